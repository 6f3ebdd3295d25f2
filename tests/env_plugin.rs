//! The NCCL environment plug-in (`NCCL_ENV_PLUGIN`): a minimal C plug-in
//! (`tests/c/plugins/env.c`), built at v2 and at v1, supplies `NCCL_ALGO`,
//! which the algorithm `all_reduce_perf -J` reports follows; a value the
//! user set in the environment wins over the plug-in's.

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

/// The algorithm of each row of an `all_reduce_perf -J` run of 4 ranks
/// under `env`.
fn algorithms(tag: &str, env: &[(&str, &str)]) -> Vec<String> {
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
        .map(|r| r["rccl"]["algorithm"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_env_plugin_supplies_settings_the_user_did_not_set() {
    let dir = dir();
    let (v2, v1) = (dir.join("env-v2.so"), dir.join("libnccl-env-testv1.so"));
    build_plugin(&v2, false);
    build_plugin(&v1, true);
    let all = |algorithm: &str, rows: &[String]| rows.iter().all(|a| a == algorithm);

    let baseline = algorithms("none", &[("TEST_ENV_ALGO", "tree")]);
    assert!(!all("tree", &baseline), "{baseline:?}");

    // v2 by path supplies NCCL_ALGO=tree.
    let plugin = [
        ("NCCL_ENV_PLUGIN", v2.to_str().unwrap()),
        ("TEST_ENV_ALGO", "tree"),
    ];
    let rows = algorithms("v2", &plugin);
    assert!(all("tree", &rows), "{rows:?}");

    // What the user set wins.
    let mut user = plugin.to_vec();
    user.push(("NCCL_ALGO", "ring"));
    let rows = algorithms("user", &user);
    assert!(all("ring", &rows), "{rows:?}");

    // v1 by name (libnccl-env-testv1.so on the library path).
    let rows = algorithms(
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
