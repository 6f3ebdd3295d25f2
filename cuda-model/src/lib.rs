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
//! - a block is resident on a modeled SM while the SM has room for its
//!   threads, registers (as many as its kernel's launch bound allows) and
//!   shared memory, with compute capability 9.0's limits per SM, which
//!   `cuOccupancyMaxActiveBlocksPerMultiprocessor` counts too
//!   (`occupancy.rs`): a design that needs more co-resident blocks hangs,
//!   and the model says so at its deadline;
//! - a kernel touching memory of another device faults, and a fault is
//!   sticky: every later call of the context returns it;
//! - cuMem mappings are inaccessible until `cuMemSetAccess`, with a
//!   granularity of 2 MiB (`api/virtual_memory.rs`);
//! - an exported POSIX-fd handle imports only as a descriptor of the
//!   exported open file itself (passed with `SCM_RIGHTS`, inherited or
//!   `dup`ed): a reopen of `/proc/<pid>/fd/<fd>` is refused with
//!   `CUDA_ERROR_INVALID_VALUE`, as a driver's export is no named file.
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
//! call left to run late, so that work racing with it shows),
//! `RCCL_CUDA_MODEL_FAULT=kernel[:n]` (the n-th launch of `kernel`, the
//! first by default, faults with `CUDA_ERROR_ILLEGAL_ADDRESS`).
//!
//! Tests read one thing the driver does not export:
//! `rccl_cuda_model_launches(name, count)` writes to `count` how many
//! kernels named `name` (NUL-terminated) started running in the process
//! so far, launched by `cuLaunchKernel` or by a graph's launch (each
//! kernel node once per launch); it returns `CUDA_ERROR_INVALID_VALUE`
//! for a null pointer (`launches.rs`).
//!
//! Layout: `api/` holds the entry points, a file per group of the Driver
//! API reference; they act on `state.rs` (one lock over devices,
//! contexts, allocations, streams, events, captures, graphs, modules;
//! `vmm.rs` its cuMem part) and enqueue `work.rs`'s operations, which
//! each stream's worker (`streams.rs`) runs through `exec.rs`. User
//! objects (`user.rs`) keep their own table and destructor thread. No
//! module depends on one that depends on it.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod api;
mod exec;
mod launches;
mod occupancy;
mod state;
mod streams;
mod user;
mod vmm;
mod work;

use std::cell::Cell;

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

thread_local! {
    /// Whether this thread runs a host function or a user object's
    /// destructor, which may not call CUDA.
    static IN_HOST_FUNCTION: Cell<bool> = const { Cell::new(false) };
}

/// An entry point's body, refused from inside a host function (which may
/// not call CUDA).
fn call(body: impl FnOnce() -> Res<()>) -> CUresult {
    if IN_HOST_FUNCTION.with(Cell::get) {
        report(format_args!(
            "a host function called the driver (CUDA_ERROR_NOT_PERMITTED)"
        ));
        return CUresult::CUDA_ERROR_NOT_PERMITTED;
    }
    entry(body)
}

/// Runs the program's host function or destructor `f`: its calls of the
/// driver are refused meanwhile.
fn as_host_function(f: impl FnOnce()) {
    IN_HOST_FUNCTION.with(|h| h.set(true));
    f();
    IN_HOST_FUNCTION.with(|h| h.set(false));
}

/// Says what the model saw that a GPU would not report (a hang, a fault).
fn report(what: std::fmt::Arguments) {
    eprintln!("rccl cuda model: {what}");
}
