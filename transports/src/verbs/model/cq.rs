//! The model's completion queues: bounded, signalled through an eventfd,
//! and failing every poll once one overflowed.

use super::*;

/// A completion queue of the model.
pub(super) struct ModelCq {
    pub(super) state: Arc<Mutex<CqState>>,
}

pub(super) struct CqState {
    pub(super) entries: VecDeque<Wc>,
    pub(super) depth: usize,
    pub(super) overflowed: bool,
    /// Written at every completion: the queue's event.
    pub(super) event: OwnedFd,
}

impl CqState {
    /// Adds `wc`: `false` if the queue was full (it overflowed).
    pub(super) fn push(&mut self, wc: Wc) -> bool {
        if self.overflowed || self.entries.len() >= self.depth {
            self.overflowed = true;
            return false;
        }
        self.entries.push_back(wc);
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; a
        // full counter already means "readable".
        unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
        true
    }
}

impl CompletionQueue for ModelCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn poll(&self, wcs: &mut [Wc]) -> Result<usize, VerbsError> {
        let mut state = self.state.lock();
        if state.overflowed {
            return Err(VerbsError::new(
                "ibv_poll_cq",
                format!("the completion queue of {} entries overflowed", state.depth),
            ));
        }
        let n = wcs.len().min(state.entries.len());
        for (slot, wc) in wcs.iter_mut().zip(state.entries.drain(..n)) {
            *slot = wc;
        }
        Ok(n)
    }

    fn event_fd(&self) -> RawFd {
        self.state.lock().event.as_raw_fd()
    }

    fn arm(&self) -> Result<(), VerbsError> {
        let state = self.state.lock();
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64 from a
        // non-blocking eventfd we own.
        unsafe { libc::read(state.event.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        Ok(())
    }
}

pub(super) fn complete(cq: &Mutex<CqState>, wc: Wc) {
    if !cq.lock().push(wc) {
        tracing::debug!(qpn = wc.qp_num, "model: a completion found its queue full");
    }
}
