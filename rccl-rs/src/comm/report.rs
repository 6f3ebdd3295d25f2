//! What a communicator tells about itself: its activity for hang reports
//! (every live communicator of the process, on request or on a signal),
//! and what init found, logged.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::CommInner;

/// What a communicator is doing, for hang reports on request: set when a
/// launch starts and ends, and refreshed while it is stuck.
#[derive(Default)]
pub(crate) struct Activity {
    /// When the launch in flight started.
    pub since: Option<Instant>,
    /// Its first operation (sequence number and name) and how many
    /// operations it holds.
    pub first: (u64, &'static str),
    pub ops: usize,
    /// How long it had made no progress, and what each stuck channel
    /// waited for, at the last check.
    pub stalled: Option<std::time::Duration>,
    pub waiting: Vec<String>,
}

/// Every live communicator of this process, for hang reports.
static LIVE: Mutex<Vec<std::sync::Weak<CommInner>>> = Mutex::new(Vec::new());

pub(super) fn register(inner: &Arc<CommInner>) {
    let mut live = LIVE.lock();
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(inner));
}

/// The state of every live communicator of this process, one block per
/// communicator: the operation in flight (sequence number, collective),
/// and per stuck channel the step, primitive and the peer waited for.
pub fn hang_report() -> String {
    let live: Vec<Arc<CommInner>> = LIVE.lock().iter().filter_map(|w| w.upgrade()).collect();
    if live.is_empty() {
        return "rccl: no live communicators".to_string();
    }
    live.iter()
        .map(|c| c.report())
        .collect::<Vec<_>>()
        .join("\n")
}

impl CommInner {
    /// This communicator's part of a hang report.
    pub fn report(&self) -> String {
        let head = format!("rank {} of {}", self.rank, self.nranks);
        let activity = self.activity.lock();
        let mut text = match activity.since {
            None => format!("{head}: no operation in flight"),
            Some(since) => {
                let (seq, name) = activity.first;
                let more = match activity.ops {
                    0 | 1 => String::new(),
                    n => format!(" and {} more", n - 1),
                };
                let mut text = format!(
                    "{head}: operation #{seq} {name}{more} in flight for {:?}",
                    since.elapsed()
                );
                match activity.stalled {
                    Some(stalled) => {
                        text += &format!(", no progress for {stalled:?}");
                        for line in &activity.waiting {
                            text += &format!("\n  {line}");
                        }
                    }
                    None => text += ", progressing",
                }
                text
            }
        };
        drop(activity);
        if self.abort.load(Ordering::Relaxed) {
            text += &format!("\n  {}", self.ended_how());
        }
        if let Some(err) = self.poisoned.get() {
            text += &format!("\n  failed: {err}");
        }
        text
    }

    /// Logs what init found: the placement, the rings and trees, and how
    /// peers will be reached (`NCCL_DEBUG=INFO`, subsystems INIT and GRAPH).
    pub(super) fn log_init(&self) {
        use crate::debug::{GRAPH, INIT};
        let (rank, n) = (self.rank, self.nranks);
        tracing::info!(
            target: INIT,
            "[{rank}] comm {:p} rank {rank} nRanks {n} nHosts {} host {} - Init COMPLETE",
            self,
            self.topology.nhosts(),
            self.peers[rank].host
        );
        if !tracing::enabled!(target: GRAPH, tracing::Level::INFO) {
            return;
        }
        for (host, ranks) in self.topology.hosts().iter().enumerate() {
            let name = &self.peers[ranks[0]].host;
            tracing::info!(target: GRAPH, "[{rank}] Topology: host {host} ({name}): ranks {ranks:?}");
        }
        let nics: Vec<String> = self.peers[rank]
            .nics
            .iter()
            .enumerate()
            .map(|(i, nic)| format!("[{i}]{}:{}<{}Mb/s>", nic.name, nic.addr, nic.speed_mbps))
            .collect();
        tracing::info!(
            target: GRAPH,
            "[{rank}] NET/Socket : Using {} ; {} rail(s) across {} host(s)",
            nics.join(" "),
            self.rails,
            self.topology.nhosts()
        );
        // As NCCL: per channel its ring, the tree it runs with all
        // channels in use (both on a lone or last odd channel), and the
        // NIC its traffic between hosts takes.
        let nch = self.config.max_channels;
        for channel in 0..nch {
            let ring: Vec<String> = self
                .topology
                .ring_order(channel)
                .iter()
                .map(|r| r.to_string())
                .collect();
            let nic = if self.topology.nhosts() > 1 {
                let rail = channel % self.rails;
                let nic = &self.peers[rank].nics[rail];
                format!(" ; NIC {rail} {} {}", nic.name, nic.addr)
            } else {
                String::new()
            };
            tracing::info!(
                target: GRAPH,
                "[{rank}] Channel {channel:02}/{nch:02} : Ring : {}{nic}",
                ring.join(" ")
            );
            for &t in rccl_algorithms::tree::channel_trees(nch, channel) {
                let node = rccl_algorithms::tree::channel_tree(&self.topology, channel, t, rank);
                let parent = node.parent.map_or("-1".to_string(), |p| p.to_string());
                tracing::info!(
                    target: GRAPH,
                    "[{rank}] Channel {channel:02}/{nch:02} : Tree {t} : {parent} -> {rank} -> {:?}",
                    node.children
                );
            }
        }
        for peer in (0..n).filter(|&p| p != rank) {
            let via = if self.shares_memory_with(peer) {
                "SHM/direct".to_string()
            } else {
                format!("{} {}", self.net.name(), self.peers[peer].data_addr)
            };
            tracing::info!(target: GRAPH, "[{rank}] Transport to rank {peer} ({}): {via}", self.peers[peer].host);
        }
    }
}
