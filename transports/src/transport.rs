//! What a transport is, in NCCL's split: how two ranks get a
//! [`Connection`].
//!
//! Each transport answers whether it can connect two ranks (from what each
//! published at init), sets up this side of a connection (local resources,
//! and the bytes the peer's side needs, which the engine carries through
//! the bootstrap), and connects once the peer's bytes are in. The table
//! (`table.rs`) says in which order the engine asks them; a transport is
//! added by implementing [`Transport`] and registering it there, with no
//! change to the engine.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crate::fifo::{FifoMemory, FifoShape};
use crate::network::PtrSupport;
use crate::process::ProcessId;
use crate::Connection;

/// What a rank published at init that transports decide and connect on.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Ranks with equal host ids share memory.
    pub host_id: String,
    /// Its process (start time 0 if unknown).
    pub process: ProcessId,
    /// Its address on the network (the port is not used).
    pub data_addr: SocketAddr,
}

/// One rank of a communicator as the transports see it while it connects.
pub struct Context<'a> {
    /// This rank.
    pub rank: usize,
    /// Every rank's endpoint, indexed by rank.
    pub endpoints: &'a [Endpoint],
    /// The FIFOs of every connection.
    pub fifo: FifoShape,
    /// `NCCL_SHM_DISABLE`.
    pub shm_disable: bool,
    /// The communicator's network entry (`network::Network` over the
    /// provider that `network::providers::choose` picked at init).
    pub net: &'a Arc<dyn Transport>,
    /// `NCCL_P2P_DISABLE`.
    pub p2p_disable: bool,
    /// Whether the connections are made for calls on device memory.
    pub device_memory: bool,
    /// Set when the connections are made for device work: the device's
    /// work fills and drains their FIFOs, which must lie where it reaches
    /// them. Only the network takes it (the engine links device work
    /// within a host itself).
    pub device_fifos: Option<&'a dyn FifoPlacement>,
    /// The communicator's abort flag.
    pub abort: &'a AtomicBool,
}

impl Context<'_> {
    /// Whether this rank creates the pair's shared resources and dials:
    /// the lower rank of a pair does.
    pub fn leads(&self, peer: usize) -> bool {
        self.rank < peer
    }

    /// Whether `peer` runs on this rank's host.
    pub fn same_host(&self, peer: usize) -> bool {
        self.endpoints[peer].host_id == self.endpoints[self.rank].host_id
    }
}

/// Where a connection made for device work puts its FIFOs.
pub trait FifoPlacement: Sync {
    /// A zeroed FIFO of `bytes` ([`crate::fifo::fifo_bytes`]) that the
    /// device's work and the host both reach, for a network that sends
    /// from and receives into the kinds of memory `network` lists: its
    /// control block in host memory, its slots there too or, GPUDirect
    /// RDMA, in device memory (as a dma-buf where the network takes those)
    /// where the placement allows it.
    fn fifo(&self, bytes: usize, network: PtrSupport) -> io::Result<Arc<dyn FifoMemory>>;
}

/// This side of a connection being set up.
pub struct Setup {
    /// What the peer's side needs, if it needs anything (the peer's
    /// [`Pending::awaits_peer_info`] says so).
    pub info: Option<Vec<u8>>,
    /// The rest of the work.
    pub pending: Box<dyn Pending>,
}

/// A connection waiting for the peer's side.
pub trait Pending: Send {
    /// Whether [`Pending::connect`] needs the [`Setup::info`] of the
    /// peer's side.
    fn awaits_peer_info(&self) -> bool;
    /// Finishes the connection, with what the peer's setup produced where
    /// it awaits it; `Ok(None)` if the peer's side is not there yet by
    /// `until` (never waits past it).
    fn connect(
        &mut self,
        cx: &Context<'_>,
        peer: usize,
        peer_info: &[u8],
        until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>>;
}

/// An entry of the transport table.
pub trait Transport: Send + Sync {
    /// Its name in logs (`SHM/direct`, `NET/Socket`).
    fn name(&self) -> &'static str;
    /// Whether it can connect this rank and `peer`.
    fn can_connect(&self, cx: &Context<'_>, peer: usize) -> bool;
    /// Sets up this side of the connection to `peer` on `channel`.
    fn setup(&self, cx: &Context<'_>, peer: usize, channel: usize) -> io::Result<Setup>;
}
