//! A simulator that replays the real collective schedules of
//! `rccl-algorithms` on modeled clusters and predicts their time and bus
//! bandwidth, in nccl-tests' terms.
//!
//! * [`ClusterSpec`] describes a cluster (JSON; presets [`cluster::h100`]
//!   and [`cluster::local`]): hosts, an intra-host switch, NICs on rails, a
//!   two-level fat tree, per-rank reduction bandwidth, protocol figures,
//!   slow ranks and degraded links.
//! * [`simulate`] builds every rank's schedule with the real algorithm and
//!   replays it (`docs/SIMULATOR.md` explains the model).
//! * [`simulate_p2p`] replays one rank's sends and receives of a group,
//!   with its peers posting the matching calls.
//! * [`report`] prints nccl-tests' table and a JSON form.
//! * [`estimate`] gives each built-in algorithm's time in closed form,
//!   and [`tune`] picks with it what the engine's tuner runs
//!   ([`tune::decide`], [`tune::engine_choice`]; in the engine's
//!   deterministic mode [`tune::engine_choice_with`]) and ranks candidates
//!   by replay ([`tune::fastest`]), the reference the forms are tested
//!   against.
//!
//! # Example
//!
//! ```
//! use rccl_algorithms::{CollKind, CollSpec, Ring};
//! use rccl_simulator::{cluster, default_params, simulate, Protocol};
//!
//! let c = cluster::h100(2); // 16 ranks
//! let spec = CollSpec { kind: CollKind::AllReduce, nranks: 16, root: 0, count: 1 << 24 };
//! let params = default_params(&c, &spec, 4, Protocol::Simple);
//! let r = simulate(&c, &spec, 4, &Ring, Protocol::Simple, &params).unwrap();
//! // The channels cross hosts on rails of their own (NICs of 46-48 GB/s).
//! assert!(r.busbw > 100.0 && r.busbw < 400.0, "{}", r.busbw);
//! ```

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod builtin;
pub mod cluster;
pub mod estimate;
pub mod probe;
pub mod report;
pub mod sim;
pub mod tune;

pub use cluster::{ClusterSpec, Protocol, SimError};
pub use rccl_algorithms::{P2pOp, Params};
pub use sim::{
    bus_factor, default_p2p_params, default_params, default_protocol, footprint, simulate,
    simulate_p2p, simulate_with, size_bytes, Footprint, Regime, SimOptions, SimResult, MAX_PRIMS,
};

/// The algorithm called `name` (case-insensitive) that the forms and the
/// replay's symmetry rules know: a built-in of `rccl-algorithms`, or the
/// ordered ring of the engine's deterministic mode.
pub fn algorithm(name: &str) -> Option<&'static dyn rccl_algorithms::Algorithm> {
    builtin::Builtin::algorithm_named(name)
}
