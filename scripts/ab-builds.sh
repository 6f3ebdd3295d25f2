#!/usr/bin/env bash
# A/B of two builds of all_reduce_perf, side by side in one run: RANKS
# ranks as threads of one process, RANKS processes over shared memory, and
# 2 emulated hosts x 1 rank over the network (scripts/testbed.sh, unshaped;
# skipped when not root), at 8 B, 64 KiB, 1 MiB, 16 MiB and 256 MiB. The two builds run in turn, ROUNDS
# times interleaved; per size, the median over rounds of each build's
# out-of-place time, their ratio B/A, and the spread of the per-round
# ratios (min-max) are printed as a Markdown table.
#
# Usage: scripts/ab-builds.sh PERF_A PERF_B   (two all_reduce_perf binaries;
#   e.g. one built from an earlier revision in a worktree)
# Environment: ROUNDS (5), OUT (target/ab-builds), SIZES (bytes, space
#   separated; default the five above), MODES (threads procs hosts), RANKS
#   (2, threads and processes), FLAGS (more flags for every run, e.g.
#   "-R 2" to put the buffers in symmetric windows).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
[ $# -eq 2 ] || {
    sed -n '2,15p' "$0" >&2
    exit 2
}
ROUNDS=${ROUNDS:-5}
out=${OUT:-$root/target/ab-builds}
mkdir -p "$out"
rm -f "$out"/*.txt
read -ra sizes <<<"${SIZES:-8 65536 1048576 16777216 268435456}"
RANKS=${RANKS:-2}
read -ra flags <<<"${FLAGS:-}"
run() { # build-file mode size
    local perf=$1 mode=$2 size=$3 iters=20
    [ "$size" -ge 16777216 ] && iters=5
    [ "$size" -le 65536 ] && iters=200
    if [ "$mode" = threads ]; then
        "$perf" -t "$RANKS" -g 1 -b "$size" -e "$size" -n "$iters" -w 3 "${flags[@]}"
    elif [ "$mode" = procs ]; then
        "$perf" --procs "$RANKS" -b "$size" -e "$size" -n "$iters" -w 3 "${flags[@]}"
    else
        "$here/testbed.sh" with 2 1 -- "$perf" -b "$size" -e "$size" -n "$iters" -w 3 "${flags[@]}"
    fi
}
modes=(threads procs)
[ "$(id -u)" = 0 ] && command -v ip >/dev/null && modes+=(hosts)
[ -n "${MODES:-}" ] && read -ra modes <<<"$MODES"
for ((r = 1; r <= ROUNDS; r++)); do
    for mode in "${modes[@]}"; do
        for size in "${sizes[@]}"; do
            for side in A B; do
                perf=$1
                [ "$side" = A ] || perf=$2
                # The out-of-place time of the size's row (column 6).
                t=$(run "$perf" "$mode" "$size" | awk -v s="$size" '$1 == s {print $6; exit}')
                echo "$mode $size $r $t" >>"$out/$side.txt"
            done
        done
    done
done
python3 - "$out" "$RANKS" <<'PY'
import statistics, sys
out, ranks = sys.argv[1], sys.argv[2]
def load(side):
    d = {}
    for line in open(f"{out}/{side}.txt"):
        mode, size, r, t = line.split()
        d.setdefault((mode, int(size)), {})[int(r)] = float(t)
    return d
a, b = load("A"), load("B")
print("| placement | bytes | A time (us) | B time (us) | B/A | per-round B/A |")
print("|---|---:|---:|---:|---:|---|")
for key in a:
    ratios = [b[key][r] / a[key][r] for r in a[key] if r in b[key]]
    ma, mb = statistics.median(a[key].values()), statistics.median(b[key].values())
    mode = {"threads": f"{ranks} threads", "procs": f"{ranks} processes"}.get(key[0], "2 hosts x 1")
    print(f"| {mode} | {key[1]} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
PY
