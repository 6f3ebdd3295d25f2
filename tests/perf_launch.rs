//! Every perf binary checks clean (`-d all -o all`, 0 in every #wrong
//! column) on 4 ranks in each launch mode without MPI: threads, processes
//! joining through torchrun's variables, Slurm's and MPI launchers'
//! variables with `NCCL_COMM_ID`, and `--procs`; the corruption switch is
//! counted as wrong in process mode too. A launcher variable naming no
//! rank of the job is refused.

use std::process::{Child, Command, Output, Stdio};

#[path = "common/children.rs"]
mod children;
#[path = "common/perf_bins.rs"]
mod perf_bins;
use children::free_port;
use perf_bins::{perf_command, BINS};

/// One size, one timed iteration, every type and op.
const ALL: &[&str] = &[
    "-b", "1K", "-e", "1K", "-n", "1", "-w", "1", "-d", "all", "-o", "all",
];

fn command(bin: &str, args: &[&str], corrupt: bool) -> Command {
    let mut cmd = perf_command(bin, args);
    if corrupt {
        cmd.env("RCCL_PERF_CORRUPT", "1");
    }
    cmd
}

/// The #wrong values of every result row (the last column of each half).
fn wrong_columns(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 12, "not a result row: {line:?}");
        out.push(f[f.len() - 5].to_string());
        out.push(f[f.len() - 1].to_string());
    }
    out
}

/// Checks a clean run: success, rows present, every #wrong 0.
fn assert_clean(name: &str, mode: &str, status_ok: bool, text: &str) {
    assert!(status_ok, "{name} ({mode}) failed:\n{text}");
    assert!(
        text.contains(&format!("# Collective test concluded: {name}")),
        "{name} ({mode}):\n{text}"
    );
    let wrong = wrong_columns(text);
    assert!(!wrong.is_empty(), "{name} ({mode}): no rows\n{text}");
    // Out-of-place halves (even indices) are always checked; in-place
    // halves of collectives that are not checked in place say N/A.
    assert!(
        wrong
            .iter()
            .enumerate()
            .all(|(i, w)| w == "0" || (i % 2 == 1 && w == "N/A")),
        "{name} ({mode}): wrong elements\n{text}"
    );
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
}

/// Starts 4 ranks as processes with `env(rank)`; returns rank 0's output
/// and whether every process succeeded.
fn run_processes(
    bin: &str,
    args: &[&str],
    corrupt: bool,
    env: impl Fn(usize) -> Vec<(String, String)>,
) -> (bool, String) {
    let children: Vec<Child> = (0..4)
        .map(|rank| {
            let mut cmd = command(bin, args, corrupt);
            cmd.envs(env(rank));
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            cmd.spawn().expect("start a rank")
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let ok = outs.iter().all(|o| o.status.success());
    let mut text = String::from_utf8_lossy(&outs[0].stdout).into_owned();
    if !ok {
        for (r, o) in outs.iter().enumerate() {
            // As comment lines, so the rows parse as before.
            text += &format!("\n# --- rank {r}: {}", o.status);
            for l in String::from_utf8_lossy(&o.stderr).lines() {
                text += &format!("\n# {l}");
            }
        }
    }
    // Ranks other than 0 print no results.
    for o in &outs[1..] {
        assert!(wrong_columns(&String::from_utf8_lossy(&o.stdout)).is_empty());
    }
    (ok, text)
}

fn torchrun_env(port: u16) -> impl Fn(usize) -> Vec<(String, String)> {
    move |rank| {
        [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", "4".to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", port.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

#[test]
fn every_binary_threads() {
    for (name, bin) in BINS {
        let mut args = vec!["-g", "4"];
        args.extend_from_slice(ALL);
        let out = command(bin, &args, false).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_clean(name, "threads", out.status.success(), &text);
    }
}

#[test]
fn every_binary_torchrun_processes() {
    for (name, bin) in BINS {
        let (ok, text) = run_processes(bin, ALL, false, torchrun_env(free_port()));
        assert_clean(name, "torchrun variables", ok, &text);
        // Four processes: four different pids in the device list.
        let pids: std::collections::HashSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("#  Rank "))
            .filter_map(|l| l.split("Pid").nth(1)?.split_whitespace().next())
            .collect();
        assert_eq!(pids.len(), 4, "{text}");
    }
}

/// Slurm's and the MPI launchers' rank variables, with the rendezvous
/// address from NCCL_COMM_ID (they set no MASTER_ADDR).
#[test]
fn slurm_openmpi_and_mpich_variables_with_nccl_comm_id() {
    let families: [(&str, &str, &str); 3] = [
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS"),
        ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("mpich", "PMI_RANK", "PMI_SIZE"),
    ];
    for (i, (family, rank_var, size_var)) in families.into_iter().enumerate() {
        let (name, bin) = BINS[i];
        let port = free_port();
        let (ok, text) = run_processes(bin, ALL, false, |rank| {
            vec![
                (rank_var.to_string(), rank.to_string()),
                (size_var.to_string(), "4".to_string()),
                ("NCCL_COMM_ID".to_string(), format!("127.0.0.1:{port}")),
            ]
        });
        assert_clean(name, family, ok, &text);
    }
}

#[test]
fn procs_launcher_runs_every_binary() {
    for (name, bin) in BINS {
        let mut args = vec!["--procs", "4"];
        args.extend_from_slice(ALL);
        let out = command(bin, &args, false).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_clean(name, "--procs 4", out.status.success(), &text);
        assert_eq!(text.matches("#  Rank ").count(), 4, "{text}");
    }
}

#[test]
fn corruption_is_counted_in_process_modes() {
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    let args = ["-b", "1K", "-e", "1K", "-n", "1"];
    let (ok, text) = run_processes(bin, &args, true, torchrun_env(free_port()));
    assert!(!ok, "a corrupted run must fail:\n{text}");
    assert!(wrong_columns(&text).iter().any(|w| w != "0"), "{text}");
    assert!(text.contains("FAILED"), "{text}");

    let mut with_procs = vec!["--procs", "4"];
    with_procs.extend_from_slice(&args);
    let out = command(bin, &with_procs, true).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(wrong_columns(&text).iter().any(|w| w != "0"), "{text}");
}

/// Processes refuse -t/-g above 1 rather than miscounting ranks.
#[test]
fn processes_reject_threads_per_process() {
    let out = command(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &["--procs", "2", "-g", "2", "-b", "8", "-e", "8"],
        false,
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("-t and -g must be 1"));
}

/// A launcher's variable that names no rank of the job (out of range, not
/// a number, negative, a world of 0 ranks, a bad local rank) is refused at
/// once, naming the variable and its value, instead of running alone.
#[test]
fn launcher_variables_naming_no_rank_of_the_job_are_refused() {
    let port = free_port().to_string();
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("RANK", "2"), ("WORLD_SIZE", "2")],
            "RANK=2 is out of range for WORLD_SIZE=2",
        ),
        (&[("RANK", "abc"), ("WORLD_SIZE", "2")], "RANK=\"abc\""),
        (&[("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK=\"-1\""),
        (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE=0"),
        (
            &[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")],
            "OMPI_COMM_WORLD_RANK=4 is out of range for OMPI_COMM_WORLD_SIZE=4",
        ),
        (
            &[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "4")],
            "SLURM_PROCID=\"x\"",
        ),
        (&[("PMI_RANK", "-1"), ("PMI_SIZE", "2")], "PMI_RANK=\"-1\""),
        // The rank is valid: only the local rank is wrong, so the old
        // behaviour was to wait for the root.
        (
            &[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "x")],
            "LOCAL_RANK=\"x\"",
        ),
        (
            &[("RANK", "1"), ("WORLD_SIZE", "2"), ("SLURM_LOCALID", "2")],
            "SLURM_LOCALID=2 is out of range",
        ),
    ];
    for &(vars, says) in cases {
        let mut cmd = command(
            env!("CARGO_BIN_EXE_all_reduce_perf"),
            &["-b", "8", "-e", "8", "-d", "float", "-o", "sum"],
            false,
        );
        cmd.envs(vars.iter().copied())
            .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"))
            .env("RCCL_TIMEOUT_MS", "3000")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = std::time::Instant::now();
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{vars:?}:\n{text}");
        assert!(
            text.contains("refusing to start") && text.contains(says),
            "{vars:?}: expected {says:?} in:\n{text}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{vars:?}"
        );
    }
}
