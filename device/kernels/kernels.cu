// The CUDA kernels, built into device/fatbin/ by scripts/build-kernels.sh.
// Each is a thin entry over the code the host twin (twin.cpp) runs too.
#include "fifo.h"
#include "reduce.h"
#include "work.h"

namespace {

__device__ __forceinline__ uint64_t grid_lane() {
  return uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t grid_lanes() { return uint64_t(gridDim.x) * blockDim.x; }

}  // namespace

#define RCCL_REDUCE_KERNEL(name, Ops)                                              \
  extern "C" __global__ void __launch_bounds__(512) rccl_reduce_##name(rccl::ReduceArgs args) { \
    rccl::reduce_for<rccl::Ops>(args, grid_lane(), grid_lanes());                  \
  }

// One kernel per datatype, named by ncclDataType_t order.
RCCL_REDUCE_KERNEL(int8, I8Ops)
RCCL_REDUCE_KERNEL(uint8, U8Ops)
RCCL_REDUCE_KERNEL(int32, I32Ops)
RCCL_REDUCE_KERNEL(uint32, U32Ops)
RCCL_REDUCE_KERNEL(int64, I64Ops)
RCCL_REDUCE_KERNEL(uint64, U64Ops)
RCCL_REDUCE_KERNEL(float16, F16Ops)
RCCL_REDUCE_KERNEL(float32, F32Ops)
RCCL_REDUCE_KERNEL(float64, F64Ops)
RCCL_REDUCE_KERNEL(bfloat16, Bf16Ops)
RCCL_REDUCE_KERNEL(float8e4m3, E4m3Ops)
RCCL_REDUCE_KERNEL(float8e5m2, E5m2Ops)

extern "C" __global__ void __launch_bounds__(512) rccl_copy(void* dst, const void* src, uint64_t bytes) {
  rccl::copy_lane(dst, src, bytes, grid_lane(), grid_lanes());
}

// A FIFO crossed inside the GPU: warp 0 of block 0 sends `bytes` of `src`
// in pieces of at most the slot size; warp 0 of block 1 receives them into
// `dst`. `status[0]` counts pieces received; `status[1]` gets bit 0 when a
// wait gave up after `spins` polls, bit 1 when a piece came out of order.
// Mirrored by `LoopbackArgs` in Rust.
struct LoopbackArgs {
  rccl::FifoView fifo;
  const unsigned char* src;
  unsigned char* dst;
  uint64_t bytes;
  uint64_t spins;
  uint32_t* status;
};

extern "C" __global__ void rccl_fifo_loopback(LoopbackArgs args) {
  const rccl::FifoView& fifo = args.fifo;
  const unsigned char* src = args.src;
  unsigned char* dst = args.dst;
  const uint64_t bytes = args.bytes, spins = args.spins;
  uint32_t* status = args.status;
  if (threadIdx.x >= 32) return;
  const uint32_t lane = threadIdx.x;
  const uint64_t piece = fifo.slot_bytes;
  const uint32_t npieces = uint32_t((bytes + piece - 1) / piece);
  for (uint32_t k = 0; k < npieces; ++k) {
    const uint64_t at = uint64_t(k) * piece;
    const uint32_t len = uint32_t(bytes - at < piece ? bytes - at : piece);
    uint64_t tries = 0;
    if (blockIdx.x == 0) {
      const uint32_t meta[4] = {len, k, 0x5eed, uint32_t(bytes)};
      while (!rccl::fifo_try_send(fifo, meta, src + at, lane, 32)) {
        if (++tries > spins) {
          if (lane == 0) atomicOr(status + 1, 1u);
          return;
        }
      }
    } else {
      uint32_t meta[4];
      while (!rccl::fifo_try_recv(fifo, dst + at, len, meta, lane, 32)) {
        if (++tries > spins) {
          if (lane == 0) atomicOr(status + 1, 1u);
          return;
        }
      }
      if (lane == 0) {
        if (meta[0] != len || meta[1] != k) atomicOr(status + 1, 2u);
        atomicAdd(status, 1u);
      }
    }
  }
}

// One rank's device work: block b runs channel b with its first warp.
// `status[b]` gets the channel's result (0 done, 1 aborted, 2 still
// waiting `timeout_ns` after it started, 3 a step too large).
extern "C" __global__ void rccl_run_work(const rccl::WorkHeader* work, uint64_t timeout_ns,
                                         int32_t* status) {
  if (threadIdx.x >= 32 || blockIdx.x >= work->nchannels) return;
  const int r = rccl::work_run_channel(*work, blockIdx.x, timeout_ns, threadIdx.x, 32);
  if (threadIdx.x == 0) status[blockIdx.x] = r;
}
