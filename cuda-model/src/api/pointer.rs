//! Unified addressing: what the driver answers of a pointer.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUdeviceptr, CUpointer_attribute as Ptr, CUresult};

use super::{context_handle, out};
use crate::state::{lock, Kind, State};
use crate::{call, Res};

use CUresult::*;

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
