//! The nccl.h-compatible C ABI of rccl-rs (`librcclrs.so` / `librcclrs.a`).
//!
//! `ffi/include/nccl.h` declares every function of NCCL 2.32's `nccl.h`;
//! this crate defines them all, plus the `pnccl*` profiling aliases NCCL
//! exports. A call on host memory completes before it returns (or at the
//! end of the enclosing group) and ignores its `cudaStream_t`; a call on
//! device memory of the active device (`RCCL_DEVICE`) is enqueued on its
//! stream and returns at once, as NCCL's. `rcclrs_emu.h` declares the
//! emulated GPU's own control calls (`emu.rs`). `docs/C-API.md` lists what
//! each function does here.
//!
//! Every entry point catches panics (returning `ncclInternalError`),
//! checks its arguments, looks its communicator handle up in a registry of
//! live handles (so a destroyed or made-up `ncclComm_t` is reported, not
//! dereferenced), and records a message for `ncclGetLastError`.

// The entry points are C functions: their safety contract is nccl.h's, as
// docs/C-API.md describes, and their names are NCCL's.
#![allow(clippy::missing_safety_doc, non_snake_case, non_upper_case_globals)]

/// Defines a C entry point `ncclX` and its profiling alias `pncclX`.
macro_rules! nccl_api {
    ($(
        $(#[$meta:meta])*
        fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? $body:block
    )*) => {$(
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? $body

        #[doc = concat!("The profiling alias of [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) $(-> $ret)? {
            unsafe { $name($($arg),*) }
        }
    )*};
}

pub mod abi;
pub mod check;
pub mod comms;
pub mod device_api;
pub mod emu;
pub mod error;
pub mod misc;
pub mod ops;
pub mod params;
pub mod registry;
pub mod simulate;
pub mod teams;

pub use abi::*;
pub use comms::*;
pub use emu::*;
pub use misc::*;
pub use ops::*;
pub use params::*;
