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
//!
//! # Pointers from C
//!
//! The entry points take raw pointers on nccl.h's terms, and their caller
//! vouches for what cannot be checked: an out-argument that is not NULL
//! is writable memory of its type; a struct argument (`ncclConfig_t`,
//! `ncclSimInfo_t`, `ncclUniqueId`, ...) that is not NULL is initialized,
//! as far as its `size` field says where it has one; a `const char *` is
//! a NUL-terminated string; an array holds the count passed with it; a
//! buffer holds its call's elements until the call completes (on device
//! memory: until its stream ran it). What can be checked is checked
//! first: NULL ([`check::non_null`]), NULL and alignment of out-arguments
//! ([`check::write_out`]), the `size` and `magic` of structs. Each
//! `unsafe` block's `SAFETY:` comment names the arguments it relies on.

// The entry points are C functions: their safety contract is nccl.h's, as
// docs/C-API.md describes, and their names are NCCL's.
#![allow(clippy::missing_safety_doc, non_snake_case, non_upper_case_globals)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

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
            // SAFETY: the alias's caller vouches for the arguments as the
            // entry point's caller does: they are passed on unchanged.
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
