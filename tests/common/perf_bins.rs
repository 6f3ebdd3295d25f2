//! Every perf binary of the package with its program name, and a command
//! that runs one without what the test runner's environment may carry
//! (included with `#[path]`).

// Each test binary uses part of this.
#![allow(dead_code)]

/// Every binary with its program name.
pub const BINS: &[(&str, &str)] = &[
    ("all_reduce_perf", env!("CARGO_BIN_EXE_all_reduce_perf")),
    ("all_gather_perf", env!("CARGO_BIN_EXE_all_gather_perf")),
    ("broadcast_perf", env!("CARGO_BIN_EXE_broadcast_perf")),
    ("reduce_perf", env!("CARGO_BIN_EXE_reduce_perf")),
    (
        "reduce_scatter_perf",
        env!("CARGO_BIN_EXE_reduce_scatter_perf"),
    ),
    ("alltoall_perf", env!("CARGO_BIN_EXE_alltoall_perf")),
    ("gather_perf", env!("CARGO_BIN_EXE_gather_perf")),
    ("scatter_perf", env!("CARGO_BIN_EXE_scatter_perf")),
    ("sendrecv_perf", env!("CARGO_BIN_EXE_sendrecv_perf")),
    ("hypercube_perf", env!("CARGO_BIN_EXE_hypercube_perf")),
];

/// Launcher variables and perf-binary settings that a test must not
/// inherit from the environment it runs in.
pub const INHERITED_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NCCL_COMM_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_DETERMINISTIC",
    "NCCL_TESTS_MIN_BW",
    "RCCL_PERF_CORRUPT",
    "RCCL_DEVICE",
];

/// A command running `bin` with `args`, none of [`INHERITED_VARS`] set.
pub fn perf_command(bin: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args);
    for v in INHERITED_VARS {
        cmd.env_remove(v);
    }
    cmd
}
