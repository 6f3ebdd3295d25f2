//! The exported entry points, under the names the driver exports (the
//! versioned names `cuda.h`'s macros map to) and with `cuda.h`'s
//! signatures, a file per group of the Driver API reference.
//! Enumerations arrive as plain integers: a value outside the enumeration
//! is refused, never undefined behaviour.

#![allow(non_snake_case)]

mod capture;
mod context;
mod copy;
mod device;
mod error;
mod event;
mod graph;
mod launch;
mod memory;
mod module;
mod pointer;
mod stream;
mod user_object;
mod virtual_memory;

use cudarc::driver::sys::{CUcontext, CUresult};

use crate::state::CONTEXT_BASE;
use crate::Res;

/// Writes `value` through an out-pointer, refusing null.
fn out<T>(ptr: *mut T, value: T) -> Res<()> {
    if ptr.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's out-pointer of type `T`, not null.
    unsafe { ptr.write(value) };
    Ok(())
}

/// The handle of device `dev`'s primary context.
fn context_handle(dev: usize) -> CUcontext {
    (((CONTEXT_BASE + dev as u64) << 4) as usize) as CUcontext
}
