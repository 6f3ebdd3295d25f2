#!/usr/bin/env bash
# All-reduce bus bandwidth with two rails against one, across emulated
# hosts (scripts/testbed.sh): two beds of HOSTS hosts x PER_HOST ranks, one
# with 1 rail and one with 2, every rail shaped to RATE (tc tbf) each way;
# all_reduce_perf at 16 MiB and 64 MiB (float, sum, the tuner's choices)
# on each bed in turn, ROUNDS rounds interleaved (R=1, R=2, R=1, ...), then
# per size and rail count the median busbw and its range over the rounds,
# and the ratio of the medians (target >= 1.8). busbw is computed from the
# out-of-place time column (the busbw column's two decimals are coarse).
#
# Usage: scripts/rails-perf.sh [OUTDIR]
# Environment: HOSTS (2), PER_HOST (2), RATE (2gbit), ROUNDS (5),
#   ITERS (5), PERF (the binary; default target/release/all_reduce_perf
#   under CARGO_TARGET_DIR, built if absent).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${1:-$root/target/rails-perf}
HOSTS=${HOSTS:-2}
PER_HOST=${PER_HOST:-2}
RATE=${RATE:-2gbit}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-5}
target=${CARGO_TARGET_DIR:-$root/target}
PERF=${PERF:-$target/release/all_reduce_perf}
if [ ! -x "$PERF" ]; then
    (cd "$root" && cargo build --release --bin all_reduce_perf)
fi
mkdir -p "$out"
rm -f "$out"/*.txt "$out"/*.log

# The tuner's NIC figure: the shaped rate in Mbit/s.
mbit=$(python3 -c "import re; m = re.fullmatch(r'(\d+)([kmg]?)bit', '$RATE'.lower()); \
print(int(int(m.group(1)) * {'k': 1e-3, 'm': 1, 'g': 1e3, '': 1e-6}[m.group(2)]) if m else 10000)")

beds=()
cleanup() {
    for bed in "${beds[@]}"; do
        "$here/testbed.sh" down --name "$bed" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for rails in 1 2; do
    bed="rccl-tb-$$-r$rails"
    beds+=("$bed")
    "$here/testbed.sh" up "$HOSTS" "$PER_HOST" --rails "$rails" --rate "$RATE" \
        --name "$bed" --owner $$ | tee -a "$out/bed.log"
done

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
    echo "cpus: $(nproc)"
    echo "shape: $HOSTS hosts x $PER_HOST ranks, $RATE per rail, $ROUNDS rounds x $ITERS iterations"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

for ((round = 1; round <= ROUNDS; round++)); do
    for rails in 1 2; do
        echo "== round $round: $rails rail(s)" >&2
        "$here/testbed.sh" run --name "rccl-tb-$$-r$rails" \
            --env NCCL_DEBUG=WARN --env "RCCL_NIC_SPEED=$mbit" -- \
            "$PERF" -g 1 -c 0 -w 1 -n "$ITERS" -d float -o sum -b 16M -e 64M -f 4 \
            >>"$out/r$rails.round$round.txt" 2>>"$out/r$rails.round$round.log" ||
            echo "WARNING: $rails rail(s) round $round failed (see $out/r$rails.round$round.log)" >&2
    done
done

# What the tuner picks, rank 0's log, two rails.
"$here/testbed.sh" run --name "rccl-tb-$$-r2" --env "RCCL_NIC_SPEED=$mbit" \
    --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=GRAPH,TUNING -- \
    "$PERF" -g 1 -c 0 -w 0 -n 1 -d float -o sum -b 16M -e 64M -f 4 \
    >/dev/null 2>"$out/choices.log" || true
grep -E '^\S+ \S+ \[0\] .*(Channel|Using|replayed|Algo)' "$out/choices.log" | sed 's/^.*\[0\] /[0] /' | sort -u | tee "$out/choices.txt" || true

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"

python3 - "$out" "$HOSTS" "$PER_HOST" <<'PY'
import glob, os, statistics, sys

out, hosts, per_host = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
n = hosts * per_host
factor = 2 * (n - 1) / n
busbw = {}
for rails in (1, 2):
    for path in sorted(glob.glob(os.path.join(out, f"r{rails}.round*.txt"))):
        for line in open(path):
            f = line.split()
            if len(f) < 9 or line.lstrip().startswith("#") or not f[0].isdigit():
                continue
            try:
                size, time_us = int(f[0]), float(f[5])
            except ValueError:
                continue
            busbw.setdefault((rails, size), []).append(size / time_us / 1e3 * factor)
print()
print("| size | rails | busbw median GB/s | range | rounds |")
print("|---:|---:|---:|---|---:|")
for size in sorted({s for _, s in busbw}):
    for rails in (1, 2):
        v = busbw.get((rails, size), [])
        if v:
            print(f"| {size >> 20} MiB | {rails} | {statistics.median(v):.3f} | "
                  f"{min(v):.3f}-{max(v):.3f} | {len(v)} |")
print()
for size in sorted({s for _, s in busbw}):
    one, two = busbw.get((1, size)), busbw.get((2, size))
    if one and two:
        print(f"{size >> 20} MiB: R=2 / R=1 = {statistics.median(two) / statistics.median(one):.2f}x")
PY
