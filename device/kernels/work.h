// Device work: one rank's schedule of one collective (rccl-algorithms'
// Schedule: per channel, steps of primitives over slices of the user's
// buffers), encoded as a position-independent block of plain structs, and
// the interpreter that runs one channel of it over FIFOs (fifo.h) with the
// reductions of reduce.h. The GPU runs a channel per block, every thread
// of the block moving its share of each piece; the host twin runs it on one
// thread (thread 0 of 1). Mirrored by device/src/work.rs.
//
// Layout: a WorkHeader, then its channels, peers, steps and primitives,
// found at byte offsets from the header, so the block can be copied to the
// device as is. Every struct is a multiple of 16 bytes at a 16-byte aligned
// offset: a block reads its descriptors in 16-byte loads only.
#pragma once

#include "fifo.h"
#include "reduce.h"

namespace rccl {

// rccl-algorithms' Prim, in its order.
enum PrimKind : uint32_t {
  kPrimSend = 0,
  kPrimRecv = 1,
  kPrimCopy = 2,
  kPrimCopySend = 3,
  kPrimRecvReduceSend = 4,
  kPrimRecvReduceCopy = 5,
  kPrimRecvReduceCopySend = 6,
  kPrimRecvCopySend = 7,
  kPrimRecvReduceCopyPartial = 8,
  kPrimReduceCopy = 9,
  kPrimReduceCopyPartial = 10,
};

enum BufKind : uint32_t { kBufSend = 0, kBufRecv = 1 };

// Most primitives one step holds (the interpreter keeps their progress).
constexpr uint32_t kMaxStepPrims = 32;

struct WorkPrim {
  uint32_t kind;
  int32_t recv_peer;  // index into the channel's peers, or -1
  int32_t send_peer;  // index into the channel's peers, or -1
  uint32_t src_buf;   // BufKind
  uint32_t dst_buf;   // BufKind
  uint32_t pad;
  uint64_t src_off;   // elements
  uint64_t dst_off;   // elements
  uint64_t len;       // elements
};

struct alignas(16) WorkStep {
  uint32_t first_prim;
  uint32_t nprims;
};

// A peer of a channel: the FIFO this rank sends into and the one it
// receives from.
struct alignas(16) WorkPeer {
  int32_t rank;
  uint32_t pad;
  FifoView send;
  FifoView recv;
};

struct WorkChannel {
  uint32_t first_step;
  uint32_t nsteps;
  uint32_t first_peer;
  uint32_t npeers;
  // Staging for one received or transformed piece: slot_bytes of the
  // channel's FIFOs.
  unsigned char* scratch;
  uint64_t scratch_bytes;
};

struct WorkHeader {
  const unsigned char* sendbuf;
  unsigned char* recvbuf;
  // The reduction (op < 0: none, the collective only moves data).
  uint64_t nranks;
  uint64_t scalar;
  const void* scalar_ptr;
  int32_t dtype;
  int32_t op;
  uint32_t elem_size;
  uint32_t nchannels;
  // Every piece's tag (seq, call) and the call's count.
  uint32_t tag_seq;
  uint32_t tag_call;
  uint32_t tag_count;
  uint32_t pad;
  // Nonzero: stop. Memory the host writes while the work runs (CUDA:
  // mapped pinned memory), set when the call is aborted or fails.
  const uint32_t* abort;
  // Byte offsets from this header.
  uint64_t channels_at;
  uint64_t peers_at;
  uint64_t steps_at;
  uint64_t prims_at;
};

template <class T>
RCCL_HD const T* work_array(const WorkHeader& w, uint64_t at) {
  return reinterpret_cast<const T*>(reinterpret_cast<const unsigned char*>(&w) + at);
}

RCCL_HD unsigned char* work_addr(const WorkHeader& w, uint32_t buf, uint64_t elem) {
  unsigned char* base = buf == kBufSend ? const_cast<unsigned char*>(w.sendbuf) : w.recvbuf;
  return base + elem * w.elem_size;
}

// One block of a device-work launch: the channel it runs and the word
// that gets the channel's end. Mirrored by `WorkBlock` in Rust.
struct alignas(16) WorkBlock {
  const WorkHeader* work;
  int32_t* status;
  uint32_t channel;
  uint32_t pad;
};

// One peer of the running block's channel: its descriptor, copied in
// when the channel starts, and the block's ends of the FIFOs with it.
struct alignas(16) PeerEnds {
  WorkPeer peer;
  FifoEnd send;
  FifoEnd recv;
};

// What a block keeps while it runs a channel, in the block's memory (the
// GPU's shared memory): the descriptors, copied in by 16-byte loads of
// many threads (the header and channel when the channel starts, each step
// and its primitives when the step starts), each primitive's progress
// (elements moved so far) and the channel's deadline. The loop reads them
// here after each call instead of keeping them in registers across it
// (where the calls' register convention would spill them); indexed at run
// time, the primitives and their progress would otherwise live on each
// thread's stack.
struct alignas(16) WorkLocal {
  WorkHeader header;
  WorkChannel channel;
  WorkStep step;
  WorkPrim prims[kMaxStepPrims];
  uint64_t done[kMaxStepPrims];
  uint64_t deadline;
  uint64_t pad;
};

// `bytes` (a multiple of 16) of descriptors from `src` to `dst`, both
// 16-byte aligned, this thread's share; the block meets at a barrier
// before reading them.
RCCL_HD void load_descriptors(void* dst, const void* src, uint64_t bytes, uint32_t thread,
                              uint32_t threads) {
  copy_aligned<16>(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes,
                   thread, threads);
}


// out = acc op input over n elements (acc null: the input transform
// alone); `partial`: the input is a partial result, which takes no input
// transform. The call's reduction comes by value: this function is out of
// line, and a reference would read the caller's shared-memory header
// through generic loads.
RCCL_HD_OUTLINE void work_reduce_call(uint64_t nranks, uint64_t scalar, const void* scalar_ptr,
                                      int32_t dtype, int32_t op, const void* acc,
                                      const void* input, void* out, uint64_t n, bool finish,
                                      bool partial, uint32_t thread, uint32_t threads) {
  ReduceArgs a;
  a.acc = acc;
  a.input = input;
  a.out = out;
  a.count = n;
  a.nranks = nranks;
  a.scalar = scalar;
  a.scalar_ptr = scalar_ptr;
  a.dtype = dtype;
  a.op = op;
  a.finish = finish ? 1 : 0;
  a.partial = partial ? 1 : 0;
  reduce_any(a, thread, threads);
  block_sync();
}
RCCL_HD void work_reduce(const WorkHeader& w, const void* acc, const void* input, void* out,
                         uint64_t n, bool finish, bool partial, uint32_t thread,
                         uint32_t threads) {
  work_reduce_call(w.nranks, w.scalar, w.scalar_ptr, w.dtype, w.op, acc, input, out, n, finish,
                   partial, thread, threads);
}

// out = src, through the input transform when src is the user's send
// buffer of a reducing collective.
RCCL_HD void work_load(const WorkHeader& w, uint32_t src_buf, const unsigned char* src,
                       unsigned char* out, uint64_t n, uint32_t thread, uint32_t threads) {
  if (w.op >= 0 && src_buf == kBufSend) {
    work_reduce(w, nullptr, src, out, n, false, false, thread, threads);
  } else if (src != out) {
    copy_bytes(out, src, n * w.elem_size, thread, threads);
    block_sync();
  }
}

// Moves one piece of `p` (done elements of it so far); the elements moved,
// 0 when its FIFOs are not ready.
RCCL_HD uint64_t work_advance(const WorkHeader& w, const WorkChannel& ch, PeerEnds* ends,
                              const WorkPrim& p, uint64_t done, uint32_t thread,
                              uint32_t threads) {
  const uint64_t es = w.elem_size;
  const unsigned char* src = work_addr(w, p.src_buf, p.src_off + done);
  unsigned char* dst = work_addr(w, p.dst_buf, p.dst_off + done);
  unsigned char* scratch = ch.scratch;
  const uint32_t meta_tail[3] = {w.tag_seq, w.tag_call, w.tag_count};
  const FifoView* to = p.send_peer >= 0 ? &ends[p.send_peer].peer.send : nullptr;
  const FifoView* from = p.recv_peer >= 0 ? &ends[p.recv_peer].peer.recv : nullptr;
  FifoEnd* to_end = p.send_peer >= 0 ? &ends[p.send_peer].send : nullptr;
  FifoEnd* from_end = p.recv_peer >= 0 ? &ends[p.recv_peer].recv : nullptr;
  uint64_t n = p.len - done;

  if (from == nullptr) {
    // Local primitives and plain sends.
    if (to != nullptr) {
      const uint64_t cap = to->slot_bytes / es;
      n = n < cap ? n : cap;
      if (!fifo_has_room(*to, *to_end, thread)) return 0;
    }
    switch (p.kind) {
      case kPrimCopy: work_load(w, p.src_buf, src, dst, n, thread, threads); return n;
      case kPrimReduceCopy:
      case kPrimReduceCopyPartial:
        work_reduce(w, dst, src, dst, n, p.kind == kPrimReduceCopy, p.src_buf != kBufSend, thread,
                    threads);
        return n;
      default: break;
    }
    const unsigned char* piece = src;
    if (p.kind == kPrimCopySend) {
      work_load(w, p.src_buf, src, dst, n, thread, threads);
      piece = dst;
    } else if (w.op >= 0 && p.src_buf == kBufSend) {
      work_load(w, p.src_buf, src, scratch, n, thread, threads);
      piece = scratch;
    }
    const uint32_t meta[4] = {uint32_t(n * es), meta_tail[0], meta_tail[1], meta_tail[2]};
    return fifo_try_send(*to, *to_end, meta, piece, thread, threads) ? n : 0;
  }

  // A forwarding primitive takes a piece only when it can pass it on.
  if (to != nullptr && !fifo_has_room(*to, *to_end, thread)) return 0;
  uint32_t meta[4];
  if (!fifo_try_recv(*from, *from_end, scratch, uint32_t(ch.scratch_bytes), meta, thread,
                     threads))
    return 0;
  uint64_t got = meta[0] / es;
  got = got < n ? got : n;
  const bool partial = p.src_buf != kBufSend;
  switch (p.kind) {
    case kPrimRecv: copy_bytes(dst, scratch, got * es, thread, threads); break;
    case kPrimRecvCopySend: copy_bytes(dst, scratch, got * es, thread, threads); break;
    case kPrimRecvReduceSend:
      work_reduce(w, scratch, src, scratch, got, false, partial, thread, threads);
      break;
    case kPrimRecvReduceCopy:
    case kPrimRecvReduceCopyPartial:
      work_reduce(w, scratch, src, dst, got, p.kind == kPrimRecvReduceCopy, partial, thread,
                  threads);
      break;
    case kPrimRecvReduceCopySend:
      work_reduce(w, scratch, src, scratch, got, true, partial, thread, threads);
      copy_bytes(dst, scratch, got * es, thread, threads);
      break;
    default: break;
  }
  block_sync();
  if (to != nullptr) {
    const uint32_t out_meta[4] = {uint32_t(got * es), meta_tail[0], meta_tail[1], meta_tail[2]};
    // Room was checked above and only this block fills `to`.
    fifo_try_send(*to, *to_end, out_meta, scratch, thread, threads);
  }
  return got;
}

// Whether an earlier unfinished primitive of the step shares p's send or
// receive peer (messages to or from one peer go in the order listed).
RCCL_HD bool work_blocked(const WorkPrim* prims, const uint64_t* done, uint32_t k) {
  for (uint32_t j = 0; j < k; ++j) {
    if (done[j] == prims[j].len) continue;
    if (prims[k].send_peer >= 0 && prims[j].send_peer == prims[k].send_peer) return true;
    if (prims[k].recv_peer >= 0 && prims[j].recv_peer == prims[k].recv_peer) return true;
  }
  return false;
}

// Runs channel `c` of `work` to the end: 0 done, 1 aborted, 2 still
// waiting `timeout_ns` after it started (clock_ns; a deadline past the
// clock's range is none), 3 too large (a step holds too many primitives,
// or the channel more peers than `ends` holds: `max_ends`). `local` and
// `ends` are the running block's memory.
RCCL_HD int work_run_channel(const WorkHeader* work, uint32_t c, uint64_t timeout_ns,
                             WorkLocal& local, PeerEnds* ends, uint32_t max_ends, uint32_t thread,
                             uint32_t threads) {
  load_descriptors(&local.header, work, sizeof(WorkHeader), thread, threads);
  block_sync();
  const WorkHeader& w = local.header;
  load_descriptors(&local.channel, work_array<WorkChannel>(*work, w.channels_at) + c,
                   sizeof(WorkChannel), thread, threads);
  block_sync();
  const WorkChannel& ch = local.channel;
  if (ch.npeers > max_ends) return 3;
  // The peers' descriptors lie apart in `ends`: one 16-byte word at a time.
  const WorkPeer* peers = work_array<WorkPeer>(*work, w.peers_at) + ch.first_peer;
  constexpr uint32_t kPeerWords = sizeof(WorkPeer) / 16;
  for (uint32_t i = thread; i < ch.npeers * kPeerWords; i += threads) {
    const uint32_t k = i / kPeerWords, word = i % kPeerWords;
    store_word<16>(reinterpret_cast<unsigned char*>(&ends[k].peer) + 16 * word,
                   load_word<16>(reinterpret_cast<const unsigned char*>(peers + k) + 16 * word));
  }
  block_sync();
  if (thread == 0) {
    for (uint32_t k = 0; k < ch.npeers; ++k) {
      ends[k].send = producer_end(ends[k].peer.send);
      ends[k].recv = consumer_end(ends[k].peer.recv);
    }
    const uint64_t start = clock_ns();
    local.deadline = start > UINT64_MAX - timeout_ns ? UINT64_MAX : start + timeout_ns;
  }
  const WorkPrim* prims = local.prims;
  uint64_t* done = local.done;
  for (uint32_t s = 0; s < ch.nsteps; ++s) {
    // Every thread is done with the last step.
    block_sync();
    load_descriptors(&local.step, work_array<WorkStep>(*work, w.steps_at) + ch.first_step + s,
                     sizeof(WorkStep), thread, threads);
    block_sync();
    if (local.step.nprims > kMaxStepPrims) return 3;
    load_descriptors(local.prims, work_array<WorkPrim>(*work, w.prims_at) + local.step.first_prim,
                     local.step.nprims * sizeof(WorkPrim), thread, threads);
    if (thread == 0) {
      for (uint32_t k = 0; k < local.step.nprims; ++k) done[k] = 0;
    }
    block_sync();
    for (;;) {
      bool finished = true, moved = false;
      for (uint32_t k = 0; k < local.step.nprims; ++k) {
        if (done[k] == prims[k].len) continue;
        finished = false;
        if (work_blocked(prims, done, k)) continue;
        const uint64_t n = work_advance(w, ch, ends, prims[k], done[k], thread, threads);
        // Every thread has read done[k]; thread 0 alone updates it.
        block_sync();
        if (thread == 0) done[k] += n;
        block_sync();
        moved = moved || n > 0;
      }
      if (finished) break;
      if (!moved) {
        const bool aborted = thread == 0 && w.abort != nullptr && load_relaxed_u32(w.abort) != 0;
        if (first_thread_says(aborted, thread)) return 1;
        if (first_thread_says(clock_ns() >= local.deadline, thread)) return 2;
        idle_pause();
      }
    }
  }
  return 0;
}

}  // namespace rccl
