//! The tuner's choice across hosts, by replay: of a few candidate
//! algorithms (with their protocol and cut), the one whose replay on the
//! cluster ends first. The engine's tuner asks this about a cluster made
//! of its own link figures ([`engine_cluster`]), and the simulator's
//! examples about their presets, so the tuner and the simulator rank
//! algorithms with one model.

use rccl_algorithms::{tree::channel_tree, Algorithm, CollSpec, Params, Topology};

use crate::cluster::{self, ClusterSpec, Fabric, IntraLink, Nic, Protocol};
use crate::sim::simulate;

/// One candidate: an algorithm, its protocol and its cut.
#[derive(Clone, Copy)]
pub struct Candidate<'a> {
    /// The algorithm.
    pub algorithm: &'a dyn Algorithm,
    /// The protocol.
    pub protocol: Protocol,
    /// Channels and chunk.
    pub params: Params,
}

/// What [`fastest`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranking {
    /// The index of the fastest candidate, `None` when none could be
    /// replayed.
    pub best: Option<usize>,
    /// Each candidate's replayed time in microseconds, `None` where the
    /// replay refused it (an algorithm that does not fit the placement, a
    /// call too large to model).
    pub times_us: Vec<Option<f64>>,
}

/// Replays every candidate for `spec` (`elem_size`-byte elements) on
/// `cluster` and ranks them; ties go to the earlier candidate.
pub fn fastest(
    cluster: &ClusterSpec,
    spec: &CollSpec,
    elem_size: usize,
    candidates: &[Candidate<'_>],
) -> Ranking {
    let times_us: Vec<Option<f64>> = candidates
        .iter()
        .map(|c| {
            simulate(cluster, spec, elem_size, c.algorithm, c.protocol, &c.params)
                .ok()
                .map(|r| r.time_us)
        })
        .collect();
    let best = times_us
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .fold(None, |best: Option<(usize, f64)>, (i, t)| match best {
            Some((_, b)) if b <= t => best,
            _ => Some((i, t)),
        })
        .map(|(i, _)| i);
    Ranking { best, times_us }
}

/// The parameters `algorithm` runs with when `base` is the call's cut:
/// the tree's chunks shrink with its depth, as NCCL's do, so that its
/// pipeline fills (halved while a channel holds fewer than 8 x depth
/// chunks, down to 128 KiB; fewer than 4 x depth, down to 64 KiB; fewer
/// than depth, down to 32 KiB); every other algorithm keeps `base`.
pub fn params_for(
    algorithm: &dyn Algorithm,
    topo: &Topology,
    spec: &CollSpec,
    elem_size: usize,
    base: Params,
) -> Params {
    if algorithm.name() != "tree" || topo.nranks() < 2 {
        return base;
    }
    let depth = tree_depth(topo);
    let per_channel = spec.count * elem_size / base.nchannels.max(1);
    let mut chunk = base.chunk_elems.max(1) * elem_size;
    for (per_depth, floor) in [(8, 128 << 10), (4, 64 << 10), (1, 32 << 10)] {
        while per_channel / chunk < depth * per_depth && chunk / 2 >= floor {
            chunk /= 2;
        }
    }
    Params {
        chunk_elems: (chunk / elem_size).max(1),
        ..base
    }
}

/// The deepest rank of channel 0's trees: hops from it to the root.
fn tree_depth(topo: &Topology) -> usize {
    (0..2)
        .flat_map(|t| {
            (0..topo.nranks()).map(move |mut rank| {
                let mut hops = 0;
                while let Some(parent) = channel_tree(topo, 0, t, rank).parent {
                    rank = parent;
                    hops += 1;
                }
                hops
            })
        })
        .max()
        .unwrap_or(0)
}

/// The link figures an engine knows about its communicator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineLinks {
    /// GB/s of one stream through shared memory.
    pub shm_gbs: f64,
    /// Microseconds per step through shared memory.
    pub shm_latency_us: f64,
    /// GB/s of one NIC (one rail) between hosts.
    pub nic_gbs: f64,
    /// Microseconds per step across the network.
    pub nic_latency_us: f64,
    /// NICs per host that the channels spread over.
    pub rails: usize,
}

/// A cluster for an engine's communicator: its ranks placed on hosts as
/// `host_of` says, this machine's CPU figures (the `local-shm` preset's
/// reduction and copy rates, cache levels and per-primitive costs), and
/// the engine's link figures: shared memory between ranks of a host (a
/// transfer is the sender's copy), `rails` NICs per host of `nic_gbs`
/// each, one switch.
pub fn engine_cluster(host_of: &[usize], links: &EngineLinks) -> ClusterSpec {
    let base = cluster::local(1, false).with_placement(host_of);
    ClusterSpec {
        name: "engine".into(),
        intra: Some(IntraLink {
            port_gbs: links.shm_gbs,
            sender_copies: true,
            handoff_scale: 1.0,
            latency_us: links.shm_latency_us,
        }),
        nic: Nic {
            gbit: links.nic_gbs * 8.0,
            efficiency: 1.0,
            per_host: Some(links.rails.max(1)),
            latency_us: links.nic_latency_us,
        },
        fabric: Fabric::default(),
        probe: None,
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rccl_algorithms::{CollKind, Ring, Tree};

    #[test]
    fn tree_chunks_shrink_with_depth() {
        let spec = |count| CollSpec {
            kind: CollKind::AllReduce,
            nranks: 64,
            root: 0,
            count,
        };
        let base = Params {
            nchannels: 4,
            chunk_elems: 512 << 10,
        };
        // 8 hosts of 8: depth 7 in the chain + 3 across = 10 or so.
        let topo = Topology::blocks(8, 8);
        let depth = tree_depth(&topo);
        assert!((9..=11).contains(&depth), "{depth}");
        // 64 MiB per channel: 32 chunks of 2 MiB, fewer than 8 x depth;
        // halved to 512 KiB, 128 chunks.
        let p = params_for(&Tree, &topo, &spec(64 << 20), 4, base);
        assert_eq!(p.chunk_elems * 4, 512 << 10);
        // A small call stops at 32 KiB; other algorithms keep theirs.
        let p = params_for(&Tree, &topo, &spec(1 << 10), 4, base);
        assert_eq!(p.chunk_elems * 4, 32 << 10);
        assert_eq!(params_for(&Ring, &topo, &spec(1 << 10), 4, base), base);
    }

    #[test]
    fn the_fastest_replay_wins_and_refusals_are_skipped() {
        let links = EngineLinks {
            shm_gbs: 5.0,
            shm_latency_us: 1.0,
            nic_gbs: 1.0,
            nic_latency_us: 40.0,
            rails: 1,
        };
        // 8 hosts of one rank: a tiny call is latency-bound (the tree's
        // 2 log2 8 hops against the ring's 14), a large one bandwidth-bound
        // (the ring moves each byte 2(n-1)/n times, the tree twice).
        let c = engine_cluster(&[0, 1, 2, 3, 4, 5, 6, 7], &links);
        let params = Params {
            nchannels: 1,
            chunk_elems: 1 << 16,
        };
        let pick = |count: usize| {
            let spec = CollSpec {
                kind: CollKind::AllReduce,
                nranks: 8,
                root: 0,
                count,
            };
            let candidates = [
                Candidate {
                    algorithm: &Ring,
                    protocol: Protocol::Simple,
                    params,
                },
                Candidate {
                    algorithm: &Tree,
                    protocol: Protocol::Simple,
                    params,
                },
                Candidate {
                    algorithm: &rccl_algorithms::Direct,
                    protocol: Protocol::Simple,
                    params,
                },
            ];
            fastest(&c, &spec, 4, &candidates)
        };
        let small = pick(8);
        assert_eq!(small.best, Some(1), "{small:?}");
        assert!(small.times_us[2].is_none(), "direct has no all-reduce");
        let large = pick(16 << 20);
        assert_eq!(large.best, Some(0), "{large:?}");
    }
}
