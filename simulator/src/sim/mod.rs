//! The replay: every rank's real schedule, run as a discrete-event
//! simulation at message level (see `docs/SIMULATOR.md`, "The model").
//!
//! Each (rank, channel) is a pipeline that runs its steps in order; a step
//! ends when all its primitives are done. A message is described by two
//! times, when its first piece (one FIFO slot) and its last piece reach
//! the receiver; a forwarding primitive starts sending once the first
//! piece is in and cannot finish before the last piece is in and
//! processed (cut-through at piece granularity). Each link is a resource
//! with busy intervals: a message occupies every link of its path for
//! bytes / bandwidth from the first idle stretch that long after its data
//! is ready, so concurrent flows on a link are served one message (chunk)
//! at a time, which gives each an equal share over a few chunks, and a
//! message whose data is ready late does not hold the link against
//! messages ready before it.
//!
//! The replay's jobs, a file each: `rates` (a rank's footprint and the
//! rates it runs at), `net` (the cluster's links and a message's route),
//! `replay` (the compacted schedules and the event loop over them) and
//! `p2p` (a group of sends and receives, with its peers' matching calls);
//! this file plans a collective's replay (what symmetry lets it fold) and
//! reports it.

mod net;
mod p2p;
mod rates;
mod replay;

use rccl_algorithms::{Algorithm, CollKind, CollSpec, Params, Topology};

use crate::builtin::Builtin;
use crate::cluster::{ClusterSpec, ProtoSpec, Protocol, SimError};

use net::{Geo, Net};
pub use p2p::{default_p2p_params, simulate_p2p};
pub use rates::{footprint, Footprint, Regime};
use replay::{replay, Threads};

/// The outcome of one simulated call.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimResult {
    /// Time from the start until the last rank finishes, microseconds.
    pub time_us: f64,
    /// Time the first rank finishes, microseconds.
    pub first_done_us: f64,
    /// Bytes of the call as nccl-tests counts its size.
    pub size_bytes: usize,
    /// size / time, GB/s.
    pub algbw: f64,
    /// algbw times nccl-tests' bus factor for the collective, GB/s.
    pub busbw: f64,
    /// The algorithm simulated.
    pub algorithm: String,
    /// The protocol simulated.
    pub protocol: Protocol,
    /// Channels and chunking simulated.
    pub nchannels: usize,
    /// Chunk, elements.
    pub chunk_elems: usize,
    /// Ranks whose schedules were replayed (fewer than the communicator's
    /// when symmetry folding applied).
    pub ranks_replayed: usize,
    /// Primitives executed.
    pub prims: u64,
    /// The rank that finished last.
    pub last_rank: usize,
}

/// nccl-tests' size (bytes) of a call.
pub fn size_bytes(spec: &CollSpec, elem_size: usize) -> usize {
    let n = spec.nranks;
    let elems = match spec.kind {
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => spec.count,
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter => spec.count * n,
    };
    elems * elem_size
}

/// nccl-tests' bus bandwidth factor of a collective over `n` ranks.
pub fn bus_factor(kind: CollKind, n: usize) -> f64 {
    let n = n as f64;
    match kind {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::Broadcast | CollKind::Reduce => 1.0,
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter => (n - 1.0) / n,
    }
}

/// Slots of a connection's FIFO.
const FIFO_SLOTS: usize = 8;

/// Most primitives one simulation may hold (about 16 bytes each).
pub const MAX_PRIMS: u64 = 400_000_000;

/// Algorithms whose schedule of rank `r + p` is that of rank `r` shifted
/// by `p` (ring-shaped): replaying one period of ranks is exact when the
/// cluster has the same symmetry. The ordered ring's is: its ring is the
/// ranks in index order, and with the count even over ranks and channels
/// its blocks are alike.
fn shift_symmetric(algorithm: Option<Builtin>) -> bool {
    matches!(
        algorithm,
        Some(Builtin::Ring | Builtin::OrderedRing | Builtin::Hierarchical)
    )
}

/// Algorithms whose channels run in lockstep and saturate their links
/// together, so one channel at 1/nchannels of the bandwidth is exact. The
/// ordered ring runs one ring on every channel, each block split evenly
/// over them: channels `c` and `c + rails` are alike, and the ring's
/// period of channels is a multiple of the rails.
fn channel_lockstep(algorithm: Option<Builtin>) -> bool {
    matches!(algorithm, Some(Builtin::Ring | Builtin::OrderedRing))
}

/// The channels after which the ring's channels repeat: across hosts a
/// channel's ring rotates each host's ranks by the channel and crosses
/// hosts on NIC `channel mod nics`, so the least common multiple of the
/// host sizes and the NIC count; within one host, 1.
fn channel_period(topo: &Topology, nics: usize) -> usize {
    if topo.nhosts() <= 1 {
        return 1;
    }
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    topo.hosts()
        .iter()
        .map(Vec::len)
        .chain([nics.max(1)])
        .fold(1, |l, m| l / gcd(l, m) * m)
}

/// The number of ranks to replay: a period `p` of the cluster under which
/// rank `r` and `r + p` see identical links, when the algorithm is
/// shift-symmetric, the collective has no root (a root breaks the
/// symmetry) and its count splits evenly over the ranks of every channel
/// (an uneven split leaves some ranks empty messages, which they skip,
/// and others not), or every rank.
fn fold_period(c: &ClusterSpec, algo: Option<Builtin>, spec: &CollSpec, nchannels: usize) -> usize {
    let n = spec.nranks;
    let uniform = c.placement.is_none()
        && c.faults.slow_ranks.is_empty()
        && c.faults.degraded_links.is_empty();
    let even = spec.count % (n * nchannels) == 0;
    if !uniform || !shift_symmetric(algo) || spec.kind.has_root() || !even {
        return n;
    }
    // Hosts on one switch are all alike: one host is a period.
    let hpl = if c.fabric.hosts_per_leaf >= c.hosts {
        1
    } else {
        c.fabric.hosts_per_leaf.max(1)
    };
    let p = c.ranks_per_host * hpl;
    if p < n && n % p == 0 && c.hosts % hpl == 0 {
        p
    } else {
        n
    }
}

/// The parameters the engine's tuner would pick for `spec` on `cluster`
/// with protocol `proto`: channels by size, chunk = half a FIFO.
pub fn default_params(
    cluster: &ClusterSpec,
    spec: &CollSpec,
    elem_size: usize,
    proto: Protocol,
) -> Params {
    let bytes = spec.count * elem_size;
    let t = &cluster.tuning;
    let slot = cluster.protocols.get(proto).slot_bytes;
    Params {
        nchannels: (bytes / t.bytes_per_channel.max(1)).clamp(t.min_channels, t.max_channels),
        chunk_elems: (slot * FIFO_SLOTS / 2 / elem_size).max(1),
    }
}

/// The protocol the engine's tuner would pick.
pub fn default_protocol(cluster: &ClusterSpec, spec: &CollSpec, elem_size: usize) -> Protocol {
    let bytes = spec.count * elem_size;
    if !cluster.all_intra() {
        Protocol::Simple
    } else if bytes <= cluster.tuning.ll_max_bytes {
        Protocol::Ll
    } else if bytes <= cluster.tuning.ll128_max_bytes {
        Protocol::Ll128
    } else {
        Protocol::Simple
    }
}

/// Which symmetry reductions the replay may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimOptions {
    /// Replay one period of ranks when the algorithm and the cluster are
    /// invariant under a shift of ranks (ring-shaped algorithms on a
    /// uniform cluster without faults).
    pub fold_ranks: bool,
    /// Replay one channel at 1/nchannels of every link's and rank's
    /// throughput, for the ring (whose channels split the work evenly and
    /// run in lockstep, sharing links equally).
    pub fold_channels: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            fold_ranks: true,
            fold_channels: true,
        }
    }
}

/// Simulates one call of `spec` (elements of `elem_size` bytes) with
/// `algorithm`, `protocol` and `params` on `cluster`, with the default
/// symmetry reductions ([`SimOptions`]).
///
/// The communicator's ranks are the cluster's ranks (`spec.nranks` must
/// equal `cluster.nranks()`).
pub fn simulate(
    cluster: &ClusterSpec,
    spec: &CollSpec,
    elem_size: usize,
    algorithm: &dyn Algorithm,
    protocol: Protocol,
    params: &Params,
) -> Result<SimResult, SimError> {
    simulate_with(
        cluster,
        spec,
        elem_size,
        algorithm,
        protocol,
        params,
        SimOptions::default(),
    )
}

/// [`simulate`] with explicit symmetry options.
pub fn simulate_with(
    cluster: &ClusterSpec,
    spec: &CollSpec,
    elem_size: usize,
    algorithm: &dyn Algorithm,
    protocol: Protocol,
    params: &Params,
    options: SimOptions,
) -> Result<SimResult, SimError> {
    cluster.validate()?;
    let full_spec = *spec;
    let n = spec.nranks;
    if n != cluster.nranks() {
        return Err(SimError(format!(
            "the call has {n} ranks, the cluster {}",
            cluster.nranks()
        )));
    }
    if !algorithm.supports(spec.kind) {
        return Err(SimError(format!(
            "{} does not implement {}",
            algorithm.name(),
            spec.kind.name()
        )));
    }
    if spec.count * elem_size > u32::MAX as usize {
        return Err(SimError(
            "calls above 4 GiB per rank are not modeled".into(),
        ));
    }
    let topo = Topology::from_hosts(cluster.host_of());
    if !algorithm.supports_topology(&topo) {
        return Err(SimError(format!(
            "{} cannot run on this placement",
            algorithm.name()
        )));
    }
    let builtin = Builtin::named(algorithm.name());
    let fold = if options.fold_ranks {
        fold_period(cluster, builtin, spec, params.nchannels.max(1))
    } else {
        n
    };
    let proto: ProtoSpec = *cluster.protocols.get(protocol);
    let mut net = Net::new(cluster, |r| footprint(&full_spec, elem_size, r));
    let geo = Geo::new(cluster, &proto);
    let real_nch = params.nchannels.max(1);
    // Only the ring's channels run in lockstep, link-bound; folding the
    // channels of tree, hier or rhd was measured 1.3-2x pessimistic (a
    // folded channel cannot borrow the bandwidth others leave idle).
    // Channels `c` and `c + period` run the same ring on the same rail, so
    // replaying `period` channels, each for `nch / period` of them, is
    // exact.
    let period = channel_period(&topo, net.rails);
    let fold_ch = options.fold_channels
        && real_nch > period
        && real_nch % period == 0
        && channel_lockstep(builtin)
        && cluster.faults.slow_ranks.is_empty()
        && cluster.faults.degraded_links.is_empty();
    // With channels folded: `period` channels with the largest share of
    // the elements, on links and ranks of period/nchannels the throughput.
    let (sim_spec, sim_params, share) = if fold_ch {
        (
            CollSpec {
                count: spec.count.div_ceil(real_nch) * period,
                ..*spec
            },
            Params {
                nchannels: period,
                ..*params
            },
            (real_nch / period) as f64,
        )
    } else {
        (*spec, *params, 1.0)
    };
    let (spec, params) = (&sim_spec, &sim_params);
    for v in net
        .bw
        .iter_mut()
        .chain(&mut net.reduce)
        .chain(&mut net.copy)
    {
        *v /= share;
    }
    let nch = params.nchannels.max(1);

    // Compact schedules of the replayed ranks: ops and step boundaries per
    // (rank, channel) thread.
    let mut threads = Threads::default();
    for rank in 0..fold {
        let schedule = algorithm.schedule(spec, rank, params, &topo);
        threads.push(schedule, nch, elem_size, fold)?;
        if rank == 0 && (threads.ops_in(0) as u64) * (fold as u64) * nch as u64 > MAX_PRIMS * 2 {
            return Err(SimError(format!(
                "about {} primitives to replay: too many",
                threads.ops_in(0) as u64 * fold as u64 * nch as u64
            )));
        }
    }
    let (done_at, prims) = replay(&net, &geo, &proto, &threads, nch, fold)?;
    let (last_rank, time_us, first_done_us) = completion(done_at.iter().copied().enumerate(), 0);
    let size = size_bytes(&full_spec, elem_size);
    let algbw = algbw_gbs(size, time_us);
    Ok(SimResult {
        time_us,
        first_done_us,
        size_bytes: size,
        algbw,
        busbw: algbw * bus_factor(spec.kind, n),
        algorithm: algorithm.name().to_string(),
        protocol,
        nchannels: real_nch,
        chunk_elems: params.chunk_elems,
        ranks_replayed: fold,
        prims: prims * (n / fold) as u64 * share as u64,
        last_rank,
    })
}

/// Over `(rank, done at)` pairs: the last rank to finish (the first of
/// the latest; `first_rank` when none took any time), when it did, and
/// when the first one did.
fn completion(done: impl Iterator<Item = (usize, f64)>, first_rank: usize) -> (usize, f64, f64) {
    done.fold(
        (first_rank, 0.0f64, f64::INFINITY),
        |(last, latest, first), (r, t)| {
            let (last, latest) = if t > latest { (r, t) } else { (last, latest) };
            (last, latest, first.min(t))
        },
    )
}

/// Algorithm bandwidth, GB/s, of `size` bytes in `time_us` (0 for no
/// time).
fn algbw_gbs(size: usize, time_us: f64) -> f64 {
    if time_us > 0.0 {
        size as f64 / time_us / 1e3
    } else {
        0.0
    }
}
