//! The exported entry points, under the names the driver exports (the
//! versioned names `cuda.h`'s macros map to) and with `cuda.h`'s
//! signatures. Enumerations arrive as plain integers: a value outside the
//! enumeration is refused, never undefined behaviour.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute as Attr, CUdeviceptr, CUevent, CUfunction, CUgraph,
    CUgraphExec, CUhostFn, CUmodule, CUpointer_attribute as Ptr, CUresult, CUstream, CUuserObject,
};

use crate::exec::{self, Kernel, Work, IN_HOST_FUNCTION, KERNELS};
use crate::state::{
    current_dev, lock, wait_until, with_stack, Capture, EventState, Exec, Function, Graph, Kind,
    Module, State, CONTEXT_BASE, EVENT_BASE, EXEC_BASE, FUNCTION_BASE, GRAPH_BASE, MODULE_BASE,
    STREAM_BASE, USER_OBJECT_BASE,
};
use crate::user::{self, UserObject};
use crate::{entry, Res};

use CUresult::*;

/// An entry point's body, refused from inside a host function (which may
/// not call CUDA).
pub(crate) fn call(body: impl FnOnce() -> Res<()>) -> CUresult {
    if IN_HOST_FUNCTION.with(|h| h.get()) {
        crate::report(format_args!(
            "a host function called the driver (CUDA_ERROR_NOT_PERMITTED)"
        ));
        return CUDA_ERROR_NOT_PERMITTED;
    }
    entry(body)
}

/// Writes `value` through an out-pointer, refusing null.
fn out<T>(ptr: *mut T, value: T) -> Res<()> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's out-pointer of type `T`, not null.
    unsafe { ptr.write(value) };
    Ok(())
}

fn context_handle(dev: usize) -> CUcontext {
    (((CONTEXT_BASE + dev as u64) << 4) as usize) as CUcontext
}

// ---- Initialization, devices, contexts ----

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    call(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        lock().init();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    call(|| out(version, 13000))
}

fn error_text(e: CUresult) -> (&'static CStr, &'static CStr) {
    match e {
        CUDA_SUCCESS => (c"CUDA_SUCCESS", c"no error"),
        CUDA_ERROR_INVALID_VALUE => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        CUDA_ERROR_OUT_OF_MEMORY => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        CUDA_ERROR_NOT_INITIALIZED => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        CUDA_ERROR_INVALID_DEVICE => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        CUDA_ERROR_INVALID_IMAGE => (
            c"CUDA_ERROR_INVALID_IMAGE",
            c"device kernel image is invalid",
        ),
        CUDA_ERROR_INVALID_CONTEXT => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        CUDA_ERROR_CONTEXT_IS_DESTROYED => {
            (c"CUDA_ERROR_CONTEXT_IS_DESTROYED", c"context is destroyed")
        }
        CUDA_ERROR_INVALID_HANDLE => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        CUDA_ERROR_NOT_FOUND => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        CUDA_ERROR_NOT_READY => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        CUDA_ERROR_ILLEGAL_ADDRESS => (
            c"CUDA_ERROR_ILLEGAL_ADDRESS",
            c"an illegal memory access was encountered",
        ),
        CUDA_ERROR_LAUNCH_TIMEOUT => (
            c"CUDA_ERROR_LAUNCH_TIMEOUT",
            c"the launch timed out and was terminated",
        ),
        CUDA_ERROR_NOT_PERMITTED => (c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
        CUDA_ERROR_NOT_SUPPORTED => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            c"operation not permitted when stream is capturing",
        ),
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => (
            c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            c"operation failed due to a previous error during capture",
        ),
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
            c"capture sequence contains a fork that was not joined to the primary stream",
        ),
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION => (
            c"CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
            c"dependency created on uncaptured work in another stream",
        ),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => (
            c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
            c"operation would make the legacy stream depend on a capturing blocking stream",
        ),
        CUDA_ERROR_CAPTURED_EVENT => (
            c"CUDA_ERROR_CAPTURED_EVENT",
            c"operation not permitted on an event last recorded in a capturing stream",
        ),
        CUDA_ERROR_ILLEGAL_STATE => (
            c"CUDA_ERROR_ILLEGAL_STATE",
            c"the operation is not permitted in the current state",
        ),
        _ => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
    }
}

#[no_mangle]
pub extern "C" fn cuGetErrorName(error: CUresult, name: *mut *const c_char) -> CUresult {
    entry(|| out(name, error_text(error).0.as_ptr()))
}

#[no_mangle]
pub extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    entry(|| out(text, error_text(error).1.as_ptr()))
}

#[no_mangle]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    call(|| {
        let st = lock();
        st.initialized()?;
        out(count, st.devices.len() as c_int)
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    call(|| out(device, lock().device(ordinal)? as CUdevice))
}

#[no_mangle]
pub extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    call(|| {
        let dev = lock().device(dev)?;
        let text = format!("rccl CUDA model {dev}\0");
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = text.len().min(len);
        // SAFETY: the caller's buffer of `len` bytes; the last byte
        // written is a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, n);
            name.add(n - 1).write(0);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_uint,
    dev: CUdevice,
) -> CUresult {
    call(|| {
        let st = lock();
        st.device(dev)?;
        let v = match attrib {
            a if a == Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as u32 => {
                st.config().sms as c_int
            }
            a if a == Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as u32 => 9,
            a if a == Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as u32 => 0,
            a if a == Attr::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING as u32 => 1,
            a if a == Attr::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY as u32 => 1,
            a if a == Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK as u32 => 1024,
            a if a == Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE as u32 => 32,
            a if a == Attr::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED as u32 => 1,
            // Not claimed: no NIC writes to the model's memory but through a file.
            a if a == Attr::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED as u32 => 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        out(value, v)
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.device(dev)?;
        if ctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = &mut st.devices[dev];
        if device.retains == 0 {
            // A new context: a fault of the one before is gone with it.
            device.sticky = None;
        }
        device.retains += 1;
        out(ctx, context_handle(dev))
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.device(dev)?;
        if st.devices[dev].retains == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        st.devices[dev].retains -= 1;
        if st.devices[dev].retains == 0 {
            // The context goes, and its memory with it.
            let gone: Vec<u64> = st
                .allocs
                .iter()
                .filter(|(_, a)| a.dev == dev)
                .map(|(&p, _)| p)
                .collect();
            for p in gone {
                exec::release(&mut st, p);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    call(|| {
        let st = lock();
        st.initialized()?;
        if ctx.is_null() {
            with_stack(|s| s.pop());
            return Ok(());
        }
        let dev = st.context(ctx as u64)?;
        with_stack(|s| match s.last_mut() {
            Some(top) => *top = dev,
            None => s.push(dev),
        });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult {
    call(|| {
        lock().initialized()?;
        out(
            ctx,
            current_dev().map_or(std::ptr::null_mut(), context_handle),
        )
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    call(|| {
        let dev = lock().context(ctx as u64)?;
        with_stack(|s| s.push(dev));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CUresult {
    call(|| {
        lock().initialized()?;
        let dev = with_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !ctx.is_null() {
            out(ctx, context_handle(dev))?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    call(|| out(device, lock().current()? as CUdevice))
}

#[no_mangle]
pub extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    if ctx.is_null() {
        return cuCtxGetDevice(device);
    }
    call(|| out(device, lock().context(ctx as u64)? as CUdevice))
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        st.unsafe_call()?;
        let streams: Vec<(u64, u64)> = st
            .streams
            .iter()
            .filter(|(_, s)| s.dev == dev)
            .map(|(&id, s)| (id, s.enqueued))
            .collect();
        wait_until(
            &mut st,
            || format!("cuCtxSynchronize of device {dev}"),
            |s| {
                s.devices[dev].sticky.is_some()
                    || streams.iter().all(|&(id, seq)| s.reached(id, seq))
            },
        )?;
        st.devices[dev].sticky.map_or(Ok(()), Err)
    })
}

// ---- Memory ----

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        if bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        st.unsafe_call()?;
        State::wait_kernels(&mut st, dev, "cuMemAlloc")?;
        let p = exec::allocate(&mut st, bytes, Kind::Device, dev)?;
        out(dptr, p)
    })
}

/// Frees device or pinned memory of the current context after the
/// kernels launched before (`what` names the call).
fn free(ptr: u64, host: bool, what: &str) -> Res<()> {
    let mut st = lock();
    let dev = st.current()?;
    let kind = match st.allocs.get(&ptr) {
        Some(a) => a.kind,
        None => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    if host != matches!(kind, Kind::PinnedHost { .. }) || matches!(kind, Kind::Mapped { .. }) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    st.unsafe_call()?;
    State::wait_kernels(&mut st, dev, what)?;
    exec::release(&mut st, ptr);
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    call(|| free(dptr, false, "cuMemFree"))
}

#[no_mangle]
pub extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        if bytes == 0 || flags & !0x7 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        st.unsafe_call()?;
        State::wait_kernels(&mut st, dev, "cuMemHostAlloc")?;
        let p = exec::allocate(&mut st, bytes, Kind::PinnedHost { flags }, dev)?;
        out(pp, p as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    call(|| free(p as u64, true, "cuMemFreeHost"))
}

#[no_mangle]
pub extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    call(|| {
        let st = lock();
        st.current()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match st.find(p as u64, 1) {
            // Mapped only when allocated with CU_MEMHOSTALLOC_DEVICEMAP.
            Some((_, a)) if matches!(a.kind, Kind::PinnedHost { flags } if flags & 0x2 != 0) => {
                out(dptr, p as u64)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        let s = st.stream(stream as u64)?;
        if bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = exec::allocate(&mut st, bytes, Kind::Device, dev)?;
        if let Some(c) = st.capturing(s) {
            // Graph memory: the graph owns it.
            st.captures.get_mut(&c).expect("live").allocs.push(p);
        }
        out(dptr, p)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if !matches!(st.allocs.get(&dptr), Some(a) if a.kind == Kind::Device) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match st.capturing(s) {
            Some(c) if st.captures[&c].allocs.contains(&dptr) => st.capture_node(c, s, Work::Empty),
            Some(_) => Err(CUDA_ERROR_NOT_SUPPORTED),
            None => st.enqueue(s, Work::Free(dptr), None).map(drop),
        }
    })
}

fn write_bool(data: *mut c_void, value: bool) -> Res<()> {
    out(data.cast::<u8>(), value as u8)
}

/// One attribute of `ptr`, or why not.
fn attribute(st: &State, attr: c_uint, ptr: u64, data: *mut c_void) -> Res<()> {
    let (base, a) = st.find(ptr, 1).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let host = matches!(a.kind, Kind::PinnedHost { .. });
    match attr {
        x if x == Ptr::CU_POINTER_ATTRIBUTE_CONTEXT as u32 => {
            out(data.cast(), context_handle(a.dev))
        }
        x if x == Ptr::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as u32 => {
            out(data.cast::<c_uint>(), if host { 1 } else { 2 })
        }
        x if x == Ptr::CU_POINTER_ATTRIBUTE_DEVICE_POINTER as u32 => out(data.cast::<u64>(), ptr),
        x if x == Ptr::CU_POINTER_ATTRIBUTE_HOST_POINTER as u32 => {
            if !host {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            out(data.cast::<u64>(), ptr)
        }
        x if x == Ptr::CU_POINTER_ATTRIBUTE_BUFFER_ID as u32 => out(data.cast::<u64>(), a.id),
        x if x == Ptr::CU_POINTER_ATTRIBUTE_IS_MANAGED as u32 => write_bool(data, false),
        x if x == Ptr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as u32 => {
            out(data.cast::<c_int>(), a.dev as c_int)
        }
        x if x == Ptr::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as u32 => {
            out(data.cast::<u64>(), base)
        }
        x if x == Ptr::CU_POINTER_ATTRIBUTE_RANGE_SIZE as u32 => out(data.cast::<usize>(), a.size),
        x if x == Ptr::CU_POINTER_ATTRIBUTE_MAPPED as u32 => write_bool(data, true),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[no_mangle]
pub extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    call(|| {
        let st = lock();
        // The strict reading: answers need a current context.
        st.current()?;
        attribute(&st, attr, ptr, data)
    })
}

#[no_mangle]
pub extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attrs: *const c_uint,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    call(|| {
        let st = lock();
        st.current()?;
        if attrs.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count as usize {
            // SAFETY: the caller's arrays of `count` entries.
            let (attr, slot) = unsafe { (*attrs.add(i), *data.add(i)) };
            if attribute(&st, attr, ptr, slot).is_err() && st.find(ptr, 1).is_none() {
                // Unknown pointers get null answers, not an error. The
                // sizes: memory type and ordinal are ints, the rest
                // pointers or booleans.
                if attr == Ptr::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as u32 {
                    out(slot.cast::<c_uint>(), 0)?;
                } else if attr == Ptr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as u32 {
                    out(slot.cast::<c_int>(), -2)?;
                } else if attr == Ptr::CU_POINTER_ATTRIBUTE_IS_MANAGED as u32
                    || attr == Ptr::CU_POINTER_ATTRIBUTE_MAPPED as u32
                {
                    write_bool(slot, false)?;
                } else {
                    out(slot.cast::<u64>(), 0)?;
                }
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    call(|| {
        let st = lock();
        st.current()?;
        match st.find(dptr, 1) {
            Some((b, a)) if matches!(a.kind, Kind::Device | Kind::Mapped { .. }) => {
                if !base.is_null() {
                    out(base, b)?;
                }
                if !size.is_null() {
                    out(size, a.size)?;
                }
                Ok(())
            }
            _ => Err(CUDA_ERROR_NOT_FOUND),
        }
    })
}

// ---- Memsets and copies ----

/// Where a range of a memset or copy lies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Device(usize),
    Pinned,
    Pageable,
}

/// The place of `[ptr, ptr + len)`: a range that starts in an allocation
/// must end in it.
fn place(st: &State, ptr: u64, len: usize) -> Res<Place> {
    if ptr == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match st.find(ptr, 1) {
        // A reservation is no host memory: unmapped or inaccessible.
        None if st.vmm.reserves(ptr) => Err(CUDA_ERROR_INVALID_VALUE),
        None => Ok(Place::Pageable),
        Some(_) if st.find(ptr, len).is_none() => Err(CUDA_ERROR_INVALID_VALUE),
        Some((_, a)) => Ok(match a.kind {
            Kind::Device | Kind::Mapped { .. } => Place::Device(a.dev),
            Kind::PinnedHost { .. } => Place::Pinned,
        }),
    }
}

/// Device memory of another device than the stream's: refused (strict),
/// unless peer access is switched on.
fn check_device(st: &State, place: Place, dev: usize) -> Res<()> {
    match place {
        Place::Device(d) if d != dev && !st.config().peer_access => {
            crate::report(format_args!(
                "memory of device {d} used from a context of device {dev} (CUDA_ERROR_INVALID_VALUE)"
            ));
            Err(CUDA_ERROR_INVALID_VALUE)
        }
        _ => Ok(()),
    }
}

/// A copy; `stream` is `None` for the synchronous calls, which run on
/// the legacy stream and return as the API's synchronization rules say.
fn copy(dst: u64, src: u64, bytes: usize, stream: Option<CUstream>) -> Res<()> {
    let mut st = lock();
    let dev = st.current()?;
    let s = match stream {
        Some(raw) => st.stream(raw as u64)?,
        None => {
            st.unsafe_call()?;
            st.devices[dev].legacy
        }
    };
    if bytes == 0 {
        return Ok(());
    }
    let (to, from) = (place(&st, dst, bytes)?, place(&st, src, bytes)?);
    check_device(&st, to, dev)?;
    check_device(&st, from, dev)?;
    let pageable = to == Place::Pageable || from == Place::Pageable;
    if let Some(c) = st.capturing(s) {
        if pageable {
            st.invalidate(Some(c));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        return st.capture_node(c, s, Work::Copy { dst, src, bytes });
    }
    let work = if from == Place::Pageable {
        // Staged now, written in stream order.
        // SAFETY: the caller's source of `bytes` bytes.
        let data = unsafe { std::slice::from_raw_parts(src as *const u8, bytes) }.to_vec();
        Work::Staged {
            dst,
            data: Arc::new(data),
        }
    } else {
        Work::Copy { dst, src, bytes }
    };
    let to_host = matches!(to, Place::Pageable | Place::Pinned);
    let wait = match stream {
        // Synchronous: device to device and pageable to device return
        // early; the rest once done.
        None => st.config().sync_copies || to_host || from == Place::Pinned,
        // Asynchronous: only device to pageable waits.
        Some(_) => to == Place::Pageable && matches!(from, Place::Device(_)),
    };
    if stream.is_none() && !wait {
        late(&mut st, s)?;
    }
    st.enqueue(s, work, None)?;
    if wait {
        State::drain(&mut st, s)?;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    call(|| copy(dst, src, bytes, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult {
    call(|| copy(dst, src as u64, bytes, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult {
    call(|| copy(dst as u64, src, bytes, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    call(|| copy(dst, src, bytes, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    call(|| copy(dst, src, bytes, Some(stream)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    call(|| copy(dst, src as u64, bytes, Some(stream)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    call(|| copy(dst as u64, src, bytes, Some(stream)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    call(|| copy(dst, src, bytes, Some(stream)))
}

/// A memset of `count` elements of `elem` bytes; synchronous when
/// `stream` is `None`: late on device memory, done on pinned memory.
fn memset(dst: u64, value: u32, elem: usize, count: usize, stream: Option<CUstream>) -> Res<()> {
    let mut st = lock();
    let dev = st.current()?;
    let s = match stream {
        Some(raw) => st.stream(raw as u64)?,
        None => {
            st.unsafe_call()?;
            st.devices[dev].legacy
        }
    };
    if count == 0 {
        return Ok(());
    }
    if !dst.is_multiple_of(elem as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let to = place(&st, dst, elem * count)?;
    if to == Place::Pageable {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_device(&st, to, dev)?;
    let work = Work::Memset {
        dst,
        value,
        elem,
        count,
    };
    if let Some(c) = st.capturing(s) {
        return st.capture_node(c, s, work);
    }
    let wait = to == Place::Pinned || st.config().sync_copies;
    if stream.is_none() && !wait {
        late(&mut st, s)?;
    }
    st.enqueue(s, work, None)?;
    if stream.is_none() && wait {
        State::drain(&mut st, s)?;
    }
    Ok(())
}

/// Before a synchronous call's operation that runs after the call
/// returns: the pause of `RCCL_CUDA_MODEL_LATE_MS`, if any.
fn late(st: &mut State, legacy: u64) -> Res<()> {
    let pause = st.config().late;
    if !pause.is_zero() {
        st.enqueue(legacy, Work::Pause(pause), None)?;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize) -> CUresult {
    call(|| memset(dst, value.into(), 1, count, None))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, count: usize) -> CUresult {
    call(|| memset(dst, value.into(), 2, count, None))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, count: usize) -> CUresult {
    call(|| memset(dst, value, 4, count, None))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: u8,
    count: usize,
    stream: CUstream,
) -> CUresult {
    call(|| memset(dst, value.into(), 1, count, Some(stream)))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    value: u16,
    count: usize,
    stream: CUstream,
) -> CUresult {
    call(|| memset(dst, value.into(), 2, count, Some(stream)))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    value: c_uint,
    count: usize,
    stream: CUstream,
) -> CUresult {
    call(|| memset(dst, value, 4, count, Some(stream)))
}

// ---- Streams and events ----

#[no_mangle]
pub extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        if flags & !1 != 0 || stream.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let id = st.handle(STREAM_BASE);
        st.new_stream(id, dev, flags & 1 == 0, false);
        out(stream, id as usize as CUstream)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if st.streams[&s].legacy {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // Work in flight completes; the worker ends after it.
        st.streams.get_mut(&s).expect("checked").destroyed = true;
        crate::state::notify();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if let Some(c) = st.capturing(s) {
            st.invalidate(Some(c));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        State::drain(&mut st, s)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if let Some(c) = st.capturing(s) {
            st.invalidate(Some(c));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let done = st.reached(s, st.streams[&s].enqueued);
        if done {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    })
}

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(stream: CUstream, f: CUhostFn, arg: *mut c_void) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let work = Work::Host {
            f,
            arg: arg as usize,
        };
        match st.capturing(s) {
            // A host node: the same argument on every replay.
            Some(c) => st.capture_node(c, s, work),
            None => st.enqueue(s, work, None).map(drop),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        if flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let id = st.handle(EVENT_BASE);
        st.events.insert(
            id,
            EventState {
                dev,
                flags,
                target: None,
                time: None,
                captured: None,
            },
        );
        out(event, id as usize as CUevent)
    })
}

fn event(st: &State, event: CUevent) -> Res<u64> {
    st.initialized()?;
    let id = event as u64;
    st.events
        .contains_key(&id)
        .then_some(id)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

#[no_mangle]
pub extern "C" fn cuEventRecord(ev: CUevent, stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = event(&st, ev)?;
        let s = st.stream(stream as u64)?;
        if st.events[&e].dev != st.streams[&s].dev {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if let Some(c) = st.capturing(s) {
            if st.captures[&c].invalid {
                return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            let tails = st.captures[&c].tails.get(&s).cloned().unwrap_or_default();
            let ev = st.events.get_mut(&e).expect("checked");
            ev.captured = Some((c, tails));
            ev.target = None;
            return Ok(());
        }
        let seq = st.enqueue(s, Work::Record(e), None)?;
        let ev = st.events.get_mut(&e).expect("checked");
        ev.target = Some((s, seq));
        ev.captured = None;
        Ok(())
    })
}

/// An event last recorded in a capture is the graph's, not the host's:
/// querying it is refused, and during the capture invalidates it.
fn captured_event(st: &mut State, e: u64) -> Res<()> {
    if let Some((c, _)) = st.events[&e].captured {
        st.invalidate(Some(c));
        return Err(CUDA_ERROR_CAPTURED_EVENT);
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = event(&st, ev)?;
        captured_event(&mut st, e)?;
        if let Some(err) = st.devices[st.events[&e].dev].sticky {
            return Err(err);
        }
        match st.events[&e].target {
            Some((s, seq)) if !st.reached(s, seq) => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = event(&st, ev)?;
        captured_event(&mut st, e)?;
        let dev = st.events[&e].dev;
        if let Some((s, seq)) = st.events[&e].target {
            wait_until(
                &mut st,
                || format!("cuEventSynchronize of an event of device {dev}"),
                |x| x.reached(s, seq) || x.devices[dev].sticky.is_some(),
            )?;
        }
        st.devices[dev].sticky.map_or(Ok(()), Err)
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = event(&st, ev)?;
        st.events.remove(&e);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    call(|| {
        let st = lock();
        let (a, b) = (event(&st, start)?, event(&st, end)?);
        let (ea, eb) = (&st.events[&a], &st.events[&b]);
        // CU_EVENT_DISABLE_TIMING
        if ea.flags & 2 != 0 || eb.flags & 2 != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        match (ea.time, eb.time) {
            (Some(x), Some(y)) => {
                let d = if y >= x {
                    (y - x).as_secs_f32()
                } else {
                    -(x - y).as_secs_f32()
                };
                out(ms, d * 1000.0)
            }
            _ => Err(CUDA_ERROR_NOT_READY),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    cuEventElapsedTime(ms, start, end)
}

/// `CU_EVENT_WAIT_EXTERNAL`: an event recorded outside a capture may be
/// waited on inside it.
const WAIT_EXTERNAL: c_uint = 1;

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, ev: CUevent, flags: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = event(&st, ev)?;
        let s = st.stream(stream as u64)?;
        if flags & !WAIT_EXTERNAL != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mine = st.capturing(s);
        match (st.events[&e].captured.clone(), mine) {
            // Inside one capture: an edge; a stream not capturing yet
            // joins the capture (a fork).
            (Some((c, nodes)), None | Some(_))
                if st.captures.contains_key(&c) && mine.is_none_or(|m| m == c) =>
            {
                let capture = st.captures.get_mut(&c).expect("checked");
                let tails = capture.tails.entry(s).or_default();
                for n in nodes {
                    if !tails.contains(&n) {
                        tails.push(n);
                    }
                }
                st.streams.get_mut(&s).expect("checked").capture = Some(c);
                Ok(())
            }
            // Recorded in a capture that ended: the graph's event.
            (Some((c, _)), None) if !st.captures.contains_key(&c) => Err(CUDA_ERROR_CAPTURED_EVENT),
            // Recorded in another capture.
            (Some(_), _) => {
                st.invalidate(mine);
                Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            }
            (None, Some(c)) if flags & WAIT_EXTERNAL == 0 => {
                st.invalidate(Some(c));
                Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            }
            (None, Some(c)) => st.capture_node(c, s, Work::WaitEvent(e)),
            (None, None) => {
                let after = st.events[&e].target;
                st.enqueue(s, Work::Empty, after).map(drop)
            }
        }
    })
}

// ---- Capture and graphs ----

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if mode > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if st.streams[&s].legacy {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if st.capturing(s).is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        let id = st.handle(0);
        let graph = st.handle(GRAPH_BASE);
        st.captures.insert(
            id,
            Capture {
                origin: s,
                mode,
                thread: std::thread::current().id(),
                nodes: Vec::new(),
                tails: [(s, Vec::new())].into(),
                invalid: false,
                allocs: Vec::new(),
                graph,
                refs: Default::default(),
            },
        );
        st.streams.get_mut(&s).expect("checked").capture = Some(id);
        Ok(())
    })
}

/// Every node that `tails` depend on, themselves included.
fn ancestors(nodes: &[exec::Node], tails: &[usize]) -> Vec<bool> {
    let mut seen = vec![false; nodes.len()];
    let mut todo: Vec<usize> = tails.to_vec();
    while let Some(n) = todo.pop() {
        if !std::mem::replace(&mut seen[n], true) {
            todo.extend(&nodes[n].deps);
        }
    }
    seen
}

#[no_mangle]
pub extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        let c = st.capturing(s).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        if st.captures[&c].origin != s {
            st.invalidate(Some(c));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        if st.captures[&c].thread != std::thread::current().id() && st.captures[&c].mode != 2 {
            return Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        }
        let capture = st.captures.remove(&c).expect("live");
        for stream in st.streams.values_mut() {
            if stream.capture == Some(c) {
                stream.capture = None;
            }
        }
        let dev = st.streams[&s].dev;
        let joined = ancestors(&capture.nodes, &capture.tails[&s]);
        let unjoined = capture.tails.values().flatten().any(|&n| !joined[n]);
        if capture.invalid || unjoined {
            // The graph goes, and what it owned with it.
            for p in capture.allocs {
                exec::release(&mut st, p);
            }
            user::release(&mut st.user_objects, &capture.refs);
            return Err(if capture.invalid {
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            } else {
                CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            });
        }
        let id = capture.graph;
        st.graphs.insert(
            id,
            Graph {
                dev,
                nodes: Arc::new(capture.nodes),
                allocs: capture.allocs,
                refs: capture.refs,
            },
        );
        out(graph, id as usize as CUgraph)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint) -> CUresult {
    call(|| {
        let st = lock();
        let s = st.stream(stream as u64)?;
        // CU_STREAM_CAPTURE_STATUS_NONE, _ACTIVE, _INVALIDATED
        let v = match st.capturing(s) {
            None => 0,
            Some(c) if st.captures[&c].invalid => 2,
            Some(_) => 1,
        };
        out(status, v)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = st
            .graphs
            .get(&(graph as u64))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let (dev, nodes, refs) = (g.dev, g.nodes.clone(), g.refs.clone());
        // The executable shares the graph's user object references.
        let hold = user::hold(&mut st.user_objects, &refs);
        let id = st.handle(EXEC_BASE);
        st.execs.insert(id, Exec { dev, nodes, hold });
        out(exec, id as usize as CUgraphExec)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        let (dev, nodes, hold) = st
            .execs
            .get(&(exec as u64))
            .map(|e| (e.dev, e.nodes.clone(), e.hold.clone()))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if dev != st.streams[&s].dev {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if st.capturing(s).is_some() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        st.enqueue(s, Work::Graph { nodes, _hold: hold }, None)
            .map(drop)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    call(|| {
        let mut st = lock();
        st.execs
            .remove(&(exec as u64))
            .map(drop)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    call(|| {
        let mut st = lock();
        let g = st
            .graphs
            .remove(&(graph as u64))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        for p in g.allocs {
            exec::release(&mut st, p);
        }
        user::release(&mut st.user_objects, &g.refs);
        Ok(())
    })
}

/// A reference count argument: nonzero and at most `INT_MAX`.
fn ref_count(count: c_uint) -> Res<u32> {
    if count == 0 || count > i32::MAX as c_uint {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(count)
}

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, the flag `cuUserObjectCreate`
/// requires.
const NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const USER_OBJECT_MOVE: c_uint = 1;

#[no_mangle]
pub extern "C" fn cuUserObjectCreate(
    object: *mut CUuserObject,
    ptr: *mut c_void,
    destroy: CUhostFn,
    initial: c_uint,
    flags: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = ref_count(initial)?;
        let destroy = destroy.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != NO_DESTRUCTOR_SYNC || object.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let id = st.handle(USER_OBJECT_BASE);
        st.user_objects.insert(
            id,
            UserObject {
                destroy,
                ptr: ptr as usize,
                refs: count.into(),
                caller: count.into(),
            },
        );
        out(object, id as usize as CUuserObject)
    })
}

/// The user object `object`, whose caller must own `count` references
/// (using more is undefined behaviour: the model refuses it).
fn owned_by_caller(st: &mut State, object: CUuserObject, count: u32) -> Res<&mut UserObject> {
    let o = st
        .user_objects
        .get_mut(&(object as u64))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if o.caller < u64::from(count) {
        crate::report(format_args!(
            "{count} references of user object {:#x} given up, of which the caller owns {} \
             (undefined behaviour)",
            object as u64, o.caller
        ));
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(o)
}

#[no_mangle]
pub extern "C" fn cuUserObjectRetain(object: CUuserObject, count: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = u64::from(ref_count(count)?);
        let o = owned_by_caller(&mut st, object, 0)?;
        o.refs += count;
        o.caller += count;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuUserObjectRelease(object: CUuserObject, count: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = ref_count(count)?;
        owned_by_caller(&mut st, object, count)?.caller -= u64::from(count);
        user::release(&mut st.user_objects, &[(object as u64, count)].into());
        Ok(())
    })
}

/// The user object references of graph `graph`: a graph's, or those of
/// the graph a capture builds.
fn graph_refs(st: &mut State, graph: CUgraph) -> Res<&mut user::Refs> {
    let id = graph as u64;
    if let Some(g) = st.graphs.get_mut(&id) {
        return Ok(&mut g.refs);
    }
    st.captures
        .values_mut()
        .find(|c| c.graph == id)
        .map(|c| &mut c.refs)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

#[no_mangle]
pub extern "C" fn cuGraphRetainUserObject(
    graph: CUgraph,
    object: CUuserObject,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = ref_count(count)?;
        if flags & !USER_OBJECT_MOVE != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        graph_refs(&mut st, graph)?;
        let moved = if flags & USER_OBJECT_MOVE != 0 {
            count
        } else {
            0
        };
        let o = owned_by_caller(&mut st, object, moved)?;
        o.caller -= u64::from(moved);
        o.refs += u64::from(count - moved);
        user::add(graph_refs(&mut st, graph)?, object as u64, count);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuGraphReleaseUserObject(
    graph: CUgraph,
    object: CUuserObject,
    count: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = ref_count(count)?;
        let refs = graph_refs(&mut st, graph)?;
        match refs.get_mut(&(object as u64)) {
            Some(held) if *held >= count => *held -= count,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        refs.retain(|_, held| *held > 0);
        user::release(&mut st.user_objects, &[(object as u64, count)].into());
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut CUgraph,
    dependencies: *mut *const c_void,
    edge_data: *mut *const c_void,
    count: *mut usize,
) -> CUresult {
    call(|| {
        let st = lock();
        let s = st.stream(stream as u64)?;
        if status.is_null() || (!edge_data.is_null() && dependencies.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !dependencies.is_null() {
            crate::report(format_args!(
                "cuStreamGetCaptureInfo: the capture's nodes are not modeled"
            ));
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let dev = st.streams[&s].dev;
        let implicit = st.streams[&s].legacy
            && st
                .streams
                .values()
                .any(|o| o.dev == dev && o.blocking && !o.legacy && o.capture.is_some());
        if implicit {
            return Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        }
        let Some(c) = st.capturing(s) else {
            return out(status, 0);
        };
        let capture = &st.captures[&c];
        if capture.invalid {
            return out(status, 2);
        }
        out(status, 1)?;
        if !id.is_null() {
            out(id, c)?;
        }
        if !graph.is_null() {
            out(graph, capture.graph as usize as CUgraph)?;
        }
        if !count.is_null() {
            out(count, capture.tails.get(&s).map_or(0, Vec::len))?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitValue32_v2(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        let s = st.stream(stream as u64)?;
        if flags & !(exec::WAIT_CONDITIONS | exec::WAIT_FLUSH) != 0 || !addr.is_multiple_of(4) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if flags & exec::WAIT_FLUSH != 0 {
            // CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES is 0 here.
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        // Memory the device reaches: its own, or mapped pinned memory.
        let reached = match st.find(addr, 4) {
            Some((_, a)) => match a.kind {
                Kind::Device => a.dev == dev || st.config().peer_access,
                Kind::PinnedHost { flags } => flags & 0x2 != 0,
                Kind::Mapped { access } => access & (1 << dev) != 0,
            },
            None => false,
        };
        if !reached {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let work = Work::WaitValue { addr, value, flags };
        match st.capturing(s) {
            Some(c) => st.capture_node(c, s, work),
            None => st.enqueue(s, work, None).map(drop),
        }
    })
}

// ---- Modules and kernels ----

/// The fatbin header's magic number.
const FATBIN_MAGIC: u32 = 0xba55_ed50;

#[no_mangle]
pub extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a fatbin starts with a 16-byte header: magic, version,
        // header size, then the size of what follows.
        let (magic, header, body) = unsafe {
            let p = image.cast::<u8>();
            (
                p.cast::<u32>().read_unaligned(),
                u64::from(p.add(6).cast::<u16>().read_unaligned()),
                p.add(8).cast::<u64>().read_unaligned(),
            )
        };
        let fatbin = rccl_device::KERNELS_FATBIN;
        if magic != FATBIN_MAGIC || header + body != fatbin.len() as u64 {
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        // SAFETY: the header says the image has this many bytes.
        let bytes = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), fatbin.len()) };
        // The model runs the committed kernels' host twin: any other image
        // has code it cannot run.
        if bytes != fatbin {
            return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
        }
        let id = st.handle(MODULE_BASE);
        st.modules.insert(id, Module { dev });
        out(module, id as usize as CUmodule)
    })
}

#[no_mangle]
pub extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.current()?;
        if !st.modules.contains_key(&(module as u64)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let (kernel, _, _) = KERNELS
            .iter()
            .find(|(k, _, _)| k.as_bytes() == name)
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        let id = st.handle(FUNCTION_BASE);
        st.functions.insert(
            id,
            Function {
                module: module as u64,
                name: kernel,
            },
        );
        out(f, id as usize as CUfunction)
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    call(|| {
        let mut st = lock();
        st.current()?;
        let m = module as u64;
        st.modules.remove(&m).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        st.functions.retain(|_, f| f.module != m);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    _dynamic_smem: usize,
) -> CUresult {
    call(|| {
        let st = lock();
        st.current()?;
        let func = st
            .functions
            .get(&(f as u64))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let bound = KERNELS
            .iter()
            .find(|k| k.0 == func.name)
            .map_or(1024, |k| k.2);
        // One block per modeled SM, whatever its size.
        out(
            blocks,
            c_int::from(block_size > 0 && block_size as u32 <= bound),
        )
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        let s = st.stream(stream as u64)?;
        let func = st
            .functions
            .get(&(f as u64))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if st.modules[&func.module].dev != dev {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (name, sizes, bound) = *KERNELS
            .iter()
            .find(|k| k.0 == func.name)
            .expect("a known kernel");
        let threads = u64::from(block_x) * u64::from(block_y) * u64::from(block_z);
        let blocks = u64::from(grid_x) * u64::from(grid_y) * u64::from(grid_z);
        if threads == 0 || blocks == 0 || threads > u64::from(bound) || blocks > u64::from(u32::MAX)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if params.is_null() || !extra.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let copied = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let mut words = vec![0u64; size.div_ceil(8)];
                // SAFETY: kernelParams holds one pointer per parameter,
                // each to a value of the parameter's size.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (*params.add(i)).cast::<u8>(),
                        words.as_mut_ptr().cast(),
                        size,
                    )
                };
                words
            })
            .collect();
        let work = Work::Kernel(Kernel {
            name,
            dev,
            blocks: blocks as u32,
            params: copied,
        });
        match st.capturing(s) {
            Some(c) => st.capture_node(c, s, work),
            None => st.enqueue(s, work, None).map(drop),
        }
    })
}
