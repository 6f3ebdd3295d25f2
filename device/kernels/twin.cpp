// The host twin: the kernels' sources compiled by the host's C++ compiler,
// thread 0 of 1 on the calling thread. The Rust tests call it to check the
// data path bit for bit against rccl's host kernels and the host FIFOs.
// It needs no C++ runtime (programs link the engine's static library with
// a C compiler): memory comes from malloc.
#include <stdlib.h>

#include "fifo.h"
#include "reduce.h"
#include "work.h"

extern "C" {

void rccl_twin_reduce(const rccl::ReduceArgs* args) { rccl::reduce_any(*args, 0, 1); }

void rccl_twin_copy(void* dst, const void* src, uint64_t bytes) {
  rccl::copy_bytes(dst, src, bytes, 0, 1);
}

int rccl_twin_fifo_send(const rccl::FifoView* fifo, const uint32_t meta[4],
                        const unsigned char* data) {
  rccl::FifoEnd end = rccl::producer_end(*fifo);
  return rccl::fifo_try_send(*fifo, end, meta, data, 0, 1) ? 1 : 0;
}

int rccl_twin_fifo_recv(const rccl::FifoView* fifo, unsigned char* out, uint32_t cap,
                        uint32_t meta[4]) {
  rccl::FifoEnd end = rccl::consumer_end(*fifo);
  return rccl::fifo_try_recv(*fifo, end, out, cap, meta, 0, 1) ? 1 : 0;
}

int rccl_twin_run_channel(const rccl::WorkHeader* work, uint32_t channel, uint64_t timeout_ns) {
  const rccl::WorkChannel& ch =
      rccl::work_array<rccl::WorkChannel>(*work, work->channels_at)[channel];
  // Each peer is filled in by the channel's start.
  auto* ends = static_cast<rccl::PeerEnds*>(calloc(ch.npeers ? ch.npeers : 1, sizeof(rccl::PeerEnds)));
  auto* local = static_cast<rccl::WorkLocal*>(calloc(1, sizeof(rccl::WorkLocal)));
  // Without memory for them the channel cannot start: "too large".
  int end = 3;
  if (ends != nullptr && local != nullptr)
    end = rccl::work_run_channel(work, channel, timeout_ns, *local, ends, ch.npeers, 0, 1);
  free(local);
  free(ends);
  return end;
}

void rccl_twin_block_memory(uint64_t* peer_ends, uint64_t* work_local) {
  *peer_ends = sizeof(rccl::PeerEnds);
  *work_local = sizeof(rccl::WorkLocal);
}

}  // extern "C"
