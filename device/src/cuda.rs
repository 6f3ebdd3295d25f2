//! The CUDA backend's driver calls: the driver API of `libcuda.so.1`,
//! opened at run time by this crate alone (`cuda_api.rs`; cudarc supplies
//! only `cuda.h`'s types and constants), so the process loads one driver
//! library and, without one, [`Driver::get`] answers
//! [`CudaError::NoDriver`]. Every other entry hangs off the `Driver` it
//! returns and runs in the calling thread's current context.

use std::collections::hash_map::{Entry, HashMap};
use std::ffi::{c_void, CStr, CString};
use std::sync::OnceLock;

use cudarc::driver::sys;
use parking_lot::Mutex;

use rccl_algorithms::Protocol;

use crate::abi::{LoopbackArgs, ReduceArgs};
use crate::cuda_api as api;
use crate::work::{WorkBlock, PEER_ENDS_BYTES, WORK_LOCAL_BYTES};
use crate::KERNELS_FATBIN;

pub use crate::cuda_api::ENTRY_POINTS;
pub use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUstream};

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
    /// A grid whose blocks wait for each other cannot be resident on the
    /// device all at once, so launched it would wait forever.
    #[error(
        "CUDA device {device}: a launch of {kernel} needs all its {blocks} blocks resident at \
         once (a block per channel of each rank of this process on the device; {threads} \
         threads and {shared_bytes} bytes of dynamic shared memory each), but {per_sm} fit per \
         SM x {sms} SMs = {}: use fewer channels (NCCL_MAX_NCHANNELS, or the communicator \
         config's maxCTAs) or fewer ranks of this process on the GPU",
        per_sm * sms
    )]
    NotResident {
        /// The device's ordinal and name.
        device: String,
        kernel: &'static str,
        blocks: u32,
        threads: u32,
        shared_bytes: u32,
        /// Blocks of this size one SM holds (the driver's occupancy).
        per_sm: u32,
        sms: u32,
    },
}

/// Result of the CUDA backend.
pub type Result<T> = std::result::Result<T, CudaError>;

/// `r` of the driver function `call` as a result, its error named and
/// described by the driver.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let text =
        |describe: unsafe fn(sys::CUresult, *mut *const std::ffi::c_char) -> sys::CUresult| {
            let mut text = std::ptr::null();
            // SAFETY: a valid out-pointer; the driver answers a static string.
            match unsafe { describe(r, &mut text) } {
                sys::CUresult::CUDA_SUCCESS if !text.is_null() => {
                    // SAFETY: NUL-terminated, owned by the driver.
                    unsafe { CStr::from_ptr(text) }
                        .to_string_lossy()
                        .into_owned()
                }
                _ => String::new(),
            }
        };
    Err(CudaError::Driver {
        call,
        code: r as i32,
        name: text(api::cuGetErrorName),
        text: text(api::cuGetErrorString),
    })
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

impl Driver {
    /// The driver, loaded and initialized (`cuInit`) on first use; on a
    /// machine without one, [`CudaError::NoDriver`] every time.
    pub fn get() -> Result<&'static Driver> {
        static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
        DRIVER
            .get_or_init(|| {
                api::open().map_err(CudaError::NoDriver)?;
                // SAFETY: no arguments beyond the flags, which must be 0.
                check("cuInit", unsafe { api::cuInit(0) })?;
                Ok(Driver { _private: () })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> Result<i32> {
        let mut count = 0;
        // SAFETY: a valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            api::cuDeviceGetCount(&mut count)
        })?;
        Ok(count)
    }

    fn device(&self, ordinal: i32) -> Result<sys::CUdevice> {
        let mut dev = 0;
        // SAFETY: a valid out-pointer.
        check("cuDeviceGet", unsafe {
            api::cuDeviceGet(&mut dev, ordinal)
        })?;
        Ok(dev)
    }

    /// The device's name (`NVIDIA H200`).
    pub fn device_name(&self, ordinal: i32) -> Result<String> {
        let dev = self.device(ordinal)?;
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer holds `name.len()` bytes.
        check("cuDeviceGetName", unsafe {
            api::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
        })?;
        // SAFETY: the driver wrote a NUL-terminated name into the buffer.
        Ok(unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// One of the device's attributes (its compute capability's major
    /// version, whether it supports GPUDirect RDMA on cuMem memory).
    pub fn attribute(&self, ordinal: i32, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let dev = self.device(ordinal)?;
        let mut value = 0;
        // SAFETY: `dev` is a valid device, `value` a valid out-pointer.
        check("cuDeviceGetAttribute", unsafe {
            api::cuDeviceGetAttribute(&mut value, attribute, dev)
        })?;
        Ok(value)
    }

    /// The calling thread's current context, if it has one.
    pub fn current_context(&self) -> Result<Option<CUcontext>> {
        let mut context = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check("cuCtxGetCurrent", unsafe {
            api::cuCtxGetCurrent(&mut context)
        })?;
        Ok((!context.is_null()).then_some(context))
    }

    /// Device `ordinal`'s primary context, retained for the life of the
    /// process (as the CUDA runtime keeps it).
    pub fn primary_context(&self, ordinal: i32) -> Result<CUcontext> {
        let dev = self.device(ordinal)?;
        let mut context = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and device.
        check("cuDevicePrimaryCtxRetain", unsafe {
            api::cuDevicePrimaryCtxRetain(&mut context, dev)
        })?;
        Ok(context)
    }

    /// The ordinal of the current context's device.
    pub fn context_device(&self) -> Result<i32> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: `dev` is a valid out-pointer.
        check("cuCtxGetDevice", unsafe { api::cuCtxGetDevice(&mut dev) })?;
        Ok(dev)
    }

    /// The current context, after making device 0's primary context
    /// current when the thread has none (as the CUDA runtime does on first
    /// use); the ordinal of its device.
    pub fn current_device(&self) -> Result<i32> {
        if self.current_context()?.is_none() {
            let context = self.primary_context(0)?;
            // SAFETY: a live context, retained above.
            check("cuCtxSetCurrent", unsafe { api::cuCtxSetCurrent(context) })?;
        }
        self.context_device()
    }

    /// Where `ptr` points: device memory (and which device), pinned or
    /// managed memory, or memory the driver does not know. Any error but
    /// the one the driver answers for memory it does not know is an
    /// error, never "host memory". Needs a current context.
    pub fn classify(&self, ptr: *const c_void) -> Result<Memory> {
        let attribute = |data: *mut c_void, which| {
            // SAFETY: the driver only reads its own tables for `ptr`;
            // `data` points at a value of the attribute's size.
            unsafe { api::cuPointerGetAttribute(data, which, ptr as CUdeviceptr) }
        };
        let mut kind: u32 = 0;
        match attribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        ) {
            sys::CUresult::CUDA_SUCCESS => {}
            // Not a pointer the driver knows: host memory (cuda.h: an
            // address it does not know is an invalid value).
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Ok(Memory::Host),
            other => check("cuPointerGetAttribute", other)?,
        }
        let mut managed: u32 = 0;
        check(
            "cuPointerGetAttribute",
            attribute(
                (&mut managed as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ),
        )?;
        if managed != 0 {
            return Ok(Memory::Managed);
        }
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Ok(Memory::PinnedHost);
        }
        let mut ordinal: i32 = 0;
        check(
            "cuPointerGetAttribute",
            attribute(
                (&mut ordinal as *mut i32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ),
        )?;
        Ok(Memory::Device(ordinal))
    }

    /// `bytes` of device memory of the current context, allocated in
    /// `stream`'s order (`cuMemAllocAsync`, which waits for no kernel) and
    /// usable from any stream once this returns.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context.
    pub unsafe fn alloc(&self, bytes: usize, stream: CUstream) -> Result<CUdeviceptr> {
        let mut ptr = 0;
        // SAFETY: a valid out-pointer and the caller's stream; the memory
        // is freed by `free`.
        check("cuMemAllocAsync", unsafe {
            api::cuMemAllocAsync(&mut ptr, bytes.max(1), stream)
        })?;
        // SAFETY: the caller's live stream.
        unsafe { self.synchronize(stream) }?;
        Ok(ptr)
    }

    /// The allocation holding `ptr` as (start, bytes), as the driver
    /// reports it (`cuMemGetAddressRange`); `None` for memory it does not
    /// know.
    pub fn address_range(&self, ptr: CUdeviceptr) -> Option<(usize, usize)> {
        let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: the driver only reads its own tables for `ptr`; both
        // out-pointers are valid.
        let r = unsafe { api::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some((base as usize, size))
    }

    /// Frees memory from [`Driver::alloc`] in `stream`'s order (waiting for
    /// no kernel).
    ///
    /// # Safety
    /// `ptr` came from `alloc` and no work in flight uses it.
    pub unsafe fn free(&self, ptr: CUdeviceptr, stream: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuMemFreeAsync", unsafe {
            api::cuMemFreeAsync(ptr, stream)
        })
    }

    /// Host to device on `stream`, done when this returns.
    ///
    /// # Safety
    /// `dst` is device memory valid for `src.len()` bytes; `stream` is a
    /// live stream of the current context.
    pub unsafe fn copy_to_device(
        &self,
        dst: CUdeviceptr,
        src: &[u8],
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract; the source outlives the
        // synchronization below.
        check("cuMemcpyHtoDAsync", unsafe {
            api::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream)
        })?;
        // SAFETY: the caller's stream.
        unsafe { self.synchronize(stream) }
    }

    /// Device to host on `stream`, done when this returns.
    ///
    /// # Safety
    /// As [`Driver::copy_to_device`], `src` valid for `dst.len()` bytes.
    pub unsafe fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: CUdeviceptr,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuMemcpyDtoHAsync", unsafe {
            api::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), stream)
        })?;
        // SAFETY: the caller's stream.
        unsafe { self.synchronize(stream) }
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
        check("cuMemcpyDtoDAsync", unsafe {
            api::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream)
        })
    }

    /// Sets `bytes` bytes of device memory to `value` on `stream`, done
    /// when this returns (a synchronous memset would run on the legacy
    /// stream, unordered with non-blocking streams, possibly after it
    /// returned).
    ///
    /// # Safety
    /// `dst` is device memory valid for `bytes` bytes; `stream` is a live
    /// stream of the current context.
    pub unsafe fn memset(
        &self,
        dst: CUdeviceptr,
        value: u8,
        bytes: usize,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuMemsetD8Async", unsafe {
            api::cuMemsetD8Async(dst, value, bytes, stream)
        })?;
        // SAFETY: the caller's stream.
        unsafe { self.synchronize(stream) }
    }

    /// A new non-blocking stream of the current context.
    pub fn create_stream(&self) -> Result<CUstream> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check("cuStreamCreate", unsafe {
            api::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        Ok(stream)
    }

    /// Waits for all work on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream (or null, the legacy default stream).
    pub unsafe fn synchronize(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuStreamSynchronize", unsafe {
            api::cuStreamSynchronize(stream)
        })
    }

    /// Destroys a stream from [`Driver::create_stream`].
    ///
    /// # Safety
    /// `stream` came from `create_stream` and is not used afterwards.
    pub unsafe fn destroy_stream(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuStreamDestroy", unsafe {
            api::cuStreamDestroy_v2(stream)
        })
    }

    /// A new event of the current context.
    pub fn create_event(&self, flags: sys::CUevent_flags) -> Result<sys::CUevent> {
        let mut event = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check("cuEventCreate", unsafe {
            api::cuEventCreate(&mut event, flags as u32)
        })?;
        Ok(event)
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
        let start = self.create_event(flags)?;
        let end = self.create_event(flags)?;
        let mut ms = 0f32;
        // SAFETY: both events are live until destroyed below; the stream
        // is the caller's.
        let timed = unsafe {
            check("cuEventRecord", api::cuEventRecord(start, stream))
                .and_then(|()| work())
                .and_then(|()| check("cuEventRecord", api::cuEventRecord(end, stream)))
                .and_then(|()| check("cuEventSynchronize", api::cuEventSynchronize(end)))
                .and_then(|()| {
                    check(
                        "cuEventElapsedTime",
                        api::cuEventElapsedTime_v2(&mut ms, start, end),
                    )
                })
        };
        // SAFETY: the events are not used after this.
        unsafe {
            check("cuEventDestroy", api::cuEventDestroy_v2(start))?;
            check("cuEventDestroy", api::cuEventDestroy_v2(end))?;
        }
        timed.map(|()| ms)
    }

    /// Loads the kernels' fatbin into the current context, whose device
    /// is `device`.
    pub fn load_kernels(&self, device: i32) -> Result<Kernels> {
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
        let mut module = std::ptr::null_mut();
        // SAFETY: `image` is a complete fatbin; the module stays loaded for
        // the life of the `Kernels`.
        check("cuModuleLoadData", unsafe {
            api::cuModuleLoadData(&mut module, image.as_ptr().cast())
        })?;
        let function = |name: &str| -> Result<sys::CUfunction> {
            let name = CString::new(name).map_err(|e| CudaError::Invalid(e.to_string()))?;
            let mut f = std::ptr::null_mut();
            // SAFETY: `module` is loaded; a NUL-terminated name.
            check("cuModuleGetFunction", unsafe {
                api::cuModuleGetFunction(&mut f, module, name.as_ptr())
            })?;
            Ok(f)
        };
        let mut reduce = Vec::with_capacity(REDUCE_KERNELS.len());
        for name in REDUCE_KERNELS {
            reduce.push(function(name)?);
        }
        let copy = function("rccl_copy")?;
        let fifo_loopback = function("rccl_fifo_loopback")?;
        let run_work = function("rccl_run_work")?;
        let sms = self
            .attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?
            .max(1) as u32;
        // SAFETY: `copy` is a kernel of the loaded module.
        let per_sm = unsafe { blocks_per_sm(copy, THREADS, 0) }?;
        Ok(Kernels {
            module,
            reduce,
            copy,
            fifo_loopback,
            run_work,
            max_blocks: sms * per_sm.max(1),
            device: format!("{device} ({})", self.device_name(device)?),
            sms,
            work_blocks_per_sm: Mutex::new(HashMap::new()),
        })
    }
}

/// How many blocks of `function`, of `threads` threads and `shared_bytes`
/// bytes of dynamic shared memory each, one SM of the current context's
/// device holds at once, as the driver counts them.
///
/// # Safety
/// `function` is a kernel of a module loaded in the current context.
unsafe fn blocks_per_sm(function: sys::CUfunction, threads: u32, shared_bytes: u32) -> Result<u32> {
    let mut per_sm = 0;
    // SAFETY: the caller's kernel; a valid out-pointer.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        api::cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut per_sm,
            function,
            threads as i32,
            shared_bytes as usize,
        )
    })?;
    Ok(per_sm.max(0) as u32)
}

/// Launches `function` with `params` (one pointer per parameter).
///
/// # Safety
/// `params` matches the kernel's parameters; the memory they name stays
/// valid until the kernel completes; `stream` is a stream of the context
/// the kernel was loaded in.
unsafe fn launch(
    function: sys::CUfunction,
    grid: u32,
    threads: u32,
    shared_bytes: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract.
    check("cuLaunchKernel", unsafe {
        api::cuLaunchKernel(
            function,
            grid,
            1,
            1,
            threads,
            1,
            1,
            shared_bytes,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
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
    /// The device's ordinal and name, for errors.
    device: String,
    sms: u32,
    /// `rccl_run_work` blocks one SM holds, by (threads, dynamic shared
    /// bytes) of a block.
    work_blocks_per_sm: Mutex<HashMap<(u32, u32), u32>>,
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
        unsafe { launch(self.reduce[dtype], blocks, THREADS, 0, stream, &mut params) }
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
        unsafe { launch(self.copy, blocks, THREADS, 0, stream, &mut params) }
    }

    /// Launches the FIFO loopback kernel: two blocks of
    /// [`LOOPBACK_THREADS`], one sending and one receiving.
    ///
    /// # Safety
    /// `args.fifo` describes zeroed device memory for its slots; `src`,
    /// `dst` and `status` are device memory of the sizes given.
    pub unsafe fn fifo_loopback(&self, args: &LoopbackArgs, stream: CUstream) -> Result<()> {
        let mut by_value = *args;
        let mut params = [(&mut by_value as *mut LoopbackArgs).cast::<c_void>()];
        // SAFETY: the kernel takes one `LoopbackArgs` by value; two blocks
        // always fit on the device together.
        unsafe {
            launch(
                self.fifo_loopback,
                2,
                LOOPBACK_THREADS,
                0,
                stream,
                &mut params,
            )
        }
    }

    /// Launches one round of device work: grid block b runs the channel
    /// `blocks[b]` names with `threads` threads and writes its end to the
    /// word `blocks[b]` names (0 done, 1 aborted, 2 still waiting
    /// `timeout_ns` after it started, by the GPU's global timer, 3 too
    /// large). Each block gets `peers` FIFO ends of shared memory.
    ///
    /// # Safety
    /// `nblocks` is at least one; `blocks` is device memory holding
    /// `nblocks` [`crate::work::WorkBlock`]s whose
    /// work is device memory holding encoded [`crate::work::Work`] of
    /// channels of at most `peers` peers, whose addresses the device can
    /// reach, and whose status words are device memory.
    pub unsafe fn run_work(
        &self,
        blocks: CUdeviceptr,
        nblocks: u32,
        threads: u32,
        peers: usize,
        timeout_ns: u64,
        stream: CUstream,
    ) -> Result<()> {
        let shared = work_shared_bytes(peers)?;
        let (mut b, mut t) = (blocks, timeout_ns);
        let mut params = [
            (&mut b as *mut CUdeviceptr).cast::<c_void>(),
            (&mut t as *mut u64).cast::<c_void>(),
        ];
        // SAFETY: the parameters match the kernel's (pointer, u64); the
        // caller's contract covers the memory.
        unsafe { launch(self.run_work, nblocks, threads, shared, stream, &mut params) }
    }

    /// Refuses a round of device work ([`Kernels::run_work`]'s arguments)
    /// whose grid cannot be resident on the device all at once: its
    /// blocks wait for each other, so launched it would wait forever.
    /// Blocks that kernels of other processes or streams hold meanwhile
    /// are not counted. Needs the kernels' context current.
    pub fn check_work_resident(&self, nblocks: u32, threads: u32, peers: usize) -> Result<()> {
        let shared_bytes = work_shared_bytes(peers)?;
        let per_sm = match self
            .work_blocks_per_sm
            .lock()
            .entry((threads, shared_bytes))
        {
            Entry::Occupied(known) => *known.get(),
            Entry::Vacant(new) => {
                // SAFETY: `run_work` is a kernel of the module loaded in
                // the current context.
                let per_sm = unsafe { blocks_per_sm(self.run_work, threads, shared_bytes) }?;
                *new.insert(per_sm)
            }
        };
        if u64::from(nblocks) <= u64::from(per_sm) * u64::from(self.sms) {
            return Ok(());
        }
        Err(CudaError::NotResident {
            device: self.device.clone(),
            kernel: "rccl_run_work",
            blocks: nblocks,
            threads,
            shared_bytes,
            per_sm,
            sms: self.sms,
        })
    }
}

/// Dynamic shared memory of a block of device work whose channels have
/// at most `peers` peers: their FIFO ends.
/// The block's descriptors (`WORK_LOCAL_BYTES` and its `WorkBlock`) sit
/// in its static shared memory, so the two together stay within the
/// 48 KiB a kernel takes without opting in.
fn work_shared_bytes(peers: usize) -> Result<u32> {
    let shared = peers * PEER_ENDS_BYTES;
    let fixed = WORK_LOCAL_BYTES + size_of::<WorkBlock>();
    if shared + fixed > MAX_STATIC_SHARED {
        return Err(CudaError::Invalid(format!(
            "device work has a channel of {peers} peers; a block keeps the descriptors and \
             FIFO ends of at most {} in shared memory",
            (MAX_STATIC_SHARED - fixed) / PEER_ENDS_BYTES
        )));
    }
    Ok(shared as u32)
}

/// Threads of each block of the FIFO loopback kernel.
const LOOPBACK_THREADS: u32 = 256;

/// Shared memory a kernel may take without opting in
/// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): 48 KiB.
const MAX_STATIC_SHARED: usize = 48 << 10;

/// Threads of a block running a channel of device work over FIFOs of
/// `protocol` ([`rccl_algorithms::Protocol::abi`]; `None`: local copies
/// only). Simple moves whole slots (hundreds of KiB) in 16-byte vectors:
/// 16 warps keep 4 vectors each in flight, enough to cover memory latency
/// at one block per channel. LL128 moves lines of 128 bytes, 8 threads per
/// line: 8 warps cover a slot of a few KiB with one chunk each. LL stores
/// an 8-byte word per 4 data bytes and every word carries its flag:
/// 8 warps too, more would mostly wait at the block's barriers.
pub fn work_threads(protocol: Option<u32>) -> u32 {
    match protocol {
        Some(p) if p == Protocol::Simple.abi() => 512,
        None => 512,
        _ => 256,
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `load_kernels` and its functions
        // die with `self`. An error here (a context already destroyed)
        // leaves nothing to clean.
        let _ = unsafe { api::cuModuleUnload(self.module) };
    }
}
