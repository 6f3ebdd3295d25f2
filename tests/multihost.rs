//! The correctness suite across emulated hosts: network namespaces joined
//! by a bridge per rail (`tests/common/netns.rs`, the shape of
//! `scripts/testbed.sh`), 2 ranks per host sharing memory, TCP between
//! hosts, with each built-in algorithm forced through `NCCL_ALGO` on 2 and
//! 4 hosts of one rail, and the algorithms whose shape follows the rails
//! (ring, tree) and the tuner's own choices on 2, 3 and 4 hosts of two
//! rails; calls on device memory of the emulated GPU (device work whose
//! pieces the network proxy moves: over Socket, and over the IB model with
//! GPUDirect RDMA through a dma-buf, without, and off), with a rank
//! leaving mid-run; and the `NCCL_DEBUG=INFO` report of such a run.
//! Every test skips itself, saying why, when it cannot make namespaces
//! (not root, no `ip`).
//!
//! To stay CI-friendly the multi-host runs use four datatypes (int32,
//! float32, bfloat16, f8e4m3: an integer, the common float, a 16-bit and an
//! 8-bit float with their own kernels) with every collective the algorithm
//! implements, every op, every count of the suite and both placements
//! (in place only where the algorithm supports it).

mod common;
mod device_cases;
#[path = "common/netns.rs"]
mod netns;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{all_cases, check, run_on_host, test_config, CaseBuffers};
use device_cases::{join_from_env, run_cases_then_close};
use netns::TestBed;
use rccl::{CollKind, Communicator, DataType, RedOp};

const CHILD_MARKER: &str = "RCCL_MULTIHOST_CHILD";
/// The forced algorithm of a suite child, or "debug" for the log test.
const MODE: &str = "RCCL_MULTIHOST_MODE";

const DTYPES: [DataType; 4] = [
    DataType::Int32,
    DataType::Float32,
    DataType::Bfloat16,
    DataType::Float8e4m3,
];

/// How long one run of ranks may take before it is killed.
const RUN_LIMIT: Duration = Duration::from_secs(240);

fn skip_reason() -> Option<String> {
    let reason = netns::unavailable()?;
    eprintln!("skipping multi-host test: {reason}");
    Some(reason)
}

/// One rank, started inside a namespace by the tests below; does nothing
/// when the harness runs it directly.
#[test]
fn child_rank() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let mode = std::env::var(MODE).unwrap();
    if mode == "device" {
        return device_suite_rank();
    }
    if mode == "device-exit" {
        return device_all_reduces_until_a_rank_exits(Duration::ZERO);
    }
    if mode == "device-exit-linger" {
        return device_all_reduces_until_a_rank_exits(LINGER);
    }
    if mode == "device-cut" {
        return device_all_reduces_until_the_link_is_cut();
    }
    if mode == "device-goodbye" {
        return device_receive_after_the_sender_left();
    }
    let comm = Communicator::from_env().expect("init from the environment");
    let nranks = comm.count();
    if mode == "debug" {
        let send = vec![1.0f32; 1 << 16];
        let mut recv = vec![0f32; 1 << 16];
        comm.all_reduce(&send[..2], &mut recv[..2], RedOp::Sum)
            .unwrap();
        comm.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
        assert!(recv.iter().all(|&v| v == nranks as f32));
        comm.broadcast_in_place(&mut recv[..1000], 1).unwrap();
        let mut gathered = vec![0f32; 4 * nranks];
        comm.all_gather(&send[..4], &mut gathered).unwrap();
        comm.finalize().unwrap();
        return;
    }
    let cases: Vec<_> = match rccl_algorithms::builtin(&mode) {
        Some(algorithm) => {
            let kinds: Vec<CollKind> = CollKind::ALL
                .into_iter()
                .filter(|&k| algorithm.supports(k))
                .collect();
            all_cases(nranks, &kinds, &DTYPES)
                .into_iter()
                .filter(|c| !c.in_place || algorithm.supports_in_place(c.kind))
                .collect()
        }
        // The tuner's choices, every collective.
        None => all_cases(nranks, &CollKind::ALL, &DTYPES),
    };
    let failures = run_on_host(&comm, &cases, CaseBuffers::new, check)
        .unwrap_or_else(|e| panic!("{mode}: {e}"));
    assert!(
        failures.is_empty(),
        "{mode}: {} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    let proxies = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "rccl-net-proxy")
        .count();
    eprintln!("NETWORK PROXY THREADS {proxies}");
}

/// The suite on device memory of the emulated GPU through the C ABI, each
/// case against the reference and against the same call on host memory.
fn device_suite_rank() {
    let (comm, stream, rank, nranks) = join_from_env();
    let cases = all_cases(nranks, &CollKind::ALL, &DTYPES);
    run_cases_then_close(&cases, comm, stream, nranks, rank);
}

/// The rank that leaves in the `device-exit` modes: the second of the
/// second host, whose ring neighbours are of its own host when the hosts
/// hold more than 2 ranks.
fn leaver(nranks: usize) -> usize {
    nranks / 2 + 1
}

/// How long a rank whose call failed keeps its process before it aborts
/// in `device-exit-linger`, as a program that logs or saves its state
/// after an error does.
const LINGER: Duration = Duration::from_secs(10);

/// The process watch's grace for a peer process on this host that is gone
/// (it may have finished its part while this rank drains its FIFOs).
const DEAD_PEER_GRACE: Duration = Duration::from_secs(2);

/// All-reduces of 64 Ki floats on device memory, the stream synchronized
/// after each; rank [`leaver`] leaves its process after 3 of them (and
/// 300 ms) without a word (`_exit`). Every other rank must see its call
/// fail within the grace and 1 s of the leaver's exit, naming a rank (the
/// leaver, or a peer that failed because of it; the leaver when the
/// failed ranks linger), print `FAILED AFTER <ms> ms: <error>`, then keep
/// its process for `linger` and abort; none may hang or succeed for 60 s.
fn device_all_reduces_until_a_rank_exits(linger: Duration) {
    use device_cases::{all_reduce_succeeds, last_error, to_device};
    use rcclrs::*;
    let (comm, stream, rank, nranks) = join_from_env();
    let leaver = leaver(nranks);
    let count = 1 << 16;
    let send = to_device(&vec![0u8; count * 4]);
    let recv = to_device(&vec![0u8; count * 4]);
    let mut since = None;
    let start = std::time::Instant::now();
    for round in 0.. {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank {rank}: no failure in 60 s"
        );
        if round == 3 {
            if rank == leaver {
                // Its last pieces leave first: the call ends on a rank
                // once its work has handed them to the network proxy.
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: ends this process at once, as a crash would.
                unsafe { libc::_exit(0) };
            }
            since = Some(std::time::Instant::now());
        }
        // Device buffers of `count` floats, never freed.
        if !all_reduce_succeeds(comm, stream, send, recv, count) {
            let waited = since.map_or(0, |t: std::time::Instant| t.elapsed().as_millis());
            // Either way, ncclGetLastError says why.
            let said = last_error(comm);
            assert!(said.contains("rank "), "rank {rank}: {said:?}");
            // The next call on a failed communicator returns its error.
            // SAFETY: as above.
            let again =
                unsafe { ncclAllReduce(send.cast(), recv.cast(), count, 7, 0, comm, stream) };
            assert_ne!(again, ncclSuccess);
            let error = last_error(comm);
            eprintln!("FAILED AFTER {waited} ms: {error}");
            assert!(
                round >= 3,
                "rank {rank} failed before any rank left: {error}"
            );
            // From the start of the round, 300 ms before the exit.
            let bound =
                (Duration::from_millis(300) + DEAD_PEER_GRACE + Duration::from_secs(1)).as_millis();
            assert!(waited < bound, "rank {rank}: {waited} ms: {error}");
            assert!(error.contains("rank "), "rank {rank}: {error}");
            // A rank that aborts at once may close its connections before
            // its note is read: its peers then name it. One that lingers
            // lets every word arrive.
            assert!(
                linger.is_zero() || error.contains(&format!("rank {leaver} ")),
                "rank {rank} does not name rank {leaver}: {error}"
            );
            std::thread::sleep(linger);
            // SAFETY: a live communicator, ended once.
            unsafe { ncclCommAbort(comm) };
            return;
        }
    }
}

/// All-reduces of 16 Ki floats on device memory, the stream synchronized
/// after each; after 3 of them rank 0 takes its host's link down
/// (`ip link set dev tb0 down`: nothing is reset, the network goes
/// silent). Every rank's next call must fail at its deadline
/// (`RCCL_TIMEOUT_MS`), not later: each prints `TIMED OUT AFTER <ms> ms:
/// <error>`, the time from the start of its failing call, and aborts.
fn device_all_reduces_until_the_link_is_cut() {
    use device_cases::{all_reduce_succeeds, last_error, to_device};
    use rcclrs::*;
    let (comm, stream, rank, _) = join_from_env();
    let count = 1 << 14;
    let send = to_device(&vec![0u8; count * 4]);
    let recv = to_device(&vec![0u8; count * 4]);
    for round in 0..4 {
        if round == 3 && rank == 0 {
            let cut = Command::new("ip")
                .args(["link", "set", "dev", netns::IFACE, "down"])
                .status()
                .unwrap();
            assert!(cut.success(), "rank 0 could not cut its link: {cut}");
        }
        let started = std::time::Instant::now();
        // Device buffers of `count` floats, never freed.
        if all_reduce_succeeds(comm, stream, send, recv, count) {
            assert!(round < 3, "rank {rank}: an all-reduce passed the cut link");
            continue;
        }
        let waited = started.elapsed().as_millis();
        // The next call on a failed communicator returns its error.
        // SAFETY: a live communicator and stream, device buffers as above.
        let again = unsafe { ncclAllReduce(send.cast(), recv.cast(), count, 7, 0, comm, stream) };
        assert_ne!(again, ncclSuccess);
        eprintln!("TIMED OUT AFTER {waited} ms: {}", last_error(comm));
        // SAFETY: a live communicator, ended once.
        unsafe { ncclCommAbort(comm) };
        return;
    }
}

/// Two ranks on two hosts: rank 1 sends 4 KiB of device memory to rank 0
/// twice; after the second send it synchronizes, destroys its
/// communicator and leaves, while rank 0 sleeps a second and only then
/// receives. What rank 1 sent is all at rank 0 (the network proxy took it
/// into the slots it had posted) before rank 0's work starts, so the
/// receive must succeed with the data although its connection is closed:
/// the peer left in order. Rank 0 prints `RECEIVED AFTER GOODBYE`.
fn device_receive_after_the_sender_left() {
    use device_cases::{last_error, read_back, to_device};
    use rcclrs::*;
    let (comm, stream, rank, _) = join_from_env();
    let bytes = 4096;
    let uint8 = DataType::Uint8 as ncclDataType_t;
    let buf = to_device(&vec![rank as u8 + 1; bytes]);
    let synced = |what: &str| {
        // SAFETY: a live stream and communicator, a writable result.
        unsafe {
            assert_eq!(
                rcclrsEmuStreamSynchronize(stream),
                ncclSuccess,
                "rank {rank}, {what}: {}",
                last_error(comm)
            );
            let mut async_error = ncclSuccess;
            ncclCommGetAsyncError(comm, &mut async_error);
            assert_eq!(
                async_error,
                ncclSuccess,
                "rank {rank}, {what}: {}",
                last_error(comm)
            );
        }
    };
    for round in 0..2 {
        if rank == 1 {
            // SAFETY: a device buffer of `bytes`, never freed.
            let rc = unsafe { ncclSend(buf.cast(), bytes, uint8, 0, comm, stream) };
            assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
            synced("sending");
            continue;
        }
        if round == 1 {
            std::thread::sleep(Duration::from_secs(1));
        }
        // SAFETY: as above.
        let rc = unsafe { ncclRecv(buf.cast(), bytes, uint8, 1, comm, stream) };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
        synced("receiving");
        assert!(
            read_back(buf, bytes).iter().all(|&b| b == 2),
            "round {round}: wrong data"
        );
    }
    if rank == 0 {
        eprintln!("RECEIVED AFTER GOODBYE");
    }
    // SAFETY: live handles, each released once.
    unsafe {
        assert_eq!(ncclCommDestroy(comm), ncclSuccess);
        assert_eq!(rcclrsEmuStreamDestroy(stream), ncclSuccess);
    }
}

/// The `NCCL_ALGO` rule forcing `name` for every collective it implements.
fn algo_rule(name: &str) -> String {
    let algorithm = rccl_algorithms::builtin(name).unwrap();
    CollKind::ALL
        .into_iter()
        .filter(|&k| algorithm.supports(k))
        .map(|k| format!("{}:{name}", k.name().to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(";")
}

/// Sets the suite's engine settings (those of `test_config`) on a rank.
fn suite_env(cmd: &mut Command) {
    let config = test_config();
    cmd.env(CHILD_MARKER, "1")
        .env("NCCL_MIN_NCHANNELS", config.min_channels.to_string())
        .env("NCCL_MAX_NCHANNELS", config.max_channels.to_string())
        .env("NCCL_BUFFSIZE", config.buffsize.to_string())
        .env("NCCL_LL_BUFFSIZE", config.ll_buffsize.to_string())
        .env("NCCL_LL128_BUFFSIZE", config.ll128_buffsize.to_string())
        .env("RCCL_TIMEOUT_MS", "60000")
        .env_remove("NCCL_DEBUG")
        .env_remove("NCCL_PROTO");
}

const CHILD_ARGS: [&str; 5] = [
    "--exact",
    "child_rank",
    "--nocapture",
    "--test-threads",
    "1",
];

/// Runs the suite under each of `modes` (a built-in algorithm's name, or
/// "tuner" for the tuner's choices) on `hosts` hosts of 2 ranks joined by
/// `rails` rails; returns how many bytes each host sent on each rail.
fn suite_on_hosts(hosts: usize, rails: usize, modes: &[&str]) -> Vec<Vec<u64>> {
    if skip_reason().is_some() {
        return Vec::new();
    }
    let exe = std::env::current_exe().unwrap();
    let mut bed = TestBed::with_rails(hosts, 2, rails).expect("building the test bed");
    for &name in modes {
        let started = std::time::Instant::now();
        bed.spawn(&exe, &CHILD_ARGS, |_, cmd| {
            suite_env(cmd);
            cmd.env(MODE, name);
            if name != "tuner" {
                cmd.env("NCCL_ALGO", algo_rule(name));
            }
        })
        .unwrap();
        let results = bed.wait(RUN_LIMIT);
        let statuses: Vec<_> = results.iter().map(|(s, _)| *s).collect();
        assert!(
            statuses.iter().all(|s| s.is_some_and(|s| s.success())),
            "{name} on {hosts} hosts x 2 ranks x {rails} rails: {statuses:?} (None: killed after {RUN_LIMIT:?})"
        );
        eprintln!(
            "{name} on {hosts} hosts x 2 ranks x {rails} rails: passed in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    (0..hosts)
        .map(|host| (0..rails).map(|rail| bed.sent_bytes(host, rail)).collect())
        .collect()
}

/// Calls on device memory across 2 hosts of 2 ranks run as device work
/// whose network connections the proxy moves: the suite passes under
/// `net` (settings), and every rank's log shows its device work's
/// connections to the other host carried `via` (`NET/IB/GDRDMA`: their
/// slots in device memory the NIC registers), their slots in `slots`.
fn device_suite_across_two_hosts(net: &[(&str, &str)], via: &str, slots: &str) {
    let Some(stderrs) = run_ranks(2, 2, 1, "device", |cmd| {
        cmd.env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "NET");
        for (key, value) in net {
            cmd.env(key, value);
        }
    }) else {
        return;
    };
    let expected = format!("(device work, slots in {slots})");
    for (rank, text) in stderrs.iter().enumerate() {
        let links: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("(device work, "))
            .collect();
        assert!(
            !links.is_empty(),
            "rank {rank} made no network connection for device work\n{text}"
        );
        for line in &links {
            assert!(
                line.contains(&format!("via {via} (")) && line.ends_with(&expected),
                "rank {rank}: {line}"
            );
        }
        eprintln!(
            "rank {rank}: {} connections of device work, {}",
            links.len(),
            links[0]
        );
    }
}

#[test]
fn the_suite_on_device_memory_across_two_hosts() {
    device_suite_across_two_hosts(&[], "NET/Socket", "host memory");
}

const IB_MODEL_GDR: [(&str, &str); 3] = [
    ("NCCL_NET", "IB"),
    ("RCCL_IB_MODEL", "1"),
    ("RCCL_IB_MODEL_GDR", "1"),
];

#[test]
fn the_suite_on_device_memory_across_two_hosts_by_gpudirect_rdma_through_a_dmabuf() {
    device_suite_across_two_hosts(&IB_MODEL_GDR, "NET/IB/GDRDMA", "device memory, a dma-buf");
}

#[test]
fn the_suite_on_device_memory_across_two_hosts_by_gpudirect_rdma_without_dmabuf() {
    let net = [IB_MODEL_GDR.as_slice(), &[("NCCL_DMABUF_ENABLE", "0")]].concat();
    device_suite_across_two_hosts(&net, "NET/IB/GDRDMA", "device memory");
}

#[test]
fn gpudirect_rdma_off_keeps_device_work_slots_in_host_memory() {
    let net = [IB_MODEL_GDR.as_slice(), &[("NCCL_NET_GDR_LEVEL", "LOC")]].concat();
    device_suite_across_two_hosts(&net, "NET/IB", "host memory");
}

/// Device work across 2 hosts x 2 ranks when a rank of the second host
/// dies mid-run: every other rank's call fails within the bound, its error
/// naming a rank, and nobody hangs (over Socket, and over the IB model with
/// GPUDirect RDMA).
fn device_work_survives_a_rank_leaving(net: &[(&str, &str)]) {
    ranks_fail_naming_the_rank_that_left("device-exit", 2, net);
}

/// Runs 2 hosts x `per_host` ranks in `mode` (one of the `device-exit`
/// modes) with `env` (the network, the algorithm), each rank asserting
/// its own failure; prints what they said.
fn ranks_fail_naming_the_rank_that_left(mode: &str, per_host: usize, env: &[(&str, &str)]) {
    let Some(stderrs) = run_ranks(2, per_host, 1, mode, |cmd| {
        for (key, value) in env {
            cmd.env(key, value);
        }
    }) else {
        return;
    };
    let leaver = leaver(2 * per_host);
    for (rank, text) in stderrs.iter().enumerate().filter(|&(r, _)| r != leaver) {
        let line = text
            .lines()
            .find(|l| l.starts_with("FAILED AFTER"))
            .unwrap_or_else(|| panic!("rank {rank} did not fail\n{text}"));
        eprintln!("rank {rank}: {line}");
    }
}

#[test]
fn device_work_across_hosts_fails_naming_a_rank_that_left() {
    device_work_survives_a_rank_leaving(&[]);
}

#[test]
fn device_work_by_gpudirect_rdma_fails_naming_a_rank_that_left() {
    device_work_survives_a_rank_leaving(&IB_MODEL_GDR);
}

/// As [`device_work_across_hosts_fails_naming_a_rank_that_left`] on 2
/// hosts x 3 ranks in one ring (`0 -> 1 -> ... -> 5 -> 0`), but a rank
/// whose call failed keeps its process for [`LINGER`]: rank 1, which no
/// connection joins to the second host, waits only on ranks of its host
/// that failed; it must learn of their failure from their word, not from
/// their processes ending long after.
#[test]
fn device_work_fails_naming_a_rank_that_left_while_failed_peers_linger() {
    let one_ring = [
        ("NCCL_ALGO", "allreduce:ring"),
        ("NCCL_MIN_NCHANNELS", "1"),
        ("NCCL_MAX_NCHANNELS", "1"),
    ];
    ranks_fail_naming_the_rank_that_left("device-exit-linger", 3, &one_ring);
}

/// Device work across 2 hosts x 2 ranks when the link between the hosts
/// goes silent: every rank's call fails within 0.5 s of its deadline
/// (5 s), naming the operation, the channel and the rank it waited for
/// with its host (and address, for a rank on the other host), as a host
/// wait does; the ranks waiting across the link name a rank of the other
/// host.
fn device_work_times_out_on_a_cut_link_naming_the_peer(net: &[(&str, &str)]) {
    const TIMEOUT_MS: u128 = 5000;
    let Some(stderrs) = run_ranks(2, 2, 1, "device-cut", |cmd| {
        cmd.env("RCCL_TIMEOUT_MS", TIMEOUT_MS.to_string());
        for (key, value) in net {
            cmd.env(key, value);
        }
    }) else {
        return;
    };
    let mut across = 0;
    for (rank, text) in stderrs.iter().enumerate() {
        let line = text
            .lines()
            .find(|l| l.starts_with("TIMED OUT AFTER"))
            .unwrap_or_else(|| panic!("rank {rank} did not fail\n{text}"));
        eprintln!("rank {rank}: {line}");
        let waited: u128 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        assert!(waited < TIMEOUT_MS + 500, "rank {rank}: {line}");
        assert!(
            line.contains(&format!(
                "rank {rank} of 4: device work timed out after 5s in operation #"
            )) && line.contains(" on channel ")
                && line.contains(", waiting for data from rank ")
                && line.contains(" (host "),
            "rank {rank}: {line}"
        );
        let other_host = netns::host_addr(1 - rank / 2);
        across += usize::from(line.contains(&format!(", {other_host}, pid ")));
    }
    assert!(across >= 2, "no rank named a peer across the link");
}

#[test]
fn device_work_across_hosts_times_out_on_a_cut_link_naming_the_peer() {
    device_work_times_out_on_a_cut_link_naming_the_peer(&[]);
}

#[test]
fn device_work_by_gpudirect_rdma_times_out_on_a_cut_link_naming_the_peer() {
    device_work_times_out_on_a_cut_link_naming_the_peer(&IB_MODEL_GDR);
}

/// Device work goes on reading what a peer on another host sent after
/// that peer destroyed its communicator in order (a goodbye, not a broken
/// connection).
#[test]
fn device_work_reads_what_a_peer_sent_before_it_left_in_order() {
    let Some(stderrs) = run_ranks(2, 1, 1, "device-goodbye", |_| {}) else {
        return;
    };
    assert!(
        stderrs[0].contains("RECEIVED AFTER GOODBYE"),
        "rank 0:\n{}",
        stderrs[0]
    );
}

fn every_builtin() -> Vec<&'static str> {
    rccl_algorithms::builtins()
        .iter()
        .map(|a| a.name())
        .collect()
}

#[test]
fn each_algorithm_on_two_hosts_of_two_ranks() {
    suite_on_hosts(2, 1, &every_builtin());
}

#[test]
fn each_algorithm_on_four_hosts_of_two_ranks() {
    suite_on_hosts(4, 1, &every_builtin());
}

#[test]
fn rings_trees_and_the_tuner_on_three_hosts_of_one_rail() {
    suite_on_hosts(3, 1, &["ring", "tree", "tuner"]);
}

/// Two rails: every channel on its own, so each host sends on both.
fn on_two_rails(hosts: usize) {
    let sent = suite_on_hosts(hosts, 2, &["ring", "tree", "tuner"]);
    for (host, rails) in sent.iter().enumerate() {
        assert!(
            rails.iter().all(|&bytes| bytes > 1 << 20),
            "host {host} sent {rails:?} bytes on its rails: one idle"
        );
    }
}

#[test]
fn rings_trees_and_the_tuner_on_two_hosts_of_two_rails() {
    on_two_rails(2);
}

#[test]
fn rings_trees_and_the_tuner_on_three_hosts_of_two_rails() {
    on_two_rails(3);
}

#[test]
fn rings_trees_and_the_tuner_on_four_hosts_of_two_rails() {
    on_two_rails(4);
}

#[test]
fn two_hosts_of_four_ranks_on_four_channels_hold_one_network_proxy_each() {
    let Some(results) = run_ranks(2, 4, 1, "tuner", |cmd| {
        cmd.env("NCCL_MIN_NCHANNELS", "4")
            .env("NCCL_MAX_NCHANNELS", "4");
    }) else {
        return;
    };
    for (rank, stderr) in results.iter().enumerate() {
        assert!(
            stderr.contains("NETWORK PROXY THREADS 1"),
            "rank {rank}:\n{stderr}"
        );
    }
}

/// Runs every rank of `hosts` x `per_host` in `mode`, with `setup`'s
/// extra settings and stderr captured; checks each exited well and returns
/// its stderr (`None`: namespaces cannot be made here).
fn run_ranks(
    hosts: usize,
    per_host: usize,
    rails: usize,
    mode: &str,
    setup: impl Fn(&mut Command),
) -> Option<Vec<String>> {
    if skip_reason().is_some() {
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let mut bed = TestBed::with_rails(hosts, per_host, rails).expect("building the test bed");
    bed.spawn(&exe, &CHILD_ARGS, |_, cmd| {
        suite_env(cmd);
        cmd.env(MODE, mode).stderr(Stdio::piped());
        setup(cmd);
    })
    .unwrap();
    let results = bed.wait(RUN_LIMIT);
    // The first rank that failed says why; the others were killed after.
    let failed = results
        .iter()
        .position(|(status, _)| status.is_some_and(|s| !s.success()))
        .or_else(|| results.iter().position(|(status, _)| status.is_none()));
    if let Some(rank) = failed {
        let statuses: Vec<_> = results.iter().map(|(status, _)| *status).collect();
        panic!(
            "rank {rank} failed; statuses {statuses:?}\n{}",
            results[rank].1
        );
    }
    Some(results.into_iter().map(|(_, stderr)| stderr).collect())
}

/// A folder holding libnccl-net-rcclrs under NCCL's name for it,
/// `libnccl-net-rcclrs.so` (a link to the library cargo built), made once.
fn exported_plugin_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let built = exe.parent().unwrap().join("libnccl_net_rcclrs.so");
        assert!(built.exists(), "{} is not built", built.display());
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("net-plugin");
        std::fs::create_dir_all(&dir).unwrap();
        let named = dir.join("libnccl-net-rcclrs.so");
        let _ = std::fs::remove_file(&named);
        std::os::unix::fs::symlink(&built, &named).unwrap();
        dir
    })
}

/// The correctness suite (the tuner's choices: every collective, the four
/// datatypes) on `hosts` hosts x 2 ranks with shared memory off, so every
/// connection goes through libnccl-net-rcclrs loaded by the plug-in host:
/// `NCCL_NET_PLUGIN=rcclrs` finds it by NCCL's name, `libnccl-net-rcclrs.so`,
/// on `LD_LIBRARY_PATH`. The plug-in runs IB over the verbs model
/// (`NCCL_PLUGIN_P2P=ib`, `RCCL_IB_MODEL=1`) or, left to choose on a
/// machine without an RDMA device, says why not IB and runs Socket. Each
/// rank's log says so. (The plug-in over the IB model runs on 2 hosts: on
/// 4 it takes 15 s, and the IB provider itself runs on 4 hosts below.)
fn suite_through_the_exported_net_plugin(hosts: usize, ib_model: bool) {
    let dir = exported_plugin_dir();
    let chooses = !ib_model && !rdma_device_here();
    let started = std::time::Instant::now();
    let Some(results) = run_ranks(hosts, 2, 1, "tuner", |cmd| {
        cmd.env("NCCL_NET_PLUGIN", "rcclrs")
            .env("LD_LIBRARY_PATH", dir)
            .env("NCCL_SHM_DISABLE", "1")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NET")
            .env_remove("NCCL_NET")
            .env_remove("NCCL_PLUGIN_P2P")
            .env_remove("RCCL_IB_MODEL");
        if ib_model {
            cmd.env("NCCL_PLUGIN_P2P", "ib").env("RCCL_IB_MODEL", "1");
        } else if !chooses {
            cmd.env("NCCL_PLUGIN_P2P", "socket");
        }
    }) else {
        return;
    };
    let network = if ib_model { "IB" } else { "Socket" };
    eprintln!(
        "the suite through the plug-in running {network} on {hosts} hosts x 2 ranks: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let using = format!("NET/rcclrs: using {network} (");
    let mut needles = vec![
        "NET/Plugin: loaded rcclrs (ncclNet v12) from libnccl-net-rcclrs.so",
        "Using network rcclrs",
        "): NET/rcclrs ",
        &using,
    ];
    if chooses {
        needles.push("NET/rcclrs: NET/IB not used: IB unavailable: ");
    }
    for (rank, stderr) in results.iter().enumerate() {
        for needle in &needles {
            assert!(
                stderr.contains(needle),
                "rank {rank} does not report {needle:?}:\n{stderr}"
            );
        }
    }
}

#[test]
fn the_suite_on_two_hosts_through_the_exported_net_plugin() {
    suite_through_the_exported_net_plugin(2, false);
}

#[test]
fn the_suite_on_four_hosts_through_the_exported_net_plugin() {
    suite_through_the_exported_net_plugin(4, false);
}

#[test]
fn the_suite_on_two_hosts_through_the_exported_net_plugin_running_the_ib_model() {
    suite_through_the_exported_net_plugin(2, true);
}

#[test]
fn debug_info_reports_topology_transports_and_choices() {
    let Some(results) = run_ranks(2, 2, 1, "debug", |cmd| {
        cmd.env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,TUNING,COLL,NET,SHM");
    }) else {
        return;
    };
    for (rank, stderr) in results.iter().enumerate() {
        // A line with all of `parts`, in order.
        let has = |parts: &[&str]| {
            stderr.lines().any(|l| {
                let mut rest = l;
                parts.iter().all(|p| match rest.find(p) {
                    Some(at) => {
                        rest = &rest[at + p.len()..];
                        true
                    }
                    None => false,
                })
            })
        };
        let tag = format!("[{rank}] ");
        let must_all = |parts: &[&str]| {
            assert!(
                has(parts),
                "rank {rank} does not report {parts:?}:\n{stderr}"
            )
        };
        let must = |needle: String| must_all(&[&needle]);
        // (Host names print as the machine's: namespaces share it; the
        // placement comes from NCCL_HOSTID.)
        must(format!("{tag}comm"));
        must(format!("rank {rank} nRanks 4 nHosts 2 host "));
        // Topology: which ranks share each host.
        must_all(&[&tag, "Topology: host 0 (", "): ranks [0, 1]"]);
        must_all(&[&tag, "Topology: host 1 (", "): ranks [2, 3]"]);
        // Per channel its ring, trees and NIC.
        must_all(&[
            &tag,
            "NET/Socket : Using [0]tb0:",
            " ; 1 rail(s) across 2 host(s)",
        ]);
        for channel in 0..2 {
            let head = format!("{tag}Channel {channel:02}/02 : ");
            must_all(&[
                &head,
                "Ring : ",
                &format!(" ; NIC 0 tb0 {}", netns::host_addr(rank / 2)),
            ]);
            // Of 2 channels, channel 0 runs tree 0 and channel 1 tree 1.
            must_all(&[&head, &format!("Tree {channel} : ")]);
        }
        // The transport to each peer: shared memory on the same host,
        // sockets on the bed's network across hosts.
        for peer in (0..4).filter(|&p| p != rank) {
            let via = if peer / 2 == rank / 2 {
                "SHM/direct".to_string()
            } else {
                format!("NET/Socket {}", netns::host_addr(peer / 2))
            };
            must_all(&[
                &format!("{tag}Transport to rank {peer} ("),
                &format!("): {via}"),
            ]);
        }
        // Connections as made, and per operation the call, algorithm and
        // protocol.
        let partner = rank ^ 1;
        must(format!("{rank} -> {partner} via SHM/direct"));
        must(format!(
            "via NET/Socket ({}",
            netns::host_addr(1 - rank / 2)
        ));
        must(format!("{tag}AllReduce: opCount"));
        must(format!("{tag}AllReduce: 8 Bytes -> Algo "));
        must(format!("{tag}AllReduce: 262144 Bytes -> Algo "));
        must(format!("{tag}Broadcast: 4000 Bytes -> Algo "));
        must(format!("{tag}AllGather: 16 Bytes -> Algo "));
        let choices: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains(" Bytes -> Algo "))
            .collect();
        assert!(
            choices.iter().all(|l| l.contains(" proto ")),
            "a choice without its protocol: {choices:?}"
        );
    }
}

#[test]
fn debug_info_names_each_channels_nic_and_the_tuners_choice_on_two_rails() {
    let Some(results) = run_ranks(2, 2, 2, "debug", |cmd| {
        cmd.env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "GRAPH,TUNING")
            .env("RCCL_NIC_SPEED", "tb0=2000,tb1=3000");
    }) else {
        return;
    };
    for (rank, stderr) in results.iter().enumerate() {
        let host = rank / 2;
        let has = |needles: &[&str]| {
            stderr
                .lines()
                .any(|l| needles.iter().all(|n| l.contains(n)))
        };
        let tag = format!("[{rank}] ");
        let using = format!(
            "Using [0]tb0:{}<2000Mb/s> [1]tb1:{}<3000Mb/s> ; 2 rail(s) across 2 host(s)",
            netns::rail_addr(host, 0),
            netns::rail_addr(host, 1)
        );
        assert!(has(&[&tag, &using]), "rank {rank}:\n{stderr}");
        // Channel c on NIC c mod 2; the ring enters host h at local index
        // c mod 2: channel 0's ring is 0 1 2 3, channel 1's 1 0 3 2.
        for (channel, ring) in [(0, "Ring : 0 1 2 3"), (1, "Ring : 1 0 3 2")] {
            let nic = format!(
                " ; NIC {channel} tb{channel} {}",
                netns::rail_addr(host, channel)
            );
            assert!(
                has(&[&tag, &format!("Channel {channel:02}/02 : "), ring, &nic]),
                "rank {rank} channel {channel}:\n{stderr}"
            );
        }
        // Across hosts the tuner names its choice per size and the time
        // its cost model expects.
        assert!(
            has(&[
                "AllReduce: 262144 Bytes on 2 hosts x 2 rails, 2 channels: ",
                " expected in ",
                " us"
            ]),
            "rank {rank}:\n{stderr}"
        );
    }
}

#[test]
fn testbed_script_runs_ranks_per_host_and_cleans_up() {
    if skip_reason().is_some() {
        return;
    }
    if Command::new("bash").arg("--version").output().is_err() {
        eprintln!("skipping: no bash");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/testbed.sh");
    let state = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("testbed-state");
    let out = Command::new("bash")
        .args([script, "with", "3", "2", "--rate", "1gbit", "--", "sh", "-c"])
        .arg(
            "test \"$WORLD_SIZE\" = 6 && test \"$NCCL_HOSTID\" = host$((RANK / 2)) && \
             test \"$LOCAL_RANK\" = $((RANK % 2)) && test \"$MASTER_ADDR\" = 10.231.0.1 && \
             ip -4 -o addr show \"$NCCL_SOCKET_IFNAME\" | grep -q \"10.231.0.$((RANK / 2 + 1))/24\" && \
             ip netns identify $$",
        )
        .env("RCCL_TB_DIR", &state)
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("exit codes by rank: 0 0 0 0 0 0"),
        "{stderr}"
    );
    // Each rank ran in its host's namespace; all of them are gone now.
    let names: Vec<&str> = stdout.lines().map(str::trim).collect();
    assert_eq!(names.len(), 6, "{stdout}");
    let bed = names[0].rsplit_once("-h").unwrap().0;
    assert!(names.iter().all(|n| n.starts_with(bed)), "{stdout}");
    let mut hosts: Vec<&str> = names.clone();
    hosts.sort_unstable();
    hosts.dedup();
    assert_eq!(hosts.len(), 3, "{stdout}");
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(!left.contains(bed), "namespaces left behind:\n{left}");
    assert!(
        std::fs::read_dir(&state).map_or(true, |mut d| d.next().is_none()),
        "state file left behind"
    );
}

/// The IB provider over the verbs model (`RCCL_IB_MODEL=1`, chosen by
/// `NCCL_NET=IB`, two queue pairs per connection) between hosts: every
/// collective of the suite with the tuner's choices, then with ring
/// forced, on `hosts` hosts of 2 ranks (the four datatypes above).
fn suite_over_the_ib_model(hosts: usize) {
    if skip_reason().is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut bed = TestBed::up(hosts, 2).expect("building the test bed");
    for mode in ["tuner", "ring"] {
        let started = std::time::Instant::now();
        bed.spawn(&exe, &CHILD_ARGS, |_, cmd| {
            suite_env(cmd);
            cmd.env(MODE, mode)
                .env("NCCL_NET", "IB")
                .env("RCCL_IB_MODEL", "1")
                .env("NCCL_IB_QPS_PER_CONNECTION", "2");
            if mode != "tuner" {
                cmd.env("NCCL_ALGO", algo_rule(mode));
            }
        })
        .unwrap();
        let results = bed.wait(RUN_LIMIT);
        let statuses: Vec<_> = results.iter().map(|(s, _)| *s).collect();
        assert!(
            statuses.iter().all(|s| s.is_some_and(|s| s.success())),
            "IB model, {mode}, {hosts} hosts x 2 ranks: {statuses:?} (None: killed after {RUN_LIMIT:?})"
        );
        eprintln!(
            "IB model, {mode}, on {hosts} hosts x 2 ranks: passed in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn the_suite_over_the_ib_model_on_two_hosts() {
    suite_over_the_ib_model(2);
}

#[test]
fn the_suite_over_the_ib_model_on_four_hosts() {
    suite_over_the_ib_model(4);
}

/// Whether this machine has an RDMA device (then IB is used, not skipped).
fn rdma_device_here() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn without_an_rdma_device_ib_says_why_and_socket_is_used() {
    if rdma_device_here() {
        eprintln!("skipping: this machine has an RDMA device");
        return;
    }
    let Some(results) = run_ranks(2, 1, 1, "debug", |cmd| {
        cmd.env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,GRAPH")
            .env_remove("RCCL_IB_MODEL")
            .env_remove("NCCL_NET");
    }) else {
        return;
    };
    for (rank, stderr) in results.iter().enumerate() {
        assert!(
            stderr.contains("NET/IB not used: "),
            "rank {rank} does not say why IB is unused:\n{stderr}"
        );
        assert!(
            stderr.contains("Using network Socket"),
            "rank {rank}:\n{stderr}"
        );
        assert!(stderr.contains(": NET/Socket "), "rank {rank}:\n{stderr}");
    }
}

#[test]
fn the_ib_model_is_used_when_asked_for() {
    let Some(results) = run_ranks(2, 1, 1, "debug", |cmd| {
        cmd.env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NET")
            .env("RCCL_IB_MODEL", "1")
            .env_remove("NCCL_NET");
    }) else {
        return;
    };
    for (rank, stderr) in results.iter().enumerate() {
        assert!(
            stderr.contains("Using network IB"),
            "rank {rank}:\n{stderr}"
        );
        assert!(
            stderr.contains("NET/IB: using rccl_model0:1 (RoCE, GID index 3, RoCE v2)"),
            "rank {rank}:\n{stderr}"
        );
        assert!(stderr.contains(": NET/IB "), "rank {rank}:\n{stderr}");
    }
}
