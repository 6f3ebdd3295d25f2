//! The CUDA backend (`RCCL_DEVICE=cuda`), unchanged, over the CUDA driver
//! model (cuda-model/): each case runs in a child process whose library
//! path starts with a folder where `libcuda.so.1` and `libcuda.so` are the
//! model, as the driver would be on a GPU machine.

#[path = "common/children.rs"]
mod children;
mod common;
#[path = "common/driver_model.rs"]
mod driver_model;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::test_config;
use driver_model::{
    child_on_the_model, driver_folder, over_the_model, over_the_model_in, run_if_the_child, RAN,
};
use rccl::device::{self, Device};
use rccl::Communicator;
use rcclrs::registry::{self, Entry, Slot};
use rcclrs::*;

fn cuda() -> &'static dyn Device {
    let device = device::active().unwrap_or_else(|| panic!("{:?}", device::selection_problem()));
    assert_eq!(device.backend(), "cuda");
    device
}

#[test]
fn the_cuda_backend_opens_on_the_model_and_moves_bytes() {
    over_the_model(
        "the_cuda_backend_opens_on_the_model_and_moves_bytes",
        &[],
        || {
            let device = cuda();
            assert!(
                device.label().contains("rccl CUDA model 0"),
                "{}",
                device.label()
            );
            let host: Vec<u8> = (0..64).collect();
            let dev = device.alloc(64).unwrap();
            assert!(device.classify(dev).unwrap().is_device());
            // SAFETY: both ranges hold 64 bytes.
            unsafe { device.copy(dev, host.as_ptr(), 64) }.unwrap();
            let mut back = vec![0u8; 64];
            // SAFETY: as above.
            unsafe { device.copy(back.as_mut_ptr(), dev, 64) }.unwrap();
            assert_eq!(back, host);
        },
    );
}

/// How a rank makes its all-reduce: (rank, communicator, stream, send,
/// recv, count); returns the call's result.
type Call = fn(usize, ncclComm_t, cudaStream_t, *const u8, *mut u8, usize) -> ncclResult_t;

fn plain_all_reduce(
    _rank: usize,
    comm: ncclComm_t,
    stream: cudaStream_t,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> ncclResult_t {
    // SAFETY: device buffers of `count` floats, a live communicator and
    // stream.
    unsafe { ncclAllReduce(send.cast(), recv.cast(), count, 7, 0, comm, stream) }
}

/// Two ranks as threads on device 0, a stream each: each makes its float
/// sum all-reduce with `call`, synchronizes, and checks the sum.
fn two_ranks_all_reduce(call: Call) {
    two_ranks_all_reduce_with(test_config(), call, 1.0)
}

/// As [`two_ranks_all_reduce`], the sum expected `scale` times larger.
fn two_ranks_all_reduce_scaled(call: Call, scale: f32) {
    two_ranks_all_reduce_with(test_config(), call, scale)
}

/// Communicators of `nranks` ranks of this process with `config`, as C
/// handles (integers, to cross into threads).
fn c_communicators(nranks: usize, config: rccl::Config) -> Vec<usize> {
    Communicator::init_all_config(nranks, config)
        .unwrap()
        .into_iter()
        .map(|comm| {
            let entry = Entry::new(Slot::Ready(comm), true, 0, None);
            registry::insert(entry.clone());
            entry.handle() as usize
        })
        .collect()
}

fn two_ranks_all_reduce_with(config: rccl::Config, call: Call, scale: f32) {
    let device = cuda();
    let count = 1024;
    let comms = c_communicators(2, config);
    let ready = &std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for (rank, &comm) in comms.iter().enumerate() {
            s.spawn(move || {
                let values: Vec<u8> = (0..count)
                    .flat_map(|i| ((rank * 1000 + i) as f32).to_le_bytes())
                    .collect();
                let send = device.alloc(values.len()).unwrap();
                let recv = device.alloc(values.len()).unwrap();
                // SAFETY: both ranges hold the values' bytes.
                unsafe { device.copy(send, values.as_ptr(), values.len()) }.unwrap();
                // A stream per rank: ranks sharing one would wait for
                // each other's kernels in one queue.
                let own = device.create_stream().unwrap();
                let comm = comm as ncclComm_t;
                // Every rank's buffers are ready before any call.
                ready.wait();
                let rc = call(rank, comm, own.raw() as cudaStream_t, send, recv, count);
                assert_eq!(rc, ncclSuccess, "rank {rank}: {}", last_error(comm));
                own.synchronize(Instant::now() + Duration::from_secs(30))
                    .unwrap();
                let mut async_error = ncclSuccess;
                // SAFETY: a live communicator, a writable result.
                unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
                assert_eq!(
                    async_error,
                    ncclSuccess,
                    "rank {rank}: {}",
                    last_error(comm)
                );
                let mut out = vec![0u8; values.len()];
                // SAFETY: both ranges hold the values' bytes.
                unsafe { device.copy(out.as_mut_ptr(), recv, out.len()) }.unwrap();
                for (i, got) in out.chunks(4).enumerate() {
                    let want = (1000 + 2 * i) as f32 * scale;
                    let got = f32::from_le_bytes(got.try_into().unwrap());
                    assert_eq!(got, want, "rank {rank} element {i}");
                }
            });
        }
    });
}

fn last_error(comm: ncclComm_t) -> String {
    // SAFETY: ncclGetLastError never returns NULL.
    unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

/// The smoke test: a collective through the C ABI on device memory, its
/// kernels run by the model with its strict defaults (allocation waits
/// for kernels, synchronous memsets and copies land late).
#[test]
fn an_all_reduce_on_device_memory_through_the_c_abi() {
    over_the_model(
        "an_all_reduce_on_device_memory_through_the_c_abi",
        &[],
        || two_ranks_all_reduce(plain_all_reduce),
    );
}

/// Rank 1 makes its first call once rank 0's kernel waits for it.
fn second_rank_calls_late(
    rank: usize,
    comm: ncclComm_t,
    stream: cudaStream_t,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> ncclResult_t {
    if rank == 1 {
        std::thread::sleep(Duration::from_millis(300));
    }
    plain_all_reduce(rank, comm, stream, send, recv, count)
}

// What the model exposes of a backend's mistakes: each test states what
// CUDA promises. Ignored ones wait for their fix (run them with
// `--ignored`).

/// A rank's first call comes while the other rank's kernel waits for it:
/// nothing on its way may wait for running kernels (`cuMemAlloc`,
/// `cuMemFree`, `cuMemHostAlloc` may), or the two wait for each other.
#[test]
fn allocation_on_the_call_path_never_waits_for_the_other_ranks_kernel() {
    over_the_model(
        "allocation_on_the_call_path_never_waits_for_the_other_ranks_kernel",
        &[("RCCL_CUDA_MODEL_DEADLINE_MS", "3000")],
        || two_ranks_all_reduce(second_rank_calls_late),
    );
}

/// Synchronous memsets and copies to device memory land 200 ms late on
/// the legacy stream: zeroing and uploads must be ordered with the
/// kernels that read them by other means (the FIFOs, scratch and abort
/// words read as set otherwise).
#[test]
fn zeroing_and_uploads_are_ordered_with_the_kernels() {
    over_the_model(
        "zeroing_and_uploads_are_ordered_with_the_kernels",
        &[("RCCL_CUDA_MODEL_LATE_MS", "200")],
        || two_ranks_all_reduce(plain_all_reduce),
    );
}

/// A thread without a current context classifies device memory as device
/// memory (the backend makes its context current).
#[test]
fn classify_on_a_thread_without_a_context() {
    over_the_model("classify_on_a_thread_without_a_context", &[], || {
        let device = cuda();
        // An address crosses into the thread as an integer.
        let dev = device.alloc(64).unwrap() as usize;
        std::thread::spawn(move || {
            let memory = cuda().classify(dev as *const u8).unwrap();
            assert!(memory.is_device(), "device memory classified as {memory}");
        })
        .join()
        .unwrap();
    });
}

/// A driver error while classifying is an error, never "host memory":
/// here the device's context is gone (released by the application).
#[test]
fn classify_reports_a_driver_error() {
    over_the_model("classify_reports_a_driver_error", &[], || {
        let device = cuda();
        let dev = device.alloc(64).unwrap();
        let release: unsafe extern "C" fn(i32) -> i32 = driver_fn(c"cuDevicePrimaryCtxRelease_v2");
        // SAFETY: releases the primary context the backend retained.
        assert_eq!(unsafe { release(0) }, 0);
        let answer = device.classify(dev);
        let error = answer.expect_err("a classification without a context");
        assert!(
            error
                .to_string()
                .contains("CUDA_ERROR_CONTEXT_IS_DESTROYED"),
            "{error}"
        );
    });
}

/// The model's driver entry point `name`.
fn driver_fn<T>(name: &std::ffi::CStr) -> T {
    // SAFETY: dlopen of the driver the backend opened (the model); dlsym
    // of a NUL-terminated name, of the type the caller names.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!lib.is_null());
        let f = libc::dlsym(lib, name.as_ptr());
        assert!(!f.is_null(), "{name:?}");
        std::mem::transmute_copy(&f)
    }
}

/// How many times the captured all-reduce is replayed.
const REPLAYS: usize = 100;

/// An ordinary call, the call captured in a graph (relaxed mode) and the
/// graph replayed [`REPLAYS`] times, each replay into a cleared output
/// and checked, the graph destroyed, then an ordinary call again.
fn captured_all_reduce(
    rank: usize,
    comm: ncclComm_t,
    stream: cudaStream_t,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> ncclResult_t {
    type P = *mut std::ffi::c_void;
    let begin: unsafe extern "C" fn(P, u32) -> i32 = driver_fn(c"cuStreamBeginCapture_v2");
    let end: unsafe extern "C" fn(P, *mut P) -> i32 = driver_fn(c"cuStreamEndCapture");
    let instantiate: unsafe extern "C" fn(*mut P, P, u64) -> i32 =
        driver_fn(c"cuGraphInstantiateWithFlags");
    let launch: unsafe extern "C" fn(P, P) -> i32 = driver_fn(c"cuGraphLaunch");
    let clear: unsafe extern "C" fn(u64, u8, usize, P) -> i32 = driver_fn(c"cuMemsetD8Async");
    let sync: unsafe extern "C" fn(P) -> i32 = driver_fn(c"cuStreamSynchronize");
    let destroy_exec: unsafe extern "C" fn(P) -> i32 = driver_fn(c"cuGraphExecDestroy");
    let destroy_graph: unsafe extern "C" fn(P) -> i32 = driver_fn(c"cuGraphDestroy");
    let device = cuda();
    // The capture calls below are the application's own: device 0's
    // context is current on this thread, as an application makes it.
    make_current(0);
    let s = stream.cast();
    let rc = plain_all_reduce(rank, comm, stream, send, recv, count);
    if rc != ncclSuccess {
        return rc;
    }
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the model's capture and graph calls on the rank's live
    // stream and its device buffers of `count` floats.
    unsafe {
        assert_eq!(begin(s, 2), 0, "cuStreamBeginCapture (relaxed)");
        let rc = plain_all_reduce(rank, comm, stream, send, recv, count);
        assert_eq!(end(s, &mut graph), 0, "cuStreamEndCapture");
        if rc != ncclSuccess {
            return rc;
        }
        assert_eq!(instantiate(&mut exec, graph, 0), 0);
        for replay in 0..REPLAYS {
            assert_eq!(clear(recv as u64, 0, count * 4, s), 0, "cuMemsetD8Async");
            assert_eq!(launch(exec, s), 0, "cuGraphLaunch");
            assert_eq!(
                sync(s),
                0,
                "rank {rank}: replay {replay}: cuStreamSynchronize"
            );
            let mut out = vec![0u8; count * 4];
            device.copy(out.as_mut_ptr(), recv, out.len()).unwrap();
            for (i, got) in out.chunks(4).enumerate() {
                let got = f32::from_le_bytes(got.try_into().unwrap());
                assert_eq!(
                    got,
                    (1000 + 2 * i) as f32,
                    "rank {rank}: replay {replay}: element {i}"
                );
            }
        }
        assert_eq!(destroy_exec(exec), 0);
        assert_eq!(destroy_graph(graph), 0);
    }
    // An ordinary call after the capture.
    plain_all_reduce(rank, comm, stream, send, recv, count)
}

#[test]
fn a_collective_captured_in_a_graph_and_replayed() {
    over_the_model("a_collective_captured_in_a_graph_and_replayed", &[], || {
        two_ranks_all_reduce(captured_all_reduce)
    });
}

/// Makes device `ordinal`'s primary context current on this thread
/// through the driver (the model), as an application does before it
/// creates its communicator.
fn make_current(ordinal: i32) {
    type P = *mut std::ffi::c_void;
    let init: unsafe extern "C" fn(u32) -> i32 = driver_fn(c"cuInit");
    let retain: unsafe extern "C" fn(*mut P, i32) -> i32 = driver_fn(c"cuDevicePrimaryCtxRetain");
    let set: unsafe extern "C" fn(P) -> i32 = driver_fn(c"cuCtxSetCurrent");
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the model's entry points with valid arguments.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(retain(&mut ctx, ordinal), 0);
        assert_eq!(set(ctx), 0);
    }
}

/// The backend opened on device 1 (current when it opened) allocates
/// there from every thread, and leaves each thread's own context as it
/// was.
#[test]
fn a_device_opened_on_device_1_allocates_there_from_every_thread() {
    over_the_model(
        "a_device_opened_on_device_1_allocates_there_from_every_thread",
        &[],
        || {
            make_current(1);
            let device = cuda();
            assert!(device.label().starts_with("[cuda 1]"), "{}", device.label());
            std::thread::spawn(|| {
                let device = cuda();
                let memory = device.classify(device.alloc(64).unwrap()).unwrap();
                assert_eq!(
                    memory,
                    rccl::device::Memory::Device {
                        backend: "cuda",
                        index: 1
                    },
                    "a helper thread's allocation"
                );
                assert_eq!(current_context(), 0, "the thread's context after the calls");
            })
            .join()
            .unwrap();
            make_current(0);
            device.alloc(64).unwrap();
            assert_eq!(current_device(), 0, "the caller's context after the calls");
        },
    );
}

/// The calling thread's current context (0 for none).
fn current_context() -> usize {
    let get: unsafe extern "C" fn(*mut usize) -> i32 = driver_fn(c"cuCtxGetCurrent");
    let mut context = 0;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { get(&mut context) }, 0);
    context
}

/// The device of the calling thread's current context.
fn current_device() -> i32 {
    let get: unsafe extern "C" fn(*mut i32) -> i32 = driver_fn(c"cuCtxGetDevice");
    let mut device = -1;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { get(&mut device) }, 0);
    device
}

/// A communicator on device 1: its all-reduce runs there.
#[test]
fn an_all_reduce_on_device_1() {
    over_the_model("an_all_reduce_on_device_1", &[], || {
        make_current(1);
        assert!(cuda().label().starts_with("[cuda 1]"));
        two_ranks_all_reduce(plain_all_reduce);
    });
}

/// A buffer of another device than the communicators' is refused, the
/// error naming both devices.
#[test]
fn a_buffer_on_another_device_is_refused() {
    over_the_model("a_buffer_on_another_device_is_refused", &[], || {
        let device = cuda();
        assert!(device.label().starts_with("[cuda 0]"));
        let comm = Communicator::init_all_config(1, test_config())
            .unwrap()
            .pop()
            .unwrap();
        let entry = Entry::new(Slot::Ready(comm), true, 0, None);
        registry::insert(entry.clone());
        let comm = entry.handle();
        let own = device.create_stream().unwrap();
        make_current(1);
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = driver_fn(c"cuMemAlloc_v2");
        let (mut send, mut recv) = (0u64, 0u64);
        // SAFETY: valid out-pointers, device 1's context current.
        unsafe {
            assert_eq!(alloc(&mut send, 4096), 0);
            assert_eq!(alloc(&mut recv, 4096), 0);
        }
        // SAFETY: a live communicator and stream; the buffers hold 1024
        // floats.
        let rc = unsafe {
            ncclAllReduce(
                send as *const _,
                recv as *mut _,
                1024,
                7,
                0,
                comm,
                own.raw() as cudaStream_t,
            )
        };
        assert_eq!(rc, ncclInvalidArgument);
        let text = last_error(comm);
        assert!(
            text.contains("cuda device 1") && text.contains("cuda device 0"),
            "{text}"
        );
    });
}

fn faulting_all_reduce(
    rank: usize,
    comm: ncclComm_t,
    stream: &dyn rccl_device::Stream,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> ncclResult_t {
    // The launch faults (RCCL_CUDA_MODEL_FAULT); the communicator must
    // say so within a second of the stream, whatever the call answered.
    let _ = plain_all_reduce(rank, comm, stream.raw() as cudaStream_t, send, recv, count);
    // The model runs the kernel, and so faults, when its stream reaches
    // it: later on a loaded machine, which is no part of the report's
    // path. The second starts when the stream tells the fault.
    let told = stream.synchronize(Instant::now() + Duration::from_secs(30));
    assert!(told.is_err(), "rank {rank}: the stream did not fail");
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let mut async_error = ncclSuccess;
        // SAFETY: a live communicator, a writable result.
        unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
        if async_error != ncclSuccess && async_error != ncclInProgress {
            // Finalize reports the failure at once, and the
            // communicator can be destroyed.
            let finalized = Instant::now();
            // SAFETY: a live communicator.
            let rc = unsafe { ncclCommFinalize(comm) };
            let took = finalized.elapsed();
            assert_ne!(
                rc, ncclSuccess,
                "rank {rank}: ncclCommFinalize after a fault"
            );
            assert!(
                took < Duration::from_secs(5),
                "rank {rank}: ncclCommFinalize took {took:?}"
            );
            let destroyed = Instant::now();
            // SAFETY: a live communicator, destroyed once.
            unsafe { ncclCommDestroy(comm) };
            let took = destroyed.elapsed();
            assert!(
                took < Duration::from_secs(5),
                "rank {rank}: ncclCommDestroy took {took:?}"
            );
            return async_error;
        }
        assert!(
            Instant::now() < until,
            "rank {rank}: no asynchronous error 1 s after the stream failed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Two ranks whose launches fault: each must see an asynchronous error.
fn two_ranks_fault() {
    let device = cuda();
    let comms = c_communicators(2, test_config());
    // Every rank's buffers and stream are made before the first launch
    // faults (the fault fails every later call of the context).
    let ready = &std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for (rank, &comm) in comms.iter().enumerate() {
            s.spawn(move || {
                let (send, recv) = (device.alloc(4096).unwrap(), device.alloc(4096).unwrap());
                let own = device.create_stream().unwrap();
                ready.wait();
                faulting_all_reduce(rank, comm as ncclComm_t, own.as_ref(), send, recv, 1024);
            });
        }
    });
}

#[test]
fn a_kernel_fault_poisons_the_communicator() {
    over_the_model(
        "a_kernel_fault_poisons_the_communicator",
        &[("RCCL_CUDA_MODEL_FAULT", "rccl_run_work")],
        two_ranks_fault,
    );
}

/// Rank 1's launch faults before rank 0 calls: rank 0's call cannot reach
/// the failed context, and rank 1 waits for its part, so its communicator
/// fails too (the order a loaded machine may give [`two_ranks_fault`]).
fn a_call_after_the_fault() {
    let device = cuda();
    let comms = c_communicators(2, test_config());
    // Made before the fault, which fails every later call of the context.
    let ranks: Vec<_> = comms
        .iter()
        .map(|_| {
            let (send, recv) = (device.alloc(4096).unwrap(), device.alloc(4096).unwrap());
            (send, recv, device.create_stream().unwrap())
        })
        .collect();
    for rank in [1, 0] {
        let (send, recv, stream) = &ranks[rank];
        faulting_all_reduce(
            rank,
            comms[rank] as ncclComm_t,
            stream.as_ref(),
            *send,
            *recv,
            1024,
        );
    }
}

#[test]
fn a_call_after_a_kernel_fault_fails_its_communicator() {
    over_the_model(
        "a_call_after_a_kernel_fault_fails_its_communicator",
        &[("RCCL_CUDA_MODEL_FAULT", "rccl_run_work")],
        a_call_after_the_fault,
    );
}

/// The process loads one driver library, `libcuda.so.1`, even where
/// `libcuda.so` is another file (as the toolkit's stub is).
#[test]
fn one_driver_library_is_loaded() {
    over_the_model_in("one_driver_library_is_loaded", &[], true, || {
        let device = cuda();
        device.alloc(64).unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mut drivers: Vec<&str> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            // The link resolves to the model's file, the copy stays.
            .filter(|p| p.contains("cuda-model-driver-") || p.ends_with("librccl_cuda_model.so"))
            .collect();
        drivers.sort();
        drivers.dedup();
        assert_eq!(drivers.len(), 1, "driver libraries loaded: {drivers:?}");
    });
}

/// The two rendezvous ports of [`over_the_model_ranks`]' children.
const PORTS: &str = "CUDA_MODEL_PORTS";

/// Runs `body` in two child processes on the model (each its own driver,
/// as processes have), with `RANK` 0 and 1 and two free ports in
/// [`PORTS`]; each must run it to the end.
fn over_the_model_ranks(test: &str, env: &[(&str, &str)], body: fn()) {
    run_if_the_child(test, body);
    let folder = driver_folder(test, false);
    let ports = format!("{},{}", children::free_port(), children::free_port());
    let logs: Vec<PathBuf> = (0..2)
        .map(|rank| folder.join(format!("rank{rank}.log")))
        .collect();
    let mut ranks = children::Ranks(
        logs.iter()
            .enumerate()
            .map(|(rank, log)| {
                let log = std::fs::File::create(log).unwrap();
                child_on_the_model(test, &folder, env)
                    .env("RANK", rank.to_string())
                    .env(PORTS, &ports)
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let ok = ranks.wait_all(Duration::from_secs(60));
    let text: Vec<String> = logs
        .iter()
        .map(|log| std::fs::read_to_string(log).unwrap_or_default())
        .collect();
    let _ = std::fs::remove_dir_all(&folder);
    for (rank, text) in text.iter().enumerate() {
        assert!(
            ok[rank] && text.contains(RAN),
            "{test}, rank {rank} over the CUDA driver model:\n{text}"
        );
    }
}

/// This process's rank (`RANK`) of a communicator of two processes, one
/// rank each, that meet at `port`; its C handle.
fn rank_of_two_processes(port: &str, config: rccl::Config) -> ncclComm_t {
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let id = rccl::UniqueId::from_address(&format!("127.0.0.1:{port}")).unwrap();
    if rank == 0 {
        id.serve_root().unwrap();
    }
    let comm = Communicator::init_rank_config(2, &id, rank, config).unwrap();
    let entry = Entry::new(Slot::Ready(comm), true, 0, None);
    registry::insert(entry.clone());
    entry.handle()
}

/// Two communicators of the same two processes, on device memory between
/// processes that do not share it (`NCCL_P2P_DISABLE`: the host executor
/// over host copies): rank 0 enqueues its all-reduce on communicator 0
/// first, rank 1 on communicator 1 first, each on a stream of its own.
/// The model runs the host functions of a process one at a time, as CUDA
/// may: a host function that waited for its peers would hold up the other
/// communicator's, which the peer waits for.
fn two_communicators_in_flight() {
    let device = cuda();
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let config = rccl::Config {
        p2p_disable: true,
        timeout: Duration::from_secs(5),
        ..test_config()
    };
    let comms: Vec<ncclComm_t> = std::env::var(PORTS)
        .unwrap()
        .split(',')
        .map(|port| rank_of_two_processes(port, config.clone()))
        .collect();
    let count = 1024;
    let values: Vec<u8> = (0..count)
        .flat_map(|i| ((rank * 1000 + i) as f32).to_le_bytes())
        .collect();
    let calls: Vec<_> = comms
        .iter()
        .map(|_| {
            let send = device.alloc(values.len()).unwrap();
            let recv = device.alloc(values.len()).unwrap();
            // SAFETY: both ranges hold the values' bytes.
            unsafe { device.copy(send, values.as_ptr(), values.len()) }.unwrap();
            (send, recv, device.create_stream().unwrap())
        })
        .collect();
    let order: Vec<usize> = if rank == 0 { vec![0, 1] } else { vec![1, 0] };
    for (n, &c) in order.iter().enumerate() {
        if n > 0 {
            // The first call's host function runs by now.
            std::thread::sleep(Duration::from_millis(300));
        }
        let (send, recv, stream) = &calls[c];
        let rc = plain_all_reduce(
            rank,
            comms[c],
            stream.raw() as cudaStream_t,
            *send,
            *recv,
            count,
        );
        assert_eq!(rc, ncclSuccess, "rank {rank}: {}", last_error(comms[c]));
    }
    for (c, (_, recv, stream)) in calls.iter().enumerate() {
        stream
            .synchronize(Instant::now() + Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("rank {rank}, communicator {c}: {e}"));
        let mut async_error = ncclSuccess;
        // SAFETY: a live communicator, a writable result.
        unsafe { ncclCommGetAsyncError(comms[c], &mut async_error) };
        assert_eq!(
            async_error,
            ncclSuccess,
            "rank {rank}: {}",
            last_error(comms[c])
        );
        let mut out = vec![0u8; values.len()];
        // SAFETY: both ranges hold the values' bytes.
        unsafe { device.copy(out.as_mut_ptr(), *recv, out.len()) }.unwrap();
        for (i, got) in out.chunks(4).enumerate() {
            let got = f32::from_le_bytes(got.try_into().unwrap());
            assert_eq!(
                got,
                (1000 + 2 * i) as f32,
                "rank {rank}, communicator {c}: element {i}"
            );
        }
    }
}

#[test]
fn two_communicators_over_host_copies_in_flight_across_processes() {
    over_the_model_ranks(
        "two_communicators_over_host_copies_in_flight_across_processes",
        &[],
        two_communicators_in_flight,
    );
}

/// Rank 0 of two calls an all-reduce that rank 1 never joins, so that its
/// kernel waits; `then` gets (rank 0's communicator, its stream, when the
/// call returned).
fn a_kernel_waits_for_a_peer_that_never_comes(
    config: rccl::Config,
    then: fn(ncclComm_t, &std::sync::Arc<dyn rccl::device::Stream>, Instant),
) {
    let device = cuda();
    let comms = c_communicators(2, config);
    let (send, recv) = (device.alloc(4096).unwrap(), device.alloc(4096).unwrap());
    let own = device.create_stream().unwrap();
    let comm = comms[0] as ncclComm_t;
    // SAFETY: device buffers of 1024 floats, a live communicator and
    // stream.
    let rc = unsafe {
        ncclAllReduce(
            send.cast(),
            recv.cast(),
            1024,
            7,
            0,
            comm,
            own.raw() as cudaStream_t,
        )
    };
    assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
    then(comm, &own, Instant::now());
}

/// A config whose timeout is `timeout`.
fn timing_out_after(timeout: Duration) -> rccl::Config {
    rccl::Config {
        timeout,
        ..test_config()
    }
}

#[test]
fn an_abort_stops_a_kernel_waiting_for_a_peer() {
    over_the_model("an_abort_stops_a_kernel_waiting_for_a_peer", &[], || {
        a_kernel_waits_for_a_peer_that_never_comes(
            timing_out_after(Duration::from_secs(600)),
            |comm, stream, _| {
                // The kernel is resident and waiting.
                std::thread::sleep(Duration::from_millis(300));
                assert!(
                    stream
                        .synchronize(Instant::now() + Duration::from_millis(50))
                        .is_err(),
                    "the kernel finished without its peer"
                );
                // SAFETY: a live communicator, aborted once.
                assert_eq!(unsafe { ncclCommAbort(comm) }, ncclSuccess);
                stream
                    .synchronize(Instant::now() + Duration::from_secs(1))
                    .expect("the kernel stops within 1 s of ncclCommAbort");
            },
        )
    });
}

#[test]
fn a_kernel_waiting_for_a_peer_fails_at_the_timeout() {
    over_the_model(
        "a_kernel_waiting_for_a_peer_fails_at_the_timeout",
        &[],
        || {
            a_kernel_waits_for_a_peer_that_never_comes(
                timing_out_after(Duration::from_millis(2000)),
                |comm, stream, called| {
                    stream
                        .synchronize(called + Duration::from_secs(3))
                        .expect("the kernel ends within 1 s of the 2 s timeout");
                    let took = called.elapsed();
                    let mut async_error = ncclSuccess;
                    // SAFETY: a live communicator, a writable result.
                    unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
                    let why = last_error(comm);
                    assert_ne!(async_error, ncclSuccess, "{why}");
                    assert!(why.contains("timed out"), "{why}");
                    assert!(
                        took >= Duration::from_millis(1900),
                        "the kernel gave up after {took:?}, before the 2 s timeout"
                    );
                },
            )
        },
    );
}

#[test]
fn a_huge_timeout_does_not_wrap() {
    over_the_model("a_huge_timeout_does_not_wrap", &[], || {
        // 15625 * this many ms, in 64 ns polls, is 2^64 + 10884: a
        // count that wraps gives up after a few thousand polls.
        let ms = 1_180_591_620_717_412;
        two_ranks_all_reduce_with(
            timing_out_after(Duration::from_millis(ms)),
            second_rank_calls_late,
            1.0,
        )
    });
}

/// cuMemcpyHtoDAsync through the model.
fn copy_to_device_async(dst: *mut u8, src: &[u8], stream: cudaStream_t) {
    type P = *mut std::ffi::c_void;
    let copy: unsafe extern "C" fn(u64, *const u8, usize, P) -> i32 =
        driver_fn(c"cuMemcpyHtoDAsync_v2");
    // SAFETY: `dst` is device memory of `src.len()` bytes; the model
    // stages the pageable source at the call.
    assert_eq!(
        unsafe { copy(dst as u64, src.as_ptr(), src.len(), stream.cast()) },
        0
    );
}

/// The stream sleeps `ms` on a host function before what follows.
fn stream_sleeps(stream: cudaStream_t, ms: u64) {
    type P = *mut std::ffi::c_void;
    unsafe extern "C" fn sleep(ms: P) {
        std::thread::sleep(Duration::from_millis(ms as u64));
    }
    let launch: unsafe extern "C" fn(P, unsafe extern "C" fn(P), P) -> i32 =
        driver_fn(c"cuLaunchHostFunc");
    // SAFETY: a live stream; the function takes its argument as a number.
    assert_eq!(unsafe { launch(stream.cast(), sleep, ms as P) }, 0);
}

/// Each rank's PreMulSum scalar (device memory, ncclScalarDevice) is 1 when
/// the op is made; its stream, after a pause, sets it to 3, then the
/// all-reduce runs: the sum is of 3 times each input.
fn premulsum_scalar_set_on_the_stream(
    _rank: usize,
    comm: ncclComm_t,
    stream: cudaStream_t,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> ncclResult_t {
    // The raw driver calls below need a context, as an application has.
    make_current(0);
    let device = cuda();
    let scalar = device.alloc(4).unwrap();
    // SAFETY: 4 bytes each.
    unsafe { device.copy(scalar, 1.0f32.to_le_bytes().as_ptr(), 4) }.unwrap();
    let mut op = 0;
    // SAFETY: a live communicator; the scalar stays while the op lives.
    let rc = unsafe { ncclRedOpCreatePreMulSum(&mut op, scalar.cast(), 7, ncclScalarDevice, comm) };
    assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
    stream_sleeps(stream, 300);
    copy_to_device_async(scalar, &3.0f32.to_le_bytes(), stream);
    // SAFETY: device buffers of `count` floats, a live communicator and
    // stream.
    unsafe { ncclAllReduce(send.cast(), recv.cast(), count, 7, op, comm, stream) }
}

#[test]
fn a_device_premulsum_scalar_is_read_when_the_collective_runs() {
    over_the_model(
        "a_device_premulsum_scalar_is_read_when_the_collective_runs",
        &[],
        || {
            two_ranks_all_reduce_scaled(premulsum_scalar_set_on_the_stream, 3.0);
        },
    );
}

/// How many kernels named `name` the model started in this process so
/// far (its launch counter, an export of the model only).
fn launches(name: &std::ffi::CStr) -> u64 {
    let counted: unsafe extern "C" fn(*const std::ffi::c_char, *mut u64) -> i32 =
        driver_fn(c"rccl_cuda_model_launches");
    let mut count = 0;
    // SAFETY: a NUL-terminated name and a valid out-pointer.
    assert_eq!(unsafe { counted(name.as_ptr(), &mut count) }, 0);
    count
}

/// For each of `ranks` ranks: a send and a receive buffer of `count`
/// floats on the device, and a stream.
fn float_buffers(
    ranks: usize,
    count: usize,
) -> Vec<(*mut u8, *mut u8, std::sync::Arc<dyn device::Stream>)> {
    let device = cuda();
    (0..ranks)
        .map(|_| {
            let send = device.alloc(4 * count).unwrap();
            let recv = device.alloc(4 * count).unwrap();
            (send, recv, device.create_stream().unwrap())
        })
        .collect()
}

/// Makes `calls` all-reduces on each of `comms` (ranks of this process,
/// a stream each) in one group from this thread and waits for them;
/// returns how many `rccl_run_work` kernels they launched.
fn run_work_launches(comms: &[ncclComm_t], calls: usize) -> u64 {
    let count = 1024;
    let buffers = float_buffers(comms.len(), count);
    let before = launches(c"rccl_run_work");
    // SAFETY: a group around calls on live communicators and streams,
    // with device buffers of `count` floats.
    unsafe {
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for _ in 0..calls {
            for (&comm, (send, recv, stream)) in comms.iter().zip(&buffers) {
                let rc =
                    plain_all_reduce(0, comm, stream.raw() as cudaStream_t, *send, *recv, count);
                assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
            }
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error(comms[0]));
    }
    for (&comm, (_, _, stream)) in comms.iter().zip(&buffers) {
        stream
            .synchronize(Instant::now() + Duration::from_secs(30))
            .unwrap();
        let mut async_error = ncclSuccess;
        // SAFETY: a live communicator, a writable result.
        unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
        assert_eq!(async_error, ncclSuccess, "{}", last_error(comm));
    }
    launches(c"rccl_run_work") - before
}

/// The first of [`PORTS`]' ports.
fn first_port() -> String {
    let ports = std::env::var(PORTS).unwrap();
    ports.split(',').next().unwrap().to_string()
}

#[test]
fn an_all_reduce_is_one_kernel_launch_per_process() {
    over_the_model_ranks(
        "an_all_reduce_is_one_kernel_launch_per_process",
        &[],
        || {
            let comm = rank_of_two_processes(&first_port(), test_config());
            let launched = run_work_launches(&[comm], 1);
            assert_eq!(launched, 1, "rccl_run_work launches of one all-reduce");
        },
    );
}

#[test]
fn a_group_of_three_all_reduces_is_a_kernel_launch_per_round() {
    over_the_model_ranks(
        "a_group_of_three_all_reduces_is_a_kernel_launch_per_round",
        &[],
        || {
            let comm = rank_of_two_processes(&first_port(), test_config());
            let launched = run_work_launches(&[comm], 3);
            assert_eq!(launched, 3, "rccl_run_work launches of a group of three");
        },
    );
}

/// Two ranks of one process on one device, driven by one thread: their
/// all-reduce is one launch covering both.
#[test]
fn ranks_of_one_process_share_a_kernel_launch() {
    over_the_model("ranks_of_one_process_share_a_kernel_launch", &[], || {
        let comms: Vec<ncclComm_t> = c_communicators(2, test_config())
            .into_iter()
            .map(|comm| comm as ncclComm_t)
            .collect();
        let launched = run_work_launches(&comms, 1);
        assert_eq!(
            launched, 1,
            "rccl_run_work launches of one all-reduce of two ranks"
        );
    });
}

/// Two ranks of this process on device 0 with 4 channels each make one
/// grid of 8 blocks that wait for each other; the model shrunk to one SM
/// holds at most 2 of them (1 of Simple's 512 threads, 2 of LL's 256), so
/// the launch is refused at once with the figures and the fix, rather
/// than left to wait until the model's deadline.
#[test]
fn a_grid_too_large_to_be_resident_is_refused_at_once() {
    over_the_model(
        "a_grid_too_large_to_be_resident_is_refused_at_once",
        &[
            ("RCCL_CUDA_MODEL_SMS", "1"),
            ("RCCL_CUDA_MODEL_DEADLINE_MS", "60000"),
        ],
        || {
            let config = rccl::Config {
                min_channels: 4,
                max_channels: 4,
                ..test_config()
            };
            let comms: Vec<ncclComm_t> = c_communicators(2, config)
                .into_iter()
                .map(|comm| comm as ncclComm_t)
                .collect();
            let count = 1024;
            let buffers = float_buffers(comms.len(), count);
            let started = Instant::now();
            // SAFETY: a group around calls on live communicators and
            // streams, with device buffers of `count` floats.
            let rc = unsafe {
                assert_eq!(ncclGroupStart(), ncclSuccess);
                for (&comm, (send, recv, stream)) in comms.iter().zip(&buffers) {
                    let rc = plain_all_reduce(
                        0,
                        comm,
                        stream.raw() as cudaStream_t,
                        *send,
                        *recv,
                        count,
                    );
                    assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
                }
                ncclGroupEnd()
            };
            let took = started.elapsed();
            let why = last_error(comms[0]);
            assert_eq!(rc, ncclInvalidUsage, "{why}");
            for expected in [
                "ranks [0, 1] on ",
                "rccl CUDA model 0",
                "rccl_run_work needs all its 8 blocks resident at once",
                "fit per SM x 1 SMs",
                "NCCL_MAX_NCHANNELS",
            ] {
                assert!(why.contains(expected), "{expected:?} in: {why}");
            }
            assert!(
                took < Duration::from_secs(20),
                "refused after {took:?}, not at once (the model's deadline is 60 s)"
            );
        },
    );
}
