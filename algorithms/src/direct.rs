//! The direct algorithm: every rank talks to its peers directly, all at once.
//!
//! Each channel runs one step whose primitives progress concurrently:
//!
//! * **AlltoAll**: a `copy` of the own block, a `send` to every other peer and
//!   a `recv` from every other peer. Rank `r` lists its peers as `r + k`
//!   (sends) and `r - k` (receives), `k = 1..n`, so that at any moment the
//!   ranks load different links.
//! * **Gather**: the root copies its own block and receives every other
//!   rank's; the other ranks send theirs.
//! * **Scatter**: the reverse of Gather.
//!
//! Channel `c` handles the same contiguous sub-range of every block, and each
//! block's sub-range is cut into messages of at most `params.chunk_elems`
//! elements, listed in order (primitives sharing a peer move in listed
//! order).
//!
//! [`p2p_schedule`] builds the same kind of schedule for a group of user
//! point-to-point calls.

use crate::{
    split_even, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Step, Topology,
};

/// Direct sends and receives between every pair of ranks, for AlltoAll,
/// Gather and Scatter.
#[derive(Clone, Copy, Debug, Default)]
pub struct Direct;

impl Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllToAll | CollKind::Gather | CollKind::Scatter
        )
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, _topo: &Topology) -> Schedule {
        assert!(
            self.supports(spec.kind),
            "direct does not implement {}",
            spec.kind.name()
        );
        let nchannels = params.nchannels.max(1);
        let chunk = params.chunk_elems.max(1);
        let (n, count, root) = (spec.nranks, spec.count, spec.root);
        let mut schedule = Schedule::new(nchannels);
        for (steps, (offset, len)) in schedule
            .channels
            .iter_mut()
            .zip(split_even(count, nchannels))
        {
            let mut step = Prims::new(chunk);
            // This channel's part of block b.
            let block = |b: usize| (b * count + offset, len);
            let own = (offset, len);
            match spec.kind {
                CollKind::AllToAll => {
                    step.copy(
                        Slice::send(block(rank).0, len),
                        Slice::recv(block(rank).0, len),
                    );
                    for k in 1..n {
                        let to = (rank + k) % n;
                        step.send(to, Slice::send, block(to));
                        let from = (rank + n - k) % n;
                        step.recv(from, Slice::recv, block(from));
                    }
                }
                CollKind::Gather if rank == root => {
                    step.copy(Slice::send(offset, len), Slice::recv(block(root).0, len));
                    for k in 1..n {
                        let from = (root + k) % n;
                        step.recv(from, Slice::recv, block(from));
                    }
                }
                CollKind::Gather => step.send(root, Slice::send, own),
                CollKind::Scatter if rank == root => {
                    step.copy(Slice::send(block(root).0, len), Slice::recv(offset, len));
                    for k in 1..n {
                        let to = (root + k) % n;
                        step.send(to, Slice::send, block(to));
                    }
                }
                CollKind::Scatter => step.recv(root, Slice::recv, own),
                _ => unreachable!(),
            }
            step.finish(steps);
        }
        schedule
    }
}

/// The primitives of one concurrent step, cut into pipeline messages.
struct Prims {
    chunk: usize,
    prims: Vec<Prim>,
}

impl Prims {
    fn new(chunk: usize) -> Prims {
        Prims {
            chunk,
            prims: Vec::new(),
        }
    }

    fn copy(&mut self, src: Slice, dst: Slice) {
        if src.len > 0 {
            self.prims.push(Prim::Copy { src, dst });
        }
    }

    /// Send `(offset, len)` of a buffer to `to`, one message per chunk.
    fn send(&mut self, to: Rank, buf: fn(usize, usize) -> Slice, (offset, len): (usize, usize)) {
        for (o, l) in chunks(offset, len, self.chunk) {
            self.prims.push(Prim::Send { to, src: buf(o, l) });
        }
    }

    /// Receive into `(offset, len)` of a buffer from `from`, one message per
    /// chunk.
    fn recv(&mut self, from: Rank, buf: fn(usize, usize) -> Slice, (offset, len): (usize, usize)) {
        for (o, l) in chunks(offset, len, self.chunk) {
            self.prims.push(Prim::Recv {
                from,
                dst: buf(o, l),
            });
        }
    }

    fn finish(self, steps: &mut Vec<Step>) {
        if !self.prims.is_empty() {
            steps.push(Step { prims: self.prims });
        }
    }
}

/// Pipeline chunks `(offset, len)` of `[offset, offset + len)`.
fn chunks(offset: usize, len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(chunk)
        .map(move |i| (offset + i, chunk.min(len - i)))
}

/// One user point-to-point call of a group (`ncclSend` / `ncclRecv`), in
/// elements of the call's datatype.
///
/// The schedule built by [`p2p_schedule`] models the group's buffers as
/// the two user buffers of a collective: every `Send` reads the
/// [`Buf::Send`](crate::Buf::Send) buffer at `offset`, every `Recv` writes
/// the [`Buf::Recv`](crate::Buf::Recv) buffer at `offset` (the engine maps
/// each call to its own base address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum P2pOp {
    /// Send `len` elements starting at `offset` to `peer`.
    Send {
        peer: Rank,
        offset: usize,
        len: usize,
    },
    /// Receive `len` elements from `peer` into `offset`.
    Recv {
        peer: Rank,
        offset: usize,
        len: usize,
    },
}

impl P2pOp {
    /// The call's length (`len`).
    pub fn length(&self) -> usize {
        match *self {
            P2pOp::Send { len, .. } | P2pOp::Recv { len, .. } => len,
        }
    }

    /// The rank the call sends to or receives from.
    pub fn peer(&self) -> Rank {
        match *self {
            P2pOp::Send { peer, .. } | P2pOp::Recv { peer, .. } => peer,
        }
    }
}

/// Why `rank`'s sends to itself do not pair with its receives from itself
/// (the `i`-th of each must have the same length, which [`p2p_schedule`]
/// needs to turn them into copies), or `None` when they do.
pub fn unpaired_self_calls(rank: Rank, calls: &[P2pOp]) -> Option<String> {
    let own = |sending: bool| -> Vec<usize> {
        calls
            .iter()
            .filter(|c| c.peer() == rank && matches!(c, P2pOp::Send { .. }) == sending)
            .map(P2pOp::length)
            .collect()
    };
    let (sends, recvs) = (own(true), own(false));
    (sends != recvs).then(|| {
        format!(
            "sends to itself (lengths {sends:?}) do not match its receives from itself (lengths \
             {recvs:?})"
        )
    })
}

/// The schedule of `rank` for a group of point-to-point calls.
///
/// Everything runs in one concurrent step per channel. Every call is split
/// across the channels (channel `c` carries the same part of it on both
/// sides) and cut into messages of at most `chunk_elems` elements; calls to
/// the same peer keep the user's order. The `i`-th send to `rank` itself
/// and the `i`-th receive from `rank` itself become one `copy`; the two
/// calls must have the same length (NCCL reports a mismatch as an error
/// before scheduling), the copy covers the shorter one. Self calls without a
/// partner stay a send / receive to `rank`, which
/// [`verify_schedules`](crate::verify::verify_schedules) rejects.
///
/// The calling rank is an argument because self calls can only be told
/// apart from calls to other peers by it.
pub fn p2p_schedule(rank: Rank, ops: &[P2pOp], nchannels: usize, chunk_elems: usize) -> Schedule {
    let nchannels = nchannels.max(1);
    let chunk = chunk_elems.max(1);

    // Pair self sends with self receives, in order.
    let self_sends = ops.iter().filter_map(|op| match *op {
        P2pOp::Send { peer, offset, len } if peer == rank => Some((offset, len)),
        _ => None,
    });
    let self_recvs = ops.iter().filter_map(|op| match *op {
        P2pOp::Recv { peer, offset, len } if peer == rank => Some((offset, len)),
        _ => None,
    });
    let copies: Vec<((usize, usize), (usize, usize))> = self_sends.zip(self_recvs).collect();
    let paired = copies.len();

    let mut schedule = Schedule::new(nchannels);
    for (c, steps) in schedule.channels.iter_mut().enumerate() {
        // Channel c's part of a call of `len` elements at `offset`.
        let part = |offset: usize, len: usize| {
            let (o, l) = split_even(len, nchannels).nth(c).unwrap_or((0, 0));
            (offset + o, l)
        };
        let mut step = Prims::new(chunk);
        for &((so, sl), (ro, rl)) in &copies {
            let len = sl.min(rl);
            let (s, l) = part(so, len);
            let (r, _) = part(ro, len);
            step.copy(Slice::send(s, l), Slice::recv(r, l));
        }
        let (mut self_sends, mut self_recvs) = (0, 0);
        for op in ops {
            match *op {
                P2pOp::Send { peer, offset, len } => {
                    if peer == rank {
                        self_sends += 1;
                        if self_sends <= paired {
                            continue;
                        }
                    }
                    step.send(peer, Slice::send, part(offset, len));
                }
                P2pOp::Recv { peer, offset, len } => {
                    if peer == rank {
                        self_recvs += 1;
                        if self_recvs <= paired {
                            continue;
                        }
                    }
                    step.recv(peer, Slice::recv, part(offset, len));
                }
            }
        }
        step.finish(steps);
    }
    schedule
}
