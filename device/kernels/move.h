// Moving bytes in wide accesses: 16-byte loads and stores (uint4 on the
// GPU, a 16-byte memcpy on the host), several in flight per thread.
//
// A range whose two ends share their address modulo 16 moves as an
// unaligned head (under 16 bytes, one byte per thread), a body of 16-byte
// vectors and a tail (under 16 bytes); ends that agree only modulo 8 or 4
// move their body in 8- or 4-byte words instead, and ends that agree on
// nothing move byte by byte.
#pragma once

#include "port.h"

namespace rccl {

// 16 bytes in registers.
struct Vec16 {
#if RCCL_ON_DEVICE
  uint4 v;
#else
  uint64_t words[2];
#endif
};

// Aligned loads and stores of `W` bytes (W = 4, 8 or 16).
template <int W>
struct Word;
template <>
struct Word<4> {
  typedef uint32_t T;
};
template <>
struct Word<8> {
  typedef uint64_t T;
};
template <>
struct Word<16> {
  typedef Vec16 T;
};

template <int W>
RCCL_HD typename Word<W>::T load_word(const unsigned char* p) {
#if RCCL_ON_DEVICE
  return *reinterpret_cast<const typename Word<W>::T*>(p);
#else
  typename Word<W>::T v;
  __builtin_memcpy(&v, p, W);
  return v;
#endif
}
template <int W>
RCCL_HD void store_word(unsigned char* p, const typename Word<W>::T& v) {
#if RCCL_ON_DEVICE
  *reinterpret_cast<typename Word<W>::T*>(p) = v;
#else
  __builtin_memcpy(p, &v, W);
#endif
}

// A 16-byte load kept whole where only some of its bytes are used (a
// slot's header, which the peer wrote: the compiler would otherwise load
// just those bytes, in narrower accesses): volatile, so it is neither
// narrowed nor moved among the thread's other memory accesses.
RCCL_HD Vec16 load_whole16(const unsigned char* p) {
#if RCCL_ON_DEVICE
  Vec16 r;
  asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.v.x), "=r"(r.v.y), "=r"(r.v.z), "=r"(r.v.w)
               : "l"(p)
               : "memory");
  return r;
#else
  return load_word<16>(p);
#endif
}

// Vectors of W bytes each thread keeps in flight per round of a copy.
constexpr int kUnroll = 4;

// Copies `bytes` (a multiple of W) between W-aligned ends: kUnroll loads
// before their stores per thread and round.
template <int W>
RCCL_HD void copy_aligned(unsigned char* D, const unsigned char* S, uint64_t bytes,
                          uint64_t thread, uint64_t threads) {
  const uint64_t words = bytes / W;
  uint64_t i = thread;
  for (; i + (kUnroll - 1) * threads < words; i += kUnroll * threads) {
    typename Word<W>::T v[kUnroll];
RCCL_UNROLL
    for (int u = 0; u < kUnroll; ++u) v[u] = load_word<W>(S + (i + u * threads) * W);
RCCL_UNROLL
    for (int u = 0; u < kUnroll; ++u) store_word<W>(D + (i + u * threads) * W, v[u]);
  }
  for (; i < words; i += threads) store_word<W>(D + i * W, load_word<W>(S + i * W));
}

// The widest word (16, 8, 4 or 1 bytes) in which ends at `a` and `b` can
// both be aligned at once.
RCCL_HD int common_width(uintptr_t a, uintptr_t b) {
  const uintptr_t differ = a ^ b;
  return differ % 16 == 0 ? 16 : differ % 8 == 0 ? 8 : differ % 4 == 0 ? 4 : 1;
}

// Bytes [0, head) and [tail, bytes) one at a time, this thread's share:
// the unaligned ends of a range, both in one call after the body, so no
// value of the caller lives across it.
RCCL_NARROW void copy_edge(unsigned char* D, const unsigned char* S, uint64_t head, uint64_t tail,
                           uint64_t bytes, uint64_t thread, uint64_t threads) {
  const uint64_t count = head + (bytes - tail);
  RCCL_NO_UNROLL
  for (uint64_t k = thread; k < count; k += threads) {
    const uint64_t i = k < head ? k : tail + (k - head);
    D[i] = S[i];
  }
}

// A range whose ends disagree modulo 16: the head up to their common
// alignment, the body in 8- or 4-byte words (or none: every byte alone),
// the tail.
RCCL_NARROW void copy_misaligned_edge(unsigned char* D, const unsigned char* S, uint64_t bytes,
                                      int width, uint64_t thread, uint64_t threads) {
  uint64_t head = width == 1 ? bytes : (width - uintptr_t(D) % width) % width;
  head = head < bytes ? head : bytes;
  const uint64_t body = (bytes - head) / width * width;
  for (uint64_t i = thread; i < head; i += threads) D[i] = S[i];
  switch (width) {
    case 8: copy_aligned<8>(D + head, S + head, body, thread, threads); break;
    case 4: copy_aligned<4>(D + head, S + head, body, thread, threads); break;
    default: break;
  }
  for (uint64_t i = head + body + thread; i < bytes; i += threads) D[i] = S[i];
}

// Copies `bytes` bytes this thread's share at a time: ends that share
// their address modulo 16 as head, 16-byte body and tail; others through
// copy_misaligned_edge.
RCCL_HD void copy_bytes(void* dst, const void* src, uint64_t bytes, uint64_t thread,
                        uint64_t threads) {
  unsigned char* D = static_cast<unsigned char*>(dst);
  const unsigned char* S = static_cast<const unsigned char*>(src);
  const int width = common_width(uintptr_t(D), uintptr_t(S));
  if (width != 16) {
    copy_misaligned_edge(D, S, bytes, width, thread, threads);
    return;
  }
  uint64_t head = (16 - uintptr_t(D) % 16) % 16;
  head = head < bytes ? head : bytes;
  const uint64_t body = (bytes - head) / 16 * 16;
  copy_aligned<16>(D + head, S + head, body, thread, threads);
  copy_edge(D, S, head, head + body, bytes, thread, threads);
}

}  // namespace rccl
