//! `RCCL_SIM_CLUSTER` points `ncclGroupSimulateEnd` at another cluster: a
//! preset name or a cluster JSON file, shaped as the communicator; a bad
//! value fails the simulated end with the group closed and a message that
//! names the variable. One test, as it sets the environment, in a binary
//! of its own.

mod common;

use std::path::PathBuf;

use common::*;
use rccl_simulator::cluster;
use rcclrs::*;

const VAR: &str = "RCCL_SIM_CLUSTER";

/// A scratch directory of this process, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("rccl-sim-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A lone send from rank 0 with `RCCL_SIM_CLUSTER` set to `value`.
fn send_with(ranks: &mut Ranks, value: &str) -> (ncclResult_t, f32) {
    std::env::set_var(VAR, value);
    let result = ranks.simulate_p2p(0, &[Call::Send(1, LARGE)]);
    std::env::remove_var(VAR);
    result
}

/// `value` fails the simulated end with `code` and a message naming the
/// variable and holding `words`; the group is closed and nothing ran.
fn refused(ranks: &mut Ranks, value: &str, code: ncclResult_t, words: &[&str]) {
    std::env::set_var(VAR, value);
    let (rc, estimate) = ranks.simulate_group(|r| {
        r.queue(&[0, 1, 2, 3], SMALL);
        r.queue_p2p(0, &[Call::Send(1, SMALL)]);
    });
    std::env::remove_var(VAR);
    assert_eq!(rc, code, "{value}: {}", last_error());
    assert_eq!(estimate, UNDEF, "{value}");
    let message = last_error();
    assert!(message.contains(VAR), "{value}: {message}");
    for word in words {
        assert!(message.contains(word), "{value}: {message} lacks {word:?}");
    }
    assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage, "{value}");
    assert!(ranks.untouched(), "{value}: a simulated group ran");
}

#[test]
fn the_variable_chooses_the_cluster_and_bad_values_fail_clearly() {
    std::env::remove_var(VAR);
    let mut ranks = Ranks::new();
    let send = [Call::Send(1, LARGE)];
    let scratch = Scratch::new();

    // Unset or empty: the local preset.
    let (rc, default) = ranks.simulate_p2p(0, &send);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(default, direct_p2p_us(0, &send));
    let (rc, empty) = send_with(&mut ranks, "");
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_eq!(empty, default);

    // Presets, shaped as the communicator: the simulator's answers, and
    // an NVSwitch host far faster than TCP loopback.
    let h100 = shaped(&cluster::h100(1));
    let tcp = shaped(&cluster::local(N, true));
    let (rc, fast) = send_with(&mut ranks, "h100");
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(fast, direct_p2p_us_on(&h100, 0, &send));
    let (rc, slow) = send_with(&mut ranks, "local-tcp");
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(slow, direct_p2p_us_on(&tcp, 0, &send));
    assert!(fast * 10.0 < slow, "h100 {fast} us, local-tcp {slow} us");

    // Collectives use the chosen cluster too.
    std::env::set_var(VAR, "h100");
    let (rc, all_reduce) = ranks.simulate(&[0, 1, 2, 3], &[LARGE]);
    std::env::remove_var(VAR);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(all_reduce, direct_us_on(&h100, LARGE));

    // A file as `rccl-sim --dump-cluster` prints it: the same as the
    // preset it was dumped from; changed figures change the estimate.
    let dumped = scratch.write("h100.json", &cluster::h100(2).to_json());
    let (rc, from_file) = send_with(&mut ranks, &dumped);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_eq!(from_file, fast);
    let mut slower = cluster::h100(1);
    slower.intra.as_mut().unwrap().port_gbs /= 4.0;
    let slower_file = scratch.write("slower.json", &slower.to_json());
    let (rc, from_slower) = send_with(&mut ranks, &slower_file);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(from_slower, direct_p2p_us_on(&shaped(&slower), 0, &send));
    assert!(from_slower > 2.0 * fast, "{from_slower} us, {fast} us");

    // Bad values: an unknown name, a missing file, a file that is not a
    // cluster, figures the model cannot use, and a cluster that cannot be
    // shaped as the communicator (four NICs for its one-host four ranks
    // is fine; eight is not).
    refused(
        &mut ranks,
        "no-such-cluster",
        ncclInvalidArgument,
        &["no-such-cluster", "not a preset", "h100"],
    );
    let missing = scratch.0.join("missing.json");
    refused(
        &mut ranks,
        missing.to_str().unwrap(),
        ncclInvalidArgument,
        &["missing.json", "readable"],
    );
    let garbage = scratch.write("garbage.json", "{ \"hosts\": 1, oops");
    refused(
        &mut ranks,
        &garbage,
        ncclInvalidArgument,
        &["garbage.json", "cluster description"],
    );
    let mut unusable = cluster::h100(1);
    unusable.copy_gbs = -1.0;
    let unusable = scratch.write("unusable.json", &unusable.to_json());
    refused(
        &mut ranks,
        &unusable,
        ncclInvalidArgument,
        &["unusable.json", "copy_gbs"],
    );
    let mut wide = cluster::h100(1);
    wide.nic.per_host = Some(8);
    let wide = scratch.write("wide.json", &wide.to_json());
    refused(
        &mut ranks,
        &wide,
        ncclInvalidUsage,
        &["cannot hold", "4 ranks", "nic.per_host"],
    );
    let mut four = cluster::h100(1);
    four.nic.per_host = Some(4);
    let four = scratch.write("four.json", &four.to_json());
    let (rc, _) = send_with(&mut ranks, &four);
    assert_eq!(rc, ncclSuccess, "{}", last_error());

    // Unset again: the default, and the communicators still work.
    let (rc, again) = ranks.simulate_p2p(0, &send);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_eq!(again, default);
    ranks.run_all_reduce(SMALL);
}
