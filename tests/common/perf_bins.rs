//! Every perf binary of the package with its program name, for the tests
//! that run them all (included with `#[path]`).

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
