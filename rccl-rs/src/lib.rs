//! rccl-rs: the collective communication engine.
//!
//! Create a [`Communicator`] per rank (from a [`UniqueId`], the
//! environment, or [`Communicator::init_all`] for ranks of one process),
//! then call NCCL's collectives on it with typed slices, or batch several
//! operations in a [`Group`].

pub mod api;
pub mod bootstrap;
mod call;
pub mod comm;
pub mod config;
mod connect;
pub mod debug;
mod diagnose;
pub mod error;
pub mod executor;
#[cfg(feature = "fault-injection")]
pub mod fault;
mod group;
pub mod kernels;
mod launch;
mod launch_key;
pub mod net;
mod op;
mod plan;
mod selection;
pub mod signal;
mod state;
mod stuck;
pub mod tuning;
pub mod types;

pub use api::{CollCall, Element, Group, F8E4M3, F8E5M2};
pub use bootstrap::{Bootstrap, UniqueId};
pub use comm::{hang_report, Communicator};
pub use config::Config;
pub use error::{Error, Result};
pub use group::{group_depth, group_end, group_fail, group_simulate_end, group_start};
pub use plan::{PlannedCollective, PlannedComm, PlannedP2p};
pub use rccl_algorithms::CollKind;
pub use signal::report_hangs_on_signal;
pub use types::{DataType, RedOp};
