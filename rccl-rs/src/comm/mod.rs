//! The communicator and its lifetime: what every rank holds
//! ([`CommInner`]), the handle users get ([`Communicator`]), and its end
//! (abort, destroy, finalize, the note peers get). Joining and splitting,
//! the init information's bytes, the tuner's remembered choices, what a
//! rank knows of its peers and what it reports live beside it.

mod choices;
mod init;
mod peers;
mod report;
mod signal;
mod split;
mod state;
mod suspend;
mod wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rccl_algorithms::Topology;
use rccl_transports::Connection;
use rccl_transports::ProcessId;
use rccl_transports::Transport;

use crate::agreement::stuck::{self, USAGE_NOTE};
use crate::bootstrap::Bootstrap;
use crate::config::Config;
use crate::error::{Error, Result};
use choices::ChoiceCache;
pub(crate) use peers::PeerWatch;
pub use report::hang_report;
pub(crate) use report::Activity;
pub use signal::report_hangs_on_signal;
pub(crate) use state::{BoardLink, ExecState, KeptLinks, Link, LoneBoardCall};
use wire::PeerInfo;

/// One rank's communicator, shared by its handles, the calls in flight
/// and the work queued on streams.
pub(crate) struct CommInner {
    pub rank: usize,
    /// What the communicator holds in memory.
    pub memory: Arc<crate::memory::Ledger>,
    /// Set between `ncclCommSuspend` and `ncclCommResume` (`suspend.rs`).
    pub suspended: AtomicBool,
    /// How many times the communicator was resumed: connections made
    /// after a resume are keyed apart from those made before.
    pub resumes: AtomicU64,
    pub nranks: usize,
    pub config: Config,
    pub bootstrap: Bootstrap,
    /// The network connections to other hosts go through (its entry of
    /// the transport table).
    pub net: Arc<dyn Transport>,
    pub peers: Vec<PeerInfo>,
    /// Per rank, its process when it runs elsewhere on this host and this
    /// rank sees it (same pid namespace), found at init while every rank
    /// runs: waits on a peer check that it still does.
    pub processes: Vec<Option<ProcessId>>,
    /// When each peer's process was first seen gone while its bootstrap
    /// connection was not yet read to its end (see [`CommInner::peer_gone`]).
    process_gone_since: Mutex<std::collections::HashMap<usize, Instant>>,
    pub abort: Arc<AtomicBool>,
    /// How the communicator was ended, once `abort` is set: "aborted"
    /// (`ncclCommAbort`) or "destroyed" (`ncclCommDestroy` while another
    /// thread ran an operation on it).
    ended: std::sync::OnceLock<&'static str>,
    /// The first failure; every later call returns it.
    pub poisoned: std::sync::OnceLock<Error>,
    /// Sequence number of the next collective (every rank counts the same
    /// collectives, so it is part of each piece's tag).
    pub next_seq: AtomicU64,
    /// Sequence number of the next batch of sends and receives (for
    /// reports only: ranks take part in different batches).
    pub next_p2p_seq: AtomicU64,
    /// Whether every peer is reached through shared memory.
    pub all_shm: bool,
    /// Whether the transport table links this rank's device work with
    /// every peer's, as decided at its first call on device memory.
    pub device_work_reaches_all: std::sync::OnceLock<bool>,
    /// Which ranks share a host.
    pub topology: Topology,
    /// The rails: NICs per host that the channels spread over (the fewest
    /// any host has); channel `c` crosses hosts on NIC `c mod rails`.
    pub rails: usize,
    pub exec: Mutex<ExecState>,
    pub activity: Mutex<Activity>,
    /// What peers waiting on this rank said they run.
    pub heard: Mutex<stuck::Heard>,
    splits: AtomicU64,
    /// The cost model's link figures, read once at init.
    pub link_model: crate::tuning::LinkModel,
    choices: Mutex<ChoiceCache>,
    /// Launches enqueued on streams and not finished yet.
    pub queued: crate::queue::Queued,
    /// One-sided calls enqueued on streams (puts, signals, waits), which
    /// no launch waits for, and not finished yet.
    pub one_sided_queued: Arc<crate::queue::Queued>,
    /// This communicator's context of a C tuner plug-in
    /// (`NCCL_TUNER_PLUGIN`), finalized when the communicator goes.
    tuner: Option<crate::plugins::tuner::CTuner>,
    /// This communicator's context of a C profiler plug-in
    /// (`NCCL_PROFILER_PLUGIN`), finalized when the communicator goes;
    /// `None`, the common case, costs a call one test.
    pub profiler: Option<crate::plugins::profiler::CProfiler>,
    /// The windows and signals of one-sided calls, once a window was
    /// registered (`onesided/`'s own type, read back as it).
    pub one_sided: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Collectives that ran on symmetric windows, reading and writing
    /// peers' windows directly.
    pub symmetric_calls: AtomicU64,
}

impl crate::queue::Owner for CommInner {
    fn rank(&self) -> usize {
        self.rank
    }

    fn timeout(&self) -> std::time::Duration {
        self.config.timeout
    }

    fn check_usable(&self) -> Result<()> {
        CommInner::check_usable(self)
    }
}

impl CommInner {
    /// Waits for this rank's work queued on streams: its launches, then
    /// its one-sided calls, within the communicator's timeout.
    pub(crate) fn wait_stream_work(&self) -> Result<()> {
        let deadline = Instant::now() + self.config.timeout;
        self.queued.wait_idle(self)?;
        self.one_sided_queued.wait_idle_within(
            self,
            deadline.saturating_duration_since(Instant::now()),
            "the communicator's one-sided calls queued on streams",
        )
    }

    /// Bytes each rank may post on the board: the configured size when
    /// every rank shares this host, else 0 (no board).
    pub fn board_bytes(&self) -> usize {
        if self.all_shm && self.nranks > 1 {
            self.config.board_bytes
        } else {
            0
        }
    }

    /// Whether `peer` runs on this rank's host and may be reached through
    /// shared memory.
    pub fn shares_memory_with(&self, peer: usize) -> bool {
        !self.config.shm_disable && self.peers[peer].host_id == self.peers[self.rank].host_id
    }

    /// "rank 3 (host h, pid 42)"; for a rank on another host, with its
    /// address: "rank 3 (host h, 10.0.0.2, pid 42)".
    pub fn describe(&self, rank: usize) -> String {
        match self.peers.get(rank) {
            Some(p) if p.host_id != self.peers[self.rank].host_id => format!(
                "rank {rank} (host {}, {}, pid {})",
                p.host,
                p.data_addr.ip(),
                p.pid
            ),
            Some(p) => format!("rank {rank} (host {}, pid {})", p.host, p.pid),
            None => format!("rank {rank}"),
        }
    }

    /// Fails if the communicator was aborted or has failed.
    pub fn check_usable(&self) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(self.ended_error());
        }
        if let Some(err) = self.poisoned.get() {
            return Err(err.clone());
        }
        if self.suspended.load(Ordering::Acquire) {
            return Err(suspend::suspended_error(self.rank));
        }
        Ok(())
    }

    /// Ends every operation in flight and every later call: `how` says
    /// how ("aborted", "destroyed") in their errors and in the note peers
    /// get. Peers waiting on this rank learn it at once through its
    /// connections (an operation in flight tells them as it stops).
    pub fn end(&self, how: &'static str) {
        let _ = self.ended.set(how);
        self.abort.store(true, Ordering::SeqCst);
        // Nothing lands in a window once this returns: its memory may go.
        self.bootstrap.stop_sinks();
        if let Some(state) = self.exec.try_lock() {
            close_links(self, &state, &self.ended_error());
        }
    }

    /// How the communicator was ended ("aborted" unless said otherwise).
    pub fn ended_how(&self) -> &'static str {
        self.ended.get().copied().unwrap_or("aborted")
    }

    /// The error of a call on an ended communicator.
    pub fn ended_error(&self) -> Error {
        if self.ended.get().is_none() {
            if let Some(why) = self.bootstrap.broken() {
                return Error::System(format!("rank {}: bootstrap: {why}", self.rank));
            }
        }
        let how = self.ended_how();
        let during = if how == "destroyed" {
            " (ncclCommDestroy) while this call was in flight"
        } else {
            ""
        };
        Error::InvalidUsage(format!(
            "rank {}: the communicator was {how}{during}",
            self.rank
        ))
    }

    /// Records the communicator's first failure.
    pub fn poison(&self, err: &Error) {
        // The first failure stays; later ones are its consequences.
        if self.poisoned.set(err.clone()).is_ok() {
            self.bootstrap.record_failure(&failure_note(self, err));
        }
    }
}

/// A communicator: a group of ranks that run collectives together.
///
/// Every rank creates its own `Communicator` with the same unique id and
/// rank count. The handle is cheap to share between threads, but like an
/// NCCL communicator it runs one operation (or group) at a time; a second
/// thread calling into it waits for the first.
///
/// ```
/// use rccl::{Communicator, RedOp};
///
/// let comms = Communicator::init_all(2).unwrap();
/// std::thread::scope(|s| {
///     for comm in &comms {
///         s.spawn(move || {
///             let mine = [comm.rank() as f32 + 1.0; 4];
///             let mut sum = [0.0f32; 4];
///             comm.all_reduce(&mine, &mut sum, RedOp::Sum).unwrap();
///             assert_eq!(sum, [3.0; 4]);
///         });
///     }
/// });
/// ```
#[derive(Clone)]
pub struct Communicator {
    pub(crate) inner: Arc<CommInner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.rank)
            .field("nranks", &self.inner.nranks)
            .finish()
    }
}

impl Communicator {
    /// How many collectives of this rank ran on symmetric windows
    /// (`NCCL_WIN_COLL_SYMMETRIC`), reading peers' windows directly
    /// instead of staging through FIFOs.
    pub fn symmetric_calls(&self) -> u64 {
        self.inner.symmetric_calls.load(Ordering::Relaxed)
    }

    /// This rank's index (`ncclCommUserRank`).
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks (`ncclCommCount`).
    pub fn count(&self) -> usize {
        self.inner.nranks
    }

    /// The ranks of every host, in rank order (hosts numbered by their
    /// lowest rank).
    pub fn hosts(&self) -> &[Vec<usize>] {
        self.inner.topology.hosts()
    }

    /// A 64-bit hash of the communicator's secret, the same on every rank
    /// and different between communicators (NCCL's `commHash`).
    pub fn hash(&self) -> u64 {
        hash_of(&self.inner.bootstrap)
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The rails: NICs per host that channels spread over between hosts
    /// (the fewest any host of the communicator has; channel `c` uses NIC
    /// `c mod rails`).
    pub fn rails(&self) -> usize {
        self.inner.rails
    }

    /// What the tuner picks on this rank for a collective call of `count`
    /// elements of `elem_size` bytes (NCCL's count; `root` for rooted
    /// calls): algorithm, protocol and channels, as the call itself would
    /// get them. For reports (the perf tests' JSON); nothing is run.
    pub fn tuning_choice(
        &self,
        kind: rccl_algorithms::CollKind,
        count: usize,
        elem_size: usize,
        root: usize,
        in_place: bool,
    ) -> Result<crate::tuning::Choice> {
        let spec = rccl_algorithms::CollSpec {
            kind,
            nranks: self.inner.nranks,
            root,
            count,
        };
        self.inner.choose(&spec, elem_size, in_place)
    }

    /// Waits until this rank's outstanding work on the communicator is
    /// done and reports any failure (`ncclCommFinalize`). A local step, as
    /// NCCL's: no rank waits for another, so one thread may finalize the
    /// ranks of [`Communicator::init_all`] one after another. Operations on
    /// host memory complete before they return, so this waits only for one
    /// that another thread still runs, and for launches and one-sided
    /// calls queued on streams (at most the timeout each); what the
    /// connections still hold for
    /// peers goes out when the communicator is dropped.
    pub fn finalize(&self) -> Result<()> {
        let inner = &self.inner;
        inner.check_usable()?;
        inner.wait_stream_work()?;
        inner.check_usable()?;
        if inner.exec.try_lock_for(inner.config.timeout).is_none() {
            return Err(Error::System(format!(
                "rank {}: finalize waited {:?} for an operation another thread runs on the \
                 communicator",
                inner.rank, inner.config.timeout
            )));
        }
        inner.check_usable()
    }

    /// Stops every operation in flight on this communicator, from any
    /// thread (`ncclCommAbort`); they and every later call fail.
    ///
    /// Peers waiting on this rank learn it at once through its connections
    /// (an operation in flight tells them as it stops).
    pub fn abort(&self) {
        self.inner.end("aborted");
    }

    /// Gives up this handle (`ncclCommDestroy`). Work this rank queued on
    /// streams completes first, as a finalize would let it (at most the
    /// timeout): its failure, or the wait's, is returned, and destroying
    /// never drops it unsaid ([`Communicator::abort`] is the way to drop
    /// it). Then, if another thread still runs an operation on the
    /// communicator through another handle, that operation is aborted,
    /// failing with an error that says the communicator was destroyed,
    /// and its peers are told, rather than left waiting for their
    /// deadline.
    pub fn destroy(self) -> Result<()> {
        let queued = self.inner.wait_stream_work();
        // The handles of calls in flight and of queued work are clones of
        // this one.
        if Arc::strong_count(&self.inner) > 1 {
            self.inner.end("destroyed");
        }
        queued
    }

    /// What this communicator is doing, for diagnosing a hang: the
    /// operation in flight (sequence number, collective), how long it has
    /// made no progress, and per stuck channel the step, primitive and the
    /// peer (rank, host, pid) it waits for. Callable from any thread while
    /// another is blocked in the operation; refreshed every 100 ms of
    /// waiting. [`hang_report`] reports every live communicator.
    pub fn hang_report(&self) -> String {
        self.inner.report()
    }

    /// The communicator's first failure, if any (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        self.inner.poisoned.get().cloned()
    }
}

/// How the note a rank leaves its peers ends when it destroys its
/// communicator in order, its queued work done: everything it sent has
/// arrived before the note.
pub(crate) const LEFT_IN_ORDER: &str = "destroyed its communicator";

impl Drop for CommInner {
    fn drop(&mut self) {
        // Peers still waiting on this rank hear why instead of timing out;
        // those whose device work still reads what this rank sent hear
        // that it left in order, not that the connection broke.
        let note = format!("{} {LEFT_IN_ORDER}", self.describe(self.rank));
        let state = self.exec.get_mut();
        let conns: Vec<&dyn Connection> = state
            .all_links()
            .map(|link| &*link.conn)
            .chain(
                state
                    .device_links
                    .iter()
                    .flat_map(|links| links.connections()),
            )
            .collect();
        close_all(conns, &note);
    }
}

/// Closes `conns` with `note`. A connection that may wait on a slow or
/// dead peer to close (a network one: its last pieces and its note) closes
/// beside the others of its kind, so the caller pays one such wait, not
/// one per connection, and the other peers hear at once. The rest close
/// at once.
fn close_all(conns: Vec<&dyn Connection>, note: &str) {
    let (waiting, prompt): (Vec<_>, Vec<_>) =
        conns.into_iter().partition(|conn| conn.close_may_wait());
    for conn in prompt {
        conn.close_with(note);
    }
    std::thread::scope(|scope| {
        for conn in waiting {
            let closing = std::thread::Builder::new()
                .name("rccl-close".into())
                .spawn_scoped(scope, move || conn.close_with(note));
            if closing.is_err() {
                conn.close_with(note);
            }
        }
    });
}

/// Closes every connection of a failed communicator, telling each peer
/// why, so that ranks waiting on this one stop at once with the cause
/// instead of timing out. A failure that came from a peer's note is passed
/// on unchanged: every rank names the rank where it started. Returns the
/// note.
pub(crate) fn close_links(comm: &CommInner, state: &ExecState, error: &Error) -> String {
    let links = || state.all_links();
    let note = links()
        .find_map(|link| link.conn.peer_note())
        .or_else(|| state.board.as_ref().and_then(|link| link.board.note()))
        .unwrap_or_else(|| failure_note(comm, error));
    close_all(links().map(|link| &*link.conn).collect(), &note);
    if let Some(link) = &state.board {
        link.board.close_with(&note);
    }
    note
}

/// What peers are told of this rank's failure: who failed and why, marked
/// as a usage error every rank shares where it is one.
pub(crate) fn failure_note(comm: &CommInner, error: &Error) -> String {
    // A broken bootstrap listener sets the abort flag too; its error says
    // why.
    let ended_by_user = comm.ended.get().is_some() || comm.bootstrap.broken().is_none();
    if comm.abort.load(Ordering::Relaxed) && ended_by_user {
        // Work was cut short: not the note of a rank that left in order
        // (LEFT_IN_ORDER), which peers' device work reads on past.
        return format!(
            "{} {} its communicator with its work unfinished",
            comm.describe(comm.rank),
            comm.ended_how()
        );
    }
    let usage = matches!(error, Error::InvalidUsage(_));
    format!(
        "{}{} failed: {error}",
        if usage { USAGE_NOTE } else { "" },
        comm.describe(comm.rank)
    )
}

/// The communicator hash of [`Communicator::hash`], from its secret.
fn hash_of(bootstrap: &Bootstrap) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"rccl-rs communicator hash")
        .chain_update(bootstrap.secret().0)
        .finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}
