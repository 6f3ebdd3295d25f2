//! Encrypted TCP (a process PSK, `rccl::set_encryption`): two processes
//! with one key run all-reduces over the Socket network with checked data;
//! a process with another key is refused at bootstrap, naming the root,
//! within the timeout.

#[path = "common/children.rs"]
mod children;

use std::time::{Duration, Instant};

use children::spawn_ranks;
use rccl::{Communicator, RedOp};

const CHILD: &str = "RCCL_TEST_ENCRYPTED_CHILD";
const PSK: &str = "RCCL_TEST_PSK";
const REFUSED: &str = "RCCL_TEST_EXPECT_REFUSAL";
const ABANDONED: &str = "RCCL_TEST_EXPECT_ABANDONED";

/// One rank, when started by a test below: sets the key, joins, and
/// all-reduces 8 B and 1 MiB checking the sums (or checks its refusal).
#[test]
fn encrypted_child_rank() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let psk = std::env::var(PSK).unwrap();
    rccl::set_encryption(Some(psk.as_bytes())).unwrap();
    assert!(rccl::encrypted());
    let comm = Communicator::from_env();
    if std::env::var_os(REFUSED).is_some() {
        let Err(e) = comm else {
            panic!("a rank with another key must be refused");
        };
        let text = e.to_string();
        let port = std::env::var("MASTER_PORT").unwrap();
        assert!(
            text.contains("different encryption key") && text.contains(&port),
            "{text}"
        );
        eprintln!("refused as expected: {text}");
        return;
    }
    if std::env::var_os(ABANDONED).is_some() {
        // The root, whose peer was refused: it fails at its timeout,
        // naming the rank that never registered, instead of hanging.
        let Err(e) = comm else {
            panic!("the root of a refused rank must fail");
        };
        let text = e.to_string();
        assert!(
            text.contains("timed out") && text.contains("rank(s) [1]"),
            "{text}"
        );
        eprintln!("abandoned as expected: {text}");
        return;
    }
    let comm = comm.unwrap();
    let (rank, n) = (comm.rank(), comm.count());
    for count in [2usize, 1 << 18] {
        let send: Vec<f32> = (0..count).map(|i| (rank * 1000 + i % 997) as f32).collect();
        let mut recv = vec![0f32; count];
        comm.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
        for (i, got) in recv.iter().enumerate() {
            let want: f32 = (0..n).map(|r| (r * 1000 + i % 997) as f32).sum();
            assert_eq!(*got, want, "rank {rank}, element {i} of {count}");
        }
    }
}

/// Runs two ranks over TCP, rank `r` with key `keys[r]` (rank `refused`
/// expecting its refusal, the other then its timeout); whether each
/// succeeded, and how long they took.
fn run(keys: [&str; 2], refused: Option<usize>, timeout_ms: u64) -> (Vec<bool>, Duration) {
    let start = Instant::now();
    let mut ranks = spawn_ranks("encrypted_child_rank", 2, |rank| {
        let mut vars = vec![
            (CHILD, "1".to_string()),
            (PSK, keys[rank].to_string()),
            ("NCCL_SHM_DISABLE", "1".to_string()),
            ("RCCL_TIMEOUT_MS", timeout_ms.to_string()),
        ];
        match refused {
            Some(r) if r == rank => vars.push((REFUSED, "1".to_string())),
            Some(_) => vars.push((ABANDONED, "1".to_string())),
            None => {}
        }
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    });
    let ok = ranks.wait_all(Duration::from_secs(60));
    (ok, start.elapsed())
}

const KEY: &str = "one-key-for-the-whole-job-0123456789";

#[test]
fn two_processes_with_one_key_all_reduce_over_tcp() {
    let (ok, _) = run([KEY, KEY], None, 30_000);
    assert_eq!(ok, [true, true]);
}

#[test]
fn a_process_with_another_key_is_refused_at_bootstrap() {
    let (ok, took) = run(
        [KEY, "another-key-for-an-intruder-987654321"],
        Some(1),
        3_000,
    );
    // Rank 1 checks its refusal; rank 0 waits for it in vain and checks
    // that it fails at its timeout rather than hanging.
    assert_eq!(ok, [true, true]);
    assert!(took < Duration::from_secs(20), "{took:?}");
}
