//! The verbs the IB network drives, behind one interface with two
//! implementations: [`libibverbs`] (rdma-core's library, opened at run
//! time) and [`Model`] (a model of reliable-connected verbs for machines
//! without an RDMA device, which the provider's tests run over).
//!
//! Only what the provider needs: devices, ports and GID tables, one
//! protection domain per opened device, memory regions, completion queues,
//! reliable-connected queue pairs moved INIT -> RTR -> RTS, RDMA write
//! (with or without immediate data), send, and receives.

use std::fmt;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) mod libibverbs;
pub(crate) mod model;

pub use model::{Fault, Model};

/// A GID: the address of a port on the fabric.
pub type Gid = [u8; 16];

/// `IBV_ACCESS_LOCAL_WRITE`.
pub const ACCESS_LOCAL_WRITE: u32 = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const ACCESS_REMOTE_WRITE: u32 = 2;
/// `IBV_ACCESS_REMOTE_READ`.
pub const ACCESS_REMOTE_READ: u32 = 4;

/// What a port's link is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID (and GID across subnets).
    InfiniBand,
    /// Ethernet (RoCE): addressed by GID.
    Ethernet,
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (`NCCL_IB_GID_INDEX`).
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// On Ethernet: RoCE v1 or v2 (`NCCL_IB_ROCE_VERSION_NUM`).
    pub roce_version: Option<u8>,
}

impl GidEntry {
    /// Whether the GID is an IPv4 address mapped into IPv6
    /// (`::ffff:a.b.c.d`, the model puts its wire's port in bytes 8..10).
    pub fn is_ipv4(&self) -> bool {
        self.gid[10] == 0xff && self.gid[11] == 0xff && self.gid[..8].iter().all(|&b| b == 0)
    }

    /// Whether the entry is unset (all zero).
    pub fn is_empty(&self) -> bool {
        self.gid.iter().all(|&b| b == 0)
    }
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Its number (from 1).
    pub port: u8,
    /// Whether the port is active (`IBV_PORT_ACTIVE`).
    pub active: bool,
    /// Its link.
    pub link_layer: LinkLayer,
    /// Its LID (0 on Ethernet).
    pub lid: u16,
    /// The active MTU, as `enum ibv_mtu` (1: 256 bytes .. 5: 4096).
    pub mtu: u8,
    /// Speed in Mbps.
    pub speed_mbps: u32,
    /// The GID table.
    pub gids: Vec<GidEntry>,
}

/// A device (an HCA) and its ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its name (`mlx5_0`).
    pub name: String,
    /// Its node GUID.
    pub guid: u64,
    /// Its PCI device in `/sys`.
    pub pci_path: Option<PathBuf>,
    /// Its ports.
    pub ports: Vec<PortInfo>,
}

/// Why a verbs call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsError {
    /// The call (`ibv_modify_qp`).
    pub call: &'static str,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.call, self.message)
    }
}

impl VerbsError {
    /// An error of `call`.
    pub fn new(call: &'static str, message: impl Into<String>) -> VerbsError {
        VerbsError {
            call,
            message: message.into(),
        }
    }
}

/// A completion's status (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: a message larger than the receive buffer.
    LocalLength,
    /// `IBV_WC_LOC_PROT_ERR`: a local buffer outside its registration.
    LocalProtection,
    /// `IBV_WC_WR_FLUSH_ERR`: the queue pair was in error.
    Flush,
    /// `IBV_WC_REM_ACCESS_ERR`: a bad remote key or bounds.
    RemoteAccess,
    /// `IBV_WC_RETRY_EXC_ERR`: no answer after the retries.
    RetryExceeded,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the receiver had no receive posted.
    RnrRetryExceeded,
    /// Any other status, by number.
    Other(u32),
}

impl WcStatus {
    /// The status from its number.
    pub fn from_raw(raw: u32) -> WcStatus {
        match raw {
            0 => WcStatus::Success,
            1 => WcStatus::LocalLength,
            4 => WcStatus::LocalProtection,
            5 => WcStatus::Flush,
            10 => WcStatus::RemoteAccess,
            12 => WcStatus::RetryExceeded,
            13 => WcStatus::RnrRetryExceeded,
            other => WcStatus::Other(other),
        }
    }

    /// Its number.
    pub fn raw(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocalLength => 1,
            WcStatus::LocalProtection => 4,
            WcStatus::Flush => 5,
            WcStatus::RemoteAccess => 10,
            WcStatus::RetryExceeded => 12,
            WcStatus::RnrRetryExceeded => 13,
            WcStatus::Other(raw) => raw,
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            WcStatus::Success => "success",
            WcStatus::LocalLength => "local length error",
            WcStatus::LocalProtection => "local protection error",
            WcStatus::Flush => "work request flushed error",
            WcStatus::RemoteAccess => "remote access error",
            WcStatus::RetryExceeded => "transport retry counter exceeded",
            WcStatus::RnrRetryExceeded => "RNR retry counter exceeded",
            WcStatus::Other(_) => "error",
        };
        write!(f, "{text} (status {})", self.raw())
    }
}

/// What a completion completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// A send.
    Send,
    /// An RDMA write (with or without immediate data).
    RdmaWrite,
    /// A receive consumed by a send.
    Recv,
    /// A receive consumed by an RDMA write with immediate data.
    RecvRdmaWithImm,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was (meaningful on success).
    pub opcode: WcOpcode,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// The immediate data, if the message carried any.
    pub imm: Option<u32>,
    /// The queue pair it belongs to.
    pub qp_num: u32,
}

/// A scatter-gather element: registered local bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Where.
    pub addr: u64,
    /// How many bytes.
    pub len: u32,
    /// The registration's local key.
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// An RDMA write to `remote_addr` under `rkey`; with immediate data it
    /// consumes a receive posted at the peer and completes it.
    Write {
        /// Where it lands.
        remote_addr: u64,
        /// The remote registration's key.
        rkey: u32,
        /// The immediate data, if any.
        imm: Option<u32>,
    },
    /// A send into the next receive posted at the peer.
    Send,
}

/// A send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Its id, returned in its completion.
    pub wr_id: u64,
    /// The bytes it moves (`None`: none).
    pub sge: Option<Sge>,
    /// What it does.
    pub op: SendOp,
    /// Whether it completes with a completion on success
    /// (`IBV_SEND_SIGNALED`); errors always complete.
    pub signaled: bool,
    /// Whether the bytes are copied at posting (`IBV_SEND_INLINE`): the
    /// buffer may be reused at once.
    pub inline: bool,
}

/// A receive work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Its id, returned in its completion.
    pub wr_id: u64,
    /// Where a send's bytes go (`None`: writes with immediate only).
    pub sge: Option<Sge>,
}

/// The sizes of a queue pair's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests outstanding.
    pub max_send_wr: u32,
    /// Receive work requests outstanding.
    pub max_recv_wr: u32,
    /// Bytes a send may carry inline.
    pub max_inline: u32,
}

/// How a queue pair reaches its peer: the peer's side of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    /// The peer queue pair's number.
    pub qpn: u32,
    /// The first packet sequence number it sends.
    pub psn: u32,
    /// The peer port's LID.
    pub lid: u16,
    /// The peer port's GID (as chosen by the peer).
    pub gid: Gid,
    /// The path MTU (`enum ibv_mtu`).
    pub mtu: u8,
}

/// The path settings of a queue pair (`NCCL_IB_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathSettings {
    /// The local port.
    pub port: u8,
    /// Address by GID (a global route header): always on Ethernet.
    pub is_global: bool,
    /// The local GID index (`NCCL_IB_GID_INDEX`).
    pub sgid_index: u8,
    /// Service level (`NCCL_IB_SL`).
    pub sl: u8,
    /// Traffic class (`NCCL_IB_TC`).
    pub traffic_class: u8,
    /// Local ACK timeout, 4.096 us x 2^timeout (`NCCL_IB_TIMEOUT`).
    pub timeout: u8,
    /// Transport retries (`NCCL_IB_RETRY_CNT`).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7: without end).
    pub rnr_retry: u8,
    /// The access a remote peer has (`IBV_ACCESS_*`).
    pub access: u32,
}

/// The verbs: the devices there are, and opening one.
pub trait Verbs: Send + Sync {
    /// Which implementation (`libibverbs`, `model`), for logs.
    fn name(&self) -> &'static str;
    /// The devices and their ports.
    fn devices(&self) -> &[DeviceInfo];
    /// Opens device `dev` (by index into [`Verbs::devices`]), with one
    /// protection domain.
    fn open(&self, dev: usize) -> Result<Arc<dyn Device>, VerbsError>;
    /// Whether `reg_mr` takes device memory (GPUDirect RDMA through
    /// `nvidia-peermem`).
    fn registers_device_memory(&self) -> bool;
}

/// An opened device with its protection domain.
pub trait Device: Send + Sync {
    /// Registers `len` bytes at `addr` with `access`: host memory, or
    /// device memory where [`Verbs::registers_device_memory`].
    ///
    /// # Safety
    /// The bytes stay valid until the region is dropped, and while the
    /// region allows remote writes nothing else relies on their contents
    /// except as the protocol using them says.
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError>;
    /// Registers the `len` bytes at `offset` of the dma-buf `fd` (device
    /// memory a GPU driver exported), addressed by peers as `iova`
    /// onwards, with `access`.
    ///
    /// # Safety
    /// As [`Device::reg_mr`], for the dma-buf's bytes.
    unsafe fn reg_dmabuf_mr(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError>;
    /// Whether [`Device::reg_dmabuf_mr`] works here (the library has it
    /// and the kernel takes dma-bufs).
    fn registers_dmabuf(&self) -> bool;
    /// A completion queue of `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>, VerbsError>;
    /// A reliable-connected queue pair (RESET) whose send and receive
    /// completions go to `cq`.
    fn create_qp(
        &self,
        cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Box<dyn QueuePair>, VerbsError>;
    /// A fatal asynchronous event seen on the device or its port (port
    /// down), if any.
    fn async_error(&self) -> Option<String>;
}

/// A memory region; dropping it deregisters it.
pub trait MemoryRegion: Send + Sync {
    /// The local key.
    fn lkey(&self) -> u32;
    /// The remote key.
    fn rkey(&self) -> u32;
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync {
    /// The implementation's own type, for its queue pairs.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Moves up to `wcs.len()` completions into `wcs`: how many. Fails
    /// once the queue overflowed.
    fn poll(&self, wcs: &mut [Wc]) -> Result<usize, VerbsError>;
    /// A descriptor that turns readable when a completion arrives after
    /// [`CompletionQueue::arm`], for the network proxy to sleep on.
    fn event_fd(&self) -> RawFd;
    /// Consumes the events so far and asks for the next one. Poll after
    /// arming: a completion that arrives later raises an event.
    fn arm(&self) -> Result<(), VerbsError>;
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send + Sync {
    /// Its number.
    fn qpn(&self) -> u32;
    /// RESET -> INIT on `path.port` with `path.access`.
    fn init(&self, path: &PathSettings) -> Result<(), VerbsError>;
    /// INIT -> RTR towards `remote`.
    fn ready_to_receive(&self, remote: &RemoteQp, path: &PathSettings) -> Result<(), VerbsError>;
    /// RTR -> RTS, sending from `psn`.
    fn ready_to_send(&self, psn: u32, path: &PathSettings) -> Result<(), VerbsError>;
    /// Posts send work requests, in order.
    fn post_send(&self, wrs: &[SendWr]) -> Result<(), VerbsError>;
    /// Posts receive work requests, in order.
    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), VerbsError>;
    /// A fatal asynchronous event seen on this queue pair, if any.
    fn async_error(&self) -> Option<String>;
}
