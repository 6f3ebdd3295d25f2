//! Device work: one rank's schedule (rccl-algorithms' `Schedule`) encoded
//! for the kernels' interpreter (`kernels/work.h`), as one
//! position-independent block: a header, then channels, peers, steps and
//! primitives at byte offsets from it, so the block can be copied to
//! device memory as is. Each struct is a multiple of 16 bytes at a 16-byte
//! aligned offset: the kernels read them in 16-byte loads.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::mem::size_of;

use rccl_algorithms::{Buf, Prim, Schedule};

use crate::abi::FifoView;

/// Most primitives one step may hold (`kMaxStepPrims`).
pub const MAX_STEP_PRIMS: usize = 32;

/// One primitive (`rccl::WorkPrim`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkPrim {
    pub kind: u32,
    pub recv_peer: i32,
    pub send_peer: i32,
    pub src_buf: u32,
    pub dst_buf: u32,
    pub pad: u32,
    pub src_off: u64,
    pub dst_off: u64,
    pub len: u64,
}

/// One step: a run of primitives (`rccl::WorkStep`).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkStep {
    pub first_prim: u32,
    pub nprims: u32,
}

/// A peer of a channel and the FIFOs to and from it (`rccl::WorkPeer`).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct WorkPeer {
    pub rank: i32,
    pub pad: u32,
    pub send: FifoView,
    pub recv: FifoView,
}

/// One channel (`rccl::WorkChannel`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WorkChannel {
    pub first_step: u32,
    pub nsteps: u32,
    pub first_peer: u32,
    pub npeers: u32,
    pub scratch: *mut u8,
    pub scratch_bytes: u64,
}

/// One block of a device-work launch (`rccl::WorkBlock`): the channel it
/// runs and the word that gets the channel's end.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct WorkBlock {
    pub work: *const WorkHeader,
    pub status: *mut i32,
    pub channel: u32,
    pub pad: u32,
}

/// What a block keeps for one peer of its channel in its dynamic shared
/// memory (`rccl::PeerEnds`: the peer's descriptor, then each FIFO end's
/// own counter and the peer's as last read).
pub const PEER_ENDS_BYTES: usize = size_of::<WorkPeer>() + 16;

/// The static shared memory of a block running device work
/// (`rccl::WorkLocal`: the header, the channel, one step and its
/// primitives, their progress, the deadline and a pad word), besides its
/// own `WorkBlock`.
pub const WORK_LOCAL_BYTES: usize = size_of::<WorkHeader>()
    + size_of::<WorkChannel>()
    + size_of::<WorkStep>()
    + MAX_STEP_PRIMS * (size_of::<WorkPrim>() + 8)
    + 16;

/// The call and where its parts are (`rccl::WorkHeader`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WorkHeader {
    pub sendbuf: *const u8,
    pub recvbuf: *mut u8,
    pub nranks: u64,
    pub scalar: u64,
    pub scalar_ptr: *const c_void,
    pub dtype: i32,
    /// `ncclRedOp_t` (or [`crate::abi::op::PRE_MUL_SUM`]); negative when
    /// the collective does not reduce.
    pub op: i32,
    pub elem_size: u32,
    pub nchannels: u32,
    pub tag_seq: u32,
    pub tag_call: u32,
    pub tag_count: u32,
    pub pad: u32,
    pub abort: *const u32,
    pub channels_at: u64,
    pub peers_at: u64,
    pub steps_at: u64,
    pub prims_at: u64,
}

// The kernels load every descriptor in 16-byte words.
const _: () = assert!(
    size_of::<WorkHeader>().is_multiple_of(16)
        && size_of::<WorkChannel>().is_multiple_of(16)
        && size_of::<WorkPeer>().is_multiple_of(16)
        && size_of::<WorkStep>().is_multiple_of(16)
        && size_of::<WorkPrim>().is_multiple_of(16)
        && size_of::<WorkBlock>().is_multiple_of(16)
);

/// What the encoder needs besides the schedule: the call (buffers, the
/// reduction, the tag) as the device sees it.
#[derive(Clone, Copy, Debug)]
pub struct WorkCall {
    pub sendbuf: *const u8,
    pub recvbuf: *mut u8,
    pub dtype: i32,
    pub op: i32,
    pub nranks: u64,
    pub scalar: u64,
    pub scalar_ptr: *const c_void,
    pub elem_size: u32,
    /// The tag every piece carries: seq, call, count.
    pub tag: [u32; 3],
    /// A word the interpreter polls while it waits; nonzero stops it.
    pub abort: *const u32,
}

/// Where a channel's bytes go: the FIFOs to and from each peer, and the
/// channel's staging buffer (at least one slot).
pub trait WorkLinks {
    /// `(send, recv)` FIFOs of `channel` with `peer`.
    fn fifos(&self, channel: usize, peer: usize) -> (FifoView, FifoView);
    /// The staging buffer of `channel` and its size in bytes.
    fn scratch(&self, channel: usize) -> (*mut u8, u64);
}

/// An encoded schedule, ready for the interpreter.
#[derive(Debug)]
pub struct Work {
    /// The block, 8-byte aligned.
    words: Vec<u64>,
}

// SAFETY: the block holds plain data and addresses the interpreter uses;
// it is only read once built.
unsafe impl Send for Work {}
// SAFETY: as above.
unsafe impl Sync for Work {}

impl Work {
    /// The header, followed by the arrays it points at.
    pub fn header(&self) -> *const WorkHeader {
        self.words.as_ptr().cast()
    }

    /// The block's bytes (to copy to device memory).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the words are initialized; u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.words.len() * 8) }
    }

    /// Channels of the work.
    pub fn nchannels(&self) -> usize {
        // SAFETY: the block starts with a header.
        unsafe { (*self.header()).nchannels as usize }
    }

    /// The channels, as encoded.
    fn channels(&self) -> &[WorkChannel] {
        // SAFETY: the block starts with a header whose `channels_at` is the
        // 8-byte aligned offset of `nchannels` channels inside the block.
        unsafe {
            let header = &*self.header();
            let at = self
                .words
                .as_ptr()
                .cast::<u8>()
                .add(header.channels_at as usize);
            std::slice::from_raw_parts(at.cast(), header.nchannels as usize)
        }
    }

    /// The most peers one channel of the work has (the FIFO ends a block
    /// running it keeps).
    pub fn max_channel_peers(&self) -> usize {
        self.channels()
            .iter()
            .map(|c| c.npeers as usize)
            .max()
            .unwrap_or(0)
    }

    /// The protocol of the work's FIFOs ([`rccl_algorithms::Protocol::abi`]),
    /// `None` when it has no peers (local copies only).
    pub fn protocol(&self) -> Option<u32> {
        let channel = self.channels().iter().find(|c| c.npeers > 0)?;
        // SAFETY: as for the channels: `peers_at` is the aligned offset of
        // the block's peers, of which the channel's are a range.
        let peer = unsafe {
            let header = &*self.header();
            let at = self
                .words
                .as_ptr()
                .cast::<u8>()
                .add(header.peers_at as usize);
            // The block is only 8-byte aligned in host memory.
            at.cast::<WorkPeer>()
                .add(channel.first_peer as usize)
                .read_unaligned()
        };
        Some(peer.send.proto)
    }
}

fn kind_of(p: &Prim) -> u32 {
    match p {
        Prim::Send { .. } => 0,
        Prim::Recv { .. } => 1,
        Prim::Copy { .. } => 2,
        Prim::CopySend { .. } => 3,
        Prim::RecvReduceSend { .. } => 4,
        Prim::RecvReduceCopy { .. } => 5,
        Prim::RecvReduceCopySend { .. } => 6,
        Prim::RecvCopySend { .. } => 7,
        Prim::RecvReduceCopyPartial { .. } => 8,
        Prim::ReduceCopy { .. } => 9,
        Prim::ReduceCopyPartial { .. } => 10,
    }
}

fn buf_code(b: Buf) -> u32 {
    match b {
        Buf::Send => 0,
        Buf::Recv => 1,
    }
}

/// Appends `items` to `block` (16-byte aligned), returning their offset.
fn push<T: Copy>(block: &mut Vec<u8>, items: &[T]) -> u64 {
    while !block.len().is_multiple_of(16) {
        block.push(0);
    }
    let at = block.len() as u64;
    // SAFETY: `T` is a `repr(C)` struct of plain fields; its bytes are
    // read as they are (padding included, which is never interpreted).
    let bytes = unsafe {
        std::slice::from_raw_parts(items.as_ptr().cast::<u8>(), std::mem::size_of_val(items))
    };
    block.extend_from_slice(bytes);
    at
}

/// Encodes `schedule` for `call`, its peers reached through `links`. A
/// step of more than [`MAX_STEP_PRIMS`] primitives is refused.
pub fn encode(schedule: &Schedule, call: &WorkCall, links: &dyn WorkLinks) -> Result<Work, String> {
    let mut channels = Vec::new();
    let mut peers = Vec::new();
    let mut steps = Vec::new();
    let mut prims = Vec::new();
    for (c, channel_steps) in schedule.channels.iter().enumerate() {
        // The channel's peers, in rank order; primitives name them by index.
        let mut index: BTreeMap<usize, i32> = BTreeMap::new();
        for prim in channel_steps.iter().flat_map(|s| s.prims.iter()) {
            for peer in [prim.recv_peer(), prim.send_peer()].into_iter().flatten() {
                let next = index.len() as i32;
                index.entry(peer).or_insert(next);
            }
        }
        let first_peer = peers.len() as u32;
        let mut by_index: Vec<(i32, usize)> = index.iter().map(|(&r, &i)| (i, r)).collect();
        by_index.sort_unstable();
        for (_, rank) in by_index {
            let (send, recv) = links.fifos(c, rank);
            peers.push(WorkPeer {
                rank: rank as i32,
                pad: 0,
                send,
                recv,
            });
        }
        let first_step = steps.len() as u32;
        for (s, step) in channel_steps.iter().enumerate() {
            if step.prims.len() > MAX_STEP_PRIMS {
                return Err(format!(
                    "channel {c} step {s} has {} primitives; device work allows {MAX_STEP_PRIMS}",
                    step.prims.len()
                ));
            }
            steps.push(WorkStep {
                first_prim: prims.len() as u32,
                nprims: step.prims.len() as u32,
            });
            for prim in &step.prims {
                // A send's source doubles as its (unused) destination; a
                // receive's destination as its source.
                let (src, dst) = match prim.slices() {
                    (Some(src), Some(dst)) => (src, dst),
                    (Some(only), None) | (None, Some(only)) => (only, only),
                    (None, None) => unreachable!("every primitive has a slice"),
                };
                let peer = |p: Option<usize>| p.map(|r| index[&r]).unwrap_or(-1);
                prims.push(WorkPrim {
                    kind: kind_of(prim),
                    recv_peer: peer(prim.recv_peer()),
                    send_peer: peer(prim.send_peer()),
                    src_buf: buf_code(src.buf),
                    dst_buf: buf_code(dst.buf),
                    pad: 0,
                    src_off: src.offset as u64,
                    dst_off: dst.offset as u64,
                    len: prim.len() as u64,
                });
            }
        }
        let (scratch, scratch_bytes) = links.scratch(c);
        channels.push(WorkChannel {
            first_step,
            nsteps: channel_steps.len() as u32,
            first_peer,
            npeers: peers.len() as u32 - first_peer,
            scratch,
            scratch_bytes,
        });
    }
    let mut header = WorkHeader {
        sendbuf: call.sendbuf,
        recvbuf: call.recvbuf,
        nranks: call.nranks,
        scalar: call.scalar,
        scalar_ptr: call.scalar_ptr,
        dtype: call.dtype,
        op: call.op,
        elem_size: call.elem_size,
        nchannels: channels.len() as u32,
        tag_seq: call.tag[0],
        tag_call: call.tag[1],
        tag_count: call.tag[2],
        pad: 0,
        abort: call.abort,
        channels_at: 0,
        peers_at: 0,
        steps_at: 0,
        prims_at: 0,
    };
    let mut block = vec![0u8; size_of::<WorkHeader>()];
    header.channels_at = push(&mut block, &channels);
    header.peers_at = push(&mut block, &peers);
    header.steps_at = push(&mut block, &steps);
    header.prims_at = push(&mut block, &prims);
    push(&mut block, &[0u64]);
    // SAFETY: as in `push`; the header is the block's first bytes.
    let head = unsafe {
        std::slice::from_raw_parts(
            (&header as *const WorkHeader).cast::<u8>(),
            size_of::<WorkHeader>(),
        )
    };
    block[..head.len()].copy_from_slice(head);
    let mut words = vec![0u64; block.len() / 8];
    // SAFETY: `words` holds block.len() bytes (a multiple of 8).
    unsafe {
        std::ptr::copy_nonoverlapping(block.as_ptr(), words.as_mut_ptr().cast::<u8>(), block.len())
    };
    Ok(Work { words })
}
