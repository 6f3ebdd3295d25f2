#!/usr/bin/env bash
# Checks the IB network on two RDMA hosts: the raw RDMA write bandwidth
# (perftest's ib_write_bw) beside all_reduce_perf's bus bandwidth over
# NCCL_NET=IB, one rank per host, with every result checked (#wrong).
# Target: busbw at 256 MiB >= 90% of the raw write bandwidth, 0 wrong.
#
# GPUDirect: the run with host buffers is "GPUDirect off"; the run with
# GPU buffers ("on") is reported as not run until GPU buffers cross hosts.
#
# Usage: scripts/rdma-check.sh HOST_A HOST_B
#        scripts/rdma-check.sh --model     (both ranks here, over the verbs
#                                           model: checks the plumbing only)
# Needs: ssh to both hosts without a password, this checkout built
# (cargo build --release) at the same path on both, perftest's ib_write_bw
# on both, and the hosts reaching each other on PORT.
# Environment: HCA (NCCL_IB_HCA; default the first device ibv_devices
#   lists on HOST_A), GID_INDEX (NCCL_IB_GID_INDEX; default NCCL's choice),
#   MAXBYTES (256M), ITERS (20), PORT (29600), OUT (target/rdma-check),
#   PERF (all_reduce_perf; default target/release/all_reduce_perf here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
MAXBYTES=${MAXBYTES:-256M}
ITERS=${ITERS:-20}
PORT=${PORT:-29600}
OUT=${OUT:-$root/target/rdma-check}
PERF=${PERF:-${CARGO_TARGET_DIR:-$root/target}/release/all_reduce_perf}
mkdir -p "$OUT"

bytes() { numfmt --from=iec "$1"; }

# The 256 MiB line's out-of-place busbw, and the total of #wrong, from an
# all_reduce_perf output.
parse_perf() {
    awk -v size="$(bytes "$MAXBYTES")" '
        /^ *[0-9]+ / { wrong += $9 + $13; if ($1 == size) busbw = $8 }
        END { printf "%s %d\n", (busbw == "" ? "n/a" : busbw), wrong }' "$1"
}

if [ "${1:-}" = "--model" ]; then
    [ -x "$PERF" ] || (cd "$root" && cargo build --release --bin all_reduce_perf)
    secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$PORT NCCL_COMM_SECRET=$secret \
            NCCL_SHM_DISABLE=1 NCCL_NET=IB RCCL_IB_MODEL=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
            "$PERF" -b 1M -e "${MAXBYTES}" -f 4 -n 3 -w 1 -c 1 >"$OUT/model-rank$r.txt" 2>&1 &
    done
    wait
    grep -q "Using network IB" "$OUT/model-rank0.txt" || { echo "IB was not used:"; cat "$OUT/model-rank0.txt"; exit 1; }
    read -r busbw wrong < <(parse_perf "$OUT/model-rank0.txt")
    echo "| run | raw write (GB/s) | all_reduce busbw at $MAXBYTES (GB/s) | wrong |"
    echo "|---|---|---|---|"
    echo "| verbs model, host buffers | n/a (the model has no wire speed) | $busbw | $wrong |"
    [ "$wrong" = 0 ] && echo "PASS (plumbing only: a model says nothing of speed)" || { echo FAIL; exit 1; }
    exit 0
fi

[ $# -eq 2 ] || { sed -n '2,20p' "$0"; exit 2; }
A=$1
B=$2
HCA=${HCA:-$(ssh "$A" ibv_devices | awk 'NR > 2 { print $1; exit }')}
[ -n "$HCA" ] || { echo "no RDMA device on $A (ibv_devices lists none)"; exit 1; }
gid=()
[ -n "${GID_INDEX:-}" ] && gid=(-x "$GID_INDEX")

echo "== raw RDMA write: ib_write_bw -d $HCA -s $MAXBYTES, $B serving, $A writing"
ssh "$B" ib_write_bw -d "$HCA" "${gid[@]}" -s "$(bytes "$MAXBYTES")" -n "$ITERS" -F --report_gbits \
    >"$OUT/ib_write_bw-server.txt" 2>&1 &
server=$!
sleep 2
ssh "$A" ib_write_bw -d "$HCA" "${gid[@]}" -s "$(bytes "$MAXBYTES")" -n "$ITERS" -F --report_gbits "$B" \
    | tee "$OUT/ib_write_bw.txt"
wait "$server" || true
# The result line: bytes, iterations, BW peak, BW average (Gb/s), MsgRate.
raw=$(awk -v size="$(bytes "$MAXBYTES")" '$1 == size { printf "%.2f", $4 / 8 }' "$OUT/ib_write_bw.txt")
[ -n "$raw" ] || { echo "no ib_write_bw result"; exit 1; }

echo "== all_reduce_perf over NCCL_NET=IB (host buffers: GPUDirect off)"
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
envs="WORLD_SIZE=2 NCCL_COMM_ID=$A:$PORT NCCL_COMM_SECRET=$secret NCCL_NET=IB NCCL_IB_HCA=$HCA"
envs="$envs ${GID_INDEX:+NCCL_IB_GID_INDEX=$GID_INDEX} NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
run="$PERF -b 1M -e $MAXBYTES -f 2 -n $ITERS -w 5 -c 1"
ssh "$B" "cd $root && env RANK=1 $envs $run" >"$OUT/all_reduce-rank1.txt" 2>&1 &
peer=$!
ssh "$A" "cd $root && env RANK=0 $envs $run" >"$OUT/all_reduce-rank0.txt" 2>&1 || true
wait "$peer" || true
grep -q "Using network IB" "$OUT/all_reduce-rank0.txt" \
    || { echo "IB was not used (see $OUT/all_reduce-rank0.txt)"; exit 1; }
read -r busbw wrong < <(parse_perf "$OUT/all_reduce-rank0.txt")
ratio=$(awk -v b="$busbw" -v r="$raw" 'BEGIN { if (b == "n/a") print "n/a"; else printf "%.0f%%", 100 * b / r }')

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short=12 HEAD), $A <-> $B, $HCA"
    echo
    echo "| run | raw write (GB/s) | all_reduce busbw at $MAXBYTES (GB/s) | of raw | wrong |"
    echo "|---|---|---|---|---|"
    echo "| GPUDirect off (host buffers) | $raw | $busbw | $ratio | $wrong |"
    echo "| GPUDirect on (GPU buffers) | not run: GPU buffers do not cross hosts yet | | | |"
} | tee "$OUT/summary.md"
pass=$(awk -v b="$busbw" -v r="$raw" -v w="$wrong" 'BEGIN { print (b != "n/a" && b >= 0.9 * r && w == 0) ? 1 : 0 }')
if [ "$pass" = 1 ]; then echo "PASS (>= 90% of raw, 0 wrong)"; else echo "FAIL (target: >= 90% of raw, 0 wrong)"; exit 1; fi
