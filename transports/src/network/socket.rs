//! The Socket network: TCP sockets that never block, opened with the
//! communicator's handshake and encrypted when the process holds a PSK
//! ([`crate::auth_tcp`]).
//!
//! Every listen opens its own listening socket; its handle carries the
//! address and a random listener id that the connecting side presents as
//! its hello. A communicator is one TCP connection.
//!
//! On the wire each send is one message: a 16-byte header (the size as a
//! little-endian `u64`, the tag as a little-endian `i32`, then
//! [`MESSAGE_MAGIC`]), then the bytes. A receiver reads a header only when a
//! receive is posted, checks it against that receive's buffers before
//! reading a byte of the body, and reads the body straight into the
//! buffer (encrypted: copied out of the opened records). Nothing is
//! allocated from a length the peer sent.
//!
//! Progress is made by `test` (and nothing else): sends are written with
//! `sendmsg` (gathering the pending messages, `MSG_NOSIGNAL` so that a peer
//! that went away is an error and not a signal; encrypted, sealed into
//! records first), receives read as far as the socket has data. There are no threads; the caller (the network
//! proxy) tests requests and sleeps on [`Net::readiness`] between tests.

use std::io::{self, IoSlice, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::checks::{check_recv, nothing_to_flush, Registration};
use super::handshake::{Client, Server, LISTENER_ID};
use super::requests::{Kind, OpState, Posted, Request, Side};
use super::{
    CommRef, Endpoint, ListenHandle, MemoryType, Net, NetError, Properties, PtrSupport, Readiness,
    RecvBuffer, Sizes, MAX_RECVS, NET_MAX_REQUESTS,
};
use crate::auth_tcp::{
    encryption, fill_random, AuthStream, Psk, Secret, DEFAULT_HANDSHAKE_TIMEOUT,
};

/// The last word of every message header.
pub const MESSAGE_MAGIC: u32 = 0x524e_4d31; // "RNM1"
/// Bytes of a message header.
const MESSAGE_HEADER: usize = 16;
/// The first bytes of a listen handle.
const HANDLE_MAGIC: [u8; 4] = *b"RCNS";
/// Bytes of a listen handle: magic, family, address, port, listener id.
const HANDLE_LEN: usize = 4 + 1 + 16 + 2 + LISTENER_ID;
/// Most bytes one message may carry (NCCL's `NCCL_MAX_NET_SIZE_BYTES`).
const MAX_P2P_BYTES: u64 = 1 << 40;
/// Most messages one `sendmsg` gathers.
const GATHER: usize = 32;
/// Port speed when the interface does not say (NCCL's default).
const DEFAULT_SPEED_MBPS: u32 = 10_000;

/// The noun in this network's I/O errors.
const NET: &str = "socket";

/// A network interface to bind: its name (for logs and its speed) and
/// the local address to listen on and connect from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketDevice {
    /// The interface's name (`eth0`, `lo`).
    pub name: String,
    /// The address of this host on it.
    pub ip: IpAddr,
}

impl SocketDevice {
    /// The loopback interface.
    pub fn loopback() -> SocketDevice {
        SocketDevice {
            name: "lo".into(),
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }
}

/// The Socket network of one communicator: its devices (chosen by the
/// caller, as `NCCL_SOCKET_IFNAME` selects them) and its secret.
#[derive(Debug)]
pub struct Socket {
    devices: Vec<SocketDevice>,
    secret: Secret,
    /// The key of encrypted connections; `None`: plaintext.
    psk: Option<Psk>,
    handshake_timeout: Duration,
}

impl Socket {
    /// A Socket network over `devices` (at least one), whose connections
    /// authenticate with `secret`, encrypted when the process holds a PSK
    /// ([`crate::auth_tcp::encryption`]).
    pub fn new(devices: Vec<SocketDevice>, secret: Secret) -> Result<Socket, NetError> {
        if devices.is_empty() {
            return Err(NetError::InvalidArgument(
                "the Socket network needs at least one interface".into(),
            ));
        }
        Ok(Socket {
            devices,
            secret,
            psk: encryption(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        })
    }

    /// Encrypts the connections made from now on with `psk` (plaintext
    /// with `None`) rather than with the process's key.
    pub fn set_psk(&mut self, psk: Option<Psk>) {
        self.psk = psk;
    }

    /// Sets how long a connecting peer may take over its handshake before
    /// the listener drops it.
    pub fn set_handshake_timeout(&mut self, timeout: Duration) {
        self.handshake_timeout = timeout;
    }

    fn device(&self, dev: usize) -> Result<&SocketDevice, NetError> {
        self.devices.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!(
                "no Socket device {dev} (there are {})",
                self.devices.len()
            ))
        })
    }
}

/// A listening communicator: its socket, its id, and the handshakes of
/// peers that connected.
pub struct SocketListen {
    listener: TcpListener,
    local: SocketAddr,
    id: [u8; LISTENER_ID],
    handshakes: Vec<Server>,
}

impl std::fmt::Debug for SocketListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketListen")
            .field("local", &self.local)
            .field("handshakes", &self.handshakes.len())
            .finish()
    }
}

/// A `connect` in progress.
#[derive(Default)]
pub struct SocketConnect {
    client: Option<(Client, SocketAddr)>,
}

/// A registration: the bytes it covers.
#[derive(Debug)]
pub struct SocketMr {
    start: usize,
    len: usize,
}

impl Registration for SocketMr {
    fn bounds(&self) -> (usize, usize) {
        (self.start, self.len)
    }
}

/// The descriptor, peer, and failure shared by both directions' states.
struct Wire {
    /// `None` once the communicator is closed.
    stream: Option<AuthStream>,
    peer: SocketAddr,
    /// Why the communicator failed: every pending request fails so.
    failed: Option<NetError>,
}

impl Wire {
    /// Why pending requests cannot complete, if they cannot.
    fn broken(&self) -> Option<NetError> {
        if let Some(failed) = &self.failed {
            return Some(failed.clone());
        }
        self.stream.is_none().then(|| NetError::Aborted {
            peer: self.peer.to_string(),
        })
    }
}

struct SendOp {
    header: [u8; MESSAGE_HEADER],
    data: *const u8,
    size: usize,
    /// Bytes of header and data written.
    written: usize,
    state: OpState,
}

struct SendState {
    wire: Wire,
    /// Requests not yet spent, in posting order.
    ops: Posted<SendOp>,
    /// The first op not yet written whole.
    next_io: usize,
    /// The first op not yet done: written whole, its encrypted bytes may
    /// still wait in the stream.
    next_done: usize,
}

// SAFETY: the raw pointers in `ops` point into registered memory that the
// caller of `reg_mr` keeps valid and untouched while the sends are
// pending; the state is only reached through its mutex.
unsafe impl Send for SendState {}

struct RecvBuf {
    data: *mut u8,
    cap: usize,
    tag: i32,
    /// The size of the message matched to this buffer, once one is.
    size: Option<usize>,
    got: usize,
}

struct RecvGroup {
    bufs: Vec<RecvBuf>,
    filled: usize,
    state: OpState,
}

struct RecvState {
    wire: Wire,
    groups: Posted<RecvGroup>,
    /// The first group not yet filled.
    next_io: usize,
    header: [u8; MESSAGE_HEADER],
    header_got: usize,
    /// The buffer of the group at `next_io` whose body is being read.
    current: Option<usize>,
}

// SAFETY: as for SendState: the buffers are registered memory the caller
// leaves to the receive while it is pending.
unsafe impl Send for RecvState {}

/// A sending communicator.
pub struct SocketSend {
    state: Arc<Mutex<SendState>>,
    peer: SocketAddr,
}

/// A receiving communicator.
pub struct SocketRecv {
    state: Arc<Mutex<RecvState>>,
    peer: SocketAddr,
    max_recvs: usize,
}

impl Endpoint for SocketSend {
    fn peer(&self) -> String {
        self.peer.to_string()
    }
}

impl Endpoint for SocketRecv {
    fn peer(&self) -> String {
        self.peer.to_string()
    }
}

/// A send, receive or flush in flight.
pub struct SocketRequest(Request<SendState, RecvState>);

impl Side for SendState {
    type Op = SendOp;

    fn posted(&self) -> &Posted<SendOp> {
        &self.ops
    }

    fn posted_mut(&mut self) -> &mut Posted<SendOp> {
        &mut self.ops
    }

    fn op_state(op: &mut SendOp) -> &mut OpState {
        &mut op.state
    }

    fn sizes(op: &SendOp) -> Sizes {
        Sizes::new(&[op.size])
    }

    fn progress(&mut self) {
        SendState::progress(self);
    }

    fn broken(&self) -> Option<NetError> {
        self.wire.broken()
    }

    fn retire(&mut self) {
        SendState::retire(self);
    }
}

impl Side for RecvState {
    type Op = RecvGroup;

    fn posted(&self) -> &Posted<RecvGroup> {
        &self.groups
    }

    fn posted_mut(&mut self) -> &mut Posted<RecvGroup> {
        &mut self.groups
    }

    fn op_state(group: &mut RecvGroup) -> &mut OpState {
        &mut group.state
    }

    fn sizes(group: &RecvGroup) -> Sizes {
        let mut sizes = [0usize; MAX_RECVS];
        for (size, buf) in sizes.iter_mut().zip(&group.bufs) {
            *size = buf.size.unwrap_or(0);
        }
        Sizes::new(&sizes[..group.bufs.len()])
    }

    fn progress(&mut self) {
        RecvState::progress(self);
    }

    fn broken(&self) -> Option<NetError> {
        self.wire.broken()
    }

    fn retire(&mut self) {
        RecvState::retire(self);
    }
}

pub(super) fn handle_bytes(addr: SocketAddr, id: &[u8; LISTENER_ID]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HANDLE_LEN);
    bytes.extend_from_slice(&HANDLE_MAGIC);
    let mut ip = [0u8; 16];
    match addr.ip() {
        IpAddr::V4(v4) => {
            bytes.push(4);
            ip[..4].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            bytes.push(6);
            ip.copy_from_slice(&v6.octets());
        }
    }
    bytes.extend_from_slice(&ip);
    bytes.extend_from_slice(&addr.port().to_le_bytes());
    bytes.extend_from_slice(id);
    bytes
}

pub(super) fn parse_handle(
    handle: &ListenHandle,
) -> Result<(SocketAddr, [u8; LISTENER_ID]), NetError> {
    let bytes = handle.as_bytes();
    let malformed = || NetError::InvalidArgument("malformed Socket listen handle".into());
    if bytes.len() != HANDLE_LEN || bytes[..4] != HANDLE_MAGIC {
        return Err(malformed());
    }
    let ip: [u8; 16] = bytes[5..21].try_into().map_err(|_| malformed())?;
    let ip = match bytes[4] {
        4 => IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
        6 => IpAddr::V6(Ipv6Addr::from(ip)),
        _ => return Err(malformed()),
    };
    let port = u16::from_le_bytes([bytes[21], bytes[22]]);
    let id = bytes[23..].try_into().map_err(|_| malformed())?;
    Ok((SocketAddr::new(ip, port), id))
}

/// The speed in Mbit/s `/sys/class/net/<name>/speed` gives, or NCCL's
/// default (10 Gbit/s).
pub fn interface_speed(name: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
        .ok()
        .and_then(|text| text.trim().parse::<i64>().ok())
        .filter(|&speed| speed > 0)
        .map_or(DEFAULT_SPEED_MBPS, |speed| {
            speed.min(i64::from(u32::MAX)) as u32
        })
}

impl SendState {
    /// Writes pending messages as far as the socket takes them.
    fn progress(&mut self) {
        if self.wire.failed.is_some() {
            return;
        }
        let peer = self.wire.peer;
        let Some(stream) = self.wire.stream.as_mut() else {
            return;
        };
        while self.next_io < self.ops.len() {
            let mut iov = [IoSlice::new(&[]); 2 * GATHER];
            let mut count = 0;
            for op in self.ops.range(self.next_io..).take(GATHER) {
                let header_left = MESSAGE_HEADER.saturating_sub(op.written);
                if header_left > 0 {
                    iov[count] = IoSlice::new(&op.header[MESSAGE_HEADER - header_left..]);
                    count += 1;
                }
                let data_done = op.written.saturating_sub(MESSAGE_HEADER);
                if op.size > data_done {
                    // SAFETY: the bytes are registered memory of a pending
                    // send, valid and untouched while it is pending (reg_mr's
                    // contract); they are only read.
                    let data = unsafe {
                        std::slice::from_raw_parts(op.data.add(data_done), op.size - data_done)
                    };
                    iov[count] = IoSlice::new(data);
                    count += 1;
                }
            }
            let mut n = match stream.write_gather(&iov[..count]) {
                Ok(n) => n,
                Err(err) => match err.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => break,
                    _ => {
                        self.wire.failed = Some(NetError::io(NET, "sending to", peer, &err));
                        return;
                    }
                },
            };
            while n > 0 {
                let op = &mut self.ops[self.next_io];
                let step = n.min(MESSAGE_HEADER + op.size - op.written);
                op.written += step;
                n -= step;
                if op.written == MESSAGE_HEADER + op.size {
                    self.next_io += 1;
                }
            }
        }
        // A send is done once its bytes are in the kernel: encrypted bytes
        // may still wait in the stream.
        match stream.flush_output() {
            Ok(true) => {
                while self.next_done < self.next_io {
                    self.ops[self.next_done].state.finish();
                    self.next_done += 1;
                }
            }
            Ok(false) => {}
            Err(err) => {
                self.wire.failed = Some(NetError::io(NET, "sending to", peer, &err));
                return;
            }
        }
        self.retire();
    }

    /// Forgets spent requests at the front.
    fn retire(&mut self) {
        let retired = self.ops.retire(|op| op.state == OpState::Spent);
        self.next_io = self.next_io.saturating_sub(retired);
        self.next_done = self.next_done.saturating_sub(retired);
    }
}

impl RecvState {
    /// Reads what the socket has into the posted buffers.
    fn progress(&mut self) {
        if self.wire.failed.is_some() {
            return;
        }
        if let Err(err) = self.read_messages() {
            self.wire.failed = Some(err);
        }
        self.retire();
    }

    fn read_messages(&mut self) -> Result<(), NetError> {
        let peer = self.wire.peer;
        let Some(stream) = self.wire.stream.as_mut() else {
            return Ok(());
        };
        while self.next_io < self.groups.len() {
            let group = &mut self.groups[self.next_io];
            let Some(at) = self.current else {
                // The next message's header.
                match stream.read(&mut self.header[self.header_got..]) {
                    Ok(0) => {
                        return Err(NetError::Closed {
                            peer: peer.to_string(),
                            mid_message: self.header_got > 0,
                        })
                    }
                    Ok(n) => self.header_got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    // The peer closed in the middle of an encrypted record.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(NetError::Closed {
                            peer: peer.to_string(),
                            mid_message: true,
                        })
                    }
                    Err(e) => return Err(NetError::io(NET, "receiving from", peer, &e)),
                }
                if self.header_got < MESSAGE_HEADER {
                    continue;
                }
                self.header_got = 0;
                let size = u64::from_le_bytes(self.header[..8].try_into().expect("8 bytes"));
                let tag = i32::from_le_bytes(self.header[8..12].try_into().expect("4 bytes"));
                let magic = u32::from_le_bytes(self.header[12..].try_into().expect("4 bytes"));
                if magic != MESSAGE_MAGIC {
                    return Err(NetError::Refused {
                        peer: peer.to_string(),
                        reason: format!("malformed message header (magic {magic:#x})"),
                    });
                }
                let Some(at) = group
                    .bufs
                    .iter()
                    .position(|buf| buf.tag == tag && buf.size.is_none())
                else {
                    return Err(NetError::UnexpectedTag {
                        peer: peer.to_string(),
                        tag,
                    });
                };
                let buf = &mut group.bufs[at];
                if size > buf.cap as u64 {
                    return Err(NetError::Truncated {
                        peer: peer.to_string(),
                        sent: size,
                        posted: buf.cap,
                    });
                }
                buf.size = Some(size as usize);
                self.current = Some(at);
                continue;
            };
            let buf = &mut group.bufs[at];
            let size = buf.size.expect("matched");
            if buf.got < size {
                // SAFETY: the buffer is registered memory of `cap >= size`
                // bytes that the pending receive owns (reg_mr's contract).
                let body = unsafe {
                    std::slice::from_raw_parts_mut(buf.data.add(buf.got), size - buf.got)
                };
                match stream.read(body) {
                    Ok(0) => {
                        return Err(NetError::Closed {
                            peer: peer.to_string(),
                            mid_message: true,
                        })
                    }
                    Ok(n) => buf.got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    // The peer closed in the middle of an encrypted record.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(NetError::Closed {
                            peer: peer.to_string(),
                            mid_message: true,
                        })
                    }
                    Err(e) => return Err(NetError::io(NET, "receiving from", peer, &e)),
                }
            }
            if buf.got == size {
                self.current = None;
                group.filled += 1;
                if group.filled == group.bufs.len() {
                    group.state.finish();
                    self.next_io += 1;
                }
            }
        }
        Ok(())
    }

    /// Forgets spent requests at the front.
    fn retire(&mut self) {
        let retired = self.groups.retire(|g| g.state == OpState::Spent);
        self.next_io = self.next_io.saturating_sub(retired);
    }
}

impl Net for Socket {
    type ListenComm = SocketListen;
    type ConnectStage = SocketConnect;
    type SendComm = SocketSend;
    type RecvComm = SocketRecv;
    type MemHandle = SocketMr;
    type Request = SocketRequest;

    fn name(&self) -> &'static str {
        "Socket"
    }

    fn devices(&self) -> usize {
        self.devices.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties, NetError> {
        let device = self.device(dev)?;
        let pci_path = std::fs::canonicalize(format!("/sys/class/net/{}/device", device.name)).ok();
        Ok(Properties {
            name: device.name.clone(),
            pci_path,
            guid: dev as u64,
            ptr_support: PtrSupport {
                host: true,
                cuda: false,
                dmabuf: false,
            },
            reg_is_global: false,
            force_flush: false,
            speed_mbps: interface_speed(&device.name),
            port: 0,
            latency_us: 0.0,
            max_comms: 65_536,
            max_recvs: MAX_RECVS,
            max_p2p_bytes: MAX_P2P_BYTES,
        })
    }

    fn listen(&self, dev: usize) -> Result<(ListenHandle, SocketListen), NetError> {
        let ip = self.device(dev)?.ip;
        let bind = SocketAddr::new(ip, 0);
        let listener =
            TcpListener::bind(bind).map_err(|e| NetError::io(NET, "listening on", bind, &e))?;
        let local = listener
            .local_addr()
            .and_then(|local| listener.set_nonblocking(true).map(|()| local))
            .map_err(|e| NetError::io(NET, "listening on", bind, &e))?;
        let mut id = [0u8; LISTENER_ID];
        fill_random(&mut id).map_err(|e| NetError::io(NET, "listening on", local, &e))?;
        let handle = ListenHandle::from_bytes(&handle_bytes(local, &id))?;
        Ok((
            handle,
            SocketListen {
                listener,
                local,
                id,
                handshakes: Vec::new(),
            },
        ))
    }

    fn connect(
        &self,
        dev: usize,
        handle: &ListenHandle,
        stage: &mut SocketConnect,
    ) -> Result<Option<SocketSend>, NetError> {
        let local = self.device(dev)?.ip;
        if stage.client.is_none() {
            let (addr, id) = parse_handle(handle)?;
            let stream = crate::tcp_connect::start_connect(Some(local), addr)
                .map_err(|e| NetError::io(NET, "connecting to", addr, &e))?;
            stage.client = Some((Client::new(stream, id, self.psk.clone()), addr));
        }
        let (client, addr) = stage.client.as_mut().expect("just set");
        let addr = *addr;
        match client.progress(&self.secret) {
            Ok(false) => Ok(None),
            Ok(true) => {
                let (client, _) = stage.client.take().expect("in progress");
                Ok(Some(SocketSend {
                    state: Arc::new(Mutex::new(SendState {
                        wire: Wire {
                            stream: Some(client.into_stream()),
                            peer: addr,
                            failed: None,
                        },
                        ops: Posted::new(),
                        next_io: 0,
                        next_done: 0,
                    })),
                    peer: addr,
                }))
            }
            Err(e) => {
                stage.client = None;
                Err(
                    if e.kind() == io::ErrorKind::PermissionDenied
                        || e.kind() == io::ErrorKind::InvalidData
                    {
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
    }

    fn accept(&self, listen: &mut SocketListen) -> Result<Option<SocketRecv>, NetError> {
        loop {
            match listen.listener.accept() {
                Ok((stream, peer)) => {
                    let deadline = Instant::now() + self.handshake_timeout;
                    match Server::new(stream, peer, deadline, &self.secret, self.psk.as_ref()) {
                        Ok(server) => listen.handshakes.push(server),
                        Err(e) => {
                            tracing::warn!(remote = %peer, "dropped a connection to {}: {e}", listen.local)
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    break
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NetError::io(NET, "accepting on", listen.local, &e)),
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < listen.handshakes.len() {
            let server = &mut listen.handshakes[i];
            let outcome = match server.progress(&self.secret, &listen.id) {
                Ok(false) if now >= server.deadline => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "timed out in the handshake",
                )),
                outcome => outcome,
            };
            match outcome {
                Ok(false) => i += 1,
                Ok(true) => {
                    let server = listen.handshakes.swap_remove(i);
                    let peer = server.peer();
                    return Ok(Some(SocketRecv {
                        state: Arc::new(Mutex::new(RecvState {
                            wire: Wire {
                                stream: Some(server.into_stream()),
                                peer,
                                failed: None,
                            },
                            groups: Posted::new(),
                            next_io: 0,
                            header: [0; MESSAGE_HEADER],
                            header_got: 0,
                            current: None,
                        })),
                        peer,
                        max_recvs: MAX_RECVS,
                    }));
                }
                Err(e) => {
                    let server = listen.handshakes.swap_remove(i);
                    tracing::warn!(
                        remote = %server.peer(),
                        listener = %listen.local,
                        "rejected a connection that failed the handshake: {e}"
                    );
                }
            }
        }
        Ok(None)
    }

    unsafe fn reg_mr(
        &self,
        _comm: CommRef<'_, Self>,
        data: *mut u8,
        size: usize,
        memory: MemoryType,
    ) -> Result<SocketMr, NetError> {
        if memory != MemoryType::Host {
            return Err(NetError::Unsupported {
                net: "Socket",
                memory,
            });
        }
        Ok(SocketMr {
            start: data as usize,
            len: size,
        })
    }

    fn dereg_mr(&self, _comm: CommRef<'_, Self>, _mhandle: SocketMr) -> Result<(), NetError> {
        Ok(())
    }

    fn isend(
        &self,
        comm: &mut SocketSend,
        data: *const u8,
        size: usize,
        tag: i32,
        mhandle: &SocketMr,
    ) -> Result<Option<SocketRequest>, NetError> {
        mhandle.check(data as usize, size)?;
        if size as u64 > MAX_P2P_BYTES {
            return Err(NetError::InvalidArgument(format!(
                "a send of {size} bytes exceeds {MAX_P2P_BYTES}"
            )));
        }
        let mut state = comm.state.lock();
        state.admit(NET_MAX_REQUESTS * MAX_RECVS)?;
        let mut header = [0u8; MESSAGE_HEADER];
        header[..8].copy_from_slice(&(size as u64).to_le_bytes());
        header[8..12].copy_from_slice(&tag.to_le_bytes());
        header[12..].copy_from_slice(&MESSAGE_MAGIC.to_le_bytes());
        let id = state.ops.push(SendOp {
            header,
            data,
            size,
            written: 0,
            state: OpState::Pending,
        });
        if state.next_io + 1 == state.ops.len() {
            // Nothing queued ahead of it: start writing now.
            state.progress();
        }
        Ok(Some(SocketRequest(Request::new(Kind::Send(
            comm.state.clone(),
            id,
        )))))
    }

    fn irecv(
        &self,
        comm: &mut SocketRecv,
        buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<SocketRequest>, NetError> {
        check_recv(buffers, comm.max_recvs)?;
        let mut state = comm.state.lock();
        state.admit(NET_MAX_REQUESTS)?;
        let id = state.groups.push(RecvGroup {
            bufs: buffers
                .iter()
                .map(|b| RecvBuf {
                    data: b.data,
                    cap: b.size,
                    tag: b.tag,
                    size: None,
                    got: 0,
                })
                .collect(),
            filled: 0,
            state: OpState::Pending,
        });
        Ok(Some(SocketRequest(Request::new(Kind::Recv(
            comm.state.clone(),
            id,
        )))))
    }

    fn iflush(
        &self,
        _comm: &mut SocketRecv,
        _buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<SocketRequest>, NetError> {
        nothing_to_flush(SocketRequest(Request::new(Kind::Flush)))
    }

    fn test(&self, request: &mut SocketRequest) -> Result<Option<Sizes>, NetError> {
        request.0.test()
    }

    fn close_send(&self, comm: SocketSend) -> Result<(), NetError> {
        comm.state.lock().wire.stream = None;
        Ok(())
    }

    fn close_recv(&self, comm: SocketRecv) -> Result<(), NetError> {
        comm.state.lock().wire.stream = None;
        Ok(())
    }

    fn close_listen(&self, comm: SocketListen) -> Result<(), NetError> {
        drop(comm);
        Ok(())
    }

    fn readiness(&self, request: &SocketRequest) -> Option<Readiness> {
        let (stream, readable) = match &request.0.kind {
            Kind::Send(state, _) => (state.lock().wire.stream.as_ref()?.as_raw_fd(), false),
            Kind::Recv(state, _) => {
                let state = state.lock();
                let stream = state.wire.stream.as_ref()?;
                // Opened plaintext waiting in the stream: test again soon.
                if stream.buffered() {
                    return None;
                }
                (stream.as_raw_fd(), true)
            }
            Kind::Flush => return None,
        };
        Some(Readiness {
            fd: stream,
            readable,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth_tcp::seal_tests::{contains, relay};

    #[test]
    fn handles_round_trip_and_refuse_garbage() {
        let id = [7u8; LISTENER_ID];
        for addr in ["127.0.0.1:4242", "[::1]:5353"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let handle = ListenHandle::from_bytes(&handle_bytes(addr, &id)).unwrap();
            assert_eq!(parse_handle(&handle).unwrap(), (addr, id));
        }
        for bytes in [&b"RCNS"[..], &[0u8; HANDLE_LEN][..]] {
            let handle = ListenHandle::from_bytes(bytes).unwrap();
            assert!(parse_handle(&handle).is_err());
        }
        assert!(ListenHandle::from_bytes(&[0; 129]).is_err());
    }

    /// Connections that never say a word (the data-listener attack of a
    /// stranger who can reach the port) neither block nor delay a member:
    /// handshakes run side by side, each against its own deadline.
    #[test]
    fn silent_clients_do_not_delay_a_member() {
        let secret = Secret::random();
        let net = Socket::new(vec![SocketDevice::loopback()], secret).unwrap();
        let (handle, mut listen) = net.listen(0).unwrap();
        let (addr, _) = parse_handle(&handle).unwrap();
        let silent: Vec<_> = (0..20)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let start = Instant::now();
        connect_both(&net, &handle, &mut listen);
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
        drop(silent);
    }

    /// Connects `net` to its own listener, both ends polled until made
    /// (within 2 s).
    fn connect_both(
        net: &Socket,
        handle: &ListenHandle,
        listen: &mut SocketListen,
    ) -> (SocketSend, SocketRecv) {
        let start = Instant::now();
        let (mut stage, mut send, mut recv) = (Default::default(), None, None);
        loop {
            assert!(start.elapsed() < Duration::from_secs(2), "no connection");
            if send.is_none() {
                send = net.connect(0, handle, &mut stage).unwrap();
            }
            if recv.is_none() {
                recv = net.accept(listen).unwrap();
            }
            if let (Some(_), Some(_)) = (&send, &recv) {
                return (send.unwrap(), recv.unwrap());
            }
        }
    }

    /// Sends one 64 KiB message of a known pattern over a Socket network
    /// encrypted with `psk` (plaintext with `None`), through a relay that
    /// records the sender's bytes and flips the one at `flip`: what the
    /// receive came to (its error's text, or the data) and the wire.
    fn relayed_message(
        psk: Option<Psk>,
        flip: Option<usize>,
    ) -> (Result<Vec<u8>, String>, Vec<u8>, String) {
        let mut net = Socket::new(vec![SocketDevice::loopback()], Secret::random()).unwrap();
        net.set_psk(psk);
        let (handle, mut listen) = net.listen(0).unwrap();
        let (addr, id) = parse_handle(&handle).unwrap();
        let (relay, wire) = relay(addr, flip);
        let handle = ListenHandle::from_bytes(&handle_bytes(relay, &id)).unwrap();
        let start = Instant::now();
        let (mut send, mut recv) = connect_both(&net, &handle, &mut listen);
        let out: Vec<u8> = b"SECRET-PAYLOAD-"
            .iter()
            .copied()
            .cycle()
            .take(64 << 10)
            .collect();
        let mut into = vec![0u8; out.len()];
        let send_mr = SocketMr {
            start: out.as_ptr() as usize,
            len: out.len(),
        };
        let recv_mr = SocketMr {
            start: into.as_mut_ptr() as usize,
            len: into.len(),
        };
        let mut s = net
            .isend(&mut send, out.as_ptr(), out.len(), 0, &send_mr)
            .unwrap()
            .unwrap();
        let buffer = RecvBuffer {
            data: into.as_mut_ptr(),
            size: into.len(),
            tag: 0,
            mhandle: &recv_mr,
        };
        let mut r = net.irecv(&mut recv, &[buffer]).unwrap().unwrap();
        let outcome = loop {
            assert!(start.elapsed() < Duration::from_secs(5), "no outcome");
            let _ = net.test(&mut s);
            match net.test(&mut r) {
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Ok(Some(_)) => break Ok(()),
                Err(e) => break Err(e.to_string()),
            }
        };
        let wire = wire.lock().clone();
        let got = outcome.map(|()| {
            assert_eq!(into, out);
            into
        });
        (got, wire, recv.peer())
    }

    /// The payload crosses the wire in the clear without a PSK and never
    /// with one.
    #[test]
    fn encrypted_messages_cross_the_wire_unreadable() {
        let psk = || Some(Psk::new(&[5; crate::auth_tcp::MIN_PSK_BYTES]).unwrap());
        let (got, wire, _) = relayed_message(None, None);
        assert!(got.is_ok() && contains(&wire, b"SECRET-PAYLOAD-"));
        let (got, wire, _) = relayed_message(psk(), None);
        assert!(got.is_ok(), "{got:?}");
        assert!(wire.len() > 64 << 10 && !contains(&wire, b"SECRET-PAYLOAD-"));
    }

    /// A byte flipped on the wire of an encrypted connection fails the
    /// receive, naming the sender's address; nothing corrupt arrives.
    #[test]
    fn a_tampered_encrypted_message_fails_the_receive_naming_the_peer() {
        let psk = Psk::new(&[5; crate::auth_tcp::MIN_PSK_BYTES]).unwrap();
        // Past the handshake and the first message header, in its body.
        let (got, _, peer) = relayed_message(Some(psk), Some(4_000));
        let text = got.unwrap_err();
        assert!(
            text.contains(&peer) && text.contains("failed authentication"),
            "{text}"
        );
    }

    #[test]
    fn registrations_bound_the_buffers() {
        let mr = SocketMr {
            start: 1000,
            len: 100,
        };
        assert!(mr.check(1000, 100).is_ok());
        assert!(mr.check(1050, 50).is_ok());
        assert!(mr.check(999, 1).is_err());
        assert!(mr.check(1050, 51).is_err());
        assert!(mr.check(usize::MAX, 2).is_err());
    }
}
