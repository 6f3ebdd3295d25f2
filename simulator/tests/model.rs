//! The simulator against closed forms, monotonicity, placement, symmetry
//! folding and scale.

use rccl_algorithms::{
    builtin, builtins, tree::dtree, CollKind, CollSpec, HalvingDoubling, Hierarchical, Params,
    Ring, Tree,
};
use rccl_simulator::cluster::{
    self, Cache, ClusterSpec, DegradedLink, IntraLink, LinkKind, SlowRank, Streaming,
};
use rccl_simulator::probe::{Probe, Rates};
use rccl_simulator::{
    default_params, report, simulate, simulate_with, Protocol, SimOptions, SimResult,
};

/// One host of `n` ranks on a switch of `gbs` GB/s ports and `lat` µs
/// latency; computation free, one piece per message, no overheads.
fn uniform(n: usize, gbs: f64, lat: f64, overhead: f64) -> ClusterSpec {
    let mut c = cluster::local(n, false);
    c.intra = Some(IntraLink {
        port_gbs: gbs,
        latency_us: lat,
        sender_copies: false,
        handoff_scale: 1.0,
    });
    c.reduce_gbs = 1e9;
    c.copy_gbs = 1e9;
    c.caches.clear();
    c.streaming = None;
    for p in [
        &mut c.protocols.ll,
        &mut c.protocols.ll128,
        &mut c.protocols.simple,
    ] {
        p.efficiency = 1.0;
        p.step_overhead_us = overhead;
        p.launch_us = 0.0;
        p.extra_latency_us = 0.0;
        p.slot_bytes = 1 << 30;
    }
    c
}

fn run(c: &ClusterSpec, kind: CollKind, count: usize, algo: &str, params: Params) -> SimResult {
    let spec = CollSpec {
        kind,
        nranks: c.nranks(),
        root: 0,
        count,
    };
    simulate(
        c,
        &spec,
        4,
        builtin(algo).unwrap(),
        Protocol::Simple,
        &params,
    )
    .unwrap()
}

fn one_channel(chunk_elems: usize) -> Params {
    Params {
        nchannels: 1,
        chunk_elems,
    }
}

/// A ring replay of `count` elements in one chunk on one channel.
fn ring_in_one_chunk(c: &ClusterSpec, kind: CollKind, count: usize) -> SimResult {
    run(c, kind, count, "ring", one_channel(1 << 30))
}

fn close(got: f64, want: f64, rel: f64) {
    assert!(
        (got - want).abs() <= rel * want,
        "got {got}, want {want} (tolerance {rel})"
    );
}

#[test]
fn ring_all_reduce_matches_the_closed_form() {
    // T = o + 2(n-1) (S/(n B) + L) with one piece per chunk and o <= L.
    for (n, overhead) in [(2, 0.0), (8, 0.0), (8, 3.0), (13, 1.0)] {
        let (b, l) = (100.0, 5.0); // GB/s, µs
        let c = uniform(n, b, l, overhead);
        let count = n * (1 << 18); // 1 MiB per chunk
        let r = run(&c, CollKind::AllReduce, count, "ring", one_channel(1 << 20));
        let chunk_bytes = (count / n * 4) as f64;
        let want = overhead + 2.0 * (n - 1) as f64 * (chunk_bytes / (b * 1e3) + l);
        close(r.time_us, want, 1e-6);
        close(
            r.busbw,
            (count * 4) as f64 / want / 1e3 * 2.0 * (n - 1) as f64 / n as f64,
            1e-6,
        );
    }
}

#[test]
fn ring_all_gather_and_reduce_scatter_match_the_closed_form() {
    // T = (n-1) (S/(n B) + L), S/n = count per rank.
    let (n, b, l) = (8, 50.0, 2.0);
    let c = uniform(n, b, l, 0.0);
    let count = 1 << 18;
    let want = (n - 1) as f64 * ((count * 4) as f64 / (b * 1e3) + l);
    for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
        let r = run(&c, kind, count, "ring", one_channel(1 << 20));
        close(r.time_us, want, 1e-6);
    }
}

#[test]
fn pieces_pipeline_the_latency_away() {
    // A 4 MiB chunk cut into 512 KiB pieces: each hop forwards the first
    // piece before the last arrives, so the time falls from the
    // store-and-forward closed form towards the bandwidth bound, and is
    // the bandwidth term plus one piece per hop: 2(n-1)/n S/B <= T.
    let (n, b, l) = (8, 100.0, 5.0);
    let mut c = uniform(n, b, l, 0.0);
    let count = n * (1 << 20);
    let whole = run(&c, CollKind::AllReduce, count, "ring", one_channel(1 << 20)).time_us;
    c.protocols.simple.slot_bytes = 512 << 10;
    let piecewise = run(&c, CollKind::AllReduce, count, "ring", one_channel(1 << 20)).time_us;
    let bound = 2.0 * (n - 1) as f64 / n as f64 * (count * 4) as f64 / (b * 1e3);
    assert!(piecewise < whole, "{piecewise} < {whole}");
    assert!(piecewise >= bound, "{piecewise} >= {bound}");
    // Cut-through: (2n-1) steps of one chunk's serialization plus one
    // latency, plus one piece per hop at most.
    let chunk = (count / n * 4) as f64 / (b * 1e3);
    let piece = (512 << 10) as f64 / (b * 1e3);
    assert!(piecewise <= (2 * n - 1) as f64 * (chunk + piece) + 2.0 * l);
}

#[test]
fn a_call_pays_its_launch_cost_once() {
    // The closed forms above, each rank starting `launch` later.
    let (n, b, l, launch) = (8, 50.0, 2.0, 7.5);
    let mut c = uniform(n, b, l, 0.0);
    c.protocols.simple.launch_us = launch;
    let count = n * (1 << 16);
    let chunk_bytes = (count / n * 4) as f64;
    let r = run(&c, CollKind::AllReduce, count, "ring", one_channel(1 << 20));
    let want = launch + 2.0 * (n - 1) as f64 * (chunk_bytes / (b * 1e3) + l);
    close(r.time_us, want, 1e-6);
    let r = run(
        &c,
        CollKind::AllGather,
        count / n,
        "ring",
        one_channel(1 << 20),
    );
    close(
        r.time_us,
        launch + (n - 1) as f64 * (chunk_bytes / (b * 1e3) + l),
        1e-6,
    );
}

/// `n` ranks on one host whose transfers are the sender's copies: ports
/// of `port` GB/s, copies at `copy`, reductions at `reduce`.
fn copied_by_sender(n: usize, port: f64, copy: f64, reduce: f64, lat: f64) -> ClusterSpec {
    let mut c = uniform(n, port, lat, 0.0);
    c.intra.as_mut().unwrap().sender_copies = true;
    c.copy_gbs = copy;
    c.reduce_gbs = reduce;
    c
}

#[test]
fn a_sender_that_copies_moves_data_at_its_copy_rate() {
    let (count, lat) = (1 << 16, 3.0);
    let bytes = (count * 4) as f64;
    // Reduce-scatter: each rank sends one block of `count` elements, then
    // reduces what it received (free here): T = S/min(port, copy) + L.
    for (port, copy, want_gbs) in [(100.0, 10.0, 10.0), (10.0, 100.0, 10.0)] {
        let c = copied_by_sender(2, port, copy, 1e9, lat);
        let r = ring_in_one_chunk(&c, CollKind::ReduceScatter, count);
        close(r.time_us, bytes / (want_gbs * 1e3) + lat, 1e-6);
    }
    // The same core then copies into the rank's own buffer, after the
    // transfer (S <= one slot here, so one piece each). All-gather: copy
    // the own block into the transfer, then into the receive buffer,
    // while the peer's block is in flight (L <= S/C), then copy the
    // peer's block out: T = 3 S/C.
    let copy = 10.0;
    let c = copied_by_sender(2, 1e9, copy, 1e9, lat);
    let r = ring_in_one_chunk(&c, CollKind::AllGather, count);
    close(r.time_us, 3.0 * bytes / (copy * 1e3), 1e-6);
    // On three ranks the middle step copies the block it receives out and
    // into the transfer onward, two copies: T = (2 + 2 + 1) S/C.
    let three = copied_by_sender(3, 1e9, copy, 1e9, lat);
    let r = ring_in_one_chunk(&three, CollKind::AllGather, count);
    close(r.time_us, 5.0 * bytes / (copy * 1e3), 1e-6);
    // All-reduce of 2 count elements: send a block, reduce the other into
    // the transfer back (one pass, so the reduction hides under the copy
    // when it is faster), copy that result into the own buffer (the
    // return's latency hides under it), copy the peer's result out: four
    // copies of a block and one latency, T = 4 S/C + L.
    let reduce = 40.0;
    let c = copied_by_sender(2, 1e9, copy, reduce, lat);
    let r = ring_in_one_chunk(&c, CollKind::AllReduce, 2 * count);
    close(r.time_us, 4.0 * bytes / (copy * 1e3) + lat, 1e-6);
    // Without `sender_copies` the forwarder reduces its block before the
    // transfer starts: S/R more.
    let mut apart = c.clone();
    apart.intra.as_mut().unwrap().sender_copies = false;
    apart.intra.as_mut().unwrap().port_gbs = copy;
    let r = ring_in_one_chunk(&apart, CollKind::AllReduce, 2 * count);
    close(
        r.time_us,
        3.0 * bytes / (copy * 1e3) + bytes / (reduce * 1e3) + 2.0 * lat,
        1e-6,
    );
}

#[test]
fn tree_latency_grows_with_depth() {
    // A tiny message: reduce up the deeper of the two trees and broadcast
    // back down; each hop costs one latency (and the data is negligible).
    let (b, l) = (100.0, 10.0);
    let mut times = Vec::new();
    for n in [4usize, 16, 64, 256] {
        let c = uniform(n, b, l, 0.0);
        let r = run(&c, CollKind::AllReduce, 2 * n, "tree", one_channel(1 << 20));
        let depth = (0..2)
            .map(|t| {
                (0..n)
                    .map(|mut r| {
                        let mut d = 0;
                        while let Some(p) = dtree(n, r)[t].parent {
                            r = p;
                            d += 1;
                        }
                        d
                    })
                    .max()
                    .unwrap()
            })
            .max()
            .unwrap() as f64;
        // The two trees' phases run in order on each rank (up 0, up 1,
        // down 0, down 1), so tree 1 can lag tree 0 by up to a depth.
        assert!(
            r.time_us >= 2.0 * depth * l - 1.0 && r.time_us <= 4.0 * depth * l + 1.0,
            "n {n}: {} vs depth {depth}",
            r.time_us
        );
        times.push(r.time_us);
        // The ring pays 2(n-1) latencies instead.
        let ring = run(&c, CollKind::AllReduce, 2 * n, "ring", one_channel(1 << 20));
        if n >= 16 {
            assert!(ring.time_us > 2.0 * r.time_us);
        }
    }
    // 64x the ranks, about 4x the depth: logarithmic.
    assert!(times[3] < 5.0 * times[0], "{times:?}");
}

#[test]
fn slower_links_and_ranks_are_slower() {
    let base = cluster::h100(2);
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 16,
        root: 0,
        count: 16 << 20,
    };
    let t = |c: &ClusterSpec| {
        let p = default_params(c, &spec, 4, Protocol::Simple);
        simulate(c, &spec, 4, &Ring, Protocol::Simple, &p)
            .unwrap()
            .time_us
    };
    let t0 = t(&base);
    let mut slow_nic = base.clone();
    slow_nic.nic.gbit = 200.0;
    let mut slow_nvl = base.clone();
    slow_nvl.intra.as_mut().unwrap().port_gbs = 20.0;
    let mut degraded = base.clone();
    degraded.faults.degraded_links.push(DegradedLink {
        rank: 7,
        link: LinkKind::Nic,
        factor: 4.0,
    });
    let mut slow_rank = base.clone();
    slow_rank.reduce_gbs = 50.0; // compute-bound everywhere ...
    let mut one_slow = slow_rank.clone();
    one_slow.faults.slow_ranks.push(SlowRank {
        rank: 3,
        compute_factor: 4.0,
        link_factor: 1.0,
    });
    let mut higher_latency = base.clone();
    higher_latency.nic.latency_us *= 10.0;
    for (what, c) in [
        ("200G NIC", &slow_nic),
        ("NVLink 100", &slow_nvl),
        ("one degraded NIC", &degraded),
        ("slow reductions", &slow_rank),
        ("NIC latency x10", &higher_latency),
    ] {
        assert!(t(c) > t0, "{what}: {} vs {t0}", t(c));
    }
    // ... and one rank slower still slows the whole ring: every chunk's
    // reduction passes through it, at a quarter of the others' rate.
    assert!(
        t(&one_slow) > t(&slow_rank) * 1.4,
        "{} against {}",
        t(&one_slow),
        t(&slow_rank)
    );
    // Bandwidth-bound: halving the NIC rate nearly doubles the time.
    close(t(&slow_nic) / t0, 2.0, 0.1);
}

#[test]
fn a_tensor_parallel_group_across_two_hosts_is_slower() {
    // 8 ranks on one host versus 4 + 4 on two hosts: across hosts the
    // rings cross on the 4 NICs of each host's 4 ranks (4 x 46 GB/s),
    // about half of NVLink's 360 GB/s.
    let one = cluster::h100(1);
    let mut split = cluster::h100(2);
    split.placement = Some(vec![0, 0, 0, 0, 1, 1, 1, 1]);
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 8,
        root: 0,
        count: 64 << 20,
    };
    let p = default_params(&one, &spec, 4, Protocol::Simple);
    let a = simulate(&one, &spec, 4, &Ring, Protocol::Simple, &p).unwrap();
    let b = simulate(&split, &spec, 4, &Ring, Protocol::Simple, &p).unwrap();
    assert!(
        b.time_us > 1.5 * a.time_us,
        "{} vs {}",
        b.time_us,
        a.time_us
    );
    // The 4 NICs bound the split group: busbw near 4 x 46 GB/s.
    assert!(b.busbw > 150.0 && b.busbw < 4.0 * 46.0, "{}", b.busbw);
}

#[test]
fn symmetry_folding_matches_full_replay() {
    // 8 hosts of 8, 2 hosts per leaf: rank period 16 of 64 ranks.
    let mut c = cluster::h100(8);
    c.fabric.hosts_per_leaf = 2;
    c.fabric.oversubscription = 2.0;
    for (algo, kind) in [
        ("ring", CollKind::AllReduce),
        ("ring", CollKind::AllGather),
        ("hier", CollKind::AllReduce),
        ("hier", CollKind::ReduceScatter),
        ("tree", CollKind::AllReduce),
    ] {
        let spec = CollSpec {
            kind,
            nranks: 64,
            root: 0,
            count: 8 << 20,
        };
        let p = default_params(&c, &spec, 4, Protocol::Simple);
        let a = builtin(algo).unwrap();
        let full = SimOptions {
            fold_ranks: false,
            fold_channels: false,
        };
        let exact = simulate_with(&c, &spec, 4, a, Protocol::Simple, &p, full).unwrap();
        let folded = simulate(&c, &spec, 4, a, Protocol::Simple, &p).unwrap();
        if algo != "tree" {
            assert_eq!(folded.ranks_replayed, 16, "{algo}");
        }
        assert_eq!(exact.ranks_replayed, 64);
        // Rank folding is exact; the ring's channel folding within 1%.
        let ranks_only = SimOptions {
            fold_ranks: true,
            fold_channels: false,
        };
        let rank_folded = simulate_with(&c, &spec, 4, a, Protocol::Simple, &p, ranks_only).unwrap();
        // Rank folding is exact.
        close(rank_folded.time_us, exact.time_us, 0.01);
        // Channel folding (the ring's only) replays one period of channels
        // (here 8 of 16, on links of half the rate): a few percent slow
        // while the pipeline is latency-bound, where two channels' pieces
        // on one link would interleave.
        let tolerance = if algo == "ring" { 0.08 } else { 0.01 };
        close(folded.time_us, exact.time_us, tolerance);
    }
}

#[test]
fn hosts_on_one_switch_fold_to_one() {
    // 6 hosts of 4 ranks and 4 rails on one switch (the engine's tuner's
    // cluster): the ring and hier replay one host's ranks, exactly.
    let c = rccl_simulator::tune::engine_cluster(
        &rccl_algorithms::Topology::blocks(6, 4),
        &rccl_simulator::tune::EngineLinks {
            shm_gbs: 5.0,
            shm_latency_us: 1.0,
            nic_gbs: 1.0,
            nic_latency_us: 40.0,
            rails: 4,
        },
    );
    // Counts that split evenly over 24 ranks and 4 channels.
    for (algo, count) in [("ring", 96 * 16), ("ring", 96 << 15), ("hier", 96 << 15)] {
        let spec = CollSpec {
            kind: CollKind::AllReduce,
            nranks: 24,
            root: 0,
            count,
        };
        let p = Params {
            nchannels: 4,
            chunk_elems: 1 << 17,
        };
        let a = builtin(algo).unwrap();
        let full = SimOptions {
            fold_ranks: false,
            fold_channels: false,
        };
        let exact = simulate_with(&c, &spec, 4, a, Protocol::Simple, &p, full).unwrap();
        let ranks_only = SimOptions {
            fold_ranks: true,
            fold_channels: false,
        };
        let folded = simulate_with(&c, &spec, 4, a, Protocol::Simple, &p, ranks_only).unwrap();
        assert_eq!(folded.ranks_replayed, 4, "{algo}");
        // Exact but for the order of simultaneous events.
        close(folded.time_us, exact.time_us, 1e-4);
    }
}

#[test]
fn every_builtin_runs_every_collective_it_supports() {
    let mut c = cluster::h100(2);
    c.ranks_per_host = 4;
    for a in builtins() {
        for kind in CollKind::ALL {
            if !a.supports(kind) {
                continue;
            }
            for count in [1, 1000, 1 << 20] {
                let spec = CollSpec {
                    kind,
                    nranks: 8,
                    root: 3,
                    count,
                };
                let p = default_params(&c, &spec, 4, Protocol::Simple);
                let r = simulate(&c, &spec, 4, *a, Protocol::Simple, &p)
                    .unwrap_or_else(|e| panic!("{} {}: {e}", a.name(), kind.name()));
                assert!(r.time_us > 0.0 && r.time_us.is_finite());
            }
        }
    }
}

#[test]
fn protocols_trade_latency_for_bandwidth() {
    let c = cluster::h100(1);
    let at = |count: usize, proto| {
        let spec = CollSpec {
            kind: CollKind::AllReduce,
            nranks: 8,
            root: 0,
            count,
        };
        let p = default_params(&c, &spec, 4, proto);
        simulate(&c, &spec, 4, &Ring, proto, &p).unwrap()
    };
    // Small: LL beats Simple; large: Simple beats LL (half the bandwidth).
    assert!(at(1024, Protocol::Ll).time_us < at(1024, Protocol::Simple).time_us);
    let (ll, simple) = (at(64 << 20, Protocol::Ll), at(64 << 20, Protocol::Simple));
    assert!(
        simple.busbw > 1.8 * ll.busbw,
        "{} {}",
        simple.busbw,
        ll.busbw
    );
}

#[test]
fn four_thousand_ranks_simulate_quickly() {
    // 512 hosts of 8: ring (folded to one leaf group of 256 ranks) and
    // tree (full replay of all 4096 ranks).
    let c = cluster::h100(512);
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 4096,
        root: 0,
        count: 64 << 20,
    };
    // Four channels keep the full replays (tree, hier, rhd) CI-sized.
    let p = Params {
        nchannels: 4,
        ..default_params(&c, &spec, 4, Protocol::Simple)
    };
    for a in [
        &Ring as &dyn rccl_algorithms::Algorithm,
        &Tree,
        &Hierarchical,
        &HalvingDoubling,
    ] {
        let start = std::time::Instant::now();
        let r = simulate(&c, &spec, 4, a, Protocol::Simple, &p).unwrap();
        let wall = start.elapsed().as_secs_f64();
        assert!(r.busbw > 1.0, "{}: {}", a.name(), r.busbw);
        eprintln!("{}: 4096 ranks in {wall:.2} s", a.name());
        // A bound on the replay's growth, not its speed (which benches
        // measure): a few seconds on a quiet core, 20-30 s on a loaded
        // one, hours if the replay turned quadratic in the ranks.
        assert!(wall < 180.0, "{} took {wall} s", a.name());
    }
}

#[test]
fn cluster_descriptions_round_trip_and_reject_nonsense() {
    for c in [
        cluster::h100(4),
        cluster::local(2, false),
        cluster::local(3, true),
    ] {
        assert_eq!(ClusterSpec::from_json(&c.to_json()).unwrap(), c);
        c.validate().unwrap();
    }
    let mut bad = cluster::h100(2);
    bad.placement = Some(vec![0; 16]);
    assert!(bad.validate().is_err(), "16 ranks on a host of 8");
    let mut bad = cluster::h100(2);
    bad.nic.gbit = 0.0;
    assert!(bad.validate().is_err());
    assert!(ClusterSpec::from_json("{\"name\": \"x\"}").is_err());
    // Cache levels are optional: a description without them has none, and
    // a cluster without them prints none.
    let mut plain = cluster::local(2, false);
    plain.caches.clear();
    plain.probe = None;
    assert!(!plain.to_json().contains("caches"));
    assert!(!cluster::h100(1).to_json().contains("caches"));
    assert_eq!(ClusterSpec::from_json(&plain.to_json()).unwrap(), plain);
    let mut bad = cluster::local(2, false);
    bad.caches.reverse();
    assert!(bad.validate().is_err(), "caches listed largest first");
    let mut bad = cluster::local(2, false);
    bad.caches[0].copy_gbs = 0.0;
    assert!(bad.validate().is_err());
}

/// `uniform` with one cache level of `bytes` per host at `reduce` /
/// `copy` GB/s in front of memory at 10 / 5 GB/s.
fn cached(n: usize, bytes: usize, reduce: f64, copy: f64) -> ClusterSpec {
    let mut c = uniform(n, 1e9, 0.0, 0.0);
    c.reduce_gbs = 10.0;
    c.copy_gbs = 5.0;
    c.caches = vec![Cache {
        bytes,
        reduce_gbs: reduce,
        copy_gbs: copy,
    }];
    c
}

/// One rank: an all-reduce of S bytes is one local copy; each case's S
/// takes `S / copy rate`.
fn copies_at(c: &ClusterSpec, cases: &[(usize, f64)]) {
    for &(bytes, copy_gbs) in cases {
        let r = ring_in_one_chunk(c, CollKind::AllReduce, bytes / 4);
        close(r.time_us, bytes as f64 / (copy_gbs * 1e3), 1e-9);
    }
}

#[test]
fn a_cache_level_switches_the_rates_at_its_size() {
    // One rank: an all-reduce is one local copy of S bytes, working set
    // 2S (send and receive buffers): S / cache copy rate while 2S fits,
    // S / memory's copy rate above.
    let cache = 1 << 20;
    let c = cached(1, cache, 40.0, 20.0);
    copies_at(&c, &[(256 << 10, 20.0), (512 << 10, 20.0), (1 << 20, 5.0)]);
    // Two ranks on one host, free links: a reduce-scatter of `count` per
    // rank sends one block and reduces the other, T = 4 count / reduce
    // rate; a rank's working set is 3 count elements (2 count in, count
    // out) and the host's cache is shared by its 2 ranks.
    let count = 1 << 14; // working set 192 KiB per rank, 384 KiB per host
    let want = |gbs: f64| (count * 4) as f64 / (gbs * 1e3);
    for (bytes, gbs) in [(384 << 10, 40.0), ((384 << 10) - 1, 10.0)] {
        let r = ring_in_one_chunk(
            &cached(2, bytes, 40.0, 20.0),
            CollKind::ReduceScatter,
            count,
        );
        close(r.time_us, want(gbs), 1e-6);
    }
    // The same ranks on two hosts (one each, linked by a free NIC): each
    // rank has a host's whole cache, so half of it suffices. (1e-6: the
    // free links still take bytes / 1e9 GB/s.)
    let mut two = cached(2, 192 << 10, 40.0, 20.0).with_placement(&[0, 1]);
    two.nic.gbit = 1e9;
    two.nic.latency_us = 0.0;
    let r = ring_in_one_chunk(&two, CollKind::ReduceScatter, count);
    close(r.time_us, want(40.0), 1e-6);
    // Two levels: the first (smallest) that holds the working set wins.
    let mut c = cached(1, 1 << 20, 40.0, 20.0);
    c.caches.insert(
        0,
        Cache {
            bytes: 256 << 10,
            reduce_gbs: 80.0,
            copy_gbs: 40.0,
        },
    );
    copies_at(&c, &[(128 << 10, 40.0), (256 << 10, 20.0), (1 << 20, 5.0)]);
}

/// A streaming regime from `min_bytes` at 12 / 8 GB/s.
fn streams_from(min_bytes: usize) -> Option<Streaming> {
    Some(Streaming {
        min_bytes,
        reduce_gbs: 12.0,
        copy_gbs: 8.0,
    })
}

#[test]
fn streaming_calls_run_at_their_rates_from_the_threshold() {
    // One rank: an all-reduce of S bytes is one local copy, working set 2S
    // (S read, S written), streaming from 2 MiB.
    let mut c = cached(1, 1 << 20, 40.0, 20.0);
    c.streaming = streams_from(2 << 20);
    copies_at(
        &c,
        &[
            // Not streaming: both buffers in the level, then in memory.
            (256 << 10, 20.0),
            (768 << 10, 5.0),
            // Streaming: what it reads still fits the level, then it does not.
            (1 << 20, 20.0),
            (4 << 20, 8.0),
        ],
    );
    // Two ranks: a reduce-scatter of `count` per rank reduces one block
    // at the streaming reduction rate once a rank's own buffers (3 count
    // elements) reach the threshold, whatever the host holds.
    let count = 1 << 16; // 768 KiB per rank
    for (min_bytes, gbs) in [(768 << 10, 12.0), ((768 << 10) + 1, 10.0)] {
        let mut c = cached(2, 1 << 10, 40.0, 20.0);
        c.streaming = streams_from(min_bytes);
        let r = ring_in_one_chunk(&c, CollKind::ReduceScatter, count);
        close(r.time_us, (count * 4) as f64 / (gbs * 1e3), 1e-6);
    }
    let mut bad = c.clone();
    bad.streaming.as_mut().unwrap().min_bytes = 0;
    assert!(bad.validate().is_err());
    bad.streaming.as_mut().unwrap().min_bytes = 1;
    bad.streaming.as_mut().unwrap().reduce_gbs = 0.0;
    assert!(bad.validate().is_err());
    let json = c.to_json();
    assert!(json.contains("streaming"));
    assert_eq!(ClusterSpec::from_json(&json).unwrap(), c);
    // The engine's threshold moves the regime; 0 drops it.
    let mut moved = c.clone();
    moved.stream_from(4 << 20);
    assert_eq!(moved.streaming.unwrap().min_bytes, 4 << 20);
    moved.stream_from(0);
    assert_eq!(moved.streaming, None);
}

fn rates(copy_gbs: f64, reduce_gbs: f64) -> Rates {
    Rates {
        copy_gbs,
        reduce_gbs,
    }
}

/// A probe of one cache level, memory, streaming and the hand-off: copy /
/// reduction rates of 10 / 20 (level), 4 / 5 (memory), 6 / 7
/// (streaming) and a hand-off of 8 GB/s, each times its factor.
fn probe_of_one_level(level: f64, memory: f64, streaming: f64, handoff: f64) -> Probe {
    Probe {
        caches: vec![rates(10.0 * level, 20.0 * level)],
        memory: rates(4.0 * memory, 5.0 * memory),
        streaming: rates(6.0 * streaming, 7.0 * streaming),
        handoff_gbs: 8.0 * handoff,
    }
}

#[test]
fn a_probe_scales_each_regime_by_its_own_ratio() {
    // One rank, a cache level of 1 MiB (copy 20), memory (copy 5) and
    // streaming from 2 MiB (copy 8), fitted beside a probe; a later probe
    // twice as fast in the cache, 3x in memory and half as fast streaming.
    let mut c = cached(1, 1 << 20, 40.0, 20.0);
    c.streaming = streams_from(2 << 20);
    c.probe = Some(probe_of_one_level(1.0, 1.0, 1.0, 1.0));
    let now = probe_of_one_level(2.0, 3.0, 0.5, 1.0);
    let calibrated = c.calibrate(&now).unwrap();
    copies_at(
        &calibrated,
        &[(256 << 10, 40.0), (768 << 10, 15.0), (4 << 20, 4.0)],
    );
    assert_eq!(calibrated.probe, Some(now));
    // Reductions by the reduction ratio: two ranks whose reduce-scatter
    // (free links) reduces one block at the level's rate, 40 then 80.
    let count = 1 << 14;
    let mut two = cached(2, 1 << 20, 40.0, 20.0);
    two.probe = Some(probe_of_one_level(1.0, 1.0, 1.0, 1.0));
    let calibrated = two
        .calibrate(&probe_of_one_level(2.0, 1.0, 1.0, 1.0))
        .unwrap();
    let r = ring_in_one_chunk(&calibrated, CollKind::ReduceScatter, count);
    close(r.time_us, (count * 4) as f64 / (80.0 * 1e3), 1e-6);
    // A sender that copies: the traffic between the cores by the
    // hand-off's ratio, T = S/(min(port, copy) x 0.5) + L, 10 -> 5 GB/s.
    let lat = 3.0;
    let mut sender = copied_by_sender(2, 10.0, 1e9, 1e9, lat);
    sender.caches = vec![Cache {
        bytes: 1 << 30,
        reduce_gbs: 1e9,
        copy_gbs: 1e9,
    }];
    sender.probe = Some(probe_of_one_level(1.0, 1.0, 1.0, 1.0));
    let calibrated = sender
        .calibrate(&probe_of_one_level(1.0, 1.0, 1.0, 0.5))
        .unwrap();
    let intra = calibrated.intra.unwrap();
    assert_eq!((intra.port_gbs, intra.handoff_scale), (10.0, 0.5));
    let r = ring_in_one_chunk(&calibrated, CollKind::ReduceScatter, count);
    close(r.time_us, (count * 4) as f64 / (5.0 * 1e3) + lat, 1e-6);
    // And the receiver's pass over it, while a rank's copy into its own
    // buffer keeps its rate: a two-rank all-gather at copy rate C takes
    // S/(0.5 C) to send, S/C to copy its own block, S/(0.5 C) to copy the
    // peer's out: T = 5 S/C.
    let copy = 10.0;
    sender.caches[0].copy_gbs = copy;
    let calibrated = sender
        .calibrate(&probe_of_one_level(1.0, 1.0, 1.0, 0.5))
        .unwrap();
    let r = ring_in_one_chunk(&calibrated, CollKind::AllGather, count);
    close(r.time_us, 5.0 * (count * 4) as f64 / (copy * 1e3), 1e-6);
}

#[test]
fn calibrating_needs_a_matching_probe() {
    // The preset's own probe changes nothing.
    let local = cluster::local(2, false);
    assert_eq!(local.calibrate(&cluster::local_probe()).unwrap(), local);
    // A cluster of datasheet figures records no probe.
    let e = cluster::h100(1)
        .calibrate(&cluster::local_probe())
        .unwrap_err();
    assert!(e.to_string().contains("records no probe"), "{e}");
    assert!(!cluster::h100(1).to_json().contains("probe"));
    // A probe of another cache count, or of a rate that is not positive.
    let e = local
        .calibrate(&probe_of_one_level(1.0, 1.0, 1.0, 1.0))
        .unwrap_err();
    assert!(
        e.to_string().contains("1 cache levels, the cluster 2"),
        "{e}"
    );
    let mut zero = cluster::local_probe();
    zero.memory.copy_gbs = 0.0;
    let e = local.calibrate(&zero).unwrap_err();
    assert!(e.to_string().contains("rates must be positive"), "{e}");
    // The median of several probes, rate by rate.
    let probes = [
        probe_of_one_level(1.0, 3.0, 1.0, 2.0),
        probe_of_one_level(2.0, 1.0, 0.5, 1.0),
        probe_of_one_level(4.0, 2.0, 0.25, 8.0),
    ];
    let median = Probe::median(&probes).unwrap();
    assert_eq!(median, probe_of_one_level(2.0, 2.0, 0.5, 2.0));
    let median = Probe::median(&probes[..2]).unwrap();
    assert_eq!(median, probe_of_one_level(1.5, 2.0, 0.75, 1.5));
    assert_eq!(
        Probe::median([&local_probe_without_levels(), &cluster::local_probe()]),
        None
    );
    assert_eq!(Probe::median([]), None);
}

fn local_probe_without_levels() -> Probe {
    Probe {
        caches: Vec::new(),
        ..cluster::local_probe()
    }
}

#[test]
fn a_placement_shapes_the_cluster() {
    let base = cluster::local(1, false);
    // Default blocks: no explicit placement, so folding stays available.
    let blocks = base.with_placement(&[0, 0, 0, 1, 1, 1]);
    assert_eq!((blocks.hosts, blocks.ranks_per_host), (2, 3));
    assert_eq!(blocks.placement, None);
    assert_eq!(blocks.host_of(), vec![0, 0, 0, 1, 1, 1]);
    // Uneven or interleaved: kept as given.
    for host_of in [vec![0, 0, 0, 1], vec![0, 1, 0, 1]] {
        let c = base.with_placement(&host_of);
        assert_eq!(c.hosts, 2);
        assert_eq!(c.ranks_per_host, if host_of[1] == 0 { 3 } else { 2 });
        assert_eq!(c.host_of(), host_of);
        c.validate().unwrap();
    }
    // One host: the preset itself.
    assert_eq!(base.with_placement(&[0; 4]), cluster::local(4, false));
    // Everything else is kept.
    let shaped = cluster::h100(1).with_placement(&[0, 0, 1, 1]);
    assert_eq!(shaped.nic, cluster::h100(1).nic);
    assert_eq!(shaped.nranks(), 4);
}

#[test]
fn the_table_follows_nccl_tests() {
    let c = cluster::h100(1);
    let r = run(
        &c,
        CollKind::AllGather,
        1 << 16,
        "ring",
        default_params(
            &c,
            &CollSpec {
                kind: CollKind::AllGather,
                nranks: 8,
                root: 0,
                count: 1 << 16,
            },
            4,
            Protocol::Simple,
        ),
    );
    assert_eq!(r.size_bytes, 8 * (1 << 16) * 4);
    let row = report::Row {
        size: r.size_bytes,
        count: report::count_column(CollKind::AllGather, 1 << 16, 8),
        dtype: "float".into(),
        redop: "none".into(),
        root: -1,
        result: r,
    };
    let line = report::line(&row);
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols.len(), 9, "{line}");
    assert_eq!(cols[0], "2097152");
    assert_eq!(cols[1], "524288");
    let json = report::json("h100", CollKind::AllGather, 8, &[row]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["rows"][0]["size"], 2097152);
    assert!(v["rows"][0]["busbw"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_message_ready_late_does_not_hold_a_link_against_earlier_ones() {
    // Across 2 hosts of 8 the tree's chains move what the ring moves
    // through each rank's port; with 16 channels, forwarded pieces whose
    // input is still arriving must not keep other channels' ready pieces
    // off the link, or the tree falls to about half the ring's busbw.
    let c = cluster::h100(2);
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 16,
        root: 0,
        count: 64 << 20,
    };
    let p = default_params(&c, &spec, 4, Protocol::Simple);
    assert_eq!(p.nchannels, 16);
    let ring = simulate(&c, &spec, 4, &Ring, Protocol::Simple, &p).unwrap();
    let tree = simulate(&c, &spec, 4, builtin("tree").unwrap(), Protocol::Simple, &p).unwrap();
    assert!(
        tree.time_us < 1.15 * ring.time_us,
        "tree {} us against ring {} us",
        tree.time_us,
        ring.time_us
    );
}

#[test]
fn a_tree_across_hosts_keeps_every_rail_busy() {
    // 8 H100 hosts, 16 channels on 8 rails: with tree 0 on channels 0-7
    // and tree 1 on 8-15, a host interior in one channel's tree is a leaf
    // in its rail partner's, so every NIC moves what the ring's does each
    // way: 2 x 2(n-1)/n x S/16 per rail. With the reductions going up and
    // the results coming down at once and the senders not waiting on the
    // receivers' ports, the tree comes within 15% of that bound at 256
    // MiB (with both trees on every channel, one phase after the other,
    // and senders held until their message had crossed, it took 2.1x).
    let c = cluster::h100(8);
    let bytes = 256usize << 20;
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 64,
        root: 0,
        count: bytes / 4,
    };
    let base = default_params(&c, &spec, 4, Protocol::Simple);
    assert_eq!(base.nchannels, 16);
    let tree = builtin("tree").unwrap();
    let p = rccl_simulator::tune::params_for(
        tree,
        &rccl_algorithms::Topology::from_hosts(c.host_of()),
        &spec,
        4,
        base,
    );
    let nic = c.nic.gbit / 8.0 * c.nic.efficiency * 1e3;
    let bound = 2.0 * 2.0 * 63.0 / 64.0 * bytes as f64 / 16.0 / nic;
    let t = simulate(&c, &spec, 4, tree, Protocol::Simple, &p).unwrap();
    assert!(
        t.time_us < 1.15 * bound,
        "tree {} us against the rails' {bound} us",
        t.time_us
    );
}
