//! What a transport is, in NCCL's split: how two ranks get a
//! [`Connection`] for host work, or a [`DeviceLink`] for device work.
//!
//! The rules of an entry of the table:
//!
//! 1. It answers from what each rank published at init ([`Context`]), so
//!    that both ranks of a pair pick the same entry.
//! 2. Host work: where [`Transport::can_connect`] holds,
//!    [`Transport::setup`] sets up this side of a [`Connection`]; device
//!    work: where [`Transport::carries_device_work`] holds,
//!    [`Transport::setup_device`] sets up this side of a [`DeviceLink`].
//!    An entry carries either or both; the engine calls a setup only where
//!    its question held.
//! 3. A setup makes this side's resources and the bytes the peer's side
//!    needs ([`Setup::info`]), which the engine carries through the
//!    bootstrap; [`Pending::connect`] finishes once the peer's bytes are
//!    in, never waiting past the time it is given.
//! 4. A device link's FIFOs lie where the device's work reaches them:
//!    the entry gets that memory from [`Context::device_fifos`], never
//!    from a device API of its own.
//!
//! The table (`table.rs`) says in which order the engine asks the
//! entries; a transport is added by implementing [`Transport`] and
//! registering it there, with no change to the engine.

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crate::fifo::{FifoMemory, FifoShape, Protocol, PtrSupport};
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
    /// The communicator's bootstrap secret, the same at each of its ranks
    /// (with the number of ranks, it keys what they share in a process).
    pub secret: [u8; 32],
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
    /// Set when the connections are made for device work: the device's
    /// work fills and drains their FIFOs, which must lie where it reaches
    /// them.
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

    /// Whether `peer` is a thread of this rank's process.
    pub fn same_process(&self, peer: usize) -> bool {
        self.same_host(peer) && self.endpoints[peer].process == self.endpoints[self.rank].process
    }
}

/// Where the connections of device work put their FIFOs: memory the
/// device's work reaches (the engine's, over its device).
pub trait FifoPlacement: Sync {
    /// A zeroed FIFO of `bytes` ([`crate::fifo::fifo_bytes`]) that the
    /// device's work and the host both reach, for a network that sends
    /// from and receives into the kinds of memory `network` lists: its
    /// control block in host memory, its slots there too or, GPUDirect
    /// RDMA, in device memory (as a dma-buf where the network takes those)
    /// where the placement allows it.
    fn network_fifo(&self, bytes: usize, network: PtrSupport) -> io::Result<Arc<dyn FifoMemory>>;
    /// A zeroed FIFO of `bytes` in device memory, for ranks of this
    /// process.
    fn device_fifo(&self, bytes: usize) -> io::Result<Arc<dyn FifoMemory>>;
    /// Whether device memory can be handed to another process
    /// ([`FifoPlacement::shareable_fifo`]).
    fn shares_memory(&self) -> bool;
    /// A FIFO of `bytes` in device memory that another process of this
    /// host maps, with the handle it maps it by (a file descriptor).
    fn shareable_fifo(&self, bytes: usize) -> io::Result<(Arc<dyn FifoMemory>, OwnedFd)>;
    /// The FIFO of `bytes` another process handed over as `handle`.
    fn import_fifo(&self, handle: OwnedFd, bytes: usize) -> io::Result<Arc<dyn FifoMemory>>;
}

/// This side of a connection being set up: of a [`Connection`] for host
/// work, of a [`DeviceLink`] for device work.
pub struct Setup<Made = Box<dyn Connection>> {
    /// What the peer's side needs, if it needs anything (the peer's
    /// [`Pending::awaits_peer_info`] says so).
    pub info: Option<Vec<u8>>,
    /// The rest of the work.
    pub pending: Box<dyn Pending<Made>>,
}

/// A connection waiting for the peer's side.
pub trait Pending<Made = Box<dyn Connection>>: Send {
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
    ) -> io::Result<Option<Made>>;
}

/// How this rank's device work reaches a peer's on one channel.
pub enum DeviceLink {
    /// FIFOs of one protocol that the two ranks' device work fills and
    /// drains itself: the one to the peer and the one from it.
    Direct {
        send: Arc<dyn FifoMemory>,
        recv: Arc<dyn FifoMemory>,
    },
    /// A connection whose proxy moves its FIFOs' slots (Simple) between
    /// hosts; the device's work fills and drains them.
    Proxied(Box<dyn Connection>),
}

/// An entry of the transport table (the rules are this module's).
pub trait Transport: Send + Sync {
    /// Its name in logs (`SHM/direct`, `NET/Socket`).
    fn name(&self) -> &'static str;
    /// Whether it can connect this rank and `peer` for host work.
    fn can_connect(&self, _cx: &Context<'_>, _peer: usize) -> bool {
        false
    }
    /// Sets up this side of the connection to `peer` on `channel`.
    fn setup(&self, _cx: &Context<'_>, _peer: usize, _channel: usize) -> io::Result<Setup> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} carries no host work", self.name()),
        ))
    }
    /// Whether it can link this rank's device work and `peer`'s
    /// ([`Context::device_fifos`] is set).
    fn carries_device_work(&self, _cx: &Context<'_>, _peer: usize) -> bool {
        false
    }
    /// Sets up this side of the device link to `peer` on `channel` for
    /// `protocol`.
    fn setup_device(
        &self,
        _cx: &Context<'_>,
        _peer: usize,
        _channel: usize,
        _protocol: Protocol,
    ) -> io::Result<Setup<DeviceLink>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} carries no device work", self.name()),
        ))
    }
}
