//! The bootstrap network with ranks as threads, on loopback.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rccl::Error;
use rccl::{Bootstrap, UniqueId};
use rccl_transports::auth_tcp::{self, Secret};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn no_abort() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// Runs `f(bootstrap)` on `n` rank threads.
fn run_ranks<T: Send + 'static>(
    id: UniqueId,
    n: usize,
    timeout: Duration,
    f: impl Fn(Bootstrap) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            thread::spawn(move || f(Bootstrap::init(&id, r, n, timeout, no_abort()).unwrap()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn payload(rank: usize, round: usize) -> Vec<u8> {
    vec![(rank * 7 + round) as u8; rank * 3 + round]
}

fn exercise(b: &Bootstrap) {
    let (n, r) = (b.nranks(), b.rank());
    // Consecutive allgathers with different-length payloads never mix.
    for round in 0..3 {
        let all = b.allgather(&payload(r, round)).unwrap();
        assert_eq!(all.len(), n);
        for (peer, got) in all.iter().enumerate() {
            assert_eq!(
                got,
                &payload(peer, round),
                "rank {r} round {round} from {peer}"
            );
        }
        b.barrier().unwrap();
    }
    // Tagged send/recv: everyone sends to everyone (itself included) under
    // two tags, received in the opposite tag order.
    for peer in 0..n {
        b.send(peer, 7, format!("{r}->{peer} seven").as_bytes())
            .unwrap();
        b.send(peer, 9, format!("{r}->{peer} nine").as_bytes())
            .unwrap();
    }
    for peer in (0..n).rev() {
        assert_eq!(
            b.recv(peer, 9).unwrap(),
            format!("{peer}->{r} nine").as_bytes()
        );
        assert_eq!(
            b.recv(peer, 7).unwrap(),
            format!("{peer}->{r} seven").as_bytes()
        );
    }
    b.barrier().unwrap();
    assert_eq!(b.peer_addr(r).ip(), LOCALHOST);
}

#[test]
fn ranks_1_2_4_8() {
    for n in [1, 2, 4, 8] {
        let id = UniqueId::new_on(LOCALHOST).unwrap();
        let t = Instant::now();
        run_ranks(id, n, Duration::from_secs(20), |b| exercise(&b));
        eprintln!("{n} ranks: {:?}", t.elapsed());
    }
}

#[test]
fn new_honours_socket_ifname() {
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let id = UniqueId::new().unwrap();
    assert!(id.root_addr().unwrap().ip().is_loopback());
    run_ranks(id, 3, Duration::from_secs(20), |b| exercise(&b));
}

#[test]
fn large_allgather() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    run_ranks(id, 3, Duration::from_secs(20), |b| {
        let mine = vec![b.rank() as u8; 2 << 20];
        let all = b.allgather(&mine).unwrap();
        for (r, v) in all.iter().enumerate() {
            assert!(v.len() == 2 << 20 && v.iter().all(|&x| x == r as u8));
        }
    });
}

/// Connects with a wrong secret and expects refusal.
fn wrong_secret_client(addr: SocketAddr) {
    let e = auth_tcp::connect(
        addr,
        &Secret::random(),
        b"hi",
        Instant::now() + Duration::from_secs(10),
    )
    .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
}

/// Sends garbage and leaves it open for a while.
fn garbage_client(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n and a lot more garbage to fill a handshake");
    s
}

#[test]
fn intruders_do_not_disturb_init() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let root = id.root_addr().unwrap();
    let _g = garbage_client(root);
    wrong_secret_client(root);
    let n = 4;
    let gate = Arc::new(Barrier::new(n + 1));
    let g2 = gate.clone();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let gate = gate.clone();
            thread::spawn(move || {
                let b = Bootstrap::init(&id, r, n, Duration::from_secs(20), no_abort()).unwrap();
                let addrs = b.allgather(&[]).unwrap();
                assert_eq!(addrs.len(), n);
                if r == 0 {
                    // Hand the listener addresses to the intruders.
                    let list: Vec<SocketAddr> = (0..n).map(|p| b.peer_addr(p)).collect();
                    INTRUDE.lock().unwrap().extend(list);
                }
                gate.wait(); // intruders attack here
                gate.wait();
                exercise(&b);
            })
        })
        .collect();
    g2.wait();
    let addrs: Vec<SocketAddr> = INTRUDE.lock().unwrap().clone();
    let mut keep = Vec::new();
    for a in &addrs {
        keep.push(garbage_client(*a));
        wrong_secret_client(*a);
        // A truncated handshake.
        let mut s = TcpStream::connect(a).unwrap();
        let _ = s.write_all(b"RCCLAUTH");
        drop(s);
    }
    g2.wait();
    for h in handles {
        h.join().unwrap();
    }
    drop(keep);
}

static INTRUDE: std::sync::Mutex<Vec<SocketAddr>> = std::sync::Mutex::new(Vec::new());

/// A port free now, below the kernel's ephemeral range (32768 and up by
/// default): between this check and the root's bind, no socket bound to
/// port 0 (this process's or another's) can be handed it.
fn free_port() -> u16 {
    let seed = std::process::id() as usize
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as usize;
    (0..12_000)
        .map(|i| 20_000 + (seed + i) % 12_000)
        .find_map(|p| TcpListener::bind((LOCALHOST, p as u16)).ok())
        .expect("a free port below 32000")
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn from_address_with_serve_root() {
    let addr = format!("127.0.0.1:{}", free_port());
    let ids: Vec<UniqueId> = (0..4)
        .map(|_| UniqueId::from_address(&addr).unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] == w[1]),
        "every rank derives the same id"
    );
    assert_eq!(ids[0].root_addr().unwrap().to_string(), addr);
    let id = ids[0];
    // Ranks 1.. may start before rank 0 serves the root: they retry.
    let n = 4;
    let handles: Vec<_> = (0..n)
        .map(|r| {
            thread::spawn(move || {
                if r == 0 {
                    thread::sleep(Duration::from_millis(200));
                    id.serve_root().unwrap();
                }
                let b = Bootstrap::init(&id, r, n, Duration::from_secs(20), no_abort()).unwrap();
                exercise(&b);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(UniqueId::from_address("not an address").is_err());
    assert!(UniqueId::from_address("127.0.0.1:0").is_err());
    assert!(format!("{:?}", id).contains(&addr));
}

#[test]
fn invalid_unique_id() {
    let mut bytes = UniqueId::new_on(LOCALHOST).unwrap().0;
    bytes[0] ^= 1;
    let e = UniqueId(bytes).root_addr().unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.starts_with("unique id is not valid")),
        "{e}"
    );
    let e = Bootstrap::init(
        &UniqueId([0; 128]),
        0,
        1,
        Duration::from_secs(1),
        no_abort(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let e = Bootstrap::init(&id, 2, 2, Duration::from_secs(1), no_abort()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

#[test]
fn missing_rank_times_out_naming_it() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let n = 4;
    let t = Instant::now();
    // Rank 2 never shows up.
    let handles: Vec<_> = [0, 1, 3]
        .into_iter()
        .map(|r| {
            thread::spawn(move || {
                Bootstrap::init(&id, r, n, Duration::from_millis(500), no_abort())
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap().unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::System(_)), "{msg}");
        assert!(msg.contains("timed out") && msg.contains("[2]"), "{msg}");
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn nranks_mismatch_and_duplicate_rank_reported_to_every_rank() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let handles: Vec<_> = [(0, 3), (1, 3), (2, 4)]
        .into_iter()
        .map(|(r, n)| {
            thread::spawn(move || {
                if r == 2 {
                    thread::sleep(Duration::from_millis(100));
                }
                Bootstrap::init(&id, r, n, Duration::from_secs(5), no_abort())
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap().unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUsage(m) if m.contains("nranks mismatch")),
            "{e}"
        );
    }
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let handles: Vec<_> = [0, 1, 1]
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50 * i as u64));
                Bootstrap::init(&id, r, 3, Duration::from_secs(5), no_abort())
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap().unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUsage(m) if m.contains("registered twice")),
            "{e}"
        );
    }
}

#[test]
fn recv_timeout_and_abort() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let n = 2;
    let aborts: Vec<Arc<AtomicBool>> = (0..n).map(|_| no_abort()).collect();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let abort = aborts[r].clone();
            thread::spawn(move || {
                Bootstrap::init(&id, r, n, Duration::from_millis(300), abort).unwrap()
            })
        })
        .collect();
    let bs: Vec<Bootstrap> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Timeout names the peer and what was awaited.
    let t = Instant::now();
    let e = bs[0].recv(1, 42).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(300));
    let msg = e.to_string();
    assert!(
        matches!(e, Error::System(_)) && msg.contains("rank 1") && msg.contains("tag 42"),
        "{msg}"
    );
    // Abort unblocks promptly.
    let a = aborts[1].clone();
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(100));
            a.store(true, Ordering::Relaxed);
        });
        let t = Instant::now();
        let e = bs[1].recv(0, 1).unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("aborted"), "{e}");
    });
    // A peer that went away is reported as such, not as a timeout.
    aborts[1].store(false, Ordering::Relaxed);
    let mut bs = bs;
    let b1 = bs.pop().unwrap();
    let b0 = bs.pop().unwrap();
    b1.send(0, 5, b"last words").unwrap();
    drop(b1);
    assert_eq!(b0.recv(1, 5).unwrap(), b"last words");
    let e = b0.recv(1, 5).unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("rank 1")),
        "{e}"
    );
    let e = b0
        .send(1, 5, b"anyone?")
        .and_then(|_| b0.send(1, 5, b"anyone?"))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("rank 1")),
        "{e}"
    );
}

#[test]
fn a_root_past_its_deadline_does_not_stop_the_others() {
    // The process's one root service thread polls every root: `a` coming
    // to its deadline while a handshake at `b` is under way (a client
    // that says nothing) must leave `b` served.
    let a: Vec<UniqueId> = (0..3)
        .map(|_| UniqueId::new_on(LOCALHOST).unwrap())
        .collect();
    let b = UniqueId::new_on(LOCALHOST).unwrap();
    let silent = TcpStream::connect(b.root_addr().unwrap()).unwrap();
    for a in &a {
        let e = Bootstrap::init(a, 0, 2, Duration::from_millis(100), no_abort()).unwrap_err();
        assert!(e.to_string().contains("timed out"), "{e}");
    }
    run_ranks(b, 2, Duration::from_secs(5), |bs| exercise(&bs));
    drop(silent);
}

#[test]
fn huge_timeout_does_not_overflow() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    run_ranks(id, 2, Duration::MAX, |b| exercise(&b));
}

#[test]
fn abort_unblocks_init() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let abort = no_abort();
    let a = abort.clone();
    let h = thread::spawn(move || Bootstrap::init(&id, 0, 2, Duration::from_secs(30), a));
    thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    abort.store(true, Ordering::Relaxed);
    let e = h.join().unwrap().unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(e.to_string().contains("aborted"), "{e}");
}

#[test]
fn silent_clients_do_not_delay_init_or_the_bootstrap_network() {
    let id = UniqueId::new_on(LOCALHOST).unwrap();
    let root = id.root_addr().unwrap();
    let silent: Vec<TcpStream> = (0..60).map(|_| TcpStream::connect(root).unwrap()).collect();
    let n = 4;
    let t = Instant::now();
    let bootstraps: Vec<Bootstrap> = (0..n)
        .map(|r| {
            thread::spawn(move || Bootstrap::init(&id, r, n, Duration::from_secs(20), no_abort()))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    // One at a time, the silent clients held the root a second each.
    let took = t.elapsed();
    eprintln!("init of {n} ranks beside 60 silent clients: {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // 30 more at every rank's listener before the ranks first dial each other.
    let more: Vec<TcpStream> = (0..n)
        .flat_map(|r| {
            let addr = bootstraps[0].peer_addr(r);
            (0..30).map(move |_| TcpStream::connect(addr).unwrap())
        })
        .collect();
    let t = Instant::now();
    let handles: Vec<_> = bootstraps
        .into_iter()
        .map(|b| thread::spawn(move || exercise(&b)))
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    drop((silent, more));
}

fn root_service_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == "rccl-boot-root")
        })
        .count()
}

/// The TCP sockets this process listens on, by port: its sockets'
/// inodes (`/proc/self/fd`) among the listening ones of
/// `/proc/self/net/tcp`.
fn listening_sockets() -> std::collections::HashMap<u16, String> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = u16::from_str_radix(f.get(1)?.split(':').nth(1)?, 16).ok()?;
            let inode = f.get(9)?.to_string();
            (f.get(3) == Some(&"0A") && inodes.contains(&inode)).then_some((port, inode))
        })
        .collect()
}

/// Set in the child process that runs the test below alone.
const ALONE: &str = "RCCL_BOOTSTRAP_TEST_ALONE";

#[test]
fn unused_unique_ids_share_one_thread_and_the_oldest_release_their_ports() {
    // The cap on unused ids is per process: beside the other tests, its
    // 100 ids would release their roots before their ranks register.
    if std::env::var_os(ALONE).is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "unused_unique_ids_share_one_thread_and_the_oldest_release_their_ports",
                "--nocapture",
            ])
            .env(ALONE, "1")
            .status()
            .unwrap();
        assert!(status.success(), "{status}");
        return;
    }
    // Each id with the listening socket its root was given: once the
    // root is released, its port may go to a later id's root (or another
    // process's socket), so a port still open says nothing.
    let ids: Vec<(UniqueId, String)> = (0..100)
        .map(|_| {
            let id = UniqueId::new_on(LOCALHOST).unwrap();
            let port = id.root_addr().unwrap().port();
            (id, listening_sockets()[&port].clone())
        })
        .collect();
    assert!(root_service_threads() <= 1, "{}", root_service_threads());
    // At most 64 unused ids keep their port: the oldest 36 are released.
    // Which of `ids` are released, from one look at the sockets.
    let released = || {
        let open: std::collections::HashSet<String> = listening_sockets().into_values().collect();
        ids.iter()
            .map(|(_, socket)| !open.contains(socket))
            .collect::<Vec<bool>>()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !released()[..36].iter().all(|&r| r) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let released = released();
    assert!(released[..36].iter().all(|&r| r));
    assert!(!released[36..].iter().any(|&r| r));
    // The newest still serves, and so does a fresh one.
    run_ranks(ids[99].0, 2, Duration::from_secs(20), |b| exercise(&b));
    run_ranks(
        UniqueId::new_on(LOCALHOST).unwrap(),
        2,
        Duration::from_secs(20),
        |b| exercise(&b),
    );
    assert!(root_service_threads() <= 1, "{}", root_service_threads());
}
