//! Failures of this process's ranks, readable by their peers in the same
//! process without a socket: a rank that ran out of file descriptors
//! cannot open a connection to tell a peer why it stopped, and ranks of one
//! process share that limit.

use std::net::SocketAddr;

use parking_lot::Mutex;

/// Why ranks of this process failed, by their bootstrap listener's
/// address (unique among the live listeners of a process; taken out when
/// the listener closes).
static FAILED: Mutex<Vec<(SocketAddr, String)>> = Mutex::new(Vec::new());

/// Records that the rank listening at `listener` failed; the first note
/// stays, later ones are its consequences.
pub(super) fn record(listener: SocketAddr, note: &str) {
    let mut failed = FAILED.lock();
    if !failed.iter().any(|(addr, _)| *addr == listener) {
        failed.push((listener, note.to_string()));
    }
}

/// Why the rank listening at `listener` failed, if it is of this process
/// and did.
pub(super) fn failure(listener: SocketAddr) -> Option<String> {
    let failed = FAILED.lock();
    failed
        .iter()
        .find(|(addr, _)| *addr == listener)
        .map(|(_, note)| note.clone())
}

/// Forgets the rank listening at `listener` (its listener closed, so the
/// address may serve another communicator).
pub(super) fn forget(listener: SocketAddr) {
    FAILED.lock().retain(|(addr, _)| *addr != listener);
}
