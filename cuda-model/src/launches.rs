//! The launch counter tests read: an export of the model only, not of the
//! driver (the crate's documentation).

use std::ffi::{c_char, CStr};

use cudarc::driver::sys::CUresult;

use crate::entry;
use crate::state::lock;

/// Writes to `count` how many kernels named `name` started running in
/// this process so far.
#[no_mangle]
pub extern "C" fn rccl_cuda_model_launches(name: *const c_char, count: *mut u64) -> CUresult {
    entry(|| {
        if name.is_null() || count.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated name, not null.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let launched = lock()
            .launches
            .iter()
            .find(|(kernel, _)| kernel.as_bytes() == name)
            .map_or(0, |(_, &n)| n);
        // SAFETY: the caller's out-pointer, not null.
        unsafe { count.write(launched) };
        Ok(())
    })
}
