//! One-shot all-pairs AllReduce: the latency-first algorithm for tiny
//! messages.
//!
//! Every rank `send`s its whole input to every other rank, all at once, and
//! reduces the `n` inputs itself, accumulating in its receive buffer in one
//! fixed order shared by every rank: rank `n-1`'s input first, then each
//! lower rank's joins in turn (`x0 op (x1 op (... op x(n-1)))`):
//!
//! * the accumulator starts as rank `n-1`'s input (`recv`, or a `copy` on
//!   rank `n-1` itself);
//! * for `j = n-2, ..., 1`, rank `j`'s input joins: `recvReduceCopyPartial`
//!   from `j`, or `reduceCopyPartial` of the own input on rank `j`;
//! * rank 0's input joins last and the result is final: `recvReduceCopy`
//!   from 0, or `reduceCopy` on rank 0.
//!
//! Every rank performs the same operations on the same values in the same
//! order (each step combines one input with the accumulator), so the
//! results are bitwise identical everywhere. One message latency, `n - 1`
//! times the data sent per rank: for small counts only.
//!
//! The sends of a chunk share a step with the chunk's first accumulation;
//! larger counts are pipelined in chunks of `chunk_elems`, and channels
//! split the elements as usual.
//!
//! **Not in place**: in place the accumulator would overwrite the own
//! input before its turn comes (a rank in the middle must hold both its
//! input and the running sum of the higher ranks, and in place there is
//! memory for only one of them), so [`OneShot`] refuses the in-place form.

use crate::pieces::{chunks, Steps};
use crate::{
    split_even, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Topology,
};

/// One-shot all-pairs AllReduce (out of place only).
#[derive(Clone, Copy, Debug, Default)]
pub struct OneShot;

impl Algorithm for OneShot {
    fn name(&self) -> &'static str {
        "oneshot"
    }

    fn supports(&self, kind: CollKind) -> bool {
        kind == CollKind::AllReduce
    }

    fn supports_in_place(&self, _kind: CollKind) -> bool {
        false
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, _topo: &Topology) -> Schedule {
        assert!(
            self.supports(spec.kind),
            "oneshot does not implement {}",
            spec.kind.name()
        );
        let nchannels = params.nchannels.max(1);
        let chunk = params.chunk_elems.max(1);
        let n = spec.nranks;
        let mut schedule = Schedule::new(nchannels);
        for (steps, (offset, len)) in schedule
            .channels
            .iter_mut()
            .zip(split_even(spec.count, nchannels))
        {
            let mut out = Steps::default();
            for (o, l) in chunks(offset, len, chunk) {
                let (input, acc) = (Slice::send(o, l), Slice::recv(o, l));
                // Send the input to every peer, starting with the next rank
                // so that the ranks load different links.
                let mut first: Vec<Prim> = (1..n)
                    .map(|k| Prim::Send {
                        to: (rank + k) % n,
                        src: input,
                    })
                    .collect();
                // The accumulator starts as rank n-1's input.
                let last = n - 1;
                first.push(if rank == last {
                    Prim::Copy {
                        src: input,
                        dst: acc,
                    }
                } else {
                    Prim::Recv {
                        from: last,
                        dst: acc,
                    }
                });
                out.step(first);
                // Ranks n-2, ..., 0 join in turn; rank 0's finishes.
                for j in (0..last).rev() {
                    let prim = match (j == rank, j == 0) {
                        (false, false) => Prim::RecvReduceCopyPartial {
                            from: j,
                            src: acc,
                            dst: acc,
                        },
                        (false, true) => Prim::RecvReduceCopy {
                            from: j,
                            src: acc,
                            dst: acc,
                        },
                        (true, false) => Prim::ReduceCopyPartial {
                            src: input,
                            dst: acc,
                        },
                        (true, true) => Prim::ReduceCopy {
                            src: input,
                            dst: acc,
                        },
                    };
                    out.one(prim);
                }
            }
            *steps = out.steps;
        }
        schedule
    }
}
