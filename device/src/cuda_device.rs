//! The CUDA backend as a [`Device`]: memory, streams and events of one
//! context (the caller's current one when the device opened, else device
//! 0's primary context), made current around every driver call on any
//! thread; host work through `cuLaunchHostFunc`, and device work launched
//! as the fatbin's interpreter kernel.
//!
//! Nothing the engine calls while another rank's kernel may be running
//! waits for kernels: memory is allocated and freed in the order of the
//! backend's own stream (`cuMemAllocAsync`, `cuMemFreeAsync`), where
//! `cuMemAlloc` and `cuMemFree` may wait for every kernel of the device
//! (a rank spinning for this one would never finish); the kernels are
//! loaded and a pool of mapped pinned memory for the launches' work
//! blocks and status words allocated when the device opens.
//! Zeroing and [`Device::copy`] run on that stream and are synchronized
//! before they return, so whatever reads the memory next sees them.
//!
//! NOT YET RUN ON HARDWARE: everything in this file compiles against
//! `cuda.h`'s bindings but has not run on a GPU (the machines this
//! is developed on have none). `scripts/gpu-check.sh` exercises it
//! through the perf binaries on `--memory device`; `tests/cuda_model.rs`
//! runs it over the CUDA driver model.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUcontext, CUevent, CUstream};
use parking_lot::Mutex;

use crate::cuda::{check, work_threads, CudaError, Driver, Kernels, Memory as CudaMemory};
use crate::cuda_api as api;
use crate::work::{WorkBlock, WorkHeader};
use crate::{Device, Error, Event, Memory, Result, Stream, Work, WorkFailure, WorkLaunch};

const BACKEND: &str = "cuda";

fn err(e: CudaError) -> Error {
    match e {
        CudaError::Invalid(why) => Error::InvalidArgument(why),
        other => Error::System(other.to_string()),
    }
}

fn call(name: &'static str, r: sys::CUresult) -> Result<()> {
    check(name, r).map_err(err)
}

/// A context made current on this thread for the guard's life; the
/// thread's own current context, if any, is current again after.
struct Current {
    pushed: bool,
}

impl Current {
    fn push(context: CUcontext) -> std::result::Result<Current, CudaError> {
        let mut now = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check("cuCtxGetCurrent", unsafe { api::cuCtxGetCurrent(&mut now) })?;
        if now == context {
            return Ok(Current { pushed: false });
        }
        // SAFETY: a live context of this device, retained or the caller's.
        check("cuCtxPushCurrent", unsafe {
            api::cuCtxPushCurrent_v2(context)
        })?;
        Ok(Current { pushed: true })
    }

    fn enter(context: CUcontext) -> Result<Current> {
        Current::push(context).map_err(err)
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops the context `enter` pushed on this thread; a
            // failure leaves nothing to undo.
            let _ = unsafe { api::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// Pinned host memory mapped into the device's address space: a launch's
/// work blocks (read by its kernels) and status words (written by them,
/// read by its host function), or the word a host-staged task sets.
/// Reused between launches: a host function may not free it (it may not
/// call CUDA).
struct Pinned {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: pinned host memory owned by this value alone (the kernels and
// host function of the launch holding it use it in stream order); handed
// between threads whole, never written through a shared reference.
unsafe impl Send for Pinned {}
// SAFETY: as above: shared references only read the address.
unsafe impl Sync for Pinned {}

/// A launch's report of how each run ended (the engine's `done`).
type Done = Box<dyn FnMut(std::result::Result<(), WorkFailure>) + Send>;

/// What a launch keeps until it can run no more: after its run, or, when
/// captured in a CUDA graph, until the graph and every executable graph
/// made from it are gone (the graph's user object owns it then).
struct LaunchState {
    /// The status words (one per channel, first) and the work blocks.
    pinned: Option<Pinned>,
    channels: usize,
    /// (round, block, channel) of each status word.
    channel_of: Vec<(usize, usize, usize)>,
    timeout: Duration,
    done: Mutex<Option<Done>>,
    spare: Arc<Mutex<Vec<Pinned>>>,
    /// The watcher's list and this launch's id in it: followed (its abort
    /// words set when it must stop) as long as it can run.
    watch: (WatchList, u64),
}

impl LaunchState {
    /// How the last run ended, from the status words its kernels wrote.
    fn ended(&self) -> std::result::Result<(), WorkFailure> {
        let pinned = self.pinned.as_ref().expect("held until dropped");
        // SAFETY: every kernel of the run wrote its words before the host
        // function that calls this runs (stream order); `channels` words
        // lie at the start of the pinned memory.
        let ends = unsafe { std::slice::from_raw_parts(pinned.ptr.cast::<i32>(), self.channels) };
        let Some(c) = ends.iter().position(|&e| e != 0) else {
            return Ok(());
        };
        Err(WorkFailure {
            error: Error::System(format!(
                "device work did not finish: channel {c} of the launch ended with {} (1 aborted, \
                 2 still waiting {:?} after it started, 3 too large: a step of too many \
                 primitives or a channel of too many peers)",
                ends[c], self.timeout
            )),
            timed_out: ends.contains(&2),
            unfinished: ends
                .iter()
                .zip(&self.channel_of)
                .filter(|(&end, _)| end != 0)
                .map(|(_, &at)| at)
                .collect(),
        })
    }

    /// Reports a run: the only one of an ordinary launch (`done` goes
    /// with it), or one replay of a captured launch.
    fn report(&self, last: bool) {
        let result = self.ended();
        let mut done = self.done.lock();
        if last {
            let taken = done.take();
            drop(done);
            unwatch(&self.watch.0, self.watch.1);
            if let Some(mut done) = taken {
                done(result);
            }
        } else if let Some(done) = done.as_mut() {
            done(result);
        }
    }

    /// Reports the launch failed without running to the end (its context
    /// faulted, so its host function never runs).
    fn fail(&self, error: Error) {
        unwatch(&self.watch.0, self.watch.1);
        let taken = self.done.lock().take();
        if let Some(mut done) = taken {
            done(Err(error.into()));
        }
    }
}

impl Drop for LaunchState {
    fn drop(&mut self) {
        unwatch(&self.watch.0, self.watch.1);
        if let Some(pinned) = self.pinned.take() {
            self.spare.lock().push(pinned);
        }
    }
}

/// Runs `body` as a host function's (or user object destructor's) body:
/// memory freed meanwhile is freed later, since it may not call CUDA.
fn as_host_function(body: impl FnOnce()) {
    IN_HOST_FUNCTION.with(|f| f.set(true));
    body();
    IN_HOST_FUNCTION.with(|f| f.set(false));
}

/// The host function after an ordinary launch: reports its run and drops
/// the reference `Arc::into_raw` gave it.
unsafe extern "C" fn launch_ran(arg: *mut c_void) {
    // SAFETY: the reference `launch_work` leaked for this call, which
    // the driver makes once.
    let state = unsafe { Arc::from_raw(arg.cast_const().cast::<LaunchState>()) };
    as_host_function(|| {
        state.report(true);
        drop(state);
    });
}

/// The host node of a captured launch: reports each replay; the graph's
/// user object owns the argument.
unsafe extern "C" fn launch_replayed(arg: *mut c_void) {
    // SAFETY: the user object keeps the state until the graph and its
    // executables are gone, after their last replay.
    let state = unsafe { &*arg.cast_const().cast::<LaunchState>() };
    as_host_function(|| state.report(false));
}

/// The user object's destructor of a captured launch.
unsafe extern "C" fn launch_released(arg: *mut c_void) {
    // SAFETY: the reference `launch_work` gave the user object, released
    // once by the driver.
    let state = unsafe { Arc::from_raw(arg.cast_const().cast::<LaunchState>()) };
    as_host_function(|| drop(state));
}

/// Ordinary launches in flight, each with an event recorded after its
/// host function. After a kernel fault (a sticky error) no host function
/// of the context runs: the fault watcher finds the error on the events
/// and reports those launches failed, so their communicators learn it.
#[derive(Default)]
struct Faults {
    pending: Mutex<Vec<(usize, std::sync::Weak<LaunchState>)>>,
    wake: parking_lot::Condvar,
    watching: OnceLock<()>,
}

/// How often the fault watcher queries the launches in flight.
const FAULT_POLL: Duration = Duration::from_millis(5);

impl Faults {
    /// Watches `state` until its event (of `context`) completes; starts
    /// the watcher on first use.
    fn watch(self: &Arc<Self>, context: usize, event: CUevent, state: &Arc<LaunchState>) {
        self.watching.get_or_init(|| {
            let faults = self.clone();
            let _ = std::thread::Builder::new()
                .name("rccl-cuda-faults".into())
                .spawn(move || faults.run(context));
        });
        self.pending
            .lock()
            .push((event as usize, Arc::downgrade(state)));
        self.wake.notify_one();
    }

    fn run(&self, context: usize) {
        // The device's context, current on this thread for its life; a
        // failure shows in the queries below.
        let _current = Current::enter(context as CUcontext);
        loop {
            let mut pending = std::mem::take(&mut *self.pending.lock());
            pending.retain(|&(event, ref state)| {
                // SAFETY: an event `launch_work` created for this watch,
                // destroyed here only.
                let answer = unsafe { api::cuEventQuery(event as CUevent) };
                if answer == sys::CUresult::CUDA_ERROR_NOT_READY {
                    return true;
                }
                if let (Err(e), Some(state)) = (check("cuEventQuery", answer), state.upgrade()) {
                    state.fail(Error::System(format!(
                        "the CUDA context failed while device work ran ({e}): its kernels \
                         stopped and nothing more runs in the context"
                    )));
                }
                // SAFETY: as above, destroyed once.
                unsafe { api::cuEventDestroy_v2(event as CUevent) };
                false
            });
            let mut list = self.pending.lock();
            list.extend(pending);
            if list.is_empty() {
                self.wake.wait(&mut list);
            } else {
                drop(list);
                std::thread::sleep(FAULT_POLL);
            }
        }
    }
}

/// Words of mapped page-locked memory the kernels poll to stop
/// ([`Device::alloc_abort_word`]): host and device addresses of each.
#[derive(Default)]
struct AbortWords {
    idle: Vec<(usize, u64)>,
    /// Every word handed out: device address -> host address.
    given: HashMap<u64, usize>,
}

/// Abort words a page of them holds.
const ABORT_WORDS_PER_PAGE: usize = 1024;

/// A launch in flight whose blocks' abort words the watcher sets (host
/// addresses) once its `stop` answers `true`.
struct Watched {
    id: u64,
    stop: Box<dyn Fn() -> bool + Send>,
    words: Vec<usize>,
    stopped: bool,
}

/// How often the watcher asks each launch in flight whether to stop it.
const WATCH: Duration = Duration::from_millis(10);

/// The launches the watcher thread follows.
type WatchList = Arc<Mutex<Vec<Watched>>>;

/// Follows `list`: sets the abort words of each launch whose `stop`
/// answers `true` (a communicator aborted or failed, a peer died, a
/// connection broke), which ends its kernels' waits.
fn watch(list: WatchList) {
    loop {
        std::thread::sleep(WATCH);
        for launch in list.lock().iter_mut().filter(|l| !l.stopped) {
            if (launch.stop)() {
                for &word in &launch.words {
                    // SAFETY: a mapped page-locked word of this device,
                    // kept while the launch is listed (its abort word);
                    // the kernels read it with atomic loads.
                    unsafe { AtomicU32::from_ptr(word as *mut u32) }.store(1, Ordering::Release);
                }
                launch.stopped = true;
            }
        }
    }
}

/// Pinned memory allocated when the device opens: this many pieces of
/// [`PINNED_BYTES`] (1 MiB). A launch needing more, or one beyond this
/// many in flight or kept by CUDA graphs, allocates its own
/// (`cuMemHostAlloc`, which may wait for running kernels).
const PINNED_SETS: usize = 64;
const PINNED_BYTES: usize = 16 << 10;

/// A CUDA device: one context and its device.
pub struct CudaDevice {
    driver: &'static Driver,
    ordinal: i32,
    context: usize,
    name: String,
    kernels: Kernels,
    /// The backend's own non-blocking stream: allocation, frees, zeroing
    /// and [`Device::copy`], each synchronized before the memory is used
    /// (frees need not be).
    own: usize,
    spare_pinned: Arc<Mutex<Vec<Pinned>>>,
    faults: Arc<Faults>,
    /// Memory freed from a host function, which may not call CUDA: freed
    /// (in the own stream's order, waiting for no kernel) at the next
    /// allocation or free.
    deferred: Mutex<Vec<u64>>,
    /// Page-locked host memory freed from a host function: freed at the
    /// next page-locked allocation (`cuMemFreeHost` may wait for kernels).
    deferred_host: Mutex<Vec<usize>>,
    /// cuMem mappings (shareable allocations and imports), by address:
    /// their allocation handle and mapped size.
    mapped: Mutex<HashMap<u64, (sys::CUmemGenericAllocationHandle, usize)>>,
    abort_words: Mutex<AbortWords>,
    /// Launches in flight, followed by a thread started with the first.
    watched: WatchList,
    watcher: OnceLock<()>,
    next_launch: AtomicU64,
}

// SAFETY: the context and streams are driver handles usable from any
// thread of the process; the rest is Send + Sync.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

thread_local! {
    /// Whether this thread is running a host function (`cuLaunchHostFunc`).
    static IN_HOST_FUNCTION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl CudaDevice {
    /// Opens the device of the calling thread's current context (device
    /// 0's primary context when it has none) when a driver loads and a
    /// device exists.
    pub fn open() -> std::result::Result<CudaDevice, CudaError> {
        let driver = Driver::get()?;
        if driver.device_count()? == 0 {
            return Err(CudaError::Invalid("the CUDA driver sees no device".into()));
        }
        let context = match driver.current_context()? {
            Some(context) => context,
            None => driver.primary_context(0)?,
        };
        let _current = Current::push(context)?;
        let ordinal = driver.context_device()?;
        // Loaded now, not at the first launch: a module load may wait for
        // running kernels.
        let kernels = driver.load_kernels(ordinal)?;
        let own = driver.create_stream()? as usize;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let mut slab = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the slab lives for the process.
        check("cuMemHostAlloc", unsafe {
            api::cuMemHostAlloc(&mut slab, PINNED_SETS * PINNED_BYTES, flags)
        })?;
        let spare = (0..PINNED_SETS)
            .map(|set| Pinned {
                // SAFETY: piece `set` of the slab's PINNED_SETS.
                ptr: unsafe { slab.cast::<u8>().add(set * PINNED_BYTES) },
                bytes: PINNED_BYTES,
            })
            .collect();
        let mut abort_words = AbortWords::default();
        // A first page of abort words now: allocating page-locked memory
        // may wait for the device's kernels, so not on a call's path.
        add_abort_words(&mut abort_words).map_err(|e| CudaError::Invalid(e.to_string()))?;
        Ok(CudaDevice {
            driver,
            ordinal,
            context: context as usize,
            name: driver.device_name(ordinal)?,
            kernels,
            own,
            spare_pinned: Arc::new(Mutex::new(spare)),
            faults: Arc::default(),
            deferred: Mutex::default(),
            deferred_host: Mutex::default(),
            mapped: Mutex::default(),
            abort_words: Mutex::new(abort_words),
            watched: WatchList::default(),
            watcher: OnceLock::new(),
            next_launch: AtomicU64::new(0),
        })
    }

    /// Makes this device's context current on the calling thread until
    /// the guard drops.
    fn enter(&self) -> Result<Current> {
        Current::enter(self.context as CUcontext)
    }

    /// The host addresses of the abort words of `rounds`' blocks that
    /// this device handed out.
    fn abort_words_of(&self, rounds: &[Vec<Arc<crate::work::Work>>]) -> Vec<usize> {
        let words = self.abort_words.lock();
        rounds
            .iter()
            .flatten()
            // SAFETY: each block starts with its header.
            .filter_map(|w| words.given.get(&(unsafe { (*w.header()).abort } as u64)))
            .copied()
            .collect()
    }

    /// Has the watcher follow a launch until [`unwatch`]; its id.
    fn follow(&self, stop: Box<dyn Fn() -> bool + Send>, words: Vec<usize>) -> Result<u64> {
        let list = self.watched.clone();
        let mut started = Ok(());
        self.watcher.get_or_init(|| {
            started = std::thread::Builder::new()
                .name("rccl-cuda-watch".into())
                .spawn(move || watch(list))
                .map(drop);
        });
        started.map_err(|e| Error::System(format!("cannot start the launch watcher: {e}")))?;
        let id = self.next_launch.fetch_add(1, Ordering::Relaxed);
        self.watched.lock().push(Watched {
            id,
            stop,
            words,
            stopped: false,
        });
        Ok(id)
    }

    fn own(&self) -> CUstream {
        self.own as CUstream
    }

    /// Pinned mapped memory of at least `bytes`, spare or new. The
    /// context is current.
    fn pinned(&self, bytes: usize) -> Result<Pinned> {
        let mut spare = self.spare_pinned.lock();
        if let Some(at) = spare.iter().position(|p| p.bytes >= bytes) {
            return Ok(spare.swap_remove(at));
        }
        drop(spare);
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // Room to grow: a launch slightly larger reuses it.
        let bytes = bytes.max(PINNED_BYTES).next_power_of_two();
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; a fresh pinned allocation of
        // `bytes`, kept for the life of the process.
        call("cuMemHostAlloc", unsafe {
            api::cuMemHostAlloc(&mut ptr, bytes, flags)
        })?;
        Ok(Pinned {
            ptr: ptr.cast(),
            bytes,
        })
    }

    /// `bytes` of device memory, in the own stream's order, after freeing
    /// what host functions freed. The context is current.
    fn allocate(&self, bytes: usize) -> Result<u64> {
        self.free_deferred()?;
        // SAFETY: the own stream lives as long as the device.
        unsafe { self.driver.alloc(bytes, self.own()) }.map_err(err)
    }
}

/// The driver calls of memory shared between processes.
const VMM_SYMBOLS: &[&str] = &[
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemAddressReserve",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemUnmap",
    "cuMemAddressFree",
    "cuMemRelease",
];

/// Memory shared between processes: cuMem allocations whose handle type is
/// a POSIX file descriptor, mapped read-write for this device.
///
/// NOT YET RUN ON HARDWARE, as the rest of this file.
impl CudaDevice {
    /// Where allocations live: pinned memory of this device, exportable
    /// as a file descriptor.
    fn shareable_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: an all-zero property block is valid (no flags, no
        // metadata); the fields that matter are set below.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location = self.location();
        // A NIC may register it (GPUDirect RDMA through a dma-buf), where
        // the device allows that on cuMem memory, as NCCL's cuMem
        // allocations ask.
        let rdma =
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED;
        if self
            .driver
            .attribute(self.ordinal, rdma)
            .is_ok_and(|flag| flag != 0)
        {
            prop.allocFlags.gpuDirectRDMACapable = 1;
        }
        prop
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal,
        }
    }

    /// Whether the loaded driver exports `symbols`: a driver without them
    /// (an old one, or a partial stand-in) is refused up front, naming
    /// the missing call, rather than halfway through setting memory up.
    fn exports(symbols: &[&str]) -> Result<()> {
        match symbols.iter().find(|name| !api::exports(name)) {
            Some(name) => Err(Error::System(format!(
                "CUDA driver: {name} is missing, so memory cannot be shared \
                 between processes (cuMem virtual memory management)"
            ))),
            None => Ok(()),
        }
    }

    /// The handle and size of the shareable allocation mapped at `ptr`.
    fn shareable_at(&self, ptr: *mut u8) -> Result<(sys::CUmemGenericAllocationHandle, usize)> {
        self.mapped
            .lock()
            .get(&(ptr as u64))
            .copied()
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{ptr:p} is not a shareable allocation of cuda device {}",
                    self.ordinal
                ))
            })
    }

    /// `bytes` rounded up to the allocation granularity.
    fn granular(&self, bytes: usize) -> Result<usize> {
        let prop = self.shareable_prop();
        let mut granularity = 0usize;
        // SAFETY: valid out-pointer and property block.
        call("cuMemGetAllocationGranularity", unsafe {
            api::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(bytes.max(1).div_ceil(granularity.max(1)) * granularity.max(1))
    }

    /// Maps `handle` (`size` bytes, granular) at a fresh address, readable
    /// and writable by this device; the mapping owns the handle from here.
    fn map(&self, handle: sys::CUmemGenericAllocationHandle, size: usize) -> Result<*mut u8> {
        let mut ptr: sys::CUdeviceptr = 0;
        let access = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: a reservation of `size` bytes, `handle` mapped over all
        // of it, access set on that range; undone on failure.
        let mapped = unsafe {
            call(
                "cuMemAddressReserve",
                api::cuMemAddressReserve(&mut ptr, size, 0, 0, 0),
            )
            .and_then(|()| call("cuMemMap", api::cuMemMap(ptr, size, 0, handle, 0)))
            .and_then(|()| call("cuMemSetAccess", api::cuMemSetAccess(ptr, size, &access, 1)))
        };
        if let Err(e) = mapped {
            // SAFETY: undoes what succeeded above; failures of the undo
            // add nothing to the error.
            unsafe {
                if ptr != 0 {
                    let _ = api::cuMemUnmap(ptr, size);
                    let _ = api::cuMemAddressFree(ptr, size);
                }
                let _ = api::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.mapped.lock().insert(ptr, (handle, size));
        Ok(ptr as *mut u8)
    }

    /// Frees the device memory host functions freed. The context is
    /// current.
    fn free_deferred(&self) -> Result<()> {
        let deferred = std::mem::take(&mut *self.deferred.lock());
        for ptr in deferred {
            // SAFETY: freed by its last user, deferred out of a host
            // function; nothing enqueued since uses it.
            unsafe { self.release(ptr) }?;
        }
        Ok(())
    }

    /// `cuMemFreeHost`s `ptr`.
    ///
    /// # Safety
    /// As [`Device::free_host`].
    unsafe fn release_host(&self, ptr: *mut u8) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: the caller's contract.
        call("cuMemFreeHost", unsafe { api::cuMemFreeHost(ptr.cast()) })
    }

    /// Frees `ptr`: a cuMem mapping is unmapped and its handle released,
    /// anything else is freed in the own stream's order. The context is
    /// current.
    ///
    /// # Safety
    /// As [`Device::free`].
    unsafe fn release(&self, ptr: u64) -> Result<()> {
        let Some((handle, size)) = self.mapped.lock().remove(&ptr) else {
            // SAFETY: the caller's contract.
            return unsafe { self.driver.free(ptr, self.own()) }.map_err(err);
        };
        // SAFETY: the mapping made by `map`, unused (the caller's
        // contract); the physical memory goes once every process that
        // mapped it has released it.
        unsafe {
            call("cuMemUnmap", api::cuMemUnmap(ptr, size))?;
            call("cuMemAddressFree", api::cuMemAddressFree(ptr, size))?;
            call("cuMemRelease", api::cuMemRelease(handle))
        }
    }
}

/// Adds a page of mapped page-locked abort words to `words`.
fn add_abort_words(words: &mut AbortWords) -> Result<()> {
    let bytes = ABORT_WORDS_PER_PAGE * 4;
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    let mut host = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the page is kept for the life of the
    // process (words go back to the idle list, never to the driver).
    call("cuMemHostAlloc", unsafe {
        api::cuMemHostAlloc(&mut host, bytes, flags)
    })?;
    let mut device: sys::CUdeviceptr = 0;
    // SAFETY: `host` is mapped memory of the current context; a valid
    // out-pointer.
    call("cuMemHostGetDevicePointer", unsafe {
        api::cuMemHostGetDevicePointer_v2(&mut device, host, 0)
    })?;
    for k in (0..ABORT_WORDS_PER_PAGE).rev() {
        words
            .idle
            .push((host as usize + 4 * k, device + 4 * k as u64));
    }
    Ok(())
}

/// Stops following launch `id`.
fn unwatch(list: &WatchList, id: u64) {
    let mut list = list.lock();
    let gone = list
        .iter()
        .position(|l| l.id == id)
        .map(|at| list.swap_remove(at));
    drop(list);
    drop(gone);
}

/// `later` waits for everything enqueued on `earlier` so far. The
/// streams' context is current.
fn order(earlier: CUstream, later: CUstream) -> Result<()> {
    // Work outside a capture is waited for on each launch of the graph
    // that `later` captures.
    let wait = if capture_graph(later)?.is_some() && capture_graph(earlier)?.is_none() {
        sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32
    } else {
        0
    };
    let mut event = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    call("cuEventCreate", unsafe {
        api::cuEventCreate(
            &mut event,
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    })?;
    // SAFETY: live streams of the current context and a fresh event,
    // destroyed once both calls are enqueued (CUDA releases it when done).
    unsafe {
        let ordered = call("cuEventRecord", api::cuEventRecord(event, earlier)).and_then(|()| {
            call(
                "cuStreamWaitEvent",
                api::cuStreamWaitEvent(later, event, wait),
            )
        });
        api::cuEventDestroy_v2(event);
        ordered
    }
}

/// The raw stream of a backend stream.
fn raw_of(stream: &dyn Stream) -> Result<CUstream> {
    stream
        .as_any()
        .downcast_ref::<CudaStream>()
        .map(|s| s.raw as CUstream)
        .ok_or_else(|| Error::InvalidArgument("not a stream of the CUDA backend".into()))
}

/// Joins `streams` into the first: work enqueued on it next runs after
/// everything enqueued so far on all of them.
fn join(streams: &[Arc<dyn Stream>]) -> Result<CUstream> {
    let first = raw_of(
        streams
            .first()
            .ok_or_else(|| Error::InvalidArgument("device work needs a stream".into()))?
            .as_ref(),
    )?;
    for other in &streams[1..] {
        let other = raw_of(other.as_ref())?;
        if other != first {
            order(other, first)?;
        }
    }
    Ok(first)
}

/// The other streams wait for what was enqueued on the first.
fn fork(first: CUstream, streams: &[Arc<dyn Stream>]) -> Result<()> {
    for other in &streams[1..] {
        let other = raw_of(other.as_ref())?;
        if other != first {
            order(first, other)?;
        }
    }
    Ok(())
}

unsafe extern "C" fn run_host_work(arg: *mut c_void) {
    // SAFETY: `arg` is the box `enqueue_host` leaked for this call, run
    // once by the driver.
    let work = unsafe { Box::from_raw(arg.cast::<Work>()) };
    IN_HOST_FUNCTION.with(|f| f.set(true));
    work();
    IN_HOST_FUNCTION.with(|f| f.set(false));
}

/// Runs `work` on the host in `stream`'s order (`cuLaunchHostFunc`). The
/// stream's context is current.
fn enqueue_host(stream: CUstream, work: Work) -> Result<()> {
    let arg = Box::into_raw(Box::new(work));
    // SAFETY: the function takes back the box it is given, once.
    let r = unsafe { api::cuLaunchHostFunc(stream, Some(run_host_work), arg.cast()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the driver did not take the box.
        drop(unsafe { Box::from_raw(arg) });
    }
    call("cuLaunchHostFunc", r)
}

/// A task of [`Device::enqueue_joint`]: run on a thread of its own, then
/// the mapped word its stream waits for is set (also when the task is
/// dropped unrun, so that the stream goes on; the task reports why).
struct JointTask {
    work: Option<Work>,
    flag: usize,
}

impl JointTask {
    fn run(mut self) {
        if let Some(work) = self.work.take() {
            work();
        }
    }
}

impl Drop for JointTask {
    fn drop(&mut self) {
        // SAFETY: the pinned word the stream waits for, kept until the
        // wait passed (which this store allows).
        unsafe { AtomicU32::from_ptr(self.flag as *mut u32) }.store(1, Ordering::Release);
    }
}

/// The host function of a joint task: starts its thread and returns.
unsafe extern "C" fn start_joint_task(arg: *mut c_void) {
    // SAFETY: the box `enqueue_joint` leaked for this call, run once.
    let task = unsafe { Box::from_raw(arg.cast::<JointTask>()) };
    // A thread that cannot start drops the task unrun, which sets the
    // word (the work, dropped, reports that it never ran).
    let _ = std::thread::Builder::new()
        .name("rccl-staged-task".into())
        .spawn(move || task.run());
}

impl Device for CudaDevice {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn label(&self) -> String {
        format!("[cuda {}] {}", self.ordinal, self.name)
    }

    fn index(&self) -> u32 {
        self.ordinal as u32
    }

    fn classify(&self, ptr: *const u8) -> Result<Memory> {
        let _current = self.enter()?;
        let memory = self
            .driver
            .classify(ptr.cast())
            .map_err(|e| Error::System(format!("cannot tell which memory {ptr:p} is: {e}")))?;
        Ok(match memory {
            CudaMemory::Device(index) => Memory::Device {
                backend: BACKEND,
                index: index as u32,
            },
            CudaMemory::Managed => Memory::Device {
                backend: BACKEND,
                index: self.ordinal as u32,
            },
            CudaMemory::Host | CudaMemory::PinnedHost => Memory::Host,
        })
    }

    fn allocation(&self, ptr: *const u8) -> Option<(usize, usize)> {
        let _current = self.enter().ok()?;
        self.driver.address_range(ptr as sys::CUdeviceptr)
    }

    fn alloc(&self, bytes: usize) -> Result<*mut u8> {
        let _current = self.enter()?;
        Ok(self.allocate(bytes)? as *mut u8)
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<*mut u8> {
        let _current = self.enter()?;
        let ptr = self.allocate(bytes)?;
        // SAFETY: a fresh allocation of `bytes`; zeroed on the own stream
        // and synchronized, so whatever uses it next sees zeros.
        unsafe { self.driver.memset(ptr, 0, bytes, self.own()) }.map_err(err)?;
        Ok(ptr as *mut u8)
    }

    unsafe fn free(&self, ptr: *mut u8) -> Result<()> {
        if IN_HOST_FUNCTION.with(|f| f.get()) {
            self.deferred.lock().push(ptr as u64);
            return Ok(());
        }
        let _current = self.enter()?;
        self.free_deferred()?;
        // SAFETY: the caller's contract.
        unsafe { self.release(ptr as u64) }
    }

    fn alloc_host(&self, bytes: usize) -> Result<*mut u8> {
        for ptr in std::mem::take(&mut *self.deferred_host.lock()) {
            // SAFETY: page-locked memory from alloc_host, freed by its
            // last user out of a host function.
            unsafe { self.release_host(ptr as *mut u8) }?;
        }
        let _current = self.enter()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the current context is this
        // device's.
        call("cuMemHostAlloc", unsafe {
            api::cuMemHostAlloc(&mut ptr, bytes.max(1), 0)
        })?;
        Ok(ptr.cast())
    }

    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()> {
        if IN_HOST_FUNCTION.with(|f| f.get()) {
            self.deferred_host.lock().push(ptr as usize);
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { self.release_host(ptr) }
    }

    unsafe fn copy(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: the caller's contract; unified addressing names both.
        // On the own stream and synchronized: a synchronous cuMemcpy
        // would run on the legacy stream, unordered with non-blocking
        // streams and, from pageable memory, possibly after it returned.
        unsafe {
            call(
                "cuMemcpyAsync",
                api::cuMemcpyAsync(dst as u64, src as u64, bytes, self.own()),
            )?;
            self.driver.synchronize(self.own()).map_err(err)
        }
    }

    fn shares_memory(&self) -> bool {
        true
    }

    fn alloc_abort_word(&self) -> Result<*mut u32> {
        let mut words = self.abort_words.lock();
        if words.idle.is_empty() {
            // More communicators than a page of words: one more page.
            let _current = self.enter()?;
            add_abort_words(&mut words)?;
        }
        let (host, device) = words.idle.pop().expect("a page was added");
        // SAFETY: an idle word of a live page; no kernel reads it.
        unsafe { AtomicU32::from_ptr(host as *mut u32) }.store(0, Ordering::Release);
        words.given.insert(device, host);
        Ok(device as *mut u32)
    }

    unsafe fn free_abort_word(&self, word: *mut u32) -> Result<()> {
        let mut words = self.abort_words.lock();
        let host = words.given.remove(&(word as u64)).ok_or_else(|| {
            Error::InvalidArgument(format!("{word:p} is not an abort word of this device"))
        })?;
        words.idle.push((host, word as u64));
        Ok(())
    }

    fn rdma_receives_ordered(&self) -> bool {
        self.driver
            .attribute(
                self.ordinal,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )
            .is_ok_and(|major| major >= 9)
    }

    fn alloc_shareable(&self, bytes: usize) -> Result<*mut u8> {
        let _current = self.enter()?;
        Self::exports(VMM_SYMBOLS)?;
        let size = self.granular(bytes)?;
        let prop = self.shareable_prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer and property block.
        call("cuMemCreate", unsafe {
            api::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let ptr = self.map(handle, size)?;
        // SAFETY: a fresh mapping of `size` bytes; zeroed and synchronized
        // before it can be exported, so a peer's writes come after.
        unsafe { self.driver.memset(ptr as u64, 0, size, self.own()) }.map_err(err)?;
        Ok(ptr)
    }

    fn export(&self, ptr: *mut u8) -> Result<(OwnedFd, usize)> {
        let _current = self.enter()?;
        let (handle, size) = self.shareable_at(ptr)?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: the handle is live (mapped); a POSIX handle is written
        // as one int.
        call("cuMemExportToShareableHandle", unsafe {
            api::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        // SAFETY: the driver made a new descriptor for this caller.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, size))
    }

    fn export_dmabuf(&self, ptr: *mut u8) -> Result<(OwnedFd, u64)> {
        let _current = self.enter()?;
        Self::exports(&["cuMemGetHandleForAddressRange"])?;
        let (_, size) = self.shareable_at(ptr)?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: the range is a live mapping of `size` bytes (a multiple
        // of the granularity, so of the page); a dma-buf handle is written
        // as one int.
        call("cuMemGetHandleForAddressRange", unsafe {
            api::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::ffi::c_int).cast(),
                ptr as u64,
                size,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        // SAFETY: the driver made a new descriptor for this caller.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, 0))
    }

    fn import(&self, handle: OwnedFd, bytes: usize) -> Result<*mut u8> {
        let _current = self.enter()?;
        Self::exports(VMM_SYMBOLS)?;
        let size = self.granular(bytes)?;
        let mut imported: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: a POSIX handle is passed as the descriptor's value in
        // the pointer; the driver holds its own reference to the memory,
        // so `handle` is closed when this returns.
        call("cuMemImportFromShareableHandle", unsafe {
            api::cuMemImportFromShareableHandle(
                &mut imported,
                handle.as_raw_fd() as isize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        self.map(imported, size)
    }

    fn stream(&self, raw: usize) -> Result<Arc<dyn Stream>> {
        Ok(Arc::new(CudaStream {
            raw,
            context: self.context,
        }))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        let _current = self.enter()?;
        let raw = self.driver.create_stream().map_err(err)?;
        self.stream(raw as usize)
    }

    fn destroy_stream(&self, raw: usize) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: the caller names a stream it created and uses no more.
        unsafe { self.driver.destroy_stream(raw as CUstream) }.map_err(err)
    }

    fn create_event(&self) -> Result<Arc<dyn Event>> {
        let _current = self.enter()?;
        let raw = self
            .driver
            .create_event(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(err)?;
        Ok(Arc::new(CudaEvent {
            raw: raw as usize,
            context: self.context,
        }))
    }

    /// The work runs on a thread of its own, never in a host function:
    /// CUDA may run the host functions of a context one at a time, so a
    /// task that waits for its peers there would hold up every other
    /// (two communicators in flight could wait on each other across
    /// processes). A host function only starts the thread; the stream
    /// waits (`cuStreamWaitValue32`) for a mapped word the thread sets
    /// when the work is done, and a second host function gives the word
    /// back. Neither host function blocks.
    fn enqueue_joint(&self, streams: &[Arc<dyn Stream>], work: Work) -> Result<()> {
        let _current = self.enter()?;
        let first = join(streams)?;
        if capture_graph(first)?.is_some() {
            // The task runs once: a replay would find it consumed.
            return Err(Error::InvalidArgument(
                "a call over host copies of device buffers (ranks of other processes with \
                 NCCL_P2P_DISABLE) cannot be captured in a CUDA graph"
                    .into(),
            ));
        }
        let flag = self.pinned(4)?;
        let word = flag.ptr as u64;
        // SAFETY: the word is spare pinned memory no stream uses now.
        unsafe { AtomicU32::from_ptr(flag.ptr.cast::<u32>()) }.store(0, Ordering::Release);
        let task = Box::into_raw(Box::new(JointTask {
            work: Some(work),
            flag: word as usize,
        }));
        // SAFETY: the function takes back the box it is given, once.
        let r = unsafe { api::cuLaunchHostFunc(first, Some(start_joint_task), task.cast()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the driver did not take the box; the task never runs
            // (dropping it only sets the word, which nothing waits for).
            drop(unsafe { Box::from_raw(task) });
            self.spare_pinned.lock().push(flag);
            return call("cuLaunchHostFunc", r);
        }
        let equal = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
        // SAFETY: mapped pinned memory (unified addressing: the device
        // sees it at the host's address), kept until the wait passed.
        call("cuStreamWaitValue32", unsafe {
            api::cuStreamWaitValue32_v2(first, word, 1, equal)
        })?;
        let spare = self.spare_pinned.clone();
        enqueue_host(first, Box::new(move || spare.lock().push(flag)))?;
        fork(first, streams)
    }

    fn launch_work(&self, streams: &[Arc<dyn Stream>], launch: WorkLaunch) -> Result<()> {
        let _current = self.enter()?;
        let kernels = &self.kernels;
        let first = join(streams)?;
        let graph = capture_graph(first)?;
        let WorkLaunch {
            rounds,
            timeout,
            done,
            stop,
        } = launch;
        // A timeout past the global timer's range is none.
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // The status words, then each round's table of grid blocks, then
        // each work block, each part at a 16-byte aligned offset.
        let channels: usize = rounds.iter().flatten().map(|w| w.nchannels()).sum();
        let words_bytes = (channels * 4).next_multiple_of(16);
        let tables_bytes: usize = rounds
            .iter()
            .map(|round| {
                let blocks: usize = round.iter().map(|w| w.nchannels()).sum();
                (blocks * size_of::<WorkBlock>()).next_multiple_of(16)
            })
            .sum();
        let total = words_bytes
            + tables_bytes
            + rounds
                .iter()
                .flatten()
                .map(|w| w.bytes().len().next_multiple_of(16))
                .sum::<usize>();
        let pinned = self.pinned(total)?;
        let id = match self.follow(stop, self.abort_words_of(&rounds)) {
            Ok(id) => id,
            Err(e) => {
                self.spare_pinned.lock().push(pinned);
                return Err(e);
            }
        };
        let mut state = LaunchState {
            pinned: Some(pinned),
            channels,
            channel_of: Vec::with_capacity(channels),
            timeout,
            done: Mutex::new(Some(done)),
            spare: self.spare_pinned.clone(),
            watch: (self.watched.clone(), id),
        };
        let base = state.pinned.as_ref().expect("just set").ptr;
        let mut table_at = words_bytes;
        let mut work_at = words_bytes + tables_bytes;
        let mut word = 0usize;
        // Per round: its table's address, its grid blocks, and what its
        // blocks need (threads, FIFO ends of shared memory).
        let mut launches = Vec::with_capacity(rounds.len());
        for (index, round) in rounds.iter().enumerate() {
            let table = table_at;
            let mut nblocks = 0usize;
            for (block, work) in round.iter().enumerate() {
                state
                    .channel_of
                    .extend((0..work.nchannels()).map(|c| (index, block, c)));
                let bytes = work.bytes();
                // SAFETY: the pinned memory holds `total` bytes, laid out
                // above; no kernel of this launch runs yet.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(work_at), bytes.len())
                };
                for channel in 0..work.nchannels() {
                    let entry = WorkBlock {
                        // SAFETY: within the pinned memory (mapped: the
                        // device sees it at the host's addresses).
                        work: unsafe { base.add(work_at) }.cast::<WorkHeader>(),
                        // SAFETY: as above, one of the `channels` words.
                        status: unsafe { base.add(4 * word) }.cast::<i32>(),
                        channel: channel as u32,
                        pad: 0,
                    };
                    // SAFETY: entry `nblocks` of the round's table, inside
                    // the memory and 8-byte aligned.
                    unsafe {
                        base.add(table_at)
                            .cast::<WorkBlock>()
                            .add(nblocks)
                            .write(entry)
                    };
                    nblocks += 1;
                    word += 1;
                }
                work_at += bytes.len().next_multiple_of(16);
            }
            table_at += (nblocks * size_of::<WorkBlock>()).next_multiple_of(16);
            let protocol = round.iter().find_map(|w| w.protocol());
            let peers = round
                .iter()
                .map(|w| w.max_channel_peers())
                .max()
                .unwrap_or(0);
            launches.push((table, nblocks, work_threads(protocol), peers));
        }
        let state = Arc::new(state);
        for &(table, nblocks, threads, peers) in &launches {
            // Every block of the round (each rank's channels) in one grid:
            // a block waits for its peers' blocks through their FIFOs, so
            // they must all be resident at once.
            // SAFETY: the table and the blocks lie in mapped pinned memory
            // the launch state keeps while the launch can run; the work's
            // addresses are device memory the engine keeps until `done` is
            // dropped; the status words are `channels` words of the same
            // memory.
            unsafe {
                kernels.run_work(
                    base.add(table) as u64,
                    nblocks as u32,
                    threads,
                    peers,
                    timeout_ns,
                    first,
                )
            }
            .map_err(err)?;
        }
        match graph {
            None => {
                let arg = Arc::into_raw(state.clone());
                // SAFETY: the function takes back the reference it is
                // given, once.
                let r = unsafe {
                    api::cuLaunchHostFunc(first, Some(launch_ran), arg.cast_mut().cast())
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    // SAFETY: the driver did not take the reference.
                    drop(unsafe { Arc::from_raw(arg) });
                }
                call("cuLaunchHostFunc", r)?;
                let watched = fault_event(first);
                match watched {
                    Ok(event) => self.faults.watch(self.context, event, &state),
                    // The context failed since the host function was
                    // enqueued, which may never run.
                    Err(e) => {
                        state.fail(e.clone());
                        return Err(e);
                    }
                }
            }
            Some(graph) => own_in_graph(graph, first, state)?,
        }
        fork(first, streams)
    }
}

/// An event recorded on `stream` now, for the fault watcher, which
/// destroys it. The stream's context is current.
fn fault_event(stream: CUstream) -> Result<CUevent> {
    let mut event = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    call("cuEventCreate", unsafe {
        api::cuEventCreate(
            &mut event,
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    })?;
    // SAFETY: a fresh event on a live stream.
    let recorded = call("cuEventRecord", unsafe {
        api::cuEventRecord(event, stream)
    });
    if recorded.is_err() {
        // SAFETY: the event, unrecorded, goes now.
        unsafe { api::cuEventDestroy_v2(event) };
    }
    recorded.map(|()| event)
}

/// The graph `stream` captures into, if it is capturing; an invalidated
/// capture is refused (the calls after its error fail). The stream's
/// context is current.
fn capture_graph(stream: CUstream) -> Result<Option<sys::CUgraph>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream, valid out-pointers; the optional ones unused.
    call("cuStreamGetCaptureInfo", unsafe {
        api::cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })?;
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(None),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(Some(graph)),
        _ => Err(Error::System(
            "the stream's CUDA graph capture was invalidated".into(),
        )),
    }
}

/// Makes the captured launch's state the graph's: a user object owns it,
/// kept by the graph and by every executable graph made from it until
/// they are gone, and a host node reports each replay with it. The
/// stream's context is current.
fn own_in_graph(graph: sys::CUgraph, first: CUstream, state: Arc<LaunchState>) -> Result<()> {
    let arg = Arc::into_raw(state).cast_mut().cast::<c_void>();
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    // SAFETY: the destructor takes back the reference it is given, once.
    let made =
        unsafe { api::cuUserObjectCreate(&mut object, arg, Some(launch_released), 1, flags) };
    if made != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the driver did not take the reference.
        drop(unsafe { Arc::from_raw(arg.cast_const().cast::<LaunchState>()) });
        return call("cuUserObjectCreate", made);
    }
    let moved = sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: a live graph under capture and the object just made, whose
    // one reference moves to the graph.
    let retained = unsafe { api::cuGraphRetainUserObject(graph, object, 1, moved) };
    if retained != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the caller's reference; the destructor frees the state.
        unsafe { api::cuUserObjectRelease(object, 1) };
        return call("cuGraphRetainUserObject", retained);
    }
    // SAFETY: the graph keeps `arg` alive for every run of this node.
    call("cuLaunchHostFunc", unsafe {
        api::cuLaunchHostFunc(first, Some(launch_replayed), arg)
    })
}

/// A stream: the caller's `cudaStream_t`, or one this backend created, of
/// the device's context.
pub struct CudaStream {
    raw: usize,
    context: usize,
}

impl CudaStream {
    fn enter(&self) -> Result<Current> {
        Current::enter(self.context as CUcontext)
    }
}

impl Stream for CudaStream {
    fn raw(&self) -> usize {
        self.raw
    }

    fn enqueue(&self, work: Work) -> Result<()> {
        let _current = self.enter()?;
        let stream = self.raw as CUstream;
        if capture_graph(stream)?.is_some() {
            // A replay would run the work again, after it was consumed.
            return Err(Error::InvalidArgument(
                "host work cannot be captured in a CUDA graph".into(),
            ));
        }
        enqueue_host(stream, work)
    }

    unsafe fn copy_async(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: the caller's contract.
        call("cuMemcpyAsync", unsafe {
            api::cuMemcpyAsync(dst as u64, src as u64, bytes, self.raw as CUstream)
        })
    }

    fn record(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        let _current = self.enter()?;
        // SAFETY: a live event and stream.
        call("cuEventRecord", unsafe {
            api::cuEventRecord(event, self.raw as CUstream)
        })
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        let _current = self.enter()?;
        let stream = self.raw as CUstream;
        // In a capture, the event (of work outside it) is waited for on
        // each launch of the graph.
        let flags = if capture_graph(stream)?.is_some() {
            sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32
        } else {
            0
        };
        // SAFETY: a live event and stream.
        call("cuStreamWaitEvent", unsafe {
            api::cuStreamWaitEvent(stream, event, flags)
        })
    }

    fn capturing(&self) -> Result<bool> {
        let _current = self.enter()?;
        capture_graph(self.raw as CUstream).map(|graph| graph.is_some())
    }

    fn synchronize(&self, deadline: Instant) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: a live stream.
        poll(deadline, || unsafe {
            api::cuStreamQuery(self.raw as CUstream)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Polls `query` until it stops answering "not ready" or `deadline`.
fn poll(deadline: Instant, query: impl Fn() -> sys::CUresult) -> Result<()> {
    loop {
        match query() {
            sys::CUresult::CUDA_ERROR_NOT_READY if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(50))
            }
            sys::CUresult::CUDA_ERROR_NOT_READY => {
                return Err(Error::System("waited past the deadline".into()))
            }
            other => return call("cuStreamQuery/cuEventQuery", other),
        }
    }
}

/// An event of the CUDA backend, of the device's context.
pub struct CudaEvent {
    raw: usize,
    context: usize,
}

fn own_event(event: &dyn Event) -> Result<CUevent> {
    event
        .as_any()
        .downcast_ref::<CudaEvent>()
        .map(|e| e.raw as CUevent)
        .ok_or_else(|| Error::InvalidArgument("not an event of the CUDA backend".into()))
}

impl Event for CudaEvent {
    fn query(&self) -> bool {
        // A failure to ask counts as done: `synchronize` reports it.
        let Ok(_current) = Current::enter(self.context as CUcontext) else {
            return true;
        };
        // SAFETY: a live event.
        let answer = unsafe { api::cuEventQuery(self.raw as CUevent) };
        answer != sys::CUresult::CUDA_ERROR_NOT_READY
    }

    fn synchronize(&self, deadline: Instant) -> Result<()> {
        let _current = Current::enter(self.context as CUcontext)?;
        // SAFETY: a live event.
        poll(deadline, || unsafe {
            api::cuEventQuery(self.raw as CUevent)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // A host function may not call CUDA: there the event is left to
        // the process (dropped there only when its last user was).
        if IN_HOST_FUNCTION.with(|f| f.get()) {
            return;
        }
        let _current = Current::enter(self.context as CUcontext);
        // SAFETY: the event is not used after this; CUDA releases it once
        // any pending record completes.
        unsafe { api::cuEventDestroy_v2(self.raw as CUevent) };
    }
}
