//! Collective schedules as pure data, and the symbolic executor that proves
//! them.
//!
//! Nothing here touches sockets, threads or memory: an [`Algorithm`] turns a
//! [`CollSpec`] and [`Params`] into a per-rank [`Schedule`] in NCCL's
//! primitive vocabulary, and [`verify()`] runs the schedules of every rank
//! together to prove that each output element is the reduction of exactly
//! the right inputs, each exactly once, and that no rank waits for a message
//! nobody sends.
//!
//! Built in, one algorithm per module: [`Ring`] (AllReduce, Broadcast,
//! Reduce, AllGather, ReduceScatter), [`Direct`] (AlltoAll, Gather, Scatter,
//! and grouped point-to-point calls through [`p2p_schedule`]), [`Tree`]
//! (NCCL's double binary tree AllReduce, tree Broadcast),
//! [`HalvingDoubling`] (Rabenseifner's AllReduce, any rank count),
//! [`Hierarchical`] (AllReduce, AllGather, ReduceScatter over hosts, given a
//! [`Topology`]) and [`OneShot`] (all-pairs AllReduce for tiny messages);
//! [`builtin`] looks one up by name and [`default_for`] picks one for a
//! collective. [`OrderedRing`] is the ring with one reduction order per
//! element ([`reduction_order`]), for deterministic reductions.
//! [`load_schedule_file`] loads a researcher's schedule from a JSON file
//! and proves it before use (`docs/SCHEDULES.md`).
//!
//! # Example
//!
//! Build a ring AllReduce for 4 ranks, cut into 2 channels and chunks of 3
//! elements, and prove it, out of place and in place:
//!
//! ```
//! use rccl_algorithms::{verify, Algorithm, CollKind, CollSpec, Params, Prim, Ring, Topology};
//!
//! let spec = CollSpec { kind: CollKind::AllReduce, nranks: 4, root: 0, count: 24 };
//! let params = Params { nchannels: 2, chunk_elems: 3 };
//!
//! // Rank 0's first step on channel 0 sends its chunk 3 (ring order).
//! let schedule = Ring.schedule(&spec, 0, &params, &Topology::flat(4));
//! assert_eq!(schedule.channels.len(), 2);
//! assert!(matches!(schedule.channels[0][0].prims[0], Prim::Send { to: 1, .. }));
//!
//! for in_place in [false, true] {
//!     let stats = verify(&Ring, &spec, &params, in_place).expect("ring all-reduce is correct");
//!     // 2 channels x 1 pipeline loop x (2n - 1) steps, on each of 4 ranks.
//!     assert_eq!(stats.steps, 4 * 2 * 7);
//! }
//! ```

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod direct;
pub mod file;
pub mod halving_doubling;
pub mod hierarchical;
pub mod one_shot;
pub mod ordered_ring;
mod pieces;
pub mod protocol;
pub mod ring;
pub mod schedule;
pub mod topology;
pub mod tree;
pub mod verify;

pub use direct::{p2p_schedule, unpaired_self_calls, Direct, P2pOp};
pub use file::{load_schedule_file, parse_schedule, FileError, LoadedAlgorithm};
pub use halving_doubling::HalvingDoubling;
pub use hierarchical::Hierarchical;
pub use one_shot::OneShot;
pub use ordered_ring::{reduction_order, OrderedRing};
pub use protocol::Protocol;
pub use ring::Ring;
pub use schedule::{
    split_even, Buf, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Step,
};
pub use topology::Topology;
pub use tree::Tree;
pub use verify::{reduction_orders, verify, verify_on, verify_schedules, Stats, VerifyError};

static BUILTINS: [&dyn Algorithm; 6] = [
    &Ring,
    &Direct,
    &Tree,
    &HalvingDoubling,
    &Hierarchical,
    &OneShot,
];

/// Every built-in algorithm.
pub fn builtins() -> &'static [&'static dyn Algorithm] {
    &BUILTINS
}

/// The built-in algorithm called `name` (case-insensitive), if any.
pub fn builtin(name: &str) -> Option<&'static dyn Algorithm> {
    BUILTINS
        .iter()
        .copied()
        .find(|a| a.name().eq_ignore_ascii_case(name))
}

/// The algorithm used for `kind` when the user selects none: ring for
/// AllReduce, Broadcast, Reduce, AllGather and ReduceScatter, direct for
/// AlltoAll, Gather and Scatter.
pub fn default_for(kind: CollKind) -> &'static dyn Algorithm {
    if Ring.supports(kind) {
        &Ring
    } else {
        &Direct
    }
}

/// A collective algorithm: turns a call into each rank's schedule.
///
/// Implementations are pure functions of their arguments: the same call on
/// every rank must yield schedules that fit together, which
/// [`verify()`] checks.
pub trait Algorithm: Send + Sync {
    /// The name users select it by (`NCCL_ALGO`), lower case.
    fn name(&self) -> &'static str;

    /// Whether this algorithm implements `kind`.
    fn supports(&self, kind: CollKind) -> bool;

    /// Whether this algorithm can run with the ranks placed on hosts as
    /// `topo` says (hierarchical algorithms need a shape); true by default.
    fn supports_topology(&self, topo: &Topology) -> bool {
        let _ = topo;
        true
    }

    /// Whether this algorithm's schedules for `kind` are also correct in
    /// place (NCCL's aliased buffers); true by default.
    fn supports_in_place(&self, kind: CollKind) -> bool {
        let _ = kind;
        true
    }

    /// The schedule of `rank` for `spec`, cut as `params` says, for ranks
    /// placed on hosts as `topo` says.
    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, topo: &Topology) -> Schedule;
}
