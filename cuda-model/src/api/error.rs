//! Error handling: the name and text of a `CUresult`.

use std::ffi::{c_char, CStr};

use cudarc::driver::sys::CUresult;

use super::out;
use crate::entry;

use CUresult::*;

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
