//! Recursive halving-doubling AllReduce (Rabenseifner's algorithm).
//!
//! Let `p` be the largest power of two not above `n` and `e = n - p`.
//!
//! 1. **Fold in the extra ranks.** Of the first `2e` ranks, each even rank
//!    `send`s its whole input to the odd rank after it, which accumulates
//!    it with its own (`recvReduceCopyPartial`) and takes part in the rest;
//!    the even rank sits out. The `p` ranks left are renumbered `0..p`.
//! 2. **Reduce-scatter by recursive halving.** With `mask = p/2, p/4, ...,
//!    1`, each rank exchanges with `partner = me ^ mask`: the region it
//!    holds is cut in two halves; the rank whose `mask` bit is clear keeps
//!    the lower half, the other the upper one. It `send`s its partial of
//!    the half it gives away and reduces the partner's partial of the half
//!    it keeps into its receive buffer (`recvReduceCopyPartial`, and
//!    `recvReduceCopy` in the last round: the result is final). Renumbered
//!    rank `i` ends owning block `i` of the region, fully reduced.
//! 3. **All-gather by recursive doubling.** The rounds in reverse: each rank
//!    `send`s the region it holds and `recv`s the partner's, so the region
//!    doubles each round.
//! 4. **Unfold.** Each odd rank of the first `2e` `send`s the whole result
//!    to the even rank before it, which `recv`s it.
//!
//! Each channel runs this on its part of the elements; every exchange is
//! cut into messages of at most `chunk_elems` elements, the sends and
//! receives of a round progressing together. Every element's result is
//! computed once, by its owner, so every rank holds the same bits.

use crate::pieces::{chunks, local_only, Steps};
use crate::{
    split_even, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Topology,
};

/// Recursive halving-doubling (Rabenseifner) AllReduce, for any rank count.
#[derive(Clone, Copy, Debug, Default)]
pub struct HalvingDoubling;

impl Algorithm for HalvingDoubling {
    fn name(&self) -> &'static str {
        "rhd"
    }

    fn supports(&self, kind: CollKind) -> bool {
        kind == CollKind::AllReduce
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, _topo: &Topology) -> Schedule {
        assert!(
            self.supports(spec.kind),
            "rhd does not implement {}",
            spec.kind.name()
        );
        let nchannels = params.nchannels.max(1);
        let chunk = params.chunk_elems.max(1);
        let n = spec.nranks;
        if let Some(schedule) = local_only(spec, nchannels) {
            return schedule;
        }
        let mut schedule = Schedule::new(nchannels);
        let p = 1 << n.ilog2();
        let extra = n - p;
        // Renumbered rank of a rank taking part, and back.
        let me = if rank < 2 * extra {
            (rank & 1 == 1).then_some(rank / 2)
        } else {
            Some(rank - extra)
        };
        let real = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };

        for (steps, (offset, len)) in schedule
            .channels
            .iter_mut()
            .zip(split_even(spec.count, nchannels))
        {
            let mut out = Steps::default();
            let whole = (offset, len);
            // Messages of at most one chunk from / into a region.
            let sends = |to: Rank, buf: fn(usize, usize) -> Slice, (o, l): (usize, usize)| {
                chunks(o, l, chunk).map(move |(o, l)| Prim::Send { to, src: buf(o, l) })
            };

            // 1. Fold in the extra ranks.
            let mut partial_in_recv = false;
            if rank < 2 * extra {
                if rank & 1 == 0 {
                    out.step(sends(rank + 1, Slice::send, whole).collect());
                } else {
                    out.step(
                        chunks(offset, len, chunk)
                            .map(|(o, l)| Prim::RecvReduceCopyPartial {
                                from: rank - 1,
                                src: Slice::send(o, l),
                                dst: Slice::recv(o, l),
                            })
                            .collect(),
                    );
                    partial_in_recv = true;
                }
            }

            if let Some(me) = me {
                // 2. Reduce-scatter by recursive halving.
                let mut region = whole;
                let mut held = Vec::new();
                let mut mask = p / 2;
                while mask > 0 {
                    let partner = real(me ^ mask);
                    let (o, l) = region;
                    let half = l / 2;
                    let (lower, upper) = ((o, half), (o + half, l - half));
                    let (keep, give) = if me & mask == 0 {
                        (lower, upper)
                    } else {
                        (upper, lower)
                    };
                    let src: fn(usize, usize) -> Slice = if partial_in_recv {
                        Slice::recv
                    } else {
                        Slice::send
                    };
                    let last = mask == 1;
                    let mut prims: Vec<Prim> = sends(partner, src, give).collect();
                    prims.extend(chunks(keep.0, keep.1, chunk).map(|(o, l)| {
                        let (src, dst) = (src(o, l), Slice::recv(o, l));
                        if last {
                            Prim::RecvReduceCopy {
                                from: partner,
                                src,
                                dst,
                            }
                        } else {
                            Prim::RecvReduceCopyPartial {
                                from: partner,
                                src,
                                dst,
                            }
                        }
                    }));
                    out.step(prims);
                    partial_in_recv = true;
                    held.push((region, give));
                    region = keep;
                    mask /= 2;
                }

                // 3. All-gather by recursive doubling.
                let mut mask = 1;
                while let Some((parent, sibling)) = held.pop() {
                    let partner = real(me ^ mask);
                    let mut prims: Vec<Prim> = sends(partner, Slice::recv, region).collect();
                    prims.extend(
                        chunks(sibling.0, sibling.1, chunk).map(|(o, l)| Prim::Recv {
                            from: partner,
                            dst: Slice::recv(o, l),
                        }),
                    );
                    out.step(prims);
                    region = parent;
                    mask *= 2;
                }
            }

            // 4. Unfold.
            if rank < 2 * extra {
                if rank & 1 == 1 {
                    out.step(sends(rank - 1, Slice::recv, whole).collect());
                } else {
                    out.step(
                        chunks(offset, len, chunk)
                            .map(|(o, l)| Prim::Recv {
                                from: rank + 1,
                                dst: Slice::recv(o, l),
                            })
                            .collect(),
                    );
                }
            }
            *steps = out.steps;
        }
        schedule
    }
}
