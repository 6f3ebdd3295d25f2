//! The checks every provider makes the same way: a receive's buffers, a
//! request tested after it was done, and a flush of host memory.

use super::{Net, NetError, RecvBuffer};

/// A provider's memory registration, for the buffer checks.
pub(crate) trait Registration {
    /// The address of the first byte it covers, and how many it covers.
    fn bounds(&self) -> (usize, usize);

    /// Whether `len` bytes at `data` lie inside the registration.
    fn check(&self, data: usize, len: usize) -> Result<(), NetError> {
        let (start, covered) = self.bounds();
        let inside = data >= start
            && data
                .checked_add(len)
                .is_some_and(|end| end <= start + covered);
        if inside {
            Ok(())
        } else {
            Err(NetError::InvalidArgument(format!(
                "{len} bytes at {data:#x} are not inside the registration of {covered} bytes at \
                 {start:#x}"
            )))
        }
    }
}

/// Refuses a receive of no buffers, of more than `max_recvs`, or with a
/// buffer outside its registration.
pub(crate) fn check_recv<N: Net + ?Sized>(
    buffers: &[RecvBuffer<'_, N>],
    max_recvs: usize,
) -> Result<(), NetError>
where
    N::MemHandle: Registration,
{
    if buffers.is_empty() || buffers.len() > max_recvs {
        return Err(NetError::InvalidArgument(format!(
            "a receive of {} buffers (1 to {max_recvs} may be grouped)",
            buffers.len()
        )));
    }
    buffers
        .iter()
        .try_for_each(|buffer| buffer.mhandle.check(buffer.data as usize, buffer.size))
}

/// Refuses to test a request that `test` already reported done (`spent`).
pub(crate) fn check_unspent(spent: bool) -> Result<(), NetError> {
    if spent {
        return Err(NetError::InvalidArgument(
            "a request was tested after it was done".into(),
        ));
    }
    Ok(())
}

/// `iflush` of host memory, which is coherent: there is nothing to flush,
/// so the request is `done`, one that `test` reports complete at once with
/// no sizes.
pub(crate) fn nothing_to_flush<R>(done: R) -> Result<Option<R>, NetError> {
    Ok(Some(done))
}
