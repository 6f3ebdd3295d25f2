//! The engine's deterministic mode as `tune` costs it: over a grid of
//! collectives, sizes and clusters, the pick for a reducing collective is
//! the ordered ring, or one-shot through the board for an all-reduce that
//! fits it, and costs what the ordered ring's form says; the collectives
//! that do not reduce are picked as without the mode; without it some
//! picks are neither; and the engine's own tuner picks the same. The
//! ordered ring's replay is the ring's on hosts of consecutive ranks,
//! and folds as exactly.

use rccl::tuning::{choose, LinkModel, Placement};
use rccl_algorithms::{Algorithm, CollKind, CollSpec, OrderedRing, Params, Ring, Topology};
use rccl_simulator::estimate::estimate_us;
use rccl_simulator::tune::{
    engine_candidates, engine_choice, engine_choice_with, engine_cluster, EngineConfig,
};
use rccl_simulator::{algorithm, cluster, simulate, simulate_with, ClusterSpec, SimOptions};

const DETERMINISTIC: EngineConfig = EngineConfig {
    deterministic: true,
    board_bytes: EngineConfig::BOARD_BYTES,
};

/// The engine's cluster with its measured link figures.
fn engine(hosts: usize, ranks_per_host: usize, rails: usize) -> ClusterSpec {
    engine_cluster(
        &Topology::blocks(hosts, ranks_per_host),
        &LinkModel::MEASURED.links(rails),
    )
}

fn spec(c: &ClusterSpec, kind: CollKind, bytes: usize) -> CollSpec {
    let n = c.nranks();
    let count = match kind {
        CollKind::AllGather | CollKind::ReduceScatter => bytes / 4 / n,
        _ => bytes / 4,
    };
    CollSpec {
        kind,
        nranks: n,
        root: 0,
        count: count.max(1),
    }
}

fn clusters() -> Vec<ClusterSpec> {
    vec![
        engine(1, 2, 1),
        engine(1, 8, 1),
        engine(4, 1, 1),
        engine(8, 8, 2),
        engine(64, 8, 8),
        cluster::local(4, false),
        cluster::local(4, true),
        cluster::h100(1),
        cluster::h100(16),
    ]
}

const REDUCING: [CollKind; 3] = [
    CollKind::AllReduce,
    CollKind::ReduceScatter,
    CollKind::Reduce,
];

#[test]
fn the_deterministic_pick_is_the_ordered_ring_or_the_board_at_its_cost() {
    let mut differs_without = 0;
    let mut on_board = 0;
    for c in clusters() {
        for kind in REDUCING {
            for bytes in (3..=28).step_by(3).map(|s| 1usize << s) {
                let spec = spec(&c, kind, bytes);
                let shape = format!("{} x{} {} {bytes} B", c.name, c.hosts, kind.name());
                let d = engine_choice_with(&c, &spec, 4, &DETERMINISTIC).expect("a pick");
                let fits = kind == CollKind::AllReduce
                    && c.all_intra()
                    && spec.count * 4 <= EngineConfig::BOARD_BYTES;
                let name = d.algorithm.name();
                assert_eq!(name == "oneshot", fits, "{shape}: the board iff it fits");
                if fits {
                    on_board += 1;
                } else {
                    assert_eq!(name, OrderedRing.name(), "{shape}");
                    // Its cost is the ordered ring's form, which is the ring's.
                    let form = |a: &str| estimate_us(&c, a, &spec, 4, d.protocol, &d.params);
                    assert_eq!(Some(d.estimate_us), form("ordered_ring"), "{shape}");
                    assert_eq!(form("ordered_ring"), form("ring"), "{shape}");
                }
                let free = engine_choice(&c, &spec, 4).expect("a pick");
                if free.algorithm.name() != name {
                    differs_without += 1;
                }
            }
        }
    }
    // Small all-reduces within a host go to the board; without the mode
    // tree, halving-doubling, hier or the ring win many shapes.
    assert!(on_board > 0);
    assert!(differs_without > 20, "{differs_without} picks differ");
}

#[test]
fn collectives_that_do_not_reduce_are_picked_as_without_the_mode() {
    for c in clusters() {
        for kind in [CollKind::AllGather, CollKind::Broadcast, CollKind::AllToAll] {
            for bytes in [1 << 10, 1 << 20, 64 << 20] {
                let spec = spec(&c, kind, bytes);
                let (d, free) = (
                    engine_choice_with(&c, &spec, 4, &DETERMINISTIC).expect("a pick"),
                    engine_choice(&c, &spec, 4).expect("a pick"),
                );
                assert_eq!(d.algorithm.name(), free.algorithm.name());
                assert_eq!((d.protocol, d.params), (free.protocol, free.params));
            }
        }
    }
}

#[test]
fn no_board_leaves_the_ordered_ring_alone() {
    let c = cluster::local(4, false);
    let spec = spec(&c, CollKind::AllReduce, 64);
    let with = engine_candidates(&c, &spec, 4, &DETERMINISTIC);
    let names: Vec<&str> = with.iter().map(|a| a.name()).collect();
    assert_eq!(names, ["oneshot"], "the board alone");
    let without = EngineConfig {
        board_bytes: 0,
        ..DETERMINISTIC
    };
    let d = engine_choice_with(&c, &spec, 4, &without).expect("a pick");
    assert_eq!(d.algorithm.name(), OrderedRing.name());
    // Past the board's size, and across hosts, the ring only.
    let large = CollSpec {
        count: EngineConfig::BOARD_BYTES / 4 + 1,
        ..spec
    };
    assert_eq!(engine_candidates(&c, &large, 4, &DETERMINISTIC).len(), 1);
    let h = engine(2, 2, 1);
    assert_eq!(
        engine_candidates(
            &h,
            &self::spec(&h, CollKind::AllReduce, 64),
            4,
            &DETERMINISTIC
        )
        .len(),
        1
    );
}

#[test]
fn the_engine_picks_what_the_simulator_picks_in_the_deterministic_mode() {
    let config = rccl::Config {
        deterministic: true,
        ..rccl::Config::default()
    };
    for (hosts, ranks) in [(1, 2), (1, 4), (1, 8), (2, 4), (8, 1)] {
        let topology = Topology::blocks(hosts, ranks);
        let c = engine(hosts, ranks, 1);
        let all_shm = hosts == 1;
        let placement = Placement {
            all_shm,
            topology: &topology,
            in_place: false,
            board_bytes: if all_shm { config.board_bytes } else { 0 },
            model: &LinkModel::MEASURED,
            rails: 1,
            tuner: None,
        };
        for kind in REDUCING {
            for bytes in (3..=24).step_by(3).map(|s| 1usize << s) {
                let spec = spec(&c, kind, bytes);
                let ours = engine_choice_with(&c, &spec, 4, &DETERMINISTIC).expect("a pick");
                let theirs = choose(&config, &spec, 4, &placement).expect("a pick");
                assert_eq!(
                    ours.algorithm.name(),
                    theirs.algorithm.name(),
                    "{hosts} x {ranks}, {} {bytes} B",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn the_ordered_ring_replays_as_the_ring_and_folds_exactly() {
    assert_eq!(
        algorithm("ORDERED_RING").map(|a| a.name()),
        Some("ordered_ring")
    );
    // 4 hosts of 4 on 2 rails: the index-order ring crosses each host
    // boundary once per channel, as the ring does.
    let c = engine(4, 4, 2);
    let params = Params {
        nchannels: 4,
        chunk_elems: 1 << 14,
    };
    let full = SimOptions {
        fold_ranks: false,
        fold_channels: false,
    };
    for kind in [CollKind::AllReduce, CollKind::ReduceScatter] {
        // Even over 16 ranks and 4 channels, so the replay folds ranks.
        let spec = spec(&c, kind, 16 << 20);
        let proto = rccl_simulator::Protocol::Simple;
        let ordered = simulate(&c, &spec, 4, &OrderedRing, proto, &params).unwrap();
        let ring = simulate(&c, &spec, 4, &Ring, proto, &params).unwrap();
        let exact = simulate_with(&c, &spec, 4, &OrderedRing, proto, &params, full).unwrap();
        assert!(ordered.ranks_replayed < 16, "{}", kind.name());
        let rel = |a: f64, b: f64| (a - b).abs() / b;
        assert!(
            rel(ordered.time_us, exact.time_us) < 1e-4,
            "{} folded {} us, full {} us",
            kind.name(),
            ordered.time_us,
            exact.time_us
        );
        assert!(
            rel(ordered.time_us, ring.time_us) < 0.02,
            "{} ordered {} us, ring {} us",
            kind.name(),
            ordered.time_us,
            ring.time_us
        );
        // On 8 channels the replay runs one period of 4 at half the rate,
        // as close to the unfolded replay as the ring's.
        let eight = Params {
            nchannels: 8,
            ..params
        };
        let ranks_only = SimOptions {
            fold_ranks: true,
            fold_channels: false,
        };
        let miss = |a: &dyn Algorithm| {
            let folded = simulate(&c, &spec, 4, a, proto, &eight).unwrap();
            let exact = simulate_with(&c, &spec, 4, a, proto, &eight, ranks_only).unwrap();
            rel(folded.time_us, exact.time_us)
        };
        let (ordered, ring) = (miss(&OrderedRing), miss(&Ring));
        assert!(
            ordered <= ring.max(0.01),
            "{} {ordered} {ring}",
            kind.name()
        );
    }
}
