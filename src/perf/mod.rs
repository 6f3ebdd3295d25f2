//! The perf tests' shared harness, compatible with nccl-tests: the same
//! flags, output format and bandwidth arithmetic, over host memory or
//! device memory of the active device (`--memory`).

pub mod args;
pub mod codec;
pub mod coll;
pub mod format;
pub mod harness;
pub mod json;
pub mod launch;

pub use args::{Args, TestOp};
pub use coll::Coll;
pub use harness::{main, CORRUPT_ENV};
