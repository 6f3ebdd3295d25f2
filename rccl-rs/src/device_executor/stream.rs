//! The stream-ordered path, as NCCL's: a call whose buffers are device
//! memory is planned on the caller's thread as any call (argument errors,
//! the tuner's choice, its sequence number), then its launch is enqueued
//! on the caller's stream and the call returns at once. Later work on that
//! stream sees the result; the caller never waits for its peers. A group
//! is one task that every stream of its calls waits for, so a thread that
//! drives several ranks (some sharing a stream) cannot deadlock.
//!
//! A launch whose communicators device work reaches runs as device work
//! (`work.rs`, `launch.rs`: the kernels' interpreter, on the GPU or
//! compiled for the host on the emulated one; ranks on other hosts through
//! the network). Any other communicator (ranks of other processes of this
//! host with `NCCL_P2P_DISABLE`) runs the host executor over host copies
//! of the buffers, made and copied back on the streams
//! (`host_staging.rs`).
//!
//! Failures of an enqueued launch poison its communicators: they surface
//! through `async_error` (`ncclCommGetAsyncError`) and the next call.

use std::sync::Arc;

use rccl_device::{Device, Memory};

use super::host_staging::{self, Staged};
use super::launch;
use super::reach::runs_device_work;
use crate::comm::CommInner;
use crate::error::{Error, Result};
use crate::host_executor;
use crate::op::RawOp;
use crate::plan::Planned;
use crate::queue::StreamRef;
use crate::types::Executor;

/// One buffer of a call, for [`stream_for`]: its name in messages
/// (`sendbuff`), address and length in bytes.
pub(crate) type Buffer<'a> = (&'a str, *const u8, usize);

/// A call as messages name it: its name and its count of elements.
pub(crate) type CallName<'a> = (&'a str, usize);

/// Where a call runs, from its buffers: `None` on host memory (the host
/// path); the stream to order it on when they are device memory and the
/// caller passed a stream (`stream`: its raw `cudaStream_t` value; `None`
/// for the host-only entry points, which refuse device memory). A call
/// mixing the two is refused, naming which buffer is which, and so is a
/// device buffer that runs past the end of its allocation, where the
/// device knows it. Costs one lookup per buffer while a device is active,
/// two atomic loads when none is.
#[inline]
pub(crate) fn stream_for(
    call: CallName<'_>,
    buffers: [Buffer<'_>; 2],
    stream: Option<usize>,
) -> Result<Option<StreamRef>> {
    match rccl_device::active() {
        None => Ok(None),
        Some(device) => stream_on(device, call, buffers, stream),
    }
}

/// Refuses a device buffer of `bytes` at `ptr` that runs past the end of
/// the allocation holding it (a count beyond the buffer would have the
/// device read or write memory that is not the caller's).
fn check_within_allocation(
    device: &dyn Device,
    (call, count): CallName<'_>,
    (name, ptr, bytes): Buffer<'_>,
) -> Result<()> {
    let Some((start, len)) = device.allocation(ptr) else {
        return Ok(());
    };
    let left = (start + len).saturating_sub(ptr as usize);
    if bytes <= left {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{call}: count {count} needs {bytes} bytes at {name} {ptr:p}, but its allocation \
         ({len} bytes of {} at {start:#x}) holds {left} bytes from there",
        device.classify(ptr)?
    )))
}

/// Refuses a buffer of another device than the one the engine drives:
/// its work would touch memory that device cannot reach.
fn on_this_device(
    device: &dyn Device,
    call: &str,
    (name, ptr, _): Buffer<'_>,
    memory: Memory,
) -> Result<()> {
    match memory {
        Memory::Device { backend, index } if index != device.index() => {
            Err(Error::InvalidArgument(format!(
                "{call}: {name} {ptr:p} is {memory}, but this process's communicators run on \
                 {backend} device {} ({}): buffers must be memory of that device",
                device.index(),
                device.label()
            )))
        }
        _ => Ok(()),
    }
}

/// [`stream_for`] while `device` is active.
fn stream_on(
    device: &dyn Device,
    call: CallName<'_>,
    buffers: [Buffer<'_>; 2],
    stream: Option<usize>,
) -> Result<Option<StreamRef>> {
    let call_name = call.0;
    // Buffers the call does not use (no elements) are not classified.
    let mut classified = [None, None];
    for (at, buffer) in buffers.into_iter().enumerate() {
        let (name, ptr, len) = buffer;
        if len > 0 && !ptr.is_null() {
            let memory = device.classify(ptr).map_err(|e| {
                let why = format!("{call_name}: {name} {ptr:p}: {e}");
                // A driver that cannot answer failed; the pointer may be fine.
                match e {
                    rccl_device::Error::System(_) => Error::System(why),
                    _ => Error::InvalidArgument(why),
                }
            })?;
            classified[at] = Some((buffer, memory));
        }
    }
    let mut used = classified.iter().flatten();
    let on_device = used.clone().find(|(_, memory)| memory.is_device());
    let on_host = used.find(|(_, memory)| !memory.is_device());
    match (on_device, on_host) {
        (None, _) => Ok(None),
        (Some(((dev_name, dev_ptr, _), memory)), Some(((host_name, host_ptr, _), _))) => {
            Err(Error::InvalidArgument(format!(
                "{call_name}: {dev_name} {dev_ptr:p} is {memory} but {host_name} {host_ptr:p} is \
                 host memory: a call's buffers must all be host memory or all device memory"
            )))
        }
        (Some(((name, ptr, _), memory)), None) => {
            for &(buffer, memory) in classified.iter().flatten() {
                on_this_device(device, call_name, buffer, memory)?;
                check_within_allocation(device, call, buffer)?;
            }
            let Some(raw) = stream else {
                return Err(Error::InvalidArgument(format!(
                    "{call_name}: {name} {ptr:p} is {memory}, which this host-memory call does not \
                     touch: pass it with a stream (the C ABI, or the *_on_stream calls)"
                )));
            };
            device.stream(raw).map(Some).map_err(Error::from)
        }
    }
}

/// A launch enqueued on streams, from plan to completion. Dropped without
/// running (its streams gone), it still poisons its communicators: their
/// sequence numbers moved on without it.
struct StreamLaunch {
    planned: Option<Planned>,
    /// Its communicators, each with the task's place in its line.
    comms: Vec<(Arc<CommInner>, u64)>,
}

// SAFETY: a planned launch holds raw pointers into the callers' buffers,
// which the callers promised stay valid (and untouched by anyone else)
// until the stream work completes; everything else in it is Send.
unsafe impl Send for StreamLaunch {}

impl StreamLaunch {
    fn run(mut self) {
        let mut planned = self.planned.take().expect("a task runs once");
        let result = self
            .comms
            .iter()
            .try_for_each(|(comm, ticket)| {
                comm.queued.wait_turn(&**comm, *ticket)?;
                comm.check_usable()
            })
            .and_then(|()| host_executor::run(&mut planned));
        if let Err(err) = result {
            for (comm, _) in &self.comms {
                comm.poison(&err);
            }
        }
    }
}

impl Drop for StreamLaunch {
    fn drop(&mut self) {
        if self.planned.take().is_some() {
            let err = Error::System(
                "a launch queued on a stream never ran: its stream was \
                 destroyed"
                    .into(),
            );
            for (comm, _) in &self.comms {
                comm.poison(&err);
            }
        }
        for (comm, _) in &self.comms {
            comm.queued.finish();
        }
    }
}

/// Plans `ops` (every one carrying its stream) and enqueues the launch as
/// one task on all their streams; returns once enqueued.
pub(crate) fn enqueue(mut ops: Vec<RawOp>) -> Result<()> {
    let device: &'static dyn Device = rccl_device::active()
        .ok_or_else(|| Error::Internal("device work without an active device".into()))?;
    let mut streams: Vec<StreamRef> = Vec::with_capacity(ops.len());
    for op in &ops {
        match &op.stream {
            Some(stream) => streams.push(stream.clone()),
            None => {
                return Err(Error::InvalidArgument(
                    "a group mixes calls on host memory with calls on device memory: run \
                     them in separate groups"
                        .into(),
                ))
            }
        }
    }
    let interpreted = ops.iter().filter(|op| runs_device_work(&op.comm)).count();
    // The one place that decides which executor runs the launch: device
    // work where it reaches every communicator of the group; else the
    // host executor over host copies of the calls' buffers.
    let executor = if interpreted == 0 {
        Executor::HostOverStaging
    } else {
        Executor::Device
    };
    let staged = if interpreted == 0 {
        ops.iter_mut()
            .map(|op| host_staging::stage(device, op))
            .collect::<Result<Vec<_>>>()?
    } else if interpreted < ops.len() {
        return Err(Error::InvalidUsage(
            "a group on device memory mixes communicators that device work reaches with \
             communicators it does not (NCCL_P2P_DISABLE between processes): run them in \
             separate groups"
                .into(),
        ));
    } else {
        Vec::new()
    };
    let mut planned = Planned::default();
    planned.plan(ops, executor)?;
    if planned.is_empty() {
        return Ok(());
    }
    if executor == Executor::Device {
        // A launch that fails on its way to the device (its context
        // faulted, say) leaves its peers waiting for this rank's part:
        // its communicators fail, as they would had it run.
        let comms: Vec<Arc<CommInner>> = planned.comms().cloned().collect();
        return launch::launch(planned, &streams, device).inspect_err(|err| {
            for comm in &comms {
                comm.poison(err);
            }
        });
    }
    let comms = planned
        .comms()
        .map(|comm| (comm.clone(), comm.queued.issue()))
        .collect();
    let task = StreamLaunch {
        planned: Some(planned),
        comms,
    };
    device
        .enqueue_joint(&streams, Box::new(move || task.run()))
        .map_err(Error::from)?;
    staged.into_iter().try_for_each(Staged::copy_back)
}
