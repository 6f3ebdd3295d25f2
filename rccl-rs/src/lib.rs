//! rccl-rs: the collective communication engine.

pub mod error;
pub mod kernels;
pub mod types;

pub use error::{Error, Result};
pub use types::{DataType, RedOp};
