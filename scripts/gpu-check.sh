#!/usr/bin/env bash
# The GPU checks, in one run of under 8 minutes on a lent GPU machine
# (no cargo there, no package registry).
#
#   scripts/gpu-check.sh prepare   here: builds the binaries, strips them
#                                  into .gpu/ (ignored by git, carried to
#                                  the GPU machine, 64 MiB at most)
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
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
pack=$root/.gpu

prepare() {
  set -e
  cd "$root"
  cargo build --release -p rccl-device --bin rccl-kernel-check
  cargo build --release -p rccl-ffi
  cargo build --release --bins
  rm -rf "$pack/bin" "$pack/lib" "$pack/include"
  mkdir -p "$pack/bin" "$pack/lib" "$pack/include"
  strip -o "$pack/bin/rccl-kernel-check" target/release/rccl-kernel-check
  for b in all_reduce all_gather broadcast reduce reduce_scatter alltoall scatter gather sendrecv hypercube; do
    strip -o "$pack/bin/${b}_perf" "target/release/${b}_perf"
  done
  strip -o "$pack/lib/librcclrs.so" target/release/librcclrs.so
  tar -czf "$pack/binaries.tar.gz" -C "$pack" bin lib
  rm -rf "$pack/bin" "$pack/lib"
  cp ffi/include/nccl.h "$pack/include/"
  { git rev-parse HEAD; git status --porcelain | grep -q . && echo "(with uncommitted changes)"; } > "$pack/REVISION" || true
  # The perf binaries reach device memory once `--memory` takes
  # device|host (until then it is nccl-tests' memory report switch).
  if target/release/all_reduce_perf --help 2>&1 | grep -A1 -- '--memory' | grep -qi 'device'; then
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
  prepare
  exit
fi

out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
[ -d "$pack/bin" ] || tar -xzf "$pack/binaries.tar.gz" -C "$pack"
start=$(date +%s)
budget=${GPU_CHECK_SECONDS:-450}
summary=()

# What is left of the run's budget, capped at $1 seconds.
left() {
  local rest=$((budget - ($(date +%s) - start)))
  [ "$rest" -lt "$1" ] && echo $((rest > 5 ? rest : 5)) || echo "$1"
}
record() { summary+=("$1|$2|$3"); }
has_cap() { grep -q "^$1=1" "$pack/CAPS" 2>/dev/null; }

# ---- the machine ----
{
  date -u
  echo "revision: $(cat "$pack/REVISION" 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  nvidia-smi 2>&1 | head -15
} > "$out/machine.log"
record machine "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" "see machine.log"

# ---- kernels: every reduction x datatype x op, FIFOs, bandwidth ----
copy_gbps=""
timeout "$(left 200)" "$pack/bin/rccl-kernel-check" > "$out/kernels.log" 2>&1
rc=$?
result=$(grep '^RESULT' "$out/kernels.log" | tail -1)
if [ -n "$result" ]; then
  get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$result"; }
  copy_gbps=$(get copy_GBps)
  ratio=$(get ratio)
  record "kernel x datatype x op vs CPU" "$([ "$(get wrong)" = 0 ] && echo PASS || echo FAIL)" "wrong elements: $(get wrong)"
  record "FIFO protocols warp to warp" "$([ "$(get fifo_wrong)" = 0 ] && echo PASS || echo FAIL)" "protocols wrong: $(get fifo_wrong)"
  record "reduce vs D2D copy bandwidth" "$(awk -v r="$ratio" 'BEGIN{print (r >= 0.90) ? "PASS" : "FAIL"}')" \
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
  wrong_total=0
  not_on_gpu=0
  failed_runs=""
  for b in all_reduce all_gather broadcast reduce reduce_scatter alltoall scatter gather sendrecv hypercube; do
    for k in 2 4 8; do
      log="$out/perf_${b}_g$k.log"
      RCCL_TIMEOUT_MS=30000 timeout "$(left 60)" "$pack/bin/${b}_perf" --memory device -g "$k" \
        -b 8 -e 1G -f 4 -n 5 -w 1 -c 1 > "$log" 2>&1
      w=$(awk '/Out of bounds values/ {print $7}' "$log")
      [ -z "$w" ] && { w=1; failed_runs+=" ${b}-g$k"; }
      grep -q '\[cuda 0\]' "$log" || not_on_gpu=$((not_on_gpu + 1))
      wrong_total=$((wrong_total + w))
    done
  done
  record "perf binaries, device memory, -g 2/4/8" \
    "$([ "$wrong_total" = 0 ] && [ "$not_on_gpu" = 0 ] && echo PASS || echo FAIL)" \
    "wrong: $wrong_total, runs not on [cuda 0]: $not_on_gpu, no result:${failed_runs:- none} (logs perf_*.log)"
  # busbw of k ranks on one GPU beside the bound B(k-1)/k^2.
  for k in 2 4 8; do
    bw=$(awk '$1 == 268435456 {print $8}' "$out/perf_all_reduce_g$k.log" | head -1)
    bound=$(awk -v b="$copy_gbps" -v k="$k" 'BEGIN{printf "%.1f", b*(k-1)/(k*k)}')
    record "all_reduce 256MiB busbw, $k ranks" "$(awk -v x="${bw:-0}" -v y="$bound" 'BEGIN{print (y > 0 && x >= 0.8*y) ? "PASS" : "FAIL"}')" "$bw GB/s, bound $bound GB/s"
  done
  # ---- the same binaries with 2 and 4 processes on device 0 ----
  # Ranks in separate processes run as device work over FIFOs one process
  # allocates with cuMem and exports as a file descriptor (CUDA IPC); the
  # links say "via P2P/IPC (device work)". busbw at 8 MiB beside the
  # thread-mode (-g) figure of the same size.
  for k in 2 4; do
    wrong_total=0
    no_link=""
    for b in all_reduce all_gather broadcast reduce reduce_scatter alltoall scatter gather sendrecv hypercube; do
      log="$out/perf_${b}_procs$k.log"
      RCCL_TIMEOUT_MS=30000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=SHM timeout "$(left 30)" \
        "$pack/bin/${b}_perf" --memory device --procs "$k" -b 8 -e 8M -f 4 -n 5 -w 1 -c 1 > "$log" 2>&1
      w=$(awk '/Out of bounds values/ {print $7}' "$log")
      [ -z "$w" ] && w=1
      wrong_total=$((wrong_total + w))
      grep -q "via P2P/IPC (device work)" "$log" || no_link+=" $b"
    done
    bw=$(awk '!/^#/ && $1 == 8388608 {print $8}' "$out/perf_all_reduce_procs$k.log" | tail -1)
    threads=$(awk '!/^#/ && $1 == 8388608 {print $8}' "$out/perf_all_reduce_g$k.log" | head -1)
    record "perf binaries, --procs $k, CUDA IPC" \
      "$([ "$wrong_total" = 0 ] && [ -z "$no_link" ] && echo PASS || echo FAIL)" \
      "wrong: $wrong_total, no device-work link:${no_link:- none}; all_reduce 8MiB busbw $bw GB/s (threads -g $k: $threads) (logs perf_*_procs$k.log)"
  done
  # ---- device work across hosts: two processes told apart by NCCL_HOSTID ----
  # Each sees the other on another host, so device work links them through
  # the network (Socket on loopback): FIFO counters and slots in page-locked
  # host memory the kernel reaches, moved by the network proxy (no
  # GPUDirect: Socket registers host memory only). The links say
  # "(device work, slots in host memory)".
  wrong_total=0
  no_link=""
  port=29700
  for b in all_reduce all_gather reduce_scatter broadcast sendrecv; do
    secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    port=$((port + 1))
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$port NCCL_COMM_SECRET=$secret \
        NCCL_HOSTID=gpu-check-host$r NCCL_SOCKET_IFNAME=lo RCCL_TIMEOUT_MS=30000 \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET timeout "$(left 30)" \
        "$pack/bin/${b}_perf" --memory device -b 8 -e 8M -f 4 -n 5 -w 1 -c 1 \
        > "$out/perf_${b}_hosts_rank$r.log" 2>&1 &
    done
    wait
    log="$out/perf_${b}_hosts_rank0.log"
    w=$(awk '/Out of bounds values/ {print $7}' "$log")
    [ -z "$w" ] && w=1
    wrong_total=$((wrong_total + w))
    grep -q "(device work, slots in host memory)" "$log" || no_link+=" $b"
  done
  bw=$(awk '!/^#/ && $1 == 8388608 {print $8}' "$out/perf_all_reduce_hosts_rank0.log" | tail -1)
  record "perf binaries, 2 hosts by NCCL_HOSTID, device work" \
    "$([ "$wrong_total" = 0 ] && [ -z "$no_link" ] && echo PASS || echo FAIL)" \
    "wrong: $wrong_total, no device-work link:${no_link:- none}; all_reduce 8MiB busbw $bw GB/s (logs perf_*_hosts_rank*.log)"
  # ---- device memory through host copies ----
  # With NCCL_P2P_DISABLE the processes' device calls run the host
  # executor over page-locked host copies that the copy engine fills and
  # empties on the stream (host_staging.rs).
  wrong_total=0
  for b in all_reduce all_gather reduce_scatter broadcast sendrecv; do
    log="$out/perf_${b}_staged.log"
    NCCL_P2P_DISABLE=1 RCCL_TIMEOUT_MS=30000 timeout "$(left 30)" \
      "$pack/bin/${b}_perf" --memory device --procs 2 -b 8 -e 8M -f 4 -n 5 -w 1 -c 1 > "$log" 2>&1
    w=$(awk '/Out of bounds values/ {print $7}' "$log")
    [ -z "$w" ] && w=1
    wrong_total=$((wrong_total + w))
  done
  bw=$(awk '!/^#/ && $1 == 8388608 {print $8}' "$out/perf_all_reduce_staged.log" | tail -1)
  record "perf binaries, --procs 2, device memory through host copies" \
    "$([ "$wrong_total" = 0 ] && echo PASS || echo FAIL)" \
    "wrong: $wrong_total; all_reduce 8MiB busbw $bw GB/s (logs perf_*_staged.log)"
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
timeout "$(left 150)" python3 "$out/nccl_bench.py" 2 4 8 > "$out/nccl_one_gpu.log" 2>&1
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

# ---- NVIDIA's nccl-tests, built here with nvcc ----
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
nccl_home=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
build=$(mktemp -d)
if [ -x "$nvcc" ] && [ -f "$pack/nccl-tests/src/Makefile" ] && [ -n "$nccl_home" ]; then
  # NVIDIA's NCCL from PyTorch's wheel: a libnccl.so for the linker.
  mkdir -p "$build/nccl/lib"
  ln -s "$nccl_home/include" "$build/nccl/include"
  ln -s "$nccl_home"/lib/libnccl.so.* "$build/nccl/lib/libnccl.so"
  cp -r "$pack/nccl-tests" "$build/src-nccl"
  timeout "$(left 200)" make -j16 -C "$build/src-nccl/src" build BUILDDIR="$build/nt-nccl" \
    NCCL_HOME="$build/nccl" CUDA_HOME="$(dirname "$(dirname "$nvcc")")" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > "$out/nccl-tests-build.log" 2>&1
  for graph in 0 1; do
    log="$out/nccl-tests_nccl_G$graph.log"
    LD_LIBRARY_PATH="$nccl_home/lib:${LD_LIBRARY_PATH:-}" timeout "$(left 60)" \
      "$build/nt-nccl/all_reduce_perf" -g 1 -b 8 -e 1G -f 4 -c 1 -G "$graph" > "$log" 2>&1
    w=$(awk '/Out of bounds values/ {print $7}' "$log")
    record "nccl-tests all_reduce -g 1 -G $graph (NVIDIA NCCL)" "$([ "$w" = 0 ] && echo PASS || echo FAIL)" "wrong: ${w:-no result} ($(basename "$log"))"
  done
else
  record "nccl-tests (NVIDIA NCCL)" FAIL "missing: nvcc '$nvcc', nccl-tests source or PyTorch's NCCL"
fi
if has_cap device_memory; then
  cp -r "$pack/nccl-tests" "$build/src-rccl"
  mkdir -p "$build/rccl/lib"
  ln -s "$pack/include" "$build/rccl/include"
  ln -s "$pack/lib/librcclrs.so" "$build/rccl/lib/libnccl.so"
  timeout "$(left 200)" make -j16 -C "$build/src-rccl/src" build BUILDDIR="$build/nt-rccl" \
    NCCL_HOME="$build/rccl" CUDA_HOME="$(dirname "$(dirname "$nvcc")")" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > "$out/nccl-tests-rccl-build.log" 2>&1
  for graph in 0 1; do
    log="$out/nccl-tests_rccl_G$graph.log"
    RCCL_TIMEOUT_MS=30000 LD_LIBRARY_PATH="$pack/lib:${LD_LIBRARY_PATH:-}" timeout "$(left 60)" \
      "$build/nt-rccl/all_reduce_perf" -g 1 -b 8 -e 1G -f 4 -c 1 -G "$graph" > "$log" 2>&1
    w=$(awk '/Out of bounds values/ {print $7}' "$log")
    record "nccl-tests all_reduce -g 1 -G $graph (rccl-rs)" "$([ "$w" = 0 ] && echo PASS || echo FAIL)" "wrong: ${w:-no result} ($(basename "$log"))"
  done
else
  record "nccl-tests all_reduce -g 1, -G 1 (rccl-rs)" "NOT YET" "librcclrs has no device-memory path"
fi
rm -rf "$build"

# ---- torch's NCCL process group on rccl-rs (scripts/gpu-check-ipc.sh) ----
PROCS="" BIN_DIR="$pack/bin" LIB="$pack/lib/librcclrs.so" OUT="$out" \
  timeout "$(left 240)" bash "$root/scripts/gpu-check-ipc.sh" > "$out/torch.log" 2>&1
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

# ---- summary ----
{
  echo "gpu-check $(date -u +%FT%TZ), revision $(head -1 "$pack/REVISION" 2>/dev/null), $(( $(date +%s) - start )) s"
  printf '%-46s %-8s %s\n' CHECK STATUS DETAIL
  for row in "${summary[@]}"; do
    IFS='|' read -r name status detail <<< "$row"
    printf '%-46s %-8s %s\n' "$name" "$status" "$detail"
  done
} | tee "$out/summary.txt"
