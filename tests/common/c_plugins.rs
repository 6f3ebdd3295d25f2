//! What the plug-in tests share: a scratch folder, building a minimal C
//! plug-in of `tests/c/plugins/`, and an `all_reduce_perf -J` run of 4
//! ranks whose rows say what was chosen.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::perf_bins::perf_command;

/// This test process's scratch folder `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds `tests/c/plugins/<source>` as the shared library `out`, with the
/// macro `define` set if given (the plug-in's older interface).
pub fn build(source: &str, define: Option<&str>, out: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c/plugins")
        .join(source);
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args([
        "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
    ]);
    if let Some(define) = define {
        cc.arg(format!("-D{define}"));
    }
    let status = cc
        .arg(&source)
        .arg("-o")
        .arg(out)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed: {cc:?}");
}

/// The `rccl` part of each row of an `all_reduce_perf -J` run of 4 ranks
/// (1 KiB to 64 KiB) written to `json`, after `setup` set its environment,
/// and what the run printed.
pub fn perf_rows(json: &Path, setup: impl FnOnce(&mut Command)) -> (Vec<Value>, String) {
    let _ = std::fs::remove_file(json);
    let mut cmd = perf_command(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &[
            "-g", "4", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1",
        ],
    );
    cmd.arg("-J").arg(json);
    setup(&mut cmd);
    let out = cmd.output().expect("running all_reduce_perf");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{}: {text}", json.display());
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let rows = doc["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["rccl"].clone())
        .collect();
    (rows, text)
}
