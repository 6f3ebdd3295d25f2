//! The NCCL environment plug-in (`NCCL_ENV_PLUGIN`): a minimal C plug-in
//! (`tests/c/plugins/env.c`), built at v2 and at v1, supplies `NCCL_ALGO`,
//! which the algorithm `all_reduce_perf -J` reports follows. As with
//! NCCL, the plug-in answers every lookup: its value wins over the one the
//! user set in the environment, and a setting it has no value for comes
//! from the environment.

#[path = "common/perf_bins.rs"]
mod perf_bins;
use perf_bins::perf_command;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn dir() -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("env-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds the test plug-in as `out` (`v1`: the v1 interface).
fn build_plugin(out: &Path, v1: bool) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/plugins/env.c");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args([
        "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
    ]);
    if v1 {
        cc.arg("-DENV_V1");
    }
    let status = cc
        .arg(&source)
        .arg("-o")
        .arg(out)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed: {cc:?}");
}

/// The algorithm and protocol of each row of an `all_reduce_perf -J` run
/// of 4 ranks under `env`.
fn choices(tag: &str, env: &[(&str, &str)]) -> Vec<(String, String)> {
    let json = dir().join(format!("{tag}.json"));
    let _ = std::fs::remove_file(&json);
    let mut cmd = perf_command(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &[
            "-g", "4", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1",
        ],
    );
    cmd.arg("-J")
        .arg(&json)
        .env_remove("NCCL_ENV_PLUGIN")
        .envs(env.iter().copied());
    let out = cmd.output().expect("running all_reduce_perf");
    assert!(
        out.status.success(),
        "{tag}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    doc["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            let field = |name: &str| r["rccl"][name].as_str().unwrap().to_string();
            (field("algorithm"), field("protocol"))
        })
        .collect()
}

#[test]
fn an_env_plugin_answers_every_setting_and_the_environment_fills_its_gaps() {
    let dir = dir();
    let (v2, v1) = (dir.join("env-v2.so"), dir.join("libnccl-env-testv1.so"));
    build_plugin(&v2, false);
    build_plugin(&v1, true);
    let all = |algorithm: &str, rows: &[(String, String)]| rows.iter().all(|(a, _)| a == algorithm);

    let baseline = choices("none", &[("TEST_ENV_ALGO", "tree")]);
    assert!(!all("tree", &baseline), "{baseline:?}");

    // v2 by path supplies NCCL_ALGO=tree.
    let plugin = [
        ("NCCL_ENV_PLUGIN", v2.to_str().unwrap()),
        ("TEST_ENV_ALGO", "tree"),
    ];
    let rows = choices("v2", &plugin);
    assert!(all("tree", &rows), "{rows:?}");

    // The plug-in's value wins over the user's; what it has no value for
    // (NCCL_PROTO) comes from the environment.
    let mut user = plugin.to_vec();
    user.extend([("NCCL_ALGO", "ring"), ("NCCL_PROTO", "LL128")]);
    let rows = choices("user", &user);
    assert!(all("tree", &rows), "{rows:?}");
    assert!(rows.iter().all(|(_, p)| p == "LL128"), "{rows:?}");

    // v1 by name (libnccl-env-testv1.so on the library path).
    let rows = choices(
        "v1",
        &[
            ("NCCL_ENV_PLUGIN", "testv1"),
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
            ("TEST_ENV_ALGO", "tree"),
        ],
    );
    assert!(all("tree", &rows), "{rows:?}");
    let _ = std::fs::remove_dir_all(dir);
}
