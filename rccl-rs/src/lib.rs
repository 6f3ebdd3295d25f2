//! rccl-rs: the collective communication engine.

pub mod bootstrap;
pub mod error;
pub mod net;
pub mod types;

pub use bootstrap::{Bootstrap, UniqueId};
pub use error::{Error, Result};
pub use types::{DataType, RedOp};
