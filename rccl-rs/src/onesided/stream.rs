//! One-sided calls ordered on a stream, as NCCL orders them, for windows
//! of device memory (the emulated GPU's or the CUDA backend's; every rank
//! on this host: a peer's window is its own pointer in this process, its
//! allocation imported in another, `device_memory.rs`). A put is the
//! device's copy into the peer's window on the caller's stream, then a
//! host function on that stream (`Stream::enqueue`, CUDA's
//! `cuLaunchHostFunc`) that raises the signal with release ordering, so
//! it lands after the work enqueued before it and a peer that saw the
//! count sees the bytes. That function holds only the signal block and
//! the count of queued tasks, never the communicator, so nothing it drops
//! can call the device from its callback. A wait blocks, so it is a host
//! task on a thread of its own (`Device::enqueue_joint`) that holds the
//! stream until the counts
//! arrive; at the communicator's timeout, on abort or when the peer is
//! gone it ends and the communicator fails with the error naming the
//! peer (`ncclCommGetAsyncError`, and its next call). Counts a wait
//! consumes are taken when it is enqueued, so waits consume in call
//! order. The caller keeps its buffers, and the window, until the stream
//! has run the task, as with any stream work; a suspend and a finalize
//! wait for the tasks.

use std::sync::Arc;
use std::time::Instant;

use rccl_device::Stream;
use rccl_transports::SignalBlock;

use crate::queue::Queued;

use super::wait::{await_count, check_descs};
use super::{check_signal, slot, State, WaitDesc, Window};
use crate::comm::{CommInner, Communicator};
use crate::error::{Error, Result};

const PUT: &str = "ncclPutSignal";
const SIGNAL: &str = "ncclSignal";
const WAIT: &str = "ncclWaitSignal";

/// A put's bytes: `len` from `src` (host or device memory) to `dst` in a
/// peer's window.
struct Copy {
    dst: usize,
    src: usize,
    len: usize,
}

impl Communicator {
    /// Whether `window` is device memory on some rank: then puts into it
    /// run on a stream ([`Communicator::put_signal_on_stream`]).
    pub fn window_on_device(&self, window: Window) -> Result<bool> {
        self.with_one_sided(|comm, state| Ok(state.window(comm, window, PUT)?.device))
    }

    /// Whether some registered window is device memory: then signals and
    /// waits of the C ABI run on their stream, in order with the puts.
    pub fn has_device_window(&self) -> Result<bool> {
        self.with_one_sided(|_, state| Ok(state.windows.values().any(|w| w.device)))
    }

    /// Enqueues on stream `stream` (its raw `cudaStream_t`) the put of
    /// `bytes` at `src` into `peer`'s buffer of `window` at `offset`,
    /// then signal `(sig, ctx)` there (`ncclPutSignal` on device memory).
    /// Returns once enqueued.
    ///
    /// # Safety
    /// `[src, src + bytes)` must stay valid and unchanged, and the window
    /// registered, until the stream has run the put.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal_on_stream(
        &self,
        src: *const u8,
        bytes: usize,
        peer: usize,
        window: Window,
        offset: usize,
        sig: usize,
        ctx: usize,
        stream: usize,
    ) -> Result<()> {
        self.with_one_sided(|comm, state| {
            check_signal(comm, PUT, peer, sig, ctx)?;
            let entry = state.window(comm, window, PUT)?;
            let target = entry.peers[peer].as_ref().filter(|_| entry.device);
            let Some(target) = target else {
                return Err(Error::InvalidUsage(format!(
                    "{PUT}: rank {}: window #{} is host memory: puts into it complete on the \
                     host (put_signal)",
                    comm.rank, entry.seq
                )));
            };
            if bytes > 0 && src.is_null() {
                return Err(Error::InvalidArgument(format!(
                    "{PUT}: rank {}: localbuff is NULL for {bytes} bytes",
                    comm.rank
                )));
            }
            let dst = target
                .address(offset, bytes)
                .map_err(|len| entry.past_end(comm, PUT, peer, offset, bytes, len))?;
            let copy = Copy {
                dst: dst as usize,
                src: src as usize,
                len: bytes,
            };
            enqueue_raise(&self.inner, state, PUT, Some(copy), peer, sig, ctx, stream)
        })
    }

    /// Enqueues signal `(sig, ctx)` to `peer` on stream `stream`
    /// (`ncclSignal` ordered with device puts).
    pub fn signal_on_stream(
        &self,
        peer: usize,
        sig: usize,
        ctx: usize,
        stream: usize,
    ) -> Result<()> {
        self.with_one_sided(|comm, state| {
            check_signal(comm, SIGNAL, peer, sig, ctx)?;
            enqueue_raise(&self.inner, state, SIGNAL, None, peer, sig, ctx, stream)
        })
    }

    /// Enqueues on stream `stream` a wait for `descs` (`ncclWaitSignal`
    /// on a stream): work enqueued after it runs once the counts arrived.
    pub fn wait_signal_on_stream(&self, descs: &[WaitDesc], stream: usize) -> Result<()> {
        self.with_one_sided(|comm, state| {
            check_descs(comm, descs)?;
            let signals = state.signals(comm, WAIT)?;
            let block = own_block(comm, &signals.blocks, WAIT)?;
            let mut consumed = signals.consumed.clone();
            let mut waits = Vec::with_capacity(descs.len());
            for d in descs {
                let at = slot(comm, d.sig, d.ctx, d.peer);
                waits.push((*d, consumed[at]));
                consumed[at] = consumed[at].wrapping_add(d.count as u32);
            }
            let inner = self.inner.clone();
            let stream = stream_of(comm, WAIT, stream)?;
            enqueue_on_thread(&self.inner, &stream, move || {
                let deadline = Instant::now() + inner.config.timeout;
                let result = waits.iter().try_for_each(|(d, base)| {
                    await_count(&inner, &block, d, *base, deadline, || Ok(()))
                });
                if let Err(err) = result {
                    inner.poison(&err);
                }
            })?;
            if let Some(signals) = state.signals.as_mut() {
                signals.consumed = consumed;
            }
            Ok(())
        })
    }
}

/// This rank's signal block, which stream work shares; refused where
/// ranks on other hosts signal by messages the host must apply.
fn own_block(
    comm: &CommInner,
    blocks: &[Option<Arc<SignalBlock>>],
    call: &str,
) -> Result<Arc<SignalBlock>> {
    if let Some(apart) = blocks.iter().position(Option::is_none) {
        return Err(Error::InvalidUsage(format!(
            "{call}: rank {}: {} is on another host, whose signals the host applies: wait \
             without a stream (wait_signal)",
            comm.rank,
            comm.describe(apart)
        )));
    }
    Ok(blocks[comm.rank].clone().expect("checked above"))
}

/// Enqueues `copy` (if any) and then the raise of `(sig, ctx)` at `peer`.
#[allow(clippy::too_many_arguments)]
fn enqueue_raise(
    inner: &Arc<CommInner>,
    state: &State,
    call: &str,
    copy: Option<Copy>,
    peer: usize,
    sig: usize,
    ctx: usize,
    stream: usize,
) -> Result<()> {
    let comm = &**inner;
    let signals = state.signals(comm, call)?;
    let Some(block) = signals.blocks[peer].clone() else {
        return Err(Error::InvalidUsage(format!(
            "{call}: rank {}: {} is on another host: signal it without a stream",
            comm.rank,
            comm.describe(peer)
        )));
    };
    let at = slot(comm, sig, ctx, comm.rank);
    let stream = stream_of(comm, call, stream)?;
    if let Some(Copy { dst, src, len }) = copy.filter(|c| c.len > 0) {
        // SAFETY: the caller of the put vouched for the source until the
        // stream ran the copy, and keeps the window registered as long;
        // the destination lies inside the peer's window as this process
        // addresses it (checked when enqueued).
        unsafe { stream.copy_async(dst as *mut u8, src as *const u8, len) }.map_err(|e| {
            Error::System(format!(
                "{PUT}: rank {}: cannot enqueue the copy of {len} bytes into the window of rank \
                 {peer}: {e}",
                comm.rank
            ))
        })?;
    }
    let counted = Counted::issue(&inner.one_sided_queued);
    stream
        .enqueue(Box::new(move || {
            let _counted = counted;
            block.raise(at);
        }))
        .map_err(Error::from)
}

/// Stream `raw` of the active device.
fn stream_of(comm: &CommInner, call: &str, raw: usize) -> Result<Arc<dyn Stream>> {
    let device = rccl_device::active().ok_or_else(|| {
        Error::InvalidUsage(format!(
            "{call}: rank {}: no device is active (RCCL_DEVICE): nothing runs on streams",
            comm.rank
        ))
    })?;
    Ok(device.stream(raw)?)
}

/// Enqueues `task` on stream `stream` of the active device, to run on a
/// thread of its own (it may block, and may drop the communicator),
/// counted in the communicator's one-sided work until it ran or was
/// dropped.
fn enqueue_on_thread(
    inner: &Arc<CommInner>,
    stream: &Arc<dyn Stream>,
    task: impl FnOnce() + Send + 'static,
) -> Result<()> {
    let device = rccl_device::active()
        .ok_or_else(|| Error::Internal("a stream without an active device".into()))?;
    let counted = Counted::issue(&inner.one_sided_queued);
    device
        .enqueue_joint(
            std::slice::from_ref(stream),
            Box::new(move || {
                let _counted = counted;
                task();
            }),
        )
        .map_err(Error::from)
}

/// A one-sided task on a stream, counted in the communicator's queued
/// one-sided work (which a suspend and a finalize wait for): finished
/// when dropped, run or not.
struct Counted(Arc<Queued>);

impl Counted {
    fn issue(queued: &Arc<Queued>) -> Counted {
        queued.issue();
        Counted(queued.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.finish();
    }
}
