#!/usr/bin/env bash
# The GPU checks, in one run of under 8 minutes on a lent GPU machine
# (no cargo there, no package registry).
#
#   scripts/gpu-check.sh prepare   here: builds the binaries, strips them
#                                  into .gpu/ (ignored by git, carried to
#                                  the GPU machine, 64 MiB at most);
#                                  `prepare --no-build` packs the binaries
#                                  already in target/release
#   scripts/gpu-check.sh           there: runs every check, writes logs
#                                  under $OUT and prints a summary table
#
# It ends with scripts/gpu-check-ipc.sh's torch checks (torch's NCCL process
# group on rccl-rs against gloo, and the DDP example, on cuda:0).
#
# .gpu/ holds: binaries.tar.gz (bin/: rccl-kernel-check and the perf
# binaries, lib/: librcclrs.so; each binary embeds the kernels' fatbin, so
# they travel compressed and the run unpacks them), include/nccl.h, nccl-tests/ (NVIDIA's nccl-tests source,
# fetched into .gpu/nccl-tests beforehand), REVISION and CAPS (what the
# binaries can do; a check they cannot run yet is listed as NOT YET).
#
# Settings (environment):
#   GPU_CHECK_PACK       the pack folder (default .gpu/)
#   GPU_CHECK_RELEASE_DIR  where prepare finds the built binaries
#                        (default target/release)
#   GPU_CHECK_SECONDS    the run's budget (default 450); each step also has
#                        its own deadline, so a hang costs one step
#   GPU_CHECK_MAX_BYTES  the largest message of any step (default: 1 GiB
#                        for the thread runs, 8 MiB across processes,
#                        256 MiB buffers for the kernels' bandwidth)
#   GPU_CHECK_MODEL=1    the driver is the CUDA driver model (cuda-model/,
#                        as libcuda.so.1 first on LD_LIBRARY_PATH): what
#                        needs parts built for the hardware (nvidia-smi,
#                        PyTorch with CUDA, nccl-tests built by nvcc) is
#                        SKIPPED (model), and bandwidth is shown, not judged
#   GPU_CHECK_SKIP       "step=reason;step=reason": steps not to run, each
#                        listed as SKIPPED (model) with its reason; steps:
#                        fifos (the kernels' FIFO protocols), procs (the
#                        perf binaries across processes over CUDA IPC),
#                        hosts (device work across NCCL_HOSTID hosts),
#                        staged (device memory through host copies)
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
pack=${GPU_CHECK_PACK:-$root/.gpu}
perf_names="all_reduce all_gather broadcast reduce reduce_scatter alltoall scatter gather sendrecv hypercube"

prepare() {
  set -e
  cd "$root"
  if [ "${1:-}" != --no-build ]; then
    cargo build --release -p rccl-device --bin rccl-kernel-check
    cargo build --release -p rccl-ffi
    cargo build --release --bins
  fi
  local release=${GPU_CHECK_RELEASE_DIR:-$root/target/release} lib
  lib=$release/librcclrs.so
  # Built only as the tests' dependency, the library stays in deps/.
  [ -f "$lib" ] || lib=$release/deps/librcclrs.so
  for f in "$release/rccl-kernel-check" "$lib" $(printf "$release/%s_perf " $perf_names); do
    [ -f "$f" ] || { echo "gpu-check: $f is missing: build it (cargo build --release -p rccl-device --bin rccl-kernel-check; cargo build --release -p rccl-ffi; cargo build --release --bins)" >&2; exit 1; }
  done
  rm -rf "$pack/bin" "$pack/lib" "$pack/include"
  mkdir -p "$pack/bin" "$pack/lib" "$pack/include"
  strip -o "$pack/bin/rccl-kernel-check" "$release/rccl-kernel-check"
  for b in $perf_names; do
    strip -o "$pack/bin/${b}_perf" "$release/${b}_perf"
  done
  strip -o "$pack/lib/librcclrs.so" "$lib"
  tar -czf "$pack/binaries.tar.gz" -C "$pack" bin lib
  rm -rf "$pack/bin" "$pack/lib"
  cp ffi/include/nccl.h "$pack/include/"
  { git rev-parse HEAD; git status --porcelain | grep -q . && echo "(with uncommitted changes)"; } > "$pack/REVISION" || true
  # The perf binaries reach device memory once `--memory` takes
  # device|host (until then it is nccl-tests' memory report switch).
  if "$release/all_reduce_perf" --help 2>&1 | grep -A1 -- '--memory' | grep -qi 'device'; then
    echo "device_memory=1" > "$pack/CAPS"
  else
    echo "device_memory=0" > "$pack/CAPS"
  fi
  if [ ! -f "$pack/nccl-tests/src/Makefile" ]; then
    echo "gpu-check: put NVIDIA's nccl-tests source in $pack/nccl-tests (git archive of github.com/NVIDIA/nccl-tests)" >&2
  fi
  du -sh "$pack"
  local bytes
  bytes=$(du -sb "$pack" | cut -f1)
  if [ "$bytes" -gt $((64 << 20)) ]; then
    echo "gpu-check: $pack is $bytes bytes, over the 64 MiB that can be carried" >&2
    exit 1
  fi
}

if [ "${1:-run}" = prepare ]; then
  prepare "${2:-}"
  exit
fi

out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
if [ ! -d "$pack/bin" ] && ! tar -xzf "$pack/binaries.tar.gz" -C "$pack"; then
  echo "gpu-check: cannot unpack $pack/binaries.tar.gz (run scripts/gpu-check.sh prepare)" >&2
  exit 1
fi
start=$(date +%s)
budget=${GPU_CHECK_SECONDS:-450}
model=${GPU_CHECK_MODEL:-0}
summary=()
if [ "$model" = 1 ]; then
  # The model's SMs, as many as the H200's: each rank's kernel holds one
  # while it waits for its peers.
  export RCCL_CUDA_MODEL_SMS=${RCCL_CUDA_MODEL_SMS:-132}
fi

record() { summary+=("$1|$2|$3"); }
has_cap() { grep -q "^$1=1" "$pack/CAPS" 2>/dev/null; }
# $1 bytes, or GPU_CHECK_MAX_BYTES if that is smaller.
size_cap() {
  local max=${GPU_CHECK_MAX_BYTES:-}
  if [ -n "$max" ] && [ "$max" -lt "$1" ]; then echo "$max"; else echo "$1"; fi
}
# The reason GPU_CHECK_SKIP gives for not running step $1 (empty: run it).
skip_reason() {
  local entry
  local IFS=';'
  for entry in ${GPU_CHECK_SKIP:-}; do
    [ "${entry%%=*}" = "$1" ] && { echo "${entry#*=}"; return; }
  done
}
# A line of a part that needs hardware-built software.
hardware_only() { record "$1" "SKIPPED (model)" "$2"; }
# A bandwidth line: judged ($2 is PASS or FAIL) on hardware, shown over
# the model.
bandwidth() {
  if [ "$model" = 1 ]; then
    record "$1" INFO "$3 (not judged over the model)"
  else
    record "$1" "$2" "$3"
  fi
}

# Each step runs within its own deadline: at most $1 seconds, and never
# past the run's budget.
step_end=$start
step() {
  local now rest
  now=$(date +%s)
  rest=$((budget - (now - start)))
  step_end=$((now + ($1 < rest ? $1 : rest)))
}
# Runs a command (after $1, its own cap in seconds) under `timeout`, ended
# by the step's deadline at the latest; once the step's time is spent it
# starts nothing and answers 124, as a timeout does.
bounded() {
  local cap=$1 rest
  shift
  rest=$((step_end - $(date +%s)))
  [ "$rest" -lt "$cap" ] && cap=$rest
  [ "$cap" -gt 0 ] || return 124
  timeout -k 5 "$cap" "$@"
}
# The out-of-place busbw of a perf log's largest size: "BYTES BUSBW".
largest_busbw() {
  awk '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ { size = $1; bw = $8 } END { if (size) print size, bw }' "$1" 2>/dev/null
}
# The out-of-place busbw of size $2 in perf log $1.
busbw_at() {
  awk -v s="$2" '!/^#/ && $1 == s { print $8; exit }' "$1" 2>/dev/null
}
# The wrong elements a perf log reports; 1 where it reports none.
wrong_in() {
  local w
  w=$(awk '/Out of bounds values/ {print $7}' "$1" 2>/dev/null)
  echo "${w:-1}"
}

# ---- the machine ----
step 30
if [ "$model" = 1 ]; then
  hardware_only machine "nvidia-smi: over the model the driver has no management library"
  { date -u; echo "revision: $(cat "$pack/REVISION" 2>/dev/null || echo unknown)"; } > "$out/machine.log"
else
  {
    date -u
    echo "revision: $(cat "$pack/REVISION" 2>/dev/null || echo unknown)"
    bounded 15 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    bounded 15 nvidia-smi 2>&1 | head -15
  } > "$out/machine.log"
  gpu=$(bounded 15 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  record machine INFO "${gpu:-nvidia-smi answered nothing}, see machine.log"
fi

# ---- kernels: every reduction x datatype x op, FIFOs, bandwidth ----
step 150
copy_gbps=""
kernel_args=(--bytes "$(size_cap $((256 << 20)))")
fifo_skip=$(skip_reason fifos)
[ -n "$fifo_skip" ] && kernel_args+=(--skip-fifos)
bounded 150 "$pack/bin/rccl-kernel-check" "${kernel_args[@]}" > "$out/kernels.log" 2>&1
rc=$?
result=$(grep '^RESULT' "$out/kernels.log" | tail -1)
if [ -n "$result" ]; then
  get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$result"; }
  copy_gbps=$(get copy_GBps)
  ratio=$(get ratio)
  record "kernel x datatype x op vs CPU" \
    "$([ "$(get wrong)" = 0 ] && [ "$(get classify)" = ok ] && echo PASS || echo FAIL)" \
    "wrong elements: $(get wrong), pointer classes: $(get classify) ($(sed -n 's/^# \(\[cuda .*\)/\1/p' "$out/kernels.log" | head -1))"
  if [ -n "$fifo_skip" ]; then
    record "FIFO protocols warp to warp" "SKIPPED (model)" "$fifo_skip"
  else
    record "FIFO protocols warp to warp" "$([ "$(get fifo_wrong)" = 0 ] && echo PASS || echo FAIL)" "protocols wrong: $(get fifo_wrong)"
  fi
  bandwidth "reduce vs D2D copy bandwidth" "$(awk -v r="$ratio" 'BEGIN{print (r >= 0.90) ? "PASS" : "FAIL"}')" \
    "copy $copy_gbps GB/s, reduce $(get reduce_GBps) GB/s, ratio $ratio (>= 0.90)"
else
  record "kernels" FAIL "rccl-kernel-check exit $rc, see kernels.log"
fi

# ---- the perf binaries on device memory, 2/4/8 ranks on device 0 ----
# Each rank's call runs the device-work interpreter kernel (one block per
# channel) on device 0 through the CUDA backend (RCCL_DEVICE unset picks
# it when the driver sees a device); a run whose header does not name
# `[cuda 0]` did not reach the GPU and counts as failed.
if has_cap device_memory; then
  step 240
  wrong_total=0
  not_on_gpu=0
  failed_runs=""
  for b in $perf_names; do
    for k in 2 4 8; do
      log="$out/perf_${b}_g$k.log"
      RCCL_TIMEOUT_MS=30000 bounded 60 "$pack/bin/${b}_perf" --memory device -g "$k" \
        -b 8 -e "$(size_cap $((1 << 30)))" -f 4 -n 5 -w 1 -c 1 > "$log" 2>&1
      w=$(wrong_in "$log")
      grep -q 'Out of bounds values' "$log" || failed_runs+=" ${b}-g$k"
      grep -q '\[cuda 0\]' "$log" || not_on_gpu=$((not_on_gpu + 1))
      wrong_total=$((wrong_total + w))
    done
  done
  record "perf binaries, device memory, -g 2/4/8" \
    "$([ "$wrong_total" = 0 ] && [ "$not_on_gpu" = 0 ] && echo PASS || echo FAIL)" \
    "wrong: $wrong_total, runs not on [cuda 0]: $not_on_gpu, no result:${failed_runs:- none} (logs perf_*.log)"
  # busbw of k ranks on one GPU, at the sweep's largest size, beside the
  # bound B(k-1)/k^2.
  for k in 2 4 8; do
    read -r size bw <<< "$(largest_busbw "$out/perf_all_reduce_g$k.log")"
    bound=$(awk -v b="$copy_gbps" -v k="$k" 'BEGIN{printf "%.1f", b*(k-1)/(k*k)}')
    bandwidth "all_reduce busbw, $k ranks" \
      "$(awk -v x="${bw:-0}" -v y="$bound" 'BEGIN{print (y > 0 && x >= 0.8*y) ? "PASS" : "FAIL"}')" \
      "${bw:-no result} GB/s at ${size:-?} B, bound $bound GB/s"
  done
  # ---- the same binaries with 2 and 4 processes on device 0 ----
  # Ranks in separate processes run as device work over FIFOs one process
  # allocates with cuMem and exports as a file descriptor (CUDA IPC); the
  # links say "via P2P/IPC (device work)". busbw at the largest size beside
  # the thread-mode (-g) figure of the same size.
  procs_skip=$(skip_reason procs)
  for k in 2 4; do
    if [ -n "$procs_skip" ]; then
      record "perf binaries, --procs $k, CUDA IPC" "SKIPPED (model)" "$procs_skip"
      continue
    fi
    step $((k == 2 ? 45 : 60))
    wrong_total=0
    no_link=""
    for b in $perf_names; do
      log="$out/perf_${b}_procs$k.log"
      RCCL_TIMEOUT_MS=30000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=SHM bounded 30 \
        "$pack/bin/${b}_perf" --memory device --procs "$k" -b 8 -e "$(size_cap $((8 << 20)))" \
        -f 4 -n 5 -w 1 -c 1 > "$log" 2>&1
      wrong_total=$((wrong_total + $(wrong_in "$log")))
      grep -q "via P2P/IPC (device work)" "$log" || no_link+=" $b"
    done
    read -r size bw <<< "$(largest_busbw "$out/perf_all_reduce_procs$k.log")"
    threads=$(busbw_at "$out/perf_all_reduce_g$k.log" "${size:-0}")
    record "perf binaries, --procs $k, CUDA IPC" \
      "$([ "$wrong_total" = 0 ] && [ -z "$no_link" ] && echo PASS || echo FAIL)" \
      "wrong: $wrong_total, no device-work link:${no_link:- none}; all_reduce busbw at ${size:-?} B $bw GB/s (threads -g $k: $threads) (logs perf_*_procs$k.log)"
  done
  # ---- device work across hosts: two processes told apart by NCCL_HOSTID ----
  # Each sees the other on another host, so device work links them through
  # the network (Socket on loopback): FIFO counters and slots in page-locked
  # host memory the kernel reaches, moved by the network proxy (no
  # GPUDirect: Socket registers host memory only). The links say
  # "(device work, slots in host memory)".
  hosts_skip=$(skip_reason hosts)
  if [ -n "$hosts_skip" ]; then
    record "perf binaries, 2 hosts by NCCL_HOSTID, device work" "SKIPPED (model)" "$hosts_skip"
  else
    step 45
    wrong_total=0
    no_link=""
    port=29700
    for b in all_reduce all_gather reduce_scatter broadcast sendrecv; do
      secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
      port=$((port + 1))
      for r in 0 1; do
        RANK=$r WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$port NCCL_COMM_SECRET=$secret \
          NCCL_HOSTID=gpu-check-host$r NCCL_SOCKET_IFNAME=lo RCCL_TIMEOUT_MS=30000 \
          NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET bounded 30 \
          "$pack/bin/${b}_perf" --memory device -b 8 -e "$(size_cap $((8 << 20)))" -f 4 -n 5 -w 1 -c 1 \
          > "$out/perf_${b}_hosts_rank$r.log" 2>&1 &
      done
      wait
      log="$out/perf_${b}_hosts_rank0.log"
      wrong_total=$((wrong_total + $(wrong_in "$log")))
      grep -q "(device work, slots in host memory)" "$log" || no_link+=" $b"
    done
    read -r size bw <<< "$(largest_busbw "$out/perf_all_reduce_hosts_rank0.log")"
    record "perf binaries, 2 hosts by NCCL_HOSTID, device work" \
      "$([ "$wrong_total" = 0 ] && [ -z "$no_link" ] && echo PASS || echo FAIL)" \
      "wrong: $wrong_total, no device-work link:${no_link:- none}; all_reduce busbw at ${size:-?} B $bw GB/s (logs perf_*_hosts_rank*.log)"
  fi
  # ---- device memory through host copies ----
  # With NCCL_P2P_DISABLE the processes' device calls run the host
  # executor over page-locked host copies that the copy engine fills and
  # empties on the stream (host_staging.rs).
  staged_skip=$(skip_reason staged)
  if [ -n "$staged_skip" ]; then
    record "perf binaries, --procs 2, device memory through host copies" "SKIPPED (model)" "$staged_skip"
  else
    step 45
    wrong_total=0
    for b in all_reduce all_gather reduce_scatter broadcast sendrecv; do
      log="$out/perf_${b}_staged.log"
      NCCL_P2P_DISABLE=1 RCCL_TIMEOUT_MS=30000 bounded 30 \
        "$pack/bin/${b}_perf" --memory device --procs 2 -b 8 -e "$(size_cap $((8 << 20)))" \
        -f 4 -n 5 -w 1 -c 1 > "$log" 2>&1
      wrong_total=$((wrong_total + $(wrong_in "$log")))
    done
    read -r size bw <<< "$(largest_busbw "$out/perf_all_reduce_staged.log")"
    record "perf binaries, --procs 2, device memory through host copies" \
      "$([ "$wrong_total" = 0 ] && echo PASS || echo FAIL)" \
      "wrong: $wrong_total; all_reduce busbw at ${size:-?} B $bw GB/s (logs perf_*_staged.log)"
  fi
else
  record "perf binaries, device memory, -g 2/4/8" "NOT YET" "perf binaries have no --memory device"
  record "all_reduce busbw vs B(k-1)/k^2" "NOT YET" "needs the perf binaries on device memory"
fi

# ---- NVIDIA's NCCL, k ranks on one GPU (PyTorch's NCCL) ----
cat > "$out/nccl_bench.py" <<'PY'
import os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

SIZES = [8, 1 << 16, 1 << 20, 1 << 24, 1 << 28, 1 << 30]

def worker(rank, k, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_MULTI_RANK_GPU_ENABLE="1")
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=rank, world_size=k)
        rows = []
        for n in SIZES:
            x = torch.ones(max(n // 4, 1), dtype=torch.float32, device="cuda")
            for _ in range(2):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            dist.barrier()
            iters = 20 if n < (1 << 26) else 4
            t = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t) / iters
            rows.append((n, dt * 1e6, n / dt / 1e9 * 2 * (k - 1) / k))
        if rank == 0:
            q.put(("ok", rows))
        dist.destroy_process_group()
    except Exception as e:
        q.put(("error", repr(e)[:300]))

if __name__ == "__main__":
    print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))
    ctx = mp.get_context("spawn")
    for k in map(int, sys.argv[1:]):
        q = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, k, 29500 + k, q)) for r in range(k)]
        for p in procs:
            p.start()
        try:
            status, rows = q.get(timeout=100)
        except Exception:
            status, rows = "error", "timed out"
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if status != "ok":
            print(f"ranks {k}: refused: {rows}")
            continue
        for n, us, busbw in rows:
            print(f"ranks {k} bytes {n} time_us {us:.1f} busbw_GBps {busbw:.2f}")
PY
if [ "$model" = 1 ]; then
  for k in 2 4 8; do
    hardware_only "NVIDIA NCCL, $k ranks on one GPU" "needs PyTorch with CUDA and NVIDIA's NCCL"
  done
else
  step 150
  bounded 150 python3 "$out/nccl_bench.py" 2 4 8 > "$out/nccl_one_gpu.log" 2>&1
  for k in 2 4 8; do
    line=$(grep -E "^ranks $k[ :]" "$out/nccl_one_gpu.log" | grep -e "bytes 268435456" -e refused | head -1)
    bw=$(sed -n 's/.*busbw_GBps \([0-9.]*\).*/\1/p' <<< "$line")
    if [ -n "$bw" ]; then
      bound=$(awk -v b="${copy_gbps:-0}" -v k="$k" 'BEGIN{printf "%.1f", b*(k-1)/(k*k)}')
      record "NVIDIA NCCL, $k ranks on one GPU" INFO "256MiB busbw $bw GB/s (bound $bound GB/s)"
    else
      record "NVIDIA NCCL, $k ranks on one GPU" INFO "${line:-no result}: $(head -1 "$out/nccl_one_gpu.log")"
    fi
  done
fi

# ---- NVIDIA's nccl-tests, built here with nvcc ----
if [ "$model" = 1 ]; then
  hardware_only "nccl-tests (NVIDIA NCCL)" "built by nvcc against PyTorch's NCCL"
  hardware_only "nccl-tests (rccl-rs)" "built by nvcc"
else
  step 150
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  nccl_home=$(bounded 30 python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  build=$(mktemp -d)
  if [ -x "$nvcc" ] && [ -f "$pack/nccl-tests/src/Makefile" ] && [ -n "$nccl_home" ]; then
    # NVIDIA's NCCL from PyTorch's wheel: a libnccl.so for the linker.
    mkdir -p "$build/nccl/lib"
    ln -s "$nccl_home/include" "$build/nccl/include"
    ln -s "$nccl_home"/lib/libnccl.so.* "$build/nccl/lib/libnccl.so"
    cp -r "$pack/nccl-tests" "$build/src-nccl"
    bounded 120 make -j16 -C "$build/src-nccl/src" build BUILDDIR="$build/nt-nccl" \
      NCCL_HOME="$build/nccl" CUDA_HOME="$(dirname "$(dirname "$nvcc")")" \
      NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > "$out/nccl-tests-build.log" 2>&1
    for graph in 0 1; do
      log="$out/nccl-tests_nccl_G$graph.log"
      LD_LIBRARY_PATH="$nccl_home/lib:${LD_LIBRARY_PATH:-}" bounded 60 \
        "$build/nt-nccl/all_reduce_perf" -g 1 -b 8 -e 1G -f 4 -c 1 -G "$graph" > "$log" 2>&1
      w=$(awk '/Out of bounds values/ {print $7}' "$log")
      record "nccl-tests all_reduce -g 1 -G $graph (NVIDIA NCCL)" "$([ "$w" = 0 ] && echo PASS || echo FAIL)" "wrong: ${w:-no result} ($(basename "$log"))"
    done
  else
    record "nccl-tests (NVIDIA NCCL)" FAIL "missing: nvcc '$nvcc', nccl-tests source or PyTorch's NCCL"
  fi
  if ! [ -x "$nvcc" ] || ! [ -f "$pack/nccl-tests/src/Makefile" ]; then
    record "nccl-tests (rccl-rs)" FAIL "missing: nvcc '$nvcc' or nccl-tests source"
  elif has_cap device_memory; then
    step 150
    cp -r "$pack/nccl-tests" "$build/src-rccl"
    mkdir -p "$build/rccl/lib"
    ln -s "$pack/include" "$build/rccl/include"
    ln -s "$pack/lib/librcclrs.so" "$build/rccl/lib/libnccl.so"
    bounded 120 make -j16 -C "$build/src-rccl/src" build BUILDDIR="$build/nt-rccl" \
      NCCL_HOME="$build/rccl" CUDA_HOME="$(dirname "$(dirname "$nvcc")")" \
      NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > "$out/nccl-tests-rccl-build.log" 2>&1
    for graph in 0 1; do
      log="$out/nccl-tests_rccl_G$graph.log"
      RCCL_TIMEOUT_MS=30000 LD_LIBRARY_PATH="$pack/lib:${LD_LIBRARY_PATH:-}" bounded 60 \
        "$build/nt-rccl/all_reduce_perf" -g 1 -b 8 -e 1G -f 4 -c 1 -G "$graph" > "$log" 2>&1
      w=$(awk '/Out of bounds values/ {print $7}' "$log")
      record "nccl-tests all_reduce -g 1 -G $graph (rccl-rs)" "$([ "$w" = 0 ] && echo PASS || echo FAIL)" "wrong: ${w:-no result} ($(basename "$log"))"
    done
  else
    record "nccl-tests all_reduce -g 1, -G 1 (rccl-rs)" "NOT YET" "librcclrs has no device-memory path"
  fi
  rm -rf "$build"
fi

# ---- torch's NCCL process group on rccl-rs (scripts/gpu-check-ipc.sh) ----
if [ "$model" = 1 ]; then
  hardware_only "torch nccl / DDP on cuda:0" "needs PyTorch with CUDA"
else
  # The script bounds each of its commands; this bounds it as a whole.
  step 280
  PROCS="" BIN_DIR="$pack/bin" LIB="$pack/lib/librcclrs.so" OUT="$out" \
    bounded 280 bash "$root/scripts/gpu-check-ipc.sh" > "$out/torch.log" 2>&1
  torch_rows=$(grep -E '^torch ' "$out/torch.log")
  if [ -n "$torch_rows" ]; then
    while IFS= read -r row; do
      # "NAME   STATUS DETAIL" as gpu-check-ipc.sh prints it (name padded to 44).
      name=$(sed -E 's/ {2,}.*//' <<< "${row:0:44}")
      rest=${row:45}
      detail=""
      [[ $rest == *" "* ]] && detail=${rest#* }
      record "$name" "${rest%% *}" "$detail"
    done <<< "$torch_rows"
  else
    record "torch nccl / DDP on cuda:0" FAIL "no result (torch.log)"
  fi
fi

# ---- summary ----
{
  echo "gpu-check $(date -u +%FT%TZ), revision $(head -1 "$pack/REVISION" 2>/dev/null), $(( $(date +%s) - start )) s$([ "$model" = 1 ] && echo ", over the CUDA driver model")"
  printf '%-60s %-15s %s\n' CHECK STATUS DETAIL
  for row in "${summary[@]}"; do
    IFS='|' read -r name status detail <<< "$row"
    printf '%-60s %-15s %s\n' "$name" "$status" "$detail"
  done
} | tee "$out/summary.txt"
