//! The ring algorithm, as in NCCL.
//!
//! Within one host, ranks form the ring `0 -> 1 -> ... -> n-1 -> 0`. Across
//! hosts, each channel has its own ring ([`Topology::ring_order`], NCCL's
//! rail-aligned rings): the hosts in order, each entered once and left
//! once, the ranks of a host rotated by the channel, so the ranks that
//! send and receive across hosts differ from channel to channel. Every
//! rank sends to the next rank of its channel's ring and receives from
//! the previous one.
//! The elements are split across channels (each channel a contiguous part,
//! see [`split_even`]); within a channel the work is pipelined in chunks of at
//! most `params.chunk_elems` elements, one message per chunk.
//!
//! * **AllReduce**: each loop covers up to `n * chunk` elements, cut into `n`
//!   chunks. Rank `r` handles chunk `(r - 1 - t) mod n` at step `t`:
//!   `send`, then `n - 2` x `recvReduceSend`, then `recvReduceCopySend`
//!   (chunk `r`, whose result is now final), `n - 2` x `recvCopySend`, and a
//!   last `recv`. Every chunk is reduced in the same ring order on every
//!   rank, so all ranks end with bitwise-identical results.
//! * **Reduce**: a ring that ends at the root: `send`, `recvReduceSend`...,
//!   and the root's `recvReduceCopy`.
//! * **Broadcast**: a ring that starts at the root: the root's `copySend`,
//!   `recvCopySend`..., and a last `recv`.
//! * **AllGather**: `copySend` of the own block, `n - 2` x `recvCopySend`,
//!   `recv`.
//! * **ReduceScatter**: `send`, `n - 2` x `recvReduceSend`, and
//!   `recvReduceCopy` of the own block into the receive buffer.
//!
//! With one rank every collective is a single `copy` from the send buffer to
//! the receive buffer. Zero-length primitives are never emitted: every rank
//! computes the same lengths, so sender and receiver skip the same messages.

use crate::pieces::local_only;
use crate::{
    split_even, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Step, Topology,
};

/// NCCL's ring algorithm for AllReduce, Broadcast, Reduce, AllGather and
/// ReduceScatter.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ring;

impl Algorithm for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce
                | CollKind::Broadcast
                | CollKind::Reduce
                | CollKind::AllGather
                | CollKind::ReduceScatter
        )
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, topo: &Topology) -> Schedule {
        assert!(
            self.supports(spec.kind),
            "ring does not implement {}",
            spec.kind.name()
        );
        let nchannels = params.nchannels.max(1);
        let chunk = params.chunk_elems.max(1);
        if let Some(schedule) = local_only(spec, nchannels) {
            return schedule;
        }
        let mut schedule = Schedule::new(nchannels);
        for (channel, (steps, (offset, len))) in schedule
            .channels
            .iter_mut()
            .zip(split_even(spec.count, nchannels))
            .enumerate()
        {
            let ring = RingPos::new(topo.ring_order(channel), rank);
            let mut out = Steps(steps);
            match spec.kind {
                CollKind::AllReduce => all_reduce(&mut out, &ring, offset, len, chunk),
                CollKind::Broadcast => broadcast(&mut out, &ring, spec.root, offset, len, chunk),
                CollKind::Reduce => reduce(&mut out, &ring, spec.root, offset, len, chunk),
                CollKind::AllGather => all_gather(&mut out, &ring, spec.count, offset, len, chunk),
                CollKind::ReduceScatter => {
                    reduce_scatter(&mut out, &ring, spec.count, offset, len, chunk)
                }
                _ => unreachable!(),
            }
        }
        schedule
    }
}

/// A rank's place in the ring.
pub(crate) struct RingPos {
    pub(crate) n: usize,
    /// The ranks in ring order.
    order: Vec<Rank>,
    /// This rank's position in `order`.
    pub(crate) pos: usize,
    rank: Rank,
    pub(crate) next: Rank,
    pub(crate) prev: Rank,
}

impl RingPos {
    pub(crate) fn new(order: Vec<Rank>, rank: Rank) -> RingPos {
        let n = order.len();
        let pos = order
            .iter()
            .position(|&r| r == rank)
            .expect("every rank is on the ring");
        RingPos {
            n,
            next: order[(pos + 1) % n],
            prev: order[(pos + n - 1) % n],
            order,
            pos,
            rank,
        }
    }

    /// The position `k` places before this rank's, for `k` up to `2n`.
    pub(crate) fn back_pos(&self, k: usize) -> usize {
        (self.pos + 2 * self.n - k) % self.n
    }

    /// The rank `k` places before this one, for `k` up to `2n`.
    fn back(&self, k: usize) -> Rank {
        self.order[self.back_pos(k)]
    }

    /// This rank's position in a ring that starts at rank `first`.
    fn from(&self, first: Rank) -> usize {
        let at = self
            .order
            .iter()
            .position(|&r| r == first)
            .expect("every rank is on the ring");
        (self.pos + self.n - at) % self.n
    }
}

/// A channel's step list that drops zero-length primitives.
struct Steps<'a>(&'a mut Vec<Step>);

impl Steps<'_> {
    fn push(&mut self, prim: Prim) {
        if !prim.is_empty() {
            self.0.push(Step::one(prim));
        }
    }
}

/// Pipeline chunks `(offset, len)` of `[offset, offset + len)`.
fn chunks(offset: usize, len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(chunk)
        .map(move |i| (offset + i, chunk.min(len - i)))
}

fn all_reduce(out: &mut Steps, ring: &RingPos, offset: usize, len: usize, chunk: usize) {
    let n = ring.n;
    for base in (0..len).step_by(n * chunk) {
        let remaining = len - base;
        // As NCCL: the last loop shrinks its chunks to spread the remainder.
        let real_chunk = chunk.min(remaining.div_ceil(n));
        // The part of the loop's region that holds data chunk `k`.
        let part = |k: usize| {
            let start = (k * real_chunk).min(remaining);
            let end = ((k + 1) * real_chunk).min(remaining);
            (offset + base + start, end - start)
        };
        all_reduce_loop(out.0, ring, part);
    }
}

/// One pipeline loop of the ring AllReduce over the chunks `part(k)`
/// (`(offset, len)` in both buffers): the rank at position `p` handles
/// chunk `p - 1 - t` at step `t`, so chunk `k` is reduced along the ring
/// from position `k + 1` round to position `k`, which stores it and starts
/// the gather. Zero-length primitives are left out.
pub(crate) fn all_reduce_loop(
    steps: &mut Vec<Step>,
    ring: &RingPos,
    part: impl Fn(usize) -> (usize, usize),
) {
    let n = ring.n;
    let (next, prev) = (ring.next, ring.prev);
    let send = |k: usize| {
        let (o, l) = part(k);
        Slice::send(o, l)
    };
    let recv = |k: usize| {
        let (o, l) = part(k);
        Slice::recv(o, l)
    };
    let mut out = Steps(steps);
    // Reduce-scatter phase.
    out.push(Prim::Send {
        to: next,
        src: send(ring.back_pos(1)),
    });
    for t in 1..n - 1 {
        out.push(Prim::RecvReduceSend {
            from: prev,
            src: send(ring.back_pos(1 + t)),
            to: next,
        });
    }
    // Chunk p is now complete: store the final result and pass it on.
    out.push(Prim::RecvReduceCopySend {
        from: prev,
        src: send(ring.pos),
        dst: recv(ring.pos),
        to: next,
    });
    // All-gather phase.
    for t in n..2 * n - 2 {
        out.push(Prim::RecvCopySend {
            from: prev,
            dst: recv(ring.back_pos(1 + t)),
            to: next,
        });
    }
    out.push(Prim::Recv {
        from: prev,
        dst: recv(ring.back_pos(2 * n - 1)),
    });
}

fn broadcast(out: &mut Steps, ring: &RingPos, root: Rank, offset: usize, len: usize, chunk: usize) {
    let pos = ring.from(root);
    let (next, prev) = (ring.next, ring.prev);
    for (o, l) in chunks(offset, len, chunk) {
        let prim = if pos == 0 {
            Prim::CopySend {
                src: Slice::send(o, l),
                dst: Slice::recv(o, l),
                to: next,
            }
        } else if pos == ring.n - 1 {
            Prim::Recv {
                from: prev,
                dst: Slice::recv(o, l),
            }
        } else {
            Prim::RecvCopySend {
                from: prev,
                dst: Slice::recv(o, l),
                to: next,
            }
        };
        out.push(prim);
    }
}

fn reduce(out: &mut Steps, ring: &RingPos, root: Rank, offset: usize, len: usize, chunk: usize) {
    // The ring starts right after the root and ends at it.
    let pos = (ring.from(root) + ring.n - 1) % ring.n;
    let (next, prev) = (ring.next, ring.prev);
    for (o, l) in chunks(offset, len, chunk) {
        let src = Slice::send(o, l);
        let prim = if pos == 0 {
            Prim::Send { to: next, src }
        } else if pos == ring.n - 1 {
            Prim::RecvReduceCopy {
                from: prev,
                src,
                dst: Slice::recv(o, l),
            }
        } else {
            Prim::RecvReduceSend {
                from: prev,
                src,
                to: next,
            }
        };
        out.push(prim);
    }
}

fn all_gather(
    out: &mut Steps,
    ring: &RingPos,
    count: usize,
    offset: usize,
    len: usize,
    chunk: usize,
) {
    let n = ring.n;
    let (next, prev) = (ring.next, ring.prev);
    for (o, l) in chunks(offset, len, chunk) {
        // Block b of the receive buffer holds rank b's contribution.
        let block = |b: usize| Slice::recv(b * count + o, l);
        out.push(Prim::CopySend {
            src: Slice::send(o, l),
            dst: block(ring.rank),
            to: next,
        });
        for t in 1..n - 1 {
            out.push(Prim::RecvCopySend {
                from: prev,
                dst: block(ring.back(t)),
                to: next,
            });
        }
        out.push(Prim::Recv {
            from: prev,
            dst: block(ring.back(n - 1)),
        });
    }
}

fn reduce_scatter(
    out: &mut Steps,
    ring: &RingPos,
    count: usize,
    offset: usize,
    len: usize,
    chunk: usize,
) {
    let n = ring.n;
    let (next, prev) = (ring.next, ring.prev);
    for (o, l) in chunks(offset, len, chunk) {
        // Block b of the send buffer is destined for rank b.
        let block = |b: usize| Slice::send(b * count + o, l);
        out.push(Prim::Send {
            to: next,
            src: block(ring.back(1)),
        });
        for t in 1..n - 1 {
            out.push(Prim::RecvReduceSend {
                from: prev,
                src: block(ring.back(1 + t)),
                to: next,
            });
        }
        out.push(Prim::RecvReduceCopy {
            from: prev,
            src: block(ring.rank),
            dst: Slice::recv(o, l),
        });
    }
}
