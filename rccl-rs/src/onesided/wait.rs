//! Waiting for signals (`ncclWaitSignal`). Counts are never reset: each
//! slot remembers how many signals waits have consumed, and a wait for
//! `count` more returns once that many arrived beyond it (counters wrap;
//! fewer than 2^31 may be outstanding).

use std::time::{Duration, Instant};

use rccl_transports::{Backoff, ParkOn, SignalBlock, WaitError};

use super::{check_signal, slot, State};
use crate::comm::{CommInner, Communicator};
use crate::error::{Error, Result};

const WAIT: &str = "ncclWaitSignal";
/// How often a wait asks whether its peer is gone.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(100);

/// One descriptor of a wait (`ncclWaitSignalDesc_t`): `count` more
/// signals `(sig, ctx)` from `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitDesc {
    pub peer: usize,
    pub sig: usize,
    pub ctx: usize,
    pub count: usize,
}

impl Communicator {
    /// Waits until, for every descriptor, `count` more signals `(sig,
    /// ctx)` from `peer` have arrived than earlier waits consumed
    /// (`ncclWaitSignal`); what the peer put before them is then visible.
    /// Fails after the communicator's timeout, when it is aborted, or
    /// when the peer is gone, naming the peer.
    pub fn wait_signal(&self, descs: &[WaitDesc]) -> Result<()> {
        self.with_one_sided(|comm, state| wait(comm, state, descs))
    }
}

fn wait(comm: &CommInner, state: &mut State, descs: &[WaitDesc]) -> Result<()> {
    check_descs(comm, descs)?;
    let signals = state.signals(comm, WAIT)?;
    let block = signals.blocks[comm.rank]
        .as_ref()
        .expect("a rank's own signal block is in its table");
    let deadline = Instant::now() + comm.config.timeout;
    let mut consumed = signals.consumed.clone();
    for d in descs {
        let at = slot(comm, d.sig, d.ctx, d.peer);
        // What ranks on other hosts sent lands on its own; a message
        // that could not land fails the wait.
        let look = || state.landing.fault();
        await_count(comm, block, d, consumed[at], deadline, look)?;
        consumed[at] = consumed[at].wrapping_add(d.count as u32);
    }
    if let Some(signals) = state.signals.as_mut() {
        signals.consumed = consumed;
    }
    Ok(())
}

/// Checks `descs` against the communicator.
pub(super) fn check_descs(comm: &CommInner, descs: &[WaitDesc]) -> Result<()> {
    if descs.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{WAIT}: rank {}: no descriptors",
            comm.rank
        )));
    }
    for (i, d) in descs.iter().enumerate() {
        check_signal(comm, WAIT, d.peer, d.sig, d.ctx)?;
        if d.count == 0 || d.count > i32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "{WAIT}: rank {}: descriptor {i} waits for {} signals (opCnt must be positive)",
                comm.rank, d.count
            )));
        }
    }
    Ok(())
}

/// Waits until `d.count` signals arrived in `block` beyond `consumed`,
/// calling `look` before each look at the count; fails at `deadline`, on
/// abort, or when the peer is gone, naming it.
pub(super) fn await_count(
    comm: &CommInner,
    block: &SignalBlock,
    d: &WaitDesc,
    consumed: u32,
    deadline: Instant,
    look: impl Fn() -> Result<()>,
) -> Result<()> {
    let at = slot(comm, d.sig, d.ctx, d.peer);
    let need = d.count as u32;
    let mut backoff = Backoff::new();
    let mut next_check = Instant::now() + PEER_CHECK_EVERY;
    loop {
        let seen = block.bell().load(std::sync::atomic::Ordering::Acquire);
        look()?;
        let arrived = block.count(at).wrapping_sub(consumed);
        if arrived >= need {
            return Ok(());
        }
        let park = ParkOn {
            word: block.bell(),
            seen,
            sleepers: Some(block.sleepers()),
        };
        match backoff.snooze(Some(park), deadline, &comm.abort) {
            Ok(()) => {}
            Err(WaitError::Aborted) => return Err(comm.ended_error()),
            Err(WaitError::TimedOut) => {
                return Err(Error::System(format!(
                    "{WAIT}: rank {} waited {:?} for {need} signal(s) (sigIdx {}, ctx {}) from {}; \
                     {arrived} arrived",
                    comm.rank,
                    comm.config.timeout,
                    d.sig,
                    d.ctx,
                    comm.describe(d.peer)
                )))
            }
        }
        if Instant::now() >= next_check {
            next_check = Instant::now() + PEER_CHECK_EVERY;
            comm.check_usable()?;
            if let Some(gone) = comm
                .peer_failure_in_process(&[d.peer])
                .or_else(|| comm.peer_gone(d.peer))
            {
                return Err(Error::Remote(format!(
                    "{WAIT}: rank {} waits for {need} signal(s) (sigIdx {}, ctx {}) from {}, \
                     {arrived} arrived: {gone}",
                    comm.rank,
                    d.sig,
                    d.ctx,
                    comm.describe(d.peer)
                )));
            }
        }
    }
}
