//! One case of the correctness suite through the C ABI on device buffers
//! of the active device with a stream, checked against the suite's
//! reference and against the same call on host buffers, bit for bit: what
//! the thread suite (device_suite.rs) and the process suites (ipc.rs,
//! multihost.rs) run.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{check, Case, CaseBuffers};
use rccl::device::{self, Device, Kind};
use rccl::{CollKind, Communicator, DataType, RedOp};
use rcclrs::registry::{self, Entry, Slot};
use rcclrs::*;

pub fn emu() -> &'static dyn Device {
    device::select(Kind::Emu).unwrap()
}

/// The device the cases run on: the CUDA backend where `RCCL_DEVICE=cuda`
/// (over the CUDA driver model in CI), else the emulated GPU.
pub fn device_under_test() -> &'static dyn Device {
    if std::env::var("RCCL_DEVICE").as_deref() != Ok("cuda") {
        return emu();
    }
    let device = device::active().unwrap_or_else(|| panic!("{:?}", device::selection_problem()));
    assert_eq!(device.backend(), "cuda");
    device
}

/// A new stream of the device under test, as a `cudaStream_t`.
pub fn create_stream() -> cudaStream_t {
    device_under_test().create_stream().unwrap().raw() as cudaStream_t
}

/// Destroys a stream of [`create_stream`]; what it holds still runs.
pub fn destroy_stream(stream: cudaStream_t) {
    device_under_test().destroy_stream(stream as usize).unwrap();
}

/// Waits for everything enqueued on `stream` so far (at most a minute);
/// the stream's first failure otherwise.
pub fn synchronize(stream: cudaStream_t) -> Result<(), String> {
    device_under_test()
        .stream(stream as usize)
        .and_then(|s| s.synchronize(Instant::now() + Duration::from_secs(60)))
        .map_err(|e| e.to_string())
}

/// This process's rank on the device under test, joined through the launcher's
/// variables, as a C handle with a stream of its own: (handle, stream,
/// rank, ranks).
pub fn join_from_env() -> (ncclComm_t, cudaStream_t, usize, usize) {
    device_under_test();
    let comm = Communicator::from_env().expect("init from the environment");
    let (rank, nranks) = (comm.rank(), comm.count());
    let entry = Entry::new(Slot::Ready(comm), true, 0, None);
    registry::insert(entry.clone());
    (entry.handle(), create_stream(), rank, nranks)
}

/// Runs `cases` on the joined rank (aborting the communicator at the
/// first failure, so that its peers stop, then panicking with it), then
/// destroys the communicator and the stream.
pub fn run_cases_then_close(
    cases: &[Case],
    comm: ncclComm_t,
    stream: cudaStream_t,
    nranks: usize,
    rank: usize,
) {
    for case in cases {
        if let Err(msg) = run_case(case, comm, stream, nranks, rank) {
            // SAFETY: this rank stops: its peers' waits end.
            unsafe { ncclCommAbort(comm) };
            panic!("{msg}");
        }
    }
    // SAFETY: a live handle, destroyed once.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
    destroy_stream(stream);
}

/// A float sum all-reduce of `count` elements from device `send` into
/// device `recv`, its stream synchronized: whether the call, the stream
/// and the communicator's asynchronous error all say success.
pub fn all_reduce_succeeds(
    comm: ncclComm_t,
    stream: cudaStream_t,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> bool {
    // SAFETY: the caller's device buffers of `count` floats, a live
    // communicator and stream.
    let rc = unsafe { ncclAllReduce(send.cast(), recv.cast(), count, 7, 0, comm, stream) };
    let ran = rc == ncclSuccess && synchronize(stream).is_ok();
    let mut async_error = ncclSuccess;
    // SAFETY: a live communicator, a writable result.
    unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
    ran && async_error == ncclSuccess
}

pub fn last_error(comm: ncclComm_t) -> String {
    // SAFETY: ncclGetLastError never returns NULL.
    unsafe { CStr::from_ptr(ncclGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

/// The `ncclRedOp_t` of `op` on `comm` (PreMulSum: created here, with the
/// suite's scalar read at once, or a device scalar's address).
pub fn c_op(comm: ncclComm_t, op: RedOp, dtype: DataType) -> ncclRedOp_t {
    let premulsum = |scalar: *mut c_void, residence| {
        let mut created = 0;
        // SAFETY: `scalar` holds one element of `dtype`.
        let rc = unsafe {
            ncclRedOpCreatePreMulSum(
                &mut created,
                scalar,
                dtype as ncclDataType_t,
                residence,
                comm,
            )
        };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
        created
    };
    match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        RedOp::PreMulSum { mut scalar } => {
            premulsum(scalar.as_mut_ptr().cast(), ncclScalarHostImmediate)
        }
        RedOp::PreMulSumDevice { scalar } => premulsum(scalar as *mut c_void, ncclScalarDevice),
    }
}

/// Calls the collective of `case` through the C ABI.
pub unsafe fn c_call(
    case: &Case,
    comm: ncclComm_t,
    op: ncclRedOp_t,
    send: *const u8,
    recv: *mut u8,
    stream: cudaStream_t,
) -> ncclResult_t {
    let (s, r): (*const c_void, *mut c_void) = (send.cast(), recv.cast());
    let (n, t, root) = (case.count, case.dtype as ncclDataType_t, case.root as c_int);
    // SAFETY: the caller passes buffers laid out for the case.
    unsafe {
        match case.kind {
            CollKind::AllReduce => ncclAllReduce(s, r, n, t, op, comm, stream),
            CollKind::Broadcast => ncclBroadcast(s, r, n, t, root, comm, stream),
            CollKind::Reduce => ncclReduce(s, r, n, t, op, root, comm, stream),
            CollKind::AllGather => ncclAllGather(s, r, n, t, comm, stream),
            CollKind::ReduceScatter => ncclReduceScatter(s, r, n, t, op, comm, stream),
            CollKind::AllToAll => ncclAlltoAll(s, r, n, t, comm, stream),
            CollKind::Gather => ncclGather(s, r, n, t, root, comm, stream),
            CollKind::Scatter => ncclScatter(s, r, n, t, root, comm, stream),
        }
    }
}

/// A copy of `host` in device memory (at least one byte, so that an
/// empty buffer still has an address).
pub fn to_device(host: &[u8]) -> *mut u8 {
    let device = device_under_test();
    let dev = device.alloc(host.len()).unwrap();
    // SAFETY: both ranges hold host.len() bytes.
    unsafe { device.copy(dev, host.as_ptr(), host.len()) }.unwrap();
    dev
}

pub fn read_back(dev: *const u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: both ranges hold `len` bytes.
    unsafe { device_under_test().copy(out.as_mut_ptr(), dev, len) }.unwrap();
    out
}

/// Holds `stream` until the returned flag is raised (at most 20 s).
pub fn gate(stream: cudaStream_t) -> Arc<AtomicBool> {
    let open = Arc::new(AtomicBool::new(false));
    let theirs = open.clone();
    let until = Instant::now() + Duration::from_secs(20);
    device_under_test()
        .stream(stream as usize)
        .unwrap()
        .enqueue(Box::new(move || {
            while !theirs.load(Ordering::Acquire) && Instant::now() < until {
                std::thread::yield_now();
            }
        }))
        .unwrap();
    open
}

/// Runs `case` on device buffers (enqueued on `stream`, then
/// synchronized) and on host buffers; returns the first failure.
pub fn run_case(
    case: &Case,
    comm: ncclComm_t,
    stream: cudaStream_t,
    nranks: usize,
    rank: usize,
) -> Result<(), String> {
    run_case_of(case, comm, stream, (nranks, rank), CaseBuffers::new, check)
}

/// As [`run_case`], with the buffers `buffers` lays out and the device
/// output checked by `check` (and against the host path's, bit for bit).
pub fn run_case_of(
    case: &Case,
    comm: ncclComm_t,
    stream: cudaStream_t,
    (nranks, rank): (usize, usize),
    buffers: fn(&Case, usize, usize) -> CaseBuffers,
    check: fn(&Case, usize, usize, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let op = c_op(comm, case.op, case.dtype);
    let mut on_device = buffers(case, nranks, rank);
    let (dev_send, dev_recv) = (to_device(&on_device.send), to_device(&on_device.recv));
    let (send, recv) = on_device.pointers_at(case, dev_send, dev_recv);
    // The stream is held while the call is made: the call must only
    // enqueue its work, leaving the device buffers as they were.
    let open = gate(stream);
    // SAFETY: the device buffers mirror the case's host layout and are
    // freed only after the stream is synchronized.
    let rc = unsafe { c_call(case, comm, op, send, recv, stream) };
    let untouched = read_back(dev_recv, on_device.recv.len()) == on_device.recv
        && read_back(dev_send, on_device.send.len()) == on_device.send;
    open.store(true, Ordering::Release);
    if rc != ncclSuccess {
        return Err(format!("{case:?} on rank {rank}: {}", last_error(comm)));
    }
    if !untouched {
        return Err(format!(
            "{case:?} on rank {rank}: the call wrote its device buffers before its stream ran it"
        ));
    }
    if let Err(e) = synchronize(stream) {
        return Err(format!("{case:?} on rank {rank}: {e}"));
    }
    let mut async_error = ncclSuccess;
    // SAFETY: a live communicator, a writable result.
    unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
    if async_error != ncclSuccess {
        return Err(format!("{case:?} on rank {rank}: {}", last_error(comm)));
    }
    // SAFETY: the stream ran the call; each copy covers its buffer.
    unsafe {
        let device = device_under_test();
        device
            .copy(on_device.send.as_mut_ptr(), dev_send, on_device.send.len())
            .unwrap();
        device
            .copy(on_device.recv.as_mut_ptr(), dev_recv, on_device.recv.len())
            .unwrap();
        device.free(dev_send).unwrap();
        device.free(dev_recv).unwrap();
    }
    let mut on_host = buffers(case, nranks, rank);
    let bases = (on_host.send.as_mut_ptr(), on_host.recv.as_mut_ptr());
    let (send, recv) = on_host.pointers_at(case, bases.0, bases.1);
    // SAFETY: host buffers laid out for the case, alive for the call,
    // which completes before it returns.
    let rc = unsafe { c_call(case, comm, op, send, recv, stream) };
    if rc != ncclSuccess {
        return Err(format!(
            "{case:?} on rank {rank} (host): {}",
            last_error(comm)
        ));
    }
    if op >= ncclNumOps {
        // SAFETY: an op created above.
        unsafe { ncclRedOpDestroy(op, comm) };
    }
    let device_out = on_device.output(case, nranks, rank);
    check(case, nranks, rank, device_out)?;
    if device_out != on_host.output(case, nranks, rank) {
        return Err(format!(
            "{case:?} on rank {rank}: the device output differs from the host path's"
        ));
    }
    Ok(())
}
