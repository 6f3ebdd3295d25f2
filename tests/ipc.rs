//! Ranks in separate processes of one host on device memory of the
//! emulated GPU, run as device work over FIFOs in device memory one
//! process exports and the other maps (the handle a file descriptor passed
//! over a Unix socket, as `P2P/IPC`'s): the correctness suite and the
//! deterministic mode's calls over 4 processes, the links made (and `NCCL_P2P_DISABLE`: the host executor
//! through shared memory, over host copies of the buffers), and a process
//! killed mid all-reduce.

#[path = "common/children.rs"]
mod children;
mod common;
mod device_cases;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use children::{free_port, Ranks};
use common::{all_cases, deterministic, TEST_BUFFSIZE};
use device_cases::{
    all_reduce_succeeds, emu, join_from_env, last_error, read_back, run_case_of,
    run_cases_then_close, to_device,
};
use rccl::{CollKind, Communicator, DataType};
use rcclrs::registry::{self, Entry, Slot};
use rcclrs::*;

/// Set in a child: what it runs (`suite`, `loop`).
const ROLE: &str = "RCCL_TEST_IPC_ROLE";

/// Runs as one rank when started by the tests below; does nothing when
/// the test harness runs it directly.
#[test]
fn child() {
    match std::env::var(ROLE).as_deref() {
        Ok("suite") => suite_rank(),
        Ok("deterministic") => deterministic_rank(),
        Ok("loop") => all_reduce_until_killed(),
        Ok("pair") => two_ranks_from_one_thread(),
        Ok("idle") => all_reduce_once_beside_an_idle_rank(),
        Ok("destroy") => destroy_during_connection_setup(),
        _ => {}
    }
}

/// The rank that never calls, for [`all_reduce_once_beside_an_idle_rank`].
const IDLE_RANK: usize = 2;

/// Prints `ready` right after init; then rank [`IDLE_RANK`] sleeps (the
/// test kills it) and the others run one all-reduce of 64 Ki floats on
/// device memory, printing `failed <text>` if it fails.
fn all_reduce_once_beside_an_idle_rank() {
    let (comm, stream, rank, _) = join_from_env();
    let count = 1 << 16;
    let send = to_device(&vec![0u8; count * 4]);
    let recv = to_device(&vec![0u8; count * 4]);
    println!("ready");
    if rank == IDLE_RANK {
        // Bounded, should the test lose this child.
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    // Device buffers of `count` floats, never freed.
    if !all_reduce_succeeds(comm, stream, send, recv, count) {
        println!("failed {}", last_error(comm));
    }
}

/// Rank 0 starts an all-reduce on device memory on another thread, whose
/// connection setup waits for rank 1, and destroys the communicator
/// 500 ms later; it prints `returned <ms> ms after the destroy: <text>`
/// once the call returns, and exits. Rank 1 calls 3 s after init, when
/// rank 0 has given up, and prints `failed <ms> ms after its call: <text>`.
fn destroy_during_connection_setup() {
    let (comm, stream, rank, _) = join_from_env();
    let count = 1 << 10;
    let send = to_device(&vec![0u8; count * 4]) as usize;
    let recv = to_device(&vec![0u8; count * 4]) as usize;
    if rank == 0 {
        let (handle, stream_handle) = (comm as usize, stream as usize);
        let call = std::thread::spawn(move || {
            // SAFETY: device buffers of `count` floats, a live communicator
            // and stream (the communicator destroyed meanwhile fails the
            // call).
            let rc = unsafe {
                ncclAllReduce(
                    send as *const _,
                    recv as *mut _,
                    count,
                    7,
                    0,
                    handle as ncclComm_t,
                    stream_handle as cudaStream_t,
                )
            };
            (Instant::now(), rc, last_error(handle as ncclComm_t))
        });
        std::thread::sleep(Duration::from_millis(500));
        let destroyed = Instant::now();
        // SAFETY: a live handle, destroyed once.
        let rc = unsafe { ncclCommDestroy(comm) };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
        let (returned, rc, text) = call.join().unwrap();
        assert_ne!(rc, ncclSuccess);
        println!(
            "returned {} ms after the destroy: {text}",
            returned.saturating_duration_since(destroyed).as_millis()
        );
        return;
    }
    std::thread::sleep(Duration::from_secs(3));
    let called = Instant::now();
    if all_reduce_succeeds(comm, stream, send as *const u8, recv as *mut u8, count) {
        println!("succeeded without rank 0");
    } else {
        println!(
            "failed {} ms after its call: {}",
            called.elapsed().as_millis(),
            last_error(comm)
        );
    }
}

fn suite_rank() {
    let (comm, stream, rank, nranks) = join_from_env();
    let dtypes = [DataType::Float32, DataType::Int32, DataType::Bfloat16];
    let cases = all_cases(nranks, &CollKind::ALL, &dtypes);
    run_cases_then_close(&cases, comm, stream, nranks, rank);
    println!("device blocks run: {}", rccl_device::emu::works_run());
    println!(
        "host staging buffers: {}",
        rccl_device::emu::host_allocations()
    );
}

/// The deterministic mode's calls on device memory: each output the
/// reference's bits and the host path's.
fn deterministic_rank() {
    let (comm, stream, rank, nranks) = join_from_env();
    let cases = deterministic::cases(nranks);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            let at = (nranks, rank);
            run_case_of(
                case,
                comm,
                stream,
                at,
                deterministic::buffers,
                deterministic::check,
            )
            .err()
        })
        .collect();
    deterministic::assert_expected(rank, cases.len(), &failures);
    // SAFETY: a live handle, destroyed once.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
}

/// All-reduces of 64 Ki floats on device memory until one fails: prints
/// `ready` after the first, then `failed <text>` with the error.
fn all_reduce_until_killed() {
    let (comm, stream, _, _) = join_from_env();
    let count = 1 << 16;
    let send = to_device(&vec![0u8; count * 4]);
    let recv = to_device(&vec![0u8; count * 4]);
    // Bounded, so that a child the test lost (its runner killed) stops by
    // itself rather than spinning on.
    let start = Instant::now();
    for round in 0.. {
        if start.elapsed() > Duration::from_secs(60) {
            println!("stopped: nobody killed a peer");
            return;
        }
        // Device buffers of `count` floats, never freed; a live
        // communicator and stream.
        // SAFETY: as above.
        let call = unsafe { ncclAllReduce(send.cast(), recv.cast(), count, 7, 0, comm, stream) };
        // SAFETY: a live stream.
        let synced = unsafe { rcclrsEmuStreamSynchronize(stream) };
        let mut async_error = ncclSuccess;
        // SAFETY: a live communicator, a writable result.
        unsafe { ncclCommGetAsyncError(comm, &mut async_error) };
        if (call, synced, async_error) != (ncclSuccess, ncclSuccess, ncclSuccess) {
            // The next call on a failed communicator returns its error.
            // SAFETY: as above.
            let again =
                unsafe { ncclAllReduce(send.cast(), recv.cast(), count, 7, 0, comm, stream) };
            assert_ne!(again, ncclSuccess);
            println!(
                "failed (call {call}, stream {synced}, asynchronous error {async_error}) {}",
                last_error(comm)
            );
            return;
        }
        if round == 0 {
            println!("ready");
        }
    }
}

/// Process `RANK` of 2 holds ranks `RANK` and `RANK + 2` of 4 and drives
/// both from this thread in one group: all-reduces on device memory, then
/// checks the sums. Every ring neighbour is in the other process, so
/// whichever rank this process links first waits for both ranks of the
/// other: the two must link at once.
fn two_ranks_from_one_thread() {
    emu();
    let process: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let port = std::env::var("MASTER_PORT").unwrap();
    let id = rccl::UniqueId::from_address(&format!("127.0.0.1:{port}")).unwrap();
    if process == 0 {
        id.serve_root().unwrap();
    }
    let ranks = [process, process + 2];
    let comms: Vec<Communicator> = std::thread::scope(|scope| {
        let id = &id;
        let joining: Vec<_> = ranks
            .map(|rank| scope.spawn(move || Communicator::init_rank(4, id, rank).unwrap()))
            .into_iter()
            .collect();
        joining.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let handles: Vec<(ncclComm_t, cudaStream_t)> = comms
        .into_iter()
        .map(|comm| {
            let entry = Entry::new(Slot::Ready(comm), true, 0, None);
            registry::insert(entry.clone());
            let mut stream: cudaStream_t = null_mut();
            // SAFETY: a writable stream slot.
            assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
            (entry.handle(), stream)
        })
        .collect();
    let count = 1 << 14;
    for round in 0..3u32 {
        let buffers: Vec<(*mut u8, *mut u8)> = ranks
            .iter()
            .map(|&rank| {
                let value = (rank as f32 + 1.0) * (round as f32 + 1.0);
                let send: Vec<u8> = (0..count).flat_map(|_| value.to_le_bytes()).collect();
                (to_device(&send), to_device(&vec![0u8; count * 4]))
            })
            .collect();
        // SAFETY: live communicators and streams; device buffers of
        // `count` floats, read back after the streams are synchronized.
        unsafe {
            assert_eq!(ncclGroupStart(), ncclSuccess);
            for (&(comm, stream), &(send, recv)) in handles.iter().zip(&buffers) {
                let rc = ncclAllReduce(send.cast(), recv.cast(), count, 7, 0, comm, stream);
                assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
            }
            assert_eq!(ncclGroupEnd(), ncclSuccess);
            for &(comm, stream) in &handles {
                assert_eq!(
                    rcclrsEmuStreamSynchronize(stream),
                    ncclSuccess,
                    "{}",
                    last_error(comm)
                );
            }
        }
        let expected = 10.0 * (round as f32 + 1.0);
        for &(_, recv) in &buffers {
            let got = read_back(recv, count * 4);
            assert!(
                got.chunks_exact(4)
                    .all(|w| f32::from_le_bytes(w.try_into().unwrap()) == expected),
                "round {round}: not {expected} everywhere"
            );
        }
    }
    // SAFETY: live handles, destroyed once; the streams are idle.
    unsafe {
        for (comm, stream) in handles {
            assert_eq!(ncclCommDestroy(comm), ncclSuccess);
            assert_eq!(rcclrsEmuStreamDestroy(stream), ncclSuccess);
        }
    }
    println!("device blocks run: {}", rccl_device::emu::works_run());
}

/// Starts `nranks` children in `role`, with `env` added, killed when the
/// test ends however it ends.
fn spawn(nranks: usize, role: &str, env: &[(&str, &str)]) -> Ranks {
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    let children = (0..nranks)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--exact", "child", "--nocapture", "--test-threads", "1"])
                .env(ROLE, role)
                .env("RCCL_DEVICE", "emu")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", nranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("NCCL_BUFFSIZE", TEST_BUFFSIZE.to_string())
                .env("NCCL_MIN_NCHANNELS", "2")
                .env("NCCL_MAX_NCHANNELS", "2")
                .env("NCCL_DEBUG", "INFO")
                .env("NCCL_DEBUG_SUBSYS", "INIT,SHM,NET")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (key, value) in env {
                cmd.env(key, value);
            }
            cmd.spawn().unwrap()
        })
        .collect();
    Ranks(children)
}

/// Every line the children print, as (rank, line), read by one thread
/// per stream.
fn lines(children: &mut [Child]) -> mpsc::Receiver<(usize, String)> {
    let (tx, rx) = mpsc::channel();
    for (rank, child) in children.iter_mut().enumerate() {
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send((rank, line));
                }
            });
        }
    }
    rx
}

/// Waits for every child (killing those still running after 120 s) and
/// returns whether each succeeded, with everything they printed.
fn finish(mut children: Ranks) -> (Vec<bool>, String) {
    let rx = lines(&mut children.0);
    let ok = children.wait_all(Duration::from_secs(120));
    // The readers may still hold the children's last lines: they end at
    // their pipes' ends, waited for boundedly (a grandchild could keep a
    // pipe open).
    let until = Instant::now() + Duration::from_secs(5);
    let mut text = Vec::new();
    while let Ok((r, l)) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        text.push(format!("[{r}] {l}"));
    }
    (ok, text.join("\n"))
}

#[test]
fn the_suite_over_four_processes_through_p2p_ipc() {
    let (ok, text) = finish(spawn(4, "suite", &[]));
    assert!(ok.iter().all(|&ok| ok), "{ok:?}\n{text}");
    // Device calls run as device work over FIFOs P2P/IPC handed over; the
    // suite's comparison calls on host memory go through shared memory.
    assert_device_work(&text);
    let blocks: Vec<u64> = text
        .lines()
        .filter_map(|l| l.split_once("device blocks run: "))
        .map(|(_, n)| n.trim().parse().unwrap())
        .collect();
    assert!(
        blocks.len() == 4 && blocks.iter().all(|&n| n > 0),
        "{blocks:?}"
    );
}

/// The deterministic mode across 4 processes on device memory through
/// P2P/IPC, under two algorithms asked for: every output is the
/// reference's bits; without the mode, the tree's are not.
#[test]
fn deterministic_calls_over_p2p_ipc_give_the_reference_bits() {
    for (mode, algo, expect) in [
        ("1", "ring", "reference"),
        ("1", "tree", "reference"),
        ("0", "allreduce:tree", "other"),
    ] {
        let env = [
            ("NCCL_DETERMINISTIC", mode),
            ("NCCL_ALGO", algo),
            (deterministic::EXPECT, expect),
        ];
        let (ok, text) = finish(spawn(4, "deterministic", &env));
        assert!(ok.iter().all(|&ok| ok), "{env:?}: {ok:?}\n{text}");
        assert_device_work(&text);
    }
}

/// Asserts that the ranks' device calls connected as device work through
/// exported memory.
fn assert_device_work(text: &str) {
    assert!(text.contains("via P2P/IPC (device work)"), "{text}");
}

#[test]
fn with_p2p_disabled_device_calls_go_through_shared_memory() {
    let (ok, text) = finish(spawn(2, "suite", &[("NCCL_P2P_DISABLE", "1")]));
    assert!(ok.iter().all(|&ok| ok), "{ok:?}\n{text}");
    assert!(text.contains("via SHM/direct"), "{text}");
    assert!(!text.contains("via P2P/IPC"), "{text}");
    // Each rank ran its calls over host copies of its device buffers.
    assert_eq!(text.matches("host staging buffers: ").count(), 2, "{text}");
    assert!(!text.contains("host staging buffers: 0\n"), "{text}");
}

#[test]
fn two_processes_of_two_ranks_each_driven_by_one_thread_run_device_work() {
    let (ok, text) = finish(spawn(2, "pair", &[("RCCL_TIMEOUT_MS", "20000")]));
    assert!(ok.iter().all(|&ok| ok), "{ok:?}\n{text}");
    assert_device_work(&text);
    assert_eq!(text.matches("device blocks run: ").count(), 2, "{text}");
    assert!(!text.contains("device blocks run: 0\n"), "{text}");
}

/// Names in /dev/shm left by these processes.
fn shm_names_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| pids.iter().any(|p| name.starts_with(&format!("rccl-{p}-"))))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sigkill_of_one_of_four_processes_mid_all_reduce_on_device_memory() {
    let (nranks, victim) = (4, 2);
    let mut children = spawn(nranks, "loop", &[("RCCL_TIMEOUT_MS", "30000")]);
    let pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    let rx = lines(&mut children.0);
    let mut seen = String::new();
    let mut ready = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready < nranks {
        let (rank, line) = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("ranks not ready:\n{seen}"));
        // The harness's "test child ... " may lead the first line.
        ready += usize::from(line.ends_with("ready"));
        seen += &format!("[{rank}] {line}\n");
    }
    assert_device_work(&seen);
    // The death must be named as fast on a loaded machine: busy threads,
    // four per core (at least eight), until the survivors have failed.
    // The survivors' own spinning channels add to them.
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let busy = Arc::new(AtomicBool::new(true));
    let loads: Vec<_> = (0..(4 * cores).max(8))
        .map(|_| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                while busy.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let killed = Instant::now();
    children.0[victim].kill().unwrap();
    children.0[victim].wait().unwrap();
    let mut failed = Vec::new();
    while failed.len() < nranks - 1 {
        let Ok((rank, line)) = rx.recv_timeout(Duration::from_secs(15)) else {
            panic!("survivors did not fail: {failed:?}");
        };
        if let Some((_, text)) = line.split_once("failed ") {
            failed.push((rank, killed.elapsed(), text.to_string()));
        }
    }
    busy.store(false, Ordering::Relaxed);
    loads.into_iter().for_each(|t| t.join().unwrap());
    for (rank, after, text) in &failed {
        println!(
            "SIGKILL of rank {victim} over P2P/IPC: rank {rank} failed after {after:?}: {text}"
        );
        // The watch's grace (2 s: a peer may exit after its part while
        // this rank drains its FIFOs), then at most 1 s: the process watch
        // stops the work itself when the grace ends, so what is left is
        // the survivor's scheduling (measured: 0.01-0.2 s under load 17 on
        // 2 cores; the rest of the second is the allowance).
        assert!(*after < Duration::from_secs(3), "rank {rank}: {after:?}");
        assert!(
            text.contains(&format!("rank {victim} ")),
            "rank {rank} does not name the dead rank: {text}"
        );
        // As NCCL: the stream's work completes, the communicator reports
        // the failure (ncclRemoteError).
        assert!(
            text.starts_with(&format!(
                "(call {ncclSuccess}, stream {ncclSuccess}, asynchronous error {ncclRemoteError})"
            )),
            "rank {rank}: {text}"
        );
    }
    // The survivors exit on their own; the victim's status is already in.
    children.wait_all(Duration::from_secs(30));
    let left = shm_names_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// A rank killed right after init, before its first call, while the
/// others wait for it in theirs (device work's connection setup through
/// exported FIFOs), with a 15 s timeout: each survivor fails within 2 s
/// naming it.
#[test]
fn a_rank_killed_before_its_first_call_on_device_memory_fails_the_others_in_setup() {
    let nranks = 4;
    let mut children = spawn(nranks, "idle", &[("RCCL_TIMEOUT_MS", "15000")]);
    let rx = lines(&mut children.0);
    let mut seen = String::new();
    let mut ready = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready < nranks {
        let (rank, line) = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("ranks not ready:\n{seen}"));
        ready += usize::from(line.ends_with("ready"));
        seen += &format!("[{rank}] {line}\n");
    }
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    children.0[IDLE_RANK].kill().unwrap();
    children.0[IDLE_RANK].wait().unwrap();
    let mut failed = Vec::new();
    while failed.len() < nranks - 1 {
        let Ok((rank, line)) = rx.recv_timeout(Duration::from_secs(20)) else {
            panic!("survivors did not fail: {failed:?}");
        };
        if let Some((_, text)) = line.split_once("failed ") {
            failed.push((rank, killed.elapsed(), text.to_string()));
        }
    }
    for (rank, after, text) in &failed {
        println!(
            "SIGKILL of rank {IDLE_RANK} before its first call on device memory: rank {rank} \
             failed after {after:?}: {text}"
        );
    }
    for (rank, after, text) in &failed {
        assert!(
            *after < Duration::from_secs(2),
            "rank {rank}: {after:?}: {text}"
        );
        assert!(
            text.contains(&format!("rank {IDLE_RANK} ")),
            "rank {rank} does not name the dead rank: {text}"
        );
    }
}

/// ncclCommDestroy from another thread reaches a device call's connection
/// setup as it reaches host work's: the call returns at once, and the
/// peer, arriving after this process gave up, fails at once naming it
/// rather than at its deadline (15 s).
#[test]
fn destroy_from_another_thread_stops_device_connection_setup() {
    let (ok, text) = finish(spawn(2, "destroy", &[("RCCL_TIMEOUT_MS", "15000")]));
    println!(
        "{}",
        text.lines()
            .filter(|l| l.contains(" ms "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(ok.iter().all(|&ok| ok), "{ok:?}\n{text}");
    // "<ms> ms after ...: <text>", behind whatever leads the line.
    let ms_of = |after: &str| -> (u128, String) {
        let marker = format!(" ms after {after}: ");
        let (before, why) = text
            .lines()
            .find_map(|l| l.split_once(&marker))
            .unwrap_or_else(|| panic!("no \"{marker}\" in:\n{text}"));
        let ms = before.rsplit(' ').next().unwrap().parse().unwrap();
        (ms, why.to_string())
    };
    let (returned, why) = ms_of("the destroy");
    assert!(
        returned < 1_000,
        "the call returned {returned} ms after the destroy: {why}"
    );
    assert!(why.contains("destroyed"), "{why}");
    let (failed, why) = ms_of("its call");
    assert!(
        failed < 2_000,
        "rank 1 failed {failed} ms after its call: {why}"
    );
    assert!(
        why.contains("rank 0 ") && why.contains("destroyed or aborted its communicator"),
        "rank 1 does not say that rank 0 left: {why}"
    );
}

/// ncclMemAlloc's device memory is shareable with other processes (as
/// NCCL's, a cuMem allocation with an exportable handle); registering it
/// with a communicator and deregistering it work once, ncclMemFree
/// refuses it while a window holds it and releases it after.
#[test]
fn mem_alloc_gives_exportable_device_memory_that_registers_and_deregisters() {
    let device = emu();
    let comm = Communicator::init_all(1).unwrap().pop().unwrap();
    let entry = Entry::new(Slot::Ready(comm), true, 0, None);
    registry::insert(entry.clone());
    let comm = entry.handle();
    let mut buf: *mut std::ffi::c_void = null_mut();
    // SAFETY: a writable pointer slot.
    assert_eq!(unsafe { ncclMemAlloc(&mut buf, 4096) }, ncclSuccess);
    assert!(device.classify(buf.cast()).unwrap().is_device());
    let (handle, len) = device.export(buf.cast()).expect("exportable");
    assert_eq!(len, 4096);
    drop(handle);
    let mut registration: *mut std::ffi::c_void = null_mut();
    // SAFETY: a live communicator, a live buffer, a writable handle slot.
    unsafe {
        assert_eq!(
            ncclCommRegister(comm, buf, 4096, &mut registration),
            ncclSuccess
        );
        assert_eq!(ncclCommDeregister(comm, registration), ncclSuccess);
        assert_ne!(ncclCommDeregister(comm, registration), ncclSuccess);
        assert!(last_error(comm).contains("not a registration"));
        // Memory still in a window is not freed.
        let mut window: ncclWindow_t = null_mut();
        assert_eq!(
            ncclCommWindowRegister(comm, buf, 4096, &mut window, 0),
            ncclSuccess
        );
        assert_eq!(ncclMemFree(buf), ncclInvalidUsage);
        let why = last_error(null_mut());
        assert!(
            why.contains("4096 bytes of device memory) is still in 1 registered window"),
            "{why}"
        );
        assert!(device.classify(buf.cast()).unwrap().is_device());
        assert_eq!(ncclCommWindowDeregister(comm, window), ncclSuccess);
        assert_eq!(ncclMemFree(buf), ncclSuccess);
        assert_eq!(ncclCommDestroy(comm), ncclSuccess);
    }
    assert!(!device.classify(buf.cast()).unwrap().is_device());
}
