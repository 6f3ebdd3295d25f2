//! Which ranks share a host: the input hierarchical algorithms need.

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
}
