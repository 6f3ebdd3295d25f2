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

/// Runs all_reduce_perf over the sweep with `env` and `flags` on two ranks
/// (`launch`: `-g 2` or `--procs 2`); checks it exits 0 with 0 wrong, and
/// returns its output, its JSON file and every row's (algorithm,
/// protocol) from that file, out of place and in place.
fn sweep(
    name: &str,
    env: &[(&str, &str)],
    flags: &[&str],
    launch: &str,
) -> (String, Value, Vec<(String, String)>) {
    let path = json_path(&format!("{}-{launch}", name.replace(':', "_")));
    let mut args = vec![launch, "2", "-J", path.to_str().unwrap()];
    args.extend_from_slice(SWEEP);
    args.extend_from_slice(flags);
    let (out, text, _) = run(env!("CARGO_BIN_EXE_all_reduce_perf"), &args, env);
    assert!(out.status.success(), "{env:?} {flags:?} {launch}:\n{text}");
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
    (text, doc, choices)
}

/// [`sweep`]'s choices with `env` alone.
fn forced_choices(env: &[(&str, &str)], launch: &str) -> Vec<(String, String)> {
    sweep(env[0].1, env, &[], launch).2
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

/// `--deterministic` (passed on to the rank processes of `--procs`) and
/// `NCCL_DETERMINISTIC=1` reach the measured communicators: the header and
/// the JSON file say the mode is on, and though `NCCL_ALGO=Tree` asks for
/// the tree, which the test above shows it gets otherwise, the tuner picks
/// the ordered ring, or the board for sizes that fit it (which folds in the
/// same order: here every size). `--deterministic 0` turns the variable's
/// mode off.
#[test]
fn the_deterministic_mode_reaches_the_measured_collective() {
    struct Case {
        env: &'static [(&'static str, &'static str)],
        flags: &'static [&'static str],
        launch: &'static str,
        /// What the header says after `# Deterministic: `.
        header: &'static str,
    }
    const TREE: (&str, &str) = ("NCCL_ALGO", "Tree");
    const ON: (&str, &str) = ("NCCL_DETERMINISTIC", "1");
    let cases = [
        Case {
            env: &[TREE],
            flags: &["--deterministic"],
            launch: "-g",
            header: "on (--deterministic)",
        },
        Case {
            env: &[TREE],
            flags: &["--deterministic"],
            launch: "--procs",
            header: "on (--deterministic)",
        },
        Case {
            env: &[TREE, ON],
            flags: &[],
            launch: "-g",
            header: "on (NCCL_DETERMINISTIC=1)",
        },
        Case {
            env: &[TREE, ON],
            flags: &["--deterministic", "0"],
            launch: "--procs",
            header: "off (--deterministic 0)",
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let Case {
            env,
            flags,
            launch,
            header,
        } = case;
        let (text, doc, choices) = sweep(&format!("deterministic-{i}"), env, flags, launch);
        let what = format!("{env:?} {flags:?} {launch}");
        assert!(
            text.contains(&format!("\n# Deterministic: {header}\n")),
            "{what}:\n{text}"
        );
        let deterministic = header.starts_with("on");
        assert_eq!(
            doc["config"]["rccl"]["deterministic"],
            Value::Bool(deterministic),
            "{what}"
        );
        let algorithms: Vec<&str> = choices.iter().map(|(a, _)| a.as_str()).collect();
        if deterministic {
            assert!(
                algorithms
                    .iter()
                    .all(|a| ["ordered_ring", "oneshot"].contains(a)),
                "{what}: {algorithms:?}"
            );
        } else {
            assert!(
                algorithms.iter().all(|&a| a == "tree"),
                "{what}: {algorithms:?}"
            );
        }
    }
}
