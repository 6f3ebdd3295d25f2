//! The unique id and the bootstrap network (NCCL's bootstrap layer).
//!
//! A [`UniqueId`] names a *root*: a listener plus a rendezvous thread that
//! serves one communicator's initialisation. Each rank binds its own
//! authenticated listener, registers `(rank, nranks, listener address)` at
//! the root, and receives every rank's listener address. From then on the
//! ranks talk directly: [`Bootstrap::send`] / [`Bootstrap::recv`] carry tagged
//! messages, [`Bootstrap::allgather`] runs a ring and [`Bootstrap::barrier`]
//! a dissemination barrier over them.
//!
//! Every connection (to the root and between ranks) is authenticated with
//! the id's 32-byte secret ([`rccl_transports::auth_tcp`]).
//!
//! Messages under a tag with a sink ([`Bootstrap::set_sink`]) skip the
//! mailbox: the listener thread hands each to the sink as it arrives, in
//! the order its sender sent them (one-sided puts land this way).

mod id;
mod in_process;
mod root;

pub use id::UniqueId;
use root::{spawn_root, Registration, Root};

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rccl_transports::auth_tcp::{self, AuthListener, AuthStream, Psk, Secret};

use crate::error::{Error, Result};
use rccl_transports::host::host_address;

/// The largest bootstrap frame accepted from the wire.
pub const MAX_FRAME: usize = 8 << 20;

pub(super) const UID_MAGIC: [u8; 4] = *b"RCID";
pub(super) const UID_VERSION: u8 = 1;
/// Hello of a rank registering at the root.
pub(super) const REG_MAGIC: [u8; 4] = *b"RCRG";
/// Hello of a rank connecting to another rank's listener.
pub(super) const PEER_MAGIC: [u8; 4] = *b"RCBP";
/// Encoded socket address: family, port, 16 address bytes, scope id.
pub(super) const ADDR_LEN: usize = 1 + 2 + 16 + 4;
/// Root answer status bytes.
pub(super) const ROOT_OK: u8 = 0;
pub(super) const ROOT_USAGE: u8 = 1;
pub(super) const ROOT_SYSTEM: u8 = 2;
/// Where the id's flags byte sits: after the magic, version, address and
/// secret.
pub(super) const FLAGS_AT: usize = 5 + ADDR_LEN + 32;
/// The id was derived from an address ([`UniqueId::from_address`]).
pub(super) const FLAG_FROM_ADDRESS: u8 = 1;
/// ... and no launcher named the job: its root settles before answering.
pub(super) const FLAG_UNNAMED_JOB: u8 = 2;
/// Message kinds, kept apart in the mailbox.
pub(super) const KIND_USER: u8 = 0;
pub(super) const KIND_COLL: u8 = 1;
/// Frame header after the length: kind, tag.
pub(super) const MSG_HEADER: usize = 1 + 8;
/// How long a root with no registered rank waits before exiting.
pub(super) const DEFAULT_ROOT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a client of the root or of a rank's listener may take to
/// authenticate (a handshake on a cluster network takes milliseconds).
/// Handshakes run concurrently: a silent client only holds its own slot
/// this long.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often waits check the abort flag.
pub(super) const ABORT_POLL: Duration = Duration::from_millis(10);

pub(super) fn encode_addr(addr: &SocketAddr, out: &mut Vec<u8>) {
    match addr {
        SocketAddr::V4(a) => {
            out.push(4);
            out.extend_from_slice(&a.port().to_le_bytes());
            let mut ip = [0u8; 16];
            ip[..4].copy_from_slice(&a.ip().octets());
            out.extend_from_slice(&ip);
            out.extend_from_slice(&0u32.to_le_bytes());
        }
        SocketAddr::V6(a) => {
            out.push(6);
            out.extend_from_slice(&a.port().to_le_bytes());
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
}

pub(super) fn decode_addr(b: &[u8]) -> std::result::Result<SocketAddr, String> {
    if b.len() < ADDR_LEN {
        return Err(format!("address of {} bytes, expected {ADDR_LEN}", b.len()));
    }
    let port = u16::from_le_bytes([b[1], b[2]]);
    let ip: [u8; 16] = b[3..19].try_into().unwrap();
    let scope = u32::from_le_bytes(b[19..23].try_into().unwrap());
    match b[0] {
        4 => Ok(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            port,
        )),
        6 => Ok(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            0,
            scope,
        ))),
        f => Err(format!("unknown address family {f}")),
    }
}

pub(super) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub(super) fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// `t + d`, saturating far in the future instead of overflowing.
pub(super) fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(100 * 365 * 24 * 3600))
}

pub(super) fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Received messages, keyed by (sender, kind, tag), plus the senders whose
/// connection ended.
#[derive(Default)]
struct Mailbox {
    msgs: HashMap<(usize, u8, u64), VecDeque<Vec<u8>>>,
    gone: HashMap<usize, String>,
    /// Per sender, its connections to this rank still being read.
    reading: HashMap<usize, usize>,
    /// Why this rank's listener could not accept a connection, if it could
    /// not: the message that connection carries will never arrive.
    broken: Option<String>,
}

/// What takes the messages of one tag as they arrive: the sender's rank
/// and the message.
pub(crate) type Sink = Box<dyn Fn(usize, &[u8]) + Send>;

struct Shared {
    mailbox: Mutex<Mailbox>,
    cond: Condvar,
    stop: AtomicBool,
    /// Per tag of user messages, its sink. Held while a sink runs, so
    /// that one removed runs no more once [`Bootstrap::stop_sinks`]
    /// returns.
    sinks: Mutex<HashMap<u64, Sink>>,
}

impl Shared {
    fn deliver(&self, from: usize, kind: u8, tag: u64, payload: &[u8]) {
        // Held across the look and the filing: a sink set meanwhile
        // misses nothing.
        let sinks = self.sinks.lock();
        if kind == KIND_USER {
            if let Some(sink) = sinks.get(&tag) {
                sink(from, payload);
                return;
            }
        }
        let payload = payload.to_vec();
        self.mailbox
            .lock()
            .msgs
            .entry((from, kind, tag))
            .or_default()
            .push_back(payload);
        self.cond.notify_all();
    }

    /// Files how a connection from `from` ended, once read to its end.
    fn mark_gone(&self, from: usize, why: String) {
        let mut mailbox = self.mailbox.lock();
        mailbox.gone.insert(from, why);
        if let Some(open) = mailbox.reading.get_mut(&from) {
            *open = open.saturating_sub(1);
        }
        drop(mailbox);
        self.cond.notify_all();
    }
}

/// The bootstrap network of one rank: its listener (served by one thread),
/// the other ranks' listener addresses, and cached outgoing connections.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    secret: Secret,
    /// The process's encryption key when this rank joined: every
    /// connection of the bootstrap network uses it.
    psk: Option<Psk>,
    timeout: Duration,
    abort: Arc<AtomicBool>,
    peers: Vec<SocketAddr>,
    out: Vec<Mutex<Option<AuthStream>>>,
    seq: AtomicU64,
    shared: Arc<Shared>,
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("listen", &self.peers[self.rank])
            .finish_non_exhaustive()
    }
}

// Bootstrap is shared between threads (e.g. a communicator's proxy).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Bootstrap>();
};

fn aborted(rank: usize, what: impl fmt::Display) -> Error {
    Error::InvalidUsage(format!("bootstrap: rank {rank} aborted while {what}"))
}

impl Bootstrap {
    /// Why this rank's listener cannot accept connections any more, if it
    /// cannot (that also sets the abort flag: the rank can take no part).
    pub(crate) fn broken(&self) -> Option<String> {
        self.shared.mailbox.lock().broken.clone()
    }

    /// Why this rank stopped while `doing` something: its listener broke,
    /// or it was aborted.
    fn stopped(&self, doing: impl fmt::Display) -> Error {
        match self.broken() {
            Some(why) => Error::System(format!("bootstrap: {why} (while {doing})")),
            None => aborted(self.rank, doing),
        }
    }

    /// Connects to the root named by `id`, registers this rank's listener
    /// address and learns every rank's. All ranks must pass the same
    /// `nranks`; a duplicate rank or an `nranks` mismatch is reported to
    /// every rank by the root (`InvalidUsage`). `timeout` bounds init and
    /// every later wait; `abort` cancels any wait within ~10 ms.
    pub fn init(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        timeout: Duration,
        abort: Arc<AtomicBool>,
    ) -> Result<Bootstrap> {
        if nranks == 0 || rank >= nranks || nranks > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "bootstrap: rank {rank} is out of range for nranks={nranks}"
            )));
        }
        let root = id.root_addr()?;
        let secret = id.secret()?;
        let start = Instant::now();
        let deadline = after(start, timeout);
        // A root on loopback means a single-host communicator: stay on
        // loopback too.
        let ip = if root.ip().is_loopback() {
            root.ip()
        } else {
            host_address()?
        };
        let psk = auth_tcp::encryption();
        let mut listener = AuthListener::bind_with(SocketAddr::new(ip, 0), secret, psk.clone())
            .map_err(|e| {
                Error::io(
                    format!("bootstrap: rank {rank} binding its listener on {ip}"),
                    e,
                )
            })?;
        listener
            .set_handshake_timeout(timeout.clamp(Duration::from_millis(100), HANDSHAKE_TIMEOUT));
        let me = listener.local_addr();

        let hello = Registration {
            rank,
            nranks,
            timeout,
            listen: me,
            pid: std::process::id(),
            host: crate::net::hostname(),
        }
        .encode();
        let mut stream =
            auth_tcp::connect_with(root, &secret, psk.as_ref(), &hello, deadline, &abort).map_err(
                |e| match e.kind() {
                    io::ErrorKind::Interrupted => {
                        aborted(rank, format_args!("connecting to the root at {root}"))
                    }
                    io::ErrorKind::TimedOut => Error::System(format!(
                "bootstrap: timed out after {} connecting rank {rank} to the root at {root}: {e}",
                secs(timeout)
            )),
                    io::ErrorKind::PermissionDenied if id.flags() & FLAG_FROM_ADDRESS != 0 => {
                        Error::InvalidUsage(format!(
                        "bootstrap: rank {rank}: the root at {root} refused this rank's secret: \
                         another job is using this address, or the ranks of this job derived \
                         different secrets (they must share NCCL_COMM_SECRET, or the key file \
                         RCCL_KEY_FILE / ~/.rccl/key and the launcher's job name): {e}"
                    ))
                    }
                    io::ErrorKind::PermissionDenied => Error::InvalidUsage(format!(
                        "bootstrap: rank {rank}: the root at {root} refused this rank's secret: \
                     it serves another unique id: {e}"
                    )),
                    _ => Error::Remote(format!(
                        "bootstrap: rank {rank} cannot register at the root at {root}: {e}"
                    )),
                },
            )?;
        // The root answers when the earliest rank's timeout passes: give it
        // a little longer than ours to say who is missing.
        let grace = (timeout / 2).clamp(Duration::from_millis(200), Duration::from_secs(2));
        let answer = auth_tcp::read_frame_until(&mut stream, MAX_FRAME, after(deadline, grace), &abort)
            .map_err(|e| match e.kind() {
                io::ErrorKind::Interrupted => aborted(rank, format_args!("waiting for the root at {root}")),
                io::ErrorKind::TimedOut => Error::System(format!(
                    "bootstrap: timed out after {} waiting for the root at {root} to collect all {nranks} ranks (rank {rank} got no answer)",
                    secs(start.elapsed())
                )),
                _ => Error::Remote(format!(
                    "bootstrap: the root at {root} failed before answering rank {rank}: {e}"
                )),
            })?;
        drop(stream);
        let peers = Bootstrap::parse_table(&answer, rank, nranks, root, me)?;

        let shared = Arc::new(Shared {
            mailbox: Mutex::new(Mailbox::default()),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
            sinks: Mutex::new(HashMap::new()),
        });
        let (wake, wake_rx) = UnixStream::pair()
            .map_err(|e| Error::io("bootstrap: creating a wake-up socket pair", e))?;
        wake_rx
            .set_nonblocking(true)
            .map_err(|e| Error::io("bootstrap: configuring the wake-up socket", e))?;
        let receiver = Receiver {
            listener,
            shared: shared.clone(),
            abort: abort.clone(),
            wake: wake_rx,
            rank,
            nranks,
            peers: peers.clone(),
            conns: Vec::new(),
        };
        let thread = thread::Builder::new()
            .name(format!("rccl-boot-{rank}"))
            .spawn(move || receiver.run())
            .map_err(|e| Error::io("bootstrap: starting the listener thread", e))?;
        Ok(Bootstrap {
            rank,
            nranks,
            secret,
            psk,
            timeout,
            abort,
            out: (0..nranks).map(|_| Mutex::new(None)).collect(),
            peers,
            seq: AtomicU64::new(0),
            shared,
            wake,
            thread: Some(thread),
        })
    }

    fn parse_table(
        answer: &[u8],
        rank: usize,
        nranks: usize,
        root: SocketAddr,
        me: SocketAddr,
    ) -> Result<Vec<SocketAddr>> {
        let bad = |why: &str| {
            Error::Remote(format!(
                "bootstrap: rank {rank} got a malformed answer from the root at {root}: {why}"
            ))
        };
        let (&status, body) = answer.split_first().ok_or_else(|| bad("empty"))?;
        match status {
            ROOT_OK => {}
            ROOT_USAGE => return Err(Error::InvalidUsage(String::from_utf8_lossy(body).into())),
            ROOT_SYSTEM => return Err(Error::System(String::from_utf8_lossy(body).into())),
            s => return Err(bad(&format!("status {s}"))),
        }
        if body.len() != 4 + nranks * ADDR_LEN || read_u32(body, 0) as usize != nranks {
            return Err(bad("address table of the wrong size"));
        }
        let peers = body[4..]
            .chunks_exact(ADDR_LEN)
            .map(decode_addr)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(&e))?;
        if peers[rank] != me {
            return Err(bad(&format!(
                "it lists {} for this rank, which listens on {me}",
                peers[rank]
            )));
        }
        Ok(peers)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The communicator's secret (for the data transports' handshakes).
    pub fn secret(&self) -> Secret {
        self.secret
    }

    /// Records, for this rank's peers in the same process, that it failed
    /// with `note` (the first note stays).
    pub(crate) fn record_failure(&self, note: &str) {
        in_process::record(self.peers[self.rank], note);
    }

    /// Why `peer` failed, if it runs in this process and did. Only for a
    /// peer known to be of this process: listener addresses are unique
    /// within one network namespace, not across them.
    pub(crate) fn failure_in_process(&self, peer: usize) -> Option<String> {
        in_process::failure(self.peers[peer])
    }

    /// The bootstrap listener of `rank` (its IP is that rank's host
    /// address).
    ///
    /// # Panics
    /// If `rank >= nranks`.
    pub fn peer_addr(&self, rank: usize) -> SocketAddr {
        self.peers[rank]
    }

    /// Whether a connection from `peer` was read to its end: everything
    /// `peer` sent on it before it closed (a failure note included) is in
    /// the mailbox.
    pub(crate) fn read_to_end(&self, peer: usize) -> bool {
        self.shared.mailbox.lock().gone.contains_key(&peer)
    }

    /// How `peer`'s bootstrap connection with this rank ended, if it did:
    /// its connection to this rank closed or broke, or this rank's
    /// connection to it reads the end of the stream or an error (a peer
    /// never writes on a connection this rank opened, so either means its
    /// end closed: its process exited or its communicator went away).
    pub(crate) fn peer_gone(&self, peer: usize) -> Option<String> {
        {
            let mailbox = self.shared.mailbox.lock();
            if let Some(why) = mailbox.gone.get(&peer) {
                return Some(why.clone());
            }
            // What it sent before it went is still being read: it is
            // gone once that is done (a one-sided fence, a failure note).
            if mailbox.reading.get(&peer).is_some_and(|&open| open > 0) {
                return None;
            }
        }
        // A sender holds the connection only while it writes.
        let slot = self.out.get(peer)?.try_lock()?;
        // The listener sends nothing after the handshake, encrypted or not.
        let stream = slot.as_ref()?.tcp();
        stream.set_nonblocking(true).ok()?;
        let ended = match stream.peek(&mut [0u8; 1]) {
            Ok(0) => Some("closed its bootstrap connection".to_string()),
            Ok(_) => None,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => Some(format!("broke its bootstrap connection ({e})")),
        };
        stream.set_nonblocking(false).ok()?;
        ended
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::InvalidArgument(format!(
                "bootstrap: peer {peer} is out of range for nranks={}",
                self.nranks
            )));
        }
        Ok(())
    }

    /// Sends `data` to `peer` under `tag`; `peer` receives it with
    /// [`Bootstrap::recv`] with the same tag. Messages with one tag from one
    /// sender arrive in order.
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.send_kind(peer, KIND_USER, tag, data, self.timeout)
    }

    /// As [`Bootstrap::send`], giving up if no connection to `peer` can be
    /// made within `connect_within` (for word that is worth little late).
    pub fn send_within(
        &self,
        peer: usize,
        tag: u64,
        data: &[u8],
        connect_within: Duration,
    ) -> Result<()> {
        self.send_kind(peer, KIND_USER, tag, data, connect_within)
    }

    /// Receives the next message `peer` sent under `tag`, waiting at most
    /// the bootstrap timeout (or until the abort flag is set).
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.recv_kind(peer, KIND_USER, tag, || format!("a message with tag {tag}"))
    }

    /// As [`Bootstrap::recv`], but `Ok(None)` once `until` passes with
    /// nothing received (the bootstrap timeout does not apply).
    pub fn recv_until(&self, peer: usize, tag: u64, until: Instant) -> Result<Option<Vec<u8>>> {
        self.recv_kind_until(peer, KIND_USER, tag, until, || {
            format!("a message with tag {tag}")
        })
    }

    /// Takes every message received so far under `tag`, from any rank, in
    /// the order each rank sent them.
    pub fn take_all(&self, tag: u64) -> Vec<(usize, Vec<u8>)> {
        let mut mb = self.shared.mailbox.lock();
        let keys: Vec<(usize, u8, u64)> = mb
            .msgs
            .keys()
            .filter(|&&(_, kind, t)| kind == KIND_USER && t == tag)
            .copied()
            .collect();
        keys.into_iter()
            .flat_map(|key| {
                let queue = mb.msgs.remove(&key).unwrap_or_default();
                queue.into_iter().map(move |msg| (key.0, msg))
            })
            .collect()
    }

    /// Hands every later message under `tag` to `sink` as it arrives,
    /// on the listener thread (which `sink` must never keep waiting),
    /// instead of filing it for [`Bootstrap::recv`].
    pub(crate) fn set_sink(&self, tag: u64, sink: Sink) {
        self.shared.sinks.lock().insert(tag, sink);
    }

    /// Removes every sink; returns once none runs any more. Later
    /// messages under their tags are filed in the mailbox.
    pub(crate) fn stop_sinks(&self) {
        self.shared.sinks.lock().clear();
    }

    fn send_kind(
        &self,
        peer: usize,
        kind: u8,
        tag: u64,
        data: &[u8],
        connect_within: Duration,
    ) -> Result<()> {
        self.check_peer(peer)?;
        if data.len() > MAX_FRAME - MSG_HEADER {
            return Err(Error::InvalidArgument(format!(
                "bootstrap: a message of {} bytes exceeds the limit of {} bytes",
                data.len(),
                MAX_FRAME - MSG_HEADER
            )));
        }
        if self.abort.load(Ordering::Relaxed) {
            return Err(self.stopped(format_args!("sending to rank {peer}")));
        }
        if peer == self.rank {
            self.shared.deliver(peer, kind, tag, data);
            return Ok(());
        }
        let addr = self.peers[peer];
        let mut slot = self.out[peer].lock();
        if slot.is_none() {
            let mut hello = Vec::with_capacity(12);
            hello.extend_from_slice(&PEER_MAGIC);
            hello.extend_from_slice(&(self.rank as u32).to_le_bytes());
            hello.extend_from_slice(&(self.nranks as u32).to_le_bytes());
            let stream = auth_tcp::connect_with(
                addr,
                &self.secret,
                self.psk.as_ref(),
                &hello,
                after(Instant::now(), connect_within),
                &self.abort,
            )
            .map_err(|e| {
                if e.kind() == io::ErrorKind::Interrupted {
                    self.stopped(format_args!("connecting to rank {peer} at {addr}"))
                } else {
                    Error::Remote(format!(
                        "bootstrap: rank {} cannot reach rank {peer} at {addr}: {e}",
                        self.rank
                    ))
                }
            })?;
            stream
                .tcp()
                .set_write_timeout(Some(self.timeout.max(Duration::from_millis(1))))
                .map_err(|e| Error::io("bootstrap: setting a write timeout", e))?;
            *slot = Some(stream);
        }
        let mut frame = Vec::with_capacity(4 + MSG_HEADER + data.len());
        frame.extend_from_slice(&((MSG_HEADER + data.len()) as u32).to_le_bytes());
        frame.push(kind);
        frame.extend_from_slice(&tag.to_le_bytes());
        frame.extend_from_slice(data);
        let stream = slot.as_mut().expect("connected above");
        if let Err(e) = stream.write_all(&frame) {
            *slot = None;
            return Err(Error::Remote(format!(
                "bootstrap: rank {} sending {} bytes to rank {peer} at {addr} failed: {e}",
                self.rank,
                data.len()
            )));
        }
        Ok(())
    }

    fn recv_kind(
        &self,
        peer: usize,
        kind: u8,
        tag: u64,
        what: impl Fn() -> String,
    ) -> Result<Vec<u8>> {
        let deadline = after(Instant::now(), self.timeout);
        self.recv_kind_until(peer, kind, tag, deadline, &what)?
            .ok_or_else(|| {
                Error::System(format!(
                    "bootstrap: timed out after {} waiting for rank {peer} at {} to send {} to rank {}",
                    secs(self.timeout),
                    self.peers[peer],
                    what(),
                    self.rank
                ))
            })
    }

    fn recv_kind_until(
        &self,
        peer: usize,
        kind: u8,
        tag: u64,
        deadline: Instant,
        what: impl Fn() -> String,
    ) -> Result<Option<Vec<u8>>> {
        self.check_peer(peer)?;
        let key = (peer, kind, tag);
        let mut mb = self.shared.mailbox.lock();
        loop {
            if let Some(queue) = mb.msgs.get_mut(&key) {
                if let Some(msg) = queue.pop_front() {
                    if queue.is_empty() {
                        mb.msgs.remove(&key);
                    }
                    return Ok(Some(msg));
                }
            }
            if let Some(why) = &mb.broken {
                return Err(Error::System(format!(
                    "bootstrap: {why} (while waiting for {} from rank {peer})",
                    what()
                )));
            }
            if let Some(why) = mb.gone.get(&peer) {
                return Err(Error::Remote(format!(
                    "bootstrap: rank {peer} at {} {why} while rank {} was waiting for {}",
                    self.peers[peer],
                    self.rank,
                    what()
                )));
            }
            if self.abort.load(Ordering::Relaxed) {
                return Err(aborted(
                    self.rank,
                    format_args!("waiting for {} from rank {peer}", what()),
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.shared
                .cond
                .wait_for(&mut mb, (deadline - now).min(ABORT_POLL));
        }
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) << 32
    }

    /// Gathers every rank's bytes: `result[r]` is what rank `r` passed
    /// (lengths may differ). A ring: n-1 steps, each sending to rank+1 what
    /// came from rank-1. All ranks must call the collectives in the same
    /// order.
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (n, rank) = (self.nranks, self.rank);
        let seq = self.next_seq();
        let mut out = vec![Vec::new(); n];
        out[rank] = mine.to_vec();
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        for step in 0..n.saturating_sub(1) {
            let send_idx = (rank + n - step) % n;
            let recv_idx = (rank + 2 * n - step - 1) % n;
            let tag = seq | step as u64;
            self.send_kind(next, KIND_COLL, tag, &out[send_idx], self.timeout)?;
            out[recv_idx] = self.recv_kind(prev, KIND_COLL, tag, || {
                format!(
                    "allgather #{} step {step} (rank {recv_idx}'s data)",
                    seq >> 32
                )
            })?;
        }
        Ok(out)
    }

    /// Returns once every rank has entered the barrier (a dissemination
    /// barrier: log2(n) rounds).
    pub fn barrier(&self) -> Result<()> {
        let (n, rank) = (self.nranks, self.rank);
        let seq = self.next_seq();
        let mut dist = 1;
        let mut round = 0u64;
        while dist < n {
            let tag = seq | round;
            self.send_kind((rank + dist) % n, KIND_COLL, tag, &[], self.timeout)?;
            self.recv_kind((rank + n - dist) % n, KIND_COLL, tag, || {
                format!("barrier #{} round {round}", seq >> 32)
            })?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = (&self.wake).write(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        in_process::forget(self.peers[self.rank]);
    }
}

/// One incoming connection from another rank.
struct Conn {
    stream: AuthStream,
    from: usize,
    buf: Vec<u8>,
}

/// The listener thread: accepts authenticated connections from other
/// ranks and files their messages into the mailbox.
struct Receiver {
    listener: AuthListener,
    shared: Arc<Shared>,
    /// Set when the listener breaks: this rank can take no part any more,
    /// so its own waits (a connection's handshake too) stop at once.
    abort: Arc<AtomicBool>,
    wake: UnixStream,
    rank: usize,
    nranks: usize,
    peers: Vec<SocketAddr>,
    conns: Vec<Conn>,
}

impl Receiver {
    fn run(mut self) {
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        while !self.shared.stop.load(Ordering::SeqCst) {
            // The wake-up socket, the connections (`pfds[1..=conns]`), then
            // the listener's descriptors.
            pfds.clear();
            for fd in std::iter::once(self.wake.as_raw_fd())
                .chain(self.conns.iter().map(|c| c.stream.as_raw_fd()))
                .chain(self.listener.poll_fds())
            {
                pfds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let wait = self.listener.poll_timeout(Duration::from_secs(1));
            let ms = wait.as_millis().clamp(1, 1000) as libc::c_int;
            // SAFETY: `pfds` is a valid array of `pfds.len()` initialised
            // pollfds that outlives the call.
            let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::warn!(rank = self.rank, "bootstrap: poll failed: {e}");
                    thread::sleep(ABORT_POLL);
                }
                continue;
            }
            if self.shared.stop.load(Ordering::SeqCst) {
                break;
            }
            // Read before accepting, while `pfds[1..=conns]` match `conns`.
            let ready: Vec<usize> = (0..self.conns.len())
                .filter(|&i| pfds[i + 1].revents != 0)
                .collect();
            let finished: Vec<usize> = ready.into_iter().filter(|&i| !self.drain(i)).collect();
            // Highest first, so each swap_remove moves a live connection.
            for i in finished.into_iter().rev() {
                self.conns.swap_remove(i);
            }
            if pfds[0].revents != 0 {
                let mut b = [0u8; 16];
                let _ = (&self.wake).read(&mut b);
            }
            // Handshakes also expire without any descriptor being ready.
            self.accept();
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept_pending() {
                Ok(Some((stream, hello))) => self.admit(stream, &hello),
                Ok(None) => return,
                Err(e) => {
                    // This rank's waits fail at once with the reason rather
                    // than at their deadline.
                    let mut mailbox = self.shared.mailbox.lock();
                    if mailbox.broken.is_none() {
                        tracing::warn!(rank = self.rank, "bootstrap: accept failed: {e}");
                        mailbox.broken = Some(format!(
                            "rank {} cannot accept connections from other ranks: {e}",
                            self.rank
                        ));
                        self.abort.store(true, Ordering::SeqCst);
                        self.shared.cond.notify_all();
                    }
                    drop(mailbox);
                    thread::sleep(ABORT_POLL);
                    return;
                }
            }
        }
    }

    /// Takes an authenticated connection from another rank.
    fn admit(&mut self, stream: AuthStream, hello: &[u8]) {
        let from_addr = stream.peer_addr().ok();
        let ok = hello.len() == 12
            && hello[..4] == PEER_MAGIC
            && read_u32(hello, 8) as usize == self.nranks
            && (read_u32(hello, 4) as usize) < self.nranks;
        if !ok {
            tracing::warn!(
                rank = self.rank,
                remote = ?from_addr,
                "bootstrap: refusing a connection with a malformed hello"
            );
            return;
        }
        let from = read_u32(hello, 4) as usize;
        if let Err(e) = stream.tcp().set_nonblocking(true) {
            tracing::warn!(
                rank = self.rank,
                "bootstrap: cannot use the connection from rank {from}: {e}"
            );
            return;
        }
        let mut mailbox = self.shared.mailbox.lock();
        mailbox.gone.remove(&from);
        *mailbox.reading.entry(from).or_default() += 1;
        drop(mailbox);
        self.conns.push(Conn {
            stream,
            from,
            buf: Vec::new(),
        });
    }

    /// Reads what connection `i` has; files complete messages. False when
    /// the connection is finished (closed, failed or misbehaving).
    fn drain(&mut self, i: usize) -> bool {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            let conn = &mut self.conns[i];
            match conn.stream.read(&mut chunk) {
                Ok(0) => {
                    let why = if conn.buf.is_empty() {
                        "closed its bootstrap connection".to_string()
                    } else {
                        format!(
                            "closed its bootstrap connection in the middle of a message ({} bytes pending)",
                            conn.buf.len()
                        )
                    };
                    self.shared.mark_gone(conn.from, why);
                    return false;
                }
                Ok(n) => {
                    conn.buf.extend_from_slice(&chunk[..n]);
                    if let Err(why) = self.parse(i) {
                        let from = self.conns[i].from;
                        tracing::warn!(
                            rank = self.rank,
                            "bootstrap: rank {from} at {} {why}; closing its connection",
                            self.peers[from]
                        );
                        self.shared.mark_gone(from, why);
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.shared
                        .mark_gone(conn.from, format!("broke its bootstrap connection ({e})"));
                    return false;
                }
            }
        }
    }

    fn parse(&mut self, i: usize) -> std::result::Result<(), String> {
        let conn = &mut self.conns[i];
        let mut at = 0;
        while conn.buf.len() - at >= 4 {
            let len = read_u32(&conn.buf, at) as usize;
            if !(MSG_HEADER..=MAX_FRAME).contains(&len) {
                return Err(format!("sent a malformed bootstrap message of {len} bytes"));
            }
            if conn.buf.len() - at - 4 < len {
                break;
            }
            let body = &conn.buf[at + 4..at + 4 + len];
            let kind = body[0];
            if kind != KIND_USER && kind != KIND_COLL {
                return Err(format!("sent a bootstrap message of unknown kind {kind}"));
            }
            let tag = read_u64(body, 1);
            self.shared
                .deliver(conn.from, kind, tag, &body[MSG_HEADER..]);
            at += 4 + len;
        }
        conn.buf.drain(..at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn loopback_listener() -> AuthListener {
        AuthListener::bind((Ipv4Addr::LOCALHOST, 0).into(), Secret::random()).unwrap()
    }

    fn refuses_connections(addr: SocketAddr) -> bool {
        TcpStream::connect(addr).is_err_and(|e| e.kind() == io::ErrorKind::ConnectionRefused)
    }

    #[test]
    fn a_root_nobody_registers_at_releases_its_port_at_its_expiry() {
        let listener = loopback_listener();
        let addr = listener.local_addr();
        let mut root = Root::new(listener, false);
        root.deadline = Instant::now() + Duration::from_millis(200);
        spawn_root(root).unwrap();
        let t = Instant::now();
        while !refuses_connections(addr) && t.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(refuses_connections(addr));
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
    }

    /// Two ranks of a job its launcher does not name complete the
    /// rendezvous; a rank 1 of another job arrives 50 ms later. Without the
    /// settling wait the first job would have formed with whichever rank 1
    /// came first.
    #[test]
    fn an_unnamed_job_settles_so_a_late_duplicate_fails_everyone() {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let id = UniqueId::encode(
            (Ipv4Addr::LOCALHOST, port).into(),
            &Secret::random(),
            FLAG_FROM_ADDRESS | FLAG_UNNAMED_JOB,
        );
        id.serve_root().unwrap();
        let abort = || Arc::new(AtomicBool::new(false));
        let init = move |rank: usize, delay: u64| {
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(delay));
                Bootstrap::init(&id, rank, 2, Duration::from_secs(10), abort())
            })
        };
        let ranks = [init(0, 0), init(1, 0), init(1, 50)];
        for h in ranks {
            let e = h.join().unwrap().unwrap_err();
            assert!(
                matches!(&e, Error::InvalidUsage(m) if m.contains("registered twice")),
                "{e}"
            );
        }
    }
}

/// Fuzzing of the bootstrap's wire decoders over arbitrary bytes: they
/// refuse or decode, never panic (bounded cases, part of `cargo test`).
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn addresses_decode_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(addr) = decode_addr(&bytes) {
                let mut again = Vec::new();
                encode_addr(&addr, &mut again);
                prop_assert_eq!(decode_addr(&again), Ok(addr));
            }
        }

        #[test]
        fn unique_ids_decode_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 128), keep_magic in any::<bool>()) {
            let mut raw: [u8; 128] = bytes.try_into().unwrap();
            if keep_magic {
                raw[..4].copy_from_slice(&UID_MAGIC);
                raw[4] = UID_VERSION;
            }
            let id = UniqueId(raw);
            let _ = id.root_addr();
            let _ = id.secret();
            let _ = format!("{id:?}");
        }

        #[test]
        fn registrations_decode_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..80), keep_magic in any::<bool>()) {
            let mut bytes = bytes;
            if keep_magic && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&REG_MAGIC);
            }
            if let Some(reg) = Registration::decode(&bytes) {
                let again = reg.encode();
                let back = Registration::decode(&again).expect("an encoded registration decodes");
                prop_assert_eq!((back.rank, back.nranks, back.listen, back.pid), (reg.rank, reg.nranks, reg.listen, reg.pid));
            }
        }

        #[test]
        fn root_answers_decode_or_refuse(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            nranks in 1usize..6,
            rank in 0usize..6,
        ) {
            let root: SocketAddr = "127.0.0.1:9".parse().unwrap();
            let me: SocketAddr = "127.0.0.1:10".parse().unwrap();
            let _ = Bootstrap::parse_table(&bytes, rank % nranks, nranks, root, me);
        }
    }
}
