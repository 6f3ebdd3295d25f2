//! The driver's entry points, looked up in the one driver library the
//! process opened (`libcuda.so.1`, [`open`]). cudarc supplies the types and
//! constants of `cuda.h`; its own loader (which tries `libcuda.so` first,
//! on many machines the toolkit's stub) is never reached, since none of
//! cudarc's functions are called.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUfunction, CUgraph,
    CUgraphEdgeData, CUgraphNode, CUhostFn, CUmemAccessDesc, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemRangeHandleType, CUmodule, CUpointer_attribute, CUresult, CUstream, CUstreamCaptureStatus,
    CUuserObject,
};

/// The driver library's handle, once opened.
static LIBRARY: OnceLock<usize> = OnceLock::new();

/// Opens the driver library by its soname, once per process; the handle
/// stays open for the life of the process. The loader's reason on failure.
pub(crate) fn open() -> Result<(), String> {
    if LIBRARY.get().is_some() {
        return Ok(());
    }
    // SAFETY: dlopen with a valid NUL-terminated name; loading the NVIDIA
    // driver library runs only its own initializers.
    let handle =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated string owned by
        // the loader, read at once.
        return Err(unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown reason".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        });
    }
    // A second opener's handle names the same library (dlopen counts).
    let _ = LIBRARY.set(handle as usize);
    Ok(())
}

/// The address of `name` (NUL-terminated) in the opened driver.
fn symbol(name: &str) -> Option<*mut c_void> {
    let handle = *LIBRARY.get()?;
    // SAFETY: a live handle from dlopen and a NUL-terminated name.
    let address = unsafe { libc::dlsym(handle as *mut c_void, name.as_ptr().cast()) };
    (!address.is_null()).then_some(address)
}

/// Whether the opened driver exports `name`.
pub(crate) fn exports(name: &str) -> bool {
    symbol(&format!("{name}\0")).is_some()
}

/// Declares each entry point as a function of its `cuda.h` signature
/// that calls the driver's symbol of the same name, resolved on first use;
/// a symbol the driver lacks answers `CUDA_ERROR_NOT_FOUND`. Their names
/// are [`ENTRY_POINTS`].
macro_rules! entry_points {
    ($($name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
        /// The name of every driver entry point the backend calls.
        pub const ENTRY_POINTS: &[&str] = &[$(stringify!($name)),*];
        $(
        /// The driver's entry point of this name.
        ///
        /// # Safety
        /// As the driver API documents for it.
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $name($($arg: $ty),*) -> CUresult {
            type Entry = unsafe extern "C" fn($($ty),*) -> CUresult;
            static ENTRY: OnceLock<usize> = OnceLock::new();
            let address = match ENTRY.get() {
                Some(&a) => a,
                None => match symbol(concat!(stringify!($name), "\0")) {
                    Some(a) => *ENTRY.get_or_init(|| a as usize),
                    None => return CUresult::CUDA_ERROR_NOT_FOUND,
                },
            };
            // SAFETY: the driver exports this symbol with `cuda.h`'s
            // signature, which `Entry` spells; the caller's contract
            // covers the arguments.
            unsafe { std::mem::transmute::<usize, Entry>(address)($($arg),*) }
        }
        )*
    };
}

entry_points! {
    cuInit(flags: c_uint);
    cuGetErrorName(error: CUresult, text: *mut *const c_char);
    cuGetErrorString(error: CUresult, text: *mut *const c_char);
    cuDeviceGetCount(count: *mut c_int);
    cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    cuDeviceGetName(name: *mut c_char, len: c_int, device: CUdevice);
    cuDeviceGetAttribute(value: *mut c_int, attribute: CUdevice_attribute, device: CUdevice);
    cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice);
    cuCtxGetCurrent(context: *mut CUcontext);
    cuCtxSetCurrent(context: CUcontext);
    cuCtxPushCurrent_v2(context: CUcontext);
    cuCtxPopCurrent_v2(context: *mut CUcontext);
    cuCtxGetDevice(device: *mut CUdevice);
    cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, ptr: CUdeviceptr);
    cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr);
    cuMemAllocAsync(ptr: *mut CUdeviceptr, bytes: usize, stream: CUstream);
    cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream);
    cuMemHostAlloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint);
    cuMemFreeHost(ptr: *mut c_void);
    cuMemHostGetDevicePointer_v2(device: *mut CUdeviceptr, host: *mut c_void, flags: c_uint);
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: CUstream);
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream);
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
    cuMemsetD8Async(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream);
    cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const CUmemAllocationProp,
        option: CUmemAllocationGranularity_flags,
    );
    cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: c_ulonglong,
    );
    cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        address: CUdeviceptr,
        flags: c_ulonglong,
    );
    cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: c_ulonglong,
    );
    cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
    cuMemUnmap(ptr: CUdeviceptr, size: usize);
    cuMemAddressFree(ptr: CUdeviceptr, size: usize);
    cuMemRelease(handle: CUmemGenericAllocationHandle);
    cuMemExportToShareableHandle(
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        kind: CUmemAllocationHandleType,
        flags: c_ulonglong,
    );
    cuMemImportFromShareableHandle(
        handle: *mut CUmemGenericAllocationHandle,
        shareable: *mut c_void,
        kind: CUmemAllocationHandleType,
    );
    cuMemGetHandleForAddressRange(
        handle: *mut c_void,
        ptr: CUdeviceptr,
        size: usize,
        kind: CUmemRangeHandleType,
        flags: c_ulonglong,
    );
    cuStreamCreate(stream: *mut CUstream, flags: c_uint);
    cuStreamDestroy_v2(stream: CUstream);
    cuStreamSynchronize(stream: CUstream);
    cuStreamQuery(stream: CUstream);
    cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);
    cuLaunchHostFunc(stream: CUstream, function: CUhostFn, data: *mut c_void);
    cuStreamWaitValue32_v2(stream: CUstream, address: CUdeviceptr, value: u32, flags: c_uint);
    cuStreamGetCaptureInfo_v3(
        stream: CUstream,
        status: *mut CUstreamCaptureStatus,
        id: *mut c_ulonglong,
        graph: *mut CUgraph,
        dependencies: *mut *const CUgraphNode,
        edge_data: *mut *const CUgraphEdgeData,
        count: *mut usize,
    );
    cuUserObjectCreate(
        object: *mut CUuserObject,
        data: *mut c_void,
        destroy: CUhostFn,
        count: c_uint,
        flags: c_uint,
    );
    cuUserObjectRelease(object: CUuserObject, count: c_uint);
    cuGraphRetainUserObject(graph: CUgraph, object: CUuserObject, count: c_uint, flags: c_uint);
    cuEventCreate(event: *mut CUevent, flags: c_uint);
    cuEventRecord(event: CUevent, stream: CUstream);
    cuEventQuery(event: CUevent);
    cuEventSynchronize(event: CUevent);
    cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent);
    cuEventDestroy_v2(event: CUevent);
    cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
    cuModuleGetFunction(function: *mut CUfunction, module: CUmodule, name: *const c_char);
    cuModuleUnload(module: CUmodule);
    cuOccupancyMaxActiveBlocksPerMultiprocessor(
        blocks: *mut c_int,
        function: CUfunction,
        threads: c_int,
        shared_bytes: usize,
    );
    cuLaunchKernel(
        function: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    );
}
