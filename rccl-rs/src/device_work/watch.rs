//! While device work runs, the processes of the communicator's ranks
//! elsewhere on this host are watched: one that dies stops the work with
//! an error naming its rank, as the host path's shared-memory links do.
//! (A process id means nothing on another host: the network connections
//! tell those ranks' ends.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rccl_transports::process::ProcessId;

use crate::comm::CommInner;
use crate::error::Error;

/// How often a running launch looks at its peers' processes.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// How long a launch may go on after a peer's process was seen gone.
const DEAD_PEER_GRACE: Duration = Duration::from_secs(2);

/// A peer seen gone: since when, which rank, why.
type Gone = (Instant, usize, String);

/// A watch over the processes of a communicator's ranks elsewhere on this
/// host, for a running launch.
pub(crate) struct Watch {
    comm: Arc<CommInner>,
    peers: Vec<(usize, ProcessId)>,
    /// When to look next; the first peer seen gone.
    state: Mutex<(Instant, Option<Gone>)>,
}

impl Watch {
    /// `None` when no rank of `comm` is in another process of this host
    /// (a process id means nothing on another host: the network
    /// connections tell those ranks' ends).
    pub(crate) fn new(comm: &Arc<CommInner>) -> Option<Watch> {
        let here = &comm.peers[comm.rank].host_id;
        let peers: Vec<(usize, ProcessId)> = (0..comm.nranks)
            .filter(|&peer| {
                let p = &comm.peers[peer];
                comm.in_other_process(peer) && p.start != 0 && p.host_id == *here
            })
            .map(|peer| {
                let p = &comm.peers[peer];
                (
                    peer,
                    ProcessId {
                        pid: p.pid,
                        start: p.start,
                    },
                )
            })
            .collect();
        (!peers.is_empty()).then(|| Watch {
            comm: comm.clone(),
            peers,
            state: Mutex::new((Instant::now(), None)),
        })
    }

    /// Whether a peer's process has died while this launch still needs it
    /// (looked at every [`WATCH_EVERY`]); the first one found poisons the
    /// communicator with an error naming it. A peer may finish its part
    /// and exit while this rank still drains what it wrote (the FIFOs stay
    /// mapped here), so a launch fails only when it still runs
    /// [`DEAD_PEER_GRACE`] after the peer was seen gone.
    pub(crate) fn peer_died(&self) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock();
        if now < state.0 {
            return false;
        }
        state.0 = now + WATCH_EVERY;
        if state.1.is_none() {
            state.1 = self
                .peers
                .iter()
                .find_map(|(peer, process)| Some((now, *peer, process.gone()?)));
        }
        // The first peer seen gone is named: the others may have failed
        // and exited because of it.
        let Some((since, peer, why)) = &state.1 else {
            return false;
        };
        if now.duration_since(*since) < DEAD_PEER_GRACE {
            return false;
        }
        self.comm.poison(&Error::Remote(format!(
            "rank {}: device work: {} died: {why}",
            self.comm.rank,
            self.comm.describe(*peer)
        )));
        true
    }
}
