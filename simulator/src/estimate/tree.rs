//! The tree's forms: all-reduce over a chain of each host's ranks under
//! a binary tree of hosts (both trees on one channel, or one tree per
//! channel), broadcast down a binary tree of ranks from the root.

use rccl_algorithms::CollKind;

use super::Call;

pub(super) fn time(call: &Call) -> Option<f64> {
    Some(match call.spec.kind {
        CollKind::AllReduce => all_reduce(call),
        CollKind::Broadcast => broadcast(call),
        _ => return None,
    })
}

fn all_reduce(call: &Call) -> f64 {
    let shape = Shape::of(call);
    if call.f.channels < 2.0 && call.f.hosts > 1.0 {
        both_trees_across_hosts(call, &shape)
    } else if call.f.channels < 2.0 {
        both_trees_in_a_host(call, &shape)
    } else {
        tree_per_channel(call, &shape)
    }
}

/// The all-reduce trees' shape: depths, the busiest rank's children and
/// the bytes a host's NICs carry.
struct Shape {
    /// Levels of the tree of hosts, of a host's chain (of the tree of
    /// ranks within one host), both, and the share crossing hosts.
    across_depth: f64,
    chain_depth: f64,
    depth: f64,
    across: f64,
    /// What a host's NICs carry for the call.
    nic_bytes: f64,
    /// A head's children on other hosts, and the busiest rank's children.
    host_children: f64,
    children: f64,
    /// The busiest rank's rate over a chunk, reduced and copied once per
    /// child.
    rate: f64,
}

impl Shape {
    fn of(call: &Call) -> Shape {
        let Call {
            ref f,
            n,
            per_channel,
            ..
        } = *call;
        // A chain of each host's ranks under a binary tree of hosts
        // (one binary tree of ranks within a host).
        let across_depth = if f.hosts > 1.0 {
            f.hosts.log2().ceil()
        } else {
            0.0
        };
        let chain_depth = if f.hosts > 1.0 {
            f.local - 1.0
        } else {
            n.log2().ceil()
        };
        let depth = across_depth + chain_depth;
        let across = across_depth / depth;
        // A host's head takes in and sends out a channel's bytes once
        // per edge of the tree of hosts at it: its parent and up to
        // two children (two from 4 hosts on, one on 3, and over two
        // hosts each is the other's only neighbour). Where a NIC
        // carries channels of both trees (channels `c` and `c + k` on
        // one rail), a host interior in one is a leaf in the other:
        // two channels' bytes each way per pair.
        let edges: f64 = match f.hosts {
            h if h > 3.0 => 3.0,
            h if h > 2.0 => 2.0,
            h if h > 1.0 => 1.0,
            _ => 0.0,
        };
        let channel_loads = if f.per_nic() >= 2.0 {
            edges.min(2.0) * f.per_nic()
        } else {
            edges
        };
        let nic_bytes = channel_loads * per_channel * f.rails.min(f.channels);
        // A rank reduces each chunk going up and copies it coming down,
        // once per child, a step each, and the busiest rank sets the
        // pace: within a host the binary tree's inner ranks have two
        // (from 3 ranks on); across hosts a host's head has the next
        // rank of its chain and, in the tree of hosts, up to two heads
        // of other hosts (two from 4 hosts on: below that no host has
        // two).
        let host_children = if f.hosts > 3.0 { 2.0 } else { 1.0 };
        let children = if f.hosts > 1.0 {
            let chain = if f.local > 1.0 { 1.0 } else { 0.0 };
            chain + host_children
        } else if n < 3.0 {
            1.0
        } else {
            2.0
        };
        let rate = 1.0 / (children / f.reduce + children / f.copy);
        Shape {
            across_depth,
            chain_depth,
            depth,
            across,
            nic_bytes,
            host_children,
            children,
            rate,
        }
    }
}

fn both_trees_across_hosts(call: &Call, shape: &Shape) -> f64 {
    let Call {
        ref f, per_channel, ..
    } = *call;
    let Shape {
        across_depth,
        chain_depth,
        host_children,
        children,
        ..
    } = *shape;
    // One channel runs both trees on half the data each, every
    // phase after the other at each rank: up tree 0, up tree 1,
    // down tree 0, down tree 1. A tree's root is a leaf of the
    // other, deepest where the first tree is shallow: the last
    // result leaves the root of tree 1 once tree 0's way up
    // and down has reached it, three crossings of the tree of
    // hosts in all, after the chain's way up (the chains are
    // the same in both trees) and before its way down.
    let half = per_channel / 2.0;
    let (chunks, s) = f.chunk_of(half);
    let piece = s.min(f.piece);
    // A chain's rank reduces a piece going up, copies it coming
    // down.
    let chain = chain_depth * (f.within_hop(piece, f.reduce) + f.within_hop(piece, f.copy));
    // A crossing reduces the piece going up, copies it coming
    // down. Below the root, which has one child host, a head
    // takes in its child hosts' pieces a step each going up,
    // the second behind the first on its NIC; going down it
    // passes the piece to its chain in one step, then to its
    // child hosts in the next, one after the other on its NIC.
    let below_root = (across_depth - 1.0).max(0.0);
    let second = if host_children > 1.0 {
        piece / f.nic
    } else {
        0.0
    };
    let crossings = 3.0 * across_depth * f.hop(piece, true)
        + across_depth * piece / f.reduce
        + 2.0 * across_depth * piece / f.copy
        + below_root * (f.step.max(second) + 2.0 * (f.step + second));
    // The other chunks follow at the pace of the busiest rank
    // or link. The head's steps over a chunk: up tree 0, then
    // down tree 0 and down tree 1 on the way to the last
    // result (tree 1's way up runs beside tree 0's). A head's
    // NIC, in each direction, carries a chunk per child host
    // in the phases where it is interior, and the other
    // tree's chunk before its next phase can start (tree 0's
    // root sends tree 1's way up before tree 0's way down): a
    // chunk per child host in each of the four phases. A
    // chain's rank takes a chunk in over its port per phase.
    let up = children * f.step + s / (f.reduce / children);
    let down = children.min(2.0) * f.step + s / (f.copy / children);
    let phases = (chunks - 1.0)
        * (up + 2.0 * down)
            .max(4.0 * host_children * s / f.nic)
            .max(4.0 * s / f.port);
    f.step + chain + crossings + phases
}

fn both_trees_in_a_host(call: &Call, shape: &Shape) -> f64 {
    let Call {
        ref f,
        bytes,
        per_channel,
        ..
    } = *call;
    let Shape {
        depth,
        across,
        children,
        rate,
        ..
    } = *shape;
    // Within one host the two trees differ rank by rank: the
    // first piece crosses three times their depth, then each
    // phase runs at the pace of its busiest rank, an inner rank
    // taking in both children's halves over its port.
    let half = per_channel / 2.0;
    let piece = f.chunk_of(half).1.min(f.piece);
    let fill = f.fill(3.0 * depth, 0.0, piece, rate);
    let phase_port = children * bytes / 2.0;
    let phase = |steps: f64, rate: f64| f.stream(half, across, steps, rate, 0.0, phase_port);
    fill + 2.0 * phase(children, f.reduce / children)
        + 2.0 * phase(children.min(2.0), f.copy / children)
}

fn tree_per_channel(call: &Call, shape: &Shape) -> f64 {
    let Call {
        ref f,
        bytes,
        per_channel,
        ..
    } = *call;
    let Shape {
        across_depth,
        depth,
        across,
        nic_bytes,
        children,
        rate,
        ..
    } = *shape;
    // One tree per channel runs the way down a lag behind the
    // way up, two chunks more per level: a rank passes chunk
    // `j` down in the steps where it reduces chunk `j + 1 + 2d`
    // at depth `d`. A chunk a head sends up at the start of a
    // step crosses the `k` levels of the tree of hosts to the
    // root and back, each level a crossing each way and the
    // head's steps over a chunk (one per child), before the
    // head can end the step that passes it on, `2k + 2` chunks
    // later: each chunk takes at least that round trip's
    // share.
    let (chunks, s) = f.chunk_of(per_channel);
    let round_trip = if f.hosts > 1.0 {
        across_depth * (2.0 * f.hop(s, true) + children * (f.step + s / f.reduce))
            / (2.0 * across_depth + 2.0)
    } else {
        0.0
    };
    f.fill(2.0 * depth, across, s.min(f.piece), rate)
        + f.stream(per_channel, across, children, rate, nic_bytes, 2.0 * bytes)
            .max(chunks * round_trip)
}

fn broadcast(call: &Call) -> f64 {
    let Call {
        ref f,
        n,
        bytes,
        per_channel,
        ..
    } = *call;
    // A binary tree over ranks from the root: the first piece's way
    // down its deepest branch, `ceil(log2 n)` edges that halve the
    // distance between parent and child at each level, every rank
    // past the root's only child serving its second child a step
    // after its first. An edge spanning a host's ranks or more
    // crosses hosts; of the shorter ones, one does where the
    // branch steps over a host's edge.
    let chunks = (per_channel / f.chunk).ceil().max(1.0);
    let s = (per_channel / chunks).max(1.0);
    let piece = s.min(f.piece);
    let levels = n.log2().ceil();
    let long = if f.hosts > 1.0 {
        (levels - f.local.log2().ceil()).max(0.0)
    } else {
        0.0
    };
    let crossing = if f.hosts > 1.0 {
        (long + 1.0).min(levels)
    } else {
        0.0
    };
    let fill = levels * piece / f.copy
        + crossing * f.hop(piece, true)
        + (levels - crossing) * f.hop(piece, false)
        + (levels - 1.0) * f.step;
    // A host's NICs carry what its ranks send to their children on
    // other hosts. With hosts of m ranks (m a power of two), rank
    // 2m is the first whose two children both live elsewhere
    // (2m - m and 2m + m), which needs a fourth host; below that
    // every host sends the data out once at most.
    let nic_bytes = match f.hosts {
        h if h > 3.0 => 2.0 * bytes,
        h if h > 1.0 => bytes,
        _ => 0.0,
    };
    let stage = chunks * (f.step + s / f.copy);
    // A rank sends to two children over its port, and keeps what
    // it passes on: on the same core where its transfers are its
    // own copies.
    f.step
        + fill
        + stage
            .max(nic_bytes / f.nic_total())
            .max(2.0 * bytes / f.port + f.kept(bytes, 0.0))
}
