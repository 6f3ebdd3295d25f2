//! Puts and signals to a rank on another host: a message over the
//! bootstrap's authenticated connection to it, which that rank applies
//! (writes into its window, then raises the signal) before it looks at
//! its signal counts, so a wait that sees the count sees the data. A
//! message carries at most [`PIECE`] bytes; a larger put goes in pieces,
//! the signal with the last.

use super::{State, WindowEntry};
use crate::comm::CommInner;
use crate::error::{Error, Result};

/// The bootstrap tag of one-sided messages.
const TAG: u64 = 7 << 40;
/// Most bytes of data one message carries (under the bootstrap's frame).
const PIECE: usize = 4 << 20;
/// Header: window number, offset, signal slot (or `NO_SIGNAL`).
const HEADER: usize = 24;
const NO_SIGNAL: u64 = u64::MAX;

/// Sends `data` for `peer`'s window number `seq` at `offset` (none: a
/// signal alone), then signal slot `slot` of its block.
pub(super) fn send(
    comm: &CommInner,
    peer: usize,
    data: Option<(u64, usize, &[u8])>,
    slot: usize,
) -> Result<()> {
    let (seq, offset, bytes) = data.unwrap_or((0, 0, &[]));
    let pieces = bytes.len().div_ceil(PIECE).max(1);
    for (i, start) in (0..pieces).map(|i| (i, i * PIECE)) {
        let piece = &bytes[start..bytes.len().min(start + PIECE)];
        let last = i + 1 == pieces;
        let mut msg = Vec::with_capacity(HEADER + piece.len());
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.extend_from_slice(&((offset + start) as u64).to_le_bytes());
        let signal = if last { slot as u64 } else { NO_SIGNAL };
        msg.extend_from_slice(&signal.to_le_bytes());
        msg.extend_from_slice(piece);
        comm.bootstrap.send(peer, TAG, &msg)?;
    }
    Ok(())
}

/// Applies every message received so far: data into this rank's windows,
/// then the signals.
pub(super) fn apply(comm: &CommInner, state: &State) -> Result<()> {
    for (from, msg) in comm.bootstrap.take_all(TAG) {
        let bad = || {
            Error::Remote(format!(
                "rank {}: a one-sided message of {} bytes from {} is malformed",
                comm.rank,
                msg.len(),
                comm.describe(from)
            ))
        };
        let word = |at: usize| -> Result<u64> {
            let bytes = msg.get(at..at + 8).ok_or_else(bad)?;
            Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        };
        let (seq, offset, signal) = (word(0)?, word(8)?, word(16)?);
        let data = &msg[HEADER..];
        if !data.is_empty() {
            let entry = by_seq(state, seq).ok_or_else(|| {
                Error::InvalidUsage(format!(
                    "rank {}: {} put {} bytes into window #{seq}, which this rank no longer has",
                    comm.rank,
                    comm.describe(from),
                    data.len()
                ))
            })?;
            let own = entry.peers[comm.rank]
                .as_ref()
                .expect("a rank reaches its own window");
            let offset = usize::try_from(offset).map_err(|_| bad())?;
            own.write(offset, data).map_err(|len| {
                Error::Remote(format!(
                    "rank {}: {} put {} bytes at offset {offset} past the end of window #{seq} \
                     ({len} bytes)",
                    comm.rank,
                    comm.describe(from),
                    data.len()
                ))
            })?;
        }
        if signal != NO_SIGNAL {
            let signals = state.signals.as_ref().ok_or_else(bad)?;
            let block = signals.blocks[comm.rank]
                .as_ref()
                .expect("a rank's own block");
            let slot = usize::try_from(signal).map_err(|_| bad())?;
            if slot >= signals.consumed.len() {
                return Err(bad());
            }
            block.raise(slot);
        }
    }
    Ok(())
}

fn by_seq(state: &State, seq: u64) -> Option<&WindowEntry> {
    state.windows.values().find(|w| w.seq == seq)
}
