//! Resource leaks across communicator life cycles: file descriptors
//! (`/proc/self/fd`) and threads (`/proc/self/task`) counted before and
//! after many init / all-reduce / destroy cycles, many live communicators
//! at once, and abort-then-drop. One test in its own binary, so that no
//! other test's threads or sockets disturb the counts.

mod common;

use std::time::{Duration, Instant};

use common::{tcp_config, test_config};
use rccl::{Communicator, Config, Group, RedOp};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn counts() -> (usize, usize) {
    (count("/proc/self/fd"), count("/proc/self/task"))
}

/// Waits (up to 5 s) for the counts to come back to `base`: threads that
/// were told to stop take a moment to exit.
fn settles_to(base: (usize, usize), what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now = counts();
    while now != base && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        now = counts();
    }
    assert_eq!(
        now, base,
        "{what}: (file descriptors, threads) grew from {base:?}"
    );
}

/// The counts once they hold still for 200 ms (the network proxy thread
/// leaves a moment after the last network connection), at most 5 s.
fn steady_counts() -> (usize, usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = counts();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = counts();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// One all-reduce on every rank of `comms`, driven from this thread.
fn all_reduce(comms: &[Communicator]) {
    let inputs: Vec<Vec<f32>> = (0..comms.len()).map(|r| vec![r as f32; 100]).collect();
    let mut outputs = vec![vec![0f32; 100]; comms.len()];
    let mut group = Group::new();
    for ((comm, input), output) in comms.iter().zip(&inputs).zip(outputs.iter_mut()) {
        group.all_reduce(comm, input, output, RedOp::Sum).unwrap();
    }
    group.run().unwrap();
    let expected = (0..comms.len()).sum::<usize>() as f32;
    assert!(outputs.iter().all(|o| o.iter().all(|&v| v == expected)));
}

fn cycles(config: &Config, n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        let comms = Communicator::init_all_config(2, config.clone()).unwrap();
        all_reduce(&comms);
    }
    start.elapsed()
}

#[test]
fn nothing_leaks_across_life_cycles() {
    let single = Config {
        min_channels: 1,
        max_channels: 1,
        ..test_config()
    };
    // Warm up whatever the process sets up once.
    cycles(&single, 2);
    cycles(&tcp_config(), 1);
    let base = steady_counts();

    let took = cycles(&single, 1000);
    println!("1000 init / all-reduce / destroy cycles of 2 ranks: {took:?}");
    settles_to(base, "1000 cycles over shared memory");

    let took = cycles(&tcp_config(), 50);
    println!("50 cycles of 2 ranks over TCP: {took:?}");
    settles_to(base, "50 cycles over TCP");

    // Many communicators alive at once.
    let mut live = Vec::new();
    for i in 0..8 {
        let config = if i % 2 == 0 {
            test_config()
        } else {
            tcp_config()
        };
        let comms = Communicator::init_all_config(2, config).unwrap();
        all_reduce(&comms);
        live.push(comms);
    }
    for comms in &live {
        all_reduce(comms);
    }
    drop(live);
    settles_to(base, "16 live communicators");

    // Abort while an operation is blocked, then drop.
    for config in [test_config(), tcp_config()] {
        let comms = Communicator::init_all_config(2, config).unwrap();
        all_reduce(&comms);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                comms[0].abort();
            });
            assert!(comms[0]
                .all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum)
                .is_err());
        });
        drop(comms);
    }
    settles_to(base, "abort then drop");
}
