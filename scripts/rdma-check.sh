#!/usr/bin/env bash
# Checks the IB network on two RDMA hosts: the raw RDMA write bandwidth
# (perftest's ib_write_bw) beside all_reduce_perf's bus bandwidth over
# NCCL_NET=IB, one rank per host, with every result checked (#wrong).
# Target: busbw at 256 MiB >= 90% of the raw write bandwidth, 0 wrong.
#
# Three runs: host buffers; GPU buffers with GPUDirect RDMA (device work
# whose FIFO slots are GPU memory the NIC reads and writes: needs dma-buf
# support or nvidia-peermem, and the log must say GDRDMA); GPU buffers with GPUDirect
# off (NCCL_NET_GDR_LEVEL=LOC: slots in page-locked host memory). The GPU
# runs need a GPU on each host (nvidia-smi); the target applies to the
# GPUDirect run where there is one, else to the host-buffer run.
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
    # Both ranks here over the model, on two hosts as far as they know
    # (NCCL_HOSTID); GPU buffers on the emulated GPU, whose device memory
    # the model's NIC registers (RCCL_IB_MODEL_GDR).
    model_run() { # name, then settings (NAME=VALUE ...) and, after --, extra arguments
        local name=$1 secret settings=() extra=()
        shift
        while [ $# -gt 0 ] && [ "$1" != -- ]; do settings+=("$1"); shift; done
        [ $# -gt 0 ] && { shift; extra=("$@"); }
        secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
        for r in 0 1; do
            env RANK=$r WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$PORT NCCL_COMM_SECRET="$secret" \
                NCCL_HOSTID=rdma-check-host$r NCCL_NET=IB RCCL_IB_MODEL=1 NCCL_DEBUG=INFO \
                NCCL_DEBUG_SUBSYS=INIT,NET "${settings[@]}" \
                "$PERF" -b 1M -e "${MAXBYTES}" -f 4 -n 3 -w 1 -c 1 "${extra[@]}" \
                >"$OUT/model-$name-rank$r.txt" 2>&1 &
        done
        wait
        grep -q "Using network IB" "$OUT/model-$name-rank0.txt" \
            || { echo "IB was not used:"; cat "$OUT/model-$name-rank0.txt"; exit 1; }
    }
    model_run host
    model_run gdr RCCL_DEVICE=emu RCCL_IB_MODEL_GDR=1 -- --memory device
    model_run nogdr RCCL_DEVICE=emu RCCL_IB_MODEL_GDR=1 NCCL_NET_GDR_LEVEL=LOC -- --memory device
    grep -q "via NET/IB/GDRDMA" "$OUT/model-gdr-rank0.txt" || { echo "no GDRDMA connection"; exit 1; }
    ! grep -q "GDRDMA" "$OUT/model-nogdr-rank0.txt" || { echo "GDRDMA with NCCL_NET_GDR_LEVEL=LOC"; exit 1; }
    echo "| run | raw write (GB/s) | all_reduce busbw at $MAXBYTES (GB/s) | wrong |"
    echo "|---|---|---|---|"
    total=0
    for run in "host:host buffers" "gdr:emulated GPU buffers, GPUDirect on" "nogdr:emulated GPU buffers, GPUDirect off"; do
        read -r busbw wrong < <(parse_perf "$OUT/model-${run%%:*}-rank0.txt")
        echo "| verbs model, ${run#*:} | n/a (the model has no wire speed) | $busbw | $wrong |"
        total=$((total + wrong))
    done
    [ "$total" = 0 ] && echo "PASS (plumbing only: a model says nothing of speed)" || { echo FAIL; exit 1; }
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

gpus=0
ssh "$A" nvidia-smi -L >/dev/null 2>&1 && ssh "$B" nvidia-smi -L >/dev/null 2>&1 && gpus=1
# One all_reduce_perf run over NCCL_NET=IB, a rank on each host: name,
# then its settings (NAME=VALUE ...) and, after --, its extra arguments.
perf_run() {
    local name=$1 secret settings=() extra=()
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do settings+=("$1"); shift; done
    [ $# -gt 0 ] && { shift; extra=("$@"); }
    echo "== all_reduce_perf over NCCL_NET=IB: $name"
    secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    local envs="WORLD_SIZE=2 NCCL_COMM_ID=$A:$PORT NCCL_COMM_SECRET=$secret NCCL_NET=IB NCCL_IB_HCA=$HCA"
    envs="$envs ${GID_INDEX:+NCCL_IB_GID_INDEX=$GID_INDEX} NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET ${settings[*]}"
    local run="$PERF -b 1M -e $MAXBYTES -f 2 -n $ITERS -w 5 -c 1 ${extra[*]}"
    ssh "$B" "cd $root && env RANK=1 $envs $run" >"$OUT/all_reduce-$name-rank1.txt" 2>&1 &
    local peer=$!
    ssh "$A" "cd $root && env RANK=0 $envs $run" >"$OUT/all_reduce-$name-rank0.txt" 2>&1 || true
    wait "$peer" || true
    grep -q "Using network IB" "$OUT/all_reduce-$name-rank0.txt" \
        || { echo "IB was not used (see $OUT/all_reduce-$name-rank0.txt)"; exit 1; }
}
perf_run host
if [ "$gpus" = 1 ]; then
    perf_run gdr -- --memory device
    perf_run nogdr NCCL_NET_GDR_LEVEL=LOC -- --memory device
fi

row() { # name, label: prints the run's row
    read -r busbw wrong < <(parse_perf "$OUT/all_reduce-$1-rank0.txt")
    local ratio
    ratio=$(awk -v b="$busbw" -v r="$raw" 'BEGIN { if (b == "n/a") print "n/a"; else printf "%.0f%%", 100 * b / r }')
    echo "| $2 | $raw | $busbw | $ratio | $wrong |"
}
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short=12 HEAD), $A <-> $B, $HCA"
    echo
    echo "| run | raw write (GB/s) | all_reduce busbw at $MAXBYTES (GB/s) | of raw | wrong |"
    echo "|---|---|---|---|---|"
    row host "host buffers"
    if [ "$gpus" = 1 ]; then
        if grep -q "GDRDMA" "$OUT/all_reduce-gdr-rank0.txt"; then
            row gdr "GPU buffers, GPUDirect RDMA"
        else
            row gdr "GPU buffers, GPUDirect asked but not used (no dma-buf, no nvidia-peermem?)"
        fi
        row nogdr "GPU buffers, GPUDirect off (NCCL_NET_GDR_LEVEL=LOC)"
    else
        echo "| GPU buffers | not run: no GPU on $A or $B (nvidia-smi) | | | |"
    fi
} | tee "$OUT/summary.md"
# The target's run (GPUDirect where it ran, else host buffers) and the
# wrong results of every run, from the table.
read -r target total < <(awk '/^\| (host buffers|GPU buffers, GPUDirect RDMA) / { split($0, f, "|"); t = f[4] } /^\| (host|GPU)/ { split($0, f, "|"); w += f[6] } END { print t + 0, w + 0 }' "$OUT/summary.md")
pass=$(awk -v b="$target" -v r="$raw" -v w="$total" 'BEGIN { print (b > 0 && b >= 0.9 * r && w == 0) ? 1 : 0 }')
if [ "$pass" = 1 ]; then echo "PASS (>= 90% of raw, 0 wrong)"; else echo "FAIL (target: >= 90% of raw, 0 wrong)"; exit 1; fi
