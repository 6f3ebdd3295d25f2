//! Rings and trees across hosts, one per channel on its rail: their shape
//! (each channel's ring enters and leaves every host once, at ranks that
//! change with the channel; each tree is a chain inside a host and a
//! double binary tree over hosts), and their correctness, proved by the
//! symbolic executor on many placements (uneven hosts and scrambled rank
//! orders included).

use proptest::prelude::*;
use rccl_algorithms::tree::{self, channel_tree};
use rccl_algorithms::{verify_on, Algorithm, CollKind, CollSpec, Params, Ring, Topology, Tree};

/// Ranks placed on `hosts` hosts of `per_host` each (the last host
/// `short` ranks fewer), in an order scrambled by `shuffle`.
fn placement(hosts: usize, per_host: usize, short: usize, shuffle: u64) -> Topology {
    let mut host_of: Vec<usize> = (0..hosts * per_host - short.min(per_host - 1))
        .map(|r| r / per_host)
        .collect();
    let mut s = shuffle;
    for i in (1..host_of.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        host_of.swap(i, (s >> 33) as usize % (i + 1));
    }
    Topology::from_hosts(host_of)
}

/// The successor of every rank on channel `channel`'s ring, read from the
/// ring all-gather's schedules (the first primitive of each rank sends to
/// its next).
fn ring_next(topo: &Topology, channel: usize) -> Vec<usize> {
    let n = topo.nranks();
    let spec = CollSpec {
        kind: CollKind::AllGather,
        nranks: n,
        root: 0,
        count: channel + 1,
    };
    let params = Params {
        nchannels: channel + 1,
        chunk_elems: 1,
    };
    (0..n)
        .map(|r| {
            let schedule = Ring.schedule(&spec, r, &params, topo);
            schedule.channels[channel][0].prims[0]
                .send_peer()
                .expect("an all-gather starts by sending")
        })
        .collect()
}

#[test]
fn each_channel_ring_enters_and_leaves_every_host_once_at_rotating_ranks() {
    // 3 hosts x 4 ranks, ranks dealt round robin over the hosts (a flat
    // ring would cross hosts at every hop).
    let topo = Topology::from_hosts((0..12).map(|r| r % 3).collect());
    for channel in 0..8 {
        let next = ring_next(&topo, channel);
        let crossings: Vec<(usize, usize)> = (0..12)
            .filter(|&r| topo.host_of(next[r]) != topo.host_of(r))
            .map(|r| (r, next[r]))
            .collect();
        assert_eq!(crossings.len(), 3, "channel {channel}: {crossings:?}");
        for host in 0..3 {
            // The channel enters host h at local index channel mod 4 and
            // leaves it from the local index before.
            let ranks = topo.local_ranks(host);
            let enters = ranks[channel % 4];
            let leaves = ranks[(channel + 3) % 4];
            assert!(
                crossings.iter().any(|&(_, to)| to == enters),
                "channel {channel} does not enter host {host} at {enters}: {crossings:?}"
            );
            assert!(
                crossings.iter().any(|&(from, _)| from == leaves),
                "channel {channel} does not leave host {host} from {leaves}: {crossings:?}"
            );
        }
    }
}

#[test]
fn trees_across_hosts_are_chains_joined_by_a_double_binary_tree_of_heads() {
    let (hosts, per_host) = (8, 4);
    let topo = Topology::blocks(hosts, per_host);
    for channel in 0..4 {
        for t in 0..2 {
            let nodes: Vec<_> = (0..hosts * per_host)
                .map(|r| channel_tree(&topo, channel, t, r))
                .collect();
            let mut roots = 0;
            let mut crossing = 0;
            for (rank, node) in nodes.iter().enumerate() {
                let head = topo.host_chain(topo.host_of(rank), channel)[0];
                match node.parent {
                    None => roots += 1,
                    Some(p) => {
                        assert!(nodes[p].children.contains(&rank));
                        if topo.host_of(p) != topo.host_of(rank) {
                            crossing += 1;
                            assert_eq!(rank, head, "only heads talk across hosts");
                            assert_eq!(p, topo.host_chain(topo.host_of(p), channel)[0]);
                        }
                    }
                }
                assert!(node.children.len() <= 3);
            }
            assert_eq!(roots, 1);
            assert_eq!(crossing, hosts - 1, "channel {channel} tree {t}");
            // Depth: the chain of a host plus log2(hosts) + 1 hops.
            let depth = |mut r: usize| {
                let mut d = 0;
                while let Some(p) = nodes[r].parent {
                    r = p;
                    d += 1;
                }
                d
            };
            let deepest = (0..hosts * per_host).map(depth).max().unwrap();
            assert!(deepest <= per_host - 1 + 4, "depth {deepest}");
        }
        // The tree algorithm's all-reduce talks to exactly these peers.
        let n = hosts * per_host;
        let spec = CollSpec {
            kind: CollKind::AllReduce,
            nranks: n,
            root: 0,
            // 64 chunks per channel: more than the deepest rank's lag.
            count: 4 * 64 * 8,
        };
        let params = Params {
            nchannels: 4,
            chunk_elems: 8,
        };
        for rank in 0..n {
            // Of 4 channels, 0 and 1 run tree 0, 2 and 3 tree 1.
            let mut expected: Vec<usize> = tree::channel_trees(4, channel)
                .iter()
                .flat_map(|&t| {
                    let node = channel_tree(&topo, channel, t, rank);
                    node.parent.into_iter().chain(node.children)
                })
                .collect();
            expected.sort_unstable();
            expected.dedup();
            let schedule = Tree.schedule(&spec, rank, &params, &topo);
            let mut peers: Vec<usize> = schedule.channels[channel]
                .iter()
                .flat_map(|step| &step.prims)
                .flat_map(|p| p.send_peer().into_iter().chain(p.recv_peer()))
                .collect();
            peers.sort_unstable();
            peers.dedup();
            assert_eq!(peers, expected, "rank {rank} channel {channel}");
            // A channel of one tree reduces up and broadcasts down at
            // once: some step of a rank with a parent both receives a
            // result from it and works on a partial (sends one to it or
            // receives one from a child).
            let tree = tree::channel_trees(4, channel)[0];
            let node = channel_tree(&topo, channel, tree, rank);
            if let Some(parent) = node.parent {
                let up = |p: &rccl_algorithms::Prim| {
                    p.send_peer() == Some(parent)
                        || p.recv_peer().is_some_and(|c| node.children.contains(&c))
                };
                let both = schedule.channels[channel].iter().any(|step| {
                    step.prims.iter().any(up)
                        && step.prims.iter().any(|p| p.recv_peer() == Some(parent))
                });
                assert!(
                    both,
                    "rank {rank} channel {channel}: phases one after the other"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn rings_and_trees_across_hosts_verify(
        pick in 0usize..6,
        hosts in 2usize..=5,
        per_host in 1usize..=4,
        short in 0usize..3,
        shuffle in any::<u64>(),
        nchannels in 1usize..=5,
        chunk in 1usize..=3,
        chunks in 1usize..=4,
        root_pick in 0usize..20,
        in_place in any::<bool>(),
    ) {
        let (alg, kind): (&dyn Algorithm, CollKind) = [
            (&Ring as &dyn Algorithm, CollKind::AllReduce),
            (&Ring, CollKind::AllGather),
            (&Ring, CollKind::ReduceScatter),
            (&Ring, CollKind::Broadcast),
            (&Ring, CollKind::Reduce),
            (&Tree, CollKind::AllReduce),
        ][pick];
        let topo = placement(hosts, per_host, short, shuffle);
        let nranks = topo.nranks();
        let count = nchannels * (nranks * chunk * (chunks - 1) + 1 + shuffle as usize % (nranks * chunk));
        let spec = CollSpec { kind, nranks, root: root_pick % nranks, count };
        let params = Params { nchannels, chunk_elems: chunk };
        let in_place = in_place && alg.supports_in_place(kind);
        if let Err(e) = verify_on(alg, &spec, &params, &topo, in_place) {
            panic!("{} {spec:?} {params:?} {topo:?} in_place={in_place}: {e}", alg.name());
        }
    }
}
