//! The verifier refuses wrong schedules, and says precisely why.

use rccl_algorithms::verify::{Loc, Wait};
use rccl_algorithms::{
    verify, verify_schedules, Algorithm, CollKind, CollSpec, Direct, Params, Prim, Ring, Schedule,
    Slice, Step, Topology, VerifyError,
};

fn spec(kind: CollKind, nranks: usize, count: usize) -> CollSpec {
    CollSpec {
        kind,
        nranks,
        root: 0,
        count,
    }
}

fn schedules(alg: &dyn Algorithm, spec: &CollSpec, params: &Params) -> Vec<Schedule> {
    (0..spec.nranks)
        .map(|r| alg.schedule(spec, r, params, &Topology::flat(spec.nranks)))
        .collect()
}

/// Schedules of one channel, one primitive per step, from a list per rank.
fn by_hand(ranks: Vec<Vec<Vec<Prim>>>) -> Vec<Schedule> {
    ranks
        .into_iter()
        .map(|steps| Schedule {
            channels: vec![steps.into_iter().map(|prims| Step { prims }).collect()],
        })
        .collect()
}

fn at(loc: &Loc) -> (usize, usize, usize, &'static str) {
    (loc.rank, loc.channel, loc.step, loc.name)
}

const ONE: Params = Params {
    nchannels: 1,
    chunk_elems: 1,
};

#[test]
fn dropped_middle_step_mixes_elements() {
    let spec = spec(CollKind::AllReduce, 4, 4);
    let mut s = schedules(&Ring, &spec, &ONE);
    s[1].channels[0].remove(1);
    let err = verify_schedules(&spec, &s, false, 1).unwrap_err();
    match &err {
        VerifyError::MixedElements { at: loc, .. } => {
            assert_eq!(at(loc), (1, 0, 1, "recvReduceSend"))
        }
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with("rank 1 channel 0 step 1 prim 0 (recvReduceSend)"),
        "{msg}"
    );
}

#[test]
fn dropped_last_step_leaves_a_message() {
    let spec = spec(CollKind::AllReduce, 4, 4);
    let mut s = schedules(&Ring, &spec, &ONE);
    s[2].channels[0].pop();
    match verify_schedules(&spec, &s, false, 1).unwrap_err() {
        VerifyError::LeftoverMessages {
            channel: 0,
            from: 1,
            to: 2,
            elements: 1,
            sender,
        } => {
            assert_eq!(at(&sender), (1, 0, 5, "recvCopySend"))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn dropped_first_step_deadlocks() {
    // The root of a Broadcast skips its first chunk: the other ranks pass
    // its second one on as the first, then wait for a second forever.
    let spec = CollSpec {
        kind: CollKind::Broadcast,
        nranks: 3,
        root: 0,
        count: 4,
    };
    let mut s = schedules(
        &Ring,
        &spec,
        &Params {
            nchannels: 1,
            chunk_elems: 2,
        },
    );
    s[0].channels[0].remove(0);
    match verify_schedules(&spec, &s, false, 2).unwrap_err() {
        VerifyError::Deadlock { stuck } => {
            let got: Vec<_> = stuck.iter().map(|x| (at(&x.at), x.waits)).collect();
            assert_eq!(
                got,
                [
                    ((1, 0, 1, "recvCopySend"), Wait::RecvFrom(0)),
                    ((2, 0, 1, "recv"), Wait::RecvFrom(1)),
                ]
            );
        }
        e => panic!("{e}"),
    }
}

#[test]
fn swapped_peers_deadlock() {
    let spec = CollSpec {
        kind: CollKind::Broadcast,
        nranks: 3,
        root: 0,
        count: 2,
    };
    let params = Params {
        nchannels: 1,
        chunk_elems: 2,
    };
    let mut s = schedules(&Ring, &spec, &params);
    match &mut s[1].channels[0][0].prims[0] {
        Prim::RecvCopySend { from, to, .. } => std::mem::swap(from, to),
        p => panic!("{p:?}"),
    }
    let err = verify_schedules(&spec, &s, false, 2).unwrap_err();
    match &err {
        VerifyError::Deadlock { stuck } => {
            let got: Vec<_> = stuck.iter().map(|x| (at(&x.at), x.waits)).collect();
            assert_eq!(
                got,
                [
                    ((1, 0, 0, "recvCopySend"), Wait::RecvFrom(2)),
                    ((2, 0, 0, "recv"), Wait::RecvFrom(1)),
                ]
            );
        }
        e => panic!("{e}"),
    }
    assert!(err
        .to_string()
        .contains("rank 1 channel 0 step 0 prim 0 (recvCopySend) waits to receive from rank 2"));
}

#[test]
fn mismatched_lengths() {
    let spec = spec(CollKind::AllReduce, 3, 6);
    let params = Params {
        nchannels: 1,
        chunk_elems: 2,
    };
    let mut s = schedules(&Ring, &spec, &params);
    match &mut s[0].channels[0][0].prims[0] {
        Prim::Send { src, .. } => src.len = 1,
        p => panic!("{p:?}"),
    }
    match verify_schedules(&spec, &s, false, 2).unwrap_err() {
        VerifyError::MessageLengthMismatch {
            at: loc,
            from: 0,
            expected: 2,
            got: 1,
            sender,
        } => {
            assert_eq!(at(&loc), (1, 0, 1, "recvReduceSend"));
            assert_eq!(at(&sender), (0, 0, 0, "send"));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn double_counted_input() {
    // Rank 0 reduces its own input into a value that already holds it.
    let spec = spec(CollKind::AllReduce, 2, 3);
    let (s, r) = (Slice::send(0, 3), Slice::recv(0, 3));
    let sc = by_hand(vec![
        vec![
            vec![Prim::Send { to: 1, src: s }],
            vec![Prim::RecvReduceCopy {
                from: 1,
                src: s,
                dst: r,
            }],
        ],
        vec![
            vec![Prim::RecvReduceSend {
                from: 0,
                src: s,
                to: 0,
            }],
            vec![],
        ],
    ]);
    match verify_schedules(&spec, &sc, false, 3).unwrap_err() {
        VerifyError::DuplicateInput { at: loc, term, .. } => {
            assert_eq!(at(&loc), (0, 0, 1, "recvReduceCopy"));
            assert_eq!((term.rank, term.index), (0, 0));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn reducing_a_finished_result() {
    let spec = spec(CollKind::AllReduce, 2, 1);
    let (s, r) = (Slice::send(0, 1), Slice::recv(0, 1));
    let sc = by_hand(vec![
        vec![
            vec![Prim::Send { to: 1, src: s }],
            vec![Prim::RecvReduceCopy {
                from: 1,
                src: s,
                dst: r,
            }],
        ],
        vec![vec![Prim::RecvReduceCopySend {
            from: 0,
            src: s,
            dst: r,
            to: 0,
        }]],
    ]);
    match verify_schedules(&spec, &sc, false, 1).unwrap_err() {
        VerifyError::DoubleReduction { at: loc, .. } => {
            assert_eq!(at(&loc), (0, 0, 1, "recvReduceCopy"))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn output_never_finished() {
    // The full sum reaches both ranks, but no primitive finishes it.
    let spec = spec(CollKind::AllReduce, 2, 2);
    let (s, r) = (Slice::send(0, 2), Slice::recv(0, 2));
    let sc = by_hand(vec![
        vec![
            vec![Prim::Send { to: 1, src: s }],
            vec![Prim::RecvCopySend {
                from: 1,
                dst: r,
                to: 1,
            }],
        ],
        vec![
            vec![Prim::RecvReduceSend {
                from: 0,
                src: s,
                to: 0,
            }],
            vec![Prim::Recv { from: 0, dst: r }],
        ],
    ]);
    match verify_schedules(&spec, &sc, false, 2).unwrap_err() {
        VerifyError::NotFinished {
            rank: 0,
            index: 0,
            writer: Some(w),
            ..
        } => {
            assert_eq!(at(&w), (0, 0, 1, "recvCopySend"))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn different_reduction_orders() {
    let spec = spec(CollKind::AllReduce, 2, 1);
    let (s, r) = (Slice::send(0, 1), Slice::recv(0, 1));
    let rank = |peer| {
        vec![vec![
            Prim::Send { to: peer, src: s },
            Prim::RecvReduceCopy {
                from: peer,
                src: s,
                dst: r,
            },
        ]]
    };
    let sc = by_hand(vec![rank(1), rank(0)]);
    // Each rank reads its input twice in one step (a read-read, no race).
    match verify_schedules(&spec, &sc, false, 1).unwrap_err() {
        VerifyError::NotIdentical {
            index: 0,
            rank_a: 0,
            rank_b: 1,
            order_a,
            order_b,
        } => {
            assert_eq!(order_a, "final[(1,0)+(0,0)]");
            assert_eq!(order_b, "final[(0,0)+(1,0)]");
        }
        e => panic!("{e}"),
    }
}

#[test]
fn wrong_block() {
    let spec = spec(CollKind::AllGather, 4, 1);
    let mut s = schedules(&Ring, &spec, &ONE);
    match &mut s[2].channels[0][3].prims[0] {
        Prim::Recv { dst, .. } => dst.offset = 2,
        p => panic!("{p:?}"),
    }
    let err = verify_schedules(&spec, &s, false, 1).unwrap_err();
    match &err {
        VerifyError::WrongValue {
            rank: 2,
            index: 2,
            expected,
            got,
            writer: Some(w),
            wrong: 2,
        } => {
            assert_eq!(expected, "{(2,0)}");
            assert_eq!(got, "[(3,0)]");
            assert_eq!(at(w), (2, 0, 3, "recv"));
        }
        e => panic!("{e}"),
    }
    assert!(
        err.to_string()
            .contains("rank 2 recv[2] holds [(3,0)], expected {(2,0)}"),
        "{err}"
    );
}

#[test]
fn static_errors_name_the_first_bad_primitive() {
    let spec = spec(CollKind::AllGather, 2, 2);
    let good = schedules(
        &Ring,
        &spec,
        &Params {
            nchannels: 1,
            chunk_elems: 2,
        },
    );
    verify_schedules(&spec, &good, false, 2).unwrap();

    let with = |f: &dyn Fn(&mut Prim)| {
        let mut s = good.clone();
        f(&mut s[1].channels[0][1].prims[0]);
        verify_schedules(&spec, &s, false, 2).unwrap_err()
    };
    let recv_at = (1, 0, 1, "recv");
    match with(&|p| {
        *p = Prim::Recv {
            from: 7,
            dst: Slice::recv(0, 2),
        }
    }) {
        VerifyError::PeerOutOfRange {
            at: l,
            peer: 7,
            nranks: 2,
        } => assert_eq!(at(&l), recv_at),
        e => panic!("{e}"),
    }
    match with(&|p| {
        *p = Prim::Recv {
            from: 1,
            dst: Slice::recv(0, 2),
        }
    }) {
        VerifyError::SelfPeer { at: l, peer: 1 } => assert_eq!(at(&l), recv_at),
        e => panic!("{e}"),
    }
    match with(&|p| {
        *p = Prim::Recv {
            from: 0,
            dst: Slice::recv(3, 2),
        }
    }) {
        VerifyError::OutOfBounds {
            at: l, buf_len: 4, ..
        } => assert_eq!(at(&l), recv_at),
        e => panic!("{e}"),
    }
    match with(&|p| {
        *p = Prim::Recv {
            from: 0,
            dst: Slice::recv(0, 0),
        }
    }) {
        VerifyError::EmptyPrim { at: l } => assert_eq!(at(&l), recv_at),
        e => panic!("{e}"),
    }
    match with(&|p| {
        *p = Prim::Copy {
            src: Slice::send(0, 2),
            dst: Slice::recv(0, 1),
        }
    }) {
        VerifyError::SliceLengthMismatch { src: 2, dst: 1, .. } => {}
        e => panic!("{e}"),
    }
    match with(&|p| {
        *p = Prim::Copy {
            src: Slice::recv(0, 2),
            dst: Slice::recv(1, 2),
        }
    }) {
        VerifyError::OverlappingSlices { .. } => {}
        e => panic!("{e}"),
    }
}

#[test]
fn uninitialized_read() {
    // Rank 1 forwards its receive buffer before anything arrived.
    let spec = spec(CollKind::Broadcast, 2, 2);
    let r = Slice::recv(0, 2);
    let sc = by_hand(vec![
        vec![vec![Prim::Recv { from: 1, dst: r }]],
        vec![vec![Prim::Send { to: 0, src: r }]],
    ]);
    match verify_schedules(&spec, &sc, false, 2).unwrap_err() {
        VerifyError::Uninitialized {
            at: l, index: 0, ..
        } => assert_eq!(at(&l), (1, 0, 0, "send")),
        e => panic!("{e}"),
    }
}

#[test]
fn races_within_a_step_and_across_channels() {
    let spec = spec(CollKind::AllGather, 2, 2);
    let sc = by_hand(vec![
        vec![vec![
            Prim::Copy {
                src: Slice::send(0, 2),
                dst: Slice::recv(0, 2),
            },
            Prim::Send {
                to: 1,
                src: Slice::recv(1, 1),
            },
        ]],
        vec![vec![]],
    ]);
    match verify_schedules(&spec, &sc, false, 2).unwrap_err() {
        VerifyError::Race {
            at: l,
            other,
            index: 1,
            ..
        } => {
            assert_eq!(at(&l), (0, 0, 0, "send"));
            assert_eq!(at(&other), (0, 0, 0, "copy"));
        }
        e => panic!("{e}"),
    }
    // The same two primitives on two channels.
    let sc = vec![
        Schedule {
            channels: vec![
                vec![Step::one(Prim::Send {
                    to: 1,
                    src: Slice::recv(1, 1),
                })],
                vec![Step::one(Prim::Copy {
                    src: Slice::send(0, 2),
                    dst: Slice::recv(0, 2),
                })],
            ],
        },
        Schedule::new(2),
    ];
    match verify_schedules(&spec, &sc, false, 2).unwrap_err() {
        VerifyError::Race { at: l, other, .. } => {
            assert_eq!(at(&l), (0, 1, 0, "copy"));
            assert_eq!(at(&other), (0, 0, 0, "send"));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn input_read_after_overwrite() {
    // In place, the receive buffer is the send buffer: rank 0 overwrites
    // its input and then reads it as an input.
    let spec = spec(CollKind::AllReduce, 2, 1);
    let (s, r) = (Slice::send(0, 1), Slice::recv(0, 1));
    let sc = by_hand(vec![
        vec![
            vec![Prim::Recv { from: 1, dst: r }],
            vec![Prim::Send { to: 1, src: s }],
        ],
        vec![
            vec![Prim::Send { to: 0, src: s }],
            vec![Prim::Recv { from: 0, dst: r }],
        ],
    ]);
    match verify_schedules(&spec, &sc, true, 1).unwrap_err() {
        VerifyError::InputOverwritten {
            at: l,
            index: 0,
            writer: Some(w),
        } => {
            assert_eq!(at(&l), (0, 0, 1, "send"));
            assert_eq!(at(&w), (0, 0, 0, "recv"));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn call_errors() {
    let a2a = spec(CollKind::AllToAll, 2, 1);
    assert!(matches!(
        verify(&Ring, &a2a, &ONE, false),
        Err(VerifyError::Unsupported { alg: "ring", .. })
    ));
    assert!(matches!(
        verify_schedules(&a2a, &[Schedule::new(1)], false, 1),
        Err(VerifyError::WrongScheduleCount { got: 1, nranks: 2 })
    ));
    let bad_root = CollSpec {
        kind: CollKind::Gather,
        nranks: 2,
        root: 2,
        count: 1,
    };
    assert!(matches!(
        verify(&Direct, &bad_root, &ONE, false),
        Err(VerifyError::InvalidCall(_))
    ));
    assert!(matches!(
        verify(
            &Direct,
            &a2a,
            &Params {
                nchannels: 1,
                chunk_elems: 0
            },
            false
        ),
        Err(VerifyError::InvalidCall(_))
    ));
}

#[test]
fn stats_count_the_work() {
    let spec = spec(CollKind::AllReduce, 4, 8);
    let stats = verify(
        &Ring,
        &spec,
        &Params {
            nchannels: 1,
            chunk_elems: 2,
        },
        false,
    )
    .unwrap();
    // 4 ranks x (2n - 1) steps, each moving a 2-element message except the
    // last receive; 2(n-1) messages per rank.
    assert_eq!(stats.steps, 4 * 7);
    assert_eq!(stats.max_steps, 7);
    assert_eq!(stats.messages, 4 * 6);
    assert_eq!(stats.elements_sent, 4 * 6 * 2);
    assert_eq!(stats.elements_reduced, 4 * 3 * 2);
}

#[test]
fn bounded_fifos_deadlock_head_to_head_sends() {
    // Both ranks send a 4-element message before receiving: fine when the
    // FIFO holds a message, a deadlock when it holds less.
    let spec = spec(CollKind::AllToAll, 2, 4);
    let rank = |me: usize| {
        let peer = 1 - me;
        vec![
            vec![Prim::Copy {
                src: Slice::send(me * 4, 4),
                dst: Slice::recv(me * 4, 4),
            }],
            vec![Prim::Send {
                to: peer,
                src: Slice::send(peer * 4, 4),
            }],
            vec![Prim::Recv {
                from: peer,
                dst: Slice::recv(peer * 4, 4),
            }],
        ]
    };
    let sc = by_hand(vec![rank(0), rank(1)]);
    verify_schedules(&spec, &sc, false, 4).unwrap();
    match verify_schedules(&spec, &sc, false, 3).unwrap_err() {
        VerifyError::Deadlock { stuck } => {
            let got: Vec<_> = stuck.iter().map(|x| (at(&x.at), x.waits)).collect();
            assert_eq!(
                got,
                [
                    ((0, 0, 1, "send"), Wait::SendTo(1)),
                    ((1, 0, 1, "send"), Wait::SendTo(0))
                ]
            );
        }
        e => panic!("{e}"),
    }
}

/// Every primitive of a correct schedule is needed: dropping any one of
/// them, for any collective, is caught (except in-place no-op copies).
#[test]
fn every_dropped_primitive_is_caught() {
    let mut cases = 0;
    for kind in CollKind::ALL {
        for nranks in 1..=4 {
            for in_place in [false, true] {
                let spec = CollSpec {
                    kind,
                    nranks,
                    root: nranks / 2,
                    count: 5,
                };
                let params = Params {
                    nchannels: 2,
                    chunk_elems: 2,
                };
                let alg = rccl_algorithms::default_for(kind);
                let good = schedules(alg, &spec, &params);
                verify_schedules(&spec, &good, in_place, 2).unwrap();
                for r in 0..nranks {
                    for c in 0..2 {
                        for s in 0..good[r].channels[c].len() {
                            for p in 0..good[r].channels[c][s].prims.len() {
                                // In place, the copy of the own block is a
                                // no-op (source and destination alias).
                                let prim = good[r].channels[c][s].prims[p];
                                if in_place && matches!(prim, Prim::Copy { .. }) {
                                    continue;
                                }
                                let mut bad = good.clone();
                                bad[r].channels[c][s].prims.remove(p);
                                let res = verify_schedules(&spec, &bad, in_place, 2);
                                assert!(res.is_err(), "{spec:?} rank {r} ch {c} step {s} prim {p}");
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 1000, "{cases}");
}
