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
//   line (length, seq, call, count) then the payload lines. The lanes of a
//   warp store a line's data, fence, then its flag; the header line goes
//   last.
#pragma once

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

// Up to `n` bytes from `src` into an 8-byte word, zero-padded.
RCCL_HD uint64_t gather_word(const unsigned char* src, uint64_t n) {
  uint64_t w = 0;
  if (n >= 8) {
    __builtin_memcpy(&w, src, 8);
  } else {
    for (uint64_t i = 0; i < n; ++i) w |= uint64_t(src[i]) << (8 * i);
  }
  return w;
}
RCCL_HD void scatter_word(unsigned char* dst, uint64_t w, uint64_t n) {
  if (n >= 8) {
    __builtin_memcpy(dst, &w, 8);
  } else {
    for (uint64_t i = 0; i < n; ++i) dst[i] = (unsigned char)(w >> (8 * i));
  }
}

// ---- LL ----

RCCL_HD uint64_t ll_pair(uint32_t value, uint32_t flag) {
  return uint64_t(value) | (uint64_t(flag) << 32);
}

RCCL_HD void ll_encode(unsigned char* slot, const uint32_t meta[4], const unsigned char* data,
                       uint32_t len, uint32_t flag, uint32_t lane, uint32_t lanes) {
  uint64_t* words = reinterpret_cast<uint64_t*>(slot);
  const uint32_t nwords = (len + 3) / 4;
  for (uint32_t i = lane; i < nwords; i += lanes) {
    uint32_t left = len - 4 * i;
    uint32_t value = uint32_t(gather_word(data + 4 * uint64_t(i), left < 4 ? left : 4));
    store_relaxed_u64(words + kLLHeaderWords + i, ll_pair(value, flag));
  }
  if (lane == 0) {
    for (int k = 3; k >= 0; --k) store_relaxed_u64(words + k, ll_pair(meta[k], flag));
  }
}

// Reads a slot written with `flag` into `out` (at most `cap` bytes) and its
// header into `meta`; false while any word of it lacks the flag.
RCCL_HD bool ll_decode(const unsigned char* slot, unsigned char* out, uint32_t cap, uint32_t flag,
                       uint32_t meta[4], uint32_t lane, uint32_t lanes) {
  const uint64_t* words = reinterpret_cast<const uint64_t*>(slot);
  bool ok = true;
  for (int k = 0; k < 4; ++k) {
    uint64_t w = load_acquire_u64(words + k);
    ok = ok && uint32_t(w >> 32) == flag;
    meta[k] = uint32_t(w);
  }
  const uint32_t len = ok ? (meta[0] < cap ? meta[0] : cap) : 0;
  const uint32_t nwords = (len + 3) / 4;
  for (uint32_t i = lane; i < nwords; i += lanes) {
    uint64_t w = load_acquire_u64(words + kLLHeaderWords + i);
    if (uint32_t(w >> 32) != flag) {
      ok = false;
      continue;
    }
    uint32_t left = len - 4 * i;
    scatter_word(out + 4 * uint64_t(i), uint32_t(w), left < 4 ? left : 4);
  }
  return all_lanes(ok);
}

// ---- LL128 ----

RCCL_HD uint64_t* ll128_flag(unsigned char* slot, uint64_t line) {
  return reinterpret_cast<uint64_t*>(slot + line * kLL128Line + kLL128Data);
}

RCCL_HD void ll128_encode(unsigned char* slot, const uint32_t meta[4], const unsigned char* data,
                          uint32_t len, uint32_t flag, uint32_t lane, uint32_t lanes) {
  const uint64_t nlines = (uint64_t(len) + kLL128Data - 1) / kLL128Data;
  const uint64_t per_line = kLL128Data / 8;
  for (uint64_t j = lane; j < nlines * per_line; j += lanes) {
    uint64_t line = j / per_line, w = j % per_line;
    uint64_t at = line * kLL128Data + w * 8;
    uint64_t left = at < len ? len - at : 0;
    uint64_t* dst = reinterpret_cast<uint64_t*>(slot + (1 + line) * kLL128Line + w * 8);
    *dst = gather_word(data + at, left < 8 ? left : 8);
  }
  // Every lane's data, then each line's flag.
  lanes_sync();
  fence_release();
  for (uint64_t line = lane; line < nlines; line += lanes)
    store_relaxed_u64(ll128_flag(slot, 1 + line), flag);
  // The header line last.
  lanes_sync();
  if (lane == 0) {
    __builtin_memcpy(slot, meta, 16);
    fence_release();
    store_relaxed_u64(ll128_flag(slot, 0), flag);
  }
}

RCCL_HD bool ll128_decode(const unsigned char* slot, unsigned char* out, uint32_t cap,
                          uint32_t flag, uint32_t meta[4], uint32_t lane, uint32_t lanes) {
  unsigned char* s = const_cast<unsigned char*>(slot);
  bool ok = load_acquire_u64(ll128_flag(s, 0)) == flag;
  if (ok) __builtin_memcpy(meta, slot, 16);
  const uint64_t len = ok ? (meta[0] < cap ? meta[0] : cap) : 0;
  const uint64_t nlines = (len + kLL128Data - 1) / kLL128Data;
  const uint64_t per_line = kLL128Data / 8;
  for (uint64_t j = lane; j < nlines * per_line; j += lanes) {
    uint64_t line = j / per_line, w = j % per_line;
    if (load_acquire_u64(ll128_flag(s, 1 + line)) != flag) {
      ok = false;
      continue;
    }
    uint64_t at = line * kLL128Data + w * 8;
    if (at >= len) continue;
    uint64_t v;
    __builtin_memcpy(&v, slot + (1 + line) * kLL128Line + w * 8, 8);
    uint64_t left = len - at;
    scatter_word(out + at, v, left < 8 ? left : 8);
  }
  return all_lanes(ok);
}

// ---- Simple ----

RCCL_HD void simple_write(unsigned char* slot, const uint32_t meta[4], const unsigned char* data,
                          uint32_t len, uint32_t lane, uint32_t lanes) {
  unsigned char* payload = slot + kSimpleMeta;
  for (uint32_t i = lane; i < len; i += lanes) payload[i] = data[i];
  if (lane == 0) __builtin_memcpy(slot, meta, 16);
}

// ---- both ends of a FIFO ----

// Sends one piece of meta[0] bytes (meta: length, seq, call, count) if a
// slot is free: every lane calls it and all get the same answer.
RCCL_HD bool fifo_try_send(const FifoView& f, const uint32_t meta[4], const unsigned char* data,
                           uint32_t lane, uint32_t lanes) {
  const uint32_t tail = load_relaxed_u32(tail_word(f));
  const uint32_t head = load_acquire_u32(head_word(f));
  if (!all_lanes(tail - head < f.nslots)) return false;
  unsigned char* slot = slot_at(f, tail);
  const uint32_t len = meta[0];
  switch (f.proto) {
    case kLL: ll_encode(slot, meta, data, len, tail + 1, lane, lanes); break;
    case kLL128: ll128_encode(slot, meta, data, len, tail + 1, lane, lanes); break;
    default: simple_write(slot, meta, data, len, lane, lanes); break;
  }
  lanes_sync();
  if (lane == 0) {
    fence_release();
    store_release_u32(tail_word(f), tail + 1);
  }
  lanes_sync();
  return true;
}

// Receives the oldest piece into `out` (at most `cap` bytes) and its header
// into `meta`, then frees its slot; false when none is complete yet.
RCCL_HD bool fifo_try_recv(const FifoView& f, unsigned char* out, uint32_t cap, uint32_t meta[4],
                           uint32_t lane, uint32_t lanes) {
  const uint32_t head = load_relaxed_u32(head_word(f));
  const unsigned char* slot = slot_at(f, head);
  bool ok;
  switch (f.proto) {
    case kLL: ok = ll_decode(slot, out, cap, head + 1, meta, lane, lanes); break;
    case kLL128: ok = ll128_decode(slot, out, cap, head + 1, meta, lane, lanes); break;
    default: {
      ok = all_lanes(load_acquire_u32(tail_word(f)) != head);
      if (!ok) break;
      __builtin_memcpy(meta, slot, 16);
      const uint32_t len = meta[0] < cap ? meta[0] : cap;
      for (uint32_t i = lane; i < len; i += lanes) out[i] = slot[kSimpleMeta + i];
      break;
    }
  }
  if (!ok) return false;
  lanes_sync();
  if (lane == 0) {
    fence_release();
    store_release_u32(head_word(f), head + 1);
  }
  lanes_sync();
  return true;
}

}  // namespace rccl
