//! The transport table: the order in which the engine asks transports
//! whether they can connect two ranks, and the one place a transport is
//! added. Transports registered at run time come first, then the built-in
//! ones by preference: device memory between processes (`P2P/IPC`), shared
//! memory (`SHM/direct`), and the communicator's network, which connects
//! any pair and so comes last.

use std::sync::{Arc, RwLock};

use crate::ipc::P2pIpc;
use crate::shm::Shm;
use crate::transport::{Context, Transport};

/// Transports registered at run time, ahead of the built-in ones.
static REGISTERED: RwLock<Vec<Arc<dyn Transport>>> = RwLock::new(Vec::new());

/// Adds `transport` to the table, ahead of every earlier entry: it is
/// asked first for every connection made from now on.
pub fn register(transport: Arc<dyn Transport>) {
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    registered.insert(0, transport);
}

/// The first transport of the table that can connect this rank and `peer`.
pub fn choose(cx: &Context<'_>, peer: usize) -> Option<Arc<dyn Transport>> {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    let builtin: [Arc<dyn Transport>; 3] = [Arc::new(P2pIpc), Arc::new(Shm), cx.net.clone()];
    registered
        .iter()
        .cloned()
        .chain(builtin)
        .find(|t| t.can_connect(cx, peer))
}
