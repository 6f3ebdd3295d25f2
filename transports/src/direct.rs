//! Device work between ranks of one process (`P2P/direct`, as NCCL's P2P
//! transport between GPUs one process drives): the FIFOs of a link are
//! device memory that both ranks' work reaches. The two ends of a FIFO
//! find the same memory in a process-wide table keyed by the
//! communicator, with nothing to trade through the bootstrap, so a call
//! enqueues its work without waiting for its peers to arrive.
//!
//! The first of a FIFO's two ranks to need it allocates it; the table
//! holds it until the second takes it: the first may run its part and
//! destroy its communicator before the second comes, and what it sent
//! waits in the FIFO. (A FIFO whose second rank never comes, its
//! communicator failed, stays until the process exits.)

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use crate::fifo::{fifo_bytes, FifoMemory, Protocol};
use crate::transport::{Context, DeviceLink, Pending, Setup, Transport};

/// The `P2P/direct` entry of the transport table.
pub struct P2pDirect;

/// Which FIFO: the communicator (its secret and size), the channel, the
/// sending and receiving ranks, the protocol and the slot size.
type FifoKey = ([u8; 32], usize, usize, usize, usize, usize, usize);

/// A FIFO of the table: held until its second rank takes it.
enum Shared {
    Waiting(Arc<dyn FifoMemory>),
    Taken(Weak<dyn FifoMemory>),
}

/// Every FIFO of device work between ranks of this process, by key.
static FIFOS: Mutex<Option<HashMap<FifoKey, Shared>>> = Mutex::new(None);

impl Transport for P2pDirect {
    fn name(&self) -> &'static str {
        "P2P/direct"
    }

    /// Threads of one process, whose device work reaches the same device
    /// memory.
    fn carries_device_work(&self, cx: &Context<'_>, peer: usize) -> bool {
        cx.device_fifos.is_some() && cx.same_process(peer)
    }

    fn setup_device(
        &self,
        cx: &Context<'_>,
        peer: usize,
        channel: usize,
        protocol: Protocol,
    ) -> io::Result<Setup<DeviceLink>> {
        let placement = cx
            .device_fifos
            .ok_or_else(|| io::Error::other("P2P/direct: no device memory to place FIFOs in"))?;
        let slot_bytes = cx.fifo.slot_bytes(protocol);
        let bytes = fifo_bytes(protocol, cx.fifo.nslots, slot_bytes);
        let nranks = cx.endpoints.len();
        let mut table = FIFOS.lock();
        let table = table.get_or_insert_with(HashMap::new);
        table.retain(|_, fifo| match fifo {
            Shared::Waiting(_) => true,
            Shared::Taken(fifo) => fifo.strong_count() > 0,
        });
        let mut fifo = |from: usize, to: usize| -> io::Result<Arc<dyn FifoMemory>> {
            let key = (
                cx.secret,
                nranks,
                channel,
                from,
                to,
                protocol.index(),
                slot_bytes,
            );
            let found = match table.get(&key) {
                Some(Shared::Waiting(fifo)) => Some(fifo.clone()),
                Some(Shared::Taken(fifo)) => fifo.upgrade(),
                None => None,
            };
            if let Some(fifo) = found {
                table.insert(key, Shared::Taken(Arc::downgrade(&fifo)));
                return Ok(fifo);
            }
            let fifo = placement.device_fifo(bytes)?;
            table.insert(key, Shared::Waiting(fifo.clone()));
            Ok(fifo)
        };
        let link = DeviceLink::Direct {
            send: fifo(cx.rank, peer)?,
            recv: fifo(peer, cx.rank)?,
        };
        Ok(Setup {
            info: None,
            pending: Box::new(Made(Some(link))),
        })
    }
}

/// A link made at setup.
struct Made(Option<DeviceLink>);

impl Pending<DeviceLink> for Made {
    fn awaits_peer_info(&self) -> bool {
        false
    }

    fn connect(
        &mut self,
        _cx: &Context<'_>,
        _peer: usize,
        _peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<DeviceLink>> {
        self.0
            .take()
            .map(Some)
            .ok_or_else(|| io::Error::other("P2P/direct: the link was handed out already"))
    }
}
