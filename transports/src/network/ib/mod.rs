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
//! the provider over the verbs model ([`crate::verbs::Model`]) instead of libibverbs.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::checks::{check_recv, nothing_to_flush, Registration};
use super::handshake::{Client, Partial, Server, LISTENER_ID};
use super::requests::{Kind, OpState, Posted, Request, Side};
use super::socket::{handle_bytes, parse_handle};
use super::{
    CommRef, Endpoint, ListenHandle, MemoryType, Net, NetError, Properties, PtrSupport, Readiness,
    RecvBuffer, Sizes, MAX_RECVS, NET_MAX_REQUESTS,
};
use crate::auth_tcp::{fill_random, Secret, DEFAULT_HANDSHAKE_TIMEOUT};
use crate::verbs::{libibverbs::Libibverbs, Model, VerbsError};
use crate::verbs::{
    CompletionQueue, Device, GidEntry, LinkLayer, MemoryRegion, PathSettings, PortInfo, QpCaps,
    QueuePair, RecvWr, RemoteQp, SendOp, SendWr, Sge, Verbs, Wc, WcOpcode, WcStatus,
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE,
};

mod config;
mod link;
mod net;
mod setup;
mod transfer;

pub use config::{choose_gid, HcaFilter, IbConfig};
pub use setup::{IbConnect, IbListen};
pub use transfer::{IbMr, IbRecv, IbRequest, IbSend};

use link::{close, Area, CtsEntry, Info, Link, CTS_BYTES};
use setup::{AcceptStep, Accepting, ConnectStep};
use transfer::{RecvGroup, RecvState, SendOpState, SendState};

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
                Arc::new(Model::new(v4).map_err(|e| format!("the verbs model on {ip}: {e}"))?)
            }
            _ => {
                // Loaded and listed once per process, as NCCL does.
                static LIBIBVERBS: OnceLock<Result<Arc<Libibverbs>, String>> = OnceLock::new();
                LIBIBVERBS
                    .get_or_init(|| Libibverbs::open().map(Arc::new))
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

fn verbs_error(doing: &'static str, device: &str, e: &VerbsError) -> NetError {
    NetError::Io {
        net: NET,
        doing,
        peer: device.to_string(),
        kind: io::ErrorKind::Other,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests;
