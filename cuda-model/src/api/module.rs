//! Module management: the committed fatbin and its kernels.

use std::ffi::{c_char, c_void, CStr};

use cudarc::driver::sys::{CUfunction, CUmodule, CUresult};

use super::out;
use crate::call;
use crate::exec::kernel_spec;
use crate::state::{lock, Function, Module, FUNCTION_BASE, MODULE_BASE};

use CUresult::*;

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
        let kernel = std::str::from_utf8(name)
            .ok()
            .and_then(kernel_spec)
            .ok_or(CUDA_ERROR_NOT_FOUND)?
            .name;
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
