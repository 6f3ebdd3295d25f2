//! The network interface, shaped like NCCL's net plug-in (`ncclNet`
//! v10-v12), its providers, and the one proxy thread per process that moves
//! every network connection's slots through them.
//!
//! - [`Net`]: what a network provides (devices, listen / connect / accept,
//!   memory registration, `isend` / `irecv` / `test`, close). Implement it
//!   to add a network.
//! - [`socket::Socket`]: the first provider, TCP sockets, authenticated with
//!   the communicator's secret.
//! - [`NetConnection`]: a [`crate::Connection`] whose FIFOs the process's
//!   network proxy moves through any [`Net`].
//! - [`providers`]: which provider a communicator uses (`NCCL_NET`).
//! - [`plugin`]: the plug-in host, a third-party NCCL net plug-in
//!   (`NCCL_NET_PLUGIN`) as a provider.
//!
//! # The contract (NCCL's, word for word where NCCL states it)
//!
//! - **One direction.** A communicator carries data one way: `connect`
//!   returns the sending side, `accept` the receiving side. Two ranks that
//!   talk both ways use two communicators.
//! - **Nothing blocks.** `listen` returns at once with a handle of at most
//!   [`NET_HANDLE_MAXSIZE`] bytes that travels to the sender (through the
//!   bootstrap). `connect` and `accept` never wait for the peer: they return
//!   `Ok(None)` until the connection is established and are called again
//!   until they return `Ok(Some(..))`. `isend` and `irecv` return
//!   `Ok(None)` when the operation cannot be started now; they are called
//!   again later. `test` never waits either.
//! - **Order.** Sends and receives of a communicator match in the order they
//!   were posted. A receive may be larger than its send; `test` then reports
//!   the real size received. A send larger than the receive's buffer is an
//!   error ([`NetError::Truncated`]).
//! - **Grouped receives.** `irecv` may post up to
//!   [`Properties::max_recvs`] buffers, each with a tag, as one request. The
//!   next sends (one per buffer) fill that group: each goes to the buffer of
//!   the group with its tag that is still empty. Tags only place a send
//!   within the first group posted; they never let a send overtake a group.
//!   The request completes when every buffer of the group is filled, and
//!   `test` reports one size per buffer.
//! - **Requests in flight.** A receiving communicator handles up to
//!   [`NET_MAX_REQUESTS`] (32) requests at once, a sending one 32 times
//!   `max_recvs`, so that 32 grouped receives can be matched. One more is
//!   refused with [`NetError::TooManyRequests`] (NCCL's providers refuse it
//!   as an internal error: the caller broke the contract), and the
//!   communicator stays usable.
//! - **Requests end once.** After `test` reports a request done it is
//!   spent; testing it again is an error. A request dropped before it is
//!   done still runs to completion on the wire, so later sends still match.
//! - **Memory.** Buffers are registered first ([`Net::reg_mr`]) and every
//!   `isend` / `irecv` names the registration its buffer lies in.
//! - **Errors.** A failed communicator fails every request on it with the
//!   same error, which names the peer.
//! - **Close.** `close_send`, `close_recv` and `close_listen` never block;
//!   requests still pending on a closed communicator fail when tested.
//!
//! A provider value is NCCL's per-communicator context (`init`'s `ctx`):
//! build one per communicator, with what that communicator's connections
//! share (for the Socket provider, its secret).

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;

mod checks;
mod connection;
mod entry;
pub(crate) mod handshake;
mod ib;
mod plugin;
mod providers;
mod proxy;
mod requests;
mod socket;

pub use crate::fifo::PtrSupport;
pub(crate) use connection::transport_name;
pub use connection::NetConnection;
pub use entry::Network;
pub use ib::{HcaFilter, Ib, IbConfig};
pub use plugin::{abi, net_library_names, Plugin, PluginNet};
pub use providers::{choose, choose_from, register, NetInit, Provider};
pub use proxy::{keep_polling, Polling};
pub use socket::{interface_speed, Socket, SocketDevice};

/// Most requests a communicator handles at once (`NCCL_NET_MAX_REQUESTS`).
pub const NET_MAX_REQUESTS: usize = 32;

/// Most buffers one grouped receive may post in any provider (NCCL's IB
/// provider's limit, `NCCL_NET_IB_MAX_RECVS`); a provider says its own in
/// [`Properties::max_recvs`].
pub const MAX_RECVS: usize = 8;

/// Most bytes of a listen handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const NET_HANDLE_MAXSIZE: usize = 128;

/// What a device is and what it can do (`ncclNetProperties_t`).
#[derive(Clone, Debug, PartialEq)]
pub struct Properties {
    /// For logs (the interface name for sockets).
    pub name: String,
    /// The PCI device in `/sys`, if the device has one.
    pub pci_path: Option<PathBuf>,
    /// Devices with the same guid share one port to the fabric.
    pub guid: u64,
    /// Memory it can move.
    pub ptr_support: PtrSupport,
    /// A registration is valid for every communicator, not just the one
    /// it was made on.
    pub reg_is_global: bool,
    /// Receives must be flushed ([`Net::iflush`]) before the data is read.
    pub force_flush: bool,
    /// Port speed in Mbps (10^6 bits per second).
    pub speed_mbps: u32,
    /// Port number on the device.
    pub port: u32,
    /// Network latency in microseconds (0: unknown).
    pub latency_us: f32,
    /// Most communicators it can create.
    pub max_comms: usize,
    /// Most buffers one grouped receive may post (at most [`MAX_RECVS`]).
    pub max_recvs: usize,
    /// Most bytes of one point-to-point transfer.
    pub max_p2p_bytes: u64,
}

/// What a registration covers and how the device reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    /// Host memory (`NCCL_PTR_HOST`).
    Host,
    /// CUDA device memory (`NCCL_PTR_CUDA`).
    Cuda,
    /// A dma-buf export of device memory (`regMrDmaBuf`): the file
    /// descriptor and the buffer's offset in it.
    DmaBuf {
        /// The dma-buf file descriptor.
        fd: RawFd,
        /// Where the buffer starts in it.
        offset: u64,
    },
}

/// The bytes a listening side gives the connecting side (through the
/// bootstrap): at most [`NET_HANDLE_MAXSIZE`].
#[derive(Clone, PartialEq, Eq)]
pub struct ListenHandle(Vec<u8>);

impl ListenHandle {
    /// A handle of `bytes`, refused if longer than [`NET_HANDLE_MAXSIZE`].
    pub fn from_bytes(bytes: &[u8]) -> Result<ListenHandle, NetError> {
        if bytes.len() > NET_HANDLE_MAXSIZE {
            return Err(NetError::InvalidArgument(format!(
                "a listen handle of {} bytes exceeds {NET_HANDLE_MAXSIZE}",
                bytes.len()
            )));
        }
        Ok(ListenHandle(bytes.to_vec()))
    }

    /// The bytes to send to the connecting side.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ListenHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ListenHandle({} bytes)", self.0.len())
    }
}

/// A send or receive communicator, for calls that take either
/// (registration).
pub enum CommRef<'a, N: Net + ?Sized> {
    /// A sending communicator.
    Send(&'a N::SendComm),
    /// A receiving communicator.
    Recv(&'a N::RecvComm),
}

/// One buffer of a (grouped) receive.
pub struct RecvBuffer<'a, N: Net + ?Sized> {
    /// Where the data goes.
    pub data: *mut u8,
    /// Room there: the most a matching send may carry.
    pub size: usize,
    /// Which send of the group fills it.
    pub tag: i32,
    /// The registration `data..data + size` lies in.
    pub mhandle: &'a N::MemHandle,
}

/// The sizes a completed request moved: one for a send, one per buffer for
/// a grouped receive, none for a flush.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sizes {
    len: usize,
    sizes: [usize; MAX_RECVS],
}

impl Sizes {
    /// Sizes from a slice of at most [`MAX_RECVS`].
    pub fn new(sizes: &[usize]) -> Sizes {
        let mut all = [0; MAX_RECVS];
        all[..sizes.len()].copy_from_slice(sizes);
        Sizes {
            len: sizes.len(),
            sizes: all,
        }
    }

    /// The sizes, in the order of the request's buffers.
    pub fn as_slice(&self) -> &[usize] {
        &self.sizes[..self.len]
    }
}

/// What a pending request waits for, so the proxy may sleep until it can
/// move: the file descriptor and whether it must become readable or
/// writable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// The descriptor.
    pub fd: RawFd,
    /// Readable (`true`) or writable (`false`).
    pub readable: bool,
}

/// The side of a communicator: who is at the other end, for messages.
pub trait Endpoint {
    /// The peer as messages name it (its address for sockets).
    fn peer(&self) -> String;
}

/// Why a network call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// The peer closed the connection (or went away) while data was
    /// expected.
    #[error("connection closed by {peer}{}", if *.mid_message { " in the middle of a message" } else { "" })]
    Closed {
        /// Who closed it.
        peer: String,
        /// Whether a message was partly received.
        mid_message: bool,
    },
    /// This side closed the communicator while the request was pending.
    #[error("the communicator with {peer} was closed with the request pending")]
    Aborted {
        /// Who the communicator went to.
        peer: String,
    },
    /// A system call on the connection failed.
    #[error("{net} error while {doing} {peer}: {message}")]
    Io {
        /// The network (`socket`).
        net: &'static str,
        /// What was being done (`sending to`, `receiving from`,
        /// `connecting to`).
        doing: &'static str,
        /// Who the connection goes to.
        peer: String,
        /// The error's kind.
        kind: io::ErrorKind,
        /// The error as the system described it.
        message: String,
    },
    /// A send was larger than the receive buffer it matched.
    #[error("message from {peer} truncated: {sent} bytes sent into a receive of {posted} bytes")]
    Truncated {
        /// The sender.
        peer: String,
        /// Bytes sent.
        sent: u64,
        /// Bytes of room in the receive.
        posted: usize,
    },
    /// A send's tag matched no empty buffer of the first receive posted.
    #[error(
        "a message from {peer} with tag {tag} matches no empty buffer of the receive posted first"
    )]
    UnexpectedTag {
        /// The sender.
        peer: String,
        /// The send's tag.
        tag: i32,
    },
    /// The handshake failed: the peer is not a member of the communicator
    /// (wrong secret) or not speaking this protocol.
    #[error("refused {peer}: {reason}")]
    Refused {
        /// Who was refused.
        peer: String,
        /// Why.
        reason: String,
    },
    /// The communicator already has as many requests in flight as it may.
    #[error("{limit} requests are already in flight on this communicator (NCCL_NET_MAX_REQUESTS)")]
    TooManyRequests {
        /// The limit.
        limit: usize,
    },
    /// The provider cannot move this kind of memory.
    #[error("the {net} network cannot register {memory:?} memory")]
    Unsupported {
        /// The network.
        net: &'static str,
        /// The memory refused.
        memory: MemoryType,
    },
    /// A call broke the contract (a bad size, a buffer outside its
    /// registration, a request tested after it was done).
    #[error("{0}")]
    InvalidArgument(String),
    /// A net plug-in's call failed: its `ncclResult_t`, and the warning it
    /// logged.
    #[error("{}", plugin_error(plugin, call, peer, *code, message))]
    Plugin {
        /// The plug-in's name.
        plugin: &'static str,
        /// The call (`isend`, `test`).
        call: &'static str,
        /// The communicator's peer as the host names it (empty for calls
        /// on no communicator).
        peer: String,
        /// The `ncclResult_t`.
        code: i32,
        /// What the plug-in logged as a warning during the call.
        message: String,
    },
}

fn plugin_error(plugin: &str, call: &str, peer: &str, code: i32, message: &str) -> String {
    let code = plugin::abi::result_name(code);
    let with = if peer.is_empty() {
        String::new()
    } else {
        format!(" with {peer}")
    };
    format!("the net plug-in {plugin}: {call} failed ({code}){with}: {message}")
}

impl NetError {
    /// An [`NetError::Io`] from `err`.
    pub fn io(
        net: &'static str,
        doing: &'static str,
        peer: impl fmt::Display,
        err: &io::Error,
    ) -> NetError {
        NetError::Io {
            net,
            doing,
            peer: peer.to_string(),
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

/// A network, shaped like NCCL's net plug-in (`ncclNet` v10-v12). See the
/// [module documentation](self) for the contract every provider keeps.
pub trait Net: Send + Sync + 'static {
    /// A listening communicator (`listenComm`).
    type ListenComm: Send;
    /// Where a `connect` in progress keeps its state between calls (NCCL
    /// keeps it in the handle).
    type ConnectStage: Default + Send;
    /// A sending communicator (`sendComm`).
    type SendComm: Send + Endpoint;
    /// A receiving communicator (`recvComm`).
    type RecvComm: Send + Endpoint;
    /// A memory registration (`mhandle`).
    type MemHandle: Send;
    /// A send, receive or flush in flight.
    type Request: Send;

    /// The network's name (`Socket`), as `NCCL_NET` selects it and logs
    /// show it (`NET/Socket`).
    fn name(&self) -> &'static str;

    /// How many devices there are (at least one).
    fn devices(&self) -> usize;

    /// Device `dev`'s properties.
    fn properties(&self, dev: usize) -> Result<Properties, NetError>;

    /// Starts listening on device `dev` for one connection: the handle to
    /// give the connecting side, and the communicator to `accept` on.
    /// Never blocks.
    fn listen(&self, dev: usize) -> Result<(ListenHandle, Self::ListenComm), NetError>;

    /// Connects device `dev` to the listener `handle` names. Never blocks:
    /// `Ok(None)` until the connection is established; call again with the
    /// same `stage` until it returns the sending communicator.
    fn connect(
        &self,
        dev: usize,
        handle: &ListenHandle,
        stage: &mut Self::ConnectStage,
    ) -> Result<Option<Self::SendComm>, NetError>;

    /// Finishes a connection a peer made to `listen`. Never blocks:
    /// `Ok(None)` until one is established; call again until it returns
    /// the receiving communicator.
    fn accept(&self, listen: &mut Self::ListenComm) -> Result<Option<Self::RecvComm>, NetError>;

    /// Registers `size` bytes at `data` for sends or receives on `comm`.
    ///
    /// # Safety
    /// The bytes stay valid until the registration is deregistered and no
    /// request posted with it is pending (or its communicator is closed).
    /// While a send is pending nobody writes its bytes; while a receive is
    /// pending nobody reads or writes its buffer.
    unsafe fn reg_mr(
        &self,
        comm: CommRef<'_, Self>,
        data: *mut u8,
        size: usize,
        memory: MemoryType,
    ) -> Result<Self::MemHandle, NetError>;

    /// Ends a registration.
    fn dereg_mr(&self, comm: CommRef<'_, Self>, mhandle: Self::MemHandle) -> Result<(), NetError>;

    /// Starts sending `size` bytes at `data` (inside `mhandle`'s
    /// registration), tagged `tag` for a grouped receive. `Ok(None)`: it
    /// cannot start now; call again later.
    fn isend(
        &self,
        comm: &mut Self::SendComm,
        data: *const u8,
        size: usize,
        tag: i32,
        mhandle: &Self::MemHandle,
    ) -> Result<Option<Self::Request>, NetError>;

    /// Starts receiving into `buffers` (one to [`Properties::max_recvs`]),
    /// as one request. `Ok(None)`: it cannot start now; call again later.
    fn irecv(
        &self,
        comm: &mut Self::RecvComm,
        buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<Self::Request>, NetError>;

    /// Makes received data visible to the device that reads it (for device
    /// memory); a request like any other. `Ok(None)`: call again later.
    fn iflush(
        &self,
        comm: &mut Self::RecvComm,
        buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<Self::Request>, NetError>;

    /// Moves the request's communicator along and says whether the request
    /// is done: `Ok(Some(sizes))` once, with the real sizes moved;
    /// `Ok(None)` while it is pending. Never blocks.
    fn test(&self, request: &mut Self::Request) -> Result<Option<Sizes>, NetError>;

    /// Closes a sending communicator; requests on it fail from now on.
    fn close_send(&self, comm: Self::SendComm) -> Result<(), NetError>;

    /// Closes a receiving communicator; requests on it fail from now on.
    fn close_recv(&self, comm: Self::RecvComm) -> Result<(), NetError>;

    /// Closes a listening communicator.
    fn close_listen(&self, comm: Self::ListenComm) -> Result<(), NetError>;

    /// Not in NCCL's interface: what a pending request waits for, so that
    /// the proxy thread can sleep until the request can move instead of
    /// testing it in a loop. `None` (the default): the proxy tests again
    /// after a short sleep.
    fn readiness(&self, request: &Self::Request) -> Option<Readiness> {
        let _ = request;
        None
    }
}
