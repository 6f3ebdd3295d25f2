// The thin layer that lets the data path compile both as CUDA (nvcc, for
// the fatbins) and as host C++ (g++, for the host twin the tests run).
//
// A "lane" is one of the threads that share a piece of work: on the GPU the
// 32 threads of a warp (or every thread of a grid for element-wise loops),
// on the host the one calling thread (lane 0 of 1). Functions written over
// (lane, lanes) run the same statements in both builds.
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
#else
#define RCCL_HD inline
#define RCCL_HD_OUTLINE inline __attribute__((noinline))
#endif

// Unrolls the loop that follows (the pack loops: constant trip counts).
#if defined(__CUDACC__)
#define RCCL_UNROLL _Pragma("unroll")
#elif defined(__clang__)
#define RCCL_UNROLL _Pragma("clang loop unroll(full)")
#else
#define RCCL_UNROLL _Pragma("GCC unroll 16")
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

// Every thread of a warp (device) or the caller (host) agrees that `ok`.
RCCL_HD bool all_lanes(bool ok) {
#if RCCL_ON_DEVICE
  return __all_sync(0xffffffffu, ok);
#else
  return ok;
#endif
}

// The lanes of a warp meet here; stores before are visible to the lanes
// after (device). Nothing to do for a single host lane.
RCCL_HD void lanes_sync() {
#if RCCL_ON_DEVICE
  __syncwarp();
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

// Orders this lane's earlier stores before its later ones for every
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
