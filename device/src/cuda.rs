//! The CUDA backend: the driver API through cudarc's `sys` / `result`
//! layers, loaded at run time.
//!
//! cudarc panics when it cannot load the driver library, so [`Driver::get`]
//! first opens `libcuda.so.1` itself and answers [`CudaError::NoDriver`]
//! when that fails; every other entry hangs off the `Driver` it returns.
//! Work runs in the caller's current context (or the primary context of
//! device 0 when none is current), on streams the caller owns: a
//! `cudaStream_t` is a `CUstream`.

use std::ffi::{c_void, CStr, CString};
use std::sync::OnceLock;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use crate::abi::{LoopbackArgs, ReduceArgs};
use crate::KERNELS_FATBIN;

pub use cudarc::driver::sys::{CUdeviceptr, CUstream};

/// What a CUDA call can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The driver library is not there (a machine without an NVIDIA
    /// driver): nothing CUDA can run.
    #[error("no CUDA driver: libcuda.so.1 could not be loaded ({0}); device memory needs an NVIDIA driver")]
    NoDriver(String),
    /// A driver call failed.
    #[error("CUDA driver: {call} failed: {name} ({code}): {text}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
        /// The result's name (`CUDA_ERROR_...`).
        name: String,
        /// The driver's description.
        text: String,
    },
    /// A request the backend refuses before calling the driver.
    #[error("CUDA: {0}")]
    Invalid(String),
}

/// Result of the CUDA backend.
pub type Result<T> = std::result::Result<T, CudaError>;

fn driver_error(call: &'static str, e: DriverError) -> CudaError {
    let text = |r: std::result::Result<&CStr, DriverError>| {
        r.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    CudaError::Driver {
        call,
        code: e.0 as i32,
        name: text(e.error_name()),
        text: text(e.error_string()),
    }
}

trait Call<T> {
    fn call(self, name: &'static str) -> Result<T>;
}

impl<T> Call<T> for std::result::Result<T, DriverError> {
    fn call(self, name: &'static str) -> Result<T> {
        self.map_err(|e| driver_error(name, e))
    }
}

/// Where a pointer's memory lives, as the driver sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Memory the driver does not know (ordinary host memory).
    Host,
    /// Host memory the driver allocated or registered (pinned).
    PinnedHost,
    /// Device memory of the device with this ordinal.
    Device(i32),
    /// Managed (unified) memory.
    Managed,
}

/// The loaded driver, initialized. Obtained once per process.
#[derive(Debug)]
pub struct Driver {
    _private: (),
}

/// Opens the driver library the way the dynamic loader finds it; the
/// handle stays open for the life of the process (cudarc opens its own).
fn open_driver_library() -> Result<()> {
    // SAFETY: dlopen with a valid NUL-terminated name; loading the NVIDIA
    // driver library runs only its own initializers.
    let handle =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated string owned by
        // the loader, read at once.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown reason".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        return Err(CudaError::NoDriver(why));
    }
    Ok(())
}

impl Driver {
    /// The driver, loaded and initialized (`cuInit`) on first use; on a
    /// machine without one, [`CudaError::NoDriver`] every time.
    pub fn get() -> Result<&'static Driver> {
        static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
        DRIVER
            .get_or_init(|| {
                open_driver_library()?;
                result::init().call("cuInit")?;
                Ok(Driver { _private: () })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> Result<i32> {
        result::device::get_count().call("cuDeviceGetCount")
    }

    /// The device's name (`NVIDIA H200`).
    pub fn device_name(&self, ordinal: i32) -> Result<String> {
        let dev = result::device::get(ordinal).call("cuDeviceGet")?;
        result::device::get_name(dev).call("cuDeviceGetName")
    }

    /// One of the device's attributes (its compute capability's major
    /// version, whether it supports GPUDirect RDMA on cuMem memory).
    pub fn attribute(&self, ordinal: i32, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let dev = result::device::get(ordinal).call("cuDeviceGet")?;
        // SAFETY: `dev` is a valid device.
        unsafe { result::device::get_attribute(dev, attribute) }.call("cuDeviceGetAttribute")
    }

    /// The current context, after making device 0's primary context
    /// current when the thread has none (as the CUDA runtime does on first
    /// use); the ordinal of its device.
    pub fn current_device(&self) -> Result<i32> {
        if result::ctx::get_current()
            .call("cuCtxGetCurrent")?
            .is_none()
        {
            let dev = result::device::get(0).call("cuDeviceGet")?;
            // SAFETY: `dev` is a valid device; the retained context is
            // kept for the life of the process, as the runtime keeps it.
            unsafe {
                let ctx = result::primary_ctx::retain(dev).call("cuDevicePrimaryCtxRetain")?;
                result::ctx::set_current(ctx).call("cuCtxSetCurrent")?;
            }
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: a context is current; `dev` is a valid out-pointer.
        unsafe { sys::cuCtxGetDevice(&mut dev) }
            .result()
            .call("cuCtxGetDevice")?;
        Ok(dev)
    }

    /// Where `ptr` points: device memory (and which device), pinned or
    /// managed memory, or memory the driver does not know.
    pub fn classify(&self, ptr: *const c_void) -> Result<Memory> {
        let mut kind: u32 = 0;
        // SAFETY: the driver only reads its own tables for `ptr`; `kind`
        // is a valid out-pointer of the attribute's size.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut kind as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr as CUdeviceptr,
            )
        };
        match r {
            sys::CUresult::CUDA_SUCCESS => {}
            // Not a pointer the driver knows: host memory.
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Ok(Memory::Host),
            other => return Err(driver_error("cuPointerGetAttribute", DriverError(other))),
        }
        let mut managed: u32 = 0;
        // SAFETY: as above.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut managed as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                ptr as CUdeviceptr,
            )
        }
        .result()
        .call("cuPointerGetAttribute")?;
        if managed != 0 {
            return Ok(Memory::Managed);
        }
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Ok(Memory::PinnedHost);
        }
        let mut ordinal: i32 = 0;
        // SAFETY: as above.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr as CUdeviceptr,
            )
        }
        .result()
        .call("cuPointerGetAttribute")?;
        Ok(Memory::Device(ordinal))
    }

    /// `bytes` of device memory in the current context.
    pub fn alloc(&self, bytes: usize) -> Result<CUdeviceptr> {
        self.current_device()?;
        // SAFETY: a context is current; the memory is freed by `free`.
        unsafe { result::malloc_sync(bytes.max(1)) }.call("cuMemAlloc")
    }

    /// The allocation holding `ptr` as (start, bytes), as the driver
    /// reports it (`cuMemGetAddressRange`); `None` for memory it does not
    /// know.
    pub fn address_range(&self, ptr: CUdeviceptr) -> Option<(usize, usize)> {
        let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: the driver only reads its own tables for `ptr`; both
        // out-pointers are valid.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
            .result()
            .ok()
            .map(|()| (base as usize, size))
    }

    /// Frees memory from [`Driver::alloc`].
    ///
    /// # Safety
    /// `ptr` came from `alloc` and no work in flight uses it.
    pub unsafe fn free(&self, ptr: CUdeviceptr) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::free_sync(ptr) }.call("cuMemFree")
    }

    /// Host to device, synchronous.
    ///
    /// # Safety
    /// `dst` is device memory valid for `src.len()` bytes.
    pub unsafe fn copy_to_device(&self, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_htod_sync(dst, src) }.call("cuMemcpyHtoD")
    }

    /// Device to host, synchronous.
    ///
    /// # Safety
    /// `src` is device memory valid for `dst.len()` bytes.
    pub unsafe fn copy_to_host(&self, dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_dtoh_sync(dst, src) }.call("cuMemcpyDtoH")
    }

    /// Device to device, ordered on `stream`.
    ///
    /// # Safety
    /// Both ranges are device memory valid for `bytes` bytes until the
    /// copy completes; `stream` is a stream of the current context.
    pub unsafe fn copy_async(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, stream) }.call("cuMemcpyDtoDAsync")
    }

    /// Sets `bytes` bytes of device memory to `value`.
    ///
    /// # Safety
    /// `dst` is device memory valid for `bytes` bytes.
    pub unsafe fn memset(&self, dst: CUdeviceptr, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::memset_d8_sync(dst, value, bytes) }.call("cuMemsetD8")
    }

    /// A new non-blocking stream of the current context.
    pub fn create_stream(&self) -> Result<CUstream> {
        self.current_device()?;
        result::stream::create(result::stream::StreamKind::NonBlocking).call("cuStreamCreate")
    }

    /// Waits for all work on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream (or null, the legacy default stream).
    pub unsafe fn synchronize(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::stream::synchronize(stream) }.call("cuStreamSynchronize")
    }

    /// Destroys a stream from [`Driver::create_stream`].
    ///
    /// # Safety
    /// `stream` came from `create_stream` and is not used afterwards.
    pub unsafe fn destroy_stream(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { result::stream::destroy(stream) }.call("cuStreamDestroy")
    }

    /// Milliseconds `work` takes on `stream`, between two events.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context.
    pub unsafe fn time_ms(
        &self,
        stream: CUstream,
        work: impl FnOnce() -> Result<()>,
    ) -> Result<f32> {
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = result::event::create(flags).call("cuEventCreate")?;
        let end = result::event::create(flags).call("cuEventCreate")?;
        // SAFETY: both events are live until destroyed below; the stream
        // is the caller's.
        let timed = unsafe {
            (|| {
                result::event::record(start, stream).call("cuEventRecord")?;
                work()?;
                result::event::record(end, stream).call("cuEventRecord")?;
                result::event::synchronize(end).call("cuEventSynchronize")?;
                result::event::elapsed(start, end).call("cuEventElapsedTime")
            })()
        };
        // SAFETY: the events are not used after this.
        unsafe {
            result::event::destroy(start).call("cuEventDestroy")?;
            result::event::destroy(end).call("cuEventDestroy")?;
        }
        timed
    }

    /// Loads the kernels' fatbin into the current context.
    pub fn load_kernels(&self) -> Result<Kernels> {
        let device = self.current_device()?;
        // The driver wants the image 8-byte aligned; `include_bytes!` only
        // promises 1.
        let mut image = vec![0u64; KERNELS_FATBIN.len().div_ceil(8)];
        // SAFETY: `image` holds at least the fatbin's bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                KERNELS_FATBIN.as_ptr(),
                image.as_mut_ptr().cast::<u8>(),
                KERNELS_FATBIN.len(),
            )
        };
        // SAFETY: `image` is a complete fatbin; the module stays loaded for
        // the life of the `Kernels`.
        let module =
            unsafe { result::module::load_data(image.as_ptr().cast()) }.call("cuModuleLoadData")?;
        let function = |name: &str| -> Result<sys::CUfunction> {
            let name = CString::new(name).map_err(|e| CudaError::Invalid(e.to_string()))?;
            // SAFETY: `module` is loaded.
            unsafe { result::module::get_function(module, name) }.call("cuModuleGetFunction")
        };
        let mut reduce = Vec::with_capacity(REDUCE_KERNELS.len());
        for name in REDUCE_KERNELS {
            reduce.push(function(name)?);
        }
        let copy = function("rccl_copy")?;
        let fifo_loopback = function("rccl_fifo_loopback")?;
        let run_work = function("rccl_run_work")?;
        let dev = result::device::get(device).call("cuDeviceGet")?;
        // SAFETY: `dev` is a valid device.
        let sms = unsafe {
            result::device::get_attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
        }
        .call("cuDeviceGetAttribute")?;
        // SAFETY: `copy` is a kernel of the loaded module.
        let per_sm = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(copy, THREADS as i32, 0)
        }
        .call("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok(Kernels {
            module,
            reduce,
            copy,
            fifo_loopback,
            run_work,
            max_blocks: (sms.max(1) * per_sm.max(1)) as u32,
        })
    }
}

/// The reduction kernels, indexed by `ncclDataType_t`.
const REDUCE_KERNELS: [&str; 12] = [
    "rccl_reduce_int8",
    "rccl_reduce_uint8",
    "rccl_reduce_int32",
    "rccl_reduce_uint32",
    "rccl_reduce_int64",
    "rccl_reduce_uint64",
    "rccl_reduce_float16",
    "rccl_reduce_float32",
    "rccl_reduce_float64",
    "rccl_reduce_bfloat16",
    "rccl_reduce_float8e4m3",
    "rccl_reduce_float8e5m2",
];

/// Threads per block of the element-wise kernels (their launch bound).
const THREADS: u32 = 512;

/// The kernels of the fatbin, loaded in one context.
#[derive(Debug)]
pub struct Kernels {
    module: sys::CUmodule,
    reduce: Vec<sys::CUfunction>,
    copy: sys::CUfunction,
    fifo_loopback: sys::CUfunction,
    run_work: sys::CUfunction,
    /// Blocks that fill the device once.
    max_blocks: u32,
}

// SAFETY: module and function handles are plain driver handles, usable
// from any thread of the process.
unsafe impl Send for Kernels {}
// SAFETY: as above; launching takes no mutable state of `Kernels`.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Blocks for `bytes` of element-wise work: 4 packs of 16 bytes per
    /// thread per round, at most enough blocks to fill the device once.
    fn blocks_for(&self, bytes: u64) -> u32 {
        let per_block = u64::from(THREADS) * 16 * 4;
        (bytes.div_ceil(per_block).max(1)).min(u64::from(self.max_blocks)) as u32
    }

    /// Launches the reduction `args` describes on `stream`.
    ///
    /// # Safety
    /// The pointers of `args` are device memory (or memory the device can
    /// reach) valid for `count` elements until the kernel completes, each
    /// pair identical or disjoint; `stream` is a stream of the context the
    /// kernels were loaded in.
    pub unsafe fn reduce(&self, args: &ReduceArgs, stream: CUstream) -> Result<()> {
        let dtype = usize::try_from(args.dtype)
            .ok()
            .filter(|&d| d < self.reduce.len())
            .ok_or_else(|| CudaError::Invalid(format!("unknown datatype {}", args.dtype)))?;
        if args.count == 0 {
            return Ok(());
        }
        let size = [1u64, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1][dtype];
        let mut by_value = *args;
        let mut params = [(&mut by_value as *mut ReduceArgs).cast::<c_void>()];
        let blocks = self.blocks_for(args.count * size);
        // SAFETY: the kernel takes one `ReduceArgs` by value, which
        // `params` points at; the caller's contract covers the memory.
        unsafe {
            result::launch_kernel(
                self.reduce[dtype],
                (blocks, 1, 1),
                (THREADS, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .call("cuLaunchKernel")
    }

    /// Launches a copy of `bytes` bytes on `stream`.
    ///
    /// # Safety
    /// As [`Kernels::reduce`], for the two ranges.
    pub unsafe fn copy(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: u64,
        stream: CUstream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let (mut d, mut s, mut n) = (dst, src, bytes);
        let mut params = [
            (&mut d as *mut CUdeviceptr).cast::<c_void>(),
            (&mut s as *mut CUdeviceptr).cast::<c_void>(),
            (&mut n as *mut u64).cast::<c_void>(),
        ];
        let blocks = self.blocks_for(bytes);
        // SAFETY: the kernel's parameters are (pointer, pointer, u64), as
        // `params` holds; the caller's contract covers the memory.
        unsafe {
            result::launch_kernel(
                self.copy,
                (blocks, 1, 1),
                (THREADS, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .call("cuLaunchKernel")
    }

    /// Launches the FIFO loopback kernel: two blocks of one warp, one
    /// sending and one receiving.
    ///
    /// # Safety
    /// `args.fifo` describes zeroed device memory for its slots; `src`,
    /// `dst` and `status` are device memory of the sizes given.
    pub unsafe fn fifo_loopback(&self, args: &LoopbackArgs, stream: CUstream) -> Result<()> {
        let mut by_value = *args;
        let mut params = [(&mut by_value as *mut LoopbackArgs).cast::<c_void>()];
        // SAFETY: the kernel takes one `LoopbackArgs` by value; two blocks
        // of one warp each always fit on the device together.
        unsafe {
            result::launch_kernel(
                self.fifo_loopback,
                (2, 1, 1),
                (32, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .call("cuLaunchKernel")
    }
}

impl Kernels {
    /// Launches device work: one block per channel, whose first warp runs
    /// the channel; `status` (one `i32` per channel) gets each channel's
    /// end (0 done, 1 aborted, 2 still waiting `timeout_ns` after it
    /// started, by the GPU's global timer, 3 a step too large).
    ///
    /// # Safety
    /// `work` is device memory holding an encoded [`crate::work::Work`]
    /// of `nchannels` channels whose addresses the device can reach;
    /// `status` holds `nchannels` words.
    pub unsafe fn run_work(
        &self,
        work: CUdeviceptr,
        nchannels: u32,
        timeout_ns: u64,
        status: CUdeviceptr,
        stream: CUstream,
    ) -> Result<()> {
        let (mut w, mut t, mut st) = (work, timeout_ns, status);
        let mut params = [
            (&mut w as *mut CUdeviceptr).cast::<c_void>(),
            (&mut t as *mut u64).cast::<c_void>(),
            (&mut st as *mut CUdeviceptr).cast::<c_void>(),
        ];
        // SAFETY: the parameters match the kernel's (pointer, u64,
        // pointer); the caller's contract covers the memory.
        unsafe {
            result::launch_kernel(
                self.run_work,
                (nchannels.max(1), 1, 1),
                (32, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .call("cuLaunchKernel")
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `load_kernels` and its functions
        // die with `self`. An error here (a context already destroyed)
        // leaves nothing to clean.
        let _ = unsafe { result::module::unload(self.module) };
    }
}
