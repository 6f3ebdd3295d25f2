// The FIFO protocols, laid out byte for byte as rccl-transports' Fifo
// (transports/src/fifo.rs) lays them out, so a GPU, the host twin and the
// host executor can each produce or consume the other's slots.
//
// Memory: a 4096-byte control block (tail at 0, head at 64, each a u32 in
// its own cache line), then `nslots` slots; or the slots apart (device
// memory a NIC reads and writes, the control block in host memory that the
// network proxy reads). Slot `c % nslots` carries the
// piece with counter c; LL and LL128 words carry the flag c + 1, so zeroed
// memory never matches.
//
// - Simple: a 64-byte slot header (length, seq, call, count as u32) then
//   the payload; the producer fences and publishes by advancing tail.
// - LL: 8-byte words of (4 data bytes, 4-byte flag), each stored whole;
//   four header words (length, seq, call, count) then the payload. The
//   reader checks every word's flag, so no fence is needed.
// - LL128: 128-byte lines of 120 data bytes and an 8-byte flag; a header
//   line (length, seq, call, count) then the payload lines. The block's
//   threads store the lines' data in 16-byte vectors, one thread fences,
//   then the lines' flags are stored; the header line goes last, after a
//   second fence.
//
// Counters where the reader is: each end keeps the counter it alone
// advances (the producer's tail, the consumer's head) in a FifoEnd of the
// running block, read from the FIFO once when it starts, and the peer's
// counter as last seen, polled again only when that view says the FIFO is
// full (producer) or empty (Simple consumer). Thread 0 polls; the block
// learns its answer at a barrier. Slots and their data start 16-byte
// aligned (the control block is page-aligned, slot strides are multiples of
// 64 bytes).
#pragma once

#include "move.h"
#include "port.h"

namespace rccl {

// Indexes of rccl-transports' Protocol::ALL.
enum Protocol : uint32_t { kLL = 0, kLL128 = 1, kSimple = 2 };

constexpr uint64_t kTailOffset = 0;
constexpr uint64_t kHeadOffset = 64;
constexpr uint64_t kSimpleMeta = 64;
constexpr uint64_t kLLHeaderWords = 4;
constexpr uint64_t kLL128Line = 128;
constexpr uint64_t kLL128Data = 120;

// One FIFO as both ends see it. Mirrored by `FifoView` in Rust.
struct FifoView {
  unsigned char* base;   // the control block
  unsigned char* slots;  // the first slot
  uint32_t proto;
  uint32_t nslots;
  uint32_t slot_bytes;
  uint32_t pad;
};

// Bytes of FIFO memory one slot takes: its protocol's bytes, rounded up to
// a cache line.
RCCL_HD uint64_t slot_stride(uint32_t proto, uint64_t slot_bytes) {
  uint64_t raw;
  switch (proto) {
    case kLL: raw = (kLLHeaderWords + (slot_bytes + 3) / 4) * 8; break;
    case kLL128: raw = (1 + (slot_bytes + kLL128Data - 1) / kLL128Data) * kLL128Line; break;
    default: raw = kSimpleMeta + slot_bytes; break;
  }
  return (raw + 63) / 64 * 64;
}

RCCL_HD unsigned char* slot_at(const FifoView& f, uint32_t counter) {
  return f.slots + uint64_t(counter % f.nslots) * slot_stride(f.proto, f.slot_bytes);
}
RCCL_HD uint32_t* tail_word(const FifoView& f) {
  return reinterpret_cast<uint32_t*>(f.base + kTailOffset);
}
RCCL_HD uint32_t* head_word(const FifoView& f) {
  return reinterpret_cast<uint32_t*>(f.base + kHeadOffset);
}

// This block's end of one FIFO.
struct FifoEnd {
  // The counter this end advances: tail (producer) or head (consumer).
  uint32_t mine;
  // The peer's counter as last read: head (producer) or tail (consumer).
  uint32_t theirs;
};

RCCL_HD FifoEnd producer_end(const FifoView& f) {
  FifoEnd e;
  e.mine = load_relaxed_u32(tail_word(f));
  e.theirs = load_acquire_u32(head_word(f));
  return e;
}
RCCL_HD FifoEnd consumer_end(const FifoView& f) {
  FifoEnd e;
  e.mine = load_relaxed_u32(head_word(f));
  e.theirs = load_acquire_u32(tail_word(f));
  return e;
}

// Up to `n` bytes from `src` into an 8-byte word, zero-padded: one load
// when the 8 bytes are there and aligned.
RCCL_HD uint64_t gather_word(const unsigned char* src, uint64_t n) {
  uint64_t w = 0;
  if (n >= 8 && uintptr_t(src) % 8 == 0) return load_word<8>(src);
  for (uint64_t i = 0; i < (n < 8 ? n : 8); ++i) w |= uint64_t(src[i]) << (8 * i);
  return w;
}
RCCL_HD void scatter_word(unsigned char* dst, uint64_t w, uint64_t n) {
  if (n >= 8 && uintptr_t(dst) % 8 == 0) {
    store_word<8>(dst, w);
    return;
  }
  for (uint64_t i = 0; i < (n < 8 ? n : 8); ++i) dst[i] = (unsigned char)(w >> (8 * i));
}

// The four header words of a slot, as one 16-byte access.
RCCL_HD void read_meta(const unsigned char* slot, uint32_t meta[4]) {
  const Vec16 v = load_whole16(slot);
  __builtin_memcpy(meta, &v, 16);
}
RCCL_HD void write_meta(unsigned char* slot, const uint32_t meta[4]) {
  Vec16 v;
  __builtin_memcpy(&v, meta, 16);
  store_word<16>(slot, v);
}

// ---- LL ----

RCCL_HD uint64_t ll_pair(uint32_t value, uint32_t flag) {
  return uint64_t(value) | (uint64_t(flag) << 32);
}

// Up to 4 bytes of `src`, zero-padded: one load when aligned and whole
// (LL carries 4 data bytes per word).
RCCL_NARROW uint32_t ll_word_gather(const unsigned char* src, uint32_t n) {
  if (n >= 4 && uintptr_t(src) % 4 == 0) return load_word<4>(src);
  uint32_t w = 0;
  for (uint32_t i = 0; i < (n < 4 ? n : 4); ++i) w |= uint32_t(src[i]) << (8 * i);
  return w;
}
RCCL_NARROW void ll_word_scatter(unsigned char* dst, uint32_t w, uint32_t n) {
  if (n >= 4 && uintptr_t(dst) % 4 == 0) {
    store_word<4>(dst, w);
    return;
  }
  for (uint32_t i = 0; i < (n < 4 ? n : 4); ++i) dst[i] = (unsigned char)(w >> (8 * i));
}

// Every word carries its flag, so no fence orders them: each thread stores
// its words whole.
RCCL_HD void ll_encode(unsigned char* slot, const uint32_t meta[4], const unsigned char* data,
                       uint32_t len, uint32_t flag, uint32_t thread, uint32_t threads) {
  uint64_t* words = reinterpret_cast<uint64_t*>(slot);
  const uint32_t nwords = (len + 3) / 4;
  for (uint32_t i = thread; i < nwords; i += threads) {
    const uint32_t value = ll_word_gather(data + 4 * uint64_t(i), len - 4 * i);
    store_relaxed_u64(words + kLLHeaderWords + i, ll_pair(value, flag));
  }
  if (thread == 0) {
    for (int k = 3; k >= 0; --k) store_relaxed_u64(words + k, ll_pair(meta[k], flag));
  }
}

// Reads a slot written with `flag` into `out` (at most `cap` bytes) and its
// header into `meta`; false while any word of it lacks the flag. Thread 0
// polls the header; only once it is there do the others read the payload.
RCCL_HD bool ll_decode(const unsigned char* slot, unsigned char* out, uint32_t cap, uint32_t flag,
                       uint32_t meta[4], uint32_t thread, uint32_t threads) {
  const uint64_t* words = reinterpret_cast<const uint64_t*>(slot);
  bool header = true;
  if (thread == 0) {
    for (int k = 0; k < 4; ++k)
      header = header && uint32_t(load_acquire_u64(words + k) >> 32) == flag;
  }
  if (!first_thread_says(header, thread)) return false;
  uint64_t head_words[4];
  const Vec16 first = load_whole16(slot), second = load_whole16(slot + 16);
  __builtin_memcpy(head_words, &first, 16);
  __builtin_memcpy(head_words + 2, &second, 16);
  for (int k = 0; k < 4; ++k) meta[k] = uint32_t(head_words[k]);
  const uint32_t len = meta[0] < cap ? meta[0] : cap;
  const uint32_t nwords = (len + 3) / 4;
  bool ok = true;
  for (uint32_t i = thread; i < nwords; i += threads) {
    const uint64_t w = load_acquire_u64(words + kLLHeaderWords + i);
    if (uint32_t(w >> 32) != flag) {
      ok = false;
      continue;
    }
    ll_word_scatter(out + 4 * uint64_t(i), uint32_t(w), len - 4 * i);
  }
  return all_threads(ok);
}

// ---- LL128 ----

// A line moves as 8 chunks of 16 bytes: chunks 0-6 hold data bytes
// 0-111, chunk 7 data bytes 112-119 and the line's flag.
constexpr uint64_t kLL128Chunks = kLL128Line / 16;

RCCL_HD uint64_t* ll128_flag(unsigned char* slot, uint64_t line) {
  return reinterpret_cast<uint64_t*>(slot + line * kLL128Line + kLL128Data);
}

// Data bytes of chunk `j` of the payload lines: where they start in the
// payload and how many a full chunk holds.
RCCL_HD uint64_t ll128_chunk_at(uint64_t j) {
  return j / kLL128Chunks * kLL128Data + j % kLL128Chunks * 16;
}
RCCL_HD uint64_t ll128_chunk_bytes(uint64_t j) { return j % kLL128Chunks == 7 ? 8 : 16; }

// A chunk that is not 16 whole aligned data bytes: `n` of its `full` data
// bytes from `src` (unaligned, or the end of the payload), or the line's
// 8-byte last chunk, whose other half is the flag.
RCCL_NARROW void ll128_edge_pack(unsigned char* chunk, const unsigned char* src, uint64_t n,
                                 uint64_t full) {
  if (full == 16) {
    Vec16 v;
    uint64_t w[2] = {gather_word(src, n), gather_word(src + 8, n > 8 ? n - 8 : 0)};
    __builtin_memcpy(&v, w, 16);
    store_word<16>(chunk, v);
  } else {
    store_word<8>(chunk, gather_word(src, n));
  }
}
// The reverse: `n` data bytes of a chunk into `out`.
RCCL_NARROW void ll128_edge_unpack(unsigned char* out, const unsigned char* chunk, uint64_t n,
                                   uint64_t full) {
  if (full == 16) {
    uint64_t w[2];
    const Vec16 v = load_word<16>(chunk);
    __builtin_memcpy(w, &v, 16);
    scatter_word(out, w[0], n);
    if (n > 8) scatter_word(out + 8, w[1], n - 8);
  } else {
    scatter_word(out, load_word<8>(chunk), n);
  }
}

RCCL_HD void ll128_encode(unsigned char* slot, const uint32_t meta[4], const unsigned char* data,
                          uint32_t len, uint32_t flag, uint32_t thread, uint32_t threads) {
  const uint64_t nlines = (uint64_t(len) + kLL128Data - 1) / kLL128Data;
  unsigned char* lines = slot + kLL128Line;
  for (uint64_t j = thread; j < nlines * kLL128Chunks; j += threads) {
    const uint64_t at = ll128_chunk_at(j), full = ll128_chunk_bytes(j);
    const uint64_t left = at < len ? len - at : 0;
    const uint64_t n = left < full ? left : full;
    unsigned char* dst = lines + j * 16;
    if (full == 16 && n == 16 && uintptr_t(data + at) % 16 == 0) {
      store_word<16>(dst, load_word<16>(data + at));
    } else {
      ll128_edge_pack(dst, data + at, n, full);
    }
  }
  // Every thread's data, one fence, then each line's flag.
  block_sync();
  if (thread == 0) fence_release();
  block_sync();
  for (uint64_t line = thread; line < nlines; line += threads)
    store_relaxed_u64(ll128_flag(slot, 1 + line), flag);
  // The header line last.
  block_sync();
  if (thread == 0) {
    write_meta(slot, meta);
    fence_release();
    store_relaxed_u64(ll128_flag(slot, 0), flag);
  }
}

// Thread 0 polls the header line's flag, a thread per line its line's
// flag; only once all are there does the block read the data.
RCCL_HD bool ll128_decode(const unsigned char* slot, unsigned char* out, uint32_t cap,
                          uint32_t flag, uint32_t meta[4], uint32_t thread, uint32_t threads) {
  unsigned char* s = const_cast<unsigned char*>(slot);
  const bool header = thread == 0 && load_acquire_u64(ll128_flag(s, 0)) == flag;
  if (!first_thread_says(header, thread)) return false;
  read_meta(slot, meta);
  const uint64_t len = meta[0] < cap ? meta[0] : cap;
  const uint64_t nlines = (len + kLL128Data - 1) / kLL128Data;
  bool ok = true;
  for (uint64_t line = thread; line < nlines; line += threads)
    ok = ok && load_acquire_u64(ll128_flag(s, 1 + line)) == flag;
  if (!all_threads(ok)) return false;
  const unsigned char* lines = slot + kLL128Line;
  for (uint64_t j = thread; j < nlines * kLL128Chunks; j += threads) {
    const uint64_t at = ll128_chunk_at(j), full = ll128_chunk_bytes(j);
    if (at >= len) continue;
    const uint64_t left = len - at;
    const uint64_t n = left < full ? left : full;
    if (full == 16 && n == 16 && uintptr_t(out + at) % 16 == 0) {
      store_word<16>(out + at, load_word<16>(lines + j * 16));
    } else {
      ll128_edge_unpack(out + at, lines + j * 16, n, full);
    }
  }
  return true;
}

// ---- Simple ----

RCCL_HD void simple_write(unsigned char* slot, const uint32_t meta[4], const unsigned char* data,
                          uint32_t len, uint32_t thread, uint32_t threads) {
  copy_bytes(slot + kSimpleMeta, data, len, thread, threads);
  if (thread == 0) write_meta(slot, meta);
}

// ---- both ends of a FIFO ----

// Whether the FIFO has a free slot, by the head last read, read again (by
// thread 0) only when that says it is full. Every thread gets the answer.
RCCL_HD bool fifo_has_room(const FifoView& f, FifoEnd& end, uint32_t thread) {
  bool room = false;
  if (thread == 0) {
    if (end.mine - end.theirs >= f.nslots) end.theirs = load_acquire_u32(head_word(f));
    room = end.mine - end.theirs < f.nslots;
  }
  return first_thread_says(room, thread);
}

// Sends one piece of meta[0] bytes (meta: length, seq, call, count) if a
// slot is free: every thread of the block calls it and all get the same
// answer.
RCCL_HD bool fifo_try_send(const FifoView& f, FifoEnd& end, const uint32_t meta[4],
                           const unsigned char* data, uint32_t thread, uint32_t threads) {
  if (!fifo_has_room(f, end, thread)) return false;
  const uint32_t tail = end.mine;
  unsigned char* slot = slot_at(f, tail);
  const uint32_t len = meta[0];
  switch (f.proto) {
    case kLL: ll_encode(slot, meta, data, len, tail + 1, thread, threads); break;
    case kLL128: ll128_encode(slot, meta, data, len, tail + 1, thread, threads); break;
    default: simple_write(slot, meta, data, len, thread, threads); break;
  }
  block_sync();
  if (thread == 0) {
    fence_release();
    store_release_u32(tail_word(f), tail + 1);
    end.mine = tail + 1;
  }
  block_sync();
  return true;
}

// Receives the oldest piece into `out` (at most `cap` bytes) and its header
// into `meta`, then frees its slot; false when none is complete yet.
RCCL_HD bool fifo_try_recv(const FifoView& f, FifoEnd& end, unsigned char* out, uint32_t cap,
                           uint32_t meta[4], uint32_t thread, uint32_t threads) {
  const uint32_t head = end.mine;
  const unsigned char* slot = slot_at(f, head);
  bool ok;
  switch (f.proto) {
    case kLL: ok = ll_decode(slot, out, cap, head + 1, meta, thread, threads); break;
    case kLL128: ok = ll128_decode(slot, out, cap, head + 1, meta, thread, threads); break;
    default: {
      bool ready = false;
      if (thread == 0) {
        if (end.theirs == head) end.theirs = load_acquire_u32(tail_word(f));
        ready = end.theirs != head;
      }
      ok = first_thread_says(ready, thread);
      if (!ok) break;
      read_meta(slot, meta);
      const uint32_t len = meta[0] < cap ? meta[0] : cap;
      copy_bytes(out, slot + kSimpleMeta, len, thread, threads);
      break;
    }
  }
  if (!ok) return false;
  block_sync();
  if (thread == 0) {
    fence_release();
    store_release_u32(head_word(f), head + 1);
    end.mine = head + 1;
  }
  block_sync();
  return true;
}

}  // namespace rccl
