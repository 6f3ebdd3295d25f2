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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use rccl_algorithms::{
    p2p_schedule, unpaired_self_calls, Algorithm, CollKind, CollSpec, P2pOp, Params, Prim,
    Schedule, Topology,
};

use crate::builtin::Builtin;
use crate::cluster::{ClusterSpec, IntraLink, LinkKind, ProtoSpec, Protocol, SimError};

/// What a compacted primitive does: takes a message in,
const RECV: u8 = 1;
/// sends one out,
const SEND: u8 = 2;
/// reduces (else copies),
const REDUCE: u8 = 4;
/// writes the rank's own buffer besides (or instead of) a transfer.
const LOCAL: u8 = 8;
/// sends to a rank outside the replayed period (folded onto one inside):
/// the transfer leaves the period's leaf group.
const AWAY: u8 = 16;

/// One primitive, compacted: 16 bytes.
#[derive(Clone, Copy, Debug)]
struct Op {
    from: u32,
    to: u32,
    bytes: u32,
    flags: u8,
}

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

/// The resolved cluster: placement and link capacities (bytes / µs).
struct Net {
    host_of: Vec<usize>,
    local: Vec<usize>,
    /// Link bandwidths, bytes per microsecond.
    bw: Vec<f64>,
    /// Whether a rank's transfers within a host are its own copies.
    sender_copies: bool,
    intra_tx: usize,
    intra_rx: usize,
    nic_tx: usize,
    nic_rx: usize,
    /// The NICs per host the channels spread over: those attached to the
    /// communicator's ranks on the host with the fewest (all of a host's
    /// when its ranks fill it).
    rails: usize,
    leaf_up: usize,
    leaf_down: usize,
    nics: usize,
    reduce: Vec<f64>,
    copy: Vec<f64>,
}

/// A transfer's route: up to 4 links and its latency.
struct Path {
    links: [usize; 4],
    len: usize,
    latency: f64,
    /// Whether the sender's own copy moves the data (a host link with
    /// `sender_copies`): a forwarding primitive then writes its output
    /// straight into the transfer, in the same pass as it processes it,
    /// and a copy into the rank's own buffer is a second pass after it.
    sender_copies: bool,
    /// How fast a pass over the message at its receiver runs against the
    /// rank's rates (`intra.handoff_scale` for a copying sender's, else 1).
    receive_scale: f64,
}

/// The bytes a call touches at one rank apart from FIFO staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// What it reads: its send buffer (or the bytes it sends).
    pub read: usize,
    /// What it writes: its receive buffer (or the bytes it receives).
    pub written: usize,
}

impl Footprint {
    /// Both buffers, counted apart even when the call is in place: the
    /// working set the cluster's `caches` levels and streaming threshold
    /// are compared with.
    pub fn bytes(self) -> usize {
        self.read.saturating_add(self.written)
    }
}

/// The footprint of a collective at `rank`.
pub fn footprint(spec: &CollSpec, elem_size: usize, rank: usize) -> Footprint {
    let (k, n) = (spec.kind, spec.nranks);
    Footprint {
        read: k
            .send_len(spec.count, n, rank, spec.root)
            .saturating_mul(elem_size),
        written: k
            .recv_len(spec.count, n, rank, spec.root)
            .saturating_mul(elem_size),
    }
}

/// Whose rates a rank runs a call at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// The cache level of this index in the cluster's `caches`.
    Cache(usize),
    /// Memory: the cluster's `reduce_gbs` / `copy_gbs`.
    Memory,
    /// The cluster's `streaming` rates.
    Streaming,
}

impl Regime {
    /// The regime of a rank with `footprint` whose host runs
    /// `ranks_on_host` ranks: the first cache level whose share holds what
    /// the call keeps in cache, else streaming when the call streams, else
    /// memory. A call keeps both its buffers in cache, or only what it
    /// reads when it streams (its writes go around the caches).
    pub fn of(c: &ClusterSpec, footprint: Footprint, ranks_on_host: usize) -> Regime {
        let streams = c
            .streaming
            .is_some_and(|s| footprint.bytes() >= s.min_bytes);
        let cached = if streams {
            footprint.read
        } else {
            footprint.bytes()
        };
        let need = cached.saturating_mul(ranks_on_host);
        match c.caches.iter().position(|k| need <= k.bytes) {
            Some(level) => Regime::Cache(level),
            None if streams => Regime::Streaming,
            None => Regime::Memory,
        }
    }

    /// Its reduction and copy rates on `c`, GB/s.
    pub fn rates(self, c: &ClusterSpec) -> (f64, f64) {
        match (self, c.streaming) {
            (Regime::Cache(level), _) => (c.caches[level].reduce_gbs, c.caches[level].copy_gbs),
            (Regime::Streaming, Some(s)) => (s.reduce_gbs, s.copy_gbs),
            _ => (c.reduce_gbs, c.copy_gbs),
        }
    }
}

/// Reduction and copy throughput of every rank (bytes / µs), given each
/// rank's footprint: its [`Regime`]'s rates.
fn rank_rates(
    c: &ClusterSpec,
    host_of: &[usize],
    footprint: impl Fn(usize) -> Footprint,
) -> Vec<(f64, f64)> {
    let mut on_host = vec![0usize; c.hosts];
    for &h in host_of {
        on_host[h] += 1;
    }
    (0..host_of.len())
        .map(|r| {
            let (reduce, copy) = Regime::of(c, footprint(r), on_host[host_of[r]]).rates(c);
            (reduce * 1e3, copy * 1e3)
        })
        .collect()
}

impl Net {
    fn new(c: &ClusterSpec, footprint: impl Fn(usize) -> Footprint) -> Net {
        let host_of = c.host_of();
        let n = host_of.len();
        let mut seen = vec![0usize; c.hosts];
        let local: Vec<usize> = host_of
            .iter()
            .map(|&h| {
                seen[h] += 1;
                seen[h] - 1
            })
            .collect();
        let nics = c.nic.per_host.unwrap_or(c.ranks_per_host);
        let hpl = c.fabric.hosts_per_leaf.min(c.hosts).max(1);
        let groups = c.hosts.div_ceil(hpl);
        let leaves = if c.fabric.rail_optimized {
            groups * nics
        } else {
            groups
        };
        let intra_tx = 0;
        let intra_rx = n;
        let nic_tx = 2 * n;
        let nic_rx = nic_tx + c.hosts * nics;
        let leaf_up = nic_rx + c.hosts * nics;
        let leaf_down = leaf_up + leaves;
        let total = leaf_down + leaves;
        let gbs = |g: f64| g * 1e3; // GB/s -> bytes/µs
        let port = gbs(c.intra.map_or(1.0, |i| i.port_gbs));
        let nic = gbs(c.nic.gbit / 8.0 * c.nic.efficiency);
        let nics_per_leaf = if c.fabric.rail_optimized { 1 } else { nics };
        let leaf = nic * (hpl * nics_per_leaf) as f64 / c.fabric.oversubscription;
        let mut bw = vec![0.0; total];
        bw[intra_tx..nic_tx].fill(port);
        bw[nic_tx..leaf_up].fill(nic);
        bw[leaf_up..total].fill(leaf);
        let rates = rank_rates(c, &host_of, footprint);
        let mut reduce: Vec<f64> = rates.iter().map(|r| r.0).collect();
        let mut copy: Vec<f64> = rates.iter().map(|r| r.1).collect();
        if let Some(intra) = c.intra.filter(|i| i.sender_copies) {
            for (r, &rank_copy) in copy.iter().enumerate() {
                bw[intra_tx + r] = port.min(rank_copy) * intra.handoff_scale;
            }
        }
        let fewest = (0..c.hosts)
            .map(|h| seen[h])
            .filter(|&k| k > 0)
            .min()
            .unwrap_or(1);
        let rails = (fewest * nics / c.ranks_per_host.max(1)).clamp(1, nics);
        let mut net = Net {
            rails,
            host_of,
            local,
            bw,
            sender_copies: c.intra.is_some_and(|i| i.sender_copies),
            intra_tx,
            intra_rx,
            nic_tx,
            nic_rx,
            leaf_up,
            leaf_down,
            nics,
            reduce: Vec::new(),
            copy: Vec::new(),
        };
        let rph = c.ranks_per_host;
        let nic_of = |net: &Net, r: usize| net.host_of[r] * nics + net.local[r] * nics / rph;
        for s in &c.faults.slow_ranks {
            reduce[s.rank] /= s.compute_factor;
            copy[s.rank] /= s.compute_factor;
            let k = nic_of(&net, s.rank);
            for l in [intra_tx + s.rank, intra_rx + s.rank, nic_tx + k, nic_rx + k] {
                net.bw[l] /= s.link_factor;
            }
        }
        for d in &c.faults.degraded_links {
            let links = match d.link {
                LinkKind::Intra => [intra_tx + d.rank, intra_rx + d.rank],
                LinkKind::Nic => {
                    let k = nic_of(&net, d.rank);
                    [nic_tx + k, nic_rx + k]
                }
            };
            for l in links {
                net.bw[l] /= d.factor;
            }
        }
        net.reduce = reduce;
        net.copy = copy;
        let _ = (groups, hpl);
        net
    }
}

/// Geometry the path computation needs.
struct Geo {
    hpl: usize,
    /// Every host on one leaf switch (one switch).
    one_leaf: bool,
    rail: bool,
    intra: Option<IntraLink>,
    nic_lat: f64,
    hop_lat: f64,
    extra_lat: f64,
}

impl Geo {
    fn new(cluster: &ClusterSpec, proto: &ProtoSpec) -> Geo {
        Geo {
            hpl: cluster.fabric.hosts_per_leaf.min(cluster.hosts).max(1),
            one_leaf: cluster.fabric.hosts_per_leaf >= cluster.hosts,
            rail: cluster.fabric.rail_optimized,
            intra: cluster.intra,
            nic_lat: cluster.nic.latency_us,
            hop_lat: cluster.fabric.hop_latency_us,
            extra_lat: proto.extra_latency_us,
        }
    }

    /// The links from `src` to `dst` for a message of channel `ch`: within
    /// a host the two ranks' ports; across hosts the NICs of the channel's
    /// rail (`ch mod nics`) at both ends, as the engine routes it. `away`:
    /// `dst` stands for a rank of another leaf group (symmetry folding).
    fn path(&self, net: &Net, src: usize, dst: usize, ch: usize, away: bool) -> Path {
        let (hs, hd) = (net.host_of[src], net.host_of[dst]);
        if hs == hd && !away {
            if let Some(intra) = self.intra {
                return Path {
                    links: [net.intra_tx + src, net.intra_rx + dst, 0, 0],
                    len: 2,
                    latency: intra.latency_us + self.extra_lat,
                    sender_copies: intra.sender_copies,
                    receive_scale: if intra.sender_copies {
                        intra.handoff_scale
                    } else {
                        1.0
                    },
                };
            }
        }
        let nics = net.nics;
        let ks = ch % net.rails;
        let kd = ks;
        let leaf = |h: usize, k: usize| {
            if self.rail {
                (h / self.hpl) * nics + k
            } else {
                h / self.hpl
            }
        };
        let tx = net.nic_tx + hs * nics + ks;
        let rx = net.nic_rx + hd * nics + kd;
        if hs == hd && !away {
            // Loopback through the NIC (no host link): no switch.
            return Path {
                links: [tx, rx, 0, 0],
                len: 2,
                latency: self.nic_lat + self.extra_lat,
                sender_copies: false,
                receive_scale: 1.0,
            };
        }
        let (ls, ld) = (leaf(hs, ks), leaf(hd, kd));
        // On one switch a peer of another folded group is on the same
        // leaf as every other.
        if ls == ld && (!away || self.one_leaf) {
            Path {
                links: [tx, rx, 0, 0],
                len: 2,
                latency: self.nic_lat + self.hop_lat + self.extra_lat,
                sender_copies: false,
                receive_scale: 1.0,
            }
        } else {
            Path {
                links: [tx, net.leaf_up + ls, net.leaf_down + ld, rx],
                len: 4,
                latency: self.nic_lat + 3.0 * self.hop_lat + self.extra_lat,
                sender_copies: false,
                receive_scale: 1.0,
            }
        }
    }
}

/// Slots of a connection's FIFO.
const FIFO_SLOTS: usize = 8;

/// Most primitives one simulation may hold (about 16 bytes each).
pub const MAX_PRIMS: u64 = 400_000_000;

/// Algorithms whose schedule of rank `r + p` is that of rank `r` shifted
/// by `p` (ring-shaped): replaying one period of ranks is exact when the
/// cluster has the same symmetry.
fn shift_symmetric(algorithm: Option<Builtin>) -> bool {
    matches!(algorithm, Some(Builtin::Ring | Builtin::Hierarchical))
}

/// Algorithms whose channels run in lockstep and saturate their links
/// together, so one channel at 1/nchannels of the bandwidth is exact.
fn channel_lockstep(algorithm: Option<Builtin>) -> bool {
    algorithm == Some(Builtin::Ring)
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

fn compact(prim: &Prim, elem: usize, fold: usize) -> Op {
    let bytes = (prim.len() * elem) as u32;
    let m = |r: usize| (r % fold) as u32;
    let away = |to: usize| if to >= fold { AWAY } else { 0 };
    let (flags, from, to) = match *prim {
        Prim::Send { to, .. } => (SEND | away(to), 0, m(to)),
        Prim::Recv { from, .. } => (RECV, m(from), 0),
        Prim::Copy { src, dst } => {
            let same = src.buf == dst.buf && src.offset == dst.offset;
            (if same { 0 } else { LOCAL }, 0, 0)
        }
        Prim::CopySend { src, dst, to } => {
            let copy = if src.buf == dst.buf && src.offset == dst.offset {
                0
            } else {
                LOCAL
            };
            (SEND | copy | away(to), 0, m(to))
        }
        Prim::RecvReduceSend { from, to, .. } => (RECV | SEND | REDUCE | away(to), m(from), m(to)),
        Prim::RecvReduceCopySend { from, to, .. } => {
            (RECV | SEND | REDUCE | LOCAL | away(to), m(from), m(to))
        }
        Prim::RecvReduceCopy { from, .. } | Prim::RecvReduceCopyPartial { from, .. } => {
            (RECV | REDUCE, m(from), 0)
        }
        Prim::RecvCopySend { from, to, .. } => (RECV | SEND | LOCAL | away(to), m(from), m(to)),
        Prim::ReduceCopy { .. } | Prim::ReduceCopyPartial { .. } => (LOCAL | REDUCE, 0, 0),
    };
    Op {
        from,
        to,
        bytes,
        flags,
    }
}

/// The busy intervals of one link, in time order, none overlapping; a
/// booking that starts where another ends (or ends where one starts)
/// joins it, so that a link booked back to back, as a rank sending to
/// every other books its port, holds one interval, not one per message.
#[derive(Clone, Default)]
struct Busy(Vec<(f64, f64)>);

impl Busy {
    /// Books the link for `len` microseconds from the earliest time at or
    /// after `at` when it is idle that long, forgetting intervals that
    /// ended before `now` (the replay's clock only moves forward); returns
    /// the start.
    fn reserve(&mut self, at: f64, len: f64, now: f64) -> f64 {
        let past = self.0.partition_point(|&(_, end)| end <= now);
        self.0.drain(..past);
        // An interval ending before `at` cannot delay the booking.
        let mut i = self.0.partition_point(|&(_, end)| end < at);
        let mut start = at;
        while let Some(&(s, e)) = self.0.get(i) {
            if start + len <= s {
                break;
            }
            start = start.max(e);
            i += 1;
        }
        let end = start + len;
        let joins_before = len > 0.0 && i > 0 && self.0[i - 1].1 == start;
        let joins_after = len > 0.0 && self.0.get(i).is_some_and(|&(s, _)| s == end);
        match (joins_before, joins_after) {
            (true, true) => {
                self.0[i - 1].1 = self.0[i].1;
                self.0.remove(i);
            }
            (true, false) => self.0[i - 1].1 = end,
            (false, true) => self.0[i].0 = start,
            (false, false) => self.0.insert(i, (start, end)),
        }
        start
    }
}

/// Times of a message at its receiver: first piece in, last piece in.
#[derive(Clone, Copy)]
struct Msg {
    head: f64,
    tail: f64,
    /// Its path's `receive_scale`.
    receive_scale: f64,
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
        if rank == 0 && (threads.ops[0].len() as u64) * (fold as u64) * nch as u64 > MAX_PRIMS * 2 {
            return Err(SimError(format!(
                "about {} primitives to replay: too many",
                threads.ops[0].len() as u64 * fold as u64 * nch as u64
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

/// The parameters the engine would use for a group of sends and receives
/// (`calls`, lengths in bytes) on `cluster`: the protocol is always
/// Simple (the engine's point-to-point path uses no other), channels by
/// the largest message as for a call that leaves the host, and a chunk
/// (in bytes) of half a Simple FIFO.
pub fn default_p2p_params(cluster: &ClusterSpec, calls: &[P2pOp]) -> Params {
    let t = &cluster.tuning;
    let slot = cluster.protocols.simple.slot_bytes;
    Params {
        nchannels: (largest_p2p(calls) / t.bytes_per_channel.max(1))
            .clamp(t.min_channels, t.max_channels),
        chunk_elems: (slot * FIFO_SLOTS / 2).max(1),
    }
}

fn largest_p2p(calls: &[P2pOp]) -> usize {
    calls.iter().map(P2pOp::length).max().unwrap_or(0)
}

/// Simulates `rank`'s side of a group of sends and receives on `cluster`:
/// `calls` in call order, offsets and lengths in bytes, run with
/// `protocol` and `params` (`chunk_elems` in bytes; see
/// [`default_p2p_params`]).
///
/// A rank knows only its own calls, so every peer is taken to post the
/// matching ones and nothing else: a receive for each send to it and a
/// send for each receive from it, in the same order, split across the
/// same channels. Those schedules and `rank`'s (the engine's
/// `p2p_schedule`) are replayed together as any collective is, so the
/// group's transfers run concurrently: sends to different peers share
/// `rank`'s outgoing links, receives its incoming ones, and a send and a
/// receive, going opposite ways, overlap. A send to `rank` itself paired
/// with a receive from itself is a local copy. `time_us` is when the last
/// transfer is complete at both ends (its last piece copied out at the
/// receiver); `size_bytes` sums the calls' lengths and `busbw` equals
/// `algbw`.
pub fn simulate_p2p(
    cluster: &ClusterSpec,
    rank: usize,
    calls: &[P2pOp],
    protocol: Protocol,
    params: &Params,
) -> Result<SimResult, SimError> {
    cluster.validate()?;
    let n = cluster.nranks();
    if rank >= n {
        return Err(SimError(format!(
            "rank {rank} is not below the cluster's {n} ranks"
        )));
    }
    if let Some(call) = calls.iter().find(|c| c.peer() >= n) {
        return Err(SimError(format!(
            "peer {} is not below the cluster's {n} ranks",
            call.peer()
        )));
    }
    // As the engine: self sends and self receives pair up into copies.
    if let Some(why) = unpaired_self_calls(rank, calls) {
        return Err(SimError(format!("rank {rank}: {why} (lengths in bytes)")));
    }
    let chunk = params.chunk_elems.max(1);
    if chunk.min(largest_p2p(calls)) > u32::MAX as usize {
        return Err(SimError(
            "messages above 4 GiB are not modeled: choose a smaller chunk".into(),
        ));
    }

    // Every peer's mirror calls, laid end to end in its buffers.
    let mut mirror: Vec<Vec<P2pOp>> = vec![Vec::new(); n];
    let mut ends = vec![(0usize, 0usize); n];
    for call in calls {
        match *call {
            P2pOp::Send { peer, len, .. } if peer != rank => {
                let offset = ends[peer].1;
                ends[peer].1 += len;
                mirror[peer].push(P2pOp::Recv {
                    peer: rank,
                    offset,
                    len,
                });
            }
            P2pOp::Recv { peer, len, .. } if peer != rank => {
                let offset = ends[peer].0;
                ends[peer].0 += len;
                mirror[peer].push(P2pOp::Send {
                    peer: rank,
                    offset,
                    len,
                });
            }
            _ => {}
        }
    }
    mirror[rank] = calls.to_vec();

    let nch = params.nchannels.max(1);
    let proto: ProtoSpec = *cluster.protocols.get(protocol);
    // A rank's footprint: the bytes it sends and receives.
    let moved: Vec<Footprint> = mirror
        .iter()
        .map(|calls| {
            let bytes = |sends: bool| {
                calls
                    .iter()
                    .filter(|c| matches!(c, P2pOp::Send { .. }) == sends)
                    .map(P2pOp::length)
                    .sum()
            };
            Footprint {
                read: bytes(true),
                written: bytes(false),
            }
        })
        .collect();
    let net = Net::new(cluster, |r| moved[r]);
    let geo = Geo::new(cluster, &proto);
    let mut threads = Threads::default();
    for (r, calls) in mirror.iter().enumerate() {
        threads.push(p2p_schedule(r, calls, nch, chunk), nch, 1, n)?;
    }
    let (done_at, prims) = replay(&net, &geo, &proto, &threads, nch, n)?;
    let involved: Vec<usize> = (0..n)
        .filter(|&r| r == rank || !mirror[r].is_empty())
        .collect();
    let (last_rank, time_us, first_done_us) =
        completion(involved.iter().map(|&r| (r, done_at[r])), rank);
    let size: usize = calls.iter().map(P2pOp::length).sum();
    let algbw = algbw_gbs(size, time_us);
    Ok(SimResult {
        time_us,
        first_done_us,
        size_bytes: size,
        algbw,
        busbw: algbw,
        algorithm: "p2p".into(),
        protocol,
        nchannels: nch,
        chunk_elems: chunk,
        ranks_replayed: involved.len(),
        prims,
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

/// Compact schedules: the ops and step boundaries of every (rank,
/// channel) thread, thread `rank * nch + channel`.
#[derive(Default)]
struct Threads {
    ops: Vec<Vec<Op>>,
    steps: Vec<Vec<u32>>,
    total: u64,
}

impl Threads {
    /// Appends `schedule` as the next rank's `nch` threads (ranks taken
    /// modulo `fold`).
    fn push(
        &mut self,
        schedule: Schedule,
        nch: usize,
        elem_size: usize,
        fold: usize,
    ) -> Result<(), SimError> {
        let mut chans = schedule.channels;
        chans.resize(nch, Vec::new());
        for ch in chans {
            let mut o = Vec::new();
            let mut s = vec![0u32];
            for step in &ch {
                for p in &step.prims {
                    o.push(compact(p, elem_size, fold));
                }
                s.push(o.len() as u32);
            }
            self.total += o.len() as u64;
            if self.total > MAX_PRIMS {
                return Err(SimError(format!(
                    "more than {MAX_PRIMS} primitives to replay: choose a larger chunk or fewer ranks"
                )));
            }
            self.ops.push(o);
            self.steps.push(s);
        }
        Ok(())
    }
}

/// Replays `threads` (`nranks` ranks of `nch` channels) on `net`: when
/// each rank finished, and how many primitives ran.
fn replay(
    net: &Net,
    geo: &Geo,
    proto: &ProtoSpec,
    threads: &Threads,
    nch: usize,
    nranks: usize,
) -> Result<(Vec<f64>, u64), SimError> {
    let (ops, steps) = (&threads.ops, &threads.steps);
    let nthreads = ops.len();
    let mut links: Vec<Busy> = vec![Busy::default(); net.bw.len()];
    let mut cursor = vec![0usize; nthreads];
    // Every thread with work starts once its rank has paid the call's
    // fixed cost; one without finishes at once.
    let start = |th: usize| {
        if steps[th].len() > 1 {
            proto.launch_us
        } else {
            0.0
        }
    };
    let mut ready: Vec<f64> = (0..nthreads).map(start).collect();
    let mut done_at = vec![0.0f64; nranks];
    let mut queues: HashMap<u64, VecDeque<Msg>, Fx> = HashMap::default();
    let mut waiting: HashMap<u64, usize, Fx> = HashMap::default();
    let mut heap: BinaryHeap<Reverse<(Time, usize)>> = ready
        .iter()
        .enumerate()
        .map(|(th, &at)| Reverse((Time(at), th)))
        .collect();
    let key =
        |from: u32, to: u32, ch: usize| ((from as u64) << 40) | ((to as u64) << 16) | ch as u64;
    let piece_cap = proto.slot_bytes as f64 * proto.efficiency;
    let fifo_bytes = piece_cap * FIFO_SLOTS as f64;
    let mut prims: u64 = 0;
    let mut mask: Vec<Vec<bool>> = vec![Vec::new(); nthreads];
    let mut step_end = vec![0.0f64; nthreads];
    // A rank whose transfers within a host are its own copies (a CPU
    // rank) makes every primitive of a step on its one core, one after
    // the other: the core time its step's primitives took so far.
    let one_core = net.sender_copies;
    let mut step_core = vec![0.0f64; nthreads];
    let mut blocked_recv: Vec<u32> = Vec::new();
    let mut blocked_send: Vec<u32> = Vec::new();

    while let Some(Reverse((Time(now), th))) = heap.pop() {
        let rank = th / nch;
        let ch = th % nch;
        let s = cursor[th];
        if s + 1 >= steps[th].len() {
            done_at[rank] = done_at[rank].max(ready[th]);
            continue;
        }
        let (lo, hi) = (steps[th][s] as usize, steps[th][s + 1] as usize);
        if mask[th].len() != hi - lo {
            mask[th].clear();
            mask[th].resize(hi - lo, false);
        }
        // The step's primitives progress independently: run every one
        // whose message is in, keeping each peer's messages in order.
        blocked_recv.clear();
        blocked_send.clear();
        let t = ready[th];
        let mut end = step_end[th].max(t);
        let mut complete = true;
        let (reduce_bw, copy_bw) = (net.reduce[rank], net.copy[rank]);
        for i in lo..hi {
            if mask[th][i - lo] {
                continue;
            }
            let op = ops[th][i];
            let recv_blocked = op.flags & RECV != 0 && {
                let k = key(op.from, rank as u32, ch);
                let empty = queues.get(&k).map_or(true, VecDeque::is_empty);
                if empty {
                    waiting.insert(k, th);
                }
                empty || blocked_recv.contains(&op.from)
            };
            let send_blocked = op.flags & SEND != 0 && blocked_send.contains(&op.to);
            if recv_blocked || send_blocked {
                complete = false;
                if op.flags & RECV != 0 {
                    blocked_recv.push(op.from);
                }
                if op.flags & SEND != 0 {
                    blocked_send.push(op.to);
                }
                continue;
            }
            mask[th][i - lo] = true;
            prims += 1;
            let bytes = op.bytes as f64;
            let s0 = t + proto.step_overhead_us;
            let piece = bytes.min(piece_cap);
            let proc_bw = if op.flags & REDUCE != 0 {
                reduce_bw
            } else {
                copy_bw
            };
            let mut op_end = s0;
            // The core time of this primitive's passes.
            let mut core = 0.0;
            let mut input: Option<Msg> = None;
            // The rate of the pass over the input, which its path sets.
            let mut proc_in = proc_bw;
            if op.flags & RECV != 0 {
                let k = key(op.from, rank as u32, ch);
                let m = queues
                    .get_mut(&k)
                    .and_then(VecDeque::pop_front)
                    .expect("checked above");
                let start = s0.max(m.head);
                proc_in = proc_bw * m.receive_scale;
                op_end = op_end.max((start + bytes / proc_in).max(m.tail + piece / proc_in));
                core = bytes / proc_in;
                input = Some(m);
            }
            if op.flags & LOCAL != 0 {
                op_end = op_end.max(s0 + bytes / proc_bw);
                core = bytes / proc_bw;
            }
            if op.flags & SEND != 0 {
                let dst = op.to as usize;
                let path = geo.path(net, rank, dst, ch, op.flags & AWAY != 0);
                // A forwarder processes a piece before it can send it, unless
                // its processing is the transfer itself.
                let stage = if path.sender_copies {
                    0.0
                } else {
                    piece / proc_in
                };
                let src_ready = match input {
                    Some(m) => s0.max(m.head) + stage,
                    None => s0,
                };
                let mut last_start = src_ready;
                let mut depart = src_ready;
                // When the last byte leaves the sender's own port.
                let mut sent = src_ready;
                let mut min_bw = f64::INFINITY;
                for (i, &l) in path.links[..path.len].iter().enumerate() {
                    let bw = net.bw[l] * proto.efficiency;
                    min_bw = min_bw.min(bw);
                    let start = links[l].reserve(src_ready, bytes / bw, now);
                    last_start = last_start.max(start);
                    depart = depart.max(start + bytes / bw);
                    if i == 0 {
                        sent = start + bytes / bw;
                    }
                }
                // A rank that makes its transfers itself also makes the
                // copy into its own buffer on the same core: after each
                // piece's transfer, not beside it.
                let serial_copy = path.sender_copies && op.flags & LOCAL != 0;
                if let Some(m) = input {
                    // Cannot outrun the input, nor its processing.
                    let floor = (m.tail + stage + piece / min_bw).max(src_ready + bytes / proc_in);
                    depart = depart.max(floor);
                    sent = sent.max(floor);
                } else if op.flags & LOCAL != 0 && !serial_copy {
                    depart = depart.max(src_ready + bytes / proc_bw);
                    sent = sent.max(src_ready + bytes / proc_bw);
                }
                if serial_copy {
                    let transfer = bytes / proc_in.min(min_bw);
                    depart = depart.max(src_ready + transfer + (bytes - piece) / copy_bw);
                    op_end = op_end.max(src_ready + transfer + bytes / copy_bw);
                }
                if path.sender_copies {
                    // The pass over the input writes into the transfer.
                    core = bytes / proc_in.min(min_bw)
                        + if serial_copy { bytes / copy_bw } else { 0.0 };
                }
                let msg = Msg {
                    head: last_start + piece / min_bw + path.latency,
                    tail: depart + path.latency,
                    receive_scale: path.receive_scale,
                };
                let k = key(rank as u32, op.to, ch);
                queues.entry(k).or_default().push_back(msg);
                if let Some(w) = waiting.remove(&k) {
                    heap.push(Reverse((Time(now), w)));
                }
                // A sender that copies is busy until its copy lands in the
                // peer's FIFO. A DMA or RDMA transfer (NVLink, a NIC) drains
                // the FIFO behind the sender: it moves on once its data is
                // staged and its port has drained all but a FIFO of it.
                op_end = op_end.max(if path.sender_copies {
                    depart
                } else {
                    sent - fifo_bytes / (net.bw[path.links[0]] * proto.efficiency)
                });
            }
            end = end.max(op_end);
            if one_core {
                step_core[th] += core;
                end = end.max(s0 + step_core[th]);
            }
        }
        if !complete {
            step_end[th] = end;
            continue;
        }
        mask[th].clear();
        step_end[th] = 0.0;
        step_core[th] = 0.0;
        cursor[th] += 1;
        ready[th] = end;
        heap.push(Reverse((Time(end), th)));
    }
    if let Some((&k, &th)) = waiting.iter().next() {
        return Err(SimError(format!(
            "deadlock: rank {} channel {} waits for a message from rank {} that never comes",
            th / nch,
            th % nch,
            k >> 40
        )));
    }
    Ok((done_at, prims))
}

/// A time ordered by `total_cmp`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A multiplicative hasher for the u64 connection keys.
#[derive(Clone, Copy, Default)]
struct Fx;

impl std::hash::BuildHasher for Fx {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher(0)
    }
}

struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // splitmix64's finalizer: every input bit reaches the low bits.
        let mut z = (self.0 ^ v).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
}
