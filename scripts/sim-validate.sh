#!/usr/bin/env bash
# The simulator against this machine: all-reduce, all-gather and
# reduce-scatter measured with the perf binaries (2 processes bound to a
# core each, over shared memory) and replayed by rccl-sim with the same
# choice the engine makes for them (ring, Simple, one channel), 64 KiB to
# 256 MiB, then a Markdown table of the error per size.
#
# Each collective runs ROUNDS times (interleaved); the measured figure is
# the median out-of-place busbw of the rounds, with the range beside it.
#
# Usage: scripts/sim-validate.sh [CLUSTER]   (a preset or a JSON file;
#   default local-shm). Environment: ROUNDS (3), ITERS (50), OUT
#   (target/sim-validate), REPORT_ONLY=1 (replay and report against the
#   last measurements, e.g. for another cluster file).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cluster=${1:-local-shm}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-50}
out=${OUT:-$root/target/sim-validate}
target=${CARGO_TARGET_DIR:-$root/target}
colls=(all_reduce all_gather reduce_scatter)

cargo build --release --quiet -p rccl-simulator \
    --bin all_reduce_perf --bin all_gather_perf --bin reduce_scatter_perf \
    -p rccl-tests
mkdir -p "$out"
[ "${REPORT_ONLY:-0}" = 1 ] || rm -f "$out"/*.txt
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= ROUNDS && ${REPORT_ONLY:-0} != 1; r++)); do
    for c in "${colls[@]}"; do
        "$target/release/${c}_perf" --procs 2 -b 64K -e 256M -f 4 -n "$ITERS" -w 5 \
            >"$out/measured-$c-$r.txt" 2>&1
    done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
for c in "${colls[@]}"; do
    "$target/release/rccl-sim" --cluster "$cluster" --ranks-per-host 2 --coll "$c" \
        --algo ring --proto Simple --nchannels 1 -b 64K -e 256M -f 4 >"$out/simulated-$c.txt"
done

echo "Cluster: $cluster. $ROUNDS rounds of $ITERS iterations, $(date -u +%Y-%m-%dT%H:%MZ)," \
    "revision $(git rev-parse --short=12 HEAD)."
echo "Load average (1/5/15 min) at start: $load_start; at end: $load_end."
echo
echo "| collective | size | measured busbw median (range) GB/s | simulated GB/s | error |"
echo "|---|---:|---:|---:|---:|"
python3 - "$out" "$ROUNDS" "${colls[@]}" <<'PY'
import statistics, sys
out, rounds, colls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def rows(path, min_fields):
    for line in open(path):
        f = line.split()
        if f and not f[0].startswith("#") and len(f) >= min_fields:
            yield int(f[0]), float(f[7])

for c in colls:
    measured = {}
    for r in range(1, rounds + 1):
        for size, busbw in rows(f"{out}/measured-{c}-{r}.txt", 13):
            measured.setdefault(size, []).append(busbw)
    simulated = dict(rows(f"{out}/simulated-{c}.txt", 9))
    for size in sorted(measured):
        v = measured[size]
        med = statistics.median(v)
        human = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        sim = simulated.get(size, float("nan"))
        err = (sim - med) / med * 100 if med > 0 else float("nan")
        print(f"| {c} | {human} | {med:.2f} ({min(v):.2f}-{max(v):.2f}) | {sim:.2f} | {err:+.0f}% |")
PY
