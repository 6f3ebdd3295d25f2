//! The transport table: how two ranks get a [`Connection`], in NCCL's split.
//!
//! Each entry answers whether it can connect two ranks (from what each
//! published at init), sets up this side of a connection (local resources,
//! and the bytes the peer's side needs, which the engine carries through
//! the bootstrap), and connects once the peer's bytes are in. The engine
//! asks the entries in order of preference and takes the first that can;
//! a transport is added by implementing [`Transport`] and [`register`]ing
//! it, with no change to the engine.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::fifo::{FifoShape, Protocol};
use crate::ipc::P2pIpc;
use crate::network::{ListenHandle, Net, NetConnection};
use crate::process::ProcessId;
use crate::shm::{self, ShmConnection, ShmSegment};
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
    /// The communicator's network entry ([`Network`] over the provider
    /// that [`crate::network::providers::choose`] picked at init).
    pub net: &'a Arc<dyn Transport>,
    /// `NCCL_P2P_DISABLE`.
    pub p2p_disable: bool,
    /// Whether the connections are made for calls on device memory.
    pub device_memory: bool,
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

/// Shared memory between processes (or threads) of one host: both FIFOs
/// of a pair in one segment that the leading rank creates and the other
/// maps and unlinks at once.
struct Shm;

impl Transport for Shm {
    fn name(&self) -> &'static str {
        "SHM/direct"
    }

    fn can_connect(&self, cx: &Context<'_>, peer: usize) -> bool {
        !cx.shm_disable && cx.same_host(peer)
    }

    fn setup(&self, cx: &Context<'_>, peer: usize, _channel: usize) -> io::Result<Setup> {
        let len = shm::segment_bytes(&cx.fifo);
        if !cx.leads(peer) {
            return Ok(Setup {
                info: None,
                pending: Box::new(ShmPending::Maps),
            });
        }
        let segment = ShmSegment::create(len).map_err(|e| {
            shm::explain_no_room(e, "a smaller NCCL_BUFFSIZE or NCCL_MAX_NCHANNELS")
        })?;
        Ok(Setup {
            info: Some(segment.name().as_bytes().to_vec()),
            pending: Box::new(ShmPending::Created(Some(segment), None)),
        })
    }
}

enum ShmPending {
    /// This side leads: the segment it created, then the connection over
    /// it, held back until the peer has mapped the segment. Handed out
    /// earlier, a send could complete into it and this side close (and
    /// remove the name) before the peer ever reached the bytes.
    Created(Option<ShmSegment>, Option<ShmConnection>),
    /// This side maps the segment whose name the peer sends.
    Maps,
}

impl Pending for ShmPending {
    fn awaits_peer_info(&self) -> bool {
        matches!(self, ShmPending::Maps)
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        peer: usize,
        peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        let made = match self {
            ShmPending::Created(segment, made) => {
                if let Some(segment) = segment.take() {
                    *made = Some(connection(cx, peer, segment, true));
                }
                return Ok(made
                    .take_if(|conn| conn.peer_mapped())
                    .map(|conn| Box::new(conn) as Box<dyn Connection>));
            }
            ShmPending::Maps => {
                let name = std::str::from_utf8(peer_info).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "a malformed segment name")
                })?;
                let segment = ShmSegment::open(name, shm::segment_bytes(&cx.fifo))?;
                segment.unlink()?;
                connection(cx, peer, segment, false)
            }
        };
        Ok(Some(Box::new(made)))
    }
}

/// The connection over `segment`, watching the peer's process.
fn connection(cx: &Context<'_>, peer: usize, segment: ShmSegment, creator: bool) -> ShmConnection {
    let mut conn = ShmConnection::new(segment, creator, &cx.fifo);
    let process = cx.endpoints[peer].process;
    if process.start != 0 {
        conn.watch_peer(process);
    }
    conn
}

/// The network: a [`Net`] provider, each side listening and connecting to
/// the other's listener (its handle goes through the bootstrap), the
/// connection's slots moved by the process's network proxy. It connects
/// any pair of ranks, so it comes last in the table.
pub struct Network<N: Net> {
    net: Arc<N>,
    name: &'static str,
}

impl<N: Net> Network<N> {
    /// The entry for `net` (`NET/<its name>` in logs).
    pub fn new(net: Arc<N>) -> Network<N> {
        let name = crate::network::transport_name(net.name());
        Network { net, name }
    }
}

impl<N: Net> Transport for Network<N> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn can_connect(&self, _cx: &Context<'_>, _peer: usize) -> bool {
        true
    }

    fn setup(&self, _cx: &Context<'_>, _peer: usize, channel: usize) -> io::Result<Setup> {
        // Channel `c` uses device `c mod devices` at both ends (its rail:
        // the communicator gives every rank's provider the same number of
        // devices), listening and connecting on it.
        let dev = channel % self.net.devices().max(1);
        let (handle, listen) = self.net.listen(dev).map_err(io::Error::other)?;
        Ok(Setup {
            info: Some(handle.as_bytes().to_vec()),
            pending: Box::new(NetworkPending::<N> {
                net: self.net.clone(),
                dev,
                listen: Some(listen),
                stage: Default::default(),
                send: None,
                recv: None,
            }),
        })
    }
}

struct NetworkPending<N: Net> {
    net: Arc<N>,
    /// The device (rail) of the connection's channel.
    dev: usize,
    listen: Option<N::ListenComm>,
    stage: N::ConnectStage,
    send: Option<N::SendComm>,
    recv: Option<N::RecvComm>,
}

impl<N: Net> Pending for NetworkPending<N> {
    fn awaits_peer_info(&self) -> bool {
        true
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        _peer: usize,
        peer_info: &[u8],
        until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        let theirs = ListenHandle::from_bytes(peer_info).map_err(io::Error::other)?;
        let net = &*self.net;
        loop {
            if self.send.is_none() {
                self.send = net
                    .connect(self.dev, &theirs, &mut self.stage)
                    .map_err(io::Error::other)?;
            }
            if let (None, Some(listen)) = (&self.recv, &mut self.listen) {
                self.recv = net.accept(listen).map_err(io::Error::other)?;
            }
            if self.send.is_some() && self.recv.is_some() {
                break;
            }
            if cx.abort.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "aborted"));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::thread::yield_now();
        }
        if let Some(listen) = self.listen.take() {
            net.close_listen(listen).map_err(io::Error::other)?;
        }
        let (send, recv) = (self.send.take(), self.recv.take());
        let (Some(send), Some(recv)) = (send, recv) else {
            unreachable!("both ends are connected")
        };
        let slot_bytes = cx.fifo.slot_bytes(Protocol::Simple);
        let conn = NetConnection::start(self.net.clone(), send, recv, cx.fifo.nslots, slot_bytes)
            .map_err(io::Error::other)?;
        Ok(Some(Box::new(conn)))
    }
}
