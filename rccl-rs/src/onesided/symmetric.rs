//! Where a collective's buffer lies in a symmetric window: the lookup
//! that lets collectives read and write peers' windows directly.

use super::{State, WIN_COLL_SYMMETRIC};
use crate::comm::CommInner;

/// A buffer inside a window registered with [`WIN_COLL_SYMMETRIC`]: its
/// offset into the window, and every rank's address of that offset as
/// this process reaches it (this rank's own buffer among them).
#[derive(Clone, Debug)]
pub struct SymmetricSpan {
    /// The window's number in the communicator's registrations (the same
    /// on every rank).
    pub window: u64,
    pub offset: usize,
    /// Per rank, its address of `offset`.
    pub peers: Vec<*mut u8>,
}

/// The symmetric window holding `[ptr, ptr + len)` on this rank, if one
/// does and every rank's window is reachable from this process (all on
/// this host). Read-only: takes the one-sided state's lock briefly.
pub(crate) fn symmetric_span(
    comm: &CommInner,
    ptr: *const u8,
    len: usize,
) -> Option<SymmetricSpan> {
    let slot = comm.one_sided.lock();
    let state = slot.as_ref()?.downcast_ref::<State>()?;
    let at = ptr as usize;
    let entry = state.windows.values().find(|w| {
        w.flags & WIN_COLL_SYMMETRIC != 0
            && at >= w.base
            && at
                .checked_add(len)
                .is_some_and(|end| end <= w.base + w.size)
    })?;
    let offset = at - entry.base;
    let peers = entry
        .peers
        .iter()
        .map(|peer| {
            let peer = peer.as_ref()?;
            (offset + len <= peer.len()).then(|| peer.as_ptr().wrapping_add(offset))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(SymmetricSpan {
        window: entry.seq,
        offset,
        peers,
    })
}
