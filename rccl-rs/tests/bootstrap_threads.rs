//! Init/destroy cycles leave no threads or file descriptors behind. In its
//! own test binary so other tests' threads do not disturb the counts.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rccl::{Bootstrap, UniqueId};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// Waits (briefly) for the count to come back to `want`: root threads exit
/// on their own just after answering.
fn settles(dir: &str, want: usize) -> usize {
    let t = Instant::now();
    loop {
        let c = count(dir);
        if c <= want || t.elapsed() > Duration::from_secs(5) {
            return c;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The count once it has held still for 200 ms (at most 5 s): a root
/// thread of the warm-up cycle may still be on its way out.
fn steady(dir: &str) -> usize {
    let t = Instant::now();
    let mut last = count(dir);
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_millis(200) && t.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(10));
        let c = count(dir);
        if c != last {
            (last, since) = (c, Instant::now());
        }
    }
    last
}

fn cycle(n: usize) {
    let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            thread::spawn(move || {
                let b = Bootstrap::init(
                    &id,
                    r,
                    n,
                    Duration::from_secs(20),
                    Arc::new(AtomicBool::new(false)),
                )
                .unwrap();
                b.allgather(&[r as u8; 10]).unwrap();
                b.barrier().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn no_thread_or_fd_leaks() {
    cycle(2); // warm up lazily created process state
    let tasks = steady("/proc/self/task");
    let fds = steady("/proc/self/fd");
    let t = Instant::now();
    for _ in 0..50 {
        cycle(3);
    }
    eprintln!("50 cycles of 3 ranks: {:?}", t.elapsed());
    // At most as many as before: a thread that was already leaving when
    // the baseline was taken may be gone by now.
    let (tasks_after, fds_after) = (
        settles("/proc/self/task", tasks),
        settles("/proc/self/fd", fds),
    );
    assert!(
        tasks_after <= tasks,
        "threads leaked: {tasks} before, {tasks_after} after"
    );
    assert!(
        fds_after <= fds,
        "fds leaked: {fds} before, {fds_after} after"
    );
}
