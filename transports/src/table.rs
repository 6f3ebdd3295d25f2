//! The transport table: the order in which the engine asks transports
//! whether they can connect two ranks, and the one place a transport is
//! added. Transports registered at run time come first, then the built-in
//! ones by preference: device memory within a process (`P2P/direct`,
//! device work only), device memory between processes (`P2P/IPC`, device
//! work only), shared memory (`SHM/direct`, host work only), and the
//! communicator's network, which connects any pair for host work and
//! ranks of different hosts for device work, and so comes last.

use std::sync::{Arc, RwLock};

use crate::direct::P2pDirect;
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

/// The first transport of the table that can connect this rank and `peer`
/// for host work.
pub fn choose(cx: &Context<'_>, peer: usize) -> Option<Arc<dyn Transport>> {
    first(cx, |t| t.can_connect(cx, peer))
}

/// The first transport of the table that can link this rank's device work
/// and `peer`'s ([`Context::device_fifos`] set).
pub fn choose_for_device(cx: &Context<'_>, peer: usize) -> Option<Arc<dyn Transport>> {
    first(cx, |t| t.carries_device_work(cx, peer))
}

fn first(
    cx: &Context<'_>,
    mut fits: impl FnMut(&dyn Transport) -> bool,
) -> Option<Arc<dyn Transport>> {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    let builtin: [Arc<dyn Transport>; 4] = [
        Arc::new(P2pDirect),
        Arc::new(P2pIpc),
        Arc::new(Shm),
        cx.net.clone(),
    ];
    registered
        .iter()
        .cloned()
        .chain(builtin)
        .find(|t| fits(&**t))
}
