//! Memsets and copies, synchronous (on the legacy stream, returning as
//! the API's synchronization rules say) and in stream order.

use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream};

use crate::state::{lock, Kind, State};
use crate::work::Work;
use crate::{call, report, Res};

use CUresult::*;

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
            report(format_args!(
                "memory of device {d} used from a context of device {dev} (CUDA_ERROR_INVALID_VALUE)"
            ));
            Err(CUDA_ERROR_INVALID_VALUE)
        }
        _ => Ok(()),
    }
}

/// The current device and the stream a memset or copy runs on: `stream`,
/// or for a synchronous call (`None`) the device's legacy stream, after
/// invalidating the captures such a call violates.
fn device_and_stream(st: &mut State, stream: Option<CUstream>) -> Res<(usize, u64)> {
    let dev = st.current()?;
    let s = match stream {
        Some(raw) => st.stream(raw as u64)?,
        None => {
            st.unsafe_call()?;
            st.devices[dev].legacy
        }
    };
    Ok((dev, s))
}

/// A copy; `stream` is `None` for the synchronous calls, which run on
/// the legacy stream and return as the API's synchronization rules say.
fn copy(dst: u64, src: u64, bytes: usize, stream: Option<CUstream>) -> Res<()> {
    let mut st = lock();
    let (dev, s) = device_and_stream(&mut st, stream)?;
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
    let (dev, s) = device_and_stream(&mut st, stream)?;
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
