//! Which ranks share a host: the input hierarchical algorithms need, and
//! the order of each channel's ring and chain across hosts.

use crate::Rank;

/// The placement of a communicator's ranks on hosts.
///
/// Hosts are numbered `0..nhosts()` in the order their first rank appears,
/// whatever labels [`Topology::from_hosts`] was given, so every rank that
/// builds the topology from the same placement sees the same numbers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Topology {
    host_of: Vec<usize>,
    hosts: Vec<Vec<Rank>>,
}

impl Topology {
    /// Every rank on one host.
    pub fn flat(nranks: usize) -> Topology {
        Topology::from_hosts(vec![0; nranks])
    }

    /// `host_of[r]` labels the host of rank `r`; labels are any numbers,
    /// equal labels meaning the same host.
    pub fn from_hosts(host_of: Vec<usize>) -> Topology {
        let mut labels: Vec<usize> = Vec::new();
        let mut hosts: Vec<Vec<Rank>> = Vec::new();
        let mut dense = Vec::with_capacity(host_of.len());
        for (rank, &label) in host_of.iter().enumerate() {
            let h = match labels.iter().position(|&l| l == label) {
                Some(h) => h,
                None => {
                    labels.push(label);
                    hosts.push(Vec::new());
                    labels.len() - 1
                }
            };
            hosts[h].push(rank);
            dense.push(h);
        }
        Topology {
            host_of: dense,
            hosts,
        }
    }

    /// `nhosts` hosts of `per_host` consecutive ranks each.
    pub fn blocks(nhosts: usize, per_host: usize) -> Topology {
        Topology::from_hosts((0..nhosts * per_host).map(|r| r / per_host).collect())
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.host_of.len()
    }

    /// Number of hosts.
    pub fn nhosts(&self) -> usize {
        self.hosts.len()
    }

    /// The host of `rank`.
    pub fn host_of(&self, rank: Rank) -> usize {
        self.host_of[rank]
    }

    /// The ranks of every host, in rank order.
    pub fn hosts(&self) -> &[Vec<Rank>] {
        &self.hosts
    }

    /// The ranks on `host`, in rank order.
    pub fn local_ranks(&self, host: usize) -> &[Rank] {
        &self.hosts[host]
    }

    /// The index of `rank` among the ranks of its host.
    pub fn local_index(&self, rank: Rank) -> usize {
        let host = &self.hosts[self.host_of[rank]];
        host.iter()
            .position(|&r| r == rank)
            .expect("a rank is on its host")
    }

    /// The ranks per host when every host has the same number.
    pub fn ranks_per_host(&self) -> Option<usize> {
        let first = self.hosts.first().map_or(0, Vec::len);
        self.hosts.iter().all(|h| h.len() == first).then_some(first)
    }

    /// The ranks with local index `index`, one per host, in host order
    /// (a "rail"); hosts with fewer ranks are skipped.
    pub fn rail(&self, index: usize) -> Vec<Rank> {
        self.hosts
            .iter()
            .filter_map(|h| h.get(index).copied())
            .collect()
    }

    /// The ranks of `host` in the order channel `channel` visits them:
    /// rotated so that the channel enters the host at local index
    /// `channel mod m` (`m` ranks on the host) and leaves it from the one
    /// before. Each channel's traffic crosses hosts on one NIC (its rail),
    /// so a channel enters and leaves every host on the same rail, and the
    /// ranks that touch the network change from channel to channel.
    pub fn host_chain(&self, host: usize, channel: usize) -> Vec<Rank> {
        let ranks = &self.hosts[host];
        let first = channel % ranks.len();
        ranks[first..]
            .iter()
            .chain(&ranks[..first])
            .copied()
            .collect()
    }

    /// The ring of channel `channel` (NCCL's rail-aligned rings): every
    /// host's [`Topology::host_chain`], hosts in order, so the ring crosses
    /// each host boundary exactly once, and the hop out of a host and the
    /// hop into the next use the channel's rail. With one host, rank order.
    pub fn ring_order(&self, channel: usize) -> Vec<Rank> {
        if self.nhosts() <= 1 {
            return (0..self.nranks()).collect();
        }
        (0..self.nhosts())
            .flat_map(|host| self.host_chain(host, channel))
            .collect()
    }
}
