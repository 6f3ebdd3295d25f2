//! The stream-ordered path's lower layer: the stream a call on device
//! memory carries, and each communicator's queue of launches enqueued on
//! streams. `device_executor/stream.rs` plans and enqueues on top of it;
//! the queue knows its communicator only through [`Owner`], so the
//! communicator that holds it needs nothing from the stream-ordered path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rccl_device::Stream;

use crate::error::{Error, Result};

/// A stream of the active device.
pub(crate) type StreamRef = Arc<dyn Stream>;

/// The communicator a queue belongs to, as the queue's waits see it.
pub(crate) trait Owner {
    /// Its rank, named in a timed-out wait's error.
    fn rank(&self) -> usize;
    /// How long a wait may take.
    fn timeout(&self) -> Duration;
    /// Its error once it failed or ended, which ends a wait at once.
    fn check_usable(&self) -> Result<()>;
}

/// A communicator's launches enqueued on streams, in issue order: each
/// runs only after the one issued before it on the communicator, whatever
/// streams they were given (NCCL orders a communicator's launches the
/// same way), and host calls and finalize wait until none is left.
#[derive(Default)]
pub(crate) struct Queued {
    /// Launches issued so far.
    issued: AtomicU64,
    /// Launches finished (run or dropped).
    finished: AtomicU64,
    lock: Mutex<()>,
    changed: Condvar,
}

/// How often a waiting launch looks at its communicator's abort flag.
const ABORT_POLL: Duration = Duration::from_millis(10);

impl Queued {
    /// The next launch's place in line.
    pub(crate) fn issue(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::AcqRel)
    }

    /// Counts a launch finished (run or dropped).
    pub(crate) fn finish(&self) {
        self.finished.fetch_add(1, Ordering::AcqRel);
        let _guard = self.lock.lock();
        self.changed.notify_all();
    }

    /// Waits until `done` holds, the communicator fails (its error), or
    /// `timeout` passes (`what` says what was waited for).
    #[cold]
    fn wait(
        &self,
        comm: &impl Owner,
        timeout: Duration,
        what: &str,
        done: impl Fn(u64) -> bool,
    ) -> Result<()> {
        if done(self.finished.load(Ordering::Acquire)) {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut guard = self.lock.lock();
        while !done(self.finished.load(Ordering::Acquire)) {
            comm.check_usable()?;
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(Error::System(format!(
                    "rank {}: waited {timeout:?} for {what}",
                    comm.rank()
                )));
            }
            self.changed
                .wait_for(&mut guard, (deadline - now).min(ABORT_POLL));
        }
        Ok(())
    }

    /// Waits until nothing is queued (a host call or finalize after
    /// device calls on the same communicator runs after them), at most
    /// the communicator's timeout. One atomic load each when nothing is.
    #[inline]
    pub(crate) fn wait_idle(&self, comm: &impl Owner) -> Result<()> {
        self.wait_idle_within(
            comm,
            comm.timeout(),
            "the communicator's work queued on streams",
        )
    }

    /// Waits until what was issued so far has finished, at most
    /// `timeout` (`what` names it in the error).
    #[inline]
    pub(crate) fn wait_idle_within(
        &self,
        comm: &impl Owner,
        timeout: Duration,
        what: &str,
    ) -> Result<()> {
        let issued = self.issued.load(Ordering::Acquire);
        // Every host call passes here: the common case stays inline.
        if self.finished.load(Ordering::Acquire) >= issued {
            return Ok(());
        }
        self.wait(comm, timeout, what, |finished| finished >= issued)
    }

    /// Waits until the launches issued before `ticket` have finished.
    pub(crate) fn wait_turn(&self, comm: &impl Owner, ticket: u64) -> Result<()> {
        self.wait(
            comm,
            comm.timeout(),
            "the communicator's launch before this one, queued on another stream",
            |finished| finished >= ticket,
        )
    }
}
