//! rccl-rs: the collective communication engine.
//!
//! Create a [`Communicator`] per rank (from a [`UniqueId`], the
//! environment, or [`Communicator::init_all`] for ranks of one process),
//! then call NCCL's collectives on it with typed slices, or batch several
//! operations in a [`Group`].
//!
//! A call is planned once (`plan/`) and handed, where it is enqueued
//! (`launch.rs`), to one of two executors: `host_executor/` runs it from
//! the calling thread on host memory, `device_executor/` enqueues it on
//! its stream as device work (or, where device work cannot reach every
//! peer, has the host executor run it over host copies).

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod agreement;
mod api;
mod bootstrap;
mod comm;
mod config;
mod connect;
mod debug;
pub mod deterministic;
mod device_executor;
mod encryption;
mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
mod group;
mod host_executor;
mod job;
// Public for the workspace's kernel benchmarks and the simulator's probe
// of this machine; not part of the API.
#[doc(hidden)]
pub mod kernels;
mod launch;
mod memory;
mod net;
mod onesided;
mod op;
mod plan;
mod plugins;
mod queue;
mod selection;
pub mod tuning;
mod types;

pub use api::{CollCall, Element, Group, F8E4M3, F8E5M2};
pub use bootstrap::{Bootstrap, UniqueId};
pub use comm::{hang_report, report_hangs_on_signal, Communicator};
pub use config::{last_level_cache_bytes, Config, MAX_CHANNELS};
pub use encryption::{encrypted, set_encryption, MIN_PSK_BYTES};
pub use error::{Error, Result};
pub use group::{group_depth, group_end, group_fail, group_simulate_end, group_start};
pub use job::{launcher_rank_from_env, rank_from_env};
pub use memory::{Hold, Ledger, MemStats, MemUse, Place, Purpose};
pub use onesided::{
    alloc_shareable_host, check_device_free, free_shareable_host, WaitDesc, Window,
    WIN_COLL_SYMMETRIC, WIN_FLAGS, WIN_REQUIRED_ALIGNMENT, WIN_STRICT_ORDERING,
};
pub use plan::{PlannedCollective, PlannedComm, PlannedP2p};
pub use rccl_algorithms::CollKind;
/// GPU memory, streams and events (the `rccl-device` crate): what callers of
/// the stream-ordered calls allocate and synchronize with.
pub use rccl_device as device;
/// Settings: the one reader of `NCCL_*` / `RCCL_*` variables (and the
/// environment plug-in).
pub use rccl_env as env;
pub use types::{DataType, Executor, RedOp};
