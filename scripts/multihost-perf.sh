#!/usr/bin/env bash
# All-reduce performance across emulated hosts (scripts/testbed.sh): 4
# hosts x 2 ranks, links shaped to 20 us / 10 Gbit/s (the delay only where
# the kernel has sch_netem), all_reduce_perf run once per algorithm forced
# with NCCL_ALGO (ring, tree, rhd, hier, oneshot) and once with the tuner's
# own choice, then three comparisons printed as Markdown tables:
#   1. hier vs ring bus bandwidth at 16 MiB and above;
#   2. tree vs ring time from 8 B to 64 KiB;
#   3. the tuner's choice vs the best forced algorithm at every size
#      (time ratio; target <= 1.10).
# Times are the out-of-place column of all_reduce_perf (float, sum).
# oneshot is out of place only: all_reduce_perf stops at its first
# in-place call, so oneshot runs once per size and keeps that size's
# out-of-place line. Every configuration runs ROUNDS times, the rounds
# interleaved, and the fastest time per size is kept, which damps the
# noise of a shared machine.
#
# Usage: scripts/multihost-perf.sh [OUTDIR]
# Environment: HOSTS (4), PER_HOST (2), DELAY (20us), RATE (10gbit),
#   MAXBYTES (64M), ROUNDS (3), SMALL_ITERS (100), LARGE_ITERS (5),
#   ALGOS ("ring tree rhd hier oneshot"), PERF (the binary; default
#   target/release/all_reduce_perf under CARGO_TARGET_DIR, built if absent).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${1:-$root/target/multihost-perf}
HOSTS=${HOSTS:-4}
PER_HOST=${PER_HOST:-2}
DELAY=${DELAY:-20us}
RATE=${RATE:-10gbit}
MAXBYTES=${MAXBYTES:-64M}
ROUNDS=${ROUNDS:-3}
SMALL_ITERS=${SMALL_ITERS:-100}
LARGE_ITERS=${LARGE_ITERS:-5}
ALGOS=${ALGOS:-ring tree rhd hier oneshot}
target=${CARGO_TARGET_DIR:-$root/target}
PERF=${PERF:-$target/release/all_reduce_perf}
if [ ! -x "$PERF" ]; then
    (cd "$root" && cargo build --release --bin all_reduce_perf)
fi
mkdir -p "$out"
rm -f "$out"/*.txt "$out"/*.log

bed="rccl-tb-$$-perf"
cleanup() { "$here/testbed.sh" down --name "$bed" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$here/testbed.sh" up "$HOSTS" "$PER_HOST" --delay "$DELAY" --rate "$RATE" \
    --name "$bed" --owner $$ | tee "$out/bed.log"
state=${RCCL_TB_DIR:-/run/rccl-testbed}/$bed.env
cp "$state" "$out/bed.env"

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
    echo "cpus: $(nproc)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

# One all_reduce_perf run on the bed; $1 = label, $2 = NCCL_ALGO ("" =
# tuner), $3 = round, then the size flags.
run_perf() {
    local label=$1 algo=$2 round=$3
    shift 3
    local envs=(--env NCCL_DEBUG=WARN)
    [ -z "$algo" ] || envs+=(--env "NCCL_ALGO=allreduce:$algo")
    "$here/testbed.sh" run --name "$bed" "${envs[@]}" -- \
        "$PERF" -g 1 -c 0 -w 2 -d float -o sum "$@" \
        >>"$out/$label.r$round.txt" 2>>"$out/$label.r$round.log" ||
        [ "$algo" = oneshot ] ||
        echo "WARNING: $label round $round failed (see $out/$label.r$round.log)" >&2
}

to_bytes() {
    local n=${1%[KMGkmg]}
    case $1 in
        *[Kk]) echo $((n << 10)) ;;
        *[Mm]) echo $((n << 20)) ;;
        *[Gg]) echo $((n << 30)) ;;
        *) echo "$n" ;;
    esac
}
max=$(to_bytes "$MAXBYTES")

for ((round = 1; round <= ROUNDS; round++)); do
    for algo in auto $ALGOS; do
        a=$algo
        [ "$a" != auto ] || a=""
        echo "== round $round: $algo" >&2
        if [ "$algo" = oneshot ]; then
            for ((s = 8; s <= max; s *= 2)); do
                iters=$SMALL_ITERS
                [ $s -le 65536 ] || iters=$LARGE_ITERS
                run_perf "$algo" "$a" "$round" -b $s -e $s -n "$iters"
            done
            continue
        fi
        run_perf "$algo" "$a" "$round" -b 8 -e 64K -f 2 -n "$SMALL_ITERS"
        run_perf "$algo" "$a" "$round" -b 128K -e "$MAXBYTES" -f 2 -n "$LARGE_ITERS"
    done
done

# What the tuner picks per size, from rank 0's TUNING log of one short run.
"$here/testbed.sh" run --name "$bed" \
    --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=TUNING -- \
    "$PERF" -g 1 -c 0 -w 0 -n 1 -d float -o sum -b 8 -e "$MAXBYTES" -f 2 \
    >/dev/null 2>"$out/choices.log" || true

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"

python3 - "$out" "$ALGOS" <<'PY'
import glob, os, re, sys

out, algos = sys.argv[1], sys.argv[2].split()
MiB = 1 << 20

def load(label):
    """Fastest out-of-place time (us) and its busbw per size over rounds."""
    best = {}
    for path in glob.glob(os.path.join(out, f"{label}.r*.txt")):
        for line in open(path):
            f = line.split()
            if len(f) < 9 or line.lstrip().startswith("#") or not f[0].isdigit():
                continue
            try:
                size, time, busbw = int(f[0]), float(f[5]), float(f[7])
            except ValueError:
                continue
            if size not in best or time < best[size][0]:
                best[size] = (time, busbw)
    return best

data = {a: load(a) for a in ["auto"] + algos}
choice = {}
for line in open(os.path.join(out, "choices.log"), errors="replace"):
    m = re.search(r"\[0\] AllReduce: (\d+) Bytes -> Algo (\S+) proto (\S+)", line)
    if m and "(in place)" not in line:
        choice[int(m.group(1))] = f"{m.group(2)}/{m.group(3)}"

def human(n):
    for unit, div in (("MiB", MiB), ("KiB", 1024)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"

sizes = sorted(set().union(*[d.keys() for d in data.values()]))
lines = []
lines.append("### hier vs ring, bus bandwidth (GB/s), >= 16 MiB\n")
lines.append("| size | ring busbw | hier busbw | hier / ring |")
lines.append("|---:|---:|---:|---:|")
for s in sizes:
    if s < 16 * MiB or s not in data.get("ring", {}) or s not in data.get("hier", {}):
        continue
    r, h = data["ring"][s][1], data["hier"][s][1]
    lines.append(f"| {human(s)} | {r:.3f} | {h:.3f} | {h / r if r else float('nan'):.2f} |")
lines.append("\n### tree vs ring, time (us), 8 B - 64 KiB\n")
lines.append("| size | ring | tree | tree / ring |")
lines.append("|---:|---:|---:|---:|")
for s in sizes:
    if s > 64 * 1024 or s not in data.get("ring", {}) or s not in data.get("tree", {}):
        continue
    r, t = data["ring"][s][0], data["tree"][s][0]
    lines.append(f"| {human(s)} | {r:.1f} | {t:.1f} | {t / r:.2f} |")
lines.append("\n### tuner vs best forced algorithm, time (us)\n")
lines.append("| size | tuner's choice | tuner | best forced | best | tuner / best | within 10% |")
lines.append("|---:|---|---:|---|---:|---:|:---:|")
misses = 0
for s in sizes:
    if s not in data["auto"]:
        continue
    forced = [(data[a][s][0], a) for a in algos if s in data[a]]
    if not forced:
        continue
    bt, ba = min(forced)
    t = data["auto"][s][0]
    ok = t <= 1.10 * bt
    misses += not ok
    lines.append(f"| {human(s)} | {choice.get(s, '?')} | {t:.1f} | {ba} | {bt:.1f} | {t / bt:.2f} | {'yes' if ok else '**no**'} |")
lines.append(f"\nTuner within 10% of the best forced choice at {len(sizes) - misses} of {len(sizes)} sizes.")
text = "\n".join(lines)
open(os.path.join(out, "tables.md"), "w").write(text + "\n")
print(text)
PY
