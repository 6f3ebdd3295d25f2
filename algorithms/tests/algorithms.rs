//! Every built-in algorithm, proved by the symbolic executor over many
//! shapes: rank counts, pipeline depths, channels, in place and out of
//! place, every root.

use proptest::prelude::*;
use rccl_algorithms::{
    builtin, builtins, default_for, p2p_schedule, verify, verify_schedules, Algorithm, CollKind,
    CollSpec, Direct, P2pOp, Params, Prim, Ring, Schedule, Slice, Topology,
};

/// Elements per channel that make a channel run exactly `loops` pipeline
/// loops (`extra` in `1..=elems_per_loop` picks how full the last one is).
fn per_channel(kind: CollKind, nranks: usize, chunk: usize, loops: usize, extra: usize) -> usize {
    let per_loop = if kind == CollKind::AllReduce {
        nranks * chunk
    } else {
        chunk
    };
    (loops - 1) * per_loop + 1 + (extra - 1) % per_loop
}

fn check(spec: CollSpec, params: Params, in_place: bool) {
    let alg = default_for(spec.kind);
    if let Err(e) = verify(alg, &spec, &params, in_place) {
        panic!(
            "{} {spec:?} {params:?} in_place={in_place}: {e}",
            alg.name()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_collective_verifies(
        kind in prop::sample::select(CollKind::ALL.to_vec()),
        nranks in 1usize..=32,
        loops in 1usize..=8,
        nchannels in 1usize..=4,
        chunk in 1usize..=3,
        extra in 1usize..=96,
        root_pick in 0usize..32,
        in_place in any::<bool>(),
    ) {
        let root = root_pick % nranks;
        let count = nchannels * per_channel(kind, nranks, chunk, loops, extra);
        let spec = CollSpec { kind, nranks, root, count };
        let params = Params { nchannels, chunk_elems: chunk };
        check(spec, params, in_place);
    }
}

/// Pipeline depth: a channel whose elements fill `loops` pipeline loops
/// runs `loops` times the steps of one loop.
#[test]
fn pipeline_loops_match_chunk_count() {
    for loops in 1..=8 {
        for nranks in [2, 5] {
            let chunk = 3;
            for kind in [
                CollKind::Broadcast,
                CollKind::Reduce,
                CollKind::AllGather,
                CollKind::AllReduce,
            ] {
                let count = 2 * per_channel(kind, nranks, chunk, loops, nranks * chunk);
                let spec = CollSpec {
                    kind,
                    nranks,
                    root: 1,
                    count,
                };
                let params = Params {
                    nchannels: 2,
                    chunk_elems: chunk,
                };
                let steps_per_loop = match kind {
                    CollKind::Broadcast | CollKind::Reduce => 1,
                    CollKind::AllGather => nranks,
                    _ => 2 * nranks - 1,
                };
                for c in 0..2 {
                    let s = Ring.schedule(&spec, 0, &params, &Topology::flat(nranks));
                    assert_eq!(
                        s.channels[c].len(),
                        loops * steps_per_loop,
                        "{kind:?} loops={loops}"
                    );
                }
            }
        }
    }
}

/// Every collective, every small rank count, counts around the chunk
/// boundaries, several channel and chunk cuts, every root, both forms.
#[test]
fn exhaustive_small() {
    let mut runs = 0;
    for kind in CollKind::ALL {
        for nranks in 1..=8 {
            for chunk in [1, 3] {
                for nchannels in [1, 2, 3] {
                    let several = 3 * nranks * chunk * nchannels + 5;
                    for count in [0, 1, 7, several] {
                        let roots = if kind.has_root() { nranks } else { 1 };
                        for root in 0..roots {
                            for in_place in [false, true] {
                                let spec = CollSpec {
                                    kind,
                                    nranks,
                                    root,
                                    count,
                                };
                                check(
                                    spec,
                                    Params {
                                        nchannels,
                                        chunk_elems: chunk,
                                    },
                                    in_place,
                                );
                                runs += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 5000);
}

#[test]
fn empty_and_single_rank_schedules() {
    for kind in CollKind::ALL {
        let alg = default_for(kind);
        let params = Params {
            nchannels: 3,
            chunk_elems: 4,
        };
        let empty = alg.schedule(
            &CollSpec {
                kind,
                nranks: 4,
                root: 0,
                count: 0,
            },
            1,
            &params,
            &Topology::flat(4),
        );
        assert!(empty.channels.iter().all(|c| c.is_empty()), "{kind:?}");
        let one = alg.schedule(
            &CollSpec {
                kind,
                nranks: 1,
                root: 0,
                count: 10,
            },
            0,
            &params,
            &Topology::flat(1),
        );
        let prims: Vec<&Prim> = one
            .channels
            .iter()
            .flatten()
            .flat_map(|s| &s.prims)
            .collect();
        assert!(
            prims.iter().all(|p| matches!(p, Prim::Copy { .. })),
            "{kind:?}: {prims:?}"
        );
        if Ring.supports(kind) {
            assert_eq!(prims.len(), 1, "{kind:?}");
        }
    }
}

#[test]
fn no_zero_length_prims() {
    for kind in CollKind::ALL {
        for nranks in 1..=6 {
            for count in 0..20 {
                let spec = CollSpec {
                    kind,
                    nranks,
                    root: nranks - 1,
                    count,
                };
                let params = Params {
                    nchannels: 4,
                    chunk_elems: 2,
                };
                for r in 0..nranks {
                    let s =
                        default_for(kind).schedule(&spec, r, &params, &Topology::flat(spec.nranks));
                    for step in s.channels.iter().flatten() {
                        assert!(!step.prims.is_empty());
                        assert!(step.prims.iter().all(|p| !p.is_empty()), "{spec:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn registry() {
    let names: Vec<&str> = builtins().iter().map(|a| a.name()).collect();
    assert_eq!(names, ["ring", "direct", "tree", "rhd", "hier", "oneshot"]);
    assert_eq!(builtin("ring").unwrap().name(), "ring");
    assert_eq!(builtin("Direct").unwrap().name(), "direct");
    assert!(builtin("nvls").is_none());
    for kind in CollKind::ALL {
        assert!(default_for(kind).supports(kind));
        // Ring or direct, whichever implements it, is the only one of the
        // two that does.
        let n = builtins()[..2].iter().filter(|a| a.supports(kind)).count();
        assert_eq!(n, 1, "{kind:?}");
    }
    assert_eq!(default_for(CollKind::AllReduce).name(), "ring");
    assert_eq!(default_for(CollKind::AllToAll).name(), "direct");
}

#[test]
fn ring_allreduce_follows_nccl_order() {
    // Rank 1 of 4: send chunk 0, rrs chunk 3, rrs chunk 2, rrcs chunk 1,
    // rcs chunk 0, rcs chunk 3, recv chunk 2.
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 4,
        root: 0,
        count: 4,
    };
    let s = Ring.schedule(
        &spec,
        1,
        &Params {
            nchannels: 1,
            chunk_elems: 1,
        },
        &Topology::flat(4),
    );
    let names: Vec<&str> = s.channels[0].iter().map(|st| st.prims[0].name()).collect();
    assert_eq!(
        names,
        [
            "send",
            "recvReduceSend",
            "recvReduceSend",
            "recvReduceCopySend",
            "recvCopySend",
            "recvCopySend",
            "recv"
        ]
    );
    let offsets: Vec<usize> = s.channels[0]
        .iter()
        .map(|st| match st.prims[0] {
            Prim::Send { src, .. } | Prim::RecvReduceSend { src, .. } => src.offset,
            Prim::RecvReduceCopySend { dst, .. }
            | Prim::RecvCopySend { dst, .. }
            | Prim::Recv { dst, .. } => dst.offset,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(offsets, [0, 3, 2, 1, 0, 3, 2]);
}

#[test]
fn direct_lists_peers_spread() {
    let spec = CollSpec {
        kind: CollKind::AllToAll,
        nranks: 4,
        root: 0,
        count: 2,
    };
    let s = Direct.schedule(
        &spec,
        1,
        &Params {
            nchannels: 1,
            chunk_elems: 1,
        },
        &Topology::flat(4),
    );
    assert_eq!(s.channels[0].len(), 1);
    let sends: Vec<usize> = s.channels[0][0]
        .prims
        .iter()
        .filter_map(Prim::send_peer)
        .collect();
    let recvs: Vec<usize> = s.channels[0][0]
        .prims
        .iter()
        .filter_map(Prim::recv_peer)
        .collect();
    assert_eq!(sends, [2, 2, 3, 3, 0, 0]);
    assert_eq!(recvs, [0, 0, 3, 3, 2, 2]);
}

/// A group of sends and receives that amounts to an AlltoAll (self calls
/// included) verifies as one.
#[test]
fn p2p_group_as_alltoall() {
    for nranks in 1..=6 {
        for count in [0, 1, 5, 13] {
            for (nchannels, chunk) in [(1, 1), (2, 3), (3, 4)] {
                let spec = CollSpec {
                    kind: CollKind::AllToAll,
                    nranks,
                    root: 0,
                    count,
                };
                let schedules: Vec<Schedule> = (0..nranks)
                    .map(|r| {
                        let mut ops = Vec::new();
                        // Receives first on odd ranks, sends first on even
                        // ones: the step is concurrent, so either works.
                        for k in 0..nranks {
                            let peer = (r + k) % nranks;
                            let send = P2pOp::Send {
                                peer,
                                offset: peer * count,
                                len: count,
                            };
                            let from = (r + nranks - k) % nranks;
                            let recv = P2pOp::Recv {
                                peer: from,
                                offset: from * count,
                                len: count,
                            };
                            if r % 2 == 0 {
                                ops.extend([send, recv]);
                            } else {
                                ops.extend([recv, send]);
                            }
                        }
                        p2p_schedule(r, &ops, nchannels, chunk)
                    })
                    .collect();
                verify_schedules(&spec, &schedules, false, chunk)
                    .unwrap_or_else(|e| panic!("n={nranks} count={count}: {e}"));
            }
        }
    }
}

#[test]
fn p2p_keeps_user_order_per_peer() {
    let ops = [
        P2pOp::Send {
            peer: 1,
            offset: 0,
            len: 3,
        },
        P2pOp::Recv {
            peer: 2,
            offset: 0,
            len: 2,
        },
        P2pOp::Send {
            peer: 1,
            offset: 10,
            len: 2,
        },
        P2pOp::Send {
            peer: 0,
            offset: 20,
            len: 4,
        },
        P2pOp::Recv {
            peer: 0,
            offset: 30,
            len: 4,
        },
    ];
    let s = p2p_schedule(0, &ops, 1, 2);
    assert_eq!(s.channels[0].len(), 1);
    let prims = &s.channels[0][0].prims;
    assert_eq!(
        prims[0],
        Prim::Copy {
            src: Slice::send(20, 4),
            dst: Slice::recv(30, 4)
        }
    );
    let to1: Vec<Slice> = prims
        .iter()
        .filter_map(|p| match *p {
            Prim::Send { to: 1, src } => Some(src),
            _ => None,
        })
        .collect();
    assert_eq!(
        to1,
        [Slice::send(0, 2), Slice::send(2, 1), Slice::send(10, 2)]
    );
    assert_eq!(prims.len(), 1 + 3 + 1);
}
