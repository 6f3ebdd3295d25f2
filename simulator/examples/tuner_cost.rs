//! What the engine's tuner spends replaying its candidates across hosts:
//! per call size, on hosts of 8 ranks with 8 rails and this machine's
//! figures (`tune::engine_cluster`), the time `tune::fastest` takes to
//! replay ring, tree and hier.
//!
//! `cargo run --release -p rccl-simulator --example tuner_cost [HOSTS...]`

use rccl_algorithms::{builtin, CollKind, CollSpec, Params, Topology};
use rccl_simulator::tune::{engine_cluster, fastest, params_for, Candidate, EngineLinks};
use rccl_simulator::Protocol;

fn main() {
    let hosts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let hosts = if hosts.is_empty() {
        vec![2, 4, 8, 16]
    } else {
        hosts
    };
    let links = EngineLinks {
        shm_gbs: 5.0,
        shm_latency_us: 1.0,
        nic_gbs: 1.0,
        nic_latency_us: 40.0,
        rails: 8,
    };
    println!("| hosts x 8 | size | channels | pick | tuner's time (ms) |");
    println!("|---|---|---|---|---|");
    for &h in &hosts {
        let topo = Topology::blocks(h, 8);
        let cluster = engine_cluster(&topo, &links);
        for shift in [10usize, 16, 20, 24, 28] {
            let bytes = 1usize << shift;
            let spec = CollSpec {
                kind: CollKind::AllReduce,
                nranks: h * 8,
                root: 0,
                count: bytes / 4,
            };
            // As the engine's tuner: one channel per 512 KiB, on a
            // multiple of the rails, at most 16; half a 4 MiB FIFO.
            let wanted = (bytes >> 19).max(1);
            let nchannels = if wanted >= 8 {
                wanted.next_multiple_of(8)
            } else {
                wanted
            }
            .min(16);
            let base = Params {
                nchannels,
                chunk_elems: (2 << 20) / 4,
            };
            let names = ["ring", "tree", "hier"];
            let tried: Vec<Candidate<'_>> = names
                .iter()
                .map(|a| Candidate {
                    algorithm: builtin(a).unwrap(),
                    protocol: Protocol::Simple,
                    params: params_for(builtin(a).unwrap(), &topo, &spec, 4, base),
                })
                .collect();
            let start = std::time::Instant::now();
            let ranking = fastest(&cluster, &spec, 4, &tried);
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let pick = ranking.best.map_or("-", |b| names[b]);
            println!("| {h} | {bytes} | {nchannels} | {pick} | {ms:.1} |");
        }
    }
}
