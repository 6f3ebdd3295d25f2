// The CUDA kernels, built into device/fatbin/ by scripts/build-kernels.sh.
// Each is a thin entry over the code the host twin (twin.cpp) runs too.
#include "fifo.h"
#include "reduce.h"
#include "work.h"

namespace {

__device__ __forceinline__ uint64_t grid_thread() {
  return uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t grid_threads() { return uint64_t(gridDim.x) * blockDim.x; }

}  // namespace

// One block per SM is asked for (the launch bound's second figure): at the
// default, the compiler holds these kernels to 64 registers to fit two
// blocks and spills around their loops instead. One block of 16 warps, each
// thread with kUnroll 16-byte loads in flight per input, keeps enough
// bytes in flight per SM (docs/PERF.md, "GPU kernels: throughput model").
#define RCCL_REDUCE_KERNEL(name, Ops)                                              \
  extern "C" __global__ void __launch_bounds__(512, 1) rccl_reduce_##name(rccl::ReduceArgs args) { \
    rccl::reduce_for<rccl::Ops>(args, grid_thread(), grid_threads());                  \
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
  rccl::copy_bytes(dst, src, bytes, grid_thread(), grid_threads());
}

// A FIFO crossed inside the GPU: block 0 sends `bytes` of `src` in pieces
// of at most the slot size; block 1 receives them into `dst`, every thread
// of each block moving its share. `status[0]` counts pieces received;
// `status[1]` gets bit 0 when a wait gave up after `spins` polls, bit 1
// when a piece came out of order. Mirrored by `LoopbackArgs` in Rust.
struct LoopbackArgs {
  rccl::FifoView fifo;
  const unsigned char* src;
  unsigned char* dst;
  uint64_t bytes;
  uint64_t spins;
  uint32_t* status;
};

extern "C" __global__ void __launch_bounds__(512) rccl_fifo_loopback(LoopbackArgs args) {
  const rccl::FifoView& fifo = args.fifo;
  const unsigned char* src = args.src;
  unsigned char* dst = args.dst;
  const uint64_t bytes = args.bytes, spins = args.spins;
  uint32_t* status = args.status;
  const uint32_t thread = threadIdx.x, threads = blockDim.x;
  const bool sender = blockIdx.x == 0;
  __shared__ rccl::FifoEnd end;
  if (thread == 0) end = sender ? rccl::producer_end(fifo) : rccl::consumer_end(fifo);
  rccl::block_sync();
  const uint64_t piece = fifo.slot_bytes;
  const uint32_t npieces = uint32_t((bytes + piece - 1) / piece);
  for (uint32_t k = 0; k < npieces; ++k) {
    const uint64_t at = uint64_t(k) * piece;
    const uint32_t len = uint32_t(bytes - at < piece ? bytes - at : piece);
    uint64_t tries = 0;
    if (sender) {
      const uint32_t meta[4] = {len, k, 0x5eed, uint32_t(bytes)};
      while (!rccl::fifo_try_send(fifo, end, meta, src + at, thread, threads)) {
        if (++tries > spins) {
          if (thread == 0) atomicOr(status + 1, 1u);
          return;
        }
      }
    } else {
      uint32_t meta[4];
      while (!rccl::fifo_try_recv(fifo, end, dst + at, len, meta, thread, threads)) {
        if (++tries > spins) {
          if (thread == 0) atomicOr(status + 1, 1u);
          return;
        }
      }
      if (thread == 0) {
        if (meta[0] != len || meta[1] != k) atomicOr(status + 1, 2u);
        atomicAdd(status, 1u);
      }
    }
  }
}

// Bytes of shared memory the launch gave the block beyond its static ones.
__device__ __forceinline__ uint32_t dynamic_shared_bytes() {
  uint32_t bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}

// Device work of every rank of a round at once: grid block b runs channel
// `blocks[b].channel` of `*blocks[b].work` with all its threads and writes
// the channel's end (0 done, 1 aborted, 2 still waiting `timeout_ns` after
// it started, 3 too large) to `*blocks[b].status`. The launch gives each
// block dynamic shared memory for its channel's peers (PeerEnds).
extern "C" __global__ void __launch_bounds__(512)
    rccl_run_work(const rccl::WorkBlock* blocks, uint64_t timeout_ns) {
  extern __shared__ rccl::PeerEnds ends[];
  __shared__ rccl::WorkLocal local;
  __shared__ rccl::WorkBlock b;
  rccl::load_descriptors(&b, blocks + blockIdx.x, sizeof(b), threadIdx.x, blockDim.x);
  __syncthreads();
  const uint32_t max_ends = dynamic_shared_bytes() / sizeof(rccl::PeerEnds);
  const int r = rccl::work_run_channel(b.work, b.channel, timeout_ns, local, ends, max_ends,
                                       threadIdx.x, blockDim.x);
  // The end as one ordered word, after every store of the channel.
  if (threadIdx.x == 0) rccl::store_release_u32(reinterpret_cast<uint32_t*>(b.status), uint32_t(r));
}
