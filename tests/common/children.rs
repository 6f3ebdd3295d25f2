//! Child processes of a test binary (ranks, perf runs): a port for them to
//! meet on, ranks started as children running one of the binary's tests,
//! and a guard that kills them when the test ends, also when it fails or
//! panics, so that none is left running (included with `#[path]`).

// Each test binary uses part of this.
#![allow(dead_code)]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A port of loopback that nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `n` ranks, each a child running this binary's test `child_test`
/// alone, meeting on a free loopback port (`RANK`, `WORLD_SIZE`,
/// `MASTER_ADDR`, `MASTER_PORT`), with `env_of_rank(rank)` set after those
/// (later entries override earlier ones).
pub fn spawn_ranks(
    child_test: &str,
    n: usize,
    env_of_rank: impl Fn(usize) -> Vec<(String, String)>,
) -> Ranks {
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    Ranks(
        (0..n)
            .map(|rank| {
                Command::new(&exe)
                    .args(["--exact", child_test, "--nocapture", "--test-threads", "1"])
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", n.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", &port)
                    .envs(env_of_rank(rank))
                    .spawn()
                    .unwrap()
            })
            .collect(),
    )
}

/// Children killed when dropped, whatever the test's outcome.
pub struct Ranks(pub Vec<Child>);

impl Ranks {
    /// Waits for every child at most `timeout` in all, kills those still
    /// running then, and says whether each exited successfully.
    pub fn wait_all(&mut self, timeout: Duration) -> Vec<bool> {
        let deadline = Instant::now() + timeout;
        self.0
            .iter_mut()
            .map(|child| loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status.success();
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(20));
            })
            .collect()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
