//! Communicator life cycle and group semantics: split, abort, errors,
//! timeouts with a report of what was waited for, and one thread driving
//! several ranks.

mod common;

use std::time::{Duration, Instant};

use common::test_config;
use rccl::{Communicator, Config, DataType, Error, Group, RedOp};

fn short_timeout() -> Config {
    Config {
        timeout: Duration::from_millis(1500),
        ..test_config()
    }
}

#[test]
fn split_by_color_orders_by_key_and_leaves_out_no_color() {
    let comms = Communicator::init_all_config(6, test_config()).unwrap();
    let results: Vec<Option<(usize, usize, Vec<u32>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let rank = comm.rank();
                    // Ranks 0..5: colors 0,1,0,1,0,none; keys reverse the order.
                    let color = (rank != 5).then_some(rank as u32 % 2);
                    let sub = comm.split(color, -(rank as i32)).unwrap()?;
                    let mut all = vec![0u32; sub.count()];
                    sub.all_gather(&[rank as u32], &mut all).unwrap();
                    Some((sub.rank(), sub.count(), all))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0], Some((2, 3, vec![4, 2, 0])));
    assert_eq!(results[2], Some((1, 3, vec![4, 2, 0])));
    assert_eq!(results[1], Some((1, 2, vec![3, 1])));
    assert_eq!(results[3], Some((0, 2, vec![3, 1])));
    assert_eq!(results[5], None);
}

#[test]
fn one_thread_drives_every_rank_in_a_group() {
    let comms = Communicator::init_all_config(4, test_config()).unwrap();
    let inputs: Vec<Vec<i64>> = (0..4).map(|r| vec![r as i64 + 1; 1000]).collect();
    let mut outputs = vec![vec![0i64; 1000]; 4];
    let mut group = Group::new();
    for ((comm, input), output) in comms.iter().zip(&inputs).zip(outputs.iter_mut()) {
        group.all_reduce(comm, input, output, RedOp::Sum).unwrap();
    }
    group.run().unwrap();
    assert!(outputs.iter().all(|o| o.iter().all(|&v| v == 10)));
}

#[test]
fn grouped_sends_and_receives_exchange_around_a_ring() {
    let n = 5;
    let value = |rank: usize, i: usize| (rank * 100_000 + i) as u32;
    // Cached stores, then non-temporal stores into the receive buffers.
    let streaming = Config {
        nt_store_bytes: 1,
        ..test_config()
    };
    for config in [test_config(), streaming] {
        let comms = Communicator::init_all_config(n, config).unwrap();
        std::thread::scope(|s| {
            for comm in &comms {
                s.spawn(move || {
                    let rank = comm.rank();
                    let mine: Vec<u32> = (0..3001).map(|i| value(rank, i)).collect();
                    let mut from_prev = vec![0u32; 3001];
                    let mut group = Group::new();
                    group.send(comm, &mine, (rank + 1) % n).unwrap();
                    group
                        .recv(comm, &mut from_prev, (rank + n - 1) % n)
                        .unwrap();
                    group.run().unwrap();
                    let prev = (rank + n - 1) % n;
                    assert!(from_prev
                        .iter()
                        .enumerate()
                        .all(|(i, &v)| v == value(prev, i)));
                });
            }
        });
    }
}

#[test]
fn lone_sends_and_receives_run_beside_board_all_reduces() {
    // The first small all-reduce makes the board; lone calls of every
    // kind after it must still take their own paths.
    let comms = Communicator::init_all_config(2, test_config()).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let rank = comm.rank();
                let mut sum = [0f32; 4];
                comm.all_reduce(&[1f32; 4], &mut sum, RedOp::Sum).unwrap();
                // The raw calls, as the C ABI makes them (the typed ones
                // run as groups of one).
                let peer = 1 - rank;
                let mine = [7u32; 16];
                let mut got = [0u32; 16];
                let send = || unsafe {
                    // SAFETY: `mine` holds 16 elements and outlives the call.
                    comm.send_raw(mine.as_ptr().cast(), 16, DataType::Uint32, peer)
                };
                let mut recv = || unsafe {
                    // SAFETY: `got` holds 16 elements, borrowed only here.
                    comm.recv_raw(got.as_mut_ptr().cast(), 16, DataType::Uint32, peer)
                };
                if rank == 0 {
                    send().unwrap();
                    recv().unwrap();
                } else {
                    recv().unwrap();
                    send().unwrap();
                }
                assert_eq!(got, [7; 16]);
                let mut gathered = [0u32; 2];
                comm.all_gather(&[rank as u32], &mut gathered).unwrap();
                assert_eq!(gathered, [0, 1]);
                comm.all_reduce(&[1f32; 4], &mut sum, RedOp::Sum).unwrap();
                assert_eq!(sum, [2.0; 4]);
            });
        }
    });
}

#[test]
fn repeated_board_all_reduces_follow_every_change_of_call() {
    // A lone all-reduce that repeats the previous one reuses its plan; any
    // change of op, scalar, type, count or placement must be planned anew.
    fn premul(scalar: f32) -> RedOp {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&scalar.to_le_bytes());
        RedOp::PreMulSum { scalar: bytes }
    }
    for n in [2usize, 3] {
        let comms = Communicator::init_all_config(n, test_config()).unwrap();
        std::thread::scope(|s| {
            for comm in &comms {
                s.spawn(move || {
                    let rank = comm.rank() as f32;
                    let ranks = n as f32;
                    let sum_of_ranks = (0..n).map(|r| r as f32).sum::<f32>();
                    let input = [rank + 1.0; 4];
                    let mut out = [0f32; 4];
                    for _ in 0..3 {
                        comm.all_reduce(&input, &mut out, RedOp::Sum).unwrap();
                        assert_eq!(out, [sum_of_ranks + ranks; 4]);
                    }
                    comm.all_reduce(&input, &mut out, RedOp::Max).unwrap();
                    assert_eq!(out, [ranks; 4]);
                    for scalar in [2.0f32, 4.0] {
                        comm.all_reduce(&input, &mut out, premul(scalar)).unwrap();
                        assert_eq!(out, [scalar * (sum_of_ranks + ranks); 4]);
                    }
                    let mut buf = input;
                    comm.all_reduce_in_place(&mut buf, RedOp::Sum).unwrap();
                    assert_eq!(buf, [sum_of_ranks + ranks; 4]);
                    let mut longer = [0f32; 5];
                    comm.all_reduce(&[1.0; 5], &mut longer, RedOp::Sum).unwrap();
                    assert_eq!(longer, [ranks; 5]);
                    let mut ints = [0i32; 4];
                    comm.all_reduce(&[comm.rank() as i32 - 7; 4], &mut ints, RedOp::Sum)
                        .unwrap();
                    assert_eq!(ints, [sum_of_ranks as i32 - 7 * n as i32; 4]);
                    comm.all_reduce(&input, &mut out, RedOp::Sum).unwrap();
                    assert_eq!(out, [sum_of_ranks + ranks; 4]);
                });
            }
        });
    }
}

#[test]
fn bad_arguments_are_refused_with_a_clear_error() {
    let comms = Communicator::init_all_config(1, test_config()).unwrap();
    let comm = &comms[0];
    let err = comm.broadcast(&[1u8], &mut [0u8], 3).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("root 3")),
        "{err}"
    );
    let err = comm
        .all_reduce(&[1f32; 4], &mut [0f32; 3], RedOp::Sum)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("receive buffer")),
        "{err}"
    );
    let err = comm.send(&[1u8], 1).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("peer 1")),
        "{err}"
    );
    assert_eq!(err.code(), 4, "ncclInvalidArgument");
}

#[test]
fn a_missing_peer_times_out_with_a_report_naming_it_and_poisons_the_comm() {
    let comms = Communicator::init_all_config(2, short_timeout()).unwrap();
    let start = Instant::now();
    // Rank 1 never joins the all-reduce.
    let err = comms[0]
        .all_reduce(&[1f32; 8], &mut [0f32; 8], RedOp::Sum)
        .unwrap_err();
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    let message = err.to_string();
    assert!(
        message.contains("AllReduce") && message.contains("rank 1"),
        "{message}"
    );
    assert_eq!(comms[0].async_error(), Some(err.clone()));
    // Every later call reports the same failure.
    assert_eq!(
        comms[0]
            .all_reduce(&[1f32], &mut [0f32], RedOp::Sum)
            .unwrap_err(),
        err
    );
}

#[test]
fn abort_from_another_thread_unblocks_an_operation_promptly() {
    let comms = Communicator::init_all_config(2, test_config()).unwrap();
    let comm = &comms[0];
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            comm.abort();
        });
        let start = Instant::now();
        let mut buf = [0u32; 16];
        let err = comm.recv(&mut buf, 1).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(err, Error::InvalidUsage(ref m) if m.contains("aborted")),
            "{err}"
        );
    });
    assert!(comm.all_reduce(&[1u8], &mut [0u8], RedOp::Sum).is_err());
}

#[test]
fn finalize_is_local_so_one_thread_finalizes_every_rank_in_turn() {
    // As ncclCommInitAll then ncclCommFinalize of each from one thread.
    let config = Config {
        timeout: Duration::from_secs(10),
        ..test_config()
    };
    let comms = Communicator::init_all_config(4, config).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                comm.all_reduce(&[1f32; 256], &mut [0f32; 256], RedOp::Sum)
                    .unwrap()
            });
        }
    });
    let start = Instant::now();
    for comm in &comms {
        comm.finalize().unwrap();
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(comms);
}

#[test]
fn ranks_that_disagree_on_settings_are_told_at_init() {
    let id = rccl::UniqueId::new().unwrap();
    let errors: Vec<Error> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let id = &id;
                s.spawn(move || {
                    let config = Config {
                        buffsize: (8 << 10) * (rank + 1),
                        ..test_config()
                    };
                    Communicator::init_rank_config(2, id, rank, config).unwrap_err()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for err in errors {
        assert!(err.to_string().contains("NCCL_BUFFSIZE"), "{err}");
    }
}

#[test]
fn an_unknown_algorithm_name_is_refused_at_init_naming_it() {
    let config = Config {
        algo: rccl::tuning::Selection::parse("NCCL_ALGO", "ring,bogus").unwrap(),
        ..short_timeout()
    };
    let started = Instant::now();
    let err = Communicator::init_all_config(2, config).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("unknown algorithm \"bogus\"") && m.contains("known: ring, direct, tree")),
        "{err}"
    );
    assert_eq!(err.code(), 4, "ncclInvalidArgument");
    assert!(started.elapsed() < Duration::from_secs(1));
    // NCCL's algorithms without an implementation here are accepted.
    let config = Config {
        algo: rccl::tuning::Selection::parse("NCCL_ALGO", "^NVLS,CollNetDirect").unwrap(),
        ..short_timeout()
    };
    let comms = Communicator::init_all_config(2, config).unwrap();
    assert_eq!(comms.len(), 2);
}

/// Runs `a` on rank 0 and `b` on rank 1 of `comms`, both expected to fail.
fn both_fail(
    comms: &[Communicator],
    a: impl FnOnce(&Communicator) -> rccl::Result<()> + Send,
    b: impl FnOnce(&Communicator) -> rccl::Result<()> + Send,
) -> Vec<Error> {
    std::thread::scope(|s| {
        let a = s.spawn(|| a(&comms[0]).unwrap_err());
        let b = s.spawn(|| b(&comms[1]).unwrap_err());
        vec![a.join().unwrap(), b.join().unwrap()]
    })
}

fn assert_names_both(errors: &[Error], first: &str, second: &str) {
    for err in errors {
        let message = err.to_string();
        assert!(matches!(err, Error::InvalidUsage(_)), "{message}");
        assert!(
            message.contains(first) && message.contains(second),
            "{message}"
        );
    }
}

#[test]
fn mismatched_collectives_fail_on_every_rank_naming_both_calls() {
    // Through FIFOs on both sides (no board).
    let no_board = Config {
        board_bytes: 0,
        ..short_timeout()
    };
    let comms = Communicator::init_all_config(2, no_board).unwrap();
    let errors = both_fail(
        &comms,
        |c| c.all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum),
        |c| c.all_gather(&[1i32; 32], &mut [0i32; 64]),
    );
    assert_names_both(&errors, "AllReduce", "AllGather");

    // Both through the board: the posts carry the call.
    let comms = Communicator::init_all_config(2, short_timeout()).unwrap();
    let errors = both_fail(
        &comms,
        |c| c.all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum),
        |c| c.all_reduce(&[1i32; 64], &mut [0i32; 64], RedOp::Max),
    );
    assert_names_both(&errors, "float, sum", "int32, max");

    // One through the board, the other through FIFOs: a stuck rank looks at
    // what the peer sent or posted (once connections exist).
    let comms = Communicator::init_all_config(2, short_timeout()).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let big = vec![1f32; 64 << 10];
                comm.all_reduce(&big, &mut vec![0f32; 64 << 10], RedOp::Sum)
                    .unwrap();
                comm.all_gather(&big[..16 << 10], &mut vec![0f32; 32 << 10])
                    .unwrap();
            });
        }
    });
    let errors = both_fail(
        &comms,
        |c| c.all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum),
        |c| c.all_gather(&[1i32; 32], &mut [0i32; 64]),
    );
    assert_names_both(&errors, "AllReduce", "AllGather");
}

#[test]
fn calls_that_leave_every_rank_waiting_fail_quickly_naming_both() {
    // Far beyond what the checks take: a failure at the deadline fails the
    // test on time.
    let patient = Config {
        timeout: Duration::from_secs(20),
        ..test_config()
    };
    let quickly = |start: Instant| {
        eprintln!("mismatch reported after {:?}", start.elapsed());
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{:?}",
            start.elapsed()
        );
    };

    // A reduce whose ranks disagree on the root: each waits for the other's
    // data, so no piece ever shows the difference.
    let comms = Communicator::init_all_config(2, patient.clone()).unwrap();
    let start = Instant::now();
    let errors = both_fail(
        &comms,
        |c| c.reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum, 0),
        |c| c.reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum, 1),
    );
    quickly(start);
    assert_names_both(&errors, "root 0", "root 1");

    // First calls, whose connections are still to be set up: the peer of
    // the rank that waits for its side runs another call.
    let comms = Communicator::init_all_config(2, patient.clone()).unwrap();
    let start = Instant::now();
    let errors = both_fail(
        &comms,
        |c| c.all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum),
        |c| c.broadcast(&[1f32; 64], &mut [0f32; 64], 1),
    );
    quickly(start);
    assert_names_both(&errors, "AllReduce", "Broadcast");

    // A send that the connection cannot hold whole (else it may finish
    // before its peer finds the mismatch, as NCCL's sends may).
    let large = vec![1f32; 4 << 20];
    for config in [
        patient.clone(),
        Config {
            shm_disable: true,
            ..patient
        },
    ] {
        let comms = Communicator::init_all_config(2, config).unwrap();
        let start = Instant::now();
        let errors = both_fail(
            &comms,
            |c| c.all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum),
            |c| c.send(&large, 0),
        );
        quickly(start);
        assert_names_both(&errors, "AllReduce", "Send/Recv");
    }
}

#[test]
fn abort_unblocks_a_group_spanning_several_communicators() {
    let a = Communicator::init_all_config(2, test_config()).unwrap();
    let b = Communicator::init_all_config(2, test_config()).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            a[0].abort();
        });
        let start = Instant::now();
        let (mut x, mut y) = ([0f32; 64], [0f32; 64]);
        let mut group = Group::new();
        group
            .all_reduce(&a[0], &[1f32; 64], &mut x, RedOp::Sum)
            .unwrap();
        group
            .all_reduce(&b[0], &[1f32; 64], &mut y, RedOp::Sum)
            .unwrap();
        let err = group.run().unwrap_err();
        let took = start.elapsed();
        println!("abort inside a group of two communicators: returned {took:?} after the call");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(err.to_string().contains("aborted"), "{err}");
    });
    // Both communicators of the group stopped mid-flight: both are poisoned.
    assert!(a[0].async_error().is_some() && b[0].async_error().is_some());
    // The peer, blocked in nothing, learns it at once when it next needs
    // rank 0 (its first call may complete from pieces rank 0 sent before
    // the abort, as one-shot algorithms send everything first).
    let start = Instant::now();
    let err = (0..2)
        .find_map(|_| {
            b[1].all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum)
                .err()
        })
        .expect("the peer of an aborted rank failed");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(err.to_string().contains("rank 0"), "{err}");
}

#[test]
fn a_failing_rank_tells_its_peers_at_once_instead_of_letting_them_time_out() {
    // Rank 0 aborts while rank 1 waits for it: rank 1 hears why through
    // the connection, long before its 60 s timeout.
    for config in [test_config(), common::tcp_config()] {
        let comms = Communicator::init_all_config(2, config).unwrap();
        // Connect first (an abort during connection setup reaches peers
        // waiting there only by their timeout).
        std::thread::scope(|s| {
            for comm in &comms {
                s.spawn(move || {
                    comm.all_reduce(&[1f32; 4096], &mut [0f32; 4096], RedOp::Sum)
                        .unwrap()
                });
            }
        });
        let err = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let start = Instant::now();
                let err = comms[1]
                    .all_reduce(&[1f32; 4096], &mut [0f32; 4096], RedOp::Sum)
                    .unwrap_err();
                (start.elapsed(), err)
            });
            std::thread::sleep(Duration::from_millis(200));
            comms[0].abort();
            let _ = comms[0].all_reduce(&[1f32; 4096], &mut [0f32; 4096], RedOp::Sum);
            waiter.join().unwrap()
        });
        let (took, err) = err;
        println!("peer abort seen after {took:?}: {err}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(err.to_string().contains("rank 0 (host"), "{err}");
        assert_eq!(err.code(), 6, "ncclRemoteError");
    }
}

#[test]
fn hang_report_on_request_names_operation_channel_step_and_peer() {
    let no_board = Config {
        board_bytes: 0,
        ..test_config()
    };
    // Rank 1 never calls: without the board, rank 0 waits for it to set
    // up its side of their first connection; with it, for its post.
    hang_report_names(
        no_board,
        "setting up the SHM/direct connection on channel 0",
        "waiting for rank 1 (host",
    );
    hang_report_names(
        test_config(),
        "the board: operation #0 AllReduce, step 0 (readPosts)",
        "waiting for data from rank 1 (host",
    );
}

fn hang_report_names(config: Config, place: &str, waiting: &str) {
    let comms = Communicator::init_all_config(2, config).unwrap();
    assert!(comms[0]
        .hang_report()
        .contains("rank 0 of 2: no operation in flight"));
    std::thread::scope(|s| {
        let blocked = s.spawn(|| {
            comms[0]
                .all_reduce(&[1f32; 256], &mut [0f32; 256], RedOp::Sum)
                .unwrap_err()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let report = loop {
            let report = comms[0].hang_report();
            if report.contains(waiting) || Instant::now() > deadline {
                break report;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        println!("{report}");
        assert!(
            report.contains("rank 0 of 2: operation #0 AllReduce in flight"),
            "{report}"
        );
        assert!(report.contains("no progress for"), "{report}");
        assert!(report.contains(place), "{report}");
        assert!(report.contains(waiting), "{report}");
        let all = rccl::hang_report();
        assert!(all.contains(&report.lines().next().unwrap()[..20]), "{all}");
        comms[0].abort();
        blocked.join().unwrap();
    });
    let report = comms[0].hang_report();
    assert!(
        report.contains("aborted") && report.contains("failed:"),
        "{report}"
    );
}

#[test]
fn a_send_completed_before_its_sender_destroys_the_communicator_still_arrives() {
    // A small send completes once its bytes are in the connection, which
    // the sender (the pair's lower rank) creates. Its communicator may be
    // gone before the receiver gets there: on the first call between the
    // two (the connection is made on the way) and on a later one.
    for connected_first in [false, true] {
        let comms = Communicator::init_all_config(2, short_timeout()).unwrap();
        let mut comms = comms.into_iter();
        let (sender, receiver) = (comms.next().unwrap(), comms.next().unwrap());
        if connected_first {
            let mut got = [0u32; 16];
            let ones = [1u32; 16];
            let mut group = Group::new();
            group.send(&sender, &ones, 1).unwrap();
            group.recv(&receiver, &mut got, 0).unwrap();
            group.run().unwrap();
            assert_eq!(got, [1; 16]);
        }
        std::thread::scope(|s| {
            s.spawn(move || {
                sender.send(&[7u32; 16], 1).unwrap();
                sender.destroy().unwrap();
            });
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                let mut got = [0u32; 16];
                receiver.recv(&mut got, 0).unwrap();
                assert_eq!(got, [7; 16], "connected first: {connected_first}");
            });
        });
    }
}

/// `NCCL_NET` picks the network by name, ignoring case, and the
/// connections go through it; a name that no provider has fails the init
/// with `ncclInvalidUsage`, naming the networks there are.
#[test]
fn nccl_net_chooses_the_network_by_name() {
    let config = |net: &str| Config {
        net: Some(net.into()),
        shm_disable: true,
        ..short_timeout()
    };
    let comms = Communicator::init_all_config(2, config("sOCKET")).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let mut out = [0u32; 3];
                comm.all_reduce(&[comm.rank() as u32 + 1; 3], &mut out, RedOp::Sum)
                    .unwrap();
                assert_eq!(out, [3; 3]);
            });
        }
    });
    let Err(err) = Communicator::init_all_config(2, config("Verbs")) else {
        panic!("an unknown network was accepted");
    };
    let text = err.to_string();
    assert!(
        text.contains("NCCL_NET=Verbs: no network of that name") && text.contains("Socket"),
        "{text}"
    );
    assert_eq!(err.code(), 5, "ncclInvalidUsage");
}
