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

use super::verbs::{
    CompletionQueue, Device, DeviceInfo, GidEntry, LinkLayer, MemoryRegion, PathSettings, PortInfo,
    QpCaps, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, Verbs, VerbsError, Wc, WcOpcode, WcStatus,
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE,
};
use crate::network::handshake::start_connect;
use wire::{
    Frame, Wire, ACK, FRAME_HEADER, HAS_IMM, HELLO, MAX_FRAME_PAYLOAD, NAK, NAK_ACCESS,
    NAK_INVALID, NAK_RNR, SEND, WRITE,
};

mod region;
mod wire;

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

/// A completion queue of the model.
struct ModelCq {
    state: Arc<Mutex<CqState>>,
}

struct CqState {
    entries: VecDeque<Wc>,
    depth: usize,
    overflowed: bool,
    /// Written at every completion: the queue's event.
    event: OwnedFd,
}

impl CqState {
    /// Adds `wc`: `false` if the queue was full (it overflowed).
    fn push(&mut self, wc: Wc) -> bool {
        if self.overflowed || self.entries.len() >= self.depth {
            self.overflowed = true;
            return false;
        }
        self.entries.push_back(wc);
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; a
        // full counter already means "readable".
        unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
        true
    }
}

impl CompletionQueue for ModelCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn poll(&self, wcs: &mut [Wc]) -> Result<usize, VerbsError> {
        let mut state = self.state.lock();
        if state.overflowed {
            return Err(VerbsError::new(
                "ibv_poll_cq",
                format!("the completion queue of {} entries overflowed", state.depth),
            ));
        }
        let n = wcs.len().min(state.entries.len());
        for (slot, wc) in wcs.iter_mut().zip(state.entries.drain(..n)) {
            *slot = wc;
        }
        Ok(n)
    }

    fn event_fd(&self) -> RawFd {
        self.state.lock().event.as_raw_fd()
    }

    fn arm(&self) -> Result<(), VerbsError> {
        let state = self.state.lock();
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64 from a
        // non-blocking eventfd we own.
        unsafe { libc::read(state.event.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        Ok(())
    }
}

fn complete(cq: &Mutex<CqState>, wc: Wc) {
    if !cq.lock().push(wc) {
        tracing::debug!(qpn = wc.qp_num, "model: a completion found its queue full");
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Error,
}

/// A send work request in the model's hands.
struct Outstanding {
    wr: SendWr,
    psn: u32,
    /// The bytes, copied at posting (inline) or at first sending.
    payload: Option<Vec<u8>>,
    sent_at: Option<Instant>,
    /// Sent at least once (later sends are retransmissions).
    sent_once: bool,
}

struct Qp {
    state: QpState,
    cq: Arc<Mutex<CqState>>,
    caps: QpCaps,
    path: Option<PathSettings>,
    /// Sent, not acknowledged, in order.
    unacked: VecDeque<Outstanding>,
    /// Posted, not sent yet (or to send again), in order.
    queued: VecDeque<Outstanding>,
    recvs: VecDeque<RecvWr>,
    next_psn: u32,
    expect_psn: u32,
    retries_left: u8,
    rnr_left: u8,
    resend_at: Option<Instant>,
    /// The stream this queue pair sends on.
    wire: Option<usize>,
    fatal: Option<String>,
}

impl Qp {
    fn complete(&self, wc: Wc) {
        complete(&self.cq, wc);
    }

    /// Puts the queue pair in error and flushes every work request.
    fn enter_error(&mut self, qpn: u32) {
        self.state = QpState::Error;
        let flushed: Vec<_> = self
            .unacked
            .drain(..)
            .chain(self.queued.drain(..))
            .collect();
        for out in flushed {
            self.complete(flush(out.wr.wr_id, send_opcode(&out.wr), qpn));
        }
        for recv in std::mem::take(&mut self.recvs) {
            self.complete(flush(recv.wr_id, WcOpcode::Recv, qpn));
        }
    }

    /// Fails the oldest unacknowledged request with `status`, then the
    /// queue pair.
    fn fail(&mut self, qpn: u32, status: WcStatus) {
        if let Some(out) = self.unacked.pop_front().or_else(|| self.queued.pop_front()) {
            self.complete(Wc {
                wr_id: out.wr.wr_id,
                status,
                opcode: send_opcode(&out.wr),
                byte_len: 0,
                imm: None,
                qp_num: qpn,
            });
        }
        self.enter_error(qpn);
    }

    /// Acknowledges everything up to `psn`.
    fn acknowledge(&mut self, qpn: u32, psn: u32) {
        while self
            .unacked
            .front()
            .is_some_and(|out| psn_distance(psn, out.psn) >= 0)
        {
            let out = self.unacked.pop_front().expect("just seen");
            if out.wr.signaled {
                self.complete(Wc {
                    wr_id: out.wr.wr_id,
                    status: WcStatus::Success,
                    opcode: send_opcode(&out.wr),
                    byte_len: out.wr.sge.map_or(0, |sge| sge.len),
                    imm: None,
                    qp_num: qpn,
                });
            }
            if let Some(path) = &self.path {
                self.retries_left = path.retry_cnt;
                self.rnr_left = path.rnr_retry;
            }
        }
    }

    /// Sends every unacknowledged frame again, from the first.
    fn go_back(&mut self) {
        while let Some(mut out) = self.unacked.pop_back() {
            out.sent_at = None;
            self.queued.push_front(out);
        }
    }
}

fn send_opcode(wr: &SendWr) -> WcOpcode {
    match wr.op {
        SendOp::Write { .. } => WcOpcode::RdmaWrite,
        SendOp::Send => WcOpcode::Send,
    }
}

fn flush(wr_id: u64, opcode: WcOpcode, qpn: u32) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::Flush,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num: qpn,
    }
}

struct NicState {
    qps: HashMap<u32, Qp>,
    regions: HashMap<u32, Region>,
    wires: Vec<Option<Wire>>,
    next_qpn: u32,
    next_key: u32,
    frames_sent: u64,
    faults: Vec<(Fault, u64)>,
    corrupt_next: bool,
    stall_until: Option<Instant>,
    port_error: Option<String>,
    /// The receive completion of the frame being answered, delivered once
    /// its acknowledgement is on the wire: as on hardware, a responder
    /// that sees the data (and whose process then ends) cannot leave the
    /// sender without its acknowledgement.
    arrived: Option<(Arc<Mutex<CqState>>, Wc)>,
}

/// The NIC: its stream listener, its state, and the thread that plays the
/// hardware.
struct Nic {
    addr: SocketAddrV4,
    listener: TcpListener,
    bell: OwnedFd,
    state: Mutex<NicState>,
}

impl Nic {
    fn start(ip: Ipv4Addr) -> io::Result<Arc<Nic>> {
        let listener = TcpListener::bind(SocketAddrV4::new(ip, 0))?;
        listener.set_nonblocking(true)?;
        let SocketAddr::V4(addr) = listener.local_addr()? else {
            unreachable!("bound to an IPv4 address")
        };
        // SAFETY: plain eventfd(2) call; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut faults = Vec::new();
        if let Some(text) = rccl_env::var(FAULT_ENV) {
            let fault = Fault::parse(&text)
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
            faults.push(fault);
        }
        let nic = Arc::new(Nic {
            addr,
            listener,
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            bell: unsafe { OwnedFd::from_raw_fd(fd) },
            state: Mutex::new(NicState {
                qps: HashMap::new(),
                regions: HashMap::new(),
                wires: Vec::new(),
                next_qpn: 0x100 | (addr.port() as u32) << 12,
                next_key: 0x1000 + addr.port() as u32,
                frames_sent: 0,
                faults,
                corrupt_next: false,
                stall_until: None,
                port_error: None,
                arrived: None,
            }),
        });
        let thread_nic = nic.clone();
        std::thread::Builder::new()
            .name("rccl-ib-model".into())
            .spawn(move || thread_nic.run())?;
        Ok(nic)
    }

    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            name: DEVICE_NAME.into(),
            guid: u64::from(u32::from(*self.addr.ip())) << 16 | u64::from(self.addr.port()),
            pci_path: None,
            ports: vec![PortInfo {
                port: 1,
                active: true,
                link_layer: LinkLayer::Ethernet,
                lid: 0,
                mtu: 5,
                speed_mbps: SPEED_MBPS,
                gids: gid_table(self.addr),
            }],
        }
    }

    fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; a
        // full counter already means "woken".
        unsafe { libc::write(self.bell.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn run(self: Arc<Nic>) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut map: Vec<usize> = Vec::new();
        loop {
            let wake = {
                let mut state = self.state.lock();
                self.step(&mut state);
                fds.clear();
                map.clear();
                for fd in [self.bell.as_raw_fd(), self.listener.as_raw_fd()] {
                    fds.push(libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
                let stalled = state.stall_until.is_some();
                for (i, wire) in state.wires.iter().enumerate() {
                    let Some(wire) = wire else { continue };
                    let mut events = if stalled { 0 } else { libc::POLLIN };
                    if wire.pending_out() > 0 {
                        events |= libc::POLLOUT;
                    }
                    fds.push(libc::pollfd {
                        fd: wire.stream.as_raw_fd(),
                        events,
                        revents: 0,
                    });
                    map.push(i);
                }
                state.next_deadline()
            };
            let timeout = wake
                .map(|at| at.saturating_duration_since(Instant::now()))
                .unwrap_or(IDLE)
                .min(IDLE);
            // SAFETY: `fds` holds `fds.len()` initialised pollfds and
            // lives across the call; errors (EINTR) end the sleep.
            unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    timeout.as_millis().max(1) as libc::c_int,
                )
            };
            if fds[0].revents != 0 {
                let mut count = 0u64;
                // SAFETY: reads at most 8 bytes into a live u64 from a
                // non-blocking eventfd we own.
                unsafe { libc::read(self.bell.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            }
        }
    }

    /// One pass: accept streams, read and handle frames, run timers, send.
    fn step(&self, state: &mut NicState) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if stream.set_nonblocking(true).is_ok() {
                        let _ = stream.set_nodelay(true);
                        state.add_wire(Wire {
                            stream,
                            qpn: None,
                            outgoing: false,
                            peer: peer.to_string(),
                            out: Vec::new(),
                            out_at: 0,
                            inbuf: Vec::new(),
                            closed: false,
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let now = Instant::now();
        if state.stall_until.is_some_and(|until| now < until) {
            return;
        }
        state.stall_until = None;
        for i in 0..state.wires.len() {
            let Some(wire) = state.wires[i].as_mut() else {
                continue;
            };
            if !wire.fill() {
                wire.closed = true;
            }
            let mut inbuf = std::mem::take(&mut wire.inbuf);
            let mut at = 0;
            while inbuf.len() - at >= FRAME_HEADER {
                let frame = Frame::decode(&inbuf[at..]);
                let payload_len = match frame.kind {
                    WRITE | SEND if frame.len <= MAX_FRAME_PAYLOAD => frame.len as usize,
                    WRITE | SEND => {
                        state.wire_mut(i).closed = true;
                        break;
                    }
                    _ => 0,
                };
                if inbuf.len() - at < FRAME_HEADER + payload_len {
                    break;
                }
                let payload = &inbuf[at + FRAME_HEADER..at + FRAME_HEADER + payload_len];
                if state.port_error.is_none() {
                    state.handle(i, &frame, payload);
                }
                at += FRAME_HEADER + payload_len;
                if state.stall_until.is_some() {
                    break;
                }
            }
            inbuf.drain(..at);
            if let Some(wire) = state.wires[i].as_mut() {
                wire.inbuf = inbuf;
            }
        }
        state.run_timers(now);
        state.transmit(now);
        for i in 0..state.wires.len() {
            let Some(wire) = state.wires[i].as_mut() else {
                continue;
            };
            if !wire.flush() {
                wire.closed = true;
            }
            if wire.closed {
                let wire = state.wires[i].take().expect("just seen");
                state.link_lost(&wire);
            }
        }
    }
}

impl NicState {
    fn add_wire(&mut self, wire: Wire) -> usize {
        if let Some(free) = self.wires.iter().position(Option::is_none) {
            self.wires[free] = Some(wire);
            free
        } else {
            self.wires.push(Some(wire));
            self.wires.len() - 1
        }
    }

    fn wire_mut(&mut self, i: usize) -> &mut Wire {
        self.wires[i].as_mut().expect("a live wire")
    }

    /// When a timer next needs the NIC.
    fn next_deadline(&self) -> Option<Instant> {
        let mut next = self.stall_until;
        let mut consider = |at: Instant| next = Some(next.map_or(at, |n: Instant| n.min(at)));
        for qp in self.qps.values() {
            if let Some(at) = qp.resend_at {
                consider(at);
            }
            if let (Some(out), Some(path)) = (qp.unacked.front(), &qp.path) {
                if let (Some(sent), Some(timeout)) = (out.sent_at, ack_timeout(path.timeout)) {
                    consider(sent + timeout);
                }
            }
        }
        next
    }

    /// The stream of queue pair `qpn` ended: a fatal event on it.
    fn link_lost(&mut self, wire: &Wire) {
        let Some(qpn) = wire.qpn else { return };
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if qp.fatal.is_none() {
            qp.fatal = Some(format!(
                "the link to {} went down (IBV_EVENT_QP_FATAL on QP {qpn:#x})",
                wire.peer
            ));
        }
        // With this NIC's own port down, its requests time out as on a
        // fabric; the far end sees its link go at once.
        if qp.state != QpState::Error && self.port_error.is_none() {
            qp.enter_error(qpn);
        }
        if qp
            .wire
            .is_some_and(|w| self.wires.get(w).is_none_or(Option::is_none))
        {
            qp.wire = None;
        }
    }

    /// Answers `frame` on wire `i` with an ACK or NAK.
    fn answer(&mut self, i: usize, kind: u8, psn: u32, reason: u8) {
        let header = Frame {
            kind,
            psn,
            reason,
            ..Frame::default()
        }
        .encode();
        self.wire_mut(i).queue(&header, &[]);
    }

    fn handle(&mut self, i: usize, frame: &Frame, payload: &[u8]) {
        let wire = self.wire_mut(i);
        match frame.kind {
            HELLO if !wire.outgoing => wire.qpn = Some(frame.qpn),
            ACK | NAK if wire.outgoing => {
                let Some(qpn) = wire.qpn else { return };
                self.requester_answer(qpn, frame);
            }
            WRITE | SEND if !wire.outgoing => {
                let Some(qpn) = wire.qpn else { return };
                self.respond(i, qpn, frame, payload);
            }
            _ => wire.closed = true,
        }
    }

    /// The responder side: a WRITE or SEND for queue pair `qpn`.
    fn respond(&mut self, i: usize, qpn: u32, frame: &Frame, payload: &[u8]) {
        let regions = &self.regions;
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !matches!(qp.state, QpState::Rtr | QpState::Rts) {
            return;
        }
        if psn_distance(qp.expect_psn, frame.psn) > 0 {
            // A duplicate of something already received.
            let ack = qp.expect_psn.wrapping_sub(1) & PSN_MASK;
            self.answer(i, ACK, ack, 0);
            return;
        }
        if frame.psn != qp.expect_psn {
            return;
        }
        let with_imm = frame.flags & HAS_IMM != 0;
        let (status, nak) = if frame.kind == WRITE {
            let target = regions
                .get(&frame.rkey)
                .filter(|r| frame.len == 0 || r.covers(frame.addr, frame.len, ACCESS_REMOTE_WRITE));
            if target.is_none() && frame.len > 0 {
                (Some(WcStatus::RemoteAccess), NAK_ACCESS)
            } else if with_imm && qp.recvs.is_empty() {
                (None, NAK_RNR)
            } else {
                if let Some(region) = target.filter(|_| frame.len > 0) {
                    // SAFETY: the range lies in a region registered for
                    // remote writes, which its owner keeps valid while
                    // registered (reg_mr's contract).
                    unsafe { write_ordered(region.reach(frame.addr) as *mut u8, payload) };
                }
                if with_imm {
                    let recv = qp.recvs.pop_front().expect("checked");
                    self.arrived = Some((
                        qp.cq.clone(),
                        Wc {
                            wr_id: recv.wr_id,
                            status: WcStatus::Success,
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: frame.len as u32,
                            imm: Some(frame.imm),
                            qp_num: qpn,
                        },
                    ));
                }
                (Some(WcStatus::Success), 0)
            }
        } else {
            match qp.recvs.front().copied() {
                None => (None, NAK_RNR),
                Some(recv) => {
                    let room = recv.sge.and_then(|sge| {
                        let region = regions.get(&sge.lkey).filter(|r| {
                            r.covers(sge.addr, u64::from(sge.len), ACCESS_LOCAL_WRITE)
                        })?;
                        Some((sge, region))
                    });
                    let fits = room.is_some_and(|(sge, _)| frame.len <= u64::from(sge.len))
                        || frame.len == 0;
                    qp.recvs.pop_front();
                    if fits {
                        if let Some((sge, region)) = room {
                            // SAFETY: the receive's buffer lies in a region
                            // registered for local writes (checked above).
                            unsafe { write_ordered(region.reach(sge.addr) as *mut u8, payload) };
                        }
                    }
                    self.arrived = Some((
                        qp.cq.clone(),
                        Wc {
                            wr_id: recv.wr_id,
                            status: if fits {
                                WcStatus::Success
                            } else {
                                WcStatus::LocalLength
                            },
                            opcode: WcOpcode::Recv,
                            byte_len: frame.len as u32,
                            imm: (frame.flags & HAS_IMM != 0).then_some(frame.imm),
                            qp_num: qpn,
                        },
                    ));
                    if fits {
                        (Some(WcStatus::Success), 0)
                    } else {
                        (Some(WcStatus::LocalLength), NAK_INVALID)
                    }
                }
            }
        };
        match status {
            Some(WcStatus::Success) => {
                qp.expect_psn = psn_after(qp.expect_psn);
                self.answer(i, ACK, frame.psn, 0);
                let wire = self.wire_mut(i);
                if !wire.flush() {
                    wire.closed = true;
                }
                self.deliver_arrived();
            }
            None => self.answer(i, NAK, frame.psn, nak),
            Some(_) => {
                // The failed receive's completion comes before the flushed
                // ones.
                self.deliver_arrived();
                let qp = self.qps.get_mut(&qpn).expect("seen above");
                if qp.fatal.is_none() && nak == NAK_ACCESS {
                    qp.fatal = Some(format!(
                        "a remote access violation on QP {qpn:#x} (IBV_EVENT_QP_ACCESS_ERR)"
                    ));
                }
                qp.enter_error(qpn);
                self.answer(i, NAK, frame.psn, nak);
            }
        }
    }

    fn deliver_arrived(&mut self) {
        if let Some((cq, wc)) = self.arrived.take() {
            complete(&cq, wc);
        }
    }

    /// The requester side: an ACK or NAK for queue pair `qpn`.
    fn requester_answer(&mut self, qpn: u32, frame: &Frame) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if qp.state == QpState::Error {
            return;
        }
        if frame.kind == ACK {
            qp.acknowledge(qpn, frame.psn);
            return;
        }
        qp.acknowledge(qpn, frame.psn.wrapping_sub(1) & PSN_MASK);
        if qp.unacked.front().is_none_or(|out| out.psn != frame.psn) {
            return;
        }
        match frame.reason {
            NAK_RNR => {
                let infinite = qp.path.is_some_and(|p| p.rnr_retry == 7);
                if !infinite && qp.rnr_left == 0 {
                    qp.fail(qpn, WcStatus::RnrRetryExceeded);
                    return;
                }
                if !infinite {
                    qp.rnr_left -= 1;
                }
                qp.go_back();
                qp.resend_at = Some(Instant::now() + RNR_DELAY);
            }
            NAK_ACCESS => qp.fail(qpn, WcStatus::RemoteAccess),
            _ => qp.fail(qpn, WcStatus::Other(9)),
        }
    }

    fn run_timers(&mut self, now: Instant) {
        for (&qpn, qp) in self.qps.iter_mut() {
            if qp.state != QpState::Rts {
                continue;
            }
            if qp.resend_at.is_some_and(|at| now >= at) {
                qp.resend_at = None;
            }
            let (Some(out), Some(path)) = (qp.unacked.front(), qp.path) else {
                continue;
            };
            let (Some(sent), Some(timeout)) = (out.sent_at, ack_timeout(path.timeout)) else {
                continue;
            };
            if now < sent + timeout {
                continue;
            }
            if qp.retries_left == 0 {
                qp.fail(qpn, WcStatus::RetryExceeded);
            } else {
                qp.retries_left -= 1;
                qp.go_back();
            }
        }
    }

    /// Moves queued work requests onto their streams.
    fn transmit(&mut self, now: Instant) {
        let qpns: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, qp)| {
                qp.state == QpState::Rts && !qp.queued.is_empty() && qp.resend_at.is_none()
            })
            .map(|(&qpn, _)| qpn)
            .collect();
        for qpn in qpns {
            loop {
                let qp = self.qps.get_mut(&qpn).expect("listed");
                let wire = qp.wire;
                if wire.is_some_and(|w| {
                    self.wires[w]
                        .as_ref()
                        .is_some_and(|w| w.pending_out() >= WIRE_QUEUE)
                }) {
                    break;
                }
                let qp = self.qps.get_mut(&qpn).expect("listed");
                let Some(mut out) = qp.queued.pop_front() else {
                    break;
                };
                let first = !out.sent_once;
                out.sent_once = true;
                if out.payload.is_none() {
                    match out.wr.sge {
                        None => out.payload = Some(Vec::new()),
                        Some(sge) => {
                            let local = self
                                .regions
                                .get(&sge.lkey)
                                .filter(|r| r.covers(sge.addr, u64::from(sge.len), 0))
                                .copied();
                            let Some(local) = local else {
                                let qp = self.qps.get_mut(&qpn).expect("listed");
                                qp.complete(Wc {
                                    wr_id: out.wr.wr_id,
                                    status: WcStatus::LocalProtection,
                                    opcode: send_opcode(&out.wr),
                                    byte_len: 0,
                                    imm: None,
                                    qp_num: qpn,
                                });
                                qp.enter_error(qpn);
                                break;
                            };
                            // SAFETY: the bytes lie in a registered region
                            // (checked above) that its owner keeps valid
                            // and unwritten while the send is outstanding.
                            let bytes = unsafe {
                                std::slice::from_raw_parts(
                                    local.reach(sge.addr) as *const u8,
                                    sge.len as usize,
                                )
                            };
                            out.payload = Some(bytes.to_vec());
                        }
                    }
                }
                let mut frame = Frame {
                    psn: out.psn,
                    len: out.payload.as_ref().map_or(0, |p| p.len() as u64),
                    ..Frame::default()
                };
                match out.wr.op {
                    SendOp::Write {
                        remote_addr,
                        rkey,
                        imm,
                    } => {
                        frame.kind = WRITE;
                        frame.addr = remote_addr;
                        frame.rkey = rkey;
                        if let Some(imm) = imm {
                            frame.flags = HAS_IMM;
                            frame.imm = imm;
                        }
                    }
                    SendOp::Send => frame.kind = SEND,
                }
                if first {
                    self.frames_sent += 1;
                    self.trigger_faults();
                    if self.corrupt_next && frame.kind == WRITE && frame.len > 0 {
                        self.corrupt_next = false;
                        frame.rkey ^= 0x5a5a_5a5a;
                        out.wr.op = SendOp::Write {
                            remote_addr: frame.addr,
                            rkey: frame.rkey,
                            imm: (frame.flags & HAS_IMM != 0).then_some(frame.imm),
                        };
                    }
                }
                out.sent_at = Some(now);
                let link_up = self.port_error.is_none();
                if let (Some(w), true) = (wire, link_up) {
                    if let Some(wire) = self.wires[w].as_mut() {
                        wire.queue(&frame.encode(), out.payload.as_deref().unwrap_or(&[]));
                    }
                }
                let qp = self.qps.get_mut(&qpn).expect("listed");
                qp.unacked.push_back(out);
                if self.stall_until.is_some() || !link_up {
                    break;
                }
            }
        }
    }

    /// Starts the faults whose time has come.
    fn trigger_faults(&mut self) {
        let sent = self.frames_sent;
        let due: Vec<Fault> = self
            .faults
            .iter()
            .filter(|(_, at)| sent > *at)
            .map(|(fault, _)| *fault)
            .collect();
        self.faults.retain(|(_, at)| sent <= *at);
        for fault in due {
            match fault {
                Fault::DropLink => {
                    self.port_error = Some("port 1 went down (IBV_EVENT_PORT_ERR)".into());
                    for wire in self.wires.iter_mut().flatten() {
                        wire.closed = true;
                        wire.out.clear();
                        wire.out_at = 0;
                    }
                }
                Fault::CorruptKey => self.corrupt_next = true,
                Fault::Stall(d) => self.stall_until = Some(Instant::now() + d),
            }
        }
    }
}

/// 4.096 us x 2^timeout; none for 0 (wait without end).
fn ack_timeout(timeout: u8) -> Option<Duration> {
    (timeout > 0).then(|| Duration::from_nanos(4096 << timeout.min(31)))
}

/// Copies `payload` to `dst` so that a reader who sees its last 8 bytes
/// (as NCCL's FIFO entries end with their sequence number) sees all of it:
/// the rest first, then a fence, then those 8 bytes in one store.
///
/// # Safety
/// `dst..dst + payload.len()` is valid for writes.
unsafe fn write_ordered(dst: *mut u8, payload: &[u8]) {
    let len = payload.len();
    let last = dst.wrapping_add(len.saturating_sub(8));
    if len >= 8 && (last as usize).is_multiple_of(8) {
        std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, len - 8);
        fence(Ordering::Release);
        let word = u64::from_ne_bytes(payload[len - 8..].try_into().expect("8 bytes"));
        // SAFETY: `last` is 8-byte aligned and valid for writes (the
        // caller's range); readers of the word load it atomically.
        AtomicU64::from_ptr(last.cast()).store(word, Ordering::Release);
    } else {
        std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, len);
        fence(Ordering::Release);
    }
}

struct ModelDevice {
    nic: Arc<Nic>,
}

impl Device for ModelDevice {
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        let region = Region {
            addr: addr as usize,
            len,
            access: access | ACCESS_LOCAL_WRITE,
            at: addr as usize,
        };
        Ok(register(&self.nic, region, None))
    }

    unsafe fn reg_dmabuf_mr(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        if !self.registers_dmabuf() {
            return Err(VerbsError::new(
                "ibv_reg_dmabuf_mr",
                format!("the model takes dma-bufs only with {GPU_DIRECT_ENV}=1 (EOPNOTSUPP)"),
            ));
        }
        // The model reaches the buffer as a NIC does: through the file.
        let mapping = map_dmabuf(fd, offset, len)?;
        let region = Region {
            addr: iova as usize,
            len,
            access: access | ACCESS_LOCAL_WRITE,
            at: mapping.bytes(),
        };
        Ok(register(&self.nic, region, Some(mapping)))
    }

    fn registers_dmabuf(&self) -> bool {
        gpu_direct()
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>, VerbsError> {
        // SAFETY: plain eventfd(2) call; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(VerbsError::new(
                "ibv_create_comp_channel",
                io::Error::last_os_error().to_string(),
            ));
        }
        Ok(Arc::new(ModelCq {
            state: Arc::new(Mutex::new(CqState {
                entries: VecDeque::new(),
                depth: depth as usize,
                overflowed: false,
                // SAFETY: `fd` is a fresh descriptor nobody else owns.
                event: unsafe { OwnedFd::from_raw_fd(fd) },
            })),
        }))
    }

    fn create_qp(
        &self,
        cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Box<dyn QueuePair>, VerbsError> {
        let cq = cq
            .as_any()
            .downcast_ref::<ModelCq>()
            .ok_or_else(|| VerbsError::new("ibv_create_qp", "not a completion queue of the model"))?
            .state
            .clone();
        let mut state = self.nic.state.lock();
        let qpn = state.next_qpn & 0xff_ffff;
        state.next_qpn = state.next_qpn.wrapping_add(1);
        state.qps.insert(
            qpn,
            Qp {
                state: QpState::Reset,
                cq,
                caps,
                path: None,
                unacked: VecDeque::new(),
                queued: VecDeque::new(),
                recvs: VecDeque::new(),
                next_psn: 0,
                expect_psn: 0,
                retries_left: 0,
                rnr_left: 0,
                resend_at: None,
                wire: None,
                fatal: None,
            },
        );
        Ok(Box::new(ModelQp {
            nic: self.nic.clone(),
            qpn,
        }))
    }

    fn async_error(&self) -> Option<String> {
        self.nic.state.lock().port_error.clone()
    }
}

struct ModelQp {
    nic: Arc<Nic>,
    qpn: u32,
}

impl ModelQp {
    fn with<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&mut NicState, &mut Qp) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut state = self.nic.state.lock();
        let mut qp = state
            .qps
            .remove(&self.qpn)
            .ok_or_else(|| VerbsError::new(call, "no such queue pair"))?;
        let result = f(&mut state, &mut qp);
        state.qps.insert(self.qpn, qp);
        drop(state);
        self.nic.ring();
        result
    }
}

fn wrong_state(call: &'static str, state: QpState) -> VerbsError {
    VerbsError::new(call, format!("the queue pair is in state {state:?}"))
}

impl QueuePair for ModelQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn init(&self, path: &PathSettings) -> Result<(), VerbsError> {
        self.with("ibv_modify_qp", |_, qp| {
            if qp.state != QpState::Reset || path.port != 1 {
                return Err(wrong_state("ibv_modify_qp", qp.state));
            }
            qp.state = QpState::Init;
            qp.path = Some(*path);
            Ok(())
        })
    }

    fn ready_to_receive(&self, remote: &RemoteQp, path: &PathSettings) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.with("ibv_modify_qp", |state, qp| {
            if qp.state != QpState::Init {
                return Err(wrong_state("ibv_modify_qp", qp.state));
            }
            qp.state = QpState::Rtr;
            qp.path = Some(*path);
            qp.expect_psn = remote.psn & PSN_MASK;
            // An address the model cannot reach is a path nothing answers
            // on: sends time out, as on a fabric.
            if let Some(addr) = route(&remote.gid) {
                match start_connect(None, SocketAddr::V4(addr)) {
                    Ok(stream) => {
                        let mut wire = Wire {
                            stream,
                            qpn: Some(qpn),
                            outgoing: true,
                            peer: addr.to_string(),
                            out: Vec::new(),
                            out_at: 0,
                            inbuf: Vec::new(),
                            closed: false,
                        };
                        let hello = Frame {
                            kind: HELLO,
                            qpn: remote.qpn,
                            src_qpn: qpn,
                            ..Frame::default()
                        };
                        wire.queue(&hello.encode(), &[]);
                        qp.wire = Some(state.add_wire(wire));
                    }
                    Err(e) => {
                        qp.fatal = Some(format!("cannot reach {addr}: {e}"));
                    }
                }
            }
            Ok(())
        })
    }

    fn ready_to_send(&self, psn: u32, path: &PathSettings) -> Result<(), VerbsError> {
        self.with("ibv_modify_qp", |_, qp| {
            if qp.state != QpState::Rtr {
                return Err(wrong_state("ibv_modify_qp", qp.state));
            }
            qp.state = QpState::Rts;
            qp.next_psn = psn & PSN_MASK;
            qp.retries_left = path.retry_cnt;
            qp.rnr_left = path.rnr_retry;
            qp.path = Some(*path);
            Ok(())
        })
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.with("ibv_post_send", |state, qp| {
            if qp.state == QpState::Error {
                for wr in wrs {
                    qp.complete(flush(wr.wr_id, send_opcode(wr), qpn));
                }
                return Ok(());
            }
            if qp.state != QpState::Rts {
                return Err(wrong_state("ibv_post_send", qp.state));
            }
            if qp.unacked.len() + qp.queued.len() + wrs.len() > qp.caps.max_send_wr as usize {
                return Err(VerbsError::new(
                    "ibv_post_send",
                    "the send queue is full (ENOMEM)",
                ));
            }
            for wr in wrs {
                let payload = match (wr.inline, wr.sge) {
                    (true, Some(sge)) => {
                        if sge.len > qp.caps.max_inline {
                            return Err(VerbsError::new(
                                "ibv_post_send",
                                format!("{} bytes inline exceed {}", sge.len, qp.caps.max_inline),
                            ));
                        }
                        // SAFETY: an inline send's bytes are valid for
                        // reads while it is posted (the caller's buffer).
                        let bytes = unsafe {
                            std::slice::from_raw_parts(sge.addr as *const u8, sge.len as usize)
                        };
                        Some(bytes.to_vec())
                    }
                    _ => None,
                };
                qp.queued.push_back(Outstanding {
                    wr: *wr,
                    psn: qp.next_psn,
                    payload,
                    sent_at: None,
                    sent_once: false,
                });
                qp.next_psn = psn_after(qp.next_psn);
            }
            let _ = state;
            Ok(())
        })
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.with("ibv_post_recv", |_, qp| {
            match qp.state {
                QpState::Reset => return Err(wrong_state("ibv_post_recv", qp.state)),
                QpState::Error => {
                    for wr in wrs {
                        qp.complete(flush(wr.wr_id, WcOpcode::Recv, qpn));
                    }
                    return Ok(());
                }
                _ => {}
            }
            if qp.recvs.len() + wrs.len() > qp.caps.max_recv_wr as usize {
                return Err(VerbsError::new(
                    "ibv_post_recv",
                    "the receive queue is full (ENOMEM)",
                ));
            }
            qp.recvs.extend(wrs.iter().copied());
            Ok(())
        })
    }

    fn async_error(&self) -> Option<String> {
        let state = self.nic.state.lock();
        if let Some(port) = &state.port_error {
            return Some(port.clone());
        }
        let qp = state.qps.get(&self.qpn)?;
        if let Some(fatal) = &qp.fatal {
            return Some(fatal.clone());
        }
        let overflowed = qp.cq.lock().overflowed;
        overflowed.then(|| "the completion queue overflowed (IBV_EVENT_CQ_ERR)".to_string())
    }
}

impl Drop for ModelQp {
    fn drop(&mut self) {
        let mut state = self.nic.state.lock();
        if let Some(qp) = state.qps.remove(&self.qpn) {
            if let Some(w) = qp.wire {
                state.wires[w] = None;
            }
        }
        let qpn = self.qpn;
        for wire in state.wires.iter_mut() {
            if wire
                .as_ref()
                .is_some_and(|w| !w.outgoing && w.qpn == Some(qpn))
            {
                *wire = None;
            }
        }
    }
}
