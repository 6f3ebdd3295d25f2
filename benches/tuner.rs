//! The tuner's first decision for a call shape (what a communicator pays
//! before it remembers the choice): an all-reduce across hosts of 8 ranks
//! and 8 rails, 1 KiB and 256 MiB, at 128 and 1,024 hosts. The closed
//! forms decide; no replay runs on the call path.
//!
//! Run with `cargo bench --bench tuner`.

#![deny(unsafe_op_in_unsafe_fn)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rccl::tuning::{choose, LinkModel, Placement};
use rccl::Config;
use rccl_algorithms::{CollKind, CollSpec, Topology};

fn first_decision(c: &mut Criterion) {
    let config = Config {
        max_channels: 16,
        ..Config::default()
    };
    let model = LinkModel::MEASURED;
    let mut group = c.benchmark_group("tuner_first_decision");
    for hosts in [128usize, 1024] {
        let topology = Topology::from_hosts((0..hosts * 8).map(|r| r / 8).collect());
        let placement = Placement {
            all_shm: false,
            topology: &topology,
            in_place: false,
            board_bytes: 0,
            model: &model,
            rails: 8,
            tuner: None,
        };
        for bytes in [1usize << 10, 256 << 20] {
            let spec = CollSpec {
                kind: CollKind::AllReduce,
                nranks: hosts * 8,
                root: 0,
                count: bytes / 4,
            };
            group.bench_with_input(
                BenchmarkId::new(format!("all_reduce_{hosts}x8"), bytes),
                &spec,
                |b, spec| b.iter(|| choose(&config, spec, 4, &placement).expect("a choice")),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, first_decision);
criterion_main!(benches);
