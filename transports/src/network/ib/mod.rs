//! The IB network: InfiniBand and RoCE through verbs, as NCCL's IB
//! transport moves bytes.
//!
//! A communicator is `NCCL_IB_QPS_PER_CONNECTION` reliable-connected queue
//! pairs and one completion queue at each end. The receiver tells the
//! sender where each message may land: for every receive it writes one
//! entry per buffer (address, room, key, tag, the group's size, and a
//! sequence number written last) into the sender's FIFO of
//! [`NET_MAX_REQUESTS`] slots, by RDMA write. The sender matches its
//! sends to the entries of the next slot by tag, writes each send's bytes
//! straight into its buffer (split across the queue pairs), and when every
//! buffer of the slot has its send, writes the sizes into the receiver's
//! size area and signals the slot with an RDMA write with immediate data
//! on every queue pair, which consumes the receives the receiver posted:
//! the receive is done when all of them arrived. A send larger than its
//! buffer, or one whose tag no buffer of the slot has, writes no data: its
//! size entry says so, and the receiver fails with the error.
//!
//! Completions are polled by `test`, from the network proxy. Queue-pair
//! details (numbers, sequence numbers, LID, GID, MTU, the FIFO's or the
//! size area's address and key) travel over a TCP connection to the
//! listener that the listen handle names, opened with the communicator's
//! HMAC handshake; the connection stays open while the communicator lives,
//! so that either side sees the other close or die.
//!
//! Settings, as in NCCL: `NCCL_IB_HCA` (devices and ports: `mlx5_0:1,mlx5_1`,
//! prefix match, `=` exact, `^` exclude), `NCCL_IB_GID_INDEX`,
//! `NCCL_IB_ROCE_VERSION_NUM`, `NCCL_IB_TC`, `NCCL_IB_SL`, `NCCL_IB_TIMEOUT`,
//! `NCCL_IB_RETRY_CNT`, `NCCL_IB_QPS_PER_CONNECTION`. `RCCL_IB_MODEL=1` runs
//! the provider over the verbs model ([`model`]) instead of libibverbs.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::checks::{check_recv, check_unspent, nothing_to_flush, OpState, Registration};
use super::handshake::{self, Client, Partial, Server, LISTENER_ID};
use super::requests::{Kind, Posted, Request, Side};
use super::socket::{handle_bytes, parse_handle};
use super::{
    CommRef, Endpoint, ListenHandle, MemoryType, Net, NetError, Properties, PtrSupport, Readiness,
    RecvBuffer, Sizes, MAX_RECVS, NET_MAX_REQUESTS,
};
use crate::auth_tcp::{fill_random, Secret, DEFAULT_HANDSHAKE_TIMEOUT};
use verbs::{
    CompletionQueue, Device, GidEntry, LinkLayer, MemoryRegion, PathSettings, PortInfo, QpCaps,
    QueuePair, RecvWr, RemoteQp, SendOp, SendWr, Sge, Verbs, Wc, WcOpcode, WcStatus,
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE,
};

mod config;
pub mod model;
mod net;
pub mod sys;
pub mod verbs;

pub use config::{choose_gid, HcaFilter, IbConfig};

/// The noun in this network's errors.
const NET: &str = "IB";
/// Most queue pairs per connection.
pub const MAX_QPS: usize = 16;
/// Most bytes of one transfer: one work request per queue pair.
const MAX_P2P_BYTES: u64 = 1 << 30;
/// Bytes of the queue-pair details each side sends.
const INFO_LEN: usize = 256;
const INFO_MAGIC: [u8; 4] = *b"RCIB";
/// Entries of the sender's FIFO (and of the receiver's size area).
const FIFO_ENTRIES: usize = NET_MAX_REQUESTS * MAX_RECVS;
/// A size entry for a send larger than its buffer (the rest: the size).
const SIZE_TRUNCATED: u64 = 1 << 63;
/// A size entry for a send whose tag no buffer had (the rest: the tag).
const SIZE_BAD_TAG: u64 = 1 << 62;
/// Work-request ids: a send's data, a slot's signal, a receive's FIFO
/// entry (the rest of the id: the send's or the slot's number).
const WR_DATA: u64 = 1 << 62;
const WR_SIGNAL: u64 = 2 << 62;
const WR_CTS: u64 = 3 << 62;
const WR_KIND: u64 = 3 << 62;
/// How often a communicator with nothing completing looks at its TCP
/// connection for the peer's close.
const LIVENESS_EVERY: Duration = Duration::from_millis(2);
/// Bytes of immediate data a send may carry inline (a FIFO entry, the
/// sizes of a slot).
const MAX_INLINE: u32 = 64;

/// One usable port of a device: what NCCL calls an IB net device.
struct Port {
    /// Index into the verbs' devices.
    verbs_dev: usize,
    name: String,
    info: PortInfo,
    gid: GidEntry,
    guid: u64,
    pci_path: Option<std::path::PathBuf>,
    /// The opened device, once a communicator needed it.
    opened: Mutex<Option<Arc<dyn Device>>>,
}

/// The IB network of one communicator: the usable ports, the settings, and
/// the secret its connections authenticate with.
pub struct Ib {
    verbs: Arc<dyn Verbs>,
    ports: Vec<Port>,
    config: IbConfig,
    /// Where the TCP listeners for connection details bind.
    ip: IpAddr,
    secret: Secret,
    handshake_timeout: Duration,
}

impl std::fmt::Debug for Ib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ib")
            .field("verbs", &self.verbs.name())
            .field(
                "ports",
                &self
                    .ports
                    .iter()
                    .map(|p| format!("{}:{}", p.name, p.info.port))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Ib {
    /// The IB network over `verbs`: the active ports `config` admits.
    /// Fails, saying why, when there is none.
    pub fn new(
        verbs: Arc<dyn Verbs>,
        config: IbConfig,
        ip: IpAddr,
        secret: Secret,
    ) -> Result<Ib, String> {
        let devices = verbs.devices();
        if devices.is_empty() {
            return Err(format!("no IB device ({} found none)", verbs.name()));
        }
        let mut ports = Vec::new();
        let mut seen = Vec::new();
        for (verbs_dev, device) in devices.iter().enumerate() {
            for info in &device.ports {
                seen.push(format!(
                    "{}:{}{}",
                    device.name,
                    info.port,
                    if info.active { "" } else { " (down)" }
                ));
                if !info.active
                    || config
                        .hca
                        .as_ref()
                        .is_some_and(|f| !f.admits(&device.name, info.port))
                {
                    continue;
                }
                let Some(gid) = choose_gid(info, config.gid_index, config.roce_version) else {
                    tracing::info!(target: "NET", "NET/IB: {}:{} has no GID{}", device.name, info.port,
                        config.gid_index.map_or(String::new(), |i| format!(" at NCCL_IB_GID_INDEX={i}")));
                    continue;
                };
                ports.push(Port {
                    verbs_dev,
                    name: device.name.clone(),
                    info: info.clone(),
                    gid,
                    guid: device.guid,
                    pci_path: device.pci_path.clone(),
                    opened: Mutex::new(None),
                });
            }
        }
        if ports.is_empty() {
            return Err(format!(
                "no usable IB port among {}{}",
                seen.join(", "),
                if config.hca.is_some() {
                    " (NCCL_IB_HCA admits none that is active)"
                } else {
                    " (none is active)"
                }
            ));
        }
        for port in &ports {
            tracing::info!(target: "NET", "NET/IB: using {}:{} ({}, GID index {}{})", port.name, port.info.port,
                match port.info.link_layer { LinkLayer::InfiniBand => "IB", LinkLayer::Ethernet => "RoCE" },
                port.gid.index, port.gid.roce_version.map_or(String::new(), |v| format!(", RoCE v{v}")));
        }
        Ok(Ib {
            verbs,
            ports,
            config,
            ip,
            secret,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        })
    }

    /// The IB network as the environment asks: over the model if
    /// `RCCL_IB_MODEL` is set (and not `0`), else over libibverbs.
    /// `Err` says why it is unavailable (no library, no device, a bad
    /// setting), for the caller to log and fall back to Socket.
    pub fn from_env(ip: IpAddr, secret: Secret) -> Result<Ib, String> {
        let config = IbConfig::from_env()?;
        let verbs: Arc<dyn Verbs> = match rccl_env::var("RCCL_IB_MODEL") {
            Some(value) if !value.is_empty() && value != "0" => {
                let IpAddr::V4(v4) = ip else {
                    return Err(format!("the verbs model needs an IPv4 address, not {ip}"));
                };
                Arc::new(
                    model::Model::new(v4).map_err(|e| format!("the verbs model on {ip}: {e}"))?,
                )
            }
            _ => {
                // Loaded and listed once per process, as NCCL does.
                static LIBIBVERBS: OnceLock<Result<Arc<sys::Libibverbs>, String>> = OnceLock::new();
                LIBIBVERBS
                    .get_or_init(|| sys::Libibverbs::open().map(Arc::new))
                    .clone()?
            }
        };
        Ib::new(verbs, config, ip, secret)
    }

    /// Sets how long a connecting peer may take over its handshake and the
    /// exchange of queue-pair details.
    pub fn set_handshake_timeout(&mut self, timeout: Duration) {
        self.handshake_timeout = timeout;
    }

    /// The settings in use.
    pub fn config(&self) -> &IbConfig {
        &self.config
    }

    fn port(&self, dev: usize) -> Result<&Port, NetError> {
        self.ports.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!(
                "no IB device {dev} (there are {})",
                self.ports.len()
            ))
        })
    }

    /// Port `dev`'s opened device.
    fn open(&self, dev: usize) -> Result<Arc<dyn Device>, NetError> {
        let port = self.port(dev)?;
        let mut opened = port.opened.lock();
        if let Some(device) = &*opened {
            return Ok(device.clone());
        }
        let device = self
            .verbs
            .open(port.verbs_dev)
            .map_err(|e| verbs_error("opening", &port.name, &e))?;
        *opened = Some(device.clone());
        Ok(device)
    }

    fn path(&self, dev: usize) -> Result<PathSettings, NetError> {
        let port = self.port(dev)?;
        Ok(PathSettings {
            port: port.info.port,
            // As NCCL: a global route header on Ethernet (RoCE), LIDs on
            // InfiniBand.
            is_global: port.info.link_layer == LinkLayer::Ethernet,
            sgid_index: port.gid.index,
            sl: self.config.sl,
            traffic_class: self.config.traffic_class,
            timeout: self.config.timeout,
            retry_cnt: self.config.retry_cnt,
            rnr_retry: 7,
            access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
        })
    }

    /// A completion queue and `nqps` queue pairs in INIT on port `dev`,
    /// with `area` (the FIFO or the size area) registered for remote
    /// writes.
    fn resources(&self, dev: usize, nqps: usize, area: Area) -> Result<Link, NetError> {
        let device = self.open(dev)?;
        let path = self.path(dev)?;
        let name = &self.port(dev)?.name;
        let caps = QpCaps {
            max_send_wr: (2 * NET_MAX_REQUESTS * (MAX_RECVS + 2)) as u32,
            max_recv_wr: NET_MAX_REQUESTS as u32,
            max_inline: MAX_INLINE,
        };
        let depth = (nqps as u32) * (caps.max_send_wr + caps.max_recv_wr) * 2;
        let cq = device
            .create_cq(depth)
            .map_err(|e| verbs_error("creating a completion queue on", name, &e))?;
        let mut qps = Vec::with_capacity(nqps);
        for _ in 0..nqps {
            let qp = device
                .create_qp(&cq, caps)
                .map_err(|e| verbs_error("creating a queue pair on", name, &e))?;
            qp.init(&path)
                .map_err(|e| verbs_error("initializing a queue pair on", name, &e))?;
            qps.push(qp);
        }
        let mut psns = [0u8; 4 * MAX_QPS];
        fill_random(&mut psns).map_err(|e| NetError::io(NET, "setting up", name, &e))?;
        let psns = (0..nqps)
            .map(|i| {
                u32::from_le_bytes(psns[4 * i..4 * i + 4].try_into().expect("4 bytes")) & 0xff_ffff
            })
            .collect();
        // SAFETY: the area lives in the link, which drops the region (and
        // the queue pairs that could write it) before the area.
        let area_mr = unsafe {
            device.reg_mr(
                area.base(),
                area.len(),
                ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
            )
        }
        .map_err(|e| verbs_error("registering memory on", name, &e))?;
        Ok(Link {
            qps,
            cq,
            area_mr: Some(area_mr),
            area,
            device,
            path,
            psns,
            port_lid: self.port(dev)?.info.lid,
            port_gid: self.port(dev)?.gid.gid,
            port_mtu: self.port(dev)?.info.mtu,
            control: None,
            peer: String::new(),
            failed: None,
            closed: false,
            last_look: Instant::now(),
            armed: false,
        })
    }
}

fn verbs_error(doing: &'static str, device: &str, e: &verbs::VerbsError) -> NetError {
    NetError::Io {
        net: NET,
        doing,
        peer: device.to_string(),
        kind: io::ErrorKind::Other,
        message: e.to_string(),
    }
}

/// One FIFO entry: where the next send of a slot may land. The sequence
/// number is last, so a sender that sees it sees the whole entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CtsEntry {
    addr: u64,
    size: u64,
    rkey: u32,
    tag: i32,
    nreqs: u32,
    seq: u32,
}

const CTS_BYTES: usize = std::mem::size_of::<CtsEntry>();

impl CtsEntry {
    fn to_bytes(self) -> [u8; CTS_BYTES] {
        let mut b = [0u8; CTS_BYTES];
        b[..8].copy_from_slice(&self.addr.to_ne_bytes());
        b[8..16].copy_from_slice(&self.size.to_ne_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_ne_bytes());
        b[20..24].copy_from_slice(&self.tag.to_ne_bytes());
        b[24..28].copy_from_slice(&self.nreqs.to_ne_bytes());
        b[28..32].copy_from_slice(&self.seq.to_ne_bytes());
        b
    }
}

/// Memory the peer writes by RDMA: the sender's FIFO or the receiver's
/// size area (8-byte words, zeroed).
struct Area(Box<[u64]>);

impl Area {
    fn fifo() -> Area {
        Area(vec![0u64; FIFO_ENTRIES * CTS_BYTES / 8].into_boxed_slice())
    }

    fn sizes() -> Area {
        Area(vec![0u64; FIFO_ENTRIES].into_boxed_slice())
    }

    fn base(&self) -> *mut u8 {
        self.0.as_ptr() as *mut u8
    }

    fn len(&self) -> usize {
        self.0.len() * 8
    }

    /// FIFO entry `i`, once its sequence number is `seq`.
    fn entry(&self, i: usize, seq: u32) -> Option<CtsEntry> {
        let at = self.base().wrapping_add(i * CTS_BYTES).cast::<CtsEntry>();
        // SAFETY: entry `i` lies in the area (i < FIFO_ENTRIES); the
        // sequence number is loaded atomically (the NIC writes it last,
        // with release ordering) before the rest is read.
        unsafe {
            let seq_at = std::ptr::addr_of_mut!((*at).seq);
            if AtomicU32::from_ptr(seq_at).load(Ordering::Acquire) != seq {
                return None;
            }
            Some(std::ptr::read_volatile(at))
        }
    }

    /// Size word `i`.
    fn size(&self, i: usize) -> u64 {
        // SAFETY: word `i` lies in the area; the NIC wrote it before the
        // completion that made the caller read it.
        unsafe { std::ptr::read_volatile(self.0.as_ptr().add(i)) }
    }
}

/// A communicator's queue pairs, completion queue, and RDMA-written area,
/// with the TCP connection it was set up over.
struct Link {
    // Field order is drop order: queue pairs and the region before the
    // area they write.
    qps: Vec<Box<dyn QueuePair>>,
    cq: Arc<dyn CompletionQueue>,
    area_mr: Option<Box<dyn MemoryRegion>>,
    area: Area,
    device: Arc<dyn Device>,
    path: PathSettings,
    psns: Vec<u32>,
    port_lid: u16,
    port_gid: [u8; 16],
    port_mtu: u8,
    control: Option<TcpStream>,
    peer: String,
    /// Why the communicator failed: every pending request fails so.
    failed: Option<NetError>,
    closed: bool,
    last_look: Instant,
    /// The completion queue raises an event for the next completion.
    armed: bool,
}

/// The queue-pair details one side sends the other.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Info {
    mtu: u8,
    lid: u16,
    gid: [u8; 16],
    /// The FIFO (from the sender) or the size area (from the receiver).
    addr: u64,
    rkey: u32,
    qps: Vec<(u32, u32)>,
}

impl Info {
    fn of(link: &Link) -> Info {
        Info {
            mtu: link.port_mtu,
            lid: link.port_lid,
            gid: link.port_gid,
            addr: link.area.base() as u64,
            rkey: link.area_mr.as_ref().map_or(0, |mr| mr.rkey()),
            qps: link
                .qps
                .iter()
                .zip(&link.psns)
                .map(|(qp, &psn)| (qp.qpn(), psn))
                .collect(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INFO_LEN];
        b[..4].copy_from_slice(&INFO_MAGIC);
        b[4] = 1;
        b[5] = self.qps.len() as u8;
        b[6] = self.mtu;
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        for (i, (qpn, psn)) in self.qps.iter().enumerate() {
            b[48 + 8 * i..52 + 8 * i].copy_from_slice(&qpn.to_le_bytes());
            b[52 + 8 * i..56 + 8 * i].copy_from_slice(&psn.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Result<Info, String> {
        if b.len() != INFO_LEN || b[..4] != INFO_MAGIC || b[4] != 1 {
            return Err("malformed queue-pair details".into());
        }
        let nqps = b[5] as usize;
        if !(1..=MAX_QPS).contains(&nqps) {
            return Err(format!("{nqps} queue pairs (1 to {MAX_QPS})"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(Info {
            mtu: b[6],
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid: b[16..32].try_into().expect("16 bytes"),
            addr: u64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
            rkey: u32_at(40),
            qps: (0..nqps)
                .map(|i| (u32_at(48 + 8 * i), u32_at(52 + 8 * i)))
                .collect(),
        })
    }
}

impl Link {
    /// Moves every queue pair to RTR and RTS towards `theirs`.
    fn connect(&mut self, theirs: &Info) -> Result<(), verbs::VerbsError> {
        for ((qp, &psn), &(qpn, their_psn)) in self.qps.iter().zip(&self.psns).zip(&theirs.qps) {
            let remote = RemoteQp {
                qpn,
                psn: their_psn,
                lid: theirs.lid,
                gid: theirs.gid,
                mtu: theirs.mtu.min(self.port_mtu),
            };
            qp.ready_to_receive(&remote, &self.path)?;
            qp.ready_to_send(psn, &self.path)?;
        }
        Ok(())
    }

    /// Why pending requests cannot complete, if they cannot.
    fn broken(&self) -> Option<NetError> {
        if let Some(failed) = &self.failed {
            return Some(failed.clone());
        }
        self.closed.then(|| NetError::Aborted {
            peer: self.peer.clone(),
        })
    }

    /// Fails the communicator; its TCP connection is shut down, so the
    /// peer's side fails too instead of waiting.
    fn fail(&mut self, err: NetError) {
        if self.failed.is_none() {
            tracing::info!(target: "NET", "NET/IB: the communicator with {} failed: {err}", self.peer);
            self.failed = Some(err);
            if let Some(control) = &self.control {
                let _ = control.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    fn fail_with(&mut self, doing: &'static str, kind: io::ErrorKind, message: String) {
        let peer = self.peer.clone();
        self.fail(NetError::Io {
            net: NET,
            doing,
            peer,
            kind,
            message,
        });
    }

    /// Polls the completion queue into `wcs`; looks for fatal events and,
    /// now and then, for the peer closing the TCP connection. `false` if
    /// the communicator is (now) failed; `wcs` then still holds the
    /// requests that completed before it failed (a peer that saw its last
    /// send complete may close at once), and only those.
    fn poll(&mut self, doing: &'static str, wcs: &mut Vec<Wc>) -> bool {
        if self.broken().is_some() {
            return false;
        }
        // Armed before polling, so a completion after this poll raises the
        // event the proxy sleeps on.
        if !self.armed {
            if let Err(e) = self.cq.arm() {
                self.fail_with(doing, io::ErrorKind::Other, e.to_string());
                return false;
            }
            self.armed = true;
        }
        let healthy = self.check(doing, wcs);
        wcs.retain(|wc| wc.status == WcStatus::Success);
        healthy
    }

    /// Drains the completion queue into `wcs` and fails the communicator
    /// if a completion, an event or the peer says so.
    fn check(&mut self, doing: &'static str, wcs: &mut Vec<Wc>) -> bool {
        if !self.drain(doing, wcs) {
            return false;
        }
        // A flush only follows the cause: the failed request's status, a
        // fatal event, or the peer closing its side.
        let bad = wcs
            .iter()
            .find(|wc| wc.status != WcStatus::Success && wc.status != WcStatus::Flush)
            .or_else(|| wcs.iter().find(|wc| wc.status == WcStatus::Flush))
            .copied();
        let failed = |wc: &Wc| {
            format!(
                "a work request failed: {} on QP {:#x}",
                wc.status, wc.qp_num
            )
        };
        if let Some(wc) = bad.filter(|wc| wc.status != WcStatus::Flush) {
            self.fail_with(doing, io::ErrorKind::ConnectionAborted, failed(&wc));
            return false;
        }
        // This side's device failing is a cause of its own.
        if let Some(fatal) = self.device.async_error() {
            self.fail_with(doing, io::ErrorKind::ConnectionAborted, fatal);
            return false;
        }
        let fatal = self.qps.iter().find_map(|qp| qp.async_error());
        if bad.is_some() || fatal.is_some() {
            // What completed before the link went is still good.
            self.drain(doing, wcs);
            if let Some(closed) = self.peer_gone() {
                self.fail(closed);
            } else {
                let why = fatal.unwrap_or_else(|| failed(&bad.expect("a flush")));
                self.fail_with(doing, io::ErrorKind::ConnectionAborted, why);
            }
            return false;
        }
        if wcs.is_empty() && self.last_look.elapsed() >= LIVENESS_EVERY {
            self.last_look = Instant::now();
            if let Some(err) = self.peer_gone() {
                self.drain(doing, wcs);
                self.fail(err);
                return false;
            }
        }
        true
    }

    /// Moves every completion the queue holds into `wcs`.
    fn drain(&mut self, doing: &'static str, wcs: &mut Vec<Wc>) -> bool {
        let mut batch = [Wc {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num: 0,
        }; 64];
        loop {
            match self.cq.poll(&mut batch) {
                Ok(0) => return true,
                Ok(n) => {
                    wcs.extend_from_slice(&batch[..n]);
                    self.armed = false;
                }
                Err(e) => {
                    self.fail_with(doing, io::ErrorKind::Other, e.to_string());
                    return false;
                }
            }
        }
    }

    /// Whether the peer closed the TCP connection (it closed the
    /// communicator, or its process ended).
    fn peer_gone(&self) -> Option<NetError> {
        let control = self.control.as_ref()?;
        let mut byte = [0u8; 1];
        // SAFETY: peeks at most one byte into a live buffer from a socket
        // we own, without waiting.
        let n = unsafe {
            libc::recv(
                std::os::fd::AsRawFd::as_raw_fd(control),
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return Some(NetError::Closed {
                peer: self.peer.clone(),
                mid_message: false,
            });
        }
        if n < 0 {
            let err = io::Error::last_os_error();
            if !matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) {
                return Some(NetError::io(NET, "watching", &self.peer, &err));
            }
        }
        None
    }

    fn post_send(&mut self, qp: usize, wrs: &[SendWr], doing: &'static str) -> bool {
        if wrs.is_empty() {
            return true;
        }
        match self.qps[qp].post_send(wrs) {
            Ok(()) => true,
            Err(e) => {
                self.fail_with(doing, io::ErrorKind::Other, e.to_string());
                false
            }
        }
    }
}

struct SendOpState {
    data: u64,
    size: usize,
    tag: i32,
    lkey: u32,
    /// Work requests not yet completed: its data's, and its slot's signal
    /// (one for all queue pairs). Done only once the signal landed: a
    /// sender that closes after its last send completed (its process may
    /// end) leaves the receiver nothing to wait for.
    left: usize,
    /// The FIFO slot it was matched to.
    slot: Option<u64>,
    /// Matched to a FIFO entry and its data posted.
    posted: bool,
    state: OpState,
}

struct SendState {
    link: Link,
    /// The peer's size area.
    sizes_addr: u64,
    sizes_rkey: u32,
    ops: Posted<SendOpState>,
    /// The first send not matched to a FIFO entry yet.
    next_match: u64,
    /// The FIFO slot being filled.
    slot: u64,
    /// The slot's entries, and the size of the send each got.
    entries: Vec<(CtsEntry, Option<usize>)>,
    /// Slots signalled whose signals have not all completed: per slot,
    /// the work requests left.
    signals: VecDeque<(u64, usize)>,
}

// SAFETY: the raw addresses in `ops` point into registered memory that the
// caller of `reg_mr` keeps valid and untouched while the sends are
// pending; the state is only reached through its mutex.
unsafe impl Send for SendState {}

struct RecvGroup {
    bufs: Vec<(usize, i32)>,
    sizes: Vec<usize>,
    /// Signals (one per queue pair) not yet arrived.
    left: usize,
    state: OpState,
}

struct RecvState {
    link: Link,
    /// The peer's FIFO.
    fifo_addr: u64,
    fifo_rkey: u32,
    groups: Posted<RecvGroup>,
    max_recvs: usize,
}

/// A sending communicator.
pub struct IbSend {
    state: Arc<Mutex<SendState>>,
    peer: String,
}

/// A receiving communicator.
pub struct IbRecv {
    state: Arc<Mutex<RecvState>>,
    peer: String,
}

impl Endpoint for IbSend {
    fn peer(&self) -> String {
        self.peer.clone()
    }
}

impl Endpoint for IbRecv {
    fn peer(&self) -> String {
        self.peer.clone()
    }
}

/// A registration: the bytes it covers and the device's region.
pub struct IbMr {
    start: usize,
    len: usize,
    mr: Box<dyn MemoryRegion>,
}

impl std::fmt::Debug for IbMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbMr")
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

impl Registration for IbMr {
    fn bounds(&self) -> (usize, usize) {
        (self.start, self.len)
    }
}

/// A send, receive or flush in flight.
pub struct IbRequest(Request<SendState, RecvState>);

impl Side for SendState {
    fn drop_request(&mut self, id: u64) {
        self.ops.get_mut(id).state.drop_request();
        self.retire();
    }
}

impl Side for RecvState {
    fn drop_request(&mut self, id: u64) {
        self.groups.get_mut(id).state.drop_request();
        self.retire();
    }
}

/// A listening communicator.
pub struct IbListen {
    listener: TcpListener,
    local: SocketAddr,
    id: [u8; LISTENER_ID],
    dev: usize,
    accepting: Vec<Accepting>,
}

/// A connection a peer made to a listener, being set up.
struct Accepting {
    peer: SocketAddr,
    deadline: Instant,
    step: AcceptStep,
}

enum AcceptStep {
    Handshake(Server),
    Details {
        stream: TcpStream,
        theirs: Partial,
    },
    Answer {
        stream: TcpStream,
        link: Box<Link>,
        fifo: (u64, u32),
        ours: Partial,
        ready: Partial,
    },
    Failed,
}

/// A `connect` in progress.
#[derive(Default)]
pub struct IbConnect {
    step: Option<ConnectStep>,
}

enum ConnectStep {
    Handshake(Client, SocketAddr),
    Details {
        stream: TcpStream,
        peer: SocketAddr,
        link: Box<Link>,
        ours: Partial,
        theirs: Partial,
        ready: Option<Partial>,
        sizes: (u64, u32),
    },
}

impl SendState {
    /// Forgets spent requests at the front.
    fn retire(&mut self) {
        self.ops
            .retire(|op| op.state == OpState::Spent && op.posted);
    }

    /// Moves what can move: completions, then sends onto FIFO entries.
    fn progress(&mut self) {
        let mut wcs = Vec::new();
        let healthy = self.link.poll("sending to", &mut wcs);
        for wc in wcs {
            let id = wc.wr_id & !WR_KIND;
            match wc.wr_id & WR_KIND {
                WR_DATA => {
                    let op = self.ops.get_mut(id);
                    op.left -= 1;
                    if op.left == 0 {
                        op.state.finish();
                    }
                }
                WR_SIGNAL => {
                    let Some(signal) = self.signals.iter_mut().find(|(slot, _)| *slot == id) else {
                        continue;
                    };
                    signal.1 -= 1;
                    if signal.1 == 0 {
                        for op in self.ops.iter_mut().filter(|op| op.slot == Some(id)) {
                            op.left -= 1;
                            if op.left == 0 {
                                op.state.finish();
                            }
                        }
                    }
                    while self.signals.front().is_some_and(|(_, left)| *left == 0) {
                        self.signals.pop_front();
                    }
                }
                _ => {}
            }
        }
        if !healthy {
            return;
        }
        while self.next_match < self.ops.next_id() {
            if !self.match_next() {
                break;
            }
        }
        self.retire();
    }

    /// Reads the current slot's entries if they are all there.
    fn read_slot(&mut self) -> bool {
        if !self.entries.is_empty() {
            return true;
        }
        let base = (self.slot as usize % NET_MAX_REQUESTS) * MAX_RECVS;
        let seq = (self.slot + 1) as u32;
        let Some(first) = self.link.area.entry(base, seq) else {
            return false;
        };
        let nreqs = first.nreqs as usize;
        if !(1..=MAX_RECVS).contains(&nreqs) {
            self.link.fail_with(
                "receiving a FIFO entry from",
                io::ErrorKind::InvalidData,
                format!("a receive of {nreqs} buffers"),
            );
            return false;
        }
        let mut entries = Vec::with_capacity(nreqs);
        for r in 0..nreqs {
            match self.link.area.entry(base + r, seq) {
                Some(entry) => entries.push((entry, None)),
                None => return false,
            }
        }
        self.entries = entries;
        true
    }

    /// Matches the next send to an entry of the current slot and posts
    /// its data; signals the slot once every entry has its send. `false`
    /// when nothing more can move now.
    fn match_next(&mut self) -> bool {
        if self.link.broken().is_some() || !self.read_slot() {
            return false;
        }
        let id = self.next_match;
        let (size, tag) = {
            let op = self.ops.get_mut(id);
            (op.size, op.tag)
        };
        let Some(r) = self
            .entries
            .iter()
            .position(|(entry, send)| send.is_none() && entry.tag == tag)
        else {
            // No buffer of the slot has this tag: the receiver fails.
            self.next_match += 1;
            let slot = self.slot;
            let op = self.ops.get_mut(id);
            op.posted = true;
            op.slot = Some(slot);
            op.left = 1;
            let sizes = vec![SIZE_BAD_TAG | u64::from(tag as u32); self.entries.len()];
            return self.signal(&sizes);
        };
        self.entries[r].1 = Some(size);
        self.next_match += 1;
        let entry = self.entries[r].0;
        let nqps = self.link.qps.len();
        // The slot's signal, then each data write.
        let mut left = 1;
        if size as u64 <= entry.size && size > 0 {
            let op = self.ops.get_mut(id);
            let (data, lkey) = (op.data, op.lkey);
            let chunk = size.div_ceil(nqps).next_multiple_of(128);
            for qp in 0..nqps {
                let start = qp * chunk;
                if start >= size {
                    break;
                }
                let len = chunk.min(size - start);
                let wr = SendWr {
                    wr_id: WR_DATA | id,
                    sge: Some(Sge {
                        addr: data + start as u64,
                        len: len as u32,
                        lkey,
                    }),
                    op: SendOp::Write {
                        remote_addr: entry.addr + start as u64,
                        rkey: entry.rkey,
                        imm: None,
                    },
                    signaled: true,
                    inline: false,
                };
                if !self.link.post_send(qp, &[wr], "sending to") {
                    return false;
                }
                left += 1;
            }
        }
        let slot = self.slot;
        let op = self.ops.get_mut(id);
        op.posted = true;
        op.slot = Some(slot);
        op.left = left;
        if self.entries.iter().all(|(_, send)| send.is_some()) {
            let sizes: Vec<u64> = self
                .entries
                .iter()
                .map(|(entry, send)| {
                    let size = send.expect("all matched") as u64;
                    if size > entry.size {
                        SIZE_TRUNCATED | size
                    } else {
                        size
                    }
                })
                .collect();
            return self.signal(&sizes);
        }
        true
    }

    /// Writes the slot's sizes into the peer's size area and signals the
    /// slot on every queue pair; moves to the next slot.
    fn signal(&mut self, sizes: &[u64]) -> bool {
        let slot = self.slot;
        let at = self.sizes_addr + ((slot as usize % NET_MAX_REQUESTS) * MAX_RECVS * 8) as u64;
        let bytes: Vec<u8> = sizes.iter().flat_map(|s| s.to_ne_bytes()).collect();
        let sizes_wr = SendWr {
            wr_id: WR_SIGNAL | slot,
            sge: Some(Sge {
                addr: bytes.as_ptr() as u64,
                len: bytes.len() as u32,
                lkey: 0,
            }),
            op: SendOp::Write {
                remote_addr: at,
                rkey: self.sizes_rkey,
                imm: None,
            },
            signaled: false,
            inline: true,
        };
        let nqps = self.link.qps.len();
        for qp in 0..nqps {
            let signal = SendWr {
                wr_id: WR_SIGNAL | slot,
                sge: None,
                op: SendOp::Write {
                    remote_addr: at,
                    rkey: self.sizes_rkey,
                    imm: Some(slot as u32),
                },
                signaled: true,
                inline: false,
            };
            let wrs: &[SendWr] = if qp == 0 {
                &[sizes_wr, signal]
            } else {
                &[signal]
            };
            if !self.link.post_send(qp, wrs, "sending to") {
                return false;
            }
        }
        self.signals.push_back((slot, nqps));
        self.slot += 1;
        self.entries.clear();
        true
    }
}

impl RecvState {
    fn retire(&mut self) {
        self.groups.retire(|group| group.state == OpState::Spent);
    }

    fn progress(&mut self) {
        let mut wcs = Vec::new();
        // A failed link still hands over what completed before it failed;
        // the rest fails at `test`.
        self.link.poll("receiving from", &mut wcs);
        for wc in wcs {
            if wc.opcode != WcOpcode::RecvRdmaWithImm {
                continue;
            }
            let id = wc.wr_id & !WR_KIND;
            let group = self.groups.get_mut(id);
            group.left -= 1;
            if group.left > 0 {
                continue;
            }
            let base = (id as usize % NET_MAX_REQUESTS) * MAX_RECVS;
            let mut error = None;
            for (r, &(cap, _)) in group.bufs.iter().enumerate() {
                let word = self.link.area.size(base + r);
                if word & SIZE_TRUNCATED != 0 {
                    error = Some(NetError::Truncated {
                        peer: self.link.peer.clone(),
                        sent: word & !SIZE_TRUNCATED,
                        posted: cap,
                    });
                } else if word & SIZE_BAD_TAG != 0 {
                    error = Some(NetError::UnexpectedTag {
                        peer: self.link.peer.clone(),
                        tag: word as u32 as i32,
                    });
                } else {
                    group.sizes.push(word as usize);
                }
                if error.is_some() {
                    break;
                }
            }
            match error {
                Some(err) => {
                    self.link.fail(err);
                    return;
                }
                None => group.state.finish(),
            }
        }
        self.retire();
    }
}

/// Closes a communicator: its queue pairs go (the peer's fail), and so
/// does the TCP connection (the peer sees it close).
fn close(link: &mut Link) {
    link.closed = true;
    // The TCP connection first: the peer learns that this side closed
    // before its queue pairs see theirs go.
    link.control = None;
    link.qps.clear();
}

impl Ib {
    fn connect_step(&self, dev: usize, stage: &mut IbConnect) -> Result<Option<IbSend>, NetError> {
        loop {
            match stage.step.as_mut().expect("a connect in progress") {
                ConnectStep::Handshake(client, addr) => {
                    let addr = *addr;
                    match client.progress(&self.secret) {
                        Ok(false) => return Ok(None),
                        Ok(true) => {}
                        Err(e) => {
                            return Err(
                                if matches!(
                                    e.kind(),
                                    io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidData
                                ) {
                                    NetError::Refused {
                                        peer: addr.to_string(),
                                        reason: e.to_string(),
                                    }
                                } else {
                                    NetError::io(NET, "connecting to", addr, &e)
                                },
                            )
                        }
                    }
                    let Some(ConnectStep::Handshake(client, _)) = stage.step.take() else {
                        unreachable!("in the handshake")
                    };
                    let mut link =
                        self.resources(dev, self.config.qps_per_connection, Area::fifo())?;
                    link.peer = addr.to_string();
                    let ours = Partial::to_write(Info::of(&link).encode());
                    stage.step = Some(ConnectStep::Details {
                        stream: client.into_stream(),
                        peer: addr,
                        link: Box::new(link),
                        ours,
                        theirs: Partial::to_read(INFO_LEN),
                        ready: None,
                        sizes: (0, 0),
                    });
                }
                ConnectStep::Details {
                    stream,
                    peer,
                    link,
                    ours,
                    theirs,
                    ready,
                    sizes,
                } => {
                    let peer = *peer;
                    let io_err = |e: io::Error| NetError::io(NET, "connecting to", peer, &e);
                    if !ours.write(stream).map_err(io_err)? {
                        return Ok(None);
                    }
                    if ready.is_none() {
                        if !theirs.read(stream).map_err(io_err)? {
                            return Ok(None);
                        }
                        let info =
                            Info::decode(&theirs.bytes).map_err(|why| NetError::Refused {
                                peer: peer.to_string(),
                                reason: why,
                            })?;
                        if info.qps.len() != link.qps.len() {
                            return Err(NetError::Refused {
                                peer: peer.to_string(),
                                reason: format!(
                                    "it set up {} queue pairs for our {}",
                                    info.qps.len(),
                                    link.qps.len()
                                ),
                            });
                        }
                        link.connect(&info)
                            .map_err(|e| verbs_error("connecting to", &peer.to_string(), &e))?;
                        *sizes = (info.addr, info.rkey);
                        *ready = Some(Partial::to_write(vec![1]));
                    }
                    if !ready.as_mut().expect("set").write(stream).map_err(io_err)? {
                        return Ok(None);
                    }
                    let Some(ConnectStep::Details {
                        stream,
                        mut link,
                        sizes,
                        ..
                    }) = stage.step.take()
                    else {
                        unreachable!("in the exchange")
                    };
                    link.control = Some(stream);
                    return Ok(Some(IbSend {
                        peer: peer.to_string(),
                        state: Arc::new(Mutex::new(SendState {
                            link: *link,
                            sizes_addr: sizes.0,
                            sizes_rkey: sizes.1,
                            ops: Posted::new(),
                            next_match: 0,
                            slot: 0,
                            entries: Vec::new(),
                            signals: VecDeque::new(),
                        })),
                    }));
                }
            }
        }
    }

    /// Moves one accepted connection along: the receiving communicator
    /// once it is set up; `Err` with why it was dropped.
    fn accept_step(
        &self,
        dev: usize,
        id: &[u8; LISTENER_ID],
        accepting: &mut Accepting,
    ) -> Result<Option<IbRecv>, String> {
        loop {
            let step = std::mem::replace(&mut accepting.step, AcceptStep::Failed);
            accepting.step = match step {
                AcceptStep::Handshake(mut server) => match server.progress(&self.secret, id) {
                    Ok(false) => {
                        accepting.step = AcceptStep::Handshake(server);
                        return Ok(None);
                    }
                    Ok(true) => AcceptStep::Details {
                        stream: server.into_stream(),
                        theirs: Partial::to_read(INFO_LEN),
                    },
                    Err(e) => return Err(format!("the handshake failed: {e}")),
                },
                AcceptStep::Details { stream, mut theirs } => {
                    if !theirs.read(&stream).map_err(|e| e.to_string())? {
                        accepting.step = AcceptStep::Details { stream, theirs };
                        return Ok(None);
                    }
                    let info = Info::decode(&theirs.bytes)?;
                    let mut link = self
                        .resources(dev, info.qps.len(), Area::sizes())
                        .map_err(|e| e.to_string())?;
                    link.peer = accepting.peer.to_string();
                    link.connect(&info).map_err(|e| e.to_string())?;
                    AcceptStep::Answer {
                        stream,
                        ours: Partial::to_write(Info::of(&link).encode()),
                        link: Box::new(link),
                        fifo: (info.addr, info.rkey),
                        ready: Partial::to_read(1),
                    }
                }
                AcceptStep::Answer {
                    stream,
                    mut link,
                    fifo,
                    mut ours,
                    mut ready,
                } => {
                    let done = ours.write(&stream).map_err(|e| e.to_string())?
                        && ready.read(&stream).map_err(|e| e.to_string())?;
                    if !done {
                        accepting.step = AcceptStep::Answer {
                            stream,
                            link,
                            fifo,
                            ours,
                            ready,
                        };
                        return Ok(None);
                    }
                    link.control = Some(stream);
                    let peer = link.peer.clone();
                    return Ok(Some(IbRecv {
                        peer,
                        state: Arc::new(Mutex::new(RecvState {
                            link: *link,
                            fifo_addr: fifo.0,
                            fifo_rkey: fifo.1,
                            groups: Posted::new(),
                            max_recvs: MAX_RECVS,
                        })),
                    }));
                }
                AcceptStep::Failed => return Err("a failed connection".into()),
            };
        }
    }
}

#[cfg(test)]
mod tests;
