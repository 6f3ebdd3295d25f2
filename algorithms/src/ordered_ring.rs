//! The ordered ring: the reducing collectives with one reduction order per
//! output element, fixed by the element's index and the rank count alone.
//!
//! A reduction of floating-point values depends on its order. The ring
//! reduces a chunk along the ring from the rank after the chunk's owner,
//! so its order follows the channel split, the chunk size and the ranks'
//! places on hosts. The ordered ring removes all three:
//!
//! * the ring is the ranks in index order, `0 -> 1 -> ... -> n-1 -> 0`,
//!   whatever their hosts (a channel's rail changes which NIC carries an
//!   edge, not the order);
//! * **AllReduce** splits the buffer into `n` blocks first
//!   ([`split_even`]), and only then each block across channels and into
//!   chunks. Block `b` is reduced along the ring from rank `b + 1` to rank
//!   `b` (its owner), then gathered: the ring AllReduce's primitives, on
//!   block-first pieces;
//! * **ReduceScatter** and **Reduce** are the ring's, on the index-order
//!   ring: an output element of rank `r`'s block (ReduceScatter) or of the
//!   root (Reduce) is reduced from rank `r + 1` (`root + 1`) round to it.
//!
//! [`reduction_order`] states the order; the property test in
//! `tests/ordered_ring.rs` proves every schedule of this module computes
//! it for any channel count and chunk, and that the ring does not. The
//! bandwidth is the ring's: every rank sends and receives the same bytes.

use crate::ring::{all_reduce_loop, RingPos};
use crate::{split_even, Algorithm, CollKind, CollSpec, Params, Rank, Ring, Schedule, Topology};

/// The ring with its reduction order fixed by element index and rank count
/// (see the module documentation), for AllReduce, ReduceScatter and
/// Reduce.
#[derive(Clone, Copy, Debug, Default)]
pub struct OrderedRing;

impl Algorithm for OrderedRing {
    fn name(&self) -> &'static str {
        "ordered_ring"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
        )
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, _topo: &Topology) -> Schedule {
        assert!(
            self.supports(spec.kind),
            "ordered_ring does not implement {}",
            spec.kind.name()
        );
        let in_index_order = Topology::flat(spec.nranks);
        if spec.kind != CollKind::AllReduce || spec.nranks == 1 {
            return Ring.schedule(spec, rank, params, &in_index_order);
        }
        let nchannels = params.nchannels.max(1);
        let chunk = params.chunk_elems.max(1);
        let ring = RingPos::new(in_index_order.ring_order(0), rank);
        let blocks: Vec<(usize, usize)> = split_even(spec.count, spec.nranks).collect();
        let mut schedule = Schedule::new(nchannels);
        for (channel, steps) in schedule.channels.iter_mut().enumerate() {
            // This channel's piece of each block, as (offset, len).
            let pieces: Vec<(usize, usize)> = blocks
                .iter()
                .map(|&(offset, len)| {
                    let (o, l) = split_even(len, nchannels)
                        .nth(channel)
                        .expect("one piece per channel");
                    (offset + o, l)
                })
                .collect();
            let longest = pieces.iter().map(|&(_, l)| l).max().unwrap_or(0);
            for base in (0..longest).step_by(chunk) {
                let part = |b: usize| {
                    let (offset, len) = pieces[b];
                    let start = base.min(len);
                    (offset + start, (len - start).min(chunk))
                };
                all_reduce_loop(steps, &ring, part);
            }
        }
        schedule
    }
}

/// The ranks whose inputs output element `index` of `rank` holds under
/// [`OrderedRing`], in accumulation order: `acc = x[o + 1]`, then
/// `acc = acc op x[o + 2]`, ..., `acc = acc op x[o]` (ranks modulo `n`),
/// where the owner `o` is the block of `index` in
/// `split_even(count, n)` for AllReduce, `rank` for ReduceScatter and the
/// root for Reduce. `None` for a collective that does not reduce, or an
/// element outside the call.
pub fn reduction_order(spec: &CollSpec, rank: Rank, index: usize) -> Option<Vec<Rank>> {
    let n = spec.nranks;
    let owner = match spec.kind {
        CollKind::AllReduce if index < spec.count => split_even(spec.count, n)
            .position(|(offset, len)| (offset..offset + len).contains(&index))?,
        CollKind::ReduceScatter if rank < n && index < spec.count => rank,
        CollKind::Reduce if rank == spec.root && index < spec.count => spec.root,
        _ => return None,
    };
    Some((1..=n).map(|k| (owner + k) % n).collect())
}
