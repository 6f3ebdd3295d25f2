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

mod launch;
mod stream;
mod watch;

use launch::{capture_graph, LaunchState};
use stream::{enqueue_host, fork, join, start_joint_task, JointTask};
use watch::{add_abort_words, unwatch, watch, AbortWords, Faults, WatchList, Watched};

pub use stream::{CudaEvent, CudaStream};

const BACKEND: &str = "cuda";

fn err(e: CudaError) -> Error {
    match e {
        CudaError::Invalid(why) => Error::InvalidArgument(why),
        e @ CudaError::NotResident { .. } => Error::InvalidUsage(e.to_string()),
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
        self.launch_rounds(streams, launch)
    }
}
