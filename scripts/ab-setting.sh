#!/usr/bin/env bash
# A/B of one engine setting over the perf binaries: all-reduce,
# all-gather and reduce-scatter with 2 processes over shared memory, run
# with the environment A and with the environment B in turn (interleaved,
# ROUNDS times), each run sweeping its sizes CYCLES times. Prints, per
# collective and size, the fastest out-of-place and in-place busbw of A
# and of B and their ratio B/A.
#
# The fastest of many short samples is what the comparison uses: this VM
# runs a process in speed modes up to 2x apart that change about once a
# second, so averages mix modes and the fastest sample is the machine
# without the slow mode (docs/PERF.md, "Non-temporal stores").
#
# Usage: scripts/ab-setting.sh 'A_VARS' 'B_VARS'
#   e.g. scripts/ab-setting.sh RCCL_NT_STORE_BYTES=0 ''
#   (space-separated VAR=VALUE lists; '' is the defaults). Environment:
#   ROUNDS (3), CYCLES (3), MINBYTES (16M), MAXBYTES (256M), ITERS (5),
#   OUT (target/ab-setting).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -eq 2 ] || {
    sed -n '2,18p' "$0" >&2
    exit 2
}
ROUNDS=${ROUNDS:-3}
CYCLES=${CYCLES:-3}
MINBYTES=${MINBYTES:-16M}
MAXBYTES=${MAXBYTES:-256M}
ITERS=${ITERS:-5}
out=${OUT:-$root/target/ab-setting}
target=${CARGO_TARGET_DIR:-$root/target}
colls=(all_reduce all_gather reduce_scatter)

cargo build --release --quiet -p rccl-tests \
    --bin all_reduce_perf --bin all_gather_perf --bin reduce_scatter_perf
mkdir -p "$out"
rm -f "$out"/*.txt
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "revision: $(git rev-parse --short=12 HEAD)"
    echo "A: ${1:-defaults}; B: ${2:-defaults}"
    echo "rounds: $ROUNDS; cycles: $CYCLES; sizes $MINBYTES-$MAXBYTES; iterations $ITERS"
    echo "cpu idle before: $(vmstat 1 2 | tail -1 | awk '{print $15}')%"
} >"$out/run.txt"
for ((r = 1; r <= ROUNDS; r++)); do
    for side in A B; do
        vars=$1
        [ "$side" = A ] || vars=$2
        for c in "${colls[@]}"; do
            # shellcheck disable=SC2086 # the list splits into VAR=VALUE words
            env $vars "$target/release/${c}_perf" --procs 2 -b "$MINBYTES" -e "$MAXBYTES" -f 4 \
                -n "$ITERS" -w 2 -N "$CYCLES" >>"$out/$side-$c.txt"
        done
    done
done
cat "$out/run.txt"
echo
python3 - "$out" "${colls[@]}" <<'PY'
import sys
out, colls = sys.argv[1], sys.argv[2:]

def best(path):
    """size -> (fastest out-of-place busbw, fastest in-place busbw)."""
    got = {}
    for line in open(path):
        f = line.split()
        if f and not f[0].startswith("#") and len(f) >= 13:
            size, oop, ip = int(f[0]), float(f[7]), float(f[11])
            a, b = got.get(size, (0.0, 0.0))
            got[size] = (max(a, oop), max(b, ip))
    return got

def human(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"

print("| collective | size | out of place A | B | B/A | in place A | B | B/A |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for c in colls:
    a, b = best(f"{out}/A-{c}.txt"), best(f"{out}/B-{c}.txt")
    for size in sorted(a):
        (ao, ai), (bo, bi) = a[size], b[size]
        print(f"| {c} | {human(size)} | {ao:.2f} | {bo:.2f} | {bo / ao:.2f} | {ai:.2f} | {bi:.2f} | {bi / ai:.2f} |")
PY
