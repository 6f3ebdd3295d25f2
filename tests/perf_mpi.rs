//! With the `mpi` feature: every perf binary under `mpirun -np 4` / `mpiexec
//! -n 4` joins through MPI (rank 0's unique id broadcast with MPI_Bcast)
//! and checks clean with `-d all -o all`.
//!
//! The launcher is `RCCL_TEST_MPIEXEC` (default `mpiexec`); it must belong
//! to the MPI the binaries were built against (`MPICC`), e.g.
//! `MPICC=mpicc.mpich RCCL_TEST_MPIEXEC=mpiexec.mpich`.
#![cfg(feature = "mpi")]

use std::process::{Command, Output};

#[path = "common/perf_bins.rs"]
mod perf_bins;
use perf_bins::BINS;

const ALL: &[&str] = &[
    "-b", "1K", "-e", "1K", "-n", "1", "-w", "1", "-d", "all", "-o", "all",
];

fn mpiexec(bin: &str, args: &[&str], corrupt: bool) -> Output {
    let launcher = std::env::var("RCCL_TEST_MPIEXEC").unwrap_or_else(|_| "mpiexec".into());
    let mut cmd = Command::new(&launcher);
    cmd.args(["-n", "4", bin]).args(args);
    // No torchrun / NCCL_COMM_ID rendezvous: the ranks must use MPI.
    for v in [
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NCCL_COMM_ID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "NCCL_TESTS_MIN_BW",
        "RCCL_PERF_CORRUPT",
    ] {
        cmd.env_remove(v);
    }
    // OpenMPI: allow root (CI runs as root) and more ranks than cores;
    // MPICH ignores these.
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe");
    if corrupt {
        cmd.env("RCCL_PERF_CORRUPT", "1");
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {launcher}: {e}"))
}

fn wrong_columns(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 12 {
            continue; // a launcher's own message
        }
        out.push(f[f.len() - 5].to_string());
        out.push(f[f.len() - 1].to_string());
    }
    out
}

#[test]
fn every_binary_under_mpi() {
    for (name, bin) in BINS {
        let out = mpiexec(bin, ALL, false);
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}:\n{text}\n{err}");
        assert_eq!(
            text.matches(&format!("# Collective test starting: {name}"))
                .count(),
            1,
            "only rank 0 reports:\n{text}"
        );
        let wrong = wrong_columns(&text);
        assert!(!wrong.is_empty(), "{name}: no rows\n{text}");
        // Out-of-place halves (even indices) are always checked; in-place
        // halves of collectives that are not checked in place say N/A.
        assert!(
            wrong
                .iter()
                .enumerate()
                .all(|(i, w)| w == "0" || (i % 2 == 1 && w == "N/A")),
            "{name}:\n{text}"
        );
        assert_eq!(text.matches("#  Rank ").count(), 4, "{text}");
    }
}

#[test]
fn mpi_bootstrap_is_used_and_corruption_counted() {
    let dir = std::env::temp_dir().join(format!("rccl-perf-mpi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mpi.json");
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    let out = mpiexec(
        bin,
        &[
            "-b",
            "8",
            "-e",
            "1K",
            "-f",
            "8",
            "-n",
            "3",
            "-I",
            "1",
            "-J",
            path.to_str().unwrap(),
        ],
        false,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(doc["config"]["rccl"]["launch"], "mpi");
    assert_eq!(doc["config"]["devices"].as_array().unwrap().len(), 4);
    let rows = doc["results"][0]["out_of_place_per_iter"]["per_process_max_times_us"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(rows, 4);
    let _ = std::fs::remove_dir_all(&dir);

    let out = mpiexec(bin, &["-b", "1K", "-e", "1K", "-n", "1"], true);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(wrong_columns(&text).iter().any(|w| w != "0"), "{text}");
}
