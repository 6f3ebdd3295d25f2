//! One-sided calls: windows registered collectively, puts and signals
//! into peers' windows, waits on signal counts; between threads of one
//! process and between processes of one host, over many rounds, with
//! every misuse answered by an error that names the window, the rank and
//! the bytes, and a wait on a dead peer ended naming it. Across hosts,
//! puts land while the target calls nothing.

#[path = "common/children.rs"]
mod children;
mod common;
#[path = "common/device_windows.rs"]
mod device_windows;

use std::process::Command;
use std::time::{Duration, Instant};

use children::spawn_ranks;
use common::gate;
use device_windows::{device_ring, payload, Alloc, DeviceBuffers, ACK, DATA};
use rccl::{
    Communicator, Config, Error, WaitDesc, Window, WIN_COLL_SYMMETRIC, WIN_STRICT_ORDERING,
};

const PAGE: usize = 4096;

/// Shareable host memory of `bytes`, freed on drop.
struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is plain bytes; the tests order writes and reads
// by signals.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(len: usize) -> Buffer {
        Buffer {
            ptr: rccl::alloc_shareable_host(len).unwrap(),
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes were allocated; peers write only between
        // the signals the reader waits for.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let _ = rccl::free_shareable_host(self.ptr);
    }
}

fn config(signals: usize, timeout: Duration) -> Config {
    Config {
        rma_signals: signals,
        timeout,
        ..Config::default()
    }
}

fn register(comm: &Communicator, buf: &Buffer, flags: u32) -> rccl::Result<Window> {
    // SAFETY: the buffer outlives the window (deregistered before drop).
    unsafe { comm.register_window(buf.ptr, buf.len, flags) }
}

/// `rounds` rounds of a ring: each rank puts into the next rank's window
/// (at an offset that moves with the round), waits for the previous
/// rank's data and checks it, then acknowledges it. Windows differ in
/// size per rank. Counts are never reset.
fn ring(comm: &Communicator, rounds: usize, bytes: usize) {
    let (rank, n) = (comm.rank(), comm.count());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let buf = Buffer::new(2 * bytes + rank * PAGE);
    let window = register(comm, &buf, 0).unwrap();
    for round in 0..rounds {
        let offset = (round % 2) * bytes;
        comm.put_signal(&payload(rank, round, bytes), next, window, offset, DATA, 0)
            .unwrap();
        comm.wait_signal(&[WaitDesc {
            peer: prev,
            sig: DATA,
            ctx: 0,
            count: 1,
        }])
        .unwrap();
        assert!(
            buf.bytes()[offset..offset + bytes] == payload(prev, round, bytes)[..],
            "rank {rank} round {round}: wrong data from rank {prev}"
        );
        comm.signal(prev, ACK, 0).unwrap();
        comm.wait_signal(&[WaitDesc {
            peer: next,
            sig: ACK,
            ctx: 0,
            count: 1,
        }])
        .unwrap();
    }
    comm.deregister_window(window).unwrap();
}

fn threads(n: usize, body: impl Fn(&Communicator) + Sync) {
    let comms = Communicator::init_all_config(n, config(2, Duration::from_secs(30))).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            let body = &body;
            s.spawn(move || body(comm));
        }
    });
}

#[test]
fn a_ring_of_puts_between_threads_at_2_and_4_ranks() {
    for n in [2, 4] {
        threads(n, |comm| ring(comm, 300, 1000));
    }
}

/// Between threads a registration maps no window (peers' pointers serve):
/// the ledger counts the signal blocks the first one makes and maps (its
/// own, its peer's), kept across registrations; a cap that leaves no room
/// for its own refuses the registration on every rank.
#[test]
fn the_signal_block_is_in_the_ledger_and_under_its_cap() {
    let block = (64 + 4 * 2 * 2) as u64;
    threads(2, |comm| {
        let before = comm.mem_stats().total;
        let buf = Buffer::new(PAGE);
        for _ in 0..2 {
            let window = register(comm, &buf, 0).unwrap();
            assert_eq!(comm.mem_stats().total - before, 2 * block);
            comm.deregister_window(window).unwrap();
        }
        assert_eq!(comm.mem_stats().persistent, 2 * block);
    });
    let capped = Config {
        board_bytes: 0,
        max_mem_bytes: Some(block - 1),
        ..config(2, Duration::from_secs(30))
    };
    let comms = Communicator::init_all_config(2, capped).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let buf = Buffer::new(PAGE);
                let err = text(register(comm, &buf, 0));
                assert!(
                    err.starts_with("system error: ncclCommWindowRegister: window #0 of rank 0")
                        && err.contains(&format!(
                            "its signal block: rank 0: {block} bytes for the window (host \
                             memory) refused"
                        )),
                    "{err}"
                );
                assert_eq!(comm.mem_stats().total, 0);
            });
        }
    });
}

/// Every rank puts into every other's window inside a group, then waits
/// for all of them in one call.
#[test]
fn puts_to_every_peer_in_a_group_and_one_wait_for_all() {
    threads(4, |comm| {
        let (rank, n) = (comm.rank(), comm.count());
        let buf = Buffer::new(n * 64);
        let window = register(comm, &buf, WIN_COLL_SYMMETRIC).unwrap();
        for round in 0..50 {
            rccl::group_start();
            for peer in (0..n).filter(|&p| p != rank) {
                comm.put_signal(&payload(rank, round, 64), peer, window, rank * 64, DATA, 0)
                    .unwrap();
            }
            rccl::group_end().unwrap();
            let descs: Vec<_> = (0..n)
                .filter(|&p| p != rank)
                .map(|peer| WaitDesc {
                    peer,
                    sig: DATA,
                    ctx: 0,
                    count: 1,
                })
                .collect();
            comm.wait_signal(&descs).unwrap();
            for peer in (0..n).filter(|&p| p != rank) {
                assert_eq!(buf.bytes()[peer * 64..][..64], payload(peer, round, 64)[..]);
            }
            for peer in (0..n).filter(|&p| p != rank) {
                comm.signal(peer, ACK, 0).unwrap();
            }
            let acks: Vec<_> = descs.iter().map(|d| WaitDesc { sig: ACK, ..*d }).collect();
            comm.wait_signal(&acks).unwrap();
        }
        comm.deregister_window(window).unwrap();
    });
}

fn text(result: rccl::Result<impl std::fmt::Debug>) -> String {
    result.expect_err("an error").to_string()
}

#[test]
fn misuse_is_an_error_naming_the_window_the_rank_and_the_bytes() {
    threads(2, |comm| {
        let rank = comm.rank();
        let buf = Buffer::new(2 * PAGE);
        // Signals before any window.
        let err = text(comm.signal(0, 0, 0));
        assert!(err.contains("no window was registered"), "{err}");
        // Rank 1's buffer is misaligned: both ranks fail alike.
        let base = if rank == 1 {
            buf.ptr.wrapping_add(8)
        } else {
            buf.ptr
        };
        // SAFETY: inside the buffer, which outlives the call.
        let err = text(unsafe { comm.register_window(base, PAGE, 0) });
        assert!(
            err.contains("window #0 of rank 1")
                && err.contains(
                    "8 bytes past a multiple of NCCL_WIN_REQUIRED_ALIGNMENT (4096 bytes)"
                ),
            "{err}"
        );
        // Flags differ between ranks.
        let err = text(register(comm, &buf, rank as u32 * 2));
        assert!(
            err.contains("rank 0 registers it with winFlags 0x0, rank 1 with 0x2"),
            "{err}"
        );
        // A symmetric window of two sizes.
        let size = PAGE * (1 + rank);
        // SAFETY: inside the buffer.
        let err = text(unsafe { comm.register_window(buf.ptr, size, WIN_COLL_SYMMETRIC) });
        assert!(
            err.contains("rank 0 registers 4096 bytes and rank 1 8192 bytes"),
            "{err}"
        );
        // Sizes differ per rank without the flag: fine.
        // SAFETY: inside the buffer.
        let window = unsafe { comm.register_window(buf.ptr, size, 0) }.unwrap();
        let peer = 1 - rank;
        let err = text(comm.put_signal(&[0u8; 16], peer, window, PAGE * (1 + peer) - 8, 0, 0));
        assert!(
            err.contains(&format!(
                "16 bytes at offset {} run past the end of window #0 of rank {peer} ({} bytes)",
                PAGE * (1 + peer) - 8,
                PAGE * (1 + peer)
            )),
            "{err}"
        );
        let err = text(comm.signal(peer, 2, 0));
        assert!(err.contains("sigIdx 2 is outside 0..2"), "{err}");
        let err = text(comm.signal(peer, 0, 1));
        assert!(err.contains("ctx 1 is outside 0..1"), "{err}");
        let err = text(comm.signal(7, 0, 0));
        assert!(err.contains("peer 7 is outside 0..2"), "{err}");
        let err = text(comm.wait_signal(&[WaitDesc {
            peer,
            sig: 0,
            ctx: 0,
            count: 0,
        }]));
        assert!(err.contains("opCnt must be positive"), "{err}");
        let err = text(comm.put_signal(&[0u8; 1], peer, Window::from_handle(u64::MAX), 0, 0, 0));
        assert!(
            err.contains("is not a window of this communicator"),
            "{err}"
        );
        // Memory still in a window cannot be freed.
        let err = text(rccl::free_shareable_host(buf.ptr));
        assert!(err.contains("still in 1 registered window"), "{err}");
        comm.deregister_window(window).unwrap();
        let err = text(comm.deregister_window(window));
        assert!(
            err.contains("is not a window of this communicator"),
            "{err}"
        );
    });
}

/// Ranks that deregister different windows both fail, and neither
/// window is lost.
#[test]
fn deregistering_different_windows_fails_on_every_rank() {
    threads(2, |comm| {
        let (a, b) = (Buffer::new(PAGE), Buffer::new(PAGE));
        let wa = register(comm, &a, 0).unwrap();
        let wb = register(comm, &b, 0).unwrap();
        let (mine, other) = if comm.rank() == 0 { (wa, wb) } else { (wb, wa) };
        let err = text(comm.deregister_window(mine));
        assert!(
            err.contains("every rank must deregister the same window"),
            "{err}"
        );
        comm.deregister_window(wa).unwrap();
        comm.deregister_window(wb).unwrap();
        let _ = other;
    });
}

/// A deregistration that the other rank never makes ends at the
/// communicator's deadline with an error, not a hang.
#[test]
fn a_deregistration_on_one_rank_only_ends_at_the_deadline() {
    let comms = Communicator::init_all_config(2, config(1, Duration::from_millis(500))).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let buf = Buffer::new(PAGE);
                let window = register(comm, &buf, 0).unwrap();
                if comm.rank() == 0 {
                    let started = Instant::now();
                    let err = text(comm.deregister_window(window));
                    assert!(started.elapsed() < Duration::from_secs(10));
                    assert!(
                        err.contains("ncclCommWindowDeregister of window #0 of rank 0")
                            && err.contains("every rank of the communicator must make this call"),
                        "{err}"
                    );
                } else {
                    std::thread::sleep(Duration::from_secs(2));
                }
                std::mem::forget(buf);
            });
        }
    });
}

#[test]
fn an_abort_ends_a_wait() {
    let comms = Communicator::init_all_config(2, config(1, Duration::from_secs(60))).unwrap();
    std::thread::scope(|s| {
        let bufs = [Buffer::new(PAGE), Buffer::new(PAGE)];
        let mut windows = Vec::new();
        std::thread::scope(|t| {
            let handles: Vec<_> = comms
                .iter()
                .zip(&bufs)
                .map(|(c, b)| t.spawn(move || register(c, b, 0).unwrap()))
                .collect();
            windows = handles.into_iter().map(|h| h.join().unwrap()).collect();
        });
        let waiter = &comms[0];
        let started = Instant::now();
        let wait = s.spawn(move || {
            waiter.wait_signal(&[WaitDesc {
                peer: 1,
                sig: 0,
                ctx: 0,
                count: 1,
            }])
        });
        std::thread::sleep(Duration::from_millis(200));
        comms[0].abort();
        let err = wait.join().unwrap().unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(err.to_string().contains("aborted"), "{err}");
        assert!(matches!(err, Error::InvalidUsage(_)));
        std::mem::forget(bufs);
    });
}

const CHILD: &str = "RCCL_ONE_SIDED_CHILD";
/// The process's encryption key (`ncclSetEncryption`), if set.
const PSK: &str = "RCCL_ONE_SIDED_PSK";

/// One rank of the processes' tests; does nothing when run directly.
#[test]
fn child_rank() {
    let Some(role) = std::env::var_os(CHILD) else {
        return;
    };
    let role = role.to_str().unwrap();
    if role == "emu-threads" {
        return emu_threads();
    }
    if role == "emu-ring" {
        let comm = Communicator::from_env_config(config(2, Duration::from_secs(60))).unwrap();
        return device_ring(&comm, 100, 3000, Alloc::Shareable);
    }
    if let Ok(key) = std::env::var(PSK) {
        rccl::set_encryption(Some(key.as_bytes())).unwrap();
    }
    let mut cfg = config(2, Duration::from_secs(60));
    if role == "cap" {
        // Room for the signal blocks, not for a mapping of a window.
        cfg.board_bytes = 0;
        cfg.max_mem_bytes = Some(PAGE as u64 - 1);
    }
    let comm = Communicator::from_env_config(cfg).unwrap();
    match role {
        "ring" => ring(&comm, 300, 4096),
        "ledger" => {
            // Each rank maps its peer's memory file and signal block, and
            // makes its own block; the deregistration gives the mapping
            // back, the blocks live as long as the communicator.
            let (rank, peer) = (comm.rank(), 1 - comm.rank());
            let block = (64 + 4 * 2 * 2) as u64;
            let before = comm.mem_stats();
            let buf = Buffer::new((rank + 1) * PAGE);
            let window = register(&comm, &buf, 0).unwrap();
            let during = comm.mem_stats();
            let mapped = ((peer + 1) * PAGE) as u64;
            assert_eq!(during.total - before.total, 2 * block + mapped);
            assert_eq!(during.persistent - before.persistent, 2 * block + mapped);
            let windows: Vec<_> = comm
                .memory()
                .breakdown()
                .into_iter()
                .filter(|u| u.purpose == rccl::Purpose::Window)
                .map(|u| (u.peer, u.bytes, u.suspendable))
                .collect();
            assert_eq!(
                windows,
                [(None, block, false), (Some(peer), block + mapped, false)]
            );
            comm.deregister_window(window).unwrap();
            assert_eq!(comm.mem_stats().total - before.total, 2 * block);
        }
        "cap" => {
            // The mapping of the peer's window passes NCCL_MAX_MEM_BYTES:
            // every rank fails with the cap's figures, and holds nothing.
            let buf = Buffer::new(PAGE);
            let err = text(register(&comm, &buf, 0));
            assert!(
                err.starts_with("system error: ncclCommWindowRegister: mapping window #0 of rank")
                    && err.contains(&format!(
                        "{PAGE} bytes for the window (host memory, to rank"
                    ))
                    && err.contains(&format!("NCCL_MAX_MEM_BYTES allows {}", PAGE - 1)),
                "{err}"
            );
            assert_eq!(comm.mem_stats().total, 0);
        }
        // Beyond one message's piece across hosts.
        "ring-big" => ring(&comm, 3, 5 << 20),
        "no-wait" => lands_without_a_wait(&comm),
        "deregister" => puts_land_before_the_deregistration(&comm),
        "abort" => nothing_lands_after_an_abort(comm),
        "dies" => {
            let buf = Buffer::new(PAGE);
            let window = register(&comm, &buf, 0).unwrap();
            if comm.rank() == 1 {
                std::process::exit(0);
            }
            let started = Instant::now();
            let err = comm
                .wait_signal(&[WaitDesc {
                    peer: 1,
                    sig: 0,
                    ctx: 0,
                    count: 1,
                }])
                .unwrap_err()
                .to_string();
            assert!(started.elapsed() < Duration::from_secs(20), "{err}");
            assert!(
                err.contains("from rank 1 (host") && err.contains("0 arrived"),
                "{err}"
            );
            let _ = window;
            std::mem::forget(buf);
        }
        "plain" => {
            // Memory not from ncclMemAlloc cannot be mapped by a peer
            // process: every rank hears which rank's window it is.
            let mut plain = vec![0u8; 3 * PAGE];
            let at = plain
                .as_mut_ptr()
                .wrapping_add(PAGE - plain.as_ptr() as usize % PAGE);
            // SAFETY: inside `plain`, which outlives the call.
            let err = text(unsafe { comm.register_window(at, PAGE, 0) });
            assert!(
                err.contains("window #0 of rank 1")
                    && err.contains("is not memory from ncclMemAlloc"),
                "{err}"
            );
        }
        "device" | "device-hosts" => {
            // Device memory (the emulated GPU's) not from ncclMemAlloc
            // cannot be mapped by a peer process; none reaches another
            // host: every rank hears which rank's window it is.
            let device = rccl::device::active().expect("RCCL_DEVICE=emu");
            let mem = match role {
                "device" => device.alloc(PAGE).unwrap(),
                _ => device.alloc_shareable(PAGE).unwrap(),
            };
            // SAFETY: `mem` holds PAGE bytes until freed below.
            let err = text(unsafe { comm.register_window(mem, PAGE, 0) });
            let expected = match role {
                "device" => "window #0 of rank 1 (0x",
                _ => {
                    "window #0 of rank 0 is device memory, which windows reach between ranks of \
                      one host only, and rank 1 (host"
                }
            };
            assert!(err.contains(expected), "{err}");
            if role == "device" {
                assert!(
                    err.contains(&format!("{PAGE} bytes) is not memory from ncclMemAlloc")),
                    "{err}"
                );
            }
            // SAFETY: nothing uses the memory any more.
            unsafe { device.free(mem) }.unwrap();
        }
        other => panic!("unknown role {other}"),
    }
}

/// Polls `buf` until it holds `want` or 20 s pass.
fn lands(buf: &Buffer, want: &[u8]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while buf.bytes() != want {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

fn from_rank_0(count: usize) -> WaitDesc {
    WaitDesc {
        peer: 0,
        sig: DATA,
        ctx: 0,
        count,
    }
}

/// Rank 0 puts into rank 1 on another host, which calls nothing until
/// the data is in its window: twice into the same bytes (the second
/// stays: call order), once beside them; then a wait finds the signals
/// risen. A signal sent just before a suspend is there after the resume.
fn lands_without_a_wait(comm: &Communicator) {
    // Two messages each.
    let bytes = 5 << 20;
    let buf = Buffer::new(2 * bytes);
    let window = register(comm, &buf, WIN_STRICT_ORDERING).unwrap();
    let put = |round, offset| {
        comm.put_signal(&payload(0, round, bytes), 1, window, offset, DATA, 0)
            .unwrap()
    };
    if comm.rank() == 0 {
        put(0, 0);
        put(1, 0);
        put(2, bytes);
        comm.signal(1, DATA, 0).unwrap();
    } else {
        let want = [payload(0, 1, bytes), payload(0, 2, bytes)].concat();
        assert!(
            lands(&buf, &want),
            "rank 1: rank 0's puts did not land while rank 1 did not wait"
        );
        comm.wait_signal(&[from_rank_0(3)]).unwrap();
    }
    comm.suspend().unwrap();
    comm.resume().unwrap();
    if comm.rank() == 1 {
        comm.wait_signal(&[from_rank_0(1)]).unwrap();
    }
    comm.deregister_window(window).unwrap();
}

/// Rank 1 puts into rank 0, on another host, and every rank deregisters
/// at once, waiting for nothing: the deregistration's own messages reach
/// rank 0 through ranks 2 and 3, on other connections than the put, and
/// the put still lands before it returns.
fn puts_land_before_the_deregistration(comm: &Communicator) {
    // Three messages.
    let bytes = 9 << 20;
    let buf = Buffer::new(bytes);
    let window = register(comm, &buf, 0).unwrap();
    if comm.rank() == 1 {
        comm.put_signal(&payload(1, 0, bytes), 0, window, 0, DATA, 0)
            .unwrap();
    }
    comm.deregister_window(window).unwrap();
    if comm.rank() == 0 {
        assert!(
            buf.bytes() == payload(1, 0, bytes),
            "rank 0: the put of rank 1 had not landed when the deregistration returned"
        );
    }
}

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Rank 0 keeps putting into rank 1, which aborts once the first put
/// landed: nothing lands after the abort returned, and the destroy ends
/// the bootstrap's listener thread, which landed them.
fn nothing_lands_after_an_abort(comm: Communicator) {
    let buf = Buffer::new(PAGE);
    let window = register(&comm, &buf, 0).unwrap();
    if comm.rank() == 0 {
        let until = Instant::now() + Duration::from_millis(1500);
        for round in 1u64.. {
            let sent = comm.put_signal(&[round], 1, window, 0, DATA, 0);
            if sent.is_err() || Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        std::mem::forget(buf);
        return;
    }
    let threads = threads_now();
    let first = Instant::now() + Duration::from_secs(20);
    while buf.bytes()[..8] == [0; 8] {
        assert!(Instant::now() < first, "rank 1: no put landed");
        std::thread::sleep(Duration::from_micros(100));
    }
    comm.abort();
    let seen = buf.bytes().to_vec();
    std::thread::sleep(Duration::from_millis(300));
    assert!(buf.bytes() == seen, "rank 1: a put landed after the abort");
    let _ = comm.destroy();
    let settled = Instant::now() + Duration::from_secs(5);
    while threads_now() >= threads && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        threads_now() < threads,
        "rank 1: {} threads after the destroy, {threads} while it ran",
        threads_now()
    );
    std::mem::forget(buf);
}

fn processes(n: usize, role: &str) {
    processes_on_hosts(n, role, |_| 0);
}

/// `n` processes in `role`, rank `r` on the host `host_of(r)` names
/// (`NCCL_HOSTID`).
fn processes_on_hosts(n: usize, role: &str, host_of: fn(usize) -> usize) {
    processes_with(n, role, host_of, &[]);
}

fn processes_with(n: usize, role: &str, host_of: fn(usize) -> usize, env: &[(&str, &str)]) {
    let mut ranks = spawn_ranks("child_rank", n, |rank| {
        let mut vars = vec![
            (CHILD.to_string(), role.to_string()),
            ("NCCL_HOSTID".to_string(), format!("host{}", host_of(rank))),
        ];
        vars.extend(env.iter().map(|&(k, v)| (k.to_string(), v.to_string())));
        vars
    });
    let ok = ranks.wait_all(Duration::from_secs(60));
    assert!(ok.iter().all(|&ok| ok), "{role}: {ok:?}");
}

#[test]
fn a_ring_of_puts_between_processes_at_2_and_4_ranks() {
    processes(2, "ring");
    processes(4, "ring");
}

/// Ranks on two hosts (`NCCL_HOSTID`) alternating around the ring: puts
/// to the other host travel as messages, to the same host as writes.
#[test]
fn a_ring_of_puts_across_hosts() {
    processes_on_hosts(2, "ring", |r| r);
    processes_on_hosts(4, "ring", |r| r % 2);
    processes_on_hosts(2, "ring-big", |r| r);
}

#[test]
fn puts_across_hosts_land_without_the_target_taking_part() {
    processes_on_hosts(2, "no-wait", |r| r);
    processes_with(
        2,
        "no-wait",
        |r| r,
        &[(PSK, "one-sided puts over TCP sealed with this key")],
    );
    processes_on_hosts(4, "deregister", |r| r % 2);
    processes_on_hosts(2, "abort", |r| r);
}

#[test]
fn a_dead_peer_ends_a_wait_naming_it() {
    processes(2, "dies");
}

/// Windows of the emulated GPU's device memory between threads, under
/// `RCCL_DEVICE=emu` (in a child process, so the device is active there
/// alone).
#[test]
fn device_windows_between_threads_order_puts_on_streams() {
    processes_with(1, "emu-threads", |_| 0, &[("RCCL_DEVICE", "emu")]);
}

/// Windows of shareable device memory (`ncclMemAlloc` on the emulated
/// GPU) between processes: each maps its peers' allocations.
#[test]
fn device_windows_between_processes_at_2_and_4_ranks() {
    processes_with(2, "emu-ring", |_| 0, &[("RCCL_DEVICE", "emu")]);
    processes_with(4, "emu-ring", |_| 0, &[("RCCL_DEVICE", "emu")]);
}

fn emu_threads() {
    for n in [2, 4] {
        let comms = Communicator::init_all_config(n, config(2, Duration::from_secs(30))).unwrap();
        std::thread::scope(|s| {
            for comm in &comms {
                s.spawn(move || device_ring(comm, 100, 3000, Alloc::Plain));
            }
        });
    }
    a_queued_signal_holds_no_communicator();
    let comms = Communicator::init_all_config(2, config(1, Duration::from_secs(30))).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || suspend_after_a_held_put(comm));
        }
    });
    let comms = Communicator::init_all_config(2, config(1, Duration::from_secs(30))).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || finalize_after_a_held_put(comm));
        }
    });
    let comms = Communicator::init_all_config(2, config(1, Duration::from_secs(1))).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || gated_put_and_late_wait(comm));
        }
    });
}

/// Rank 0's put waits behind a task that holds its stream while every
/// handle of both communicators goes: the task raising its signal holds
/// no communicator (both are gone at once), and the bytes still land
/// once the stream runs.
fn a_queued_signal_holds_no_communicator() {
    let comms = Communicator::init_all_config(2, config(1, Duration::from_secs(30))).unwrap();
    let mems = [0, 1].map(|_| DeviceBuffers::new(PAGE, Alloc::Plain));
    let bases = mems.each_ref().map(|m| m.window as usize);
    let windows: Vec<Window> = std::thread::scope(|s| {
        let joins: Vec<_> = comms
            .iter()
            .zip(bases)
            // SAFETY: the memory outlives the windows (the communicators
            // go first).
            .map(|(comm, base)| {
                s.spawn(move || unsafe { comm.register_window(base as *mut u8, PAGE, 0) })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap().unwrap())
            .collect()
    });
    let open = gate(&*mems[0].stream);
    let data = vec![3u8; 64];
    let raw = mems[0].stream.raw();
    // SAFETY: `data` outlives the stream's run (synced below).
    unsafe { comms[0].put_signal_on_stream(data.as_ptr(), 64, 1, windows[0], 64, 0, 0, raw) }
        .unwrap();
    drop(comms);
    assert_eq!(rccl::hang_report(), "rccl: no live communicators");
    open.store(true, std::sync::atomic::Ordering::Release);
    mems[0].sync();
    assert_eq!(mems[1].read(64, 64), data);
}

/// Rank 0 enqueues a put behind a task that holds its stream, then
/// finalizes: the finalize returns only once the stream ran the put (and
/// raised its signal).
fn finalize_after_a_held_put(comm: &Communicator) {
    let mem = DeviceBuffers::new(PAGE, Alloc::Plain);
    // SAFETY: the memory outlives the window (deregistered before drop).
    let window = unsafe { comm.register_window(mem.window, PAGE, 0) }.unwrap();
    let data = vec![5u8; 64];
    if comm.rank() == 0 {
        held_put_then(comm, &mem, window, 512, &data, "finalize", || {
            comm.finalize()
        });
    } else {
        comm.wait_signal(&[first_signal()]).unwrap();
        assert_eq!(mem.read(512, 64), data);
    }
    comm.deregister_window(window).unwrap();
}

/// Rank 0's side: `data` put at `offset` of rank 1's window behind a task
/// that holds the stream, then `call` (named `what`), which must return
/// only once the stream ran the put: the hold ends 300 ms into it.
fn held_put_then(
    comm: &Communicator,
    mem: &DeviceBuffers,
    window: Window,
    offset: usize,
    data: &[u8],
    what: &str,
    call: impl FnOnce() -> rccl::Result<()>,
) {
    use std::sync::atomic::Ordering;
    let open = gate(&*mem.stream);
    let raw = mem.stream.raw();
    // SAFETY: `data` outlives the stream's run (`call` waits for it).
    unsafe { comm.put_signal_on_stream(data.as_ptr(), data.len(), 1, window, offset, 0, 0, raw) }
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            open.store(true, Ordering::Release);
        });
        call().unwrap();
        assert!(
            open.load(Ordering::Acquire),
            "the {what} returned before the stream ran the put"
        );
    });
}

/// Signal 0 of context 0 from rank 0, once.
fn first_signal() -> WaitDesc {
    WaitDesc {
        peer: 0,
        sig: 0,
        ctx: 0,
        count: 1,
    }
}

/// Rank 0 enqueues a put behind a task that holds its stream: the put
/// lands only once the task ends. Rank 1's stream wait for a signal that
/// never comes ends at the timeout and fails the communicator, naming
/// rank 0.
fn gated_put_and_late_wait(comm: &Communicator) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static OPENED: AtomicBool = AtomicBool::new(false);
    let mem = DeviceBuffers::new(PAGE, Alloc::Plain);
    // SAFETY: the memory outlives the window (deregistered before drop).
    let window = unsafe { comm.register_window(mem.window, PAGE, 0) }.unwrap();
    let raw = mem.stream.raw();
    let wait = |count| WaitDesc {
        peer: 0,
        sig: 0,
        ctx: 0,
        count,
    };
    let data = vec![7u8; 64];
    if comm.rank() == 0 {
        let open = gate(&*mem.stream);
        // SAFETY: `data` outlives the stream's run (synced below).
        unsafe { comm.put_signal_on_stream(data.as_ptr(), 64, 1, window, 128, 0, 0, raw) }.unwrap();
        std::thread::sleep(Duration::from_millis(200));
        OPENED.store(true, Ordering::Release);
        open.store(true, Ordering::Release);
        mem.sync();
    } else {
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            mem.read(128, 64),
            [0u8; 64],
            "the put landed before the stream got to it"
        );
        comm.wait_signal(&[wait(1)]).unwrap();
        assert!(OPENED.load(Ordering::Acquire));
        assert_eq!(mem.read(128, 64), data);
        // No second signal comes: the stream wait fails at the deadline.
        comm.wait_signal_on_stream(&[wait(1)], raw).unwrap();
        mem.sync();
        let err = comm.async_error().expect("the wait failed").to_string();
        assert!(
            err.contains("ncclWaitSignal: rank 1 waited") && err.contains("from rank 0"),
            "{err}"
        );
    }
    let _ = comm.deregister_window(window);
}

/// Rank 0 enqueues a put behind a task that holds its stream, then
/// suspends: the suspend returns only once the stream ran the put, so
/// rank 1, past the suspend's barrier, finds the bytes; the signal's
/// count survives the suspend.
fn suspend_after_a_held_put(comm: &Communicator) {
    let mem = DeviceBuffers::new(PAGE, Alloc::Plain);
    // SAFETY: the memory outlives the window (deregistered before drop).
    let window = unsafe { comm.register_window(mem.window, PAGE, 0) }.unwrap();
    let data = vec![9u8; 64];
    if comm.rank() == 0 {
        held_put_then(comm, &mem, window, 256, &data, "suspend", || comm.suspend());
    } else {
        comm.suspend().unwrap();
        assert_eq!(
            mem.read(256, 64),
            data,
            "the put had not landed at the suspend"
        );
    }
    comm.resume().unwrap();
    if comm.rank() == 1 {
        comm.wait_signal(&[first_signal()]).unwrap();
    }
    comm.deregister_window(window).unwrap();
}

/// A registration enters the mappings it makes in the ledger, and the
/// ledger's cap refuses one on every rank.
#[test]
fn windows_between_processes_are_in_the_ledger_and_under_its_cap() {
    processes(2, "ledger");
    processes(2, "cap");
}

#[test]
fn device_memory_not_from_nccl_mem_alloc_or_across_hosts_is_refused_on_every_rank() {
    processes_with(2, "device", |_| 0, &[("RCCL_DEVICE", "emu")]);
    processes_with(2, "device-hosts", |r| r, &[("RCCL_DEVICE", "emu")]);
}

#[test]
fn plain_memory_is_refused_for_peers_in_other_processes() {
    processes(2, "plain");
}

/// The perf binary runs both methods side by side, as threads, as
/// processes, and as processes on hosts of their own.
#[test]
fn putsignal_perf_reports_both_methods() {
    for mode in [&[][..], &["--procs"][..], &["--procs", "--hosts"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_putsignal_perf"))
            .args(["-g", "2", "-b", "8,64K", "-n", "20", "-r", "2"])
            .args(mode)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for size in ["8", "65536"] {
            for method in ["send/recv", "put/signal"] {
                assert!(
                    text.lines()
                        .any(|l| l.split_whitespace().take(2).eq([size, method])),
                    "{mode:?}: no {method} line for {size} bytes:\n{text}"
                );
            }
        }
    }
}
