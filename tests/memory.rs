//! What a communicator holds in memory (`rccl::Ledger`): the breakdown
//! after collectives over shared memory, TCP and the emulated GPU, the
//! figures of `ncclCommMemStats`, suspend and resume (the error of a call
//! while suspended, correct results after, no growth over 1,000 cycles),
//! and the limit `NCCL_MAX_MEM_BYTES`.

#[path = "common/children.rs"]
mod children;
mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{gate, tcp_config, test_config};
use rccl::device::{self, Device, Kind, Stream};
use rccl::{CollCall, CollKind, Communicator, Config, DataType, Executor, MemStats, MemUse};
use rccl::{Place, Purpose, RedOp};

/// Taken by every test: the resident set the cycle test reads is the
/// process's.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `body` on every rank, each on a thread of its own, in rank order.
fn on_threads<T: Send>(comms: &[Communicator], body: impl Fn(&Communicator) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let running: Vec<_> = comms.iter().map(|c| s.spawn(|| body(c))).collect();
        running.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// An all-reduce of `count` floats, each rank giving rank + 1: checks the
/// sum.
fn all_reduce(comm: &Communicator, count: usize) -> rccl::Result<()> {
    let mine = vec![comm.rank() as f32 + 1.0; count];
    let mut sum = vec![0.0f32; count];
    comm.all_reduce(&mine, &mut sum, RedOp::Sum)?;
    let n = comm.count() as f32;
    assert!(sum.iter().all(|&x| x == n * (n + 1.0) / 2.0));
    Ok(())
}

/// The sizes of an all-reduce sweep: the board's, one-shot's and the
/// ring's.
const SWEEP: [usize; 3] = [64, 4096, 64 << 10];

fn sweep(comm: &Communicator) {
    for count in SWEEP {
        all_reduce(comm, count).unwrap();
    }
}

/// Checks that the breakdown adds up to the figures and that everything
/// held is host memory a suspend releases; returns the FIFO entries.
fn host_breakdown(comm: &Communicator) -> Vec<MemUse> {
    let stats = comm.mem_stats();
    let parts = comm.memory().breakdown();
    assert_eq!(parts.iter().map(|u| u.bytes).sum::<u64>(), stats.total);
    assert_eq!((stats.suspendable, stats.persistent), (stats.total, 0));
    assert!(parts
        .iter()
        .all(|u| u.place == Place::Host && u.suspendable));
    parts
        .into_iter()
        .filter(|u| u.purpose == Purpose::Fifo)
        .collect()
}

#[test]
fn collectives_on_threads_over_shm_enter_every_connection_and_the_board() {
    let _serial = serial();
    let config = test_config();
    let comms = Communicator::init_all_config(4, config.clone()).unwrap();
    assert!(comms.iter().all(|c| c.mem_stats() == MemStats::default()));
    on_threads(&comms, sweep);
    let segment = rccl_transports::segment_bytes(&config.fifo_shape()) as u64;
    let board = rccl_transports::Board::segment_bytes(4, config.board_bytes) as u64;
    for comm in &comms {
        let parts = comm.memory().breakdown();
        let boards: Vec<_> = parts
            .iter()
            .filter(|u| u.purpose == Purpose::Board)
            .collect();
        assert_eq!(boards.len(), 1, "{parts:?}");
        assert_eq!(boards[0].bytes, board);
        let fifos = host_breakdown(comm);
        // Each connection maps one segment, to peers the sweep's
        // algorithms reach.
        assert!(!fifos.is_empty());
        assert!(fifos
            .iter()
            .all(|u| u.peer.is_some_and(|p| p != comm.rank())));
        for fifo in &fifos {
            assert_eq!(fifo.executor, Some(Executor::Host));
            assert!(
                fifo.bytes > 0 && fifo.bytes.is_multiple_of(segment),
                "{fifo:?}"
            );
        }
    }
}

#[test]
fn collectives_on_threads_over_tcp_enter_each_connections_private_fifos() {
    let _serial = serial();
    let comms = Communicator::init_all_config(4, tcp_config()).unwrap();
    on_threads(&comms, sweep);
    for comm in &comms {
        let parts = comm.memory().breakdown();
        assert!(
            parts.iter().all(|u| u.purpose != Purpose::Board),
            "{parts:?}"
        );
        let fifos = host_breakdown(comm);
        assert!(!fifos.is_empty());
        assert!(fifos.iter().all(|u| u.peer.is_some() && u.bytes > 0));
    }
}

fn emu() -> &'static dyn Device {
    device::select(Kind::Emu).unwrap()
}

/// An all-reduce of `count` floats on device buffers of every rank, on
/// streams; checks the sums.
fn device_all_reduce(comms: &[Communicator], count: usize) {
    let n = comms.len();
    let streams: Vec<Arc<dyn Stream>> = (0..n).map(|_| emu().create_stream().unwrap()).collect();
    let bytes = count * 4;
    let mut buffers = Vec::new();
    for (rank, comm) in comms.iter().enumerate() {
        let values = vec![rank as f32 + 1.0; count];
        let send = emu().alloc(bytes).unwrap();
        let recv = emu().alloc(bytes).unwrap();
        // SAFETY: both ranges hold `count` floats.
        unsafe { emu().copy(send, values.as_ptr().cast(), bytes) }.unwrap();
        let call = CollCall {
            kind: CollKind::AllReduce,
            count,
            dtype: DataType::Float32,
            op: RedOp::Sum,
            root: 0,
        };
        // SAFETY: the buffers hold `count` floats until the streams are
        // synchronized below.
        unsafe { comm.collective_raw_on_stream(call, send, recv, streams[rank].raw()) }.unwrap();
        buffers.push((send, recv));
    }
    let want = (n * (n + 1) / 2) as f32;
    for (stream, (send, recv)) in streams.iter().zip(buffers) {
        stream
            .synchronize(Instant::now() + Duration::from_secs(30))
            .unwrap();
        let mut out = vec![0f32; count];
        // SAFETY: both ranges hold `count` floats.
        unsafe { emu().copy(out.as_mut_ptr().cast(), recv, bytes) }.unwrap();
        assert!(out.iter().all(|&x| x == want));
        // SAFETY: the stream ran everything that used them.
        unsafe { emu().free(send) }.unwrap();
        // SAFETY: as above.
        unsafe { emu().free(recv) }.unwrap();
    }
}

#[test]
fn device_work_on_the_emulated_gpu_enters_device_fifos_staging_and_its_work_word() {
    let _serial = serial();
    for nranks in [2, 4] {
        device_ledger_matches_the_emulated_gpu(nranks);
    }
}

fn device_ledger_matches_the_emulated_gpu(nranks: usize) {
    let emu_device = rccl::device::emu::device();
    let before = emu_device.bytes_in_use();
    let comms = Communicator::init_all_config(nranks, test_config()).unwrap();
    for count in SWEEP {
        device_all_reduce(&comms, count);
    }
    let in_use = (emu_device.bytes_in_use() - before) as u64;
    let mut device_held = 0;
    for comm in &comms {
        let parts = comm.memory().breakdown();
        let stats = comm.mem_stats();
        assert_eq!(parts.iter().map(|u| u.bytes).sum::<u64>(), stats.total);
        let on_device = |purpose| {
            parts.iter().any(|u| {
                u.purpose == purpose
                    && u.place == Place::Device
                    && u.executor == Some(Executor::Device)
            })
        };
        assert!(on_device(Purpose::Fifo), "{parts:?}");
        assert!(on_device(Purpose::Staging), "{parts:?}");
        assert!(on_device(Purpose::WorkTable), "{parts:?}");
        device_held += parts
            .iter()
            .filter(|u| u.place == Place::Device)
            .map(|u| u.bytes)
            .sum::<u64>();
    }
    eprintln!("emulated device, {nranks} ranks: ledger {device_held} bytes, in use {in_use} bytes");
    assert_eq!(device_held, in_use);
    on_threads(&comms, |c| c.suspend().unwrap());
    assert!(comms.iter().all(|c| c.mem_stats().total == 0));
    assert_eq!(emu_device.bytes_in_use(), before);
    on_threads(&comms, |c| c.resume().unwrap());
    device_all_reduce(&comms, 4096);
}

#[test]
fn suspend_waits_for_work_queued_on_streams_before_releasing() {
    let _serial = serial();
    let comms = Communicator::init_all_config(2, test_config()).unwrap();
    device_all_reduce(&comms, 4096);
    let count = 4096;
    let bytes = count * 4;
    let call = CollCall {
        kind: CollKind::AllReduce,
        count,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        root: 0,
    };
    let streams: Vec<Arc<dyn Stream>> = (0..2).map(|_| emu().create_stream().unwrap()).collect();
    // Rank 0's stream is held until 200 ms after both ranks called
    // suspend: each suspend waits for its rank's queued call.
    let open = gate(streams[0].as_ref());
    let mut buffers = Vec::new();
    for (rank, comm) in comms.iter().enumerate() {
        let buffer = emu().alloc(bytes).unwrap();
        let values = vec![rank as f32 + 1.0; count];
        // SAFETY: the range holds `count` floats.
        unsafe { emu().copy(buffer, values.as_ptr().cast(), bytes) }.unwrap();
        // SAFETY: the buffer holds `count` floats until the streams are
        // synchronized below.
        unsafe { comm.collective_raw_on_stream(call, buffer, buffer, streams[rank].raw()) }
            .unwrap();
        buffers.push(buffer);
    }
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            open.store(true, Ordering::Release);
        });
        on_threads(&comms, |comm| comm.suspend().unwrap());
    });
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(comms.iter().all(|c| c.mem_stats().suspended));
    for (stream, buffer) in streams.iter().zip(buffers) {
        stream
            .synchronize(Instant::now() + Duration::from_secs(30))
            .unwrap();
        let mut out = vec![0f32; count];
        // SAFETY: both ranges hold `count` floats.
        unsafe { emu().copy(out.as_mut_ptr().cast(), buffer, bytes) }.unwrap();
        assert!(out.iter().all(|&x| x == 3.0));
        // SAFETY: the stream ran everything that used it.
        unsafe { emu().free(buffer) }.unwrap();
    }
    on_threads(&comms, |c| c.resume().unwrap());
    device_all_reduce(&comms, 4096);
}

fn suspended(rank: usize) -> String {
    format!(
        "invalid usage: rank {rank}: the communicator is suspended (ncclCommSuspend); call \
         ncclCommResume before any other operation"
    )
}

#[test]
fn suspend_releases_everything_calls_fail_until_resume_and_results_stay_right() {
    let _serial = serial();
    for config in [test_config(), tcp_config()] {
        let comms = Communicator::init_all_config(2, config).unwrap();
        on_threads(&comms, sweep);
        let held: Vec<MemStats> = comms.iter().map(Communicator::mem_stats).collect();
        assert!(held.iter().all(|s| s.suspendable > 0 && !s.suspended));
        on_threads(&comms, |c| c.suspend().unwrap());
        for (comm, before) in comms.iter().zip(&held) {
            let stats = comm.mem_stats();
            assert_eq!((stats.suspendable, stats.total), (0, 0));
            assert!(stats.suspended);
            assert_eq!(stats.released, before.suspendable);
            assert!(comm.memory().breakdown().is_empty());
        }
        let err = all_reduce(&comms[0], 64).unwrap_err();
        assert_eq!(err.to_string(), suspended(0));
        assert_eq!(
            comms[0].suspend().unwrap_err().to_string(),
            "invalid usage: rank 0: ncclCommSuspend: the communicator is suspended already"
        );
        on_threads(&comms, |c| c.resume().unwrap());
        assert_eq!(
            comms[1].resume().unwrap_err().to_string(),
            "invalid usage: rank 1: ncclCommResume: the communicator is not suspended"
        );
        on_threads(&comms, sweep);
        let again: Vec<MemStats> = comms.iter().map(Communicator::mem_stats).collect();
        assert_eq!(again, held);
    }
}

/// This process's resident set, in bytes (`/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn a_thousand_suspend_resume_cycles_leave_the_ledger_and_rss_where_they_were() {
    let _serial = serial();
    let comms = Communicator::init_all_config(2, test_config()).unwrap();
    let cycle = |comm: &Communicator, i: usize| {
        if i.is_multiple_of(10) {
            sweep(comm);
        }
        comm.suspend().unwrap();
        comm.resume().unwrap();
    };
    // Warm up: the allocator's and the bootstrap's first growth.
    on_threads(&comms, |c| (0..50).for_each(|i| cycle(c, i)));
    on_threads(&comms, sweep);
    let held: Vec<MemStats> = comms.iter().map(Communicator::mem_stats).collect();
    let rss_before = rss();
    let started = Instant::now();
    on_threads(&comms, |c| (0..1000).for_each(|i| cycle(c, i)));
    let took = started.elapsed();
    on_threads(&comms, sweep);
    let rss_after = rss();
    eprintln!(
        "1000 cycles: {took:?}; rss {rss_before} -> {rss_after} bytes; ledger {:?}",
        held[0]
    );
    let again: Vec<MemStats> = comms.iter().map(Communicator::mem_stats).collect();
    assert_eq!(again, held);
    assert!(
        rss_after < rss_before + (4 << 20),
        "rss grew from {rss_before} to {rss_after} bytes"
    );
}

#[test]
fn the_limit_refuses_an_allocation_naming_it_what_is_held_and_the_limit() {
    let _serial = serial();
    let config = Config {
        board_bytes: 0,
        max_mem_bytes: Some(10_000),
        ..test_config()
    };
    let comms = Communicator::init_all_config(2, config).unwrap();
    let errors = on_threads(&comms, |c| all_reduce(c, 4096).unwrap_err().to_string());
    let segment = rccl_transports::segment_bytes(&test_config().fifo_shape());
    assert_eq!(
        errors[0],
        format!(
            "system error: rank 0: {segment} bytes for the FIFOs (host memory, to rank 1) \
             refused: the communicator holds 0 bytes and NCCL_MAX_MEM_BYTES allows 10000"
        )
    );
    assert_eq!(comms[0].mem_stats().total, 0);
}

const CHILD: &str = "RCCL_TEST_MEMORY_CHILD";
/// Set for children that check that the resident set has fallen by most
/// of what the ledger held by the time suspend returns.
const RSS_DROP: &str = "RCCL_TEST_MEMORY_RSS_DROP";

/// One rank of `processes_count_suspend_and_resume`: a sweep, its
/// breakdown, a suspend (the resident set before and after), a refused
/// call, a resume and the sweep again, timed.
#[test]
fn memory_child_rank() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let comm = Communicator::from_env().expect("init from the environment");
    if let Some(limit) = std::env::var_os("NCCL_MAX_MEM_BYTES") {
        let err = all_reduce(&comm, 4096).unwrap_err().to_string();
        let allows = format!("and NCCL_MAX_MEM_BYTES allows {}", limit.to_string_lossy());
        assert!(err.ends_with(&allows), "{err}");
        return;
    }
    sweep(&comm);
    assert!(!host_breakdown(&comm).is_empty());
    let held = comm.mem_stats();
    if std::env::var_os(RSS_DROP).is_some() {
        suspends_give_the_pages_back(&comm, held.total);
    }
    let rss_held = rss();
    let started = Instant::now();
    comm.suspend().unwrap();
    let suspend_took = started.elapsed();
    let rss_suspended = rss();
    assert_eq!(comm.mem_stats().total, 0);
    let err = all_reduce(&comm, 64).unwrap_err();
    assert_eq!(err.to_string(), suspended(comm.rank()));
    let started = Instant::now();
    comm.resume().unwrap();
    all_reduce(&comm, 64 << 10).unwrap();
    let resume_took = started.elapsed();
    sweep(&comm);
    assert_eq!(comm.mem_stats(), held);
    eprintln!(
        "rank {} of {} (NCCL_SHM_DISABLE={}): ledger {} bytes; rss {rss_held} -> \
         {rss_suspended} bytes on suspend; suspend {suspend_took:?}, resume + first all-reduce \
         {resume_took:?}",
        comm.rank(),
        comm.count(),
        std::env::var("NCCL_SHM_DISABLE").unwrap_or_default(),
        held.total
    );
}

/// Suspends and resumes a few times, checking each time that the
/// resident set has fallen by nearly all the ledger held (`held` bytes)
/// when suspend returns: the memory of one connection still held by a
/// thread behind the call would miss the mark.
fn suspends_give_the_pages_back(comm: &Communicator, held: u64) {
    for cycle in 0..4 {
        let rss_held = rss();
        comm.suspend().unwrap();
        let rss_suspended = rss();
        let dropped = rss_held.saturating_sub(rss_suspended);
        assert!(
            dropped >= held / 16 * 15,
            "rank {}, suspend {cycle}: the resident set fell by {dropped} bytes ({rss_held} -> \
             {rss_suspended}) by the time suspend returned, the ledger held {held} bytes",
            comm.rank()
        );
        comm.resume().unwrap();
        sweep(comm);
    }
}

/// Runs `memory_child_rank` in `nranks` processes with `env` (and small
/// FIFOs unless `env` says otherwise); panics unless every rank passes.
fn run_children(nranks: usize, env: &[(&str, &str)]) {
    let mut ranks = children::spawn_ranks("memory_child_rank", nranks, |_| {
        let defaults = [
            (CHILD, "1".to_string()),
            ("NCCL_BUFFSIZE", common::TEST_BUFFSIZE.to_string()),
            ("NCCL_MIN_NCHANNELS", "2".to_string()),
            ("NCCL_MAX_NCHANNELS", "2".to_string()),
            ("RCCL_TIMEOUT_MS", "30000".to_string()),
        ];
        let env = env.iter().map(|&(k, v)| (k, v.to_string()));
        defaults
            .into_iter()
            .chain(env)
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    });
    let ok = ranks.wait_all(Duration::from_secs(60));
    assert!(ok.iter().all(|&ok| ok), "{nranks} ranks, {env:?}: {ok:?}");
}

#[test]
fn processes_over_shm_and_tcp_count_suspend_and_resume() {
    let _serial = serial();
    for nranks in [2, 4] {
        for shm_disable in ["0", "1"] {
            run_children(nranks, &[("NCCL_SHM_DISABLE", shm_disable)]);
        }
    }
    run_children(2, &[("NCCL_MAX_MEM_BYTES", "1000")]);
}

/// Over TCP the network proxy moves the FIFOs: suspend returns only once
/// it has let go of them, so their pages (1 MiB FIFOs: mapped pages the
/// allocator unmaps when freed) are gone when it returns.
#[test]
fn suspend_over_tcp_returns_once_the_fifos_pages_are_gone() {
    let _serial = serial();
    for nranks in [2, 4] {
        run_children(
            nranks,
            &[
                ("NCCL_SHM_DISABLE", "1"),
                ("NCCL_BUFFSIZE", "1048576"),
                (RSS_DROP, "1"),
            ],
        );
    }
}
