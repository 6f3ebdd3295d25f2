//! The ordered ring reduces every output element in the order
//! `reduction_order` states, whatever the channel count, the chunk, the
//! placement on hosts and in place or not; the ring's order moves with
//! them (so the property can fail).

use proptest::prelude::*;
use rccl_algorithms::{
    reduction_order, reduction_orders, CollKind, CollSpec, OrderedRing, Params, Rank, Ring,
    Topology,
};

const REDUCING: [CollKind; 3] = [
    CollKind::AllReduce,
    CollKind::ReduceScatter,
    CollKind::Reduce,
];

/// The orders `reduction_order` states for every receive element of every
/// rank (empty where a rank receives nothing).
fn stated(spec: &CollSpec) -> Vec<Vec<Vec<Rank>>> {
    (0..spec.nranks)
        .map(|r| {
            let len = spec.kind.recv_len(spec.count, spec.nranks, spec.root, r);
            (0..len)
                .map(|i| reduction_order(spec, r, i).expect("a reduced element"))
                .collect()
        })
        .collect()
}

/// A placement of `nranks` on hosts, shuffled by `seed` so that hosts do
/// not hold consecutive ranks.
fn placement(nranks: usize, nhosts: usize, seed: usize) -> Topology {
    let nhosts = nhosts.clamp(1, nranks);
    Topology::from_hosts(
        (0..nranks)
            .map(|r| (r * 7 + seed) % nhosts)
            .collect::<Vec<_>>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn every_element_is_reduced_in_the_stated_order(
        kind in prop::sample::select(REDUCING.to_vec()),
        nranks in 1usize..=8,
        count in 0usize..=70,
        nchannels in 1usize..=4,
        chunk in 1usize..=5,
        nhosts in 1usize..=4,
        seed in 0usize..8,
        root_pick in 0usize..8,
        in_place in any::<bool>(),
    ) {
        let spec = CollSpec { kind, nranks, root: root_pick % nranks, count };
        let params = Params { nchannels, chunk_elems: chunk };
        let topo = placement(nranks, nhosts, seed);
        let orders = reduction_orders(&OrderedRing, &spec, &params, &topo, in_place)
            .map_err(|e| TestCaseError::fail(format!("{spec:?} {params:?}: {e}")))?;
        prop_assert_eq!(orders, stated(&spec), "{:?} {:?} in_place={}", spec, params, in_place);
    }
}

/// The ring's all-reduce order depends on the channel count and the chunk:
/// the same call cut two ways reduces some element differently, and
/// differently from the stated order; the ordered ring's does not.
#[test]
fn the_ring_order_moves_with_the_cut_and_the_ordered_ring_does_not() {
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 4,
        root: 0,
        count: 64,
    };
    let topo = Topology::flat(4);
    let cuts = [
        Params {
            nchannels: 1,
            chunk_elems: 4,
        },
        Params {
            nchannels: 2,
            chunk_elems: 3,
        },
    ];
    let ring: Vec<_> = cuts
        .iter()
        .map(|p| reduction_orders(&Ring, &spec, p, &topo, false).unwrap())
        .collect();
    assert_ne!(
        ring[0], ring[1],
        "the ring's order did not move with the cut"
    );
    assert_ne!(ring[0], stated(&spec));
    for p in &cuts {
        assert_eq!(
            reduction_orders(&OrderedRing, &spec, p, &topo, false).unwrap(),
            stated(&spec),
            "{p:?}"
        );
    }
}

/// Across hosts the ring follows the placement; the ordered ring keeps the
/// index order.
#[test]
fn the_ring_order_moves_with_the_placement_and_the_ordered_ring_does_not() {
    let spec = CollSpec {
        kind: CollKind::ReduceScatter,
        nranks: 4,
        root: 0,
        count: 8,
    };
    let params = Params {
        nchannels: 1,
        chunk_elems: 8,
    };
    let apart = Topology::from_hosts(vec![0, 1, 0, 1]);
    let ring = reduction_orders(&Ring, &spec, &params, &apart, false).unwrap();
    assert_ne!(ring, stated(&spec));
    let ordered = reduction_orders(&OrderedRing, &spec, &params, &apart, false).unwrap();
    assert_eq!(ordered, stated(&spec));
}
