//! NCCL's double binary tree.
//!
//! **Across hosts** (more than one host in the [`Topology`]) the trees are
//! built as NCCL builds them, per channel: inside each host a chain of its
//! ranks ([`Topology::host_chain`], the channel's rotation, so the chain's
//! head is the rank where the channel's ring enters the host), and across
//! hosts the double binary tree below over the hosts, whose edges join the
//! chains' heads. Every edge that crosses hosts is on the channel's rail;
//! each rank but a head has its chain neighbours as parent and child, and
//! a head has the head of its parent host as parent and, as children, the
//! next rank of its chain and the heads of its child hosts. Depth is
//! `m - 1 + log2(hosts)` for `m` ranks per host, so small calls scale with
//! `log(hosts)`, not `hosts`. Within one host, the trees below over ranks.
//!
//! **The trees.** Tree 0 is NCCL's binary tree over ranks (`ncclGetBtree`):
//! rank 0 is the root with one child, the largest power of two below `n`;
//! a rank whose lowest set bit is `b` has children `rank - b/2` and
//! `rank + b/2` (the latter shrunk to stay below `n`). Tree 1 is tree 0
//! mirrored (`rank -> n - 1 - rank`) when `n` is even and shifted by one
//! (`rank -> rank + 1`) when `n` is odd (`ncclGetDtree`), so that most ranks
//! are a leaf in one tree and interior in the other.
//!
//! **AllReduce.** As NCCL duplicates its channels for the trees, each
//! channel runs one tree on all its elements ([`channel_trees`]): of
//! `2k` or `2k + 1` channels, channel `c < k` runs tree 0 and channel
//! `c + k` tree 1, so channels `c` and `c + k` (the same rail when `k` is
//! a multiple of the rails) carry one tree each, and a host interior in
//! one is a leaf in the other: every NIC carries the same bytes each way
//! as the ring's. A single channel, or the last of an odd count, splits
//! its elements in two halves, one per tree. Within a tree, pipelined in
//! chunks of at most `chunk_elems`:
//!
//! * *reduce up*, for each chunk: a leaf `send`s its input to its parent;
//!   a rank with one child does `recvReduceSend` (child's partial op own
//!   input, to the parent); a rank with two children first accumulates the
//!   first child's partial with its input in its receive buffer
//!   (`recvReduceCopyPartial`), then `recvReduceSend`s the second child's
//!   partial with that; the root ends with `recvReduceCopy`, the final
//!   result;
//! * *broadcast down*, for each chunk: the root `send`s the result to its
//!   children, interior ranks `recvCopySend` it to their first child (and
//!   `send` it to the second), leaves `recv` it.
//!
//! A channel that runs one tree overlaps the two phases as NCCL's
//! `runTreeSplit` does: a rank `d` hops below the root broadcasts chunk `j`
//! in the steps where it reduces chunk `j + 1 + 2d` (the result of chunk
//! `j` comes back down about two hops per level after the chunk went up),
//! one step holding a primitive of each phase, so the links carry both
//! directions at once and a step's fixed cost is paid once for both. The
//! lag grows down the tree, so a step never waits on a parent's step that
//! waits on this one. A channel that runs both trees runs the phases one
//! after the other, as NCCL's `runTreeUpDown`: reduce up tree 0, reduce up
//! tree 1, broadcast down tree 0, broadcast down tree 1; a phase depends
//! only on the same phase at other ranks and on earlier phases, so the
//! trees cannot deadlock each other. The result is computed once per
//! element, at a root, so every rank holds the same bits.
//!
//! **Broadcast**: one tree rooted at the call's root (tree 0 with ranks
//! renumbered from the root), pipelined the same way: the root
//! `copySend`s, interior ranks `recvCopySend` (and `send` to a second
//! child), leaves `recv`.
//!
//! (Reduce would need a scratch area at interior ranks with two children,
//! whose receive buffer is empty in NCCL's Reduce; ring serves it.)

use crate::pieces::{chunks, local_only, Steps};
use crate::{
    split_even, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Topology,
};

/// NCCL's double binary tree for AllReduce, and a pipelined binary tree for
/// Broadcast.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tree;

/// A rank's place in one tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The parent, `None` at the root.
    pub parent: Option<Rank>,
    /// The children, at most two, lower rank first in tree 0.
    pub children: Vec<Rank>,
}

/// NCCL's binary tree (`ncclGetBtree`) over `n` ranks rooted at 0: the
/// place of `rank`.
pub fn btree(n: usize, rank: Rank) -> Node {
    let mut bit = 1;
    while bit < n {
        if bit & rank != 0 {
            break;
        }
        bit <<= 1;
    }
    if rank == 0 {
        let children = if n > 1 { vec![bit >> 1] } else { vec![] };
        return Node {
            parent: None,
            children,
        };
    }
    let mut up = (rank ^ bit) | (bit << 1);
    if up >= n {
        up = rank ^ bit;
    }
    let mut children = Vec::new();
    let lowbit = bit >> 1;
    if lowbit > 0 {
        children.push(rank - lowbit);
        let mut low = lowbit;
        while low > 0 && rank + low >= n {
            low >>= 1;
        }
        if low > 0 {
            children.push(rank + low);
        }
    }
    Node {
        parent: Some(up),
        children,
    }
}

/// The place of `rank` in tree 0 and tree 1 of NCCL's double binary tree
/// (`ncclGetDtree`).
pub fn dtree(n: usize, rank: Rank) -> [Node; 2] {
    let t0 = btree(n, rank);
    let t1 = if n % 2 == 1 {
        // Shift: virtual rank v = rank - 1.
        renumber(n, rank, |r| (r + n - 1) % n, |v| (v + 1) % n)
    } else {
        // Mirror.
        renumber(n, rank, |r| n - 1 - r, |v| n - 1 - v)
    };
    [t0, t1]
}

/// The place of `rank` in tree `t` (0 or 1) of channel `channel` over
/// `topo`: over ranks within one host, chains joined by the double binary
/// tree over hosts across several (see the module documentation).
pub fn channel_tree(topo: &Topology, channel: usize, t: usize, rank: Rank) -> Node {
    if topo.nhosts() <= 1 {
        let [t0, t1] = dtree(topo.nranks(), rank);
        return if t == 0 { t0 } else { t1 };
    }
    let host = topo.host_of(rank);
    let chain = topo.host_chain(host, channel);
    let q = chain
        .iter()
        .position(|&r| r == rank)
        .expect("a rank is on its host's chain");
    let next_in_chain = chain.get(q + 1).copied();
    if q > 0 {
        return Node {
            parent: Some(chain[q - 1]),
            children: next_in_chain.into_iter().collect(),
        };
    }
    let head = |h: usize| topo.host_chain(h, channel)[0];
    let hosts = dtree(topo.nhosts(), host);
    let across = &hosts[t.min(1)];
    Node {
        parent: across.parent.map(head),
        children: next_in_chain
            .into_iter()
            .chain(across.children.iter().map(|&h| head(h)))
            .collect(),
    }
}

/// The trees channel `channel` of `nchannels` runs an AllReduce on, as
/// NCCL pairs its duplicated channels: of `2k` or `2k + 1` channels,
/// tree 0 on channels `0..k`, tree 1 on `k..2k`, both (each on half the
/// channel's elements) on a single or last odd channel.
pub fn channel_trees(nchannels: usize, channel: usize) -> &'static [usize] {
    let k = nchannels / 2;
    if channel < k {
        &[0]
    } else if channel < 2 * k {
        &[1]
    } else {
        &[0, 1]
    }
}

/// The binary tree over virtual ranks `to_virtual(r)`, seen from `rank`.
fn renumber(
    n: usize,
    rank: Rank,
    to_virtual: impl Fn(Rank) -> Rank,
    to_real: impl Fn(Rank) -> Rank,
) -> Node {
    let v = btree(n, to_virtual(rank));
    Node {
        parent: v.parent.map(&to_real),
        children: v.children.into_iter().map(&to_real).collect(),
    }
}

impl Algorithm for Tree {
    fn name(&self) -> &'static str {
        "tree"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(kind, CollKind::AllReduce | CollKind::Broadcast)
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, topo: &Topology) -> Schedule {
        assert!(
            self.supports(spec.kind),
            "tree does not implement {}",
            spec.kind.name()
        );
        let nchannels = params.nchannels.max(1);
        let chunk = params.chunk_elems.max(1);
        let n = spec.nranks;
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
            let mut out = Steps::default();
            match spec.kind {
                CollKind::AllReduce => {
                    let trees = channel_trees(nchannels, channel);
                    let parts: Vec<(Node, (usize, usize))> = trees
                        .iter()
                        .map(|&t| channel_tree(topo, channel, t, rank))
                        .zip(split_even(len, trees.len()))
                        .collect();
                    if let [(node, _)] = parts.as_slice() {
                        let t = trees[0];
                        let lag = 1 + 2 * depth(|r| channel_tree(topo, channel, t, r), rank);
                        let up = reduce_up(node, offset, len, chunk);
                        let down = broadcast_down(node, offset, len, chunk);
                        for g in 0..up.len() + lag {
                            let u = up.get(g).map_or(&[][..], Vec::as_slice);
                            let d = g
                                .checked_sub(lag)
                                .and_then(|j| down.get(j))
                                .map_or(&[][..], Vec::as_slice);
                            for i in 0..u.len().max(d.len()) {
                                let prims = u.get(i).into_iter().chain(d.get(i)).flatten();
                                out.step(prims.cloned().collect());
                            }
                        }
                    } else {
                        // Reduce up every tree, then broadcast down each.
                        for (node, (o, l)) in &parts {
                            for step in reduce_up(node, offset + o, *l, chunk).concat() {
                                out.step(step);
                            }
                        }
                        for (node, (o, l)) in &parts {
                            for step in broadcast_down(node, offset + o, *l, chunk).concat() {
                                out.step(step);
                            }
                        }
                    }
                }
                CollKind::Broadcast => {
                    let node = renumber(
                        n,
                        rank,
                        |r| (r + n - spec.root) % n,
                        |v| (v + spec.root) % n,
                    );
                    for (o, l) in chunks(offset, len, chunk) {
                        let (send, recv) = (Slice::send(o, l), Slice::recv(o, l));
                        let first = node.children.first().copied();
                        match (node.parent, first) {
                            (None, Some(c)) => out.one(Prim::CopySend {
                                src: send,
                                dst: recv,
                                to: c,
                            }),
                            (None, None) => out.one(Prim::Copy {
                                src: send,
                                dst: recv,
                            }),
                            (Some(p), Some(c)) => out.one(Prim::RecvCopySend {
                                from: p,
                                dst: recv,
                                to: c,
                            }),
                            (Some(p), None) => out.one(Prim::Recv { from: p, dst: recv }),
                        }
                        for &c in node.children.iter().skip(1) {
                            out.one(Prim::Send { to: c, src: recv });
                        }
                    }
                }
                _ => unreachable!(),
            }
            *steps = out.steps;
        }
        schedule
    }
}

/// Hops from `rank` to the root of the tree whose nodes `node_of` gives.
fn depth(node_of: impl Fn(Rank) -> Node, mut rank: Rank) -> usize {
    let mut hops = 0;
    while let Some(parent) = node_of(rank).parent {
        rank = parent;
        hops += 1;
    }
    hops
}

/// The steps of one pipeline chunk.
type ChunkSteps = Vec<Vec<Prim>>;

/// The reduce-up steps of one tree over `[offset, offset + len)`, chunk by
/// chunk: the first child's partial is combined with the rank's input
/// into its receive buffer, each further child's into that, and the last
/// child's goes on to the parent (or, at the root, is the result).
fn reduce_up(node: &Node, offset: usize, len: usize, chunk: usize) -> Vec<ChunkSteps> {
    let mut all = Vec::new();
    for (o, l) in chunks(offset, len, chunk) {
        let mut steps = Vec::new();
        let (send, recv) = (Slice::send(o, l), Slice::recv(o, l));
        let Some((&last, firsts)) = node.children.split_last() else {
            let p = node.parent.expect("a tree over more than one rank");
            all.push(vec![vec![Prim::Send { to: p, src: send }]]);
            continue;
        };
        let mut acc = send;
        for &c in firsts {
            steps.push(vec![Prim::RecvReduceCopyPartial {
                from: c,
                src: acc,
                dst: recv,
            }]);
            acc = recv;
        }
        steps.push(vec![match node.parent {
            Some(p) => Prim::RecvReduceSend {
                from: last,
                src: acc,
                to: p,
            },
            None => Prim::RecvReduceCopy {
                from: last,
                src: acc,
                dst: recv,
            },
        }]);
        all.push(steps);
    }
    all
}

/// The broadcast-down steps of one tree over `[offset, offset + len)`,
/// chunk by chunk: the result goes on to the first child as it arrives,
/// then to the others at once.
fn broadcast_down(node: &Node, offset: usize, len: usize, chunk: usize) -> Vec<ChunkSteps> {
    let mut all = Vec::new();
    for (o, l) in chunks(offset, len, chunk) {
        let mut steps = Vec::new();
        let recv = Slice::recv(o, l);
        match (node.parent, node.children.as_slice()) {
            (None, children) => steps.push(
                children
                    .iter()
                    .map(|&c| Prim::Send { to: c, src: recv })
                    .collect(),
            ),
            (Some(p), []) => steps.push(vec![Prim::Recv { from: p, dst: recv }]),
            (Some(p), &[c, ref rest @ ..]) => {
                steps.push(vec![Prim::RecvCopySend {
                    from: p,
                    dst: recv,
                    to: c,
                }]);
                if !rest.is_empty() {
                    steps.push(
                        rest.iter()
                            .map(|&c| Prim::Send { to: c, src: recv })
                            .collect(),
                    );
                }
            }
        }
        all.push(steps);
    }
    all
}
