//! The correctness suite through the C ABI on device buffers of the
//! emulated GPU, with streams: every collective x datatype x op (PreMulSum
//! and Avg included) x count, in place and out of place, for 1, 2, 3, 4
//! and 8 ranks as threads. Each rank checks its output against the
//! suite's reference (tests/common) and against the same call on host
//! buffers, bit for bit.

mod common;

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{all_cases, check, test_config, Case, CaseBuffers};
use parking_lot::Mutex;
use rccl::device::{self, Device, Kind};
use rccl::{CollKind, Communicator, DataType, RedOp};
use rcclrs::registry::{self, Entry, Slot};
use rcclrs::*;

fn emu() -> &'static dyn Device {
    device::select(Kind::Emu).unwrap()
}

fn last_error(comm: ncclComm_t) -> String {
    // SAFETY: ncclGetLastError never returns NULL.
    unsafe { CStr::from_ptr(ncclGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

/// `nranks` communicators with the suite's settings, as C handles.
fn c_comms(nranks: usize) -> Vec<ncclComm_t> {
    Communicator::init_all_config(nranks, test_config())
        .unwrap()
        .into_iter()
        .map(|comm| {
            let entry = Entry::new(Slot::Ready(comm), true, 0, None);
            registry::insert(entry.clone());
            entry.handle()
        })
        .collect()
}

/// The `ncclRedOp_t` of `op` on `comm` (PreMulSum: created here, with the
/// suite's scalar read at once).
fn c_op(comm: ncclComm_t, op: RedOp, dtype: DataType) -> ncclRedOp_t {
    match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        RedOp::PreMulSum { mut scalar } => {
            let mut created = 0;
            // SAFETY: `scalar` holds one element of `dtype`.
            let rc = unsafe {
                ncclRedOpCreatePreMulSum(
                    &mut created,
                    scalar.as_mut_ptr().cast(),
                    dtype as ncclDataType_t,
                    ncclScalarHostImmediate,
                    comm,
                )
            };
            assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
            created
        }
    }
}

/// Calls the collective of `case` through the C ABI.
unsafe fn c_call(
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
fn to_device(host: &[u8]) -> *mut u8 {
    let dev = emu().alloc(host.len()).unwrap();
    // SAFETY: both ranges hold host.len() bytes.
    unsafe { emu().copy(dev, host.as_ptr(), host.len()) }.unwrap();
    dev
}

fn read_back(dev: *const u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: both ranges hold `len` bytes.
    unsafe { emu().copy(out.as_mut_ptr(), dev, len) }.unwrap();
    out
}

/// Holds `stream` until the returned flag is raised (at most 20 s).
fn gate(stream: cudaStream_t) -> Arc<AtomicBool> {
    let open = Arc::new(AtomicBool::new(false));
    let theirs = open.clone();
    let until = Instant::now() + Duration::from_secs(20);
    emu()
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
/// synchronized) and on host buffers; returns the device output or the
/// first failure.
fn run_case(
    case: &Case,
    comm: ncclComm_t,
    stream: cudaStream_t,
    nranks: usize,
    rank: usize,
) -> Result<(), String> {
    let op = c_op(comm, case.op, case.dtype);
    let mut on_device = CaseBuffers::new(case, nranks, rank);
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
    // SAFETY: synchronizes a live stream.
    if unsafe { rcclrsEmuStreamSynchronize(stream) } != ncclSuccess {
        return Err(format!(
            "{case:?} on rank {rank}: {}",
            last_error(null_mut())
        ));
    }
    let mut async_error = ncclSuccess;
    // SAFETY: a live communicator, a writable result.
    unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
    if async_error != ncclSuccess {
        return Err(format!("{case:?} on rank {rank}: {}", last_error(comm)));
    }
    // SAFETY: the stream ran the call; each copy covers its buffer.
    unsafe {
        emu()
            .copy(on_device.send.as_mut_ptr(), dev_send, on_device.send.len())
            .unwrap();
        emu()
            .copy(on_device.recv.as_mut_ptr(), dev_recv, on_device.recv.len())
            .unwrap();
        emu().free(dev_send).unwrap();
        emu().free(dev_recv).unwrap();
    }
    let mut on_host = CaseBuffers::new(case, nranks, rank);
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

fn suite(nranks: usize) {
    emu();
    let comms = c_comms(nranks);
    let cases = all_cases(nranks, &CollKind::ALL, &DataType::ALL);
    let failures = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for (rank, &comm) in comms.iter().enumerate() {
            let (cases, failures) = (&cases, &failures);
            // Handles cross into the rank's thread as integers.
            let comm = comm as usize;
            s.spawn(move || {
                let comm = comm as ncclComm_t;
                let mut stream: cudaStream_t = null_mut();
                // SAFETY: a writable stream slot.
                assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
                for case in cases {
                    if let Err(msg) = run_case(case, comm, stream, nranks, rank) {
                        failures.lock().push(msg);
                        // SAFETY: this rank stops: its peers' waits end.
                        unsafe { ncclCommAbort(comm) };
                        return;
                    }
                }
                // SAFETY: the stream is idle and no longer used.
                assert_eq!(unsafe { rcclrsEmuStreamDestroy(stream) }, ncclSuccess);
                // SAFETY: a live handle, destroyed once.
                assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
            });
        }
    });
    let failures = failures.into_inner();
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

#[test]
fn one_rank() {
    suite(1);
}

#[test]
fn two_ranks() {
    suite(2);
}

#[test]
fn three_ranks() {
    suite(3);
}

#[test]
fn four_ranks() {
    suite(4);
}

#[test]
fn eight_ranks() {
    suite(8);
}

/// Through the C ABI, outside any group: rank 0's call on device memory
/// returns although rank 1 has not called yet (this thread makes rank 1's
/// call only afterwards: a call that waited for its peer would never
/// return, and fails at its deadline instead); both complete at stream
/// synchronize.
#[test]
fn a_call_returns_before_its_peer_arrives_and_completes_at_synchronize() {
    emu();
    let comms = c_comms(2);
    let count = 1000;
    let streams: Vec<cudaStream_t> = (0..2)
        .map(|_| {
            let mut stream = null_mut();
            // SAFETY: a writable stream slot.
            assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
            stream
        })
        .collect();
    let bufs: Vec<(*mut u8, *mut u8)> = (0..2)
        .map(|r| {
            let values: Vec<u8> = vec![r as u8 + 1; count];
            (to_device(&values), to_device(&vec![0; count]))
        })
        .collect();
    let started = Instant::now();
    for (rank, &(send, recv)) in bufs.iter().enumerate() {
        // SAFETY: device buffers of `count` bytes, never freed.
        let rc = unsafe {
            ncclAllReduce(
                send.cast(),
                recv.cast(),
                count,
                DataType::Uint8 as ncclDataType_t,
                0,
                comms[rank],
                streams[rank],
            )
        };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comms[rank]));
    }
    assert!(started.elapsed() < Duration::from_secs(5), "a call blocked");
    for (rank, &stream) in streams.iter().enumerate() {
        // SAFETY: a live stream.
        assert_eq!(unsafe { rcclrsEmuStreamSynchronize(stream) }, ncclSuccess);
        assert_eq!(read_back(bufs[rank].1, count), vec![3u8; count]);
    }
}
