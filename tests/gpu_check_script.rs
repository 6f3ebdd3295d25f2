//! `scripts/gpu-check.sh`, the run a lent GPU machine makes, end to end
//! over the CUDA driver model (cuda-model/ as `libcuda.so.1`):
//! `prepare --no-build` packs the binaries of this build, and the run
//! goes through every step with small messages. The summary must hold no
//! FAIL, and every line that needs no part built for the hardware must
//! have run on the model's `[cuda 0]`.
//!
//! It uses the binaries in target/release: the perf binaries (built
//! before this test) and `rccl-kernel-check`, which `cargo test
//! --workspace` builds with the device crate's tests (alone:
//! `cargo build --release -p rccl-device --bin rccl-kernel-check`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The lines run over the model, each with the status it must have.
const RUN: &[(&str, &str)] = &[
    ("kernel x datatype x op vs CPU", "PASS"),
    ("reduce vs D2D copy bandwidth", "INFO"),
    ("perf binaries, device memory, -g 2/4/8", "PASS"),
    ("all_reduce busbw, 2 ranks", "INFO"),
    ("all_reduce busbw, 4 ranks", "INFO"),
    ("all_reduce busbw, 8 ranks", "INFO"),
    (
        "perf binaries, --procs 2, device memory through host copies",
        "PASS",
    ),
    ("perf binaries, --procs 2, CUDA IPC", "PASS"),
    ("perf binaries, --procs 4, CUDA IPC", "PASS"),
    ("perf binaries, 2 hosts by NCCL_HOSTID, device work", "PASS"),
];

/// The lines that need parts built for the hardware.
const HARDWARE_ONLY: &[&str] = &[
    "machine",
    "NVIDIA NCCL, 2 ranks on one GPU",
    "NVIDIA NCCL, 4 ranks on one GPU",
    "NVIDIA NCCL, 8 ranks on one GPU",
    "nccl-tests (NVIDIA NCCL)",
    "nccl-tests (rccl-rs)",
    "torch nccl / DDP on cuda:0",
];

/// Steps the model cannot run yet, with the reason the summary gives.
const NOT_ON_THE_MODEL: &[(&str, &str, &[&str])] = &[(
    "fifos",
    "the model has no FIFO loopback kernel yet",
    &["FIFO protocols warp to warp"],
)];

/// The widths of the summary's name and status columns.
const NAME_WIDTH: usize = 60;
const STATUS_WIDTH: usize = 15;

/// A folder of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The script with `args`, bounded by `timeout`; its output.
fn gpu_check(args: &[&str], env: &[(&str, String)], seconds: u32) -> (bool, String) {
    let script = repo_root().join("scripts/gpu-check.sh");
    let out = Command::new("timeout")
        .args(["-k", "10", &seconds.to_string(), "bash"])
        .arg(&script)
        .args(args)
        .current_dir(repo_root())
        .env_remove("RCCL_DEVICE")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run scripts/gpu-check.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The summary's rows: (check, status, detail).
fn rows(summary: &str) -> Vec<(String, String, String)> {
    summary
        .lines()
        .skip(2)
        .map(|line| {
            let status_end = (NAME_WIDTH + 1 + STATUS_WIDTH).min(line.len());
            (
                line[..NAME_WIDTH.min(line.len())].trim().to_string(),
                line[(NAME_WIDTH + 1).min(line.len())..status_end]
                    .trim()
                    .to_string(),
                line[status_end..].trim().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_gpu_check_runs_end_to_end_over_the_cuda_driver_model() {
    let release = Path::new(env!("CARGO_BIN_EXE_all_reduce_perf"))
        .parent()
        .unwrap();
    let kernel_check = release.join("rccl-kernel-check");
    assert!(
        kernel_check.exists(),
        "{} is missing: cargo build --release -p rccl-device --bin rccl-kernel-check",
        kernel_check.display()
    );
    let model = release.join("deps/librccl_cuda_model.so");
    assert!(
        model.exists(),
        "{} is built with the tests",
        model.display()
    );

    let scratch =
        Scratch(std::env::temp_dir().join(format!("rccl-gpu-check-{}", std::process::id())));
    let (pack, out, driver) = (
        scratch.0.join("pack"),
        scratch.0.join("out"),
        scratch.0.join("driver"),
    );
    std::fs::create_dir_all(&driver).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::os::unix::fs::symlink(&model, driver.join(name)).unwrap();
    }

    let (ok, text) = gpu_check(
        &["prepare", "--no-build"],
        &[
            ("GPU_CHECK_PACK", pack.display().to_string()),
            ("GPU_CHECK_RELEASE_DIR", release.display().to_string()),
        ],
        120,
    );
    assert!(ok, "gpu-check.sh prepare --no-build:\n{text}");

    let library_path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", driver.display()),
        _ => driver.display().to_string(),
    };
    let skip = NOT_ON_THE_MODEL
        .iter()
        .map(|(step, reason, _)| format!("{step}={reason}"))
        .collect::<Vec<_>>()
        .join(";");
    let (_, text) = gpu_check(
        &[],
        &[
            ("GPU_CHECK_PACK", pack.display().to_string()),
            ("OUT", out.display().to_string()),
            ("GPU_CHECK_MODEL", "1".into()),
            ("GPU_CHECK_MAX_BYTES", "65536".into()),
            ("GPU_CHECK_SKIP", skip),
            ("LD_LIBRARY_PATH", library_path),
            ("RCCL_CUDA_MODEL_DEADLINE_MS", "10000".into()),
        ],
        420,
    );
    let summary = std::fs::read_to_string(out.join("summary.txt"))
        .unwrap_or_else(|e| panic!("no summary ({e}):\n{text}"));
    let logs = || {
        let mut all = String::new();
        for name in [
            "kernels.log",
            "perf_all_reduce_g8.log",
            "perf_all_reduce_staged.log",
            "perf_all_reduce_procs2.log",
            "perf_all_reduce_procs4.log",
        ] {
            let log = std::fs::read_to_string(out.join(name)).unwrap_or_default();
            all += &format!("== {name}\n{log}\n");
        }
        all
    };
    let header = summary.lines().next().unwrap_or_default();
    assert!(header.contains("over the CUDA driver model"), "{summary}");
    let rows = rows(&summary);
    let status_of = |check: &str| {
        rows.iter()
            .find(|(name, _, _)| name == check)
            .map(|(_, status, detail)| (status.as_str(), detail.as_str()))
    };
    for (check, want) in RUN {
        let (status, detail) =
            status_of(check).unwrap_or_else(|| panic!("no line {check:?}:\n{summary}"));
        assert_eq!(status, *want, "{check}:\n{summary}\n{}", logs());
        if *want == "INFO" {
            assert!(detail.contains("not judged over the model"), "{summary}");
        }
    }
    for check in HARDWARE_ONLY {
        let (status, _) =
            status_of(check).unwrap_or_else(|| panic!("no line {check:?}:\n{summary}"));
        assert_eq!(status, "SKIPPED (model)", "{check}:\n{summary}");
    }
    for (_, reason, checks) in NOT_ON_THE_MODEL {
        for check in *checks {
            let (status, detail) =
                status_of(check).unwrap_or_else(|| panic!("no line {check:?}:\n{summary}"));
            assert_eq!((status, detail), ("SKIPPED (model)", *reason), "{summary}");
        }
    }
    let listed = RUN.len()
        + HARDWARE_ONLY.len()
        + NOT_ON_THE_MODEL
            .iter()
            .map(|(_, _, checks)| checks.len())
            .sum::<usize>();
    assert_eq!(rows.len(), listed, "lines nobody expects:\n{summary}");
    // The runs reached the model's device, not another backend.
    let kernels = std::fs::read_to_string(out.join("kernels.log")).unwrap();
    assert!(kernels.contains("[cuda 0] rccl CUDA model 0"), "{kernels}");
    let perf = std::fs::read_to_string(out.join("perf_all_reduce_g8.log")).unwrap();
    assert!(
        perf.contains("memory=device [cuda 0] rccl CUDA model 0"),
        "{perf}"
    );
    println!("{summary}");
}
