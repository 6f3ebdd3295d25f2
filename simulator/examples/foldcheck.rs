use rccl_algorithms::{builtin, CollKind, CollSpec};
use rccl_simulator::{cluster, default_params, simulate_with, Protocol, SimOptions};
fn main() {
    let mut c = cluster::h100(8);
    c.fabric.hosts_per_leaf = 2;
    c.fabric.oversubscription = 2.0;
    for (algo, kind) in [("ring", CollKind::AllReduce), ("ring", CollKind::AllGather), ("hier", CollKind::AllReduce), ("hier", CollKind::ReduceScatter), ("tree", CollKind::AllReduce)] {
        let spec = CollSpec { kind, nranks: 64, root: 0, count: 8 << 20 };
        let p = default_params(&c, &spec, 4, Protocol::Simple);
        for (fr, fc) in [(false, false), (true, false), (false, true), (true, true)] {
            let r = simulate_with(&c, &spec, 4, builtin(algo).unwrap(), Protocol::Simple, &p, SimOptions { fold_ranks: fr, fold_channels: fc }).unwrap();
            println!("{algo} {:?} ranks {fr} ch {fc}: {:.1} us (nch {})", kind, r.time_us, p.nchannels);
        }
    }
}
