//! The cluster description: hosts, links, fabric, protocols and faults, as
//! read from JSON (`docs/SIMULATOR.md` documents every field), and the
//! resolved form the simulator runs on.
//!
//! Units: bandwidths in GB/s (10^9 bytes per second) except the NIC line
//! rate, given in Gb/s as NICs are sold; latencies and overheads in
//! microseconds; sizes in bytes.

pub use rccl_algorithms::Protocol;
use serde::{Deserialize, Serialize};

use crate::probe::{Probe, Rates};

/// The whole description of a modeled cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// A label printed in reports.
    pub name: String,
    /// Number of hosts.
    pub hosts: usize,
    /// Ranks (accelerators) per host.
    pub ranks_per_host: usize,
    /// `placement[r]` is the host of rank `r`, overriding the default of
    /// `ranks_per_host` consecutive ranks per host. Each host may hold at
    /// most `ranks_per_host` ranks (its NICs and switch ports).
    #[serde(default)]
    pub placement: Option<Vec<usize>>,
    /// The link between ranks on one host; `null`: ranks on one host talk
    /// through their NICs (a TCP-only setup).
    pub intra: Option<IntraLink>,
    /// The network interfaces.
    pub nic: Nic,
    /// The switched network between hosts.
    #[serde(default)]
    pub fabric: Fabric,
    /// Per-rank reduction throughput (GB/s of output): how fast a rank
    /// combines a received piece with its own data.
    pub reduce_gbs: f64,
    /// Per-rank local copy throughput (GB/s): copies out of a FIFO and
    /// local copies between buffers.
    pub copy_gbs: f64,
    /// Cache levels in front of memory, smallest first: a rank whose
    /// working set for a call fits its share of a level runs the call at
    /// the first such level's rates instead of `reduce_gbs` / `copy_gbs`
    /// (which are then memory's). Empty (the default): one pair of rates
    /// for every size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<Cache>,
    /// Calls large enough for the engine to write the user's buffers with
    /// non-temporal stores (`RCCL_NT_STORE_BYTES`), and the rates they
    /// run at; `null` (the default): no call streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<Streaming>,
    /// The three protocols.
    pub protocols: Protocols,
    /// How calls are cut into channels and chunks when the caller does not
    /// say (the engine's tuner rules).
    #[serde(default)]
    pub tuning: Tuning,
    /// Slow ranks and degraded links.
    #[serde(default)]
    pub faults: Faults,
    /// The host's copy and reduction rates measured (`probe_local`) when
    /// the rates above were fitted; with it, [`ClusterSpec::calibrate`]
    /// scales them to a later probe. `null` (the default): the rates are
    /// not tied to a probe (datasheet figures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

/// A cache level of a host, its capacity shared by the ranks on the host
/// (a level private to each core is given as the sum over the cores).
///
/// A rank's working set for a call is the bytes of its send and receive
/// buffers (`CollKind::send_len + recv_len` elements, counted apart even
/// when the call is in place); FIFO staging is left out (it is bounded by
/// the slots and reused). When the working set is at most `bytes` divided
/// by the number of ranks on the rank's host, the rank reduces and copies
/// at this level's `reduce_gbs` / `copy_gbs` for the whole call, unless a
/// smaller level listed before it fits too.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cache {
    /// Capacity of one host's cache, bytes.
    pub bytes: usize,
    /// Per-rank reduction throughput for working sets that fit, GB/s.
    pub reduce_gbs: f64,
    /// Per-rank copy throughput for working sets that fit, GB/s.
    pub copy_gbs: f64,
}

/// Calls whose buffers on a rank reach `min_bytes` (send plus receive, the
/// working set of [`Cache`]) are the engine's streaming calls: they write
/// the user's buffers with non-temporal stores, which skip the read of
/// each line a cached store of a line not in cache makes. Such a rank
/// reduces and copies at `reduce_gbs` / `copy_gbs` for the whole call,
/// whatever the cache levels say.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Streaming {
    /// The engine's threshold: bytes of one rank's send and receive
    /// buffers from which its call streams.
    pub min_bytes: usize,
    /// Per-rank reduction throughput of streaming calls, GB/s.
    pub reduce_gbs: f64,
    /// Per-rank copy throughput of streaming calls, GB/s.
    pub copy_gbs: f64,
}

/// The intra-host interconnect: a switch (NVSwitch-class, or shared memory
/// seen as one) where every rank has one port; a transfer crosses the
/// sender's port out and the receiver's port in.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntraLink {
    /// Per-rank port bandwidth, each direction, GB/s.
    pub port_gbs: f64,
    /// One-way latency of a transfer, microseconds.
    pub latency_us: f64,
    /// Whether a transfer is a copy the sending rank makes itself (CPU
    /// ranks over shared memory): then a rank's port runs at the lower of
    /// `port_gbs` and the rank's copy rate for the call, which depends on
    /// where its data sits (`caches`, streaming, memory) as its other
    /// copies do, and the copy a primitive also makes into the rank's own
    /// buffer (`copySend`, `recvCopySend`, `recvReduceCopySend`) follows
    /// each piece's transfer on the same core instead of running beside
    /// it. A copy engine or NVLink moves data at the port's rate whatever
    /// the sender's caches hold.
    #[serde(default)]
    pub sender_copies: bool,
    /// With `sender_copies`: the speed of the traffic between two ranks'
    /// cores against the one the rates were fitted at (1 unless
    /// [`ClusterSpec::calibrate`] sets it to the hand-off's ratio). A
    /// sender's copy into a peer's FIFO and the receiver's pass over it
    /// run at their rates times this; a rank's copies into its own
    /// buffers do not.
    #[serde(default = "one")]
    pub handoff_scale: f64,
}

/// The network interfaces of a host.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    /// Line rate, Gb/s, each direction.
    pub gbit: f64,
    /// Fraction of the line rate a transfer achieves (headers, protocol).
    #[serde(default = "one")]
    pub efficiency: f64,
    /// NICs per host (default: one per rank, "rails"). Channel `c` crosses
    /// hosts on NIC `c mod nics` at both ends (its rail), as the engine
    /// routes it; local rank `i` is the one attached to NIC
    /// `i * nics / ranks_per_host` (whose NIC a rank's faults slow).
    #[serde(default)]
    pub per_host: Option<usize>,
    /// One-way latency NIC to NIC, excluding switch hops, microseconds.
    pub latency_us: f64,
}

/// A two-level (leaf / spine) fat tree.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fabric {
    /// Hosts under one leaf switch (per rail when rail optimized).
    pub hosts_per_leaf: usize,
    /// Leaf downlink capacity / uplink capacity (1.0: non-blocking).
    pub oversubscription: f64,
    /// Latency added per switch crossed, microseconds (1 switch within a
    /// leaf, 3 through a spine).
    pub hop_latency_us: f64,
    /// Rail optimized: NIC `i` of every host in a leaf group connects to
    /// leaf `i` of that group; otherwise all NICs of a host share its leaf.
    pub rail_optimized: bool,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric {
            hosts_per_leaf: usize::MAX,
            oversubscription: 1.0,
            hop_latency_us: 0.0,
            rail_optimized: false,
        }
    }
}

/// Efficiency and overheads of one protocol.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtoSpec {
    /// Payload fraction of the bytes on the wire (LL 0.5, LL128 120/128,
    /// Simple 1.0).
    pub efficiency: f64,
    /// Fixed cost of each primitive (step) on a rank, microseconds: flag
    /// polling, synchronisation, kernel step overhead.
    pub step_overhead_us: f64,
    /// Fixed cost of each call on a rank before its first primitive,
    /// microseconds: the host-side path from the call to the first step
    /// (argument checks, planning, handing the work over). NCCL's tuner
    /// calls this the base latency.
    #[serde(default)]
    pub launch_us: f64,
    /// Extra latency of each message for this protocol (Simple's
    /// fences/flags on top of the wire), microseconds.
    #[serde(default)]
    pub extra_latency_us: f64,
    /// FIFO slot size in bytes (one piece); a connection has 8 slots.
    pub slot_bytes: usize,
}

/// The protocols, by name.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocols {
    /// LL: 8-byte lines of 4 data and 4 flag bytes.
    pub ll: ProtoSpec,
    /// LL128: 128-byte lines of 120 data bytes.
    pub ll128: ProtoSpec,
    /// Simple: bulk copies with a flag per slot.
    pub simple: ProtoSpec,
}

impl Protocols {
    /// The figures of `p`.
    pub fn get(&self, p: Protocol) -> &ProtoSpec {
        match p {
            Protocol::Ll => &self.ll,
            Protocol::Ll128 => &self.ll128,
            Protocol::Simple => &self.simple,
        }
    }
}

/// The engine's tuner rules, used when the caller gives no parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    /// Fewest channels.
    pub min_channels: usize,
    /// Most channels.
    pub max_channels: usize,
    /// Bytes per call per channel below which no channel is added.
    pub bytes_per_channel: usize,
    /// Largest call (bytes) given LL when every peer is on one host.
    pub ll_max_bytes: usize,
    /// Largest call given LL128 when every peer is on one host.
    pub ll128_max_bytes: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        // The engine's defaults (rccl-rs/src/tuning.rs, config.rs).
        Tuning {
            min_channels: 1,
            max_channels: 2,
            bytes_per_channel: 512 << 10,
            ll_max_bytes: 16 << 10,
            ll128_max_bytes: 256 << 10,
        }
    }
}

/// Imbalance and faults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Ranks slower than the rest.
    #[serde(default)]
    pub slow_ranks: Vec<SlowRank>,
    /// Links slower than the rest.
    #[serde(default)]
    pub degraded_links: Vec<DegradedLink>,
}

/// A rank whose reduction/copy throughput and/or links are divided by a
/// factor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowRank {
    /// The rank.
    pub rank: usize,
    /// Reduction and copy throughput divided by this (1: unaffected).
    #[serde(default = "one")]
    pub compute_factor: f64,
    /// Bandwidth of the rank's switch port and NIC divided by this.
    #[serde(default = "one")]
    pub link_factor: f64,
}

/// Which link of a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// The rank's intra-host switch port (both directions).
    Intra,
    /// The NIC the rank uses (both directions; shared with any rank on
    /// the same NIC).
    Nic,
}

/// One degraded link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DegradedLink {
    /// The rank whose link it is.
    pub rank: usize,
    /// Which of its links.
    pub link: LinkKind,
    /// Bandwidth divided by this.
    pub factor: f64,
}

fn one() -> f64 {
    1.0
}

/// Errors in a cluster description or a request.
#[derive(Clone, Debug, PartialEq)]
pub struct SimError(pub String);

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimError {}

fn err<T>(msg: impl Into<String>) -> Result<T, SimError> {
    Err(SimError(msg.into()))
}

impl ClusterSpec {
    /// Parse a JSON description.
    pub fn from_json(text: &str) -> Result<ClusterSpec, SimError> {
        serde_json::from_str(text).map_err(|e| SimError(format!("cluster description: {e}")))
    }

    /// The description as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a cluster description serializes")
    }

    /// Ranks in the cluster.
    pub fn nranks(&self) -> usize {
        self.placement
            .as_ref()
            .map_or(self.hosts * self.ranks_per_host, Vec::len)
    }

    /// The host of every rank.
    pub fn host_of(&self) -> Vec<usize> {
        match &self.placement {
            Some(p) => p.clone(),
            None => (0..self.hosts * self.ranks_per_host)
                .map(|r| r / self.ranks_per_host.max(1))
                .collect(),
        }
    }

    /// The NICs per host a communicator's channels spread over: those
    /// attached to its ranks on the host with the fewest (all of a host's
    /// when its ranks fill it).
    pub fn rails(&self) -> usize {
        let nics = self.nic.per_host.unwrap_or(self.ranks_per_host).max(1);
        (self.occupancy().fewest * nics / self.ranks_per_host.max(1)).clamp(1, nics)
    }

    /// How the ranks fill the hosts: without an explicit placement read
    /// off the shape, so that it costs nothing per rank.
    pub fn occupancy(&self) -> Occupancy {
        let Some(placement) = &self.placement else {
            let per_host = self.ranks_per_host.max(1);
            return Occupancy {
                hosts: self.hosts.max(1),
                fewest: per_host,
                most: per_host,
            };
        };
        let labels = placement.iter().max().map_or(1, |&h| h + 1);
        let mut on_host = vec![0usize; labels];
        for &h in placement {
            on_host[h] += 1;
        }
        let used = on_host.iter().copied().filter(|&k| k > 0);
        Occupancy {
            hosts: used.clone().count().max(1),
            fewest: used.clone().min().unwrap_or(1),
            most: used.max().unwrap_or(1),
        }
    }

    /// Sets where the streaming regime starts to the engine's
    /// `RCCL_NT_STORE_BYTES`, `nt_store_bytes`; 0 (the engine never
    /// streams) drops the regime. A cluster without one keeps none.
    pub fn stream_from(&mut self, nt_store_bytes: usize) {
        if nt_store_bytes == 0 {
            self.streaming = None;
        } else if let Some(streaming) = &mut self.streaming {
            streaming.min_bytes = nt_store_bytes;
        }
    }

    /// The same cluster with `hosts` hosts (and the default placement).
    pub fn with_hosts(&self, hosts: usize) -> ClusterSpec {
        ClusterSpec {
            hosts,
            placement: None,
            ..self.clone()
        }
    }

    /// The same cluster with its ranks placed as `host_of` says
    /// (`host_of[r]` the host of rank `r`, hosts numbered from 0): as many
    /// hosts as it names, as many ranks per host as the fullest holds, and
    /// an explicit `placement` only when it is not the default blocks of
    /// consecutive ranks (which keeps symmetry folding available).
    pub fn with_placement(&self, host_of: &[usize]) -> ClusterSpec {
        let hosts = host_of.iter().max().map_or(1, |&h| h + 1);
        let mut count = vec![0usize; hosts];
        for &h in host_of {
            count[h] += 1;
        }
        let ranks_per_host = count.iter().copied().max().unwrap_or(1).max(1);
        let blocks = host_of.len() == hosts * ranks_per_host
            && host_of
                .iter()
                .enumerate()
                .all(|(r, &h)| h == r / ranks_per_host);
        ClusterSpec {
            hosts,
            ranks_per_host,
            placement: (!blocks).then(|| host_of.to_vec()),
            ..self.clone()
        }
    }

    /// The same cluster with its host rates scaled to the machine's speed
    /// of `now`, a probe taken beside the measurement to predict, against
    /// the cluster's own [`ClusterSpec::probe`]: each cache level's rates,
    /// memory's and the streaming ones by the ratio of the same regime's
    /// probe figures (copy by copy, reduction by reduction), and the
    /// traffic between the cores (`intra.handoff_scale`) by the hand-off's
    /// ratio when senders copy (the hand-off is two cores' transfers
    /// through a FIFO each way).
    /// Latencies and fixed costs stay as they are. The result records
    /// `now` as its probe.
    pub fn calibrate(&self, now: &Probe) -> Result<ClusterSpec, SimError> {
        let Some(reference) = &self.probe else {
            return err(format!(
                "cluster {} records no probe to calibrate against (its `probe` field)",
                self.name
            ));
        };
        for (label, probe) in [("the cluster's probe", reference), ("the new probe", now)] {
            if probe.caches.len() != self.caches.len() {
                return err(format!(
                    "{label} has {} cache levels, the cluster {}",
                    probe.caches.len(),
                    self.caches.len()
                ));
            }
            if let Some(v) = probe.all_rates().find(|v| !(v.is_finite() && *v > 0.0)) {
                return err(format!(
                    "{label} holds a rate of {v}; rates must be positive"
                ));
            }
        }
        // One regime's (copy, reduction) rates by its probes' ratios.
        let scale = |copy: &mut f64, reduce: &mut f64, old: Rates, new: Rates| {
            *copy *= new.copy_gbs / old.copy_gbs;
            *reduce *= new.reduce_gbs / old.reduce_gbs;
        };
        let mut c = self.clone();
        for ((cache, &old), &new) in c.caches.iter_mut().zip(&reference.caches).zip(&now.caches) {
            scale(&mut cache.copy_gbs, &mut cache.reduce_gbs, old, new);
        }
        scale(
            &mut c.copy_gbs,
            &mut c.reduce_gbs,
            reference.memory,
            now.memory,
        );
        if let Some(s) = &mut c.streaming {
            scale(
                &mut s.copy_gbs,
                &mut s.reduce_gbs,
                reference.streaming,
                now.streaming,
            );
        }
        if let Some(intra) = c.intra.as_mut().filter(|i| i.sender_copies) {
            intra.handoff_scale *= now.handoff_gbs / reference.handoff_gbs;
        }
        c.probe = Some(now.clone());
        Ok(c)
    }

    /// Checks the description for values the model cannot use.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.hosts == 0 || self.ranks_per_host == 0 {
            return err("hosts and ranks_per_host must be at least 1");
        }
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                err(format!("{name} must be positive, not {v}"))
            }
        };
        let non_negative = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                err(format!("{name} must be >= 0, not {v}"))
            }
        };
        positive("reduce_gbs", self.reduce_gbs)?;
        positive("copy_gbs", self.copy_gbs)?;
        for cache in &self.caches {
            positive("caches.reduce_gbs", cache.reduce_gbs)?;
            positive("caches.copy_gbs", cache.copy_gbs)?;
        }
        if let Some(streaming) = &self.streaming {
            positive("streaming.reduce_gbs", streaming.reduce_gbs)?;
            positive("streaming.copy_gbs", streaming.copy_gbs)?;
            if streaming.min_bytes == 0 {
                return err("streaming.min_bytes must be positive");
            }
        }
        if self.caches.windows(2).any(|w| w[0].bytes >= w[1].bytes) {
            return err("caches must be listed smallest first");
        }
        positive("nic.gbit", self.nic.gbit)?;
        positive("nic.efficiency", self.nic.efficiency)?;
        non_negative("nic.latency_us", self.nic.latency_us)?;
        if let Some(intra) = self.intra {
            positive("intra.port_gbs", intra.port_gbs)?;
            positive("intra.handoff_scale", intra.handoff_scale)?;
            non_negative("intra.latency_us", intra.latency_us)?;
        }
        if self.fabric.hosts_per_leaf == 0 {
            return err("fabric.hosts_per_leaf must be at least 1");
        }
        positive("fabric.oversubscription", self.fabric.oversubscription)?;
        non_negative("fabric.hop_latency_us", self.fabric.hop_latency_us)?;
        for p in Protocol::ALL {
            let s = self.protocols.get(p);
            if !(s.efficiency > 0.0 && s.efficiency <= 1.0) {
                return err(format!("{} efficiency must be in (0, 1]", p.name()));
            }
            non_negative("step_overhead_us", s.step_overhead_us)?;
            non_negative("launch_us", s.launch_us)?;
            non_negative("extra_latency_us", s.extra_latency_us)?;
            if s.slot_bytes == 0 {
                return err(format!("{} slot_bytes must be positive", p.name()));
            }
        }
        if let Some(n) = self.nic.per_host {
            if n == 0 || n > self.ranks_per_host {
                return err("nic.per_host must be in 1..=ranks_per_host");
            }
        }
        let n = self.nranks();
        if let Some(p) = &self.placement {
            let mut count = vec![0usize; self.hosts];
            for (r, &h) in p.iter().enumerate() {
                if h >= self.hosts {
                    return err(format!(
                        "placement puts rank {r} on host {h} of {}",
                        self.hosts
                    ));
                }
                count[h] += 1;
                if count[h] > self.ranks_per_host {
                    return err(format!(
                        "placement puts more than {} ranks on host {h}",
                        self.ranks_per_host
                    ));
                }
            }
        }
        for s in &self.faults.slow_ranks {
            if s.rank >= n {
                return err(format!("slow rank {} is not below {n}", s.rank));
            }
            positive("compute_factor", s.compute_factor)?;
            positive("link_factor", s.link_factor)?;
        }
        for d in &self.faults.degraded_links {
            if d.rank >= n {
                return err(format!("degraded link of rank {} is not below {n}", d.rank));
            }
            positive("factor", d.factor)?;
        }
        Ok(())
    }

    /// Whether every rank is on one host and has a host link (the engine
    /// then picks LL / LL128 for small calls).
    pub fn all_intra(&self) -> bool {
        self.intra.is_some() && self.occupancy().hosts == 1
    }
}

/// How a cluster's ranks fill its hosts ([`ClusterSpec::occupancy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Hosts that hold at least one rank.
    pub hosts: usize,
    /// The fewest ranks such a host holds.
    pub fewest: usize,
    /// The most ranks a host holds.
    pub most: usize,
}

/// Standard protocol figures: efficiencies as NCCL's wire formats give
/// them, slot sizes as the engine's default FIFOs (4 MiB Simple, 480 KiB
/// LL128, 64 KiB LL buffers over 8 slots); `launch` is each one's
/// per-call cost.
fn protocols(
    ll_oh: f64,
    ll128_oh: f64,
    simple_oh: f64,
    simple_extra: f64,
    launch: f64,
) -> Protocols {
    Protocols {
        ll: ProtoSpec {
            efficiency: 0.5,
            step_overhead_us: ll_oh,
            launch_us: launch,
            extra_latency_us: 0.0,
            slot_bytes: 8 << 10,
        },
        ll128: ProtoSpec {
            efficiency: 120.0 / 128.0,
            step_overhead_us: ll128_oh,
            launch_us: launch,
            extra_latency_us: 0.0,
            slot_bytes: 60 << 10,
        },
        simple: ProtoSpec {
            efficiency: 1.0,
            step_overhead_us: simple_oh,
            launch_us: launch,
            extra_latency_us: simple_extra,
            slot_bytes: 512 << 10,
        },
    }
}

/// Preset (a): `hosts` DGX-H100-class hosts. Figures and sources are in
/// `docs/SIMULATOR.md`: 8 GPUs per host on NVSwitch (NVLink4, 900 GB/s
/// bidirectional = 450 GB/s per direction per GPU, taken at 80% achievable
/// for NCCL's copy kernels = 360 GB/s), one 400 Gb/s NIC per GPU at 92%
/// achievable payload rate, a rail-optimized leaf/spine fat tree of 32
/// hosts per leaf (per rail), non-blocking (1:1) by default.
pub fn h100(hosts: usize) -> ClusterSpec {
    ClusterSpec {
        name: "h100-nvswitch-ib400".into(),
        hosts,
        ranks_per_host: 8,
        placement: None,
        intra: Some(IntraLink {
            port_gbs: 360.0,
            sender_copies: false,
            handoff_scale: 1.0,
            latency_us: 0.6,
        }),
        nic: Nic {
            gbit: 400.0,
            efficiency: 0.92,
            per_host: None,
            latency_us: 2.0,
        },
        fabric: Fabric {
            hosts_per_leaf: 32,
            oversubscription: 1.0,
            hop_latency_us: 0.3,
            rail_optimized: true,
        },
        reduce_gbs: 1100.0,
        copy_gbs: 1600.0,
        caches: Vec::new(),
        streaming: None,
        protocols: protocols(0.2, 0.5, 1.0, 2.0, 0.0),
        tuning: Tuning {
            min_channels: 1,
            max_channels: 16,
            bytes_per_channel: 512 << 10,
            ll_max_bytes: 16 << 10,
            ll128_max_bytes: 256 << 10,
        },
        faults: Faults::default(),
        probe: None,
    }
}

/// Preset (b): this development machine, ranks as processes on one host
/// over shared memory (`intra`) or over TCP loopback (`nic`, used when
/// `tcp_only`). Figures measured as `docs/SIMULATOR.md` describes.
pub fn local(ranks: usize, tcp_only: bool) -> ClusterSpec {
    ClusterSpec {
        name: if tcp_only { "local-tcp" } else { "local-shm" }.into(),
        hosts: 1,
        ranks_per_host: ranks,
        placement: None,
        intra: (!tcp_only).then_some(IntraLink {
            port_gbs: LOCAL_SHM_GBS,
            sender_copies: true,
            handoff_scale: 1.0,
            latency_us: LOCAL_SHM_LATENCY_US,
        }),
        nic: Nic {
            gbit: LOCAL_TCP_GBIT,
            efficiency: 1.0,
            per_host: Some(1),
            latency_us: LOCAL_TCP_LATENCY_US,
        },
        fabric: Fabric::default(),
        reduce_gbs: LOCAL_REDUCE_GBS,
        copy_gbs: LOCAL_COPY_GBS,
        caches: vec![
            Cache {
                bytes: LOCAL_L2_BYTES,
                reduce_gbs: LOCAL_L2_REDUCE_GBS,
                copy_gbs: LOCAL_L2_COPY_GBS,
            },
            Cache {
                bytes: LOCAL_L3_BYTES,
                reduce_gbs: LOCAL_L3_REDUCE_GBS,
                copy_gbs: LOCAL_L3_COPY_GBS,
            },
        ],
        streaming: Some(Streaming {
            min_bytes: LOCAL_L3_BYTES,
            reduce_gbs: LOCAL_STREAMING_REDUCE_GBS,
            copy_gbs: LOCAL_STREAMING_COPY_GBS,
        }),
        protocols: protocols(
            LOCAL_STEP_OVERHEAD_US,
            LOCAL_STEP_OVERHEAD_US,
            LOCAL_STEP_OVERHEAD_US,
            0.0,
            LOCAL_LAUNCH_US,
        ),
        tuning: Tuning::default(),
        faults: Faults::default(),
        probe: Some(local_probe()),
    }
}

/// The probe the local-shm rates were fitted beside (`probe_local`, the
/// median over the fit runs of each run's fastest figures).
pub fn local_probe() -> Probe {
    let rates = |(copy_gbs, reduce_gbs)| Rates {
        copy_gbs,
        reduce_gbs,
    };
    Probe {
        caches: vec![rates(LOCAL_PROBE_L2), rates(LOCAL_PROBE_L3)],
        memory: rates(LOCAL_PROBE_MEMORY),
        streaming: rates(LOCAL_PROBE_STREAMING),
        handoff_gbs: LOCAL_PROBE_HANDOFF_GBS,
    }
}

// The local-shm figures below were fitted to this machine's perf binaries
// (2 processes bound to a core each, ring, 64 KiB-256 MiB, all-reduce,
// all-gather and reduce-scatter, the fastest of 5 rounds x 3 cycles per
// size on an idle machine, `STAT=best ROUNDS=5`, four runs pooled, each
// calibrated to the probe taken beside it): `scripts/sim-validate.sh`
// measures and probes, `simulator/examples/fit_local.rs` fits the
// shared-memory bandwidth, the per-primitive and per-call overheads and
// the four pairs of reduction / copy rates (L2, L3, memory, streaming),
// all at the reference probe below (`local_probe`, the median of the four
// runs' probes); the cache sizes, the streaming threshold (the engine's
// default, the L3's size) and the shared-memory latency are not fitted.
// docs/SIMULATOR.md "Against this machine".

/// Most shared-memory transfer bandwidth per rank, GB/s: a transfer is the
/// sender's copy into the segment, at the lower of this and the sender's
/// copy rate for the call, times `handoff_scale` (fitted: close to the
/// probe's hand-off between the cores, and below the cache copy rates,
/// which bind for copies into a rank's own buffers).
pub const LOCAL_SHM_GBS: f64 = 16.0;
/// Shared-memory wake-up latency, microseconds (not refitted: at 64 KiB
/// and up it does not change the fit).
pub const LOCAL_SHM_LATENCY_US: f64 = 0.5;
/// TCP loopback throughput, Gb/s.
pub const LOCAL_TCP_GBIT: f64 = 16.0;
/// TCP loopback one-way latency, microseconds.
pub const LOCAL_TCP_LATENCY_US: f64 = 30.0;
/// Reduction throughput of one rank (float sum) whose working set fits
/// no cache level (memory), GB/s.
pub const LOCAL_REDUCE_GBS: f64 = 8.0;
/// Copy throughput of one rank whose working set fits no cache level
/// (memory), GB/s.
pub const LOCAL_COPY_GBS: f64 = 11.0;
/// This machine's L2 caches, bytes: 512 KiB private to each of its two
/// cores (`/sys/devices/system/cpu/cpu*/cache/index2`).
pub const LOCAL_L2_BYTES: usize = 2 * (512 << 10);
/// Reduction throughput of a rank whose working set fits its L2, GB/s.
pub const LOCAL_L2_REDUCE_GBS: f64 = 18.0;
/// Copy throughput of a rank whose working set fits its L2, GB/s.
pub const LOCAL_L2_COPY_GBS: f64 = 40.0;
/// This machine's last-level cache (L3), bytes, shared by its two cores
/// (`/sys/devices/system/cpu/cpu0/cache/index3`).
pub const LOCAL_L3_BYTES: usize = 32 << 20;
/// Reduction throughput of a rank whose working set fits its share of the
/// L3, GB/s.
pub const LOCAL_L3_REDUCE_GBS: f64 = 24.0;
/// Copy throughput of a rank whose working set fits its share of the L3,
/// GB/s.
pub const LOCAL_L3_COPY_GBS: f64 = 32.0;
/// Reduction throughput of a rank whose call streams (its buffers reach
/// the engine's default threshold, the L3's size), GB/s.
pub const LOCAL_STREAMING_REDUCE_GBS: f64 = 10.0;
/// Copy throughput of a rank whose call streams, GB/s.
pub const LOCAL_STREAMING_COPY_GBS: f64 = 13.0;
/// Fixed cost of a primitive on a CPU rank (a pass of the drive loop and
/// the FIFO's flags), µs.
pub const LOCAL_STEP_OVERHEAD_US: f64 = 0.5;
/// Fixed cost of a call on a CPU rank before its first primitive (the
/// call's checks, planning and hand-over), µs.
pub const LOCAL_LAUNCH_US: f64 = 1.5;
/// `probe_local`'s (copy, reduction) GB/s per core beside the fit runs
/// (the median of the runs' probes, each the median of its rounds'),
/// L2-resident working sets.
pub const LOCAL_PROBE_L2: (f64, f64) = (46.3, 30.3);
/// The same, working sets in a core's share of the L3.
pub const LOCAL_PROBE_L3: (f64, f64) = (33.4, 23.1);
/// The same, working sets beyond the L3, ordinary stores.
pub const LOCAL_PROBE_MEMORY: (f64, f64) = (8.6, 6.0);
/// The same, working sets beyond the L3, non-temporal stores.
pub const LOCAL_PROBE_STREAMING: (f64, f64) = (9.2, 7.3);
/// `probe_local`'s hand-off between the two cores beside the fit runs,
/// GB/s per core.
pub const LOCAL_PROBE_HANDOFF_GBS: f64 = 13.6;

/// A preset by name: `h100` (with `hosts`), `local-shm` / `local-tcp`
/// (with `ranks_per_host` ranks).
pub fn preset(name: &str, hosts: usize, ranks: usize) -> Option<ClusterSpec> {
    match name {
        "h100" => Some(h100(hosts)),
        "local-shm" | "local" => Some(local(ranks, false)),
        "local-tcp" => Some(local(ranks, true)),
        _ => None,
    }
}
