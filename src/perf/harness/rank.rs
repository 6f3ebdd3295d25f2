//! One rank's side of a run: its measured and bookkeeping communicators,
//! its stream, and its send and receive buffers in host or device memory.

use std::sync::Arc;

use rccl::device::{Device, Stream};
use rccl::Communicator;

use super::Res;
use crate::perf::format::hostname;

/// One buffer, 64-byte aligned: host memory, or device memory (page
/// aligned).
pub(super) enum Buffer {
    Host {
        mem: Vec<u64>,
        offset: usize,
    },
    Device {
        ptr: *mut u8,
        device: &'static dyn Device,
    },
    /// Part of the rank's symmetric window (`-R 2`), which the rank frees.
    Window {
        ptr: *mut u8,
    },
}

// SAFETY: the device allocation belongs to this buffer alone, as the
// host one does.
unsafe impl Send for Buffer {}

impl Buffer {
    pub(super) fn new(bytes: usize, device: Option<&'static dyn Device>) -> Res<Buffer> {
        let Some(device) = device else {
            let mem = vec![0u64; bytes.div_ceil(8) + 16];
            let offset = (64 - (mem.as_ptr() as usize % 64)) % 64;
            return Ok(Buffer::Host { mem, offset });
        };
        let ptr = device
            .alloc(bytes)
            .map_err(|e| format!("{}: cannot allocate device memory: {e}", hostname()))?;
        Ok(Buffer::Device { ptr, device })
    }

    pub(super) fn ptr(&mut self) -> *mut u8 {
        match self {
            // SAFETY: offset < 64 bytes lies inside the 16-word slack.
            Buffer::Host { mem, offset } => unsafe { mem.as_mut_ptr().cast::<u8>().add(*offset) },
            Buffer::Device { ptr, .. } | Buffer::Window { ptr } => *ptr,
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Buffer::Device { ptr, device } = self {
            // SAFETY: the rank's stream was synchronized before its buffers
            // drop (Rank's Drop).
            let _ = unsafe { device.free(*ptr) };
        }
    }
}

pub(super) struct Rank {
    /// What is measured.
    pub(super) comm: Communicator,
    /// The harness's own collectives ([`bookkeeping_config`]).
    pub(super) books: Communicator,
    /// The stream its calls on device memory are ordered on.
    pub(super) stream: Option<Arc<dyn Stream>>,
    pub(super) send: Buffer,
    pub(super) recv: Buffer,
    /// `-R 2`: the symmetric window holding both buffers (its memory
    /// starts at the send buffer).
    pub(super) window: Option<rccl::Window>,
}

/// Registers one symmetric window of shareable host memory holding a
/// send and a receive buffer of `bytes` each (`-R 2`, as nccl-tests'),
/// collectively with the rank's peers (from the rank's own thread).
pub(super) fn register_symmetric(rank: &mut Rank, bytes: usize) -> Res<()> {
    const PAGE: usize = rccl::WIN_REQUIRED_ALIGNMENT;
    let half = bytes.div_ceil(PAGE).max(1) * PAGE;
    let base = rccl::alloc_shareable_host(2 * half).map_err(|e| e.to_string())?;
    // SAFETY: the memory stays allocated until the window is deregistered
    // (Rank's Drop).
    let window = unsafe {
        rank.comm
            .register_window(base, 2 * half, rccl::WIN_COLL_SYMMETRIC)
    };
    let window = match window {
        Ok(window) => window,
        Err(e) => {
            let _ = rccl::free_shareable_host(base);
            return Err(format!("{}: -R 2: {e}", hostname()));
        }
    };
    rank.send = Buffer::Window { ptr: base };
    rank.recv = Buffer::Window {
        ptr: base.wrapping_add(half),
    };
    rank.window = Some(window);
    Ok(())
}

impl Rank {
    /// Waits for the work queued on the rank's stream; reports a failure
    /// of the stream or of the work (the communicator's async error).
    pub(super) fn complete(&self) -> rccl::Result<()> {
        if let Some(stream) = &self.stream {
            stream.synchronize(std::time::Instant::now() + self.comm.config().timeout)?;
            if let Some(err) = self.comm.async_error() {
                return Err(err);
            }
        }
        Ok(())
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        // The buffers drop after this: nothing queued may still use them.
        if let Some(stream) = self.stream.take() {
            let _ = stream.synchronize(std::time::Instant::now() + self.comm.config().timeout);
            if let Some(device) = rccl::device::active() {
                let _ = device.destroy_stream(stream.raw());
            }
        }
        if let Some(window) = self.window.take() {
            let _ = self.comm.deregister_window(window);
            let _ = rccl::free_shareable_host(self.send.ptr());
        }
    }
}
