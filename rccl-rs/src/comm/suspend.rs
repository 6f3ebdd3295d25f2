//! Suspending a communicator's memory (`ncclCommSuspend` with
//! `NCCL_SUSPEND_MEM`, `ncclCommResume`) and what it holds
//! ([`crate::memory::Ledger`]).
//!
//! Both are collective, as NCCL's: every rank calls them, in the same
//! order as its other calls. A suspend waits for this rank's calls in
//! flight and its work queued on streams, one-sided calls included (all
//! within the timeout), then for every rank to
//! arrive (a bootstrap barrier), so that no peer still moves bytes
//! through a connection; then each rank drops all its connections, its
//! board and its device links, on both sides of every pair alike, and
//! their memory goes back. Calls fail until the resume. A resume waits for
//! every rank again; the next calls connect afresh, under setup keys of
//! their own (`connection_secret`), as the first calls did.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{CommInner, Communicator};
use crate::error::{Error, Result};
use crate::memory::{Ledger, MemStats};

/// The error of a call on a suspended communicator.
pub(crate) fn suspended_error(rank: usize) -> Error {
    Error::InvalidUsage(format!(
        "rank {rank}: the communicator is suspended (ncclCommSuspend); call ncclCommResume \
         before any other operation"
    ))
}

impl Communicator {
    /// Gives back every allocation a suspend may release
    /// (`ncclCommSuspend(comm, NCCL_SUSPEND_MEM)`): connections, board and
    /// device links, on every rank (collective). Waits for this rank's
    /// calls in flight first; calls fail until [`Communicator::resume`].
    pub fn suspend(&self) -> Result<()> {
        let inner = &self.inner;
        if inner.suspended.load(Ordering::Acquire) {
            return Err(Error::InvalidUsage(format!(
                "rank {}: ncclCommSuspend: the communicator is suspended already",
                inner.rank
            )));
        }
        inner.check_usable()?;
        inner.wait_stream_work()?;
        let Some(mut state) = inner.exec.try_lock_for(inner.config.timeout) else {
            return Err(Error::InvalidUsage(format!(
                "rank {}: ncclCommSuspend waited {:?} for an operation another thread runs on \
                 the communicator",
                inner.rank, inner.config.timeout
            )));
        };
        inner.check_usable()?;
        // No rank drops a connection a peer still reads from.
        inner.bootstrap.barrier()?;
        let before = inner.memory.stats().suspendable;
        let state = &mut *state;
        for links in state.host_links.iter_mut().chain(&mut state.staged_links) {
            links.fill_with(|| None);
        }
        state.board = None;
        state.lone = None;
        state.device_links = None;
        inner.suspended.store(true, Ordering::Release);
        let released = before - inner.memory.stats().suspendable;
        inner.memory.set_suspended(Some(released));
        tracing::info!(
            target: crate::debug::ALLOC,
            "[{}] Suspended: released {released} bytes",
            inner.rank
        );
        Ok(())
    }

    /// Ends a suspend (`ncclCommResume`, collective): the next calls make
    /// their connections again. Resuming a communicator that is not
    /// suspended is a usage error, as in NCCL.
    pub fn resume(&self) -> Result<()> {
        let inner = &self.inner;
        if !inner.suspended.load(Ordering::Acquire) {
            return Err(Error::InvalidUsage(format!(
                "rank {}: ncclCommResume: the communicator is not suspended",
                inner.rank
            )));
        }
        let _state = inner.exec.lock();
        inner.bootstrap.barrier()?;
        inner.resumes.fetch_add(1, Ordering::Relaxed);
        inner.memory.set_suspended(None);
        inner.suspended.store(false, Ordering::Release);
        Ok(())
    }

    /// The ledger of what the communicator holds: figures
    /// ([`Ledger::stats`]), a breakdown by purpose and peer, and
    /// [`Ledger::hold`] for memory kept on the communicator's behalf.
    pub fn memory(&self) -> &Arc<Ledger> {
        &self.inner.memory
    }

    /// The figures of `ncclCommMemStats`.
    pub fn mem_stats(&self) -> MemStats {
        self.inner.memory.stats()
    }
}

impl CommInner {
    /// The secret the transports key what a pair shares by: the
    /// bootstrap's until the first resume, then one of each resume's own,
    /// the same on every rank.
    pub(crate) fn connection_secret(&self) -> [u8; 32] {
        let secret = self.bootstrap.secret().0;
        match self.resumes.load(Ordering::Relaxed) {
            0 => secret,
            resumes => {
                use sha2::{Digest, Sha256};
                Sha256::new()
                    .chain_update(b"rccl-rs connections after a resume")
                    .chain_update(secret)
                    .chain_update(resumes.to_le_bytes())
                    .finalize()
                    .into()
            }
        }
    }
}
