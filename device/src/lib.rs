//! GPU memory, streams, events and kernels behind one interface.
//!
//! Nothing outside this crate knows CUDA exists. Two backends: `cuda`,
//! the driver API of `libcuda.so.1` loaded at run time (a machine
//! without a driver gets an error, never a panic), and `emu`, an emulated
//! GPU that CI runs (`RCCL_DEVICE=emu`).
//!
//! The engine asks three things of a device: which memory a pointer is
//! ([`Device::classify`], a lookup cheap enough for every call), streams
//! to order its work on ([`Device::stream`], from the caller's raw
//! `cudaStream_t`), a way to run one piece of work once every stream
//! of a group has reached it ([`Device::enqueue_joint`]), and the launch
//! of device work ([`Device::launch_work`]: the kernels' interpreter
//! running rccl-algorithms' schedules).
//!
//! The kernels (`kernels/`, CUDA C++) are prebuilt into `fatbin/` by
//! `scripts/build-kernels.sh`; their host twin, the same sources compiled
//! by the host's C++ compiler, is [`twin`].

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::any::Any;
use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod abi;
pub mod cuda;
mod cuda_api;
pub mod cuda_device;
pub mod emu;
mod select;
pub mod twin;
pub mod work;

pub use select::{active, select, selection_problem, Kind};

/// What went wrong in a device call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A pointer, handle or size the device does not know or accept.
    #[error("{0}")]
    InvalidArgument(String),
    /// Work the device cannot run as the caller configured it (a launch
    /// whose blocks cannot all be resident at once).
    #[error("{0}")]
    InvalidUsage(String),
    /// The device (or the system under it) failed, or a wait passed its
    /// deadline.
    #[error("{0}")]
    System(String),
}

/// The device crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Which memory a pointer points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (anything the device does not own).
    Host,
    /// Memory of device `index` of `backend` ("emu", "cuda").
    Device { backend: &'static str, index: u32 },
}

impl Memory {
    /// Whether this is device memory.
    pub fn is_device(self) -> bool {
        matches!(self, Memory::Device { .. })
    }
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memory::Host => f.write_str("host memory"),
            Memory::Device { backend, index } => {
                write!(f, "device memory of {backend} device {index}")
            }
        }
    }
}

/// Work a stream runs in its order: the engine's launch of a group, a
/// copy. Its failures are reported by the work itself (the engine records
/// them on its communicators, as NCCL's asynchronous errors).
pub type Work = Box<dyn FnOnce() + Send + 'static>;

/// Device work to run in stream order ([`Device::launch_work`]).
pub struct WorkLaunch {
    /// Rounds, run one after another. Every channel of every block of a
    /// round runs at once: blocks of one round may wait on each other
    /// through their FIFOs (ranks of one process sharing the device).
    pub rounds: Vec<Vec<Arc<work::Work>>>,
    /// How long the launch may run once started (CUDA: each round's
    /// kernel, by the GPU's global timer); then it fails.
    pub timeout: Duration,
    /// Asked from the host while the launch is queued or runs: `true` sets
    /// every block's abort word (the engine's communicator was aborted or
    /// failed, a peer died, a connection broke), which stops its waits.
    pub stop: Box<dyn Fn() -> bool + Send>,
    /// Told how each run of the launch ended, in stream order: once, or
    /// once per replay of a launch captured in a CUDA graph. Dropped when
    /// the launch can run no more: after its run, when it never runs (its
    /// stream was destroyed), or with the graph that captured it.
    pub done: Box<dyn FnMut(std::result::Result<(), WorkFailure>) + Send>,
}

/// How a launch of device work that did not finish ended, for the engine
/// to say which peers its channels waited for.
#[derive(Debug)]
pub struct WorkFailure {
    pub error: Error,
    /// It ran out of time (rather than being stopped or failing to start).
    pub timed_out: bool,
    /// The channels that did not finish, as (round, block, channel).
    pub unfinished: Vec<(usize, usize, usize)>,
}

impl From<Error> for WorkFailure {
    fn from(error: Error) -> WorkFailure {
        WorkFailure {
            error,
            timed_out: false,
            unfinished: Vec::new(),
        }
    }
}

/// A GPU as the engine sees it.
pub trait Device: Send + Sync {
    /// The backend's name ("emu", "cuda").
    fn backend(&self) -> &'static str;

    /// The device index and a description for headers: `[emu 0]`,
    /// `[cuda 0] NVIDIA H200`.
    fn label(&self) -> String;

    /// The index of the device this backend drives (its ordinal: the
    /// engine's device buffers must be its memory).
    fn index(&self) -> u32 {
        0
    }

    /// Which memory `ptr` points into. A lookup (it runs on every call of
    /// the engine); an error where the backend cannot tell, never a guess.
    fn classify(&self, ptr: *const u8) -> Result<Memory>;

    /// The allocation of device memory holding `ptr`, as (start address,
    /// bytes), where the backend knows it: calls check their counts
    /// against it.
    fn allocation(&self, _ptr: *const u8) -> Option<(usize, usize)> {
        None
    }

    /// Allocates `bytes` of device memory.
    fn alloc(&self, bytes: usize) -> Result<*mut u8>;

    /// Allocates `bytes` of device memory, zeroed (FIFOs start zeroed).
    fn alloc_zeroed(&self, bytes: usize) -> Result<*mut u8> {
        let ptr = self.alloc(bytes)?;
        let zeros = vec![0u8; bytes];
        // SAFETY: `ptr` is a fresh allocation of `bytes`, `zeros` a host
        // buffer as long; they do not overlap.
        unsafe { self.copy(ptr, zeros.as_ptr(), bytes) }?;
        Ok(ptr)
    }

    /// Frees what [`Device::alloc`] returned.
    ///
    /// # Safety
    /// No work still queued or running may use the memory.
    unsafe fn free(&self, ptr: *mut u8) -> Result<()>;

    /// Allocates `bytes` of page-locked host memory: the copy engines
    /// reach it at full speed, and a stream's copy to or from it waits for
    /// nothing but the stream (CUDA: `cuMemHostAlloc`).
    fn alloc_host(&self, bytes: usize) -> Result<*mut u8>;

    /// Frees what [`Device::alloc_host`] returned; callable from work
    /// running on a stream (freed there or deferred).
    ///
    /// # Safety
    /// No work still queued or running may use the memory.
    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()>;

    /// Copies `bytes` from `src` to `dst`, either of them host or device
    /// memory, and returns when done. Not ordered with any stream: make
    /// the stream work the copy depends on complete first.
    ///
    /// # Safety
    /// Both ranges must be valid for `bytes` and not overlap.
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()>;

    /// The stream whose raw `cudaStream_t` value is `raw` (0: the default
    /// stream).
    fn stream(&self, raw: usize) -> Result<Arc<dyn Stream>>;

    /// A new stream; [`Stream::raw`] is its `cudaStream_t` value.
    fn create_stream(&self) -> Result<Arc<dyn Stream>>;

    /// Destroys the stream `raw`: what it holds still runs, then its
    /// worker ends; later lookups fail.
    fn destroy_stream(&self, raw: usize) -> Result<()>;

    /// A new event, recorded nowhere yet.
    fn create_event(&self) -> Result<Arc<dyn Event>>;

    /// Enqueues `work` so that it runs once, after everything enqueued
    /// before it on every stream of `streams` (duplicates allowed), and
    /// before anything enqueued after it on any of them: one task that
    /// every involved stream waits for. A group over several
    /// communicators, some sharing a stream, runs this way without
    /// deadlock.
    fn enqueue_joint(&self, streams: &[Arc<dyn Stream>], work: Work) -> Result<()>;

    /// Enqueues device work as [`Device::enqueue_joint`] enqueues a task:
    /// after everything enqueued before it on every stream of `streams`,
    /// before anything enqueued after it on any of them. Every address in
    /// the blocks (buffers, FIFOs, scratch, abort word) must be memory the
    /// device reaches, valid until `done` is called.
    fn launch_work(&self, streams: &[Arc<dyn Stream>], launch: WorkLaunch) -> Result<()>;

    /// A zeroed word for [`work::WorkCall::abort`]: read by the device while
    /// work runs, set from the host by [`Device::launch_work`] when the
    /// launch's `stop` answers `true`, even while a kernel spins (CUDA:
    /// mapped page-locked memory, taken from words allocated when the
    /// device opened). Freed by [`Device::free_abort_word`].
    fn alloc_abort_word(&self) -> Result<*mut u32> {
        Ok(self.alloc_zeroed(4)?.cast())
    }

    /// Gives back a word of [`Device::alloc_abort_word`].
    ///
    /// # Safety
    /// No work still queued or running may use the word.
    unsafe fn free_abort_word(&self, word: *mut u32) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.free(word.cast()) }
    }

    /// Whether a NIC's writes into this device's memory are seen by its
    /// work in the order of the host's later writes that announce them, so
    /// that a network may receive into it (GPUDirect RDMA) without a
    /// flush (a read through the NIC) first, which the networks do not
    /// make. CUDA: compute capability 9.0 and newer, as NCCL finds.
    fn rdma_receives_ordered(&self) -> bool {
        false
    }

    /// Whether this backend shares device memory between processes
    /// ([`Device::alloc_shareable`], [`Device::export`],
    /// [`Device::import`]).
    fn shares_memory(&self) -> bool {
        false
    }

    /// Allocates `bytes` of zeroed device memory that [`Device::export`]
    /// can hand to another process (CUDA: a cuMem allocation whose handle
    /// type is a POSIX file descriptor). Freed by [`Device::free`].
    fn alloc_shareable(&self, bytes: usize) -> Result<*mut u8> {
        let _ = bytes;
        Err(self.no_sharing())
    }

    /// A file descriptor that names the shareable allocation at `ptr`, to
    /// pass to another process of this host over a Unix socket
    /// (`SCM_RIGHTS`); with its length.
    fn export(&self, ptr: *mut u8) -> Result<(OwnedFd, usize)> {
        let _ = ptr;
        Err(self.no_sharing())
    }

    /// A dma-buf file descriptor for the shareable allocation at `ptr`, for
    /// a NIC to register (GPUDirect RDMA through the file), and the
    /// allocation's offset in it (CUDA: `cuMemGetHandleForAddressRange`;
    /// the emulated GPU: its memfd, which a NIC model maps).
    fn export_dmabuf(&self, ptr: *mut u8) -> Result<(OwnedFd, u64)> {
        let _ = ptr;
        Err(self.no_sharing())
    }

    /// Maps the `bytes` of device memory another process exported as
    /// `handle`. A process cannot open a handle it exported itself (as
    /// CUDA's). Unmapped by [`Device::free`].
    fn import(&self, handle: OwnedFd, bytes: usize) -> Result<*mut u8> {
        let _ = (handle, bytes);
        Err(self.no_sharing())
    }

    /// The error of a backend that shares no memory between processes.
    fn no_sharing(&self) -> Error {
        Error::InvalidArgument(format!(
            "the {} backend does not share device memory between processes",
            self.backend()
        ))
    }
}

/// An ordered queue of device work.
pub trait Stream: Send + Sync {
    /// The raw `cudaStream_t` value that names it.
    fn raw(&self) -> usize;

    /// Enqueues `work` after everything enqueued so far.
    fn enqueue(&self, work: Work) -> Result<()>;

    /// Enqueues a copy of `bytes` from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges must stay valid until the copy has run.
    unsafe fn copy_async(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()>;

    /// Records `event` here: it completes when the work enqueued so far
    /// has.
    fn record(&self, event: &dyn Event) -> Result<()>;

    /// Makes work enqueued after this wait until `event`'s latest record
    /// (at the time of this call) has completed.
    fn wait_event(&self, event: &dyn Event) -> Result<()>;

    /// Whether the stream is capturing a CUDA graph: what is enqueued
    /// now runs on each launch of the graph, not now.
    fn capturing(&self) -> Result<bool> {
        Ok(false)
    }

    /// Waits until everything enqueued so far has run, at most until
    /// `deadline`; reports the stream's first failure, if any.
    fn synchronize(&self, deadline: Instant) -> Result<()>;

    /// For backends that need their own type back.
    fn as_any(&self) -> &dyn Any;
}

/// A marker in a stream's order.
pub trait Event: Send + Sync {
    /// Whether the latest record has completed (true when never recorded,
    /// as CUDA's).
    fn query(&self) -> bool;

    /// Waits for the latest record to complete, at most until `deadline`.
    fn synchronize(&self, deadline: Instant) -> Result<()>;

    /// For backends that need their own type back.
    fn as_any(&self) -> &dyn Any;
}

/// The kernels' fatbin (SASS for sm_80, sm_90, sm_100 and compute_80
/// PTX), built from `kernels/` by `scripts/build-kernels.sh`.
pub static KERNELS_FATBIN: &[u8] = include_bytes!("../fatbin/kernels.fatbin");

/// What the fatbin was built from (`fatbin/MANIFEST`).
pub static KERNELS_MANIFEST: &str = include_str!("../fatbin/MANIFEST");
