//! The tuner's closed forms against the replay they stand for: over a grid
//! of shapes, what `tune::engine_choice` picks replays within 5% of the
//! fastest candidate's replay in every shape (the misses are listed when
//! the test fails; `cargo test ... -- --nocapture` prints the count and
//! the worst). The reference is the replay without channel folding
//! ([`EXACT`]).
//!
//! The grid: all-reduce, broadcast, all-gather and reduce-scatter (the
//! collectives with more than one built-in algorithm; the others have a
//! single candidate); sizes 8 B to 512 MiB by factors of 4 (the next,
//! 2 GiB, is past what a replay may move); on the engine's own cluster
//! (`engine_cluster` with the measured link figures) 1, 2, 3, 4, 5, 6, 8,
//! 12, 16, 32, 64, 256 and 1024 hosts of one rank on one rail, and 1, 2,
//! 4, 8, 16, 32 and 64 hosts of 8 ranks on 1, 2 or 8 rails; on the `h100`
//! preset the same counts of hosts of 8 ranks and 8 rails; and all-reduce
//! alone on 128 and 1,024 hosts of 8 ranks, of the engine's cluster on 8
//! rails and of the `h100` preset.
//! Left out, so that the test runs in a few minutes (the closed forms
//! themselves are cheap at any scale, `benches/tuner.rs`): shapes whose
//! replays would move more than 1 GiB in all (past 128 MiB on 8 ranks,
//! 1 MiB on 1,024, 128 KiB on 8,192); broadcast, all-gather and
//! reduce-scatter on 128 hosts of 8 ranks and more (hier's all-gather on
//! 8,192 ranks replays for minutes); and one-shot's replay above 1,024
//! ranks, where its closed form must be more than twice the pick's
//! ([`ONE_SHOT_REPLAYED_UP_TO`]).

use std::sync::atomic::{AtomicUsize, Ordering};

use rccl_algorithms::{builtins, CollKind, CollSpec, Params, Topology};
use rccl_simulator::estimate::estimate_us;
use rccl_simulator::tune::{engine_choice, engine_cluster, params_for, EngineLinks};
use rccl_simulator::{cluster, default_params, simulate_with, ClusterSpec, Protocol, SimOptions};

/// The replay without channel folding, which is up to 8% slow where
/// channels sharing a NIC would interleave (`docs/SIMULATOR.md`); rank
/// folding is exact.
const EXACT: SimOptions = SimOptions {
    fold_ranks: true,
    fold_channels: false,
};

/// Above this many ranks one-shot's replay (every rank sends to every
/// other, so the square of the ranks in messages) takes minutes: 2 s on
/// 1,024 ranks, about 64 times that on 8,192. There its closed form, which
/// agrees with its replay within 0.1% up to 1,024 ranks, must be more than
/// twice the pick's, so that one-shot cannot be within 5% of the fastest
/// and the pick is never a candidate left unreplayed.
const ONE_SHOT_REPLAYED_UP_TO: usize = 1024;

/// The engine's measured link figures (`LinkModel::MEASURED`).
fn engine(hosts: usize, ranks_per_host: usize, rails: usize) -> ClusterSpec {
    engine_cluster(
        &Topology::blocks(hosts, ranks_per_host),
        &EngineLinks {
            shm_gbs: 5.0,
            shm_latency_us: 1.0,
            nic_gbs: 1.0,
            nic_latency_us: 40.0,
            rails,
        },
    )
}

/// How much slower the pick's replay is than the fastest candidate's, or
/// `None` where the shape is too large to replay here.
fn loss(c: &ClusterSpec, kind: CollKind, bytes: usize) -> Option<(f64, String)> {
    let n = c.nranks();
    if bytes.saturating_mul(n) > 1 << 30 {
        return None;
    }
    let count = match kind {
        CollKind::AllGather | CollKind::ReduceScatter => bytes / 4 / n,
        _ => bytes / 4,
    }
    .max(1);
    let spec = CollSpec {
        kind,
        nranks: n,
        root: 0,
        count,
    };
    let choice = engine_choice(c, &spec, 4).expect("a built-in implements it");
    let topo = Topology::from_hosts(c.host_of());
    let protocols: &[Protocol] = if c.all_intra() {
        &Protocol::ALL
    } else {
        &[Protocol::Simple]
    };
    let mut best = (f64::MAX, String::new());
    let mut picked = None;
    for &algorithm in builtins()
        .iter()
        .filter(|a| a.supports(kind) && a.supports_topology(&topo))
    {
        for &protocol in protocols {
            let base = Params {
                nchannels: choice.params.nchannels,
                ..default_params(c, &spec, 4, protocol)
            };
            let params = params_for(algorithm, &topo, &spec, 4, base);
            if n > ONE_SHOT_REPLAYED_UP_TO && algorithm.name() == "oneshot" {
                let form = estimate_us(c, "oneshot", &spec, 4, protocol, &params)
                    .expect("one-shot has a form");
                assert!(
                    form > 2.0 * choice.estimate_us,
                    "one-shot's form {form:.1} us is near the pick's {:.1} us: replay it",
                    choice.estimate_us
                );
                continue;
            }
            let Ok(r) = simulate_with(c, &spec, 4, algorithm, protocol, &params, EXACT) else {
                continue;
            };
            let name = format!("{}/{}", algorithm.name(), protocol.name());
            if algorithm.name() == choice.algorithm.name() && protocol == choice.protocol {
                assert_eq!(params, choice.params, "{name}");
                picked = Some((r.time_us, name.clone()));
            }
            if r.time_us < best.0 {
                best = (r.time_us, name);
            }
        }
    }
    let Some((time, name)) = picked else {
        return Some((
            f64::INFINITY,
            format!(
                "{}/{} does not replay",
                choice.algorithm.name(),
                choice.protocol.name()
            ),
        ));
    };
    Some((
        time / best.0 - 1.0,
        format!("{name} {time:.1} us, fastest {} {:.1} us", best.1, best.0),
    ))
}

#[test]
fn the_closed_forms_pick_near_the_fastest_replay() {
    let every_kind = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::AllGather,
        CollKind::ReduceScatter,
    ];
    let mut clusters = Vec::new();
    for hosts in [1, 2, 4, 8, 16, 32, 64, 256, 1024] {
        clusters.push((engine(hosts, 1, 1), &every_kind[..]));
        if hosts <= 64 {
            for rails in [1, 2, 8] {
                clusters.push((engine(hosts, 8, rails), &every_kind[..]));
            }
            clusters.push((cluster::h100(hosts), &every_kind[..]));
        }
    }
    for hosts in [3, 5, 6, 12] {
        clusters.push((engine(hosts, 1, 1), &every_kind[..]));
    }
    for hosts in [128, 1024] {
        clusters.push((engine(hosts, 8, 8), &[CollKind::AllReduce][..]));
        clusters.push((cluster::h100(hosts), &[CollKind::AllReduce][..]));
    }
    // Every shape replays on its own: the machine's cores take the next
    // one until none is left.
    let grid: Vec<(&ClusterSpec, CollKind, usize)> = clusters
        .iter()
        .flat_map(|(c, kinds)| {
            kinds.iter().flat_map(move |&kind| {
                (3..=30)
                    .step_by(2)
                    .map(move |shift| (c, kind, 1usize << shift))
            })
        })
        .collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let results: Vec<(f64, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut results = Vec::new();
                    while let Some(&(c, kind, bytes)) =
                        grid.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        if let Some((loss, what)) = loss(c, kind, bytes) {
                            let shape = format!(
                                "{} {} hosts x {} ({} rails), {} {bytes} B",
                                c.name,
                                c.hosts,
                                c.ranks_per_host,
                                c.rails(),
                                kind.name(),
                            );
                            results.push((loss, format!("{shape}: {what}")));
                        }
                    }
                    results
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a worker panicked"))
            .collect()
    });
    let shapes = results.len();
    let worst = results.iter().map(|r| r.0).fold(0.0, f64::max);
    let misses: Vec<String> = results
        .iter()
        .filter(|(loss, _)| *loss > 0.05)
        .map(|(loss, what)| format!("{what} (+{:.1}%)", loss * 100.0))
        .collect();
    let report = format!(
        "{} of {shapes} shapes more than 5% slower than the fastest, the worst +{:.0}%:\n{}",
        misses.len(),
        worst * 100.0,
        misses.join("\n")
    );
    println!("{report}");
    assert!(shapes > 1900, "{shapes} shapes replayed");
    assert!(misses.is_empty(), "{report}");
}
