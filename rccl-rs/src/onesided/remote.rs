//! Puts and signals to a rank on another host: messages over the
//! bootstrap's authenticated connection to it, which that rank's
//! [`super::landing::Landing`] applies as they arrive (the data into its
//! window, then the signal). A message carries at most [`PIECE`] bytes;
//! a larger put goes in pieces, the signal with the last.

use crate::comm::CommInner;
use crate::error::Result;

/// The bootstrap tag of one-sided messages.
pub(super) const TAG: u64 = 7 << 40;
/// Most bytes of data one message carries (under the bootstrap's frame).
const PIECE: usize = 4 << 20;
/// Header: window number, offset, what follows the data ([`Then`]).
const HEADER: usize = 24;
const NO_SIGNAL: u64 = u64::MAX;
/// The sender's last message for the window before it is deregistered.
const FENCE: u64 = u64::MAX - 1;

/// What a message asks of its target after writing its data.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Then {
    Nothing,
    /// Raise this slot of the signal block.
    Signal(u64),
    /// Count the sender's fence: it puts no more into the window.
    Fence,
}

/// One message as its target reads it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Message<'a> {
    pub seq: u64,
    pub offset: u64,
    pub data: &'a [u8],
    pub then: Then,
}

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
        let then = if i + 1 == pieces {
            slot as u64
        } else {
            NO_SIGNAL
        };
        let msg = encode(seq, (offset + start) as u64, then, piece);
        comm.bootstrap.send(peer, TAG, &msg)?;
    }
    Ok(())
}

/// Tells `peer` that this rank puts no more into window number `seq`.
pub(super) fn send_fence(comm: &CommInner, peer: usize, seq: u64) -> Result<()> {
    comm.bootstrap.send(peer, TAG, &encode(seq, 0, FENCE, &[]))
}

fn encode(seq: u64, offset: u64, then: u64, data: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(HEADER + data.len());
    for word in [seq, offset, then] {
        msg.extend_from_slice(&word.to_le_bytes());
    }
    msg.extend_from_slice(data);
    msg
}

/// Reads a message; `None` if it is malformed.
pub(super) fn decode(msg: &[u8]) -> Option<Message<'_>> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(msg.get(at..at + 8)?.try_into().ok()?))
    };
    let then = match word(16)? {
        NO_SIGNAL => Then::Nothing,
        FENCE => Then::Fence,
        slot => Then::Signal(slot),
    };
    Some(Message {
        seq: word(0)?,
        offset: word(8)?,
        data: &msg[HEADER..],
        then,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_back_whole_and_short_ones_are_refused() {
        let msg = encode(3, 4096, 5, b"abc");
        let read = decode(&msg).unwrap();
        assert_eq!((read.seq, read.offset, read.data), (3, 4096, &b"abc"[..]));
        assert_eq!(read.then, Then::Signal(5));
        assert_eq!(decode(&encode(1, 0, FENCE, &[])).unwrap().then, Then::Fence);
        assert_eq!(
            decode(&encode(1, 0, NO_SIGNAL, b"x")).unwrap().then,
            Then::Nothing
        );
        assert!(decode(&msg[..HEADER - 1]).is_none());
    }
}
