//! One network proxy thread per process, however many connections: 8 peers
//! x 4 channels of [`NetConnection`]s (both ends in this process) add one
//! thread, and it ends with the last connection. Alone in its binary so
//! that no other test's threads disturb the count.

mod common;

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::{net_connection_pair, DEADLINE};
use rccl_transports::wait_until;
use rccl_transports::Tag;

/// This process's threads, and how many of them are network proxies.
fn threads() -> (usize, usize) {
    let mut all = 0;
    let mut proxies = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        all += 1;
        let name = std::fs::read_to_string(task.unwrap().path().join("comm")).unwrap_or_default();
        proxies += usize::from(name.trim() == "rccl-net-proxy");
    }
    (all, proxies)
}

/// Waits (up to 5 s) for the thread counts to become `want`.
fn settles_at(want: (usize, usize)) {
    let until = Instant::now() + Duration::from_secs(5);
    while threads() != want && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(threads(), want, "(threads, proxy threads)");
}

#[test]
fn thirty_two_connections_share_one_proxy_thread() {
    const PEERS: usize = 8;
    const CHANNELS: usize = 4;
    let (base, no_proxy) = threads();
    assert_eq!(no_proxy, 0);
    let pairs: Vec<_> = (0..PEERS * CHANNELS)
        .map(|_| net_connection_pair(4, 1024))
        .collect();
    settles_at((base + 1, 1));
    // Every connection moves a piece each way through that one thread.
    let abort = AtomicBool::new(false);
    let deadline = Instant::now() + DEADLINE;
    for (i, (a, b)) in pairs.iter().enumerate() {
        for (from, to) in [(a, b), (b, a)] {
            from.send_fifo().try_reserve().unwrap();
            from.send_fifo().publish(
                8,
                Tag {
                    seq: i as u32,
                    ..Tag::default()
                },
            );
            let (_, len, tag) =
                wait_until(|| to.recv_fifo().try_peek(), None, deadline, &abort).unwrap();
            assert_eq!((len, tag.seq), (8, i as u32));
            to.recv_fifo().release();
        }
    }
    assert_eq!(threads(), (base + 1, 1));
    drop(pairs);
    settles_at((base, 0));
    // A new connection starts a proxy again.
    let pair = net_connection_pair(2, 64);
    settles_at((base + 1, 1));
    drop(pair);
    settles_at((base, 0));
}
