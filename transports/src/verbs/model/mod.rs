//! A model of reliable-connected verbs, for machines without an RDMA
//! device (`RCCL_IB_MODEL=1`): the IB provider's logic runs against it in
//! CI.
//!
//! One NIC per process and address, with one port whose link is TCP: a
//! queue pair in RTR connects a stream to the NIC its peer's GID names (the
//! model's GIDs carry the NIC's address and port), so queue pairs of two
//! processes, or of two hosts in different network namespaces, talk as
//! over a fabric. A thread per NIC plays the hardware: it sends each work
//! request as one frame with a packet sequence number, acknowledges what
//! it receives, and retransmits.
//!
//! What it keeps of the verbs' semantics:
//! - **In order.** A queue pair's work requests land in posting order;
//!   a lost or refused frame is sent again with every frame after it
//!   (go-back-N), and duplicates are acknowledged and dropped. Packet
//!   sequence numbers are 24 bits and wrap, as on the wire.
//! - **Write with immediate** consumes a receive posted at the peer and
//!   completes it with the immediate data; with none posted the peer
//!   answers receiver-not-ready and the sender retries after a while, up
//!   to `rnr_retry` times (7: without end), then fails with
//!   `IBV_WC_RNR_RETRY_EXC_ERR`.
//! - **Keys and bounds.** A write outside a region registered for remote
//!   writes under its key fails with `IBV_WC_REM_ACCESS_ERR` at the sender
//!   and puts the receiver's queue pair in error; a local buffer outside
//!   its region fails with `IBV_WC_LOC_PROT_ERR`.
//! - **Timeouts.** A frame not acknowledged within 4.096 us x 2^timeout is
//!   sent again, `retry_cnt` times, then fails with
//!   `IBV_WC_RETRY_EXC_ERR`.
//! - **Errors flush.** A queue pair in error completes every outstanding
//!   and later work request with `IBV_WC_WR_FLUSH_ERR`.
//! - **Completion queues overflow.** A completion that finds its queue
//!   full is lost; the queue fails every later poll and its queue pairs
//!   report `IBV_EVENT_CQ_ERR`.
//! - **The link is point to point.** A stream that ends (the peer's
//!   process died, its queue pair was destroyed, or its port went down)
//!   is a fatal event on the queue pairs that used it.
//!
//! Faults are injected through [`Model::inject`] or, for a whole process,
//! `RCCL_IB_MODEL_FAULT` (`drop:N`, `corrupt:N`, `stall:N:MS`: after `N`
//! data frames sent): the port goes down, the next write carries a wrong
//! key, or the NIC stops for `MS` milliseconds.
//!
//! `RCCL_IB_MODEL_GDR=1` makes the NIC register device memory, as one
//! with `nvidia-peermem` does, and dma-bufs, which it maps itself:
//! GPUDirect RDMA over the emulated GPU, whose device memory the model
//! reaches as host memory and whose shareable memory is a file.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{
    CompletionQueue, Device, DeviceInfo, GidEntry, LinkLayer, MemoryRegion, PathSettings, PortInfo,
    QpCaps, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, Verbs, VerbsError, Wc, WcOpcode, WcStatus,
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE,
};
use crate::tcp_connect::start_connect;
use wire::{
    Frame, Wire, ACK, FRAME_HEADER, HAS_IMM, HELLO, MAX_FRAME_PAYLOAD, NAK, NAK_ACCESS,
    NAK_INVALID, NAK_RNR, SEND, WRITE,
};

mod cq;
mod device;
mod nic;
mod qp;
mod region;
#[cfg(test)]
mod tests;
mod transfer;
mod wire;

use cq::{complete, CqState, ModelCq};
use device::ModelDevice;
use nic::{Nic, NicState};
use qp::{flush, send_opcode, Outstanding, Qp, QpState};
use region::{map_dmabuf, register, Region};

/// The model's device name, as `NCCL_IB_HCA` selects it.
pub const DEVICE_NAME: &str = "rccl_model0";
/// The fault a process's NICs start with.
pub const FAULT_ENV: &str = "RCCL_IB_MODEL_FAULT";
/// Set (and not `0`): the model's NIC registers device memory, as a NIC
/// with `nvidia-peermem` does, and dma-bufs (GPUDirect RDMA).
pub const GPU_DIRECT_ENV: &str = "RCCL_IB_MODEL_GDR";

fn gpu_direct() -> bool {
    rccl_env::var(GPU_DIRECT_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Bytes queued on a stream before the NIC stops taking work requests.
const WIRE_QUEUE: usize = 4 << 20;
/// How long a sender waits after receiver-not-ready (the minimum RNR
/// timer NCCL sets, rounded up).
const RNR_DELAY: Duration = Duration::from_millis(1);
/// Longest the NIC thread sleeps without a reason to wake.
const IDLE: Duration = Duration::from_millis(200);
/// Model port speed: 100 Gbps.
const SPEED_MBPS: u32 = 100_000;

/// Packet sequence numbers are 24 bits.
const PSN_MASK: u32 = 0xff_ffff;

/// The sequence number after `psn`.
fn psn_after(psn: u32) -> u32 {
    psn.wrapping_add(1) & PSN_MASK
}

/// How far `psn` lies after `base` in the 24-bit sequence space
/// (negative: before it), so that comparisons hold across the wrap.
fn psn_distance(psn: u32, base: u32) -> i32 {
    ((psn.wrapping_sub(base) << 8) as i32) >> 8
}

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The port goes down: nothing more is sent or received, and every
    /// stream ends (its peers see the link go down).
    DropLink,
    /// The next RDMA write carries a wrong remote key.
    CorruptKey,
    /// The NIC neither sends nor receives for this long.
    Stall(Duration),
}

impl Fault {
    /// `drop:N`, `corrupt:N`, `stall:N:MS`: the fault and after how many
    /// data frames.
    pub fn parse(text: &str) -> Result<(Fault, u64), String> {
        let bad = || format!("{FAULT_ENV}={text}: expected drop:N, corrupt:N or stall:N:MS");
        let mut parts = text.trim().split(':');
        let kind = parts.next().ok_or_else(bad)?;
        let after: u64 = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let fault = match kind {
            "drop" => Fault::DropLink,
            "corrupt" => Fault::CorruptKey,
            "stall" => {
                let ms: u64 = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
                Fault::Stall(Duration::from_millis(ms))
            }
            _ => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok((fault, after))
    }
}

/// The model: one device whose NIC is this process's for `ip`.
pub struct Model {
    nic: Arc<Nic>,
    devices: Vec<DeviceInfo>,
}

impl Model {
    /// The model's device on `ip` (the NIC is made on first use, one per
    /// process and address, and lives as long as the process).
    pub fn new(ip: Ipv4Addr) -> io::Result<Model> {
        static NICS: Mutex<Vec<Arc<Nic>>> = Mutex::new(Vec::new());
        let mut nics = NICS.lock();
        let nic = match nics.iter().find(|nic| *nic.addr.ip() == ip) {
            Some(nic) => nic.clone(),
            None => {
                let nic = Nic::start(ip)?;
                nics.push(nic.clone());
                nic
            }
        };
        let devices = vec![nic.device_info()];
        Ok(Model { nic, devices })
    }

    /// Injects `fault` after this NIC has sent `after` more data frames.
    pub fn inject(&self, fault: Fault, after: u64) {
        let mut state = self.nic.state.lock();
        let at = state.frames_sent + after;
        state.faults.push((fault, at));
        drop(state);
        self.nic.ring();
    }

    /// Data frames this NIC has sent (each work request once).
    pub fn frames_sent(&self) -> u64 {
        self.nic.state.lock().frames_sent
    }
}

impl Verbs for Model {
    fn name(&self) -> &'static str {
        "model"
    }

    fn registers_device_memory(&self) -> bool {
        // The model reaches what the process reaches: the emulated GPU's
        // device memory is host memory.
        gpu_direct()
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn open(&self, dev: usize) -> Result<Arc<dyn Device>, VerbsError> {
        if dev != 0 {
            return Err(VerbsError::new(
                "ibv_open_device",
                format!("no device {dev}"),
            ));
        }
        Ok(Arc::new(ModelDevice {
            nic: self.nic.clone(),
        }))
    }
}

/// Where a GID of the model points: the NIC's stream address.
fn route(gid: &[u8; 16]) -> Option<SocketAddrV4> {
    let entry = GidEntry {
        index: 0,
        gid: *gid,
        roce_version: None,
    };
    if gid[..2] == [0xfe, 0x80] {
        let ip = Ipv4Addr::new(gid[8], gid[9], gid[10], gid[11]);
        let port = u16::from_be_bytes([gid[12], gid[13]]);
        Some(SocketAddrV4::new(ip, port))
    } else if entry.is_ipv4() {
        let ip = Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]);
        let port = u16::from_be_bytes([gid[8], gid[9]]);
        Some(SocketAddrV4::new(ip, port))
    } else {
        None
    }
}

/// The GID table of a NIC at `addr`, laid out as on a RoCE port: link
/// local (v1, v2), then IPv4-mapped (v1, v2).
fn gid_table(addr: SocketAddrV4) -> Vec<GidEntry> {
    let ip = addr.ip().octets();
    let port = addr.port().to_be_bytes();
    let mut local = [0u8; 16];
    local[..2].copy_from_slice(&[0xfe, 0x80]);
    local[8..12].copy_from_slice(&ip);
    local[12..14].copy_from_slice(&port);
    let mut mapped = [0u8; 16];
    mapped[8..10].copy_from_slice(&port);
    mapped[10..12].copy_from_slice(&[0xff, 0xff]);
    mapped[12..].copy_from_slice(&ip);
    [(local, 1), (local, 2), (mapped, 1), (mapped, 2)]
        .into_iter()
        .enumerate()
        .map(|(index, (gid, version))| GidEntry {
            index: index as u8,
            gid,
            roce_version: Some(version),
        })
        .collect()
}
