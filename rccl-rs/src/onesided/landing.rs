//! Where puts and signals from other hosts land (what NCCL's proxy does
//! for a put over TCP): the bootstrap's listener thread hands each
//! one-sided message to the communicator's [`Landing`] as it arrives,
//! which writes the data into this rank's window, then raises the signal
//! with release ordering and rings the waiters' bell. The target takes no
//! part, and a waiter wakes at once. Messages from one rank land in the
//! order it sent them, so its puts reach a window in call order.
//!
//! A window enters the landing before this rank says its registration
//! succeeded (no peer puts into it earlier), and leaves it at the
//! deregistration once every rank on another host sent its fence: each
//! sends one after its allgather of the deregistration, behind its last
//! put on the same connection, so nothing lands in a window after it is
//! deregistered. An ended communicator stops the bootstrap's sinks, so
//! nothing lands after an abort either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rccl_transports::{PeerWindow, SignalBlock};

use super::remote::{self, Message, Then, TAG};
use crate::comm::CommInner;
use crate::error::{Error, Result};

const DEREGISTER: &str = "ncclCommWindowDeregister";
/// How often a deregistration waiting for fences looks at the abort flag
/// and its peers.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// One communicator's landing of messages from other hosts.
pub(super) struct Landing {
    rank: usize,
    /// Per rank, how errors name it.
    names: Vec<String>,
    /// Counters in the signal block.
    slots: usize,
    abort: Arc<AtomicBool>,
    state: Mutex<Landed>,
    /// Rung when a fence arrives.
    fenced: Condvar,
    /// The first message that could not be applied (read by waits
    /// without the lock a landing put holds).
    fault: OnceLock<Error>,
}

struct Landed {
    /// This rank's windows, by number.
    windows: HashMap<u64, PeerWindow>,
    /// This rank's signal block, from its first registration.
    block: Option<Arc<SignalBlock>>,
    /// Per rank, the fences it sent this rank.
    fences: Vec<u64>,
    /// Per rank, the fences deregistrations consumed.
    consumed: Vec<u64>,
}

impl Landing {
    /// The landing of `comm`, taking the one-sided messages from now on.
    pub(super) fn start(comm: &CommInner) -> Arc<Landing> {
        let landing = Arc::new(Landing {
            rank: comm.rank,
            names: (0..comm.nranks).map(|r| comm.describe(r)).collect(),
            slots: comm.config.rma_contexts * comm.config.rma_signals * comm.nranks,
            abort: comm.abort.clone(),
            state: Mutex::new(Landed {
                windows: HashMap::new(),
                block: None,
                fences: vec![0; comm.nranks],
                consumed: vec![0; comm.nranks],
            }),
            fenced: Condvar::new(),
            fault: OnceLock::new(),
        });
        let sink = landing.clone();
        comm.bootstrap
            .set_sink(TAG, Box::new(move |from, msg| sink.deliver(from, msg)));
        landing
    }

    /// Lets puts land in window number `seq`, `size` bytes at `base`
    /// (and signals in `block`, given at the first registration).
    pub(super) fn open(
        &self,
        seq: u64,
        base: *mut u8,
        size: usize,
        block: Option<Arc<SignalBlock>>,
    ) {
        let mut landed = self.state.lock();
        landed
            .windows
            .insert(seq, PeerWindow::in_process(base, size));
        if block.is_some() {
            landed.block = block;
        }
    }

    /// Takes back [`Landing::open`] for a registration that failed.
    pub(super) fn forget(&self, seq: u64) {
        self.state.lock().windows.remove(&seq);
    }

    /// The first message from another host that could not be applied.
    pub(super) fn fault(&self) -> Result<()> {
        self.fault.get().cloned().map_or(Ok(()), Err)
    }

    /// Ends window number `seq` (at its deregistration, once every rank
    /// agreed on it): sends this rank's fence to every rank on another
    /// host, waits for theirs, behind which their last puts landed, then
    /// takes the window out. Fails at the communicator's deadline, on
    /// abort, or when a peer is gone, naming it.
    pub(super) fn close(&self, comm: &CommInner, seq: u64) -> Result<()> {
        let me = &comm.peers[comm.rank];
        let remote: Vec<usize> = (0..comm.nranks)
            .filter(|&r| comm.peers[r].host_id != me.host_id)
            .collect();
        for &peer in &remote {
            remote::send_fence(comm, peer, seq)?;
        }
        let deadline = Instant::now() + comm.config.timeout;
        let mut landed = self.state.lock();
        for &peer in &remote {
            while landed.fences[peer] == landed.consumed[peer] {
                let waiting = || {
                    format!(
                        "{DEREGISTER}: rank {} waits for {} to finish its puts into window \
                         #{seq}",
                        comm.rank, self.names[peer]
                    )
                };
                comm.check_usable()?;
                // Without the lock: the listener thread lands meanwhile.
                if let Some(gone) = MutexGuard::unlocked(&mut landed, || comm.peer_gone(peer)) {
                    return Err(Error::Remote(format!("{}: {gone}", waiting())));
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::System(format!(
                        "{} (its fence): none came in {:?}",
                        waiting(),
                        comm.config.timeout
                    )));
                }
                self.fenced
                    .wait_for(&mut landed, (deadline - now).min(LOOK_EVERY));
            }
            landed.consumed[peer] += 1;
        }
        landed.windows.remove(&seq);
        Ok(())
    }

    /// Applies one message from `from` (on the bootstrap's listener
    /// thread); one that cannot be applied becomes the fault waits report.
    fn deliver(&self, from: usize, msg: &[u8]) {
        if self.abort.load(Ordering::Relaxed) {
            return;
        }
        let mut landed = self.state.lock();
        if let Err(e) = self.apply(&mut landed, from, msg) {
            tracing::warn!(rank = self.rank, "one-sided: {e}");
            let _ = self.fault.set(e);
        }
    }

    fn apply(&self, landed: &mut Landed, from: usize, msg: &[u8]) -> Result<()> {
        let (me, them) = (self.rank, &self.names[from]);
        let bad = || {
            Error::Remote(format!(
                "rank {me}: a one-sided message of {} bytes from {them} is malformed",
                msg.len()
            ))
        };
        let Message {
            seq,
            offset,
            data,
            then,
        } = remote::decode(msg).ok_or_else(bad)?;
        if !data.is_empty() {
            let window = landed.windows.get(&seq).ok_or_else(|| {
                Error::InvalidUsage(format!(
                    "rank {me}: {them} put {} bytes into window #{seq}, which this rank does not \
                     have (not registered, or deregistered)",
                    data.len()
                ))
            })?;
            let offset = usize::try_from(offset).map_err(|_| bad())?;
            window.write(offset, data).map_err(|len| {
                Error::Remote(format!(
                    "rank {me}: {them} put {} bytes at offset {offset} past the end of window \
                     #{seq} ({len} bytes)",
                    data.len()
                ))
            })?;
        }
        match then {
            Then::Nothing => {}
            Then::Signal(slot) => {
                let block = landed.block.as_ref().ok_or_else(bad)?;
                let slot = usize::try_from(slot).map_err(|_| bad())?;
                if slot >= self.slots {
                    return Err(bad());
                }
                block.raise(slot);
            }
            Then::Fence => {
                landed.fences[from] += 1;
                self.fenced.notify_all();
            }
        }
        Ok(())
    }
}
