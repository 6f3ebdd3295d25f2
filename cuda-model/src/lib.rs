//! A strict model of the CUDA driver, loaded in place of `libcuda.so.1`.
//!
//! Memory is host memory, "kernels" of the committed fatbin run as their
//! host twin (rccl-device's `twin`) on threads, and every call follows
//! the Driver API documentation (the comments of CUDA 13.0's `cuda.h`).
//! Where the driver may do one of several things, the model does the one
//! most likely to expose a caller's mistake:
//!
//! - synchronous `cuMemset*` and `cuMemcpy*` to device memory take effect
//!   after the call returns, in the legacy default stream's order;
//! - a pageable source is staged at the call and written later;
//! - `cuMemAlloc`, `cuMemFree`, `cuMemHostAlloc`, `cuMemFreeHost` wait for
//!   every kernel launched before them on the device;
//! - fresh device memory holds garbage, not zeros;
//! - one block per modeled SM is resident at a time: a design that needs
//!   more co-resident blocks hangs, and the model says so at its deadline;
//! - a kernel touching memory of another device faults, and a fault is
//!   sticky: every later call of the context returns it;
//! - cuMem mappings are inaccessible until `cuMemSetAccess`, with a
//!   granularity of 2 MiB (vmm.rs).
//!
//! Switches (environment, read at `cuInit`):
//! `RCCL_CUDA_MODEL_DEVICES` (2), `RCCL_CUDA_MODEL_SMS` (4 per device),
//! `RCCL_CUDA_MODEL_DEADLINE_MS` (20000: how long a wait that would hang
//! on a GPU lasts before the model reports it and fails the call with
//! `CUDA_ERROR_LAUNCH_TIMEOUT`), `RCCL_CUDA_MODEL_SYNC_COPIES=1`
//! (synchronous memsets and copies complete before they return),
//! `RCCL_CUDA_MODEL_PEER_ACCESS=1` (memory of any device is usable from
//! every context), `RCCL_CUDA_MODEL_ALLOC_WAITS=0` (allocation and free
//! do not wait for kernels), `RCCL_CUDA_MODEL_LATE_MS` (0: how long the
//! legacy stream pauses before each memset or copy that a synchronous
//! call left to run late, so that work racing with it shows), `RCCL_CUDA_MODEL_FAULT=kernel[:n]` (the n-th launch of
//! `kernel`, the first by default, faults with
//! `CUDA_ERROR_ILLEGAL_ADDRESS`).

#![deny(clippy::undocumented_unsafe_blocks)]

mod api;
mod exec;
mod state;
mod user;
mod vmm;

use cudarc::driver::sys::CUresult;

/// A driver call's outcome: `Err` holds the `CUresult` it returns.
type Res<T> = Result<T, CUresult>;

/// Runs an entry point's body: its error as the `CUresult`, and a panic
/// as `CUDA_ERROR_UNKNOWN` rather than across the C boundary.
fn entry(body: impl FnOnce() -> Res<()>) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUresult::CUDA_ERROR_UNKNOWN,
    }
}

/// Says what the model saw that a GPU would not report (a hang, a fault).
fn report(what: std::fmt::Arguments) {
    eprintln!("rccl cuda model: {what}");
}
