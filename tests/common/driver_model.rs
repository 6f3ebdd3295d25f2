//! Running a test over the CUDA driver model (cuda-model/): a child process
//! of the test binary whose library path starts with a folder where
//! `libcuda.so.1` and `libcuda.so` are the model, as the driver would be on
//! a GPU machine, with `RCCL_DEVICE=cuda` (included with `#[path]`).

// Each test binary uses part of this.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A folder holding the model under the driver's names; with
/// `stub_copy`, `libcuda.so` is a copy of it (another file, as the
/// toolkit's stub is another library than the driver).
pub fn driver_folder(test: &str, stub_copy: bool) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let model = deps.join("librccl_cuda_model.so");
    assert!(
        model.exists(),
        "{} is built with the tests",
        model.display()
    );
    // One folder per test: the tests of this binary run at once.
    let folder = deps.join(format!("cuda-model-driver-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = folder.join(name);
        let _ = std::fs::remove_file(&link);
        if stub_copy && name == "libcuda.so" {
            std::fs::copy(&model, &link).unwrap();
        } else {
            std::os::unix::fs::symlink(&model, &link).unwrap();
        }
    }
    folder
}

/// What a child prints when its case ran to the end.
pub const RAN: &str = "the case ran over the CUDA driver model";

/// Runs `body` in a child process on the model.
pub fn over_the_model(test: &str, env: &[(&str, &str)], body: fn()) {
    over_the_model_in(test, env, false, body)
}

/// As [`over_the_model`]; with `stub_copy`, as [`driver_folder`]'s.
pub fn over_the_model_in(test: &str, env: &[(&str, &str)], stub_copy: bool, body: fn()) {
    run_if_the_child(test, body);
    let folder = driver_folder(test, stub_copy);
    let out = child_on_the_model(test, &folder, env).output().unwrap();
    let _ = std::fs::remove_dir_all(&folder);
    let ran = String::from_utf8_lossy(&out.stdout).contains(RAN);
    assert!(
        out.status.success() && ran,
        "{test} over the CUDA driver model:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In a child of `test`'s runner: runs `body`, says so ([`RAN`]) and
/// exits. Elsewhere returns at once.
pub fn run_if_the_child(test: &str, body: fn()) {
    if std::env::var("CUDA_MODEL_CASE").as_deref() == Ok(test) {
        body();
        println!("{RAN}");
        std::process::exit(0);
    }
}

/// A child process running `test` of this binary on the model of
/// `folder` ([`driver_folder`]), with `env` over the defaults.
pub fn child_on_the_model(test: &str, folder: &Path, env: &[(&str, &str)]) -> Command {
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", folder.display()),
        _ => folder.display().to_string(),
    };
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([test, "--exact", "--nocapture", "--include-ignored"])
        .env("CUDA_MODEL_CASE", test)
        .env("RCCL_DEVICE", "cuda")
        .env("LD_LIBRARY_PATH", path)
        .env("RCCL_CUDA_MODEL_DEADLINE_MS", "10000")
        .envs(env.iter().copied());
    child
}
