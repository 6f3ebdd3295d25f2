//! `NCCL_ALGO` / `NCCL_PROTO` narrow the measured collective only, as in
//! nccl-tests: the perf harness's own collectives (device list, barriers,
//! times, error counts) run on communicators without them, so forcing an
//! algorithm that implements nothing else still runs, checks clean and
//! reports the forced choice; one that leaves the measured collective no
//! algorithm fails at once, saying so.

#[path = "common/perf_bins.rs"]
mod perf_bins;
use perf_bins::perf_command;

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Sizes 8 B to 64 KiB, a few iterations, one type and op.
const SWEEP: &[&str] = &[
    "-b", "8", "-e", "64K", "-f", "4", "-n", "5", "-w", "1", "-d", "float", "-o", "sum",
];

fn json_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rccl-perf-forced-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    let _ = std::fs::remove_file(&path);
    path
}

/// Runs `bin` with `args` and `env`; every wait inside is bounded by
/// `RCCL_TIMEOUT_MS`.
fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, String, Duration) {
    let mut cmd = perf_command(bin, args);
    cmd.envs(env.iter().copied())
        .env("RCCL_TIMEOUT_MS", "20000");
    let started = Instant::now();
    let out = cmd.output().expect("run the perf binary");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text, started.elapsed())
}

/// Runs all_reduce_perf over the sweep with `env` on two ranks (`launch`:
/// `-g 2` or `--procs 2`); checks it exits 0 with 0 wrong, and returns
/// every row's (algorithm, protocol) from the JSON file, out of place and
/// in place.
fn forced_choices(env: &[(&str, &str)], launch: &str) -> Vec<(String, String)> {
    let path = json_path(&format!("{}-{launch}", env[0].1.replace(':', "_")));
    let mut args = vec![launch, "2", "-J", path.to_str().unwrap()];
    args.extend_from_slice(SWEEP);
    let (out, text, _) = run(env!("CARGO_BIN_EXE_all_reduce_perf"), &args, env);
    assert!(out.status.success(), "{env:?} {launch}:\n{text}");
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let rows = doc["results"].as_array().unwrap();
    assert_eq!(rows.len(), 7, "8 B to 64 KiB by 4:\n{text}");
    let mut choices = Vec::new();
    for row in rows {
        for half in ["out_of_place", "in_place"] {
            assert_eq!(row[half]["nwrong"].as_f64(), Some(0.0), "{row}");
        }
        let tuning = &row["rccl"];
        let in_place = tuning.get("in_place_choice").unwrap_or(tuning);
        for choice in [tuning, in_place] {
            choices.push((
                choice["algorithm"].as_str().unwrap().to_string(),
                choice["protocol"].as_str().unwrap().to_string(),
            ));
        }
    }
    choices
}

#[test]
fn a_forced_algorithm_is_measured_and_checks_clean() {
    for (algo, name) in [("Tree", "tree"), ("Ring", "ring"), ("allreduce:rhd", "rhd")] {
        for launch in ["-g", "--procs"] {
            let choices = forced_choices(&[("NCCL_ALGO", algo)], launch);
            assert!(
                choices.iter().all(|(a, _)| a == name),
                "NCCL_ALGO={algo} {launch} 2: {choices:?}"
            );
        }
    }
}

#[test]
fn a_forced_protocol_is_measured_and_checks_clean() {
    for launch in ["-g", "--procs"] {
        let choices = forced_choices(&[("NCCL_PROTO", "LL")], launch);
        assert!(
            choices.iter().all(|(_, p)| p == "LL"),
            "NCCL_PROTO=LL {launch} 2: {choices:?}"
        );
    }
}

#[test]
fn a_selection_that_leaves_the_measured_collective_nothing_fails_at_once() {
    let (out, text, took) = run(
        env!("CARGO_BIN_EXE_all_gather_perf"),
        &["-g", "2", "-b", "8", "-e", "8"],
        &[("NCCL_ALGO", "tree")],
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("NCCL_ALGO=\"tree\" leaves no algorithm that implements AllGather"),
        "{text}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    let (out, text, took) = run(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &["-g", "2", "-b", "8", "-e", "8"],
        &[("NCCL_ALGO", "ring,bogus")],
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("unknown algorithm \"bogus\""), "{text}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}
