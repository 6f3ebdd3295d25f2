//! The tree, halving-doubling, hierarchical and one-shot algorithms, proved
//! by the symbolic executor over many shapes: rank counts 1..=32, pipeline
//! chunk counts 1..=8, channels 1..=4, in place and out of place, and (for
//! the hierarchical algorithms) 2 to 4 hosts.

use proptest::prelude::*;
use rccl_algorithms::{
    builtin, tree, verify, verify_on, Algorithm, CollKind, CollSpec, HalvingDoubling, Hierarchical,
    OneShot, Params, Topology, Tree, VerifyError,
};

fn check(alg: &dyn Algorithm, spec: CollSpec, params: Params, topo: &Topology, in_place: bool) {
    if let Err(e) = verify_on(alg, &spec, &params, topo, in_place) {
        panic!(
            "{} {spec:?} {params:?} {topo:?} in_place={in_place}: {e}",
            alg.name()
        );
    }
}

/// A count giving each channel `chunks` pipeline chunks (the last one
/// `fill` elements short of full, at most).
fn count_for(nchannels: usize, chunk: usize, chunks: usize, fill: usize) -> usize {
    nchannels * ((chunks - 1) * chunk + 1 + fill % chunk)
}

/// Every algorithm and collective this file proves.
fn cases() -> Vec<(&'static dyn Algorithm, CollKind)> {
    vec![
        (&Tree, CollKind::AllReduce),
        (&Tree, CollKind::Broadcast),
        (&HalvingDoubling, CollKind::AllReduce),
        (&OneShot, CollKind::AllReduce),
        (&Hierarchical, CollKind::AllReduce),
        (&Hierarchical, CollKind::AllGather),
        (&Hierarchical, CollKind::ReduceScatter),
    ]
}

#[test]
fn small_shapes_exhaustively() {
    for (alg, kind) in cases() {
        for nranks in 1..=9 {
            for nchannels in 1..=2 {
                for chunk in 1..=2 {
                    for chunks in [1, 2, 3] {
                        for fill in 0..2 {
                            let count = count_for(nchannels, chunk, chunks, fill);
                            let spec = CollSpec {
                                kind,
                                nranks,
                                root: nranks / 2,
                                count,
                            };
                            let params = Params {
                                nchannels,
                                chunk_elems: chunk,
                            };
                            for in_place in [false, true] {
                                if in_place && !alg.supports_in_place(kind) {
                                    continue;
                                }
                                check(alg, spec, params, &Topology::flat(nranks), in_place);
                                if alg.name() == "hier" {
                                    for hosts in 2..=4 {
                                        if nranks % hosts == 0 {
                                            let topo = Topology::blocks(hosts, nranks / hosts);
                                            check(alg, spec, params, &topo, in_place);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn flat_algorithms_verify(
        pick in 0usize..4,
        nranks in 1usize..=32,
        chunks in 1usize..=8,
        nchannels in 1usize..=4,
        chunk in 1usize..=3,
        fill in 0usize..3,
        root_pick in 0usize..32,
        in_place in any::<bool>(),
    ) {
        let (alg, kind) = cases()[pick];
        let in_place = in_place && alg.supports_in_place(kind);
        let count = count_for(nchannels, chunk, chunks, fill);
        let spec = CollSpec { kind, nranks, root: root_pick % nranks, count };
        let params = Params { nchannels, chunk_elems: chunk };
        check(alg, spec, params, &Topology::flat(nranks), in_place);
    }

    #[test]
    fn hierarchical_verifies(
        kind in prop::sample::select(vec![
            CollKind::AllReduce, CollKind::AllGather, CollKind::ReduceScatter,
        ]),
        hosts in 2usize..=4,
        per_host in 1usize..=8,
        chunks in 1usize..=8,
        nchannels in 1usize..=4,
        chunk in 1usize..=3,
        fill in 0usize..3,
        shuffle in any::<u64>(),
        in_place in any::<bool>(),
    ) {
        let nranks = hosts * per_host;
        let in_place = in_place && Hierarchical.supports_in_place(kind);
        // Ranks placed on hosts in a scrambled order.
        let mut host_of: Vec<usize> = (0..nranks).map(|r| r / per_host).collect();
        let mut s = shuffle;
        for i in (1..nranks).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            host_of.swap(i, (s >> 33) as usize % (i + 1));
        }
        let topo = Topology::from_hosts(host_of);
        let count = count_for(nchannels, chunk, chunks, fill);
        let spec = CollSpec { kind, nranks, root: 0, count };
        let params = Params { nchannels, chunk_elems: chunk };
        check(&Hierarchical, spec, params, &topo, in_place);
    }
}

/// Rabenseifner's algorithm for every rank count 1..=32, including the
/// non-powers of two, in several shapes.
#[test]
fn halving_doubling_every_rank_count() {
    for nranks in 1..=32 {
        for (nchannels, chunk, count) in [(1, 1, 1), (1, 2, 7), (2, 3, 37), (3, 1, 64), (4, 2, 5)] {
            let spec = CollSpec {
                kind: CollKind::AllReduce,
                nranks,
                root: 0,
                count,
            };
            let params = Params {
                nchannels,
                chunk_elems: chunk,
            };
            for in_place in [false, true] {
                check(
                    &HalvingDoubling,
                    spec,
                    params,
                    &Topology::flat(nranks),
                    in_place,
                );
            }
        }
    }
}

/// The double binary tree: two trees of one root each, children that
/// name their parent, and (for even rank counts) no rank interior in both.
#[test]
fn double_tree_shape() {
    for n in 2..=64 {
        let mut roots = [0; 2];
        for r in 0..n {
            let t = tree::dtree(n, r);
            for (i, node) in t.iter().enumerate() {
                assert!(node.children.len() <= 2);
                if node.parent.is_none() {
                    roots[i] += 1;
                }
                for &c in &node.children {
                    assert_eq!(tree::dtree(n, c)[i].parent, Some(r), "n={n} tree {i}");
                }
            }
            if n % 2 == 0 {
                let interior = t.iter().filter(|x| !x.children.is_empty()).count();
                assert!(interior <= 1, "n={n} rank {r} interior in both trees");
            }
        }
        assert_eq!(roots, [1, 1], "n={n}");
    }
}

#[test]
fn registry_has_the_new_algorithms() {
    for name in ["tree", "rhd", "hier", "oneshot", "TREE"] {
        assert!(builtin(name).is_some(), "{name}");
    }
}

#[test]
fn refusals() {
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 4,
        root: 0,
        count: 8,
    };
    let params = Params {
        nchannels: 1,
        chunk_elems: 2,
    };
    assert!(matches!(
        verify(&OneShot, &spec, &params, true),
        Err(VerifyError::InPlaceUnsupported { alg: "oneshot", .. })
    ));
    let uneven = Topology::from_hosts(vec![0, 0, 0, 1]);
    assert!(matches!(
        verify_on(&Hierarchical, &spec, &params, &uneven, false),
        Err(VerifyError::InvalidCall(_))
    ));
}

/// In place, a rank's input read through the receive buffer would skip the
/// op's input transform in the engine: refused.
#[test]
fn untransformed_input_through_recv_is_refused() {
    use rccl_algorithms::{verify_schedules, Prim, Schedule, Slice, Step};
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 2,
        root: 0,
        count: 1,
    };
    let sched = |me: usize| Schedule {
        channels: vec![vec![
            Step::one(Prim::Send {
                to: 1 - me,
                src: Slice::recv(0, 1),
            }),
            Step::one(Prim::RecvReduceCopy {
                from: 1 - me,
                src: Slice::send(0, 1),
                dst: Slice::recv(0, 1),
            }),
        ]],
    };
    let err = verify_schedules(&spec, &[sched(0), sched(1)], true, 1).unwrap_err();
    assert!(
        matches!(err, VerifyError::UntransformedInput { index: 0, .. }),
        "{err}"
    );
}
