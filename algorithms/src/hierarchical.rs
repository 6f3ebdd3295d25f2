//! Hierarchical collectives: rings inside each host, and rings across hosts
//! between the ranks with the same local index (one ring per "rail").
//!
//! Every host must hold the same number of ranks `m`; with `h` hosts, the
//! rank with local index `i` on host `a` is written `(a, i)`. Each channel
//! runs the algorithm on its part of the elements, pipelined in chunks of at
//! most `chunk_elems`.
//!
//! * **AllReduce**: the channel's part is cut into `m` blocks.
//!   1. *Reduce-scatter inside the host* (ring over the host's ranks):
//!      `(a, i)` ends with the host's partial of block `i` in its receive
//!      buffer (`recvReduceCopyPartial`; `recvReduceCopy` with one host).
//!   2. *All-reduce across hosts* (ring over rail `i`) of block `i`,
//!      starting from those partials: the result is final.
//!   3. *All-gather inside the host* (ring over the host's ranks) of the
//!      `m` blocks.
//! * **AllGather**: 1. all-gather across hosts (ring over rail `i`): `(a, i)`
//!   collects the blocks of every `(b, i)`; 2. all-gather inside the host:
//!   each rank passes its rail's `h` blocks around the host's ring.
//! * **ReduceScatter**: the rail's ring reduce-scatter, whose contribution
//!   for host `b` at step `t` (`b = a - 1 - t`) is first made by a
//!   reduce-scatter inside the host: `(a, i)` accumulates the host's partial
//!   of the block of `(b, i)` in its receive buffer, which then travels the
//!   rail ring (`send`, `recvReduceSend`, and `recvReduceCopy` at `(b, i)`).
//!   The receive buffer serves as the staging area, so (with several ranks
//!   per host and several hosts) this is out of place only.
//!
//! With one host these are ring algorithms over the host; with one rank per
//! host, ring algorithms over the rail. Results are computed once per
//! element and copied, so every rank holds the same bits.

use crate::pieces::{chunks, local_only, Steps};
use crate::{
    split_even, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Topology,
};

/// Hierarchical AllReduce, AllGather and ReduceScatter over hosts of equal
/// size.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hierarchical;

impl Algorithm for Hierarchical {
    fn name(&self) -> &'static str {
        "hier"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter
        )
    }

    fn supports_topology(&self, topo: &Topology) -> bool {
        topo.ranks_per_host().is_some()
    }

    fn supports_in_place(&self, kind: CollKind) -> bool {
        kind != CollKind::ReduceScatter
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, topo: &Topology) -> Schedule {
        assert!(
            self.supports(spec.kind),
            "hier does not implement {}",
            spec.kind.name()
        );
        assert!(
            self.supports_topology(topo) && topo.nranks() == spec.nranks,
            "hier needs the same number of ranks on every host"
        );
        let nchannels = params.nchannels.max(1);
        let chunk = params.chunk_elems.max(1);
        if let Some(schedule) = local_only(spec, nchannels) {
            return schedule;
        }
        let mut schedule = Schedule::new(nchannels);
        let host = topo.host_of(rank);
        let local = topo.local_index(rank);
        let host_ring = RingOf::new(topo.local_ranks(host).to_vec(), local);
        let rail_ring = RingOf::new(topo.rail(local), host);
        for (steps, (offset, len)) in schedule
            .channels
            .iter_mut()
            .zip(split_even(spec.count, nchannels))
        {
            let mut out = Steps::default();
            let ctx = Ctx {
                out: &mut out,
                chunk,
                count: spec.count,
                topo,
                host: &host_ring,
                rail: &rail_ring,
            };
            match spec.kind {
                CollKind::AllReduce => all_reduce(ctx, offset, len),
                CollKind::AllGather => all_gather(ctx, offset, len),
                CollKind::ReduceScatter => reduce_scatter(ctx, offset, len),
                _ => unreachable!(),
            }
            *steps = out.steps;
        }
        schedule
    }
}

/// A ring over some ranks, seen from one of them.
struct RingOf {
    members: Vec<Rank>,
    me: usize,
}

impl RingOf {
    fn new(members: Vec<Rank>, me: usize) -> RingOf {
        RingOf { members, me }
    }

    fn len(&self) -> usize {
        self.members.len()
    }

    fn next(&self) -> Rank {
        self.members[(self.me + 1) % self.len()]
    }

    fn prev(&self) -> Rank {
        self.members[(self.me + self.len() - 1) % self.len()]
    }

    /// Position `me - k` (mod the ring's size), for `k` up to twice it.
    fn back(&self, k: usize) -> usize {
        (self.me + 2 * self.len() - k) % self.len()
    }
}

struct Ctx<'a> {
    out: &'a mut Steps,
    chunk: usize,
    count: usize,
    topo: &'a Topology,
    host: &'a RingOf,
    rail: &'a RingOf,
}

/// Whether a reduction's result is final or partial.
fn reduce_into(from: Rank, src: Slice, dst: Slice, last: bool) -> Prim {
    if last {
        Prim::RecvReduceCopy { from, src, dst }
    } else {
        Prim::RecvReduceCopyPartial { from, src, dst }
    }
}

fn all_reduce(ctx: Ctx, offset: usize, len: usize) {
    let Ctx {
        out,
        chunk,
        host,
        rail,
        ..
    } = ctx;
    let (m, h) = (host.len(), rail.len());
    let blocks: Vec<(usize, usize)> = split_even(len, m).map(|(o, l)| (offset + o, l)).collect();
    let longest = blocks.iter().map(|b| b.1).max().unwrap_or(0);
    // The part of block b at chunk position c.
    let piece = |b: usize, c: usize| {
        let (o, l) = blocks[b];
        let start = c.min(l);
        (o + start, chunk.min(l - start))
    };

    // 1. Reduce-scatter inside the host: ring order, own block last.
    if m > 1 {
        for c in (0..longest).step_by(chunk) {
            let k = host.back(1);
            let (o, l) = piece(k, c);
            out.one(Prim::Send {
                to: host.next(),
                src: Slice::send(o, l),
            });
            for t in 1..m - 1 {
                let (o, l) = piece(host.back(1 + t), c);
                out.one(Prim::RecvReduceSend {
                    from: host.prev(),
                    src: Slice::send(o, l),
                    to: host.next(),
                });
            }
            let (o, l) = piece(host.me, c);
            out.one(reduce_into(
                host.prev(),
                Slice::send(o, l),
                Slice::recv(o, l),
                h == 1,
            ));
        }
    }

    // 2. All-reduce of the own block across hosts (a ring over the rail).
    if h > 1 {
        let (o, l) = blocks[host.me];
        let src: fn(usize, usize) -> Slice = if m > 1 { Slice::recv } else { Slice::send };
        ring_all_reduce(out, rail, src, o, l, chunk);
    }

    // 3. All-gather inside the host.
    if m > 1 {
        for c in (0..longest).step_by(chunk) {
            let (o, l) = piece(host.me, c);
            out.one(Prim::Send {
                to: host.next(),
                src: Slice::recv(o, l),
            });
            for t in 1..m - 1 {
                let (o, l) = piece(host.back(t), c);
                out.one(Prim::RecvCopySend {
                    from: host.prev(),
                    dst: Slice::recv(o, l),
                    to: host.next(),
                });
            }
            let (o, l) = piece(host.back(m - 1), c);
            out.one(Prim::Recv {
                from: host.prev(),
                dst: Slice::recv(o, l),
            });
        }
    }
}

/// NCCL's ring all-reduce of `[offset, offset + len)` over `ring`, reading
/// the rank's contribution through `src`.
fn ring_all_reduce(
    out: &mut Steps,
    ring: &RingOf,
    src: fn(usize, usize) -> Slice,
    offset: usize,
    len: usize,
    chunk: usize,
) {
    let n = ring.len();
    let (next, prev) = (ring.next(), ring.prev());
    for base in (0..len).step_by(n * chunk) {
        let remaining = len - base;
        let real_chunk = chunk.min(remaining.div_ceil(n));
        let part = |k: usize| {
            let start = (k * real_chunk).min(remaining);
            let end = ((k + 1) * real_chunk).min(remaining);
            (offset + base + start, end - start)
        };
        let contrib = |k: usize| {
            let (o, l) = part(k);
            src(o, l)
        };
        let recv = |k: usize| {
            let (o, l) = part(k);
            Slice::recv(o, l)
        };
        out.one(Prim::Send {
            to: next,
            src: contrib(ring.back(1)),
        });
        for t in 1..n - 1 {
            out.one(Prim::RecvReduceSend {
                from: prev,
                src: contrib(ring.back(1 + t)),
                to: next,
            });
        }
        out.one(Prim::RecvReduceCopySend {
            from: prev,
            src: contrib(ring.me),
            dst: recv(ring.me),
            to: next,
        });
        for t in n..2 * n - 2 {
            out.one(Prim::RecvCopySend {
                from: prev,
                dst: recv(ring.back(1 + t)),
                to: next,
            });
        }
        out.one(Prim::Recv {
            from: prev,
            dst: recv(ring.back(2 * n - 1)),
        });
    }
}

fn all_gather(ctx: Ctx, offset: usize, len: usize) {
    let Ctx {
        out,
        chunk,
        count,
        topo,
        host,
        rail,
    } = ctx;
    let (m, h) = (host.len(), rail.len());
    let me = rail.members[rail.me];
    for (o, l) in chunks(offset, len, chunk) {
        // Block of rank q in the receive buffer.
        let block = |q: Rank| Slice::recv(q * count + o, l);
        let own = Slice::send(o, l);

        // 1. All-gather across hosts, over the rail.
        if h > 1 {
            out.one(Prim::CopySend {
                src: own,
                dst: block(me),
                to: rail.next(),
            });
            for t in 1..h - 1 {
                out.one(Prim::RecvCopySend {
                    from: rail.prev(),
                    dst: block(rail.members[rail.back(t)]),
                    to: rail.next(),
                });
            }
            out.one(Prim::Recv {
                from: rail.prev(),
                dst: block(rail.members[rail.back(h - 1)]),
            });
        }

        // 2. All-gather inside the host: each rank passes on its rail's
        //    blocks, one per host.
        if m > 1 {
            // The rail of host position j holds the blocks of these ranks.
            let rail_of = |j: usize| topo.rail(j);
            for (b, &q) in rail_of(host.me).iter().enumerate() {
                out.one(if h > 1 {
                    Prim::Send {
                        to: host.next(),
                        src: block(q),
                    }
                } else {
                    Prim::CopySend {
                        src: own,
                        dst: block(q),
                        to: host.next(),
                    }
                });
                for t in 1..m - 1 {
                    out.one(Prim::RecvCopySend {
                        from: host.prev(),
                        dst: block(rail_of(host.back(t))[b]),
                        to: host.next(),
                    });
                }
                out.one(Prim::Recv {
                    from: host.prev(),
                    dst: block(rail_of(host.back(m - 1))[b]),
                });
            }
        }
    }
}

fn reduce_scatter(ctx: Ctx, offset: usize, len: usize) {
    let Ctx {
        out,
        chunk,
        count,
        topo,
        host,
        rail,
    } = ctx;
    let (m, h) = (host.len(), rail.len());
    for (o, l) in chunks(offset, len, chunk) {
        // Block of rank q in the send buffer, at this piece.
        let block = |q: Rank| Slice::send(q * count + o, l);
        let stage = Slice::recv(o, l);
        for t in 0..h {
            // The host whose blocks this rail step carries.
            let b = rail.back(1 + t);
            let targets = topo.local_ranks(b);
            let last = t == h - 1;
            // Stage the host's partial of the block of (b, me) (inside the
            // host: ring order, own target last).
            if m > 1 {
                out.one(Prim::Send {
                    to: host.next(),
                    src: block(targets[host.back(1)]),
                });
                for s in 1..m - 1 {
                    out.one(Prim::RecvReduceSend {
                        from: host.prev(),
                        src: block(targets[host.back(1 + s)]),
                        to: host.next(),
                    });
                }
                out.one(reduce_into(
                    host.prev(),
                    block(targets[host.me]),
                    stage,
                    h == 1,
                ));
            }
            if h == 1 {
                continue;
            }
            let contrib = if m > 1 {
                stage
            } else {
                block(targets[host.me])
            };
            out.one(match t {
                0 => Prim::Send {
                    to: rail.next(),
                    src: contrib,
                },
                _ if last => Prim::RecvReduceCopy {
                    from: rail.prev(),
                    src: contrib,
                    dst: stage,
                },
                _ => Prim::RecvReduceSend {
                    from: rail.prev(),
                    src: contrib,
                    to: rail.next(),
                },
            });
        }
    }
}
