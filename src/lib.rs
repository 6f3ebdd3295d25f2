//! Shared code of the perf binaries and the correctness suite.

pub mod perf;
