//! Collective schedules as pure data, and the symbolic executor that proves
//! them.
//!
//! Nothing here touches sockets, threads or memory: an [`Algorithm`] turns a
//! [`CollSpec`] and [`Params`] into a per-rank [`Schedule`] in NCCL's
//! primitive vocabulary, and [`verify`] runs the schedules of every rank
//! together to prove that each output element is the reduction of exactly
//! the right inputs, each exactly once, and that no rank waits for a message
//! nobody sends.

pub mod schedule;

pub use schedule::{split_even, Buf, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Step};

/// A collective algorithm: turns a call into each rank's schedule.
///
/// Implementations are pure functions of their arguments: the same call on
/// every rank must yield schedules that fit together, which
/// [`verify`](crate::verify) checks.
pub trait Algorithm: Send + Sync {
    /// The name users select it by (`NCCL_ALGO`), lower case.
    fn name(&self) -> &'static str;

    /// Whether this algorithm implements `kind`.
    fn supports(&self, kind: CollKind) -> bool;

    /// The schedule of `rank` for `spec`, cut as `params` says.
    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params) -> Schedule;
}
