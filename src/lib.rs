//! Shared code of the perf binaries and the correctness suite.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod perf;
