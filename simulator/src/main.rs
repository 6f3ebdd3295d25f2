//! `rccl-sim`: replay a collective on a modeled cluster and print
//! nccl-tests' table (and optionally JSON).

#![deny(unsafe_op_in_unsafe_fn)]

use std::process::ExitCode;

use clap::Parser;
use rccl_algorithms::{CollKind, CollSpec, Params, Topology};
use rccl_simulator::cluster::{self, DegradedLink, LinkKind, SlowRank};
use rccl_simulator::probe::Probe;
use rccl_simulator::report::{self, Row};
use rccl_simulator::tune::{engine_candidates, engine_choice_with, params_for, EngineConfig};
use rccl_simulator::{algorithm, default_params, simulate, size_bytes, ClusterSpec, Protocol};

#[derive(Parser, Debug)]
#[command(
    name = "rccl-sim",
    about = "Simulate rccl-rs collectives on a modeled cluster"
)]
struct Args {
    /// Cluster: a preset (h100, local-shm, local-tcp) or a JSON file.
    #[arg(long, default_value = "h100")]
    cluster: String,
    /// Hosts (presets, local-* included; overrides a file's value).
    #[arg(long)]
    hosts: Option<usize>,
    /// Ranks per host (presets local-*: the rank count; overrides a file's).
    #[arg(long)]
    ranks_per_host: Option<usize>,
    /// Collective: all_reduce, all_gather, reduce_scatter, broadcast,
    /// reduce, alltoall, gather, scatter.
    #[arg(long, default_value = "all_reduce")]
    coll: String,
    /// Algorithm (ring, tree, rhd, hier, oneshot, direct, ordered_ring);
    /// default: the engine's tuner's choice for this cluster.
    #[arg(long)]
    algo: Option<String>,
    /// As the engine's deterministic mode (NCCL_DETERMINISTIC=1): reducing
    /// collectives run the ordered ring or, for all-reduces that fit the
    /// board, one-shot; --algo must name that one.
    #[arg(long)]
    deterministic: bool,
    /// Protocol (LL, LL128, Simple); default as the engine's tuner.
    #[arg(long)]
    proto: Option<String>,
    /// Channels (default as the engine's tuner).
    #[arg(long)]
    nchannels: Option<usize>,
    /// Pipeline chunk in bytes (default as the engine's tuner: half a
    /// FIFO, the tree's shrunk with its depth).
    #[arg(long)]
    chunk_bytes: Option<usize>,
    /// Smallest size, bytes (K, M, G suffixes).
    #[arg(short = 'b', long, default_value = "64K", value_parser = parse_size)]
    minbytes: usize,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "256M", value_parser = parse_size)]
    maxbytes: usize,
    /// Size multiplier between rows.
    #[arg(short = 'f', long, default_value = "4")]
    stepfactor: usize,
    /// Element size in bytes (4: float).
    #[arg(long, default_value = "4")]
    elem_size: usize,
    /// A slow rank: RANK:COMPUTE_FACTOR[:LINK_FACTOR] (repeatable).
    #[arg(long)]
    slow_rank: Vec<String>,
    /// A degraded link: RANK:intra|nic:FACTOR (repeatable).
    #[arg(long)]
    degrade: Vec<String>,
    /// NIC line rate, Gb/s (overrides the cluster's).
    #[arg(long)]
    nic_gbit: Option<f64>,
    /// Fraction of the NIC line rate a transfer achieves (overrides).
    #[arg(long)]
    nic_efficiency: Option<f64>,
    /// NIC-to-NIC one-way latency per message, µs (overrides).
    #[arg(long)]
    nic_latency_us: Option<f64>,
    /// Scale the cluster's host rates to the machine's speed now: a file
    /// holding a probe's JSON (the probe_local example, run beside the
    /// measurement to predict); repeated, the median of each rate over
    /// the probes. The cluster must record the probe its rates were
    /// fitted beside, as local-shm does.
    #[arg(long)]
    probe: Vec<String>,
    /// Placement: a file holding a JSON array of host per rank.
    #[arg(long)]
    placement: Option<String>,
    /// Write the results as JSON to this file.
    #[arg(short = 'J', long)]
    json: Option<String>,
    /// Print the cluster description as JSON and exit.
    #[arg(long)]
    dump_cluster: bool,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|v| v * mult)
        .map_err(|e| format!("{s}: {e}"))
}

fn kind_of(name: &str) -> Option<CollKind> {
    Some(match name.to_ascii_lowercase().replace('-', "_").as_str() {
        "all_reduce" | "allreduce" => CollKind::AllReduce,
        "all_gather" | "allgather" => CollKind::AllGather,
        "reduce_scatter" | "reducescatter" => CollKind::ReduceScatter,
        "broadcast" => CollKind::Broadcast,
        "reduce" => CollKind::Reduce,
        "alltoall" | "all_to_all" => CollKind::AllToAll,
        "gather" => CollKind::Gather,
        "scatter" => CollKind::Scatter,
        _ => return None,
    })
}

fn build_cluster(a: &Args) -> Result<ClusterSpec, String> {
    let mut c = match cluster::preset(
        &a.cluster,
        a.hosts.unwrap_or(1),
        a.ranks_per_host.unwrap_or(2),
    ) {
        Some(c) => c,
        None => {
            let text = std::fs::read_to_string(&a.cluster)
                .map_err(|e| format!("{}: {e} (presets: h100, local-shm, local-tcp)", a.cluster))?;
            let mut c = ClusterSpec::from_json(&text).map_err(|e| e.to_string())?;
            if let Some(m) = a.ranks_per_host {
                c.ranks_per_host = m;
            }
            c
        }
    };
    if let Some(h) = a.hosts {
        c.hosts = h;
    }
    if let Some(g) = a.nic_gbit {
        c.nic.gbit = g;
    }
    if let Some(e) = a.nic_efficiency {
        c.nic.efficiency = e;
    }
    if let Some(l) = a.nic_latency_us {
        c.nic.latency_us = l;
    }
    if let Some(path) = &a.placement {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        c.placement = Some(serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?);
    }
    let num = |s: &str| s.parse::<f64>().map_err(|e| format!("{s}: {e}"));
    for s in &a.slow_rank {
        let f: Vec<&str> = s.split(':').collect();
        if f.len() < 2 {
            return Err(format!("--slow-rank {s}: want RANK:COMPUTE[:LINK]"));
        }
        c.faults.slow_ranks.push(SlowRank {
            rank: f[0].parse().map_err(|e| format!("{s}: {e}"))?,
            compute_factor: num(f[1])?,
            link_factor: f.get(2).map_or(Ok(1.0), |x| num(x))?,
        });
    }
    for s in &a.degrade {
        let f: Vec<&str> = s.split(':').collect();
        if f.len() != 3 {
            return Err(format!("--degrade {s}: want RANK:intra|nic:FACTOR"));
        }
        c.faults.degraded_links.push(DegradedLink {
            rank: f[0].parse().map_err(|e| format!("{s}: {e}"))?,
            link: match f[1] {
                "intra" => LinkKind::Intra,
                "nic" => LinkKind::Nic,
                x => return Err(format!("--degrade {s}: unknown link {x}")),
            },
            factor: num(f[2])?,
        });
    }
    if !a.probe.is_empty() {
        let probes = a
            .probe
            .iter()
            .map(|path| {
                let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
                Probe::from_json(&text).map_err(|e| format!("{path}: {e}"))
            })
            .collect::<Result<Vec<Probe>, String>>()?;
        let now = Probe::median(&probes)
            .ok_or("--probe: the probes differ in their number of cache levels")?;
        c = c.calibrate(&now).map_err(|e| format!("--probe: {e}"))?;
    }
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

fn run(a: Args) -> Result<(), String> {
    let c = build_cluster(&a)?;
    if a.dump_cluster {
        println!("{}", c.to_json());
        return Ok(());
    }
    let kind = kind_of(&a.coll).ok_or_else(|| format!("unknown collective {}", a.coll))?;
    let algo = a
        .algo
        .as_deref()
        .map(|name| algorithm(name).ok_or_else(|| format!("unknown algorithm {name}")))
        .transpose()?;
    let proto = a
        .proto
        .as_deref()
        .map(|p| Protocol::parse(p).ok_or_else(|| format!("unknown protocol {p}")))
        .transpose()?;
    let n = c.nranks();
    let elem = a.elem_size.max(1);
    // nccl-tests sizes: the count is per rank for AllGather-like calls.
    let mut specs = Vec::new();
    let mut bytes = a.minbytes.max(elem);
    while bytes <= a.maxbytes.max(a.minbytes) {
        let total_elems = bytes / elem;
        let count = match kind {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => total_elems,
            _ => total_elems / n,
        };
        if count > 0 {
            specs.push(CollSpec {
                kind,
                nranks: n,
                root: 0,
                count,
            });
        }
        if a.stepfactor <= 1 {
            break;
        }
        bytes *= a.stepfactor;
    }
    let config = EngineConfig {
        deterministic: a.deterministic,
        ..EngineConfig::default()
    };
    // What each size runs: the engine's tuner's choice for this cluster,
    // with what the flags name instead. In the deterministic mode a named
    // algorithm must be one the engine would run there, or the numbers
    // would be those of a schedule whose bits change with the cut.
    let runs = specs
        .iter()
        .map(|spec| {
            let engine = engine_choice_with(&c, spec, elem, &config)
                .ok_or_else(|| format!("no algorithm implements {} here", kind.name()))?;
            if let Some(named) = algo.filter(|_| a.deterministic && kind.reduces()) {
                let allowed = engine_candidates(&c, spec, elem, &config);
                if !allowed.iter().any(|x| x.name() == named.name()) {
                    let names: Vec<&str> = allowed.iter().map(|x| x.name()).collect();
                    return Err(format!(
                        "--deterministic: {} of {} B runs {}, not {}",
                        kind.name(),
                        size_bytes(spec, elem),
                        names.join(" or "),
                        named.name()
                    ));
                }
            }
            let algorithm = algo.unwrap_or(engine.algorithm);
            let protocol = proto.unwrap_or(engine.protocol);
            let mut params = if algo.is_some() || proto.is_some() {
                let base = default_params(&c, spec, elem, protocol);
                params_for(
                    algorithm,
                    &Topology::from_hosts(c.host_of()),
                    spec,
                    elem,
                    Params {
                        nchannels: engine.params.nchannels,
                        ..base
                    },
                )
            } else {
                engine.params
            };
            if let Some(ch) = a.nchannels {
                params.nchannels = ch.max(1);
            }
            if let Some(cb) = a.chunk_bytes {
                params.chunk_elems = (cb / elem).max(1);
            }
            Ok((spec, algorithm, protocol, params))
        })
        .collect::<Result<Vec<_>, String>>()?;
    println!(
        "# rccl-sim: {} on {} ({} hosts, {} ranks, {} rails); per size, the engine's choice{}{}:",
        kind.name(),
        c.name,
        c.hosts,
        n,
        c.rails(),
        if a.deterministic {
            " in the deterministic mode"
        } else {
            ""
        },
        if a.algo.is_some() || a.proto.is_some() || a.nchannels.is_some() || a.chunk_bytes.is_some()
        {
            " as the flags override it"
        } else {
            ""
        }
    );
    for (spec, algorithm, protocol, params) in &runs {
        println!(
            "#   {:>12} B: {} {}, {} channels, chunk {} B",
            size_bytes(spec, elem),
            algorithm.name(),
            protocol.name(),
            params.nchannels,
            params.chunk_elems * elem
        );
    }
    print!("{}", report::header());
    let mut rows = Vec::new();
    for (spec, algorithm, protocol, params) in runs {
        let result =
            simulate(&c, spec, elem, algorithm, protocol, &params).map_err(|e| e.to_string())?;
        let row = Row {
            size: result.size_bytes,
            count: report::count_column(kind, spec.count, n),
            dtype: if elem == 4 { "float" } else { "bytes" }.into(),
            redop: if kind.reduces() { "sum" } else { "none" }.into(),
            root: if kind.has_root() { 0 } else { -1 },
            result,
        };
        println!("{}", report::line(&row));
        rows.push(row);
    }
    if let Some(path) = &a.json {
        std::fs::write(path, report::json(&c.name, kind, n, &rows))
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rccl-sim: {e}");
            ExitCode::FAILURE
        }
    }
}
