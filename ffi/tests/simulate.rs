//! `ncclGroupSimulateEnd`: the estimate is the simulator's replay of the
//! engine's plan (collectives, and this rank's side of its sends and
//! receives), nothing runs, bad arguments fail with the group closed, and
//! the communicators go on working. `RCCL_SIM_CLUSTER` has its own test
//! binary (`simulate_cluster.rs`), as it sets the environment.

mod common;

use std::ptr::null_mut;

use common::*;
use rccl::{PlannedComm, PlannedP2p};
use rccl_algorithms::{P2pOp, Topology};
use rcclrs::*;

#[test]
fn the_estimate_is_the_simulators_and_nothing_runs() {
    let mut ranks = Ranks::new();
    let every: Vec<usize> = (0..N).collect();

    // One all-reduce on every rank: the simulator's time for it.
    let (rc, small) = ranks.simulate(&every, &[SMALL]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert!(small > 0.0, "{small}");
    assert_close(small, direct_us(SMALL));
    assert!(ranks.untouched(), "a simulated group ran");

    // A larger call takes longer, as the simulator says.
    let (rc, large) = ranks.simulate(&every, &[LARGE]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(large, direct_us(LARGE));
    assert!(large > small, "{large} <= {small}");

    // Two operations on a communicator run one after another: the sum.
    let (rc, both) = ranks.simulate(&every, &[SMALL, LARGE]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert!(both > large, "{both} <= {large}");
    assert_close(both, direct_us(SMALL) + direct_us(LARGE));

    // One rank may ask alone: the replay covers every rank of the call.
    let (rc, alone) = ranks.simulate(&[0], &[LARGE]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(alone, direct_us(LARGE));
    assert!(ranks.untouched(), "a simulated group ran");

    // The communicators go on: the one-rank simulation took no sequence
    // number, so every rank still agrees on the next collective.
    ranks.run_all_reduce(LARGE);
    ranks.run_all_reduce(SMALL);
}

#[test]
fn bad_calls_fail_clearly_and_close_the_group() {
    let mut ranks = Ranks::new();
    let every: Vec<usize> = (0..N).collect();

    // Outside a group.
    let mut info = sim_info();
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut info) }, ncclInvalidUsage);
    assert!(last_error().contains("without ncclGroupStart"));
    assert_eq!(info.estimatedTime, UNDEF);

    // NULL simInfo: the group is closed and nothing ran.
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    ranks.queue(&every, SMALL);
    assert_eq!(
        unsafe { ncclGroupSimulateEnd(null_mut()) },
        ncclInvalidArgument
    );
    assert!(last_error().contains("simInfo is NULL"), "{}", last_error());
    assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage);
    assert!(ranks.untouched());

    // A simInfo not made by NCCL_SIM_INFO_INITIALIZER.
    type Spoil = fn(&mut ncclSimInfo_t);
    let spoiled: [(Spoil, &str); 3] = [
        (|i| i.magic = 0, "magic"),
        (|i| i.size = 8, "size"),
        (|i| i.version = 0, "version"),
    ];
    for (spoil, field) in spoiled {
        let mut info = sim_info();
        spoil(&mut info);
        assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
        ranks.queue(&every, SMALL);
        assert_eq!(
            unsafe { ncclGroupSimulateEnd(&mut info) },
            ncclInvalidArgument,
            "{field}"
        );
        let message = last_error();
        assert!(
            message.contains(field) && message.contains("NCCL_SIM_INFO_INITIALIZER"),
            "{message}"
        );
        assert_eq!(info.estimatedTime, UNDEF);
        assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage, "{field}");
        assert!(ranks.untouched());
    }

    // A send to the rank itself without its receive: refused as the
    // launch would refuse it, group closed.
    let mut info = sim_info();
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    ranks.queue(&every, SMALL);
    ranks.queue_p2p(0, &[Call::Send(0, 4)]);
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut info) }, ncclInvalidUsage);
    assert!(last_error().contains("itself"), "{}", last_error());
    assert_eq!(info.estimatedTime, UNDEF);
    assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage);
    assert!(ranks.untouched());

    // A call that failed inside the group fails its simulated end too.
    let mut info = sim_info();
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    let rc = unsafe {
        ncclAllReduce(
            ranks.send[0].as_ptr().cast(),
            ranks.recv[0].as_mut_ptr().cast(),
            4,
            FLOAT,
            77,
            ranks.comms[0],
            null_mut(),
        )
    };
    assert_eq!(rc, ncclInvalidArgument);
    assert_eq!(
        unsafe { ncclGroupSimulateEnd(&mut info) },
        ncclInvalidArgument
    );
    assert_eq!(info.estimatedTime, UNDEF);
    assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage);
    assert!(ranks.untouched());

    // Nested groups: the inner end only closes its level.
    let (mut inner, mut outer) = (sim_info(), sim_info());
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    ranks.queue(&every, SMALL);
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut inner) }, ncclSuccess);
    assert_eq!(inner.estimatedTime, UNDEF);
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut outer) }, ncclSuccess);
    assert_close(outer.estimatedTime, direct_us(SMALL));
    assert!(ranks.untouched());

    // A normal group works afterwards.
    ranks.run_all_reduce(SMALL);
}

#[test]
fn sends_and_receives_are_estimated_from_this_ranks_side() {
    let mut ranks = Ranks::new();
    let every: Vec<usize> = (0..N).collect();
    let send = |peer, count| Call::Send(peer, count);
    let recv = |peer, count| Call::Recv(peer, count);

    // A lone send: the simulator's answer for this rank's link to the
    // peer. The peer never posts its receive, yet the call returns (the
    // watchdog in simulate_group) and moves nothing.
    let (rc, one) = ranks.simulate_p2p(0, &[send(1, LARGE)]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert!(one > 0.0, "{one}");
    assert_close(one, direct_p2p_us(0, &[send(1, LARGE)]));
    assert!(ranks.untouched(), "a simulated group ran");
    // Its receiving side, asked by the peer, costs the same.
    let (rc, back) = ranks.simulate_p2p(1, &[recv(0, LARGE)]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(back, one as f64);

    // Monotonic in bytes.
    let mut last = 0.0;
    for count in [1, SMALL, 16 * SMALL, LARGE / 4, LARGE] {
        let (rc, t) = ranks.simulate_p2p(0, &[send(1, count)]);
        assert_eq!(rc, ncclSuccess, "{}", last_error());
        assert!(t > last, "{count} floats: {t} <= {last}");
        last = t;
    }

    // A send and a receive with one peer go opposite ways and overlap.
    let pair = [send(1, LARGE), recv(1, LARGE)];
    let (rc, both_ways) = ranks.simulate_p2p(0, &pair);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(both_ways, direct_p2p_us(0, &pair));
    assert!(
        (both_ways / one - 1.0).abs() < 0.01,
        "send + receive {both_ways} us, send {one} us"
    );

    // Two sends to two peers share the outgoing link: about the sum, less
    // what they share (step overhead, latency, the last copy out).
    let two = [send(1, LARGE), send(2, LARGE)];
    let (rc, shared) = ranks.simulate_p2p(0, &two);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(shared, direct_p2p_us(0, &two));
    assert!(
        shared > 1.5 * one && shared <= 2.0 * one,
        "two sends {shared} us, one {one} us"
    );
    // Two receives share the incoming one. Over shared memory each
    // sender copies its own message, so two senders copy at once where
    // one sender copies twice: no slower than two sends, slower than one.
    let two_in = [recv(1, LARGE), recv(2, LARGE)];
    let (rc, shared_in) = ranks.simulate_p2p(0, &two_in);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(shared_in, direct_p2p_us(0, &two_in));
    assert!(
        shared_in > 1.2 * one && shared_in <= shared,
        "two receives {shared_in} us, two sends {shared} us, one {one} us"
    );

    // A send to the rank itself with its receive is a local copy, cheaper
    // than crossing to a peer.
    let own = [send(2, LARGE), recv(2, LARGE)];
    let (rc, copy) = ranks.simulate_p2p(2, &own);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(copy, direct_p2p_us(2, &own));
    assert!(copy < one, "self copy {copy} us, send {one} us");
    assert!(ranks.untouched(), "a simulated group ran");

    // Collectives and sends of one communicator add up; other
    // communicators' collectives run beside them.
    let (rc, mixed) = ranks.simulate_group(|r| {
        r.queue(&every, LARGE);
        r.queue_p2p(0, &[send(1, SMALL), recv(3, SMALL)]);
    });
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(
        mixed,
        direct_us(LARGE) + direct_p2p_us(0, &[send(1, SMALL), recv(3, SMALL)]),
    );
    assert!(ranks.untouched(), "a simulated group ran");

    // Nothing was taken from the communicators: real traffic still
    // matches up.
    ranks.run_all_reduce(SMALL);
}

/// A plan of one send of `bytes` from rank 0 to rank 1, on ranks placed
/// on hosts as `host_of` says.
fn planned_send(host_of: Vec<usize>, bytes: usize) -> PlannedComm {
    let config = rccl::Config::from_env().unwrap();
    let (nchannels, protocol) = rccl::tuning::p2p_choice(&config, bytes, 1);
    PlannedComm {
        rank: 0,
        topology: Topology::from_hosts(host_of),
        rails: 1,
        p2p: Some(PlannedP2p {
            calls: vec![P2pOp::Send {
                peer: 1,
                offset: 0,
                len: bytes,
            }],
            nchannels,
            protocol,
            chunk_bytes: rccl::tuning::chunk_bytes(&config, protocol),
        }),
        config,
        collectives: Vec::new(),
    }
}

#[test]
fn a_peer_on_another_host_is_reached_through_the_nic() {
    // The preset puts ranks of one host on shared memory (fast, short
    // latency) and hosts on TCP (slower, longer latency), so the same
    // send costs more across hosts, whatever the size.
    for bytes in [4, 64 << 10, 4 << 20] {
        let same = rcclrs::simulate::group_us(&[planned_send(vec![0, 0], bytes)]).unwrap();
        let across = rcclrs::simulate::group_us(&[planned_send(vec![0, 1], bytes)]).unwrap();
        assert!(
            across > same,
            "{bytes} bytes: {across} us across, {same} us within"
        );
    }
    // Without shared memory both go through TCP, whose loopback the preset
    // models as fast as the network: the same either way, at a size whose
    // working set exceeds every cache level (below that, two ranks of one
    // host share a host's cache and may fall to a slower level than one
    // rank alone).
    let mut within = planned_send(vec![0, 0], 64 << 20);
    let mut across = planned_send(vec![0, 1], 64 << 20);
    within.config.shm_disable = true;
    across.config.shm_disable = true;
    let within = rcclrs::simulate::group_us(&[within]).unwrap();
    let across = rcclrs::simulate::group_us(&[across]).unwrap();
    assert!(
        (within / across - 1.0).abs() < 1e-9,
        "{within} us, {across} us"
    );
}
