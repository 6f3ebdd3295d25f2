//! The tuner's choice: of the candidate algorithms and protocols, the one
//! the closed forms of [`crate::estimate`] expect to end first
//! ([`decide`]), with the engine's channel rule ([`channels`]) and cut
//! ([`params_for`]). The engine's tuner asks this about a cluster made of
//! its own link figures ([`engine_cluster`]) and `rccl-sim` about the
//! cluster it replays, so both pick with one model. [`fastest`] ranks the
//! same candidates by replaying them: the reference the closed forms are
//! tested against (`tests/closed_form.rs`). [`EngineConfig`] carries the
//! engine's settings that narrow the candidates: its deterministic mode
//! and its board.

use rccl_algorithms::{
    tree::dtree, Algorithm, CollKind, CollSpec, OneShot, OrderedRing, Params, Topology,
};

use crate::builtin::Builtin;
use crate::cluster::{self, ClusterSpec, Fabric, IntraLink, Nic, Protocol};
use crate::estimate::estimate_us;
use crate::sim::simulate;

/// What [`decide`] picked.
#[derive(Clone, Copy)]
pub struct Decision<'a> {
    /// The index of the algorithm among the candidates.
    pub index: usize,
    /// The algorithm.
    pub algorithm: &'a dyn Algorithm,
    /// The protocol.
    pub protocol: Protocol,
    /// Channels and chunk ([`params_for`] applied).
    pub params: Params,
    /// The closed form's time, microseconds.
    pub estimate_us: f64,
}

/// The candidate the closed forms expect to end first on `cluster`
/// (whose placement `topo` describes): each algorithm of `algorithms`
/// with each of `protocols`, cut as `base` says for the protocol (then
/// [`params_for`]). Ties go to the earlier algorithm, then
/// the earlier protocol; `None` when the forms know none of them.
pub fn decide<'a>(
    cluster: &ClusterSpec,
    topo: &Topology,
    spec: &CollSpec,
    elem_size: usize,
    algorithms: &[&'a dyn Algorithm],
    protocols: &[Protocol],
    base: impl Fn(Protocol) -> Params,
) -> Option<Decision<'a>> {
    let mut best: Option<Decision<'a>> = None;
    for (index, &algorithm) in algorithms.iter().enumerate() {
        for &protocol in protocols {
            let params = params_for(algorithm, topo, spec, elem_size, base(protocol));
            let Some(time) = estimate_us(
                cluster,
                algorithm.name(),
                spec,
                elem_size,
                protocol,
                &params,
            ) else {
                continue;
            };
            if best.as_ref().map_or(true, |b| time < b.estimate_us) {
                best = Some(Decision {
                    index,
                    algorithm,
                    protocol,
                    params,
                    estimate_us: time,
                });
            }
        }
    }
    best
}

/// The engine's settings that change which schedules its tuner may pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// The deterministic mode (`NCCL_DETERMINISTIC=1`): AllReduce,
    /// ReduceScatter and Reduce run the ordered ring, whose order per
    /// element is fixed by the element and the rank count alone, or, for
    /// an all-reduce that fits the board, the board, which folds its posts
    /// in the same order (costed as one-shot, though from 8 KiB the engine
    /// folds in two shots). The other collectives are picked as without it.
    pub deterministic: bool,
    /// Bytes each rank can post on the board (`RCCL_BOARD_BYTES`; 0: no
    /// board). The engine has one only where every rank shares a host,
    /// and device work never has one.
    pub board_bytes: usize,
}

impl EngineConfig {
    /// The engine's board by default, 64 KiB a rank.
    pub const BOARD_BYTES: usize = 64 << 10;
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            deterministic: false,
            board_bytes: EngineConfig::BOARD_BYTES,
        }
    }
}

/// The algorithms the engine's tuner ranks for `spec` on `cluster` as
/// `config` says, the collective's default first (it wins ties): in the
/// deterministic mode, for a reducing collective, the ordered ring, or
/// one-shot where the all-reduce fits the board (every rank on one host,
/// more than one, at most `board_bytes` a rank); otherwise every built-in
/// that implements the call on its placement (one-shot at any size, as
/// out of place).
pub fn engine_candidates(
    cluster: &ClusterSpec,
    spec: &CollSpec,
    elem_size: usize,
    config: &EngineConfig,
) -> Vec<&'static dyn Algorithm> {
    if config.deterministic && OrderedRing.supports(spec.kind) {
        let on_board = spec.kind == CollKind::AllReduce
            && cluster.all_intra()
            && spec.nranks > 1
            && spec.count * elem_size <= config.board_bytes;
        return vec![if on_board { &OneShot } else { &OrderedRing }];
    }
    let topo = Topology::from_hosts(cluster.host_of());
    let default = rccl_algorithms::default_for(spec.kind);
    std::iter::once(default)
        .chain(
            rccl_algorithms::builtins()
                .iter()
                .copied()
                .filter(|a| !std::ptr::eq(*a, default)),
        )
        .filter(|a| a.supports(spec.kind) && a.supports_topology(&topo))
        .collect()
}

/// What the engine's tuner would run for `spec` on `cluster` by default:
/// [`engine_choice_with`] the default [`EngineConfig`].
pub fn engine_choice(
    cluster: &ClusterSpec,
    spec: &CollSpec,
    elem_size: usize,
) -> Option<Decision<'static>> {
    engine_choice_with(cluster, spec, elem_size, &EngineConfig::default())
}

/// What the engine's tuner would run for `spec` on `cluster` as `config`
/// says: of [`engine_candidates`], with any protocol within a host and
/// Simple across hosts (every protocol crosses hosts as Simple), on
/// [`channels`] by the cluster's `tuning` and a chunk of half a FIFO, the
/// one [`decide`] picks. In the deterministic mode the ordered ring is
/// ranked by the ring's form, as the engine ranks it.
pub fn engine_choice_with(
    cluster: &ClusterSpec,
    spec: &CollSpec,
    elem_size: usize,
    config: &EngineConfig,
) -> Option<Decision<'static>> {
    let topo = Topology::from_hosts(cluster.host_of());
    let algorithms = engine_candidates(cluster, spec, elem_size, config);
    let all_intra = cluster.all_intra();
    let protocols: &[Protocol] = if all_intra {
        &Protocol::ALL
    } else {
        &[Protocol::Simple]
    };
    let t = &cluster.tuning;
    let nchannels = channels(
        spec.count * elem_size,
        all_intra,
        cluster.rails(),
        t.bytes_per_channel,
        t.min_channels,
        t.max_channels,
    );
    decide(
        cluster,
        &topo,
        spec,
        elem_size,
        &algorithms,
        protocols,
        |p| Params {
            nchannels,
            ..crate::default_params(cluster, spec, elem_size, p)
        },
    )
}

/// The engine's channel count for a call of `bytes` per rank: within a
/// host (`all_intra`) the fewest, `min`, since the calling thread makes
/// every copy itself and more channels only interleave the same work;
/// across hosts one per `bytes_per_channel`, and from `rails` channels on
/// a multiple of `rails` so that every NIC carries as many; within
/// `min..=max`.
pub fn channels(
    bytes: usize,
    all_intra: bool,
    rails: usize,
    bytes_per_channel: usize,
    min: usize,
    max: usize,
) -> usize {
    if all_intra {
        return min;
    }
    let rails = rails.max(1);
    let wanted = (bytes / bytes_per_channel.max(1)).max(1);
    let spread = if wanted >= rails {
        wanted.next_multiple_of(rails)
    } else {
        wanted
    };
    spread.clamp(min, max)
}

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
    if Builtin::named(algorithm.name()) != Some(Builtin::Tree) || topo.nranks() < 2 {
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

/// The deepest rank of channel 0's trees: hops from it to the root. Across
/// hosts a host's ranks form a chain under its head, the heads a double
/// binary tree over the hosts; within a host, the double binary tree over
/// the ranks. Both trees of `n` nodes are `ceil(log2 n)` deep, so with as
/// many ranks on every host this costs nothing per rank or host; other
/// placements walk the trees over hosts, `O(hosts log hosts)`.
fn tree_depth(topo: &Topology) -> usize {
    let hosts = topo.hosts();
    if hosts.len() <= 1 {
        return ceil_log2(topo.nranks());
    }
    if let Some(per_host) = topo.ranks_per_host() {
        return ceil_log2(hosts.len()) + per_host.saturating_sub(1);
    }
    dtree_depths(hosts.len())
        .into_iter()
        .zip(hosts)
        .map(|(depth, ranks)| depth + ranks.len().saturating_sub(1))
        .max()
        .unwrap_or(0)
}

/// The depth of NCCL's binary tree over `n` nodes: its root's one child
/// heads a tree of the next lower power of two, halving per level.
fn ceil_log2(n: usize) -> usize {
    n.max(1).next_power_of_two().trailing_zeros() as usize
}

/// Each of `n` nodes' hops to the root, the deeper of its places in the
/// two trees of NCCL's double binary tree.
fn dtree_depths(n: usize) -> Vec<usize> {
    (0..n)
        .map(|node| {
            (0..2)
                .map(|t| {
                    let (mut at, mut hops) = (node, 0);
                    while let Some(parent) = dtree(n, at)[t].parent {
                        at = parent;
                        hops += 1;
                    }
                    hops
                })
                .max()
                .unwrap_or(0)
        })
        .collect()
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
/// `topology` says, this machine's CPU figures (the `local-shm` preset's
/// reduction and copy rates, cache levels and per-primitive costs), and
/// the engine's link figures: shared memory between ranks of a host (a
/// transfer is the sender's copy), `rails` NICs per host of `nic_gbs`
/// each, one switch; and the engine's protocols as measured on a 2-core
/// host (`all_reduce_perf --procs 2`, `cargo bench --bench protocols`):
/// the CPU encodes and decodes LL's flagged words one by one, a twentieth
/// of Simple's bandwidth (a 4 KiB round trip took 31 us against Simple's
/// 1 us), and LL128 at half of Simple's bandwidth from 128 KiB to 16 MiB
/// (2 processes, 2026-12-02: 48 against 28 us at 128 KiB, 906 against
/// 426 us at 1 MiB), its steps no cheaper (a CPU's stores become visible
/// in order, so a tail counter costs no more than per-line flags). Hosts of consecutive ranks, as many on each, are
/// read off the hosts' first and last ranks, without a pass over the
/// ranks.
pub fn engine_cluster(topology: &Topology, links: &EngineLinks) -> ClusterSpec {
    let mut base = cluster::local(1, false);
    base.protocols.ll.efficiency = 0.05;
    base.protocols.ll128.efficiency = 0.5;
    base.protocols.ll128.step_overhead_us = 1.1 * base.protocols.simple.step_overhead_us;
    let hosts = topology.hosts();
    let per_host = topology.ranks_per_host().unwrap_or(0);
    let blocks = per_host > 0
        && hosts.iter().enumerate().all(|(h, ranks)| {
            ranks.first() == Some(&(h * per_host))
                && ranks.last() == Some(&(h * per_host + per_host - 1))
        });
    let placed = if blocks {
        ClusterSpec {
            hosts: hosts.len(),
            ranks_per_host: per_host,
            ..base
        }
    } else {
        let host_of: Vec<usize> = (0..topology.nranks())
            .map(|r| topology.host_of(r))
            .collect();
        base.with_placement(&host_of)
    };
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
        ..placed
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
    fn tree_depth_is_the_deepest_rank_of_the_channel_trees() {
        use rccl_algorithms::tree::channel_tree;
        let walked = |topo: &Topology| {
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
        };
        for topo in [
            Topology::flat(1),
            Topology::flat(7),
            Topology::blocks(1, 8),
            Topology::blocks(8, 8),
            Topology::blocks(13, 4),
            Topology::blocks(32, 1),
            Topology::from_hosts(vec![0, 1, 0, 1, 2, 2, 2]),
        ] {
            assert_eq!(tree_depth(&topo), walked(&topo), "{:?}", topo.hosts());
        }
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
        let c = engine_cluster(&Topology::blocks(8, 1), &links);
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
