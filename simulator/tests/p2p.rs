//! `simulate_p2p` against closed forms: one rank's sends and receives,
//! its peers posting the matching calls.

use rccl_algorithms::Params;
use rccl_simulator::cluster::{self, ClusterSpec, IntraLink};
use rccl_simulator::{default_p2p_params, simulate_p2p, P2pOp, Protocol, SimResult};

/// Figures with distinct values, so that a term taken from the wrong
/// place shows in the closed forms.
const PORT_GBS: f64 = 12.5;
const LAT_US: f64 = 0.75;
const OVERHEAD_US: f64 = 0.3;
const LAUNCH_US: f64 = 0.45;
/// From the call to the first primitive's work: the call's fixed cost and
/// the primitive's.
const START_US: f64 = LAUNCH_US + OVERHEAD_US;
const EXTRA_US: f64 = 0.2;
const EFF: f64 = 0.8;
const COPY_GBS: f64 = 7.0;
const SLOT: usize = 1 << 20;

/// `n` ranks on one host, or on as many hosts as `hosts` names.
fn shaped(host_of: &[usize], tcp_only: bool) -> ClusterSpec {
    let mut c = cluster::local(1, tcp_only);
    if !tcp_only {
        c.intra = Some(IntraLink {
            port_gbs: PORT_GBS,
            latency_us: LAT_US,
            sender_copies: false,
            handoff_scale: 1.0,
        });
    }
    // One copy rate at every size: no cache levels, no streaming.
    c.caches.clear();
    c.streaming = None;
    c.copy_gbs = COPY_GBS;
    c.protocols.simple.efficiency = EFF;
    c.protocols.simple.step_overhead_us = OVERHEAD_US;
    c.protocols.simple.launch_us = LAUNCH_US;
    c.protocols.simple.extra_latency_us = EXTRA_US;
    c.protocols.simple.slot_bytes = SLOT;
    c.with_placement(host_of)
}

fn one_host(n: usize) -> ClusterSpec {
    shaped(&vec![0; n], false)
}

/// Bytes per microsecond of a link of `gbs` GB/s under Simple.
fn link(gbs: f64) -> f64 {
    gbs * 1e3 * EFF
}

fn copy() -> f64 {
    COPY_GBS * 1e3
}

fn send(peer: usize, len: usize) -> P2pOp {
    P2pOp::Send {
        peer,
        offset: 0,
        len,
    }
}

fn recv(peer: usize, len: usize) -> P2pOp {
    P2pOp::Recv {
        peer,
        offset: 0,
        len,
    }
}

fn params(nchannels: usize, chunk: usize) -> Params {
    Params {
        nchannels,
        chunk_elems: chunk,
    }
}

fn run(c: &ClusterSpec, rank: usize, calls: &[P2pOp], p: Params) -> SimResult {
    simulate_p2p(c, rank, calls, Protocol::Simple, &p).unwrap()
}

fn close(got: f64, want: f64) {
    let rel = (got - want).abs() / want.abs();
    assert!(rel <= 1e-9, "got {got}, want {want} (relative error {rel})");
}

#[test]
fn one_message_costs_overhead_latency_wire_and_copy_out() {
    // S bytes in one chunk within one FIFO piece: the step overhead, the
    // link's latency (plus Simple's extra), S over the link at the
    // protocol's efficiency, and the receiver's copy out of the FIFO.
    let c = one_host(2);
    let s = 100_000;
    let r = run(&c, 0, &[send(1, s)], params(1, 1 << 20));
    let want = START_US + LAT_US + EXTRA_US + s as f64 / link(PORT_GBS) + s as f64 / copy();
    close(r.time_us, want);
    assert_eq!(r.last_rank, 1, "the receiver finishes last");
    // The link drains the FIFO behind the sender: it is done once the
    // message is in (it fits)...
    close(r.first_done_us, START_US);
    assert_eq!(r.size_bytes, s);
    assert_eq!(r.ranks_replayed, 2);

    // ... or, for a message larger than the FIFO (8 slots), once its port
    // has sent all but a FIFO of it.
    let fifo = 8.0 * SLOT as f64 * EFF;
    let big = 10 * SLOT;
    let r = run(&c, 0, &[send(1, big)], params(1, 16 * SLOT));
    close(
        r.first_done_us,
        START_US + (big as f64 - fifo) / link(PORT_GBS),
    );

    // The receiving side of the same transfer takes the same time.
    let back = run(&c, 1, &[recv(0, s)], params(1, 1 << 20));
    close(back.time_us, want);
}

#[test]
fn chunks_pipeline_and_pieces_cut_through() {
    let c = one_host(2);
    // K chunks of C bytes: the wire time of all of them, one chunk's copy.
    let (k, chunk) = (8, 64 << 10);
    let r = run(&c, 0, &[send(1, k * chunk)], params(1, chunk));
    let want =
        START_US + LAT_US + EXTRA_US + (k * chunk) as f64 / link(PORT_GBS) + chunk as f64 / copy();
    close(r.time_us, want);
    assert_eq!(r.prims, 2 * k as u64);

    // One chunk of several pieces: the copy out starts with the first
    // piece and cannot end before the last piece is in.
    let s = 3 * SLOT;
    let r = run(&c, 0, &[send(1, s)], params(1, s));
    let piece = SLOT as f64 * EFF;
    let head = START_US + piece / link(PORT_GBS) + LAT_US + EXTRA_US;
    let tail = START_US + s as f64 / link(PORT_GBS) + LAT_US + EXTRA_US;
    close(
        r.time_us,
        (head + s as f64 / copy()).max(tail + piece / copy()),
    );
}

#[test]
fn sends_share_the_outgoing_link_and_opposite_directions_overlap() {
    let c = one_host(3);
    let s = 100_000;
    let p = params(1, 1 << 20);
    let wire = s as f64 / link(PORT_GBS);
    let fixed = START_US + LAT_US + EXTRA_US + s as f64 / copy();
    let one = run(&c, 0, &[send(1, s)], p).time_us;

    // Two sends to two peers queue on rank 0's port: twice the wire time.
    let two = run(&c, 0, &[send(1, s), send(2, s)], p).time_us;
    close(two, fixed + 2.0 * wire);

    // Two receives from two peers queue on its incoming port the same way.
    let two_in = run(&c, 0, &[recv(1, s), recv(2, s)], p).time_us;
    close(two_in, fixed + 2.0 * wire);

    // A send and a receive with one peer go opposite ways: one's time.
    let pair = run(&c, 0, &[send(1, s), recv(1, s)], p).time_us;
    close(pair, one);
    let pair = run(&c, 0, &[recv(1, s), send(1, s)], p).time_us;
    close(pair, one);

    // A send and a receive with different peers overlap as well.
    let crossed = run(&c, 0, &[send(1, s), recv(2, s)], p).time_us;
    close(crossed, one);
}

#[test]
fn a_self_pair_is_a_local_copy() {
    let c = one_host(2);
    let s = 100_000;
    let r = run(&c, 1, &[send(1, s), recv(1, s)], params(1, 1 << 20));
    close(r.time_us, START_US + s as f64 / copy());
    assert_eq!(r.ranks_replayed, 1);
    let unpaired = simulate_p2p(&c, 1, &[send(1, s)], Protocol::Simple, &params(1, 1 << 20));
    assert!(unpaired.unwrap_err().0.contains("itself"));
}

#[test]
fn across_hosts_the_nic_path_applies() {
    // Two hosts: the transfer crosses the NICs, at their rate and latency
    // (no switch hops in this preset).
    let c = shaped(&[0, 1], false);
    let s = 100_000;
    let r = run(&c, 0, &[send(1, s)], params(1, 1 << 20));
    let nic = cluster::LOCAL_TCP_GBIT / 8.0 * c.nic.efficiency;
    let want = START_US
        + cluster::LOCAL_TCP_LATENCY_US
        + EXTRA_US
        + s as f64 / link(nic)
        + s as f64 / copy();
    close(r.time_us, want);
    let same_host = run(&one_host(2), 0, &[send(1, s)], params(1, 1 << 20));
    assert!(r.time_us > same_host.time_us);

    // Each host has its own NIC: a send and a receive overlap.
    let pair = run(&c, 0, &[send(1, s), recv(1, s)], params(1, 1 << 20));
    close(pair.time_us, want);

    // Without a host link, ranks of one host loop back through their NIC.
    let tcp = shaped(&[0, 0], true);
    let r = run(&tcp, 0, &[send(1, s)], params(1, 1 << 20));
    close(r.time_us, want);
}

#[test]
fn time_grows_with_bytes_and_channels_split_the_calls() {
    let c = one_host(2);
    let mut last = 0.0;
    for s in [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20] {
        let p = default_p2p_params(&c, &[send(1, s)]);
        let t = run(&c, 0, &[send(1, s)], p).time_us;
        assert!(t > last, "{s} bytes: {t} <= {last}");
        last = t;
    }
    // Channels share the port: two channels move the bytes no faster,
    // but each carries half, so the copy out of the last chunk halves.
    let s = 1 << 20;
    let one = run(&c, 0, &[send(1, s)], params(1, s)).time_us;
    let two = run(&c, 0, &[send(1, s)], params(2, s)).time_us;
    assert!(two <= one, "{two} > {one}");
    assert_eq!(
        run(&c, 0, &[send(1, s)], params(2, s)).prims,
        4,
        "one message per channel on each side"
    );
}

#[test]
fn default_parameters_follow_the_engine() {
    let c = one_host(2);
    let small = default_p2p_params(&c, &[send(1, 1 << 10)]);
    assert_eq!(small.nchannels, c.tuning.min_channels);
    assert_eq!(small.chunk_elems, SLOT * 8 / 2);
    let large = default_p2p_params(&c, &[recv(1, 1 << 10), send(1, 64 << 20)]);
    assert_eq!(large.nchannels, c.tuning.max_channels);
}

#[test]
fn bad_requests_are_refused() {
    let c = one_host(2);
    let p = params(1, 1 << 20);
    let err = |rank, calls: &[P2pOp]| {
        simulate_p2p(&c, rank, calls, Protocol::Simple, &p)
            .unwrap_err()
            .0
    };
    assert!(err(2, &[send(0, 8)]).contains("rank 2"));
    assert!(err(0, &[send(5, 8)]).contains("peer 5"));
    // Nothing to do takes no time.
    assert_eq!(run(&c, 0, &[], p).time_us, 0.0);
}
