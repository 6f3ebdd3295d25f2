//! Initialization, version and device management: `cuInit`, the devices
//! and their attributes.

use std::ffi::{c_char, c_int, c_uint};

use cudarc::driver::sys::{CUdevice, CUdevice_attribute as Attr, CUresult};

use super::out;
use crate::call;
use crate::state::lock;
use crate::streams;

use CUresult::*;

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    call(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        streams::init(&mut lock());
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    call(|| out(version, 13000))
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
