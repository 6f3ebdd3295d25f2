//! The host twin of the kernels: `kernels/`'s sources compiled by the
//! host's C++ compiler (build.rs), run on the calling thread (thread 0 of
//! 1). The GPU runs the same statements with every thread of a block; tests hold the twin to rccl's
//! host kernels and FIFOs bit for bit.

use std::ffi::c_void;

use crate::abi::{FifoView, ReduceArgs};
use crate::work::{Work, WorkHeader};

extern "C" {
    fn rccl_twin_reduce(args: *const ReduceArgs);
    fn rccl_twin_copy(dst: *mut c_void, src: *const c_void, bytes: u64);
    fn rccl_twin_fifo_send(fifo: *const FifoView, meta: *const u32, data: *const u8) -> i32;
    fn rccl_twin_fifo_recv(fifo: *const FifoView, out: *mut u8, cap: u32, meta: *mut u32) -> i32;
    fn rccl_twin_run_channel(work: *const WorkHeader, channel: u32, timeout_ns: u64) -> i32;
    fn rccl_twin_block_memory(peer_ends: *mut u64, work_local: *mut u64);
}

/// Bytes of the kernels' `PeerEnds` and `WorkLocal` as the C++ compiler
/// lays them out (what [`crate::work::PEER_ENDS_BYTES`] and
/// [`crate::work::WORK_LOCAL_BYTES`] mirror).
pub fn block_memory() -> (usize, usize) {
    let (mut peer_ends, mut work_local) = (0u64, 0u64);
    // SAFETY: the twin writes one word through each pointer.
    unsafe { rccl_twin_block_memory(&mut peer_ends, &mut work_local) };
    (peer_ends as usize, work_local as usize)
}

/// How a channel of device work ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelEnd {
    /// Every step ran.
    Done,
    /// The abort word was set.
    Aborted,
    /// It still waited `timeout_ns` after it started.
    GaveUp,
    /// A step held more primitives than the interpreter keeps, or the
    /// channel more peers than the block keeps FIFO ends for.
    TooLarge,
}

/// Runs channel `channel` of `work` on this thread to its end, giving up
/// once it waits `timeout_ns` after it started (on the host's monotonic
/// clock, which stands for the GPU's global timer; `u64::MAX`: never).
///
/// # Safety
/// Every buffer, FIFO and scratch address in `work` is valid host memory
/// of the sizes its schedule uses; the peers' ends of its FIFOs are run by
/// other threads; no other thread runs this channel of this work.
pub unsafe fn run_channel(work: &Work, channel: usize, timeout_ns: u64) -> ChannelEnd {
    assert!(
        channel < work.nchannels(),
        "channel {channel} of {}",
        work.nchannels()
    );
    // SAFETY: the caller's contract; the block is a complete encoding.
    unsafe { run_encoded_channel(work.header(), channel as u32, timeout_ns) }
}

/// Runs channel `channel` of the encoded work at `header` (a block copied
/// to device memory, as a kernel sees it) on this thread to its end.
///
/// # Safety
/// As [`run_channel`], `header` starting a complete encoding of more than
/// `channel` channels.
pub unsafe fn run_encoded_channel(
    header: *const WorkHeader,
    channel: u32,
    timeout_ns: u64,
) -> ChannelEnd {
    // SAFETY: the caller's contract.
    match unsafe { rccl_twin_run_channel(header, channel, timeout_ns) } {
        0 => ChannelEnd::Done,
        1 => ChannelEnd::Aborted,
        2 => ChannelEnd::GaveUp,
        _ => ChannelEnd::TooLarge,
    }
}

/// Runs the reduction `args` describes.
///
/// # Safety
/// `input` and `out` (and `acc` unless null, `scalar_ptr` unless null) are
/// valid for `count` elements of the datatype (one for the scalar), each
/// pair identical or disjoint.
pub unsafe fn reduce(args: &ReduceArgs) {
    // SAFETY: the caller's contract; the twin reads `args` only.
    unsafe { rccl_twin_reduce(args) }
}

/// Copies `bytes` bytes.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `bytes` bytes, disjoint.
pub unsafe fn copy(dst: *mut c_void, src: *const c_void, bytes: u64) {
    // SAFETY: the caller's contract.
    unsafe { rccl_twin_copy(dst, src, bytes) }
}

/// Sends `data` as one piece tagged `(seq, call, count)` if the FIFO has a
/// free slot; whether it was sent.
///
/// # Safety
/// `fifo` describes FIFO memory (zeroed when first used) that holds its
/// control block and `nslots` slots, used by one producer (this caller)
/// and one consumer; `data.len()` is at most `slot_bytes`.
pub unsafe fn fifo_send(fifo: &FifoView, data: &[u8], tag: [u32; 3]) -> bool {
    let meta = [data.len() as u32, tag[0], tag[1], tag[2]];
    // SAFETY: the caller's contract; `meta` holds 4 words.
    unsafe { rccl_twin_fifo_send(fifo, meta.as_ptr(), data.as_ptr()) != 0 }
}

/// Receives the oldest piece into `out` (at most `out.len()` bytes) and
/// frees its slot: `(length, [seq, call, count])`, or `None` when no piece
/// is complete yet.
///
/// # Safety
/// As [`fifo_send`], this caller being the consumer.
pub unsafe fn fifo_recv(fifo: &FifoView, out: &mut [u8]) -> Option<(usize, [u32; 3])> {
    let mut meta = [0u32; 4];
    let cap = u32::try_from(out.len()).unwrap_or(u32::MAX);
    // SAFETY: the caller's contract; `out` holds `cap` bytes, `meta` 4 words.
    let got = unsafe { rccl_twin_fifo_recv(fifo, out.as_mut_ptr(), cap, meta.as_mut_ptr()) };
    (got != 0).then_some((
        (meta[0] as usize).min(out.len()),
        [meta[1], meta[2], meta[3]],
    ))
}
