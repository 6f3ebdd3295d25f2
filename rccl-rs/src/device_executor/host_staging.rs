//! Calls on device memory that device work does not reach (ranks of other
//! processes of this host with `NCCL_P2P_DISABLE`):
//! the host executor runs them over page-locked host copies of their
//! buffers. On each call's stream the GPU's copy engine copies its inputs
//! into those copies, the launch runs as one task after every stream's
//! copies, and the outputs are copied back after it; then the copies go
//! back to a cache of idle ones, all in stream order as the rest of the
//! device path. Making page-locked memory costs far more than a call
//! (`cuMemHostAlloc` pins every page), so a few idle copies are kept.
//!
//! A network provider that takes device memory directly (GPUDirect RDMA)
//! would spare the two copies; this path serves every provider.

use parking_lot::Mutex;
use rccl_device::Device;
use smallvec::{smallvec, SmallVec};

use crate::error::{Error, Result};
use crate::op::RawOp;
use crate::queue::StreamRef;

/// One page-locked host buffer, freed when dropped.
struct HostBuffer {
    ptr: *mut u8,
    bytes: usize,
    device: &'static dyn Device,
}

// SAFETY: the buffer is owned by this value alone, and the device is
// shared between threads by design; it is sent to the stream work that
// gives it back.
unsafe impl Send for HostBuffer {}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: dropped when evicted from the idle cache, which holds
        // only buffers whose copies have all run.
        if let Err(e) = unsafe { self.device.free_host(self.ptr) } {
            tracing::warn!("freeing a host staging buffer: {e}");
        }
    }
}

/// Idle host copies, for the next calls.
static IDLE: Mutex<Vec<HostBuffer>> = Mutex::new(Vec::new());
/// The most idle copies kept, and the most bytes they may hold.
const IDLE_MAX: usize = 32;
const IDLE_MAX_BYTES: usize = 1 << 30;

/// The smallest idle copy of `device` that holds `bytes`, or a new one.
fn take(device: &'static dyn Device, bytes: usize) -> Result<HostBuffer> {
    let mut idle = IDLE.lock();
    let fits = idle
        .iter()
        .enumerate()
        .filter(|(_, b)| b.bytes >= bytes && std::ptr::addr_eq(b.device, device))
        .min_by_key(|(_, b)| b.bytes)
        .map(|(i, _)| i);
    if let Some(i) = fits {
        return Ok(idle.swap_remove(i));
    }
    drop(idle);
    let ptr = device.alloc_host(bytes)?;
    Ok(HostBuffer { ptr, bytes, device })
}

/// Keeps `buffers`, whose copies have all run, for later calls, freeing
/// the smallest idle ones beyond the cache's bounds.
fn give_back(buffers: Vec<HostBuffer>) {
    let mut idle = IDLE.lock();
    idle.extend(buffers);
    idle.sort_unstable_by_key(|b| std::cmp::Reverse(b.bytes));
    let mut held = 0;
    let keep = idle
        .iter()
        .take_while(|b| {
            held += b.bytes;
            held <= IDLE_MAX_BYTES
        })
        .count()
        .min(IDLE_MAX);
    let evicted = idle.split_off(keep);
    drop(idle);
    drop(evicted);
}

/// A call's buffers moved to host copies: what to copy back after the
/// launch, on which stream, and the copies to give back after that.
pub(crate) struct Staged {
    stream: StreamRef,
    /// (device destination, host source, bytes) of the output.
    copy_back: Option<(*mut u8, *const u8, usize)>,
    buffers: Vec<HostBuffer>,
}

/// Points `op` at host copies of its buffers, enqueueing the copy of its
/// input on its stream; the op then plans as a host call (no stream). A
/// send range and a receive range that overlap (a call in place) share
/// one copy, and a pointer the call does not use on this rank follows the
/// other's copy when it lies in it, so the two compare as before.
pub(crate) fn stage(device: &'static dyn Device, op: &mut RawOp) -> Result<Staged> {
    let stream = op
        .stream
        .take()
        .ok_or_else(|| Error::Internal("staging a call without a stream".into()))?;
    let (send_bytes, recv_bytes) = op.buffer_bytes();
    let (send, recv) = (op.send as usize, op.recv as usize);
    // The device ranges copied, as (start, bytes).
    let ranges: SmallVec<[(usize, usize); 2]> =
        if send_bytes > 0 && recv_bytes > 0 && send < recv + recv_bytes && recv < send + send_bytes
        {
            let start = send.min(recv);
            let end = (send + send_bytes).max(recv + recv_bytes);
            smallvec![(start, end - start)]
        } else {
            [(send, send_bytes), (recv, recv_bytes)]
                .into_iter()
                .filter(|&(_, bytes)| bytes > 0)
                .collect()
        };
    let mut staged = Staged {
        stream,
        copy_back: None,
        buffers: Vec::with_capacity(ranges.len()),
    };
    let mut hosts: SmallVec<[usize; 2]> = SmallVec::new();
    for &(_, bytes) in &ranges {
        let buffer = take(device, bytes)?;
        hosts.push(buffer.ptr as usize);
        staged.buffers.push(buffer);
    }
    let to_host = |addr: usize| {
        ranges
            .iter()
            .zip(&hosts)
            .find(|(&(start, bytes), _)| (start..start + bytes).contains(&addr))
            .map_or(addr, |(&(start, _), &host)| host + (addr - start))
    };
    let (send_host, recv_host) = (to_host(send), to_host(recv));
    if send_bytes > 0 {
        // SAFETY: the caller's buffer holds `send_bytes` (checked when the
        // call was built) and stays valid until its stream work completes;
        // the host copy is given back only by work enqueued after this
        // copy.
        unsafe {
            staged
                .stream
                .copy_async(send_host as *mut u8, op.send, send_bytes)
        }?;
    }
    if recv_bytes > 0 {
        staged.copy_back = Some((op.recv, recv_host as *const u8, recv_bytes));
    }
    op.send = send_host as *const u8;
    op.recv = recv_host as *mut u8;
    Ok(staged)
}

impl Staged {
    /// Enqueues, after the launch, the copy of the output back to the
    /// device buffer (the host copies are given back after it, when
    /// `self` drops).
    pub(crate) fn copy_back(mut self) -> Result<()> {
        if let Some((dst, src, bytes)) = self.copy_back.take() {
            // SAFETY: as for the input's copy: both ranges hold `bytes`
            // and stay valid until the work enqueued after it.
            unsafe { self.stream.copy_async(dst, src, bytes) }?;
        }
        Ok(())
    }
}

impl Drop for Staged {
    /// Gives the host copies back in stream order, after every copy
    /// enqueued so far (a stream that takes no more work frees them).
    fn drop(&mut self) {
        let buffers = std::mem::take(&mut self.buffers);
        if !buffers.is_empty() {
            let _ = self.stream.enqueue(Box::new(move || give_back(buffers)));
        }
    }
}
