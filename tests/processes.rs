//! The correctness suite with 4 separate processes on loopback, each
//! joining through the torchrun environment variables.

mod common;

use std::process::Command;

use common::{all_cases, check, CaseBuffers, TEST_BUFFSIZE};
use rccl::{CollKind, Communicator, DataType};

const CHILD_MARKER: &str = "RCCL_TEST_CHILD";

/// Runs as one rank when started by `four_processes`; does nothing when
/// the test harness runs it directly.
#[test]
fn child_rank() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let comm = Communicator::from_env().expect("init from the environment");
    let (rank, nranks) = (comm.rank(), comm.count());
    let mut failures = Vec::new();
    for case in all_cases(nranks, &CollKind::ALL, &DataType::ALL) {
        let mut bufs = CaseBuffers::new(&case, nranks, rank);
        bufs.run(&comm, &case)
            .unwrap_or_else(|e| panic!("{case:?} on rank {rank}: {e}"));
        if let Err(msg) = check(&case, nranks, rank, bufs.output(&case, nranks, rank)) {
            failures.push(msg);
        }
    }
    assert!(
        failures.is_empty(),
        "{}",
        failures[..failures.len().min(10)].join("\n")
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run_processes(nranks: usize, shm_disable: bool) {
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..nranks)
        .map(|rank| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_rank",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD_MARKER, "1")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", nranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("NCCL_BUFFSIZE", TEST_BUFFSIZE.to_string())
                .env("NCCL_MIN_NCHANNELS", "2")
                .env("NCCL_MAX_NCHANNELS", "2")
                .env("RCCL_TIMEOUT_MS", "60000")
                .env("NCCL_SHM_DISABLE", if shm_disable { "1" } else { "0" })
                .spawn()
                .unwrap()
        })
        .collect();
    let statuses: Vec<_> = children
        .into_iter()
        .map(|mut child| child.wait().unwrap())
        .collect();
    assert!(statuses.iter().all(|s| s.success()), "{statuses:?}");
}

#[test]
fn four_processes_shm() {
    run_processes(4, false);
}

#[test]
fn four_processes_tcp() {
    run_processes(4, true);
}
