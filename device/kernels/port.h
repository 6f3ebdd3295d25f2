// The thin layer that lets the data path compile both as CUDA (nvcc, for
// the fatbins) and as host C++ (g++, for the host twin the tests run).
//
// A "thread" is one of the threads that share a piece of work: on the GPU
// the threads of a block (or of a grid, for the element-wise kernels), on
// the host the one calling thread (thread 0 of 1). Functions written over
// (thread, threads) run the same statements in both builds; those that meet
// at a block barrier are called by every thread of the block.
#pragma once

#include <stddef.h>
#include <stdint.h>
#if !defined(__CUDA_ARCH__)
#include <sched.h>
#include <time.h>
#endif

#if defined(__CUDACC__)
#define RCCL_HD __host__ __device__ __forceinline__
// Called from many places, compiled once (keeps the interpreter's code,
// and the compile, small).
#define RCCL_HD_OUTLINE __host__ __device__ __noinline__
// Sub-16-byte payload moves (unaligned heads and tails, LL's 4-byte data
// words): functions of their own on the GPU, so scripts/check_kernels.py
// can count them apart from the 16-byte bulk by the function's name.
#define RCCL_NARROW __host__ __device__ __noinline__
#else
#define RCCL_HD inline
#define RCCL_HD_OUTLINE inline __attribute__((noinline))
#define RCCL_NARROW inline
#endif

// Unrolls the loop that follows (the pack loops: constant trip counts).
#if defined(__CUDACC__)
#define RCCL_UNROLL _Pragma("unroll")
#elif defined(__clang__)
#define RCCL_UNROLL _Pragma("clang loop unroll(full)")
#else
#define RCCL_UNROLL _Pragma("GCC unroll 16")
#endif

// Keeps the loop that follows rolled (the edges: at most a few elements
// per thread, where unrolled copies would only add code).
#if defined(__CUDACC__)
#define RCCL_NO_UNROLL _Pragma("unroll 1")
#else
#define RCCL_NO_UNROLL
#endif

// True while compiling device code (nvcc's device pass).
#if defined(__CUDA_ARCH__)
#define RCCL_ON_DEVICE 1
#else
#define RCCL_ON_DEVICE 0
#endif

namespace rccl {

RCCL_HD uint32_t f32_bits(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  return u;
}
RCCL_HD float f32_from(uint32_t u) {
  float x;
  __builtin_memcpy(&x, &u, 4);
  return x;
}
RCCL_HD uint64_t f64_bits(double x) {
  uint64_t u;
  __builtin_memcpy(&u, &x, 8);
  return u;
}
RCCL_HD double f64_from(uint64_t u) {
  double x;
  __builtin_memcpy(&x, &u, 8);
  return x;
}

// Leading zero bits of a 32-bit word (x != 0).
RCCL_HD int clz32(uint32_t x) {
#if RCCL_ON_DEVICE
  return __clz(int(x));
#else
  return __builtin_clz(x);
#endif
}

// The threads of a block meet here; their stores before are visible to
// every thread after (device). Nothing to do for a single host thread.
RCCL_HD void block_sync() {
#if RCCL_ON_DEVICE
  __syncthreads();
#endif
}

// A barrier of the block at which every thread learns whether all of them
// said `ok`.
RCCL_HD bool all_threads(bool ok) {
#if RCCL_ON_DEVICE
  return __syncthreads_and(ok) != 0;
#else
  return ok;
#endif
}

// A barrier of the block at which every thread learns what thread 0 said:
// one thread polls memory a peer writes, the others wait here for its
// answer instead of each polling across the bus.
RCCL_HD bool first_thread_says(bool said, uint32_t thread) {
#if RCCL_ON_DEVICE
  return __syncthreads_or(thread == 0 && said) != 0;
#else
  (void)thread;
  return said;
#endif
}

// A waiter with nothing to do steps aside: briefly on the GPU (fewer polls
// of the memory its peer writes), to another thread on the host (ranks may
// outnumber the host's cores).
RCCL_HD void idle_pause() {
#if RCCL_ON_DEVICE
  __nanosleep(64);
#else
  sched_yield();
#endif
}

// Nanoseconds of a clock that only moves forward: the GPU's global timer
// (%globaltimer), the host's monotonic clock. Deadlines of device work are
// measured on it, whatever a poll costs.
RCCL_HD uint64_t clock_ns() {
#if RCCL_ON_DEVICE
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
#endif
}

// Orders this thread's earlier stores, and those of the threads of its
// block that met it at a barrier since, before its later ones for every
// observer (other GPUs and the host included).
RCCL_HD void fence_release() {
#if RCCL_ON_DEVICE
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

// The FIFO words: single-copy atomic 4- and 8-byte accesses, with acquire /
// release where a protocol publishes. System scope: a FIFO may live in host
// memory or in a peer GPU's memory.
RCCL_HD uint64_t load_acquire_u64(const uint64_t* p) {
#if RCCL_ON_DEVICE
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
RCCL_HD void store_relaxed_u64(uint64_t* p, uint64_t v) {
#if RCCL_ON_DEVICE
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}
RCCL_HD void store_release_u64(uint64_t* p, uint64_t v) {
#if RCCL_ON_DEVICE
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
RCCL_HD uint32_t load_acquire_u32(const uint32_t* p) {
#if RCCL_ON_DEVICE
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
RCCL_HD uint32_t load_relaxed_u32(const uint32_t* p) {
#if RCCL_ON_DEVICE
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}
RCCL_HD void store_release_u32(uint32_t* p, uint32_t v) {
#if RCCL_ON_DEVICE
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

}  // namespace rccl
