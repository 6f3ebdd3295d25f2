#!/usr/bin/env bash
# A/B of one engine setting over the perf binaries: all-reduce,
# all-gather and reduce-scatter with 2 processes over shared memory, run
# with the environment A and with the environment B in turn (interleaved,
# ROUNDS times), each run sweeping its sizes CYCLES times. Prints, per
# rank count, collective and size, the fastest out-of-place time and busbw
# and the fastest in-place busbw of A and of B, with the ratios B/A.
#
# The fastest of many short samples is what the comparison uses: this VM
# runs a process in speed modes up to 2x apart that change about once a
# second, so averages mix modes and the fastest sample is the machine
# without the slow mode (docs/PERF.md, "Non-temporal stores").
#
# Usage: scripts/ab-setting.sh 'A_VARS' 'B_VARS'
#   e.g. scripts/ab-setting.sh RCCL_NT_STORE_BYTES=0 ''
#   (space-separated VAR=VALUE lists; '' is the defaults). Environment:
#   ROUNDS (3), CYCLES (3), MINBYTES (16M), MAXBYTES (256M), FACTOR (4),
#   ITERS (5), PROCS (rank counts: "2"), COLLS ("all_reduce all_gather
#   reduce_scatter"), OUT (target/ab-setting).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -eq 2 ] || {
    sed -n '2,19p' "$0" >&2
    exit 2
}
ROUNDS=${ROUNDS:-3}
CYCLES=${CYCLES:-3}
MINBYTES=${MINBYTES:-16M}
MAXBYTES=${MAXBYTES:-256M}
FACTOR=${FACTOR:-4}
ITERS=${ITERS:-5}
read -r -a procs <<<"${PROCS:-2}"
out=${OUT:-$root/target/ab-setting}
target=${CARGO_TARGET_DIR:-$root/target}
read -r -a colls <<<"${COLLS:-all_reduce all_gather reduce_scatter}"

bins=()
for c in "${colls[@]}"; do bins+=(--bin "${c}_perf"); done
cargo build --release --quiet -p rccl-tests "${bins[@]}"
mkdir -p "$out"
rm -f "$out"/*.txt
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "revision: $(git rev-parse --short=12 HEAD)"
    echo "A: ${1:-defaults}; B: ${2:-defaults}"
    echo "ranks: ${procs[*]}; rounds: $ROUNDS; cycles: $CYCLES; sizes $MINBYTES-$MAXBYTES x$FACTOR; iterations $ITERS"
    echo "cpu idle before: $(vmstat 1 2 | tail -1 | awk '{print $15}')%"
} >"$out/run.txt"
for ((r = 1; r <= ROUNDS; r++)); do
    for np in "${procs[@]}"; do
        for side in A B; do
            vars=$1
            [ "$side" = A ] || vars=$2
            for c in "${colls[@]}"; do
                # shellcheck disable=SC2086 # the list splits into VAR=VALUE words
                env $vars "$target/release/${c}_perf" --procs "$np" -b "$MINBYTES" -e "$MAXBYTES" \
                    -f "$FACTOR" -n "$ITERS" -w 2 -N "$CYCLES" >>"$out/$side-$c-$np.txt"
            done
        done
    done
done
cat "$out/run.txt"
echo
python3 - "$out" "${procs[*]}" "${colls[@]}" <<'PY'
import sys
out, procs, colls = sys.argv[1], sys.argv[2].split(), sys.argv[3:]

def best(path):
    """size -> (fastest out-of-place time, its busbw, fastest in-place busbw)."""
    got = {}
    for line in open(path):
        f = line.split()
        if f and not f[0].startswith("#") and len(f) >= 13:
            size, time, oop, ip = int(f[0]), float(f[5]), float(f[7]), float(f[11])
            t, a, b = got.get(size, (float("inf"), 0.0, 0.0))
            got[size] = (min(t, time), max(a, oop), max(b, ip))
    return got

def human(size):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size >> shift} {unit}"
    return f"{size} B"

def ratio(b, a):
    return f"{b / a:.2f}" if a else "-"

print("| ranks | collective | size | time A (us) | B | B/A | busbw A | B | B/A | in place A | B | B/A |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for np in procs:
    for c in colls:
        a, b = best(f"{out}/A-{c}-{np}.txt"), best(f"{out}/B-{c}-{np}.txt")
        for size in sorted(a):
            (at, ao, ai), (bt, bo, bi) = a[size], b[size]
            print(f"| {np} | {c} | {human(size)} | {at:.1f} | {bt:.1f} | {ratio(bt, at)} "
                  f"| {ao:.2f} | {bo:.2f} | {ratio(bo, ao)} | {ai:.2f} | {bi:.2f} | {ratio(bi, ai)} |")
PY
