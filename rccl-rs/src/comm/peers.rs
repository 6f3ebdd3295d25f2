//! What a rank knows of its peers' fate: whether one runs in another
//! process, whether it is gone, and the failure it told before it went.

use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::Mutex;

use super::CommInner;
use crate::agreement::stuck::{self, note_error, STALL_CHECK_EVERY};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// How long a peer whose process is gone may keep its last words unread
/// (see [`CommInner::peer_gone`]).
const PROCESS_GONE_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

impl CommInner {
    /// Whether `peer` runs in another process than this rank.
    pub fn in_other_process(&self, peer: usize) -> bool {
        let (me, them) = (&self.peers[self.rank], &self.peers[peer]);
        them.pid != me.pid || them.start != me.start || them.host_id != me.host_id
    }

    /// Why `peer` can take no part any more, if that is known: its process
    /// on this host is gone, or its bootstrap connection with this rank
    /// ended (a process that dies closes its sockets). For waits on a peer
    /// that no connection of the communicator joins yet (connection
    /// setup), which no closing note can end.
    pub fn peer_gone(&self, peer: usize) -> Option<Error> {
        let why = match self.processes[peer].and_then(|process| process.gone()) {
            Some(why) if self.said_all_it_could(peer) => format!("died: {why}"),
            Some(_) => return None,
            None => self.bootstrap.peer_gone(peer)?,
        };
        let gone = Error::Remote(format!("rank {}: {} {why}", self.rank, self.describe(peer)));
        // A failure the peer told before it went is the news, not its end.
        Some(stuck::peer_failure(self).unwrap_or(gone))
    }

    /// Whether what `peer`, whose process is gone, said before it went has
    /// been read: its bootstrap connection was read to its end, or
    /// [`PROCESS_GONE_GRACE`] passed since its process was first seen gone
    /// (a peer that never opened a connection to this rank leaves none to
    /// read). A rank that fails and exits at once tells its failure first;
    /// without this, a peer could see the process end before the reader
    /// thread reached the note, and report a death instead of the cause.
    fn said_all_it_could(&self, peer: usize) -> bool {
        if self.bootstrap.read_to_end(peer) {
            return true;
        }
        let now = Instant::now();
        let since = *self.process_gone_since.lock().entry(peer).or_insert(now);
        now.duration_since(since) >= PROCESS_GONE_GRACE
    }

    /// The failure of one of `peers` that runs in this process, as this
    /// rank reports it: read without a socket, so that it arrives even
    /// when the failed rank could open none to tell this one.
    pub fn peer_failure_in_process(&self, peers: &[usize]) -> Option<Error> {
        peers.iter().find_map(|&peer| {
            if self.in_other_process(peer) {
                return None;
            }
            let note = self.bootstrap.failure_in_process(peer)?;
            let context = format!("rank {}: word from {}", self.rank, self.describe(peer));
            Some(note_error(&note, &context))
        })
    }
}

/// What a wait on peers that no connection joins yet (connection setup)
/// checks between its attempts: at once whether this rank was aborted or
/// destroyed, and every [`STALL_CHECK_EVERY`] whether a peer
/// told it of a failure or one of the peers waited for is gone (a peer
/// that died or left before setting up its side never will).
#[derive(Clone, Default)]
pub(crate) struct PeerWatch {
    next: Option<Instant>,
}

impl PeerWatch {
    pub fn check(&mut self, comm: &CommInner, peers: &[usize]) -> Result<()> {
        if comm.abort.load(Ordering::Relaxed) {
            return Err(comm.ended_error());
        }
        let now = Instant::now();
        if self.next.is_some_and(|next| now < next) {
            return Ok(());
        }
        self.next = Some(now + STALL_CHECK_EVERY);
        let failure = stuck::peer_failure(comm)
            .or_else(|| peers.iter().find_map(|&peer| comm.peer_gone(peer)));
        failure.map_or(Ok(()), Err)
    }
}

impl stuck::Member for CommInner {
    fn rank(&self) -> usize {
        self.rank
    }
    fn describe(&self, rank: usize) -> String {
        CommInner::describe(self, rank)
    }
    fn bootstrap(&self) -> &Bootstrap {
        &self.bootstrap
    }
    fn heard(&self) -> &Mutex<stuck::Heard> {
        &self.heard
    }
}
