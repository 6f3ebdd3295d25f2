//! Puts and signals (`ncclPutSignal`, `ncclSignal`): the bytes go into
//! the peer's window first, then the signal's counter at the peer rises
//! with release ordering, so a peer that has seen the count sees the data.

use super::{check_signal, remote, slot, State};
use crate::comm::{CommInner, Communicator};
use crate::error::{Error, Result};
use crate::onesided::Window;

const PUT: &str = "ncclPutSignal";
const SIGNAL: &str = "ncclSignal";

impl Communicator {
    /// Writes `data` into `peer`'s buffer of `window` at byte `offset`,
    /// then raises signal `(sig, ctx)` there (`ncclPutSignal`). Completes
    /// before it returns; `peer` takes no part.
    pub fn put_signal<T: bytemuck::Pod>(
        &self,
        data: &[T],
        peer: usize,
        window: Window,
        offset: usize,
        sig: usize,
        ctx: usize,
    ) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.with_one_sided(|comm, state| {
            put(comm, state, Some((bytes, window, offset)), peer, sig, ctx)
        })
    }

    /// Raises signal `(sig, ctx)` at `peer` alone (`ncclSignal`).
    pub fn signal(&self, peer: usize, sig: usize, ctx: usize) -> Result<()> {
        self.with_one_sided(|comm, state| put(comm, state, None, peer, sig, ctx))
    }
}

fn put(
    comm: &CommInner,
    state: &mut State,
    data: Option<(&[u8], Window, usize)>,
    peer: usize,
    sig: usize,
    ctx: usize,
) -> Result<()> {
    let call = if data.is_some() { PUT } else { SIGNAL };
    check_signal(comm, call, peer, sig, ctx)?;
    let signals = state.signals(comm, call)?;
    let slot = slot(comm, sig, ctx, comm.rank);
    if let Some((bytes, window, offset)) = data {
        let entry = state.window(comm, window, call)?;
        if entry.device {
            return Err(Error::InvalidUsage(format!(
                "{call}: rank {}: window #{} is device memory: put into it on a stream \
                 (put_signal_on_stream, or ncclPutSignal with a stream)",
                comm.rank, entry.seq
            )));
        }
        let past_end = |len| entry.past_end(comm, call, peer, offset, bytes.len(), len);
        match &entry.peers[peer] {
            Some(target) => target.write(offset, bytes).map_err(past_end)?,
            None => {
                let len = entry.sizes[peer];
                if offset.checked_add(bytes.len()).is_none_or(|end| end > len) {
                    return Err(past_end(len));
                }
                return remote::send(comm, peer, Some((entry.seq, offset, bytes)), slot);
            }
        }
    }
    match &signals.blocks[peer] {
        Some(block) => block.raise(slot),
        None => remote::send(comm, peer, None, slot)?,
    }
    Ok(())
}
