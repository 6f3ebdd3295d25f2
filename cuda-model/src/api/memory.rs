//! Memory management: device and page-locked host memory, allocated and
//! freed synchronously or in stream order, and address ranges.

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream};

use super::out;
use crate::state::{lock, Kind, State};
use crate::work::Work;
use crate::{call, Res};

use CUresult::*;

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
        let p = st.allocate(bytes, Kind::Device, dev)?;
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
    st.release(ptr);
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
        let p = st.allocate(bytes, Kind::PinnedHost { flags }, dev)?;
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
        let p = st.allocate(bytes, Kind::Device, dev)?;
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
