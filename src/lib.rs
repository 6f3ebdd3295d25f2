//! Shared code of the perf binaries and the correctness suite.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod perf;
