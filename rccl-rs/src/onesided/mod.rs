//! One-sided calls (NCCL's windows, `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`): a rank writes into a peer's registered window and
//! raises a signal there; the peer never posts a matching call, it waits
//! for the signal's count.
//!
//! - `register.rs`: registering and deregistering a window, collectively:
//!   every rank publishes its window, checks what it gets, and all agree
//!   on the outcome, so a window exists on every rank or on none.
//! - `put.rs`: puts and signals: checks, the write into the peer's
//!   window, the signal raised after it.
//! - `wait.rs`: waits for signal counts, with the communicator's deadline,
//!   its abort flag and the peer's fate watched.
//! - `remote.rs`: puts and signals to ranks on other hosts, as messages
//!   over the bootstrap's connections.
//! - `landing.rs`: where those messages land at the target, as they
//!   arrive, without the target taking part.
//! - `stream.rs`: the same calls ordered on a stream, for windows of
//!   device memory.
//! - `device_memory.rs`: windows of device memory between processes: the
//!   owner's export, a peer's import.
//! - `symmetric.rs`: which symmetric window holds a collective's buffer,
//!   and where every rank's copy of it lies.
//!
//! How the bytes cross within a host (the peer's own pointer in this
//! process, a mapping of its shareable memory in another) is
//! `rccl_transports`' business; across hosts they go over the bootstrap's
//! authenticated TCP connections.
//! On host memory every call completes before it returns (the stream is
//! not used; on device memory see `stream.rs`), so puts reach a window in the order they were called, which
//! is what `NCCL_WIN_STRICT_ORDERING` asks for; inside a group they run
//! at once too (they never wait for the peer), and a wait waits where it
//! is called (the C ABI runs a grouped `ncclWaitSignal` at the group's
//! end).

mod device_memory;
mod landing;
mod put;
mod register;
mod remote;
mod stream;
mod symmetric;
mod wait;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rccl_transports::{PeerWindow, SignalBlock};

use crate::comm::{CommInner, Communicator};
use crate::error::{Error, Result};
use crate::memory::Hold;
use landing::Landing;

pub(crate) use symmetric::symmetric_span;
pub use symmetric::SymmetricSpan;
pub use wait::WaitDesc;

/// `NCCL_WIN_COLL_SYMMETRIC`: every rank registers the same size.
pub const WIN_COLL_SYMMETRIC: u32 = 0x01;
/// `NCCL_WIN_STRICT_ORDERING`: puts into the window land in call order.
pub const WIN_STRICT_ORDERING: u32 = 0x02;
/// Every flag of `nccl.h` (`NCCL_WIN_GIN_ONLY`, `NCCL_WIN_CFT_COUNTED`
/// concern the device API and change nothing here).
pub const WIN_FLAGS: u32 = 0x0f;
/// `NCCL_WIN_REQUIRED_ALIGNMENT`: a window's first byte is a multiple of
/// this.
pub const WIN_REQUIRED_ALIGNMENT: usize = 4096;

/// A window registered with a communicator (`ncclWindow_t`): the same
/// window on every rank, each rank's own buffer behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window(u64);

impl Window {
    /// The window's handle for the C ABI: never 0, unique in the process.
    pub fn handle(self) -> u64 {
        self.0
    }

    /// The window of a handle [`Window::handle`] gave (calls check that
    /// it names a window of their communicator).
    pub fn from_handle(handle: u64) -> Window {
        Window(handle)
    }
}

/// Handles of windows in this process.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// A communicator's one-sided state.
struct State {
    /// Windows registered so far, counted the same on every rank.
    registered: u64,
    windows: std::collections::BTreeMap<u64, WindowEntry>,
    signals: Option<Signals>,
    /// Where puts and signals from other hosts land.
    landing: Arc<Landing>,
}

/// One registered window on this rank.
struct WindowEntry {
    /// Its number in the communicator's registrations (the same on every
    /// rank), for messages.
    seq: u64,
    base: usize,
    size: usize,
    flags: u32,
    /// Whether this rank's buffer is shareable memory counted as in use.
    exported: bool,
    /// Whether some rank's buffer is device memory: then every rank is
    /// on this host, and puts into the window run on streams
    /// (`stream.rs`).
    device: bool,
    /// Per rank, its window as this rank writes it; `None` for a rank on
    /// another host (reached by messages, `remote.rs`).
    peers: Vec<Option<PeerWindow>>,
    /// Per rank, its window's size.
    sizes: Vec<usize>,
    /// The mappings of peers' windows in the communicator's ledger.
    _held: Vec<Hold>,
    /// The server of this rank's device memory as exported for peers in
    /// other processes, alive while the window lives.
    _offered: Option<rccl_transports::ServedFd>,
    /// Peers' device memory mapped into this process.
    _imports: Vec<device_memory::Imported>,
    /// This rank's buffer as device memory in a window, if it is.
    _device_use: Option<DeviceUse>,
}

impl WindowEntry {
    /// The error of a `call` by `comm`'s rank that writes `bytes` bytes at
    /// `offset` of `peer`'s part of this window, which holds `len` bytes.
    fn past_end(
        &self,
        comm: &CommInner,
        call: &str,
        peer: usize,
        offset: usize,
        bytes: usize,
        len: usize,
    ) -> Error {
        Error::InvalidArgument(format!(
            "{call}: rank {}: {bytes} bytes at offset {offset} run past the end of window #{} of \
             rank {peer} ({len} bytes)",
            comm.rank, self.seq
        ))
    }
}

/// Device memory of this process in registered windows, as (first byte,
/// bytes), once per window: `ncclMemFree` refuses to free it.
static DEVICE_IN_WINDOWS: parking_lot::Mutex<Vec<(usize, usize)>> =
    parking_lot::Mutex::new(Vec::new());

/// A window's use of this process's device memory, counted while it
/// lives.
struct DeviceUse((usize, usize));

impl DeviceUse {
    fn new(base: usize, size: usize) -> DeviceUse {
        DEVICE_IN_WINDOWS.lock().push((base, size));
        DeviceUse((base, size))
    }
}

impl Drop for DeviceUse {
    fn drop(&mut self) {
        let mut all = DEVICE_IN_WINDOWS.lock();
        if let Some(i) = all.iter().position(|&used| used == self.0) {
            all.swap_remove(i);
        }
    }
}

/// Refuses to free the device allocation of `len` bytes at `ptr` while a
/// registered window uses any of it.
pub fn check_device_free(ptr: *mut u8, len: usize) -> Result<()> {
    let (start, end) = (ptr as usize, (ptr as usize).saturating_add(len.max(1)));
    let windows = DEVICE_IN_WINDOWS
        .lock()
        .iter()
        .filter(|&&(base, size)| base < end && start < base.saturating_add(size.max(1)))
        .count();
    if windows > 0 {
        return Err(Error::InvalidUsage(format!(
            "{ptr:p} ({len} bytes of device memory) is still in {windows} registered window(s): \
             deregister them first"
        )));
    }
    Ok(())
}

/// The signal counters: this rank's block and its peers'.
struct Signals {
    /// Per rank, its block (`None` on another host); this rank's own
    /// is among them.
    blocks: Vec<Option<Arc<SignalBlock>>>,
    /// Per slot of this rank's block, the count waits have consumed.
    consumed: Vec<u32>,
    /// The blocks in the communicator's ledger: they live as long as it.
    _held: Vec<Hold>,
}

/// A communicator destroyed with windows still registered (a failed one
/// refuses the collective deregistration) releases them, so their
/// shareable memory can be freed.
impl Drop for State {
    fn drop(&mut self) {
        for entry in self.windows.values().filter(|w| w.exported) {
            rccl_transports::release_window(entry.base as *const u8);
        }
    }
}

impl State {
    fn new(comm: &CommInner) -> State {
        State {
            registered: 0,
            windows: Default::default(),
            signals: None,
            landing: Landing::start(comm),
        }
    }

    fn window(&self, comm: &CommInner, window: Window, call: &str) -> Result<&WindowEntry> {
        self.windows.get(&window.0).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{call}: rank {}: {:#x} is not a window of this communicator (registered and not \
                 deregistered)",
                comm.rank, window.0
            ))
        })
    }

    fn signals(&self, comm: &CommInner, call: &str) -> Result<&Signals> {
        self.signals.as_ref().ok_or_else(|| {
            Error::InvalidUsage(format!(
                "{call}: rank {}: no window was registered with this communicator yet: signals \
                 come with the first ncclCommWindowRegister",
                comm.rank
            ))
        })
    }
}

/// The slot of signal `(sig, ctx)` from `src` in a block.
fn slot(comm: &CommInner, sig: usize, ctx: usize, src: usize) -> usize {
    (ctx * comm.config.rma_signals + sig) * comm.nranks + src
}

/// Checks a `(sigIdx, ctx)` pair and a peer against the communicator.
fn check_signal(comm: &CommInner, call: &str, peer: usize, sig: usize, ctx: usize) -> Result<()> {
    let me = comm.rank;
    if peer >= comm.nranks {
        return Err(Error::InvalidArgument(format!(
            "{call}: rank {me}: peer {peer} is outside 0..{}",
            comm.nranks
        )));
    }
    if sig >= comm.config.rma_signals {
        return Err(Error::InvalidArgument(format!(
            "{call}: rank {me}: sigIdx {sig} is outside 0..{} (NCCL_NUM_RMA_SIG, \
             ncclConfig_t.numRmaSig)",
            comm.config.rma_signals
        )));
    }
    if ctx >= comm.config.rma_contexts {
        return Err(Error::InvalidArgument(format!(
            "{call}: rank {me}: ctx {ctx} is outside 0..{} (NCCL_NUM_RMA_CTX, \
             ncclConfig_t.numRmaCtx)",
            comm.config.rma_contexts
        )));
    }
    Ok(())
}

impl Communicator {
    /// Runs `f` on the communicator's one-sided state, made if need be.
    fn with_one_sided<T>(&self, f: impl FnOnce(&CommInner, &mut State) -> Result<T>) -> Result<T> {
        let inner = &*self.inner;
        inner.check_usable()?;
        let mut slot = inner.one_sided.lock();
        let boxed = slot.get_or_insert_with(|| Box::new(State::new(inner)));
        let state = boxed
            .downcast_mut::<State>()
            .expect("the one-sided state is onesided::State");
        f(inner, state)
    }

    /// This rank's buffer of `window` and its size (`ncclWinGetUserPtr`).
    pub fn window_buffer(&self, window: Window) -> Result<(*mut u8, usize)> {
        self.with_one_sided(|comm, state| {
            let entry = state.window(comm, window, "ncclWinGetUserPtr")?;
            Ok((entry.base as *mut u8, entry.size))
        })
    }

    /// The flags `window` was registered with.
    pub fn window_flags(&self, window: Window) -> Result<u32> {
        self.with_one_sided(|comm, state| Ok(state.window(comm, window, "window flags")?.flags))
    }
}

/// Page-aligned, zeroed host memory that peers in other processes of
/// this host can map as a window (`ncclMemAlloc` without a device).
pub fn alloc_shareable_host(size: usize) -> Result<*mut u8> {
    rccl_transports::alloc_shareable(size)
        .map_err(|e| Error::System(format!("cannot allocate {size} shareable bytes: {e}")))
}

/// Frees memory of [`alloc_shareable_host`]: `Ok(false)` when `ptr` is
/// not such memory, an error while a registered window still uses it.
pub fn free_shareable_host(ptr: *mut u8) -> Result<bool> {
    rccl_transports::free_shareable(ptr).map_err(Error::InvalidUsage)
}

fn next_handle() -> u64 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}
