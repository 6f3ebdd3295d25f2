//! The CUDA backend as a [`Device`]: memory, streams and events of the
//! caller's current context (device 0's primary context when none is),
//! host work through `cuLaunchHostFunc`, and device work launched as the
//! fatbin's interpreter kernel.
//!
//! NOT YET RUN ON HARDWARE: everything in this file compiles against
//! cudarc's driver bindings but has not run on a GPU (the machines this
//! is developed on have none). `scripts/gpu-check.sh` exercises it
//! through the perf binaries on `--memory device`.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUevent, CUstream};
use parking_lot::Mutex;

use crate::cuda::{CudaError, Driver, Kernels, Memory as CudaMemory};
use crate::{Device, Error, Event, Memory, Result, Stream, Work, WorkFailure, WorkLaunch};

const BACKEND: &str = "cuda";

fn err(e: CudaError) -> Error {
    match e {
        CudaError::Invalid(why) => Error::InvalidArgument(why),
        other => Error::System(other.to_string()),
    }
}

fn call(name: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| {
        Error::System(format!(
            "CUDA driver: {name} failed: {}",
            e.error_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        ))
    })
}

/// Pinned host words the interpreter kernel writes each channel's end
/// into (mapped into the device's address space), reused between
/// launches: a host function may not free them (it may not call CUDA).
struct Status {
    words: *mut i32,
    len: usize,
}

// SAFETY: pinned host memory, written by the kernel and read by one host
// function after it; handed between threads whole.
unsafe impl Send for Status {}

/// A CUDA device: the context current when it was opened.
pub struct CudaDevice {
    driver: &'static Driver,
    ordinal: i32,
    name: String,
    kernels: OnceLock<std::result::Result<Kernels, CudaError>>,
    /// Idle streams of this backend's own. A launch takes one per block
    /// of its largest round (blocks of ranks that share the caller's
    /// stream must run at once) and gives them back from its last host
    /// function, so no two launches in flight share one.
    helpers: Arc<Mutex<Vec<usize>>>,
    spare_status: Arc<Mutex<Vec<Status>>>,
    /// Memory freed from a host function, which may not call CUDA: freed
    /// at the next allocation (device memory, and page-locked host
    /// memory).
    deferred: Mutex<Vec<u64>>,
    deferred_host: Mutex<Vec<usize>>,
    /// cuMem mappings (shareable allocations and imports), by address:
    /// their allocation handle and mapped size.
    mapped: Mutex<HashMap<u64, (sys::CUmemGenericAllocationHandle, usize)>>,
}

thread_local! {
    /// Whether this thread is running a host function (`cuLaunchHostFunc`).
    static IN_HOST_FUNCTION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl CudaDevice {
    /// Opens the current device when a driver loads and a device exists.
    pub fn open() -> std::result::Result<CudaDevice, CudaError> {
        let driver = Driver::get()?;
        if driver.device_count()? == 0 {
            return Err(CudaError::Invalid("the CUDA driver sees no device".into()));
        }
        let ordinal = driver.current_device()?;
        Ok(CudaDevice {
            driver,
            ordinal,
            name: driver.device_name(ordinal)?,
            kernels: OnceLock::new(),
            helpers: Arc::default(),
            spare_status: Arc::default(),
            deferred: Mutex::default(),
            deferred_host: Mutex::default(),
            mapped: Mutex::default(),
        })
    }

    fn kernels(&self) -> Result<&Kernels> {
        self.kernels
            .get_or_init(|| self.driver.load_kernels())
            .as_ref()
            .map_err(|e| err(e.clone()))
    }

    /// Makes this device's context current on the calling thread.
    fn enter(&self) -> Result<()> {
        self.driver.current_device().map(|_| ()).map_err(err)
    }

    /// `count` helper streams, taken from the idle ones or created.
    fn take_helpers(&self, count: usize) -> Result<Vec<usize>> {
        let mut taken = Vec::with_capacity(count);
        {
            let mut idle = self.helpers.lock();
            while taken.len() < count {
                match idle.pop() {
                    Some(s) => taken.push(s),
                    None => break,
                }
            }
        }
        while taken.len() < count {
            match self.driver.create_stream() {
                Ok(s) => taken.push(s as usize),
                Err(e) => {
                    self.helpers.lock().extend(taken);
                    return Err(err(e));
                }
            }
        }
        Ok(taken)
    }

    fn status(&self, len: usize) -> Result<Status> {
        let mut spare = self.spare_status.lock();
        if let Some(at) = spare.iter().position(|s| s.len >= len) {
            return Ok(spare.swap_remove(at));
        }
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a fresh pinned allocation of `len` words.
        let words = unsafe { result::malloc_host(len.max(1) * 4, flags) }
            .map_err(|e| Error::System(format!("cuMemHostAlloc: {e:?}")))?;
        Ok(Status {
            words: words.cast(),
            len,
        })
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

    /// Whether the loaded driver exports `symbols`: cudarc panics on the
    /// first call of a missing one, where a driver without them (or a
    /// partial stand-in for one) should get a typed error.
    fn exports(symbols: &[&str]) -> Result<()> {
        for name in symbols {
            // SAFETY: looks a symbol up in the driver cudarc loaded (it is
            // loaded: this device was opened through it); nothing is called.
            let found = unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) };
            if found.is_err() {
                return Err(Error::System(format!(
                    "CUDA driver: {name} is missing, so memory cannot be shared \
                     between processes (cuMem virtual memory management)"
                )));
            }
        }
        Ok(())
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
            sys::cuMemGetAllocationGranularity(
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
                sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0),
            )
            .and_then(|()| call("cuMemMap", sys::cuMemMap(ptr, size, 0, handle, 0)))
            .and_then(|()| call("cuMemSetAccess", sys::cuMemSetAccess(ptr, size, &access, 1)))
        };
        if let Err(e) = mapped {
            // SAFETY: undoes what succeeded above; failures of the undo
            // add nothing to the error.
            unsafe {
                if ptr != 0 {
                    let _ = sys::cuMemUnmap(ptr, size);
                    let _ = sys::cuMemAddressFree(ptr, size);
                }
                let _ = sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.mapped.lock().insert(ptr, (handle, size));
        Ok(ptr as *mut u8)
    }

    /// Frees what host functions freed since the last allocation.
    fn free_deferred(&self) -> Result<()> {
        for ptr in std::mem::take(&mut *self.deferred.lock()) {
            // SAFETY: freed by its last user, deferred out of a host
            // function; nothing enqueued since uses it.
            unsafe { self.release(ptr) }?;
        }
        for ptr in std::mem::take(&mut *self.deferred_host.lock()) {
            // SAFETY: as above, page-locked memory from alloc_host.
            unsafe { self.release_host(ptr as *mut u8) }?;
        }
        Ok(())
    }

    /// `cuMemFreeHost`s `ptr`.
    ///
    /// # Safety
    /// As [`Device::free_host`].
    unsafe fn release_host(&self, ptr: *mut u8) -> Result<()> {
        self.enter()?;
        // SAFETY: the caller's contract.
        call("cuMemFreeHost", unsafe { sys::cuMemFreeHost(ptr.cast()) })
    }

    /// Frees `ptr`: a cuMem mapping is unmapped and its handle released,
    /// anything else is `cuMemFree`d.
    ///
    /// # Safety
    /// As [`Device::free`].
    unsafe fn release(&self, ptr: u64) -> Result<()> {
        let Some((handle, size)) = self.mapped.lock().remove(&ptr) else {
            // SAFETY: the caller's contract.
            return unsafe { self.driver.free(ptr) }.map_err(err);
        };
        // SAFETY: the mapping made by `map`, unused (the caller's
        // contract); the physical memory goes once every process that
        // mapped it has released it.
        unsafe {
            call("cuMemUnmap", sys::cuMemUnmap(ptr, size))?;
            call("cuMemAddressFree", sys::cuMemAddressFree(ptr, size))?;
            call("cuMemRelease", sys::cuMemRelease(handle))
        }
    }
}

/// `later` waits for everything enqueued on `earlier` so far.
fn order(earlier: CUstream, later: CUstream) -> Result<()> {
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
    let event = result::event::create(flags).map_err(|e| Error::System(format!("{e:?}")))?;
    // SAFETY: live streams of the current context and a fresh event,
    // destroyed once both calls are enqueued (CUDA releases it when done).
    unsafe {
        let ordered = call("cuEventRecord", sys::cuEventRecord(event, earlier))
            .and_then(|()| call("cuStreamWaitEvent", sys::cuStreamWaitEvent(later, event, 0)));
        sys::cuEventDestroy_v2(event);
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

/// Runs `work` on the host in `stream`'s order (`cuLaunchHostFunc`).
fn enqueue_host(stream: CUstream, work: Work) -> Result<()> {
    let arg = Box::into_raw(Box::new(work));
    // SAFETY: the function takes back the box it is given, once.
    let r = unsafe { sys::cuLaunchHostFunc(stream, Some(run_host_work), arg.cast()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the driver did not take the box.
        drop(unsafe { Box::from_raw(arg) });
    }
    call("cuLaunchHostFunc", r)
}

impl Device for CudaDevice {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn label(&self) -> String {
        format!("[cuda {}] {}", self.ordinal, self.name)
    }

    fn classify(&self, ptr: *const u8) -> Memory {
        match self.driver.classify(ptr.cast()) {
            Ok(CudaMemory::Device(index)) => Memory::Device {
                backend: BACKEND,
                index: index as u32,
            },
            Ok(CudaMemory::Managed) => Memory::Device {
                backend: BACKEND,
                index: self.ordinal as u32,
            },
            _ => Memory::Host,
        }
    }

    fn allocation(&self, ptr: *const u8) -> Option<(usize, usize)> {
        self.driver.address_range(ptr as sys::CUdeviceptr)
    }

    fn alloc(&self, bytes: usize) -> Result<*mut u8> {
        self.free_deferred()?;
        Ok(self.driver.alloc(bytes).map_err(err)? as *mut u8)
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<*mut u8> {
        let ptr = self.alloc(bytes)?;
        // SAFETY: a fresh allocation of `bytes`.
        unsafe { self.driver.memset(ptr as u64, 0, bytes) }.map_err(err)?;
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: *mut u8) -> Result<()> {
        if IN_HOST_FUNCTION.with(|f| f.get()) {
            self.deferred.lock().push(ptr as u64);
            return Ok(());
        }
        self.enter()?;
        // SAFETY: the caller's contract.
        unsafe { self.release(ptr as u64) }
    }

    fn alloc_host(&self, bytes: usize) -> Result<*mut u8> {
        self.free_deferred()?;
        self.enter()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the current context is this
        // device's.
        call("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut ptr, bytes.max(1), 0)
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
        self.enter()?;
        // SAFETY: the caller's contract; unified addressing names both.
        call("cuMemcpy", unsafe {
            sys::cuMemcpy(dst as u64, src as u64, bytes)
        })
    }

    fn shares_memory(&self) -> bool {
        true
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
        self.enter()?;
        Self::exports(VMM_SYMBOLS)?;
        let size = self.granular(bytes)?;
        let prop = self.shareable_prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer and property block.
        call("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let ptr = self.map(handle, size)?;
        // SAFETY: a fresh mapping of `size` bytes.
        unsafe { self.driver.memset(ptr as u64, 0, size) }.map_err(err)?;
        Ok(ptr)
    }

    fn export(&self, ptr: *mut u8) -> Result<(OwnedFd, usize)> {
        let (handle, size) = self.shareable_at(ptr)?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: the handle is live (mapped); a POSIX handle is written
        // as one int.
        call("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(
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
        self.enter()?;
        Self::exports(&["cuMemGetHandleForAddressRange"])?;
        let (_, size) = self.shareable_at(ptr)?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: the range is a live mapping of `size` bytes (a multiple
        // of the granularity, so of the page); a dma-buf handle is written
        // as one int.
        call("cuMemGetHandleForAddressRange", unsafe {
            sys::cuMemGetHandleForAddressRange(
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
        self.enter()?;
        Self::exports(VMM_SYMBOLS)?;
        let size = self.granular(bytes)?;
        let mut imported: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: a POSIX handle is passed as the descriptor's value in
        // the pointer; the driver holds its own reference to the memory,
        // so `handle` is closed when this returns.
        call("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut imported,
                handle.as_raw_fd() as isize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        self.map(imported, size)
    }

    fn stream(&self, raw: usize) -> Result<Arc<dyn Stream>> {
        Ok(Arc::new(CudaStream { raw }))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        let raw = self.driver.create_stream().map_err(err)?;
        Ok(Arc::new(CudaStream { raw: raw as usize }))
    }

    fn destroy_stream(&self, raw: usize) -> Result<()> {
        // SAFETY: the caller names a stream it created and uses no more.
        unsafe { self.driver.destroy_stream(raw as CUstream) }.map_err(err)
    }

    fn create_event(&self) -> Result<Arc<dyn Event>> {
        self.enter()?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let raw = result::event::create(flags).map_err(|e| Error::System(format!("{e:?}")))?;
        Ok(Arc::new(CudaEvent { raw: raw as usize }))
    }

    fn enqueue_joint(&self, streams: &[Arc<dyn Stream>], work: Work) -> Result<()> {
        self.enter()?;
        let first = join(streams)?;
        enqueue_host(first, work)?;
        fork(first, streams)
    }

    fn launch_work(&self, streams: &[Arc<dyn Stream>], launch: WorkLaunch) -> Result<()> {
        self.enter()?;
        let kernels = self.kernels()?;
        let first = join(streams)?;
        let WorkLaunch {
            rounds,
            timeout,
            done,
            // The host cannot stop a running kernel yet: it gives up after
            // `spins` idle polls instead.
            stop: _,
        } = launch;
        // __nanosleep(64) per idle poll: about the launch's timeout.
        let spins = (timeout.as_nanos() / 64) as u64;
        let blocks: Vec<&Arc<crate::work::Work>> = rounds.iter().flatten().collect();
        let total: usize = blocks.iter().map(|w| w.bytes().len()).sum();
        let channels: usize = blocks.iter().map(|w| w.nchannels()).sum();
        let status = self.status(channels)?;
        // SAFETY: stream-ordered allocation on `first`, freed on it below
        // after every kernel that reads it.
        let mem = unsafe { result::malloc_async(first, total.max(8)) }
            .map_err(|e| Error::System(format!("cuMemAllocAsync: {e:?}")))?;
        let mut at = 0u64;
        let mut word = 0usize;
        // (round, block, channel) of each status word.
        let mut channel_of: Vec<(usize, usize, usize)> = Vec::with_capacity(channels);
        // A round of one block runs on `first` itself.
        let widest = rounds.iter().map(Vec::len).max().unwrap_or(0);
        let helpers = self.take_helpers(if widest > 1 { widest } else { 0 })?;
        for (index, round) in rounds.iter().enumerate() {
            // Every block of the round is copied first, then the kernels
            // start together on the helpers (a block waits for its peers'
            // blocks through their FIFOs), then `first` waits for them all.
            let mut placed = Vec::with_capacity(round.len());
            for (block, work) in round.iter().enumerate() {
                channel_of.extend((0..work.nchannels()).map(|c| (index, block, c)));
                let bytes = work.bytes();
                // SAFETY: `mem + at` holds `bytes.len()` bytes; the source
                // is pageable, so the driver stages it before returning.
                unsafe { result::memcpy_htod_async(mem + at, bytes, first) }
                    .map_err(|e| Error::System(format!("cuMemcpyHtoDAsync: {e:?}")))?;
                placed.push((mem + at, work.nchannels(), word));
                at += bytes.len() as u64;
                word += work.nchannels();
            }
            let lanes: Vec<CUstream> = if round.len() == 1 {
                vec![first]
            } else {
                helpers.iter().map(|&s| s as CUstream).collect()
            };
            for (&(block, nchannels, word), &helper) in placed.iter().zip(&lanes) {
                if helper != first {
                    order(first, helper)?;
                }
                // SAFETY: the block was copied to `block` before the kernel
                // (ordered above); its addresses are device memory the
                // engine keeps until `done`; the status words are mapped
                // pinned memory of `channels` words.
                unsafe {
                    kernels.run_work(
                        block,
                        nchannels as u32,
                        spins,
                        status.words.add(word) as u64,
                        helper,
                    )
                }
                .map_err(err)?;
            }
            for &helper in lanes.iter().filter(|&&s| s != first) {
                order(helper, first)?;
            }
        }
        // SAFETY: every kernel reading `mem` is ordered before this on
        // `first`.
        unsafe { result::free_async(mem, first) }
            .map_err(|e| Error::System(format!("cuMemFreeAsync: {e:?}")))?;
        let spare = self.spare_status.clone();
        let idle = self.helpers.clone();
        enqueue_host(
            first,
            Box::new(move || {
                // SAFETY: every kernel wrote its words before this host
                // function runs (stream order); `channels` words exist.
                let ends = unsafe { std::slice::from_raw_parts(status.words, channels) };
                let result = match ends.iter().position(|&e| e != 0) {
                    None => Ok(()),
                    Some(c) => Err(WorkFailure {
                        error: Error::System(format!(
                            "device work did not finish: channel {c} of the launch ended with \
                             {} (1 aborted, 2 gave up after {timeout:?} without progress, 3 a \
                             step too large)",
                            ends[c]
                        )),
                        timed_out: ends.contains(&2),
                        unfinished: ends
                            .iter()
                            .zip(&channel_of)
                            .filter(|(&end, _)| end != 0)
                            .map(|(_, &at)| at)
                            .collect(),
                    }),
                };
                spare.lock().push(status);
                idle.lock().extend(helpers);
                done(result);
            }),
        )?;
        fork(first, streams)
    }
}

/// A stream: the caller's `cudaStream_t`, or one this backend created.
pub struct CudaStream {
    raw: usize,
}

impl Stream for CudaStream {
    fn raw(&self) -> usize {
        self.raw
    }

    fn enqueue(&self, work: Work) -> Result<()> {
        enqueue_host(self.raw as CUstream, work)
    }

    unsafe fn copy_async(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        call("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(dst as u64, src as u64, bytes, self.raw as CUstream)
        })
    }

    fn record(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        // SAFETY: a live event and stream.
        call("cuEventRecord", unsafe {
            sys::cuEventRecord(event, self.raw as CUstream)
        })
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        // SAFETY: a live event and stream.
        call("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw as CUstream, event, 0)
        })
    }

    fn synchronize(&self, deadline: Instant) -> Result<()> {
        // SAFETY: a live stream.
        poll(deadline, || unsafe {
            sys::cuStreamQuery(self.raw as CUstream)
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

/// An event of the CUDA backend.
pub struct CudaEvent {
    raw: usize,
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
        // SAFETY: a live event.
        let answer = unsafe { sys::cuEventQuery(self.raw as CUevent) };
        answer != sys::CUresult::CUDA_ERROR_NOT_READY
    }

    fn synchronize(&self, deadline: Instant) -> Result<()> {
        // SAFETY: a live event.
        poll(deadline, || unsafe {
            sys::cuEventQuery(self.raw as CUevent)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: the event is not used after this; CUDA releases it once
        // any pending record completes.
        unsafe { sys::cuEventDestroy_v2(self.raw as CUevent) };
    }
}
