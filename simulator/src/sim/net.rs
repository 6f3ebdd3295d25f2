//! The cluster resolved for a replay: every link's capacity (rank ports,
//! NICs, leaf switches' up- and downlinks, faults applied) and each
//! rank's rates ([`Net`]), and the route of a message between two ranks
//! on a channel ([`Geo::path`]).

use crate::cluster::{ClusterSpec, IntraLink, LinkKind, ProtoSpec};

use super::rates::{rank_rates, Footprint};

/// The resolved cluster: placement and link capacities (bytes / µs).
pub(super) struct Net {
    pub(super) host_of: Vec<usize>,
    pub(super) local: Vec<usize>,
    /// Link bandwidths, bytes per microsecond.
    pub(super) bw: Vec<f64>,
    /// Whether a rank's transfers within a host are its own copies.
    pub(super) sender_copies: bool,
    pub(super) intra_tx: usize,
    pub(super) intra_rx: usize,
    pub(super) nic_tx: usize,
    pub(super) nic_rx: usize,
    /// The NICs per host the channels spread over: those attached to the
    /// communicator's ranks on the host with the fewest (all of a host's
    /// when its ranks fill it).
    pub(super) rails: usize,
    pub(super) leaf_up: usize,
    pub(super) leaf_down: usize,
    pub(super) nics: usize,
    pub(super) reduce: Vec<f64>,
    pub(super) copy: Vec<f64>,
}

/// A transfer's route: up to 4 links and its latency.
pub(super) struct Path {
    pub(super) links: [usize; 4],
    pub(super) len: usize,
    pub(super) latency: f64,
    /// Whether the sender's own copy moves the data (a host link with
    /// `sender_copies`): a forwarding primitive then writes its output
    /// straight into the transfer, in the same pass as it processes it,
    /// and a copy into the rank's own buffer is a second pass after it.
    pub(super) sender_copies: bool,
    /// How fast a pass over the message at its receiver runs against the
    /// rank's rates (`intra.handoff_scale` for a copying sender's, else 1).
    pub(super) receive_scale: f64,
}

impl Net {
    pub(super) fn new(c: &ClusterSpec, footprint: impl Fn(usize) -> Footprint) -> Net {
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
pub(super) struct Geo {
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
    pub(super) fn new(cluster: &ClusterSpec, proto: &ProtoSpec) -> Geo {
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
    pub(super) fn path(&self, net: &Net, src: usize, dst: usize, ch: usize, away: bool) -> Path {
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
