//! The correctness suite with each protocol forced (`NCCL_PROTO`) and with
//! 1, 2 and 4 channels, for ranks as threads and as processes.

#[path = "common/children.rs"]
mod children;
mod common;

use std::time::Duration;

use children::spawn_ranks;
use common::{all_cases, check, run_on_host, suite_on_threads, test_config, CaseBuffers};
use rccl::tuning::Selection;
use rccl::{CollKind, Communicator, Config, DataType};

fn forced(proto: &str, channels: usize) -> Config {
    Config {
        proto: Selection::parse("NCCL_PROTO", proto).unwrap(),
        min_channels: channels,
        max_channels: channels,
        ..test_config()
    }
}

fn threads(proto: &str) {
    for channels in [1, 2, 4] {
        for nranks in [3, 4] {
            let cases = all_cases(nranks, &CollKind::ALL, &DataType::ALL);
            let failures = suite_on_threads(nranks, forced(proto, channels), &cases);
            assert!(
                failures.is_empty(),
                "{proto}, {channels} channels, {nranks} ranks: {} failures:\n{}",
                failures.len(),
                failures[..failures.len().min(5)].join("\n")
            );
        }
    }
}

#[test]
fn ll_on_threads() {
    threads("LL");
}

#[test]
fn ll128_on_threads() {
    threads("LL128");
}

#[test]
fn simple_on_threads() {
    threads("Simple");
}

const CHILD_MARKER: &str = "RCCL_PROTOCOL_CHILD";

/// One rank of `processes`; a no-op when the harness runs it directly.
#[test]
fn child_rank() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let comm = Communicator::from_env().expect("init from the environment");
    let cases = all_cases(comm.count(), &CollKind::ALL, &DataType::ALL);
    let failures =
        run_on_host(&comm, &cases, CaseBuffers::new, check).unwrap_or_else(|e| panic!("{e}"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn each_protocol_with_four_processes() {
    let config = test_config();
    for (proto, channels) in [("LL", 1), ("LL128", 4), ("Simple", 2)] {
        let env = [
            (CHILD_MARKER, "1".to_string()),
            ("NCCL_PROTO", proto.into()),
            ("NCCL_MIN_NCHANNELS", channels.to_string()),
            ("NCCL_MAX_NCHANNELS", channels.to_string()),
            ("NCCL_BUFFSIZE", config.buffsize.to_string()),
            ("NCCL_LL_BUFFSIZE", config.ll_buffsize.to_string()),
            ("NCCL_LL128_BUFFSIZE", config.ll128_buffsize.to_string()),
            ("RCCL_TIMEOUT_MS", "60000".into()),
        ];
        let mut ranks = spawn_ranks("child_rank", 4, |_| {
            env.iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        });
        let passed = ranks.wait_all(Duration::from_secs(180));
        assert!(
            passed.iter().all(|&p| p),
            "{proto} with 4 processes: {passed:?}"
        );
    }
}
