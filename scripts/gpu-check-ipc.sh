#!/usr/bin/env bash
# The GPU checks of CUDA IPC between processes and of PyTorch's NCCL process
# group on rccl-rs, for a machine with a CUDA device (scripts/gpu-check.sh
# calls it; it also runs alone). Logs go under $OUT (default: a temporary
# folder); a summary table ends the output, one line per check: PASS, FAIL,
# or BLOCKED where the CUDA device path it needs is missing from this build.
#
#   BIN_DIR   perf binaries (default target/release)
#   LIB       librcclrs.so to preload for torch (default $BIN_DIR/librcclrs.so)
#   PYTHON    a Python with the device's own torch (default python3)
#   RANGE     perf sizes, "-b 8 -e 16M -f 16 -n 5 -w 1" by default
#   PROCS     process counts for the perf binaries, "2 4" by default; empty
#             runs only the torch checks (gpu-check.sh runs the perf
#             binaries across processes itself)
#   TORCH_SECONDS  the deadline of each torch run (default 50), so that
#             the probe and the four runs end within gpu-check.sh's step
#
# Needs the CUDA backend of the device crate (RCCL_DEVICE=cuda). Ranks in
# separate processes on device 0 run as device work (the interpreter
# kernel) over FIFOs the receiving process allocates with cuMem, exports as
# a POSIX file descriptor and hands over a Unix socket; the perf lines
# check that the links say "via P2P/IPC (device work)". Processes on one
# GPU without MPS take turns on it (time slices), so their figures are a
# floor, not NVLink's. Where the probe fails, every line below reports
# BLOCKED, and the gloo self-check of the torch program still runs.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=${BIN_DIR:-$ROOT/target/release}
LIB=${LIB:-$BIN_DIR/librcclrs.so}
PYTHON=${PYTHON:-python3}
RANGE=${RANGE:-"-b 8 -e 16M -f 16 -n 5 -w 1"}
TORCH_SECONDS=${TORCH_SECONDS:-50}
OUT=${OUT:-$(mktemp -d)}
LOGS=$OUT/ipc
mkdir -p "$LOGS"
PERF="all_reduce_perf all_gather_perf broadcast_perf reduce_perf reduce_scatter_perf alltoall_perf gather_perf scatter_perf sendrecv_perf hypercube_perf"
SUMMARY=()
note() { SUMMARY+=("$(printf '%-44s %s' "$1" "$2")"); }

# Does this build reach the GPU? One all-reduce on device memory.
CUDA=1
if ! RCCL_DEVICE=cuda timeout -k 5 30 "$BIN_DIR/all_reduce_perf" --memory device -g 1 -c 1 -b 8 -e 8 \
    >"$LOGS/probe.log" 2>&1; then
  CUDA=0
fi

# The perf binaries with 2 and 4 processes on device 0, through P2P/IPC.
for procs in ${PROCS-2 4}; do
  for bin in $PERF; do
    name="$bin --procs $procs"
    if [ $CUDA = 0 ]; then note "$name" "BLOCKED (no CUDA device path: $LOGS/probe.log)"; continue; fi
    log="$LOGS/$bin-procs$procs.log"
    # shellcheck disable=SC2086
    RCCL_DEVICE=cuda NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=SHM timeout -k 5 120 \
      "$BIN_DIR/$bin" --procs "$procs" --memory device -c 1 $RANGE >"$log" 2>&1
    rc=$?
    wrong=$(awk '!/^#/ && NF >= 13 { w += $9 + $13 } END { print w + 0 }' "$log")
    busbw=$(awk '/Avg bus bandwidth/ { print $NF }' "$log")
    via=$(grep -q "via P2P/IPC (device work)" "$log" && echo "device work over CUDA IPC" \
      || echo "no CUDA IPC link")
    if [ $rc = 0 ] && [ "$wrong" = 0 ] && grep -q "Out of bounds values : 0 OK" "$log" \
      && [ "$via" = "device work over CUDA IPC" ]; then
      note "$name" "PASS 0 wrong, avg busbw ${busbw} GB/s, $via"
    else
      note "$name" "FAIL rc=$rc wrong=$wrong, $via ($log)"
    fi
  done
done

# torch: the same program under gloo on CPU and on cuda:0 with
# backend="nccl" served by rccl-rs (LD_PRELOAD: libtorch_cuda finds
# libnccl through an RPATH, which LD_LIBRARY_PATH does not override).
PARITY=$ROOT/python/tests/gpu_nccl_parity.py
run_torch() { # log, then the command (env assignments first)
  local log=$1; shift
  timeout -k 5 "$TORCH_SECONDS" env "$@" >"$log" 2>&1
}
if run_torch "$LOGS/parity-gloo.log" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 \
    "$PARITY" --backend gloo --device cpu --out "$LOGS/parity-gloo.json"; then
  note "torch parity program, gloo on cpu" "PASS"
else
  note "torch parity program, gloo on cpu" "FAIL ($LOGS/parity-gloo.log)"
fi
if [ $CUDA = 0 ]; then
  note "torch nccl on cuda:0, 2 processes" "BLOCKED (no CUDA device path)"
  note "torch DDP on cuda:0, 2 processes" "BLOCKED (no CUDA device path)"
else
  # LD_DEBUG=bindings shows which library torch's NCCL calls bind to.
  if run_torch "$LOGS/parity-nccl.log" LD_PRELOAD="$LIB" LD_DEBUG=bindings \
      LD_DEBUG_OUTPUT="$LOGS/bindings" "$PYTHON" -m torch.distributed.run --standalone \
      --nproc-per-node 2 "$PARITY" --backend nccl --device cuda:0 --out "$LOGS/parity-nccl.json" \
    && cat "$LOGS"/bindings.* | grep -q "to .*librcclrs.so.*ncclAllReduce" \
    && timeout -k 5 30 "$PYTHON" "$PARITY" --compare "$LOGS/parity-gloo.json" "$LOGS/parity-nccl.json" \
      >"$LOGS/parity-compare.log" 2>&1; then
    note "torch nccl on cuda:0, 2 processes" "PASS $(head -1 "$LOGS/parity-compare.log")"
  else
    note "torch nccl on cuda:0, 2 processes" "FAIL ($LOGS/parity-nccl.log, parity-compare.log)"
  fi
  DDP=$ROOT/examples/torch_ddp.py
  run_torch "$LOGS/ddp-gloo.log" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 \
    "$DDP" --backend gloo --device cpu --json "$LOGS/ddp-gloo.json"
  run_torch "$LOGS/ddp-nccl.log" LD_PRELOAD="$LIB" \
    "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 \
    "$DDP" --backend nccl --device cuda:0 --json "$LOGS/ddp-nccl.json"
  # Tolerance: the GPU's matmul kernels sum in another order than the
  # CPU's, so losses agree to float32 rounding accumulated over 50 steps,
  # not bitwise; 1e-4 relative is far above that and far below a wrong
  # gradient (which moves the final loss by whole percents).
  verdict=$(timeout -k 5 30 "$PYTHON" - "$LOGS/ddp-gloo.json" "$LOGS/ddp-nccl.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
la, lb = float.fromhex(a["losses"][-1]), float.fromhex(b["losses"][-1])
rel = abs(la - lb) / max(abs(la), 1e-12)
print(("PASS" if rel < 1e-4 else "FAIL") + f" final loss gloo/cpu {la:.9f}, nccl/cuda {lb:.9f}, rel {rel:.2e}")
PY
  ) || verdict="FAIL ($LOGS/ddp-*.log)"
  note "torch DDP on cuda:0, 2 processes" "$verdict"
fi

echo "== CUDA IPC and torch's NCCL process group ($(date -u +%FT%TZ), logs in $LOGS)"
printf '%s\n' "${SUMMARY[@]}"
! printf '%s\n' "${SUMMARY[@]}" | grep -q " FAIL"
