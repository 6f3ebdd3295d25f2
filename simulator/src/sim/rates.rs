//! What a rank's call touches ([`Footprint`]) and the rates it runs at
//! for it ([`Regime`]: a cache level, memory or streaming).

use rccl_algorithms::CollSpec;

use crate::cluster::ClusterSpec;

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
pub(super) fn rank_rates(
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
