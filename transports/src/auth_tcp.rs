//! Authenticated TCP connections.
//!
//! Every connection between ranks (the bootstrap network and the TCP data
//! transport) starts with a mutual challenge-response handshake over a
//! 32-byte shared [`Secret`], so the secret never crosses the wire and no
//! message of one handshake can be replayed in another:
//!
//! 1. server → client: `MAGIC`, protocol version (u32 LE), server nonce (32 B)
//! 2. client → server: `MAGIC`, protocol version, client nonce (32 B),
//!    `HMAC-SHA256(secret, "rccl-rs client" || server nonce || client nonce)`
//! 3. server verifies (constant time), then → client:
//!    `HMAC-SHA256(secret, "rccl-rs server" || server nonce || client nonce)`
//! 4. client verifies, then sends its *hello* (an opaque purpose payload of at
//!    most [`MAX_HELLO`] bytes) as one frame.
//!
//! Frames are a little-endian `u32` length followed by that many bytes.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The first bytes of both handshake messages.
pub(crate) const MAGIC: [u8; 8] = *b"RCCLAUTH";
/// The handshake protocol version.
pub(crate) const VERSION: u32 = 1;
pub(crate) const NONCE_LEN: usize = 32;
pub(crate) const MAC_LEN: usize = 32;
/// Server greeting: magic, version, server nonce.
pub(crate) const GREETING_LEN: usize = 8 + 4 + NONCE_LEN;
/// Client response: magic, version, client nonce, client MAC.
pub(crate) const RESPONSE_LEN: usize = 8 + 4 + NONCE_LEN + MAC_LEN;
pub(crate) const CLIENT_LABEL: &[u8] = b"rccl-rs client";
pub(crate) const SERVER_LABEL: &[u8] = b"rccl-rs server";

/// The largest hello payload [`connect`] may send.
pub const MAX_HELLO: usize = 4096;

/// How long a handshake may take by default, on either side.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often blocking waits wake up to check a stop flag.
const POLL_SLICE: Duration = Duration::from_millis(10);

/// A stop flag that never becomes true.
static NEVER: AtomicBool = AtomicBool::new(false);

/// A 32-byte secret shared by the members of one communicator.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; 32]);

impl Secret {
    /// A fresh secret from the operating system's random source.
    ///
    /// # Panics
    /// If the operating system cannot provide random bytes (no `getrandom`
    /// syscall and no readable `/dev/urandom`): there is no safe fallback.
    pub fn random() -> Secret {
        let mut bytes = [0u8; 32];
        fill_random(&mut bytes).expect("rccl-rs: the OS random source is unavailable");
        Secret(bytes)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Fills `buf` with random bytes from the OS (`getrandom(2)`, falling back
/// to `/dev/urandom`).
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes
        // for the duration of the call; getrandom writes at most that many.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOSYS) | Some(libc::EPERM) => {
                    return std::fs::File::open("/dev/urandom")?.read_exact(rest);
                }
                _ => return Err(err),
            }
        }
        filled += n as usize;
    }
    Ok(())
}

pub(crate) fn nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    fill_random(&mut n)?;
    Ok(n)
}

pub(crate) fn mac(
    secret: &Secret,
    label: &[u8],
    server_nonce: &[u8],
    client_nonce: &[u8],
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(&secret.0).expect("HMAC accepts any key length");
    m.update(label);
    m.update(server_nonce);
    m.update(client_nonce);
    m
}

fn err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

fn timed_out(what: &str) -> io::Error {
    err(io::ErrorKind::TimedOut, format!("timed out {what}"))
}

fn interrupted() -> io::Error {
    err(io::ErrorKind::Interrupted, "stopped")
}

/// `t + d`, saturating far in the future instead of overflowing.
fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// Time left until `deadline`, at least 1 ms (socket timeouts refuse zero).
fn slice_until(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(1), POLL_SLICE)
}

/// Reads exactly `buf.len()` bytes, giving up with `TimedOut` at `deadline`
/// and with `Interrupted` soon after `stop` becomes true. The stream's read
/// timeout is changed; partial reads are never lost.
pub fn read_exact_until(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        if stop.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        if Instant::now() >= deadline {
            return Err(timed_out(&format!(
                "reading ({filled} of {} bytes received)",
                buf.len()
            )));
        }
        stream.set_read_timeout(Some(slice_until(deadline)))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(err(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed by the peer ({filled} of {} bytes received)",
                        buf.len()
                    ),
                ))
            }
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`read_frame`] with a deadline and a stop flag, as [`read_exact_until`].
pub fn read_frame_until(
    stream: &mut TcpStream,
    max_len: usize,
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<Vec<u8>> {
    let mut header = [0u8; 4];
    read_exact_until(stream, &mut header, deadline, stop)?;
    let len = check_len(header, max_len)?;
    let mut payload = vec![0u8; len];
    read_exact_until(stream, &mut payload, deadline, stop)?;
    Ok(payload)
}

fn check_len(header: [u8; 4], max_len: usize) -> io::Result<usize> {
    let len = u32::from_le_bytes(header) as usize;
    if len > max_len {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the limit of {max_len} bytes"),
        ));
    }
    Ok(len)
}

/// Writes one frame: the payload's length as a little-endian `u32`, then
/// the payload.
pub fn write_frame(stream: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| {
        err(
            io::ErrorKind::InvalidInput,
            format!("frame of {} bytes is too long", payload.len()),
        )
    })?;
    if payload.len() <= 64 * 1024 {
        // One write, so a small frame leaves in one segment.
        let mut buf = Vec::with_capacity(4 + payload.len());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(payload);
        stream.write_all(&buf)
    } else {
        stream.write_all(&len.to_le_bytes())?;
        stream.write_all(payload)
    }
}

/// Reads one frame written by [`write_frame`]. A length above `max_len` is
/// refused with `InvalidData` before anything is allocated; the payload
/// buffer grows in steps as data arrives and never exceeds `max_len`.
pub fn read_frame(stream: &mut impl Read, max_len: usize) -> io::Result<Vec<u8>> {
    const STEP: usize = 1 << 20;
    let mut header = [0u8; 4];
    stream.read_exact(&mut header)?;
    let len = check_len(header, max_len)?;
    let mut payload = Vec::new();
    while payload.len() < len {
        let start = payload.len();
        let step = (len - start).min(STEP);
        payload.reserve_exact(step);
        payload.resize(start + step, 0);
        stream.read_exact(&mut payload[start..])?;
    }
    Ok(payload)
}

fn set_write_deadline(stream: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_write_timeout(Some(left))
}

pub(crate) fn check_header(buf: &[u8], peer: &str) -> io::Result<()> {
    if buf[..8] != MAGIC {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("bad handshake magic (the {peer} is not rccl-rs)"),
        ));
    }
    let version = u32::from_le_bytes(buf[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("the {peer} speaks handshake version {version}, expected {VERSION}"),
        ));
    }
    Ok(())
}

/// Adds `context` to an I/O error, keeping its kind (and explaining a
/// lack of file descriptors).
fn context(e: io::Error, context: impl fmt::Display) -> io::Error {
    let e = crate::explain_fd_limit(e);
    io::Error::new(e.kind(), format!("{context}: {e}"))
}

/// Connects to `addr`, proves knowledge of `secret` (and checks that the
/// listener knows it too), then sends `hello` (an opaque purpose payload,
/// at most [`MAX_HELLO`] bytes).
///
/// A refused connection is retried with a short backoff until `deadline`
/// (the listener may not be up yet), and so is one the listener drops
/// after its greeting without refusing our proof (a busy listener sheds
/// its oldest unauthenticated handshakes); other failures, a refused proof
/// among them, are returned at once. The stream comes back blocking,
/// without timeouts, with `TCP_NODELAY`.
pub fn connect(
    addr: SocketAddr,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
) -> io::Result<TcpStream> {
    connect_until(addr, secret, hello, deadline, &NEVER)
}

/// [`connect`] that also gives up with `Interrupted` soon after `stop`
/// becomes true.
pub fn connect_until(
    addr: SocketAddr,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<TcpStream> {
    if hello.len() > MAX_HELLO {
        return Err(err(
            io::ErrorKind::InvalidInput,
            format!("hello of {} bytes exceeds {MAX_HELLO}", hello.len()),
        ));
    }
    let mut backoff = Duration::from_millis(5);
    loop {
        let mut stream = connect_tcp(addr, deadline, stop, &mut backoff)?;
        match client_handshake(&mut stream, secret, hello, deadline, stop) {
            Ok(()) => return Ok(stream),
            Err(Attempt::Final(e)) => {
                return Err(context(e, format_args!("handshake with {addr}")))
            }
            Err(Attempt::Dropped(e)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(context(e, format_args!("handshake with {addr}")));
                }
                back_off(&mut backoff, left);
            }
        }
    }
}

/// Sleeps `backoff` (at most `left`), then doubles it, up to 100 ms.
fn back_off(backoff: &mut Duration, left: Duration) {
    std::thread::sleep((*backoff).min(left));
    *backoff = (*backoff * 2).min(Duration::from_millis(100));
}

/// Opens the TCP connection, retrying refusals until `deadline`.
fn connect_tcp(
    addr: SocketAddr,
    deadline: Instant,
    stop: &AtomicBool,
    backoff: &mut Duration,
) -> io::Result<TcpStream> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(&format!("connecting to {addr}")));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(context(e, format_args!("connecting to {addr}")));
                }
                back_off(backoff, left);
            }
            Err(e) => return Err(context(e, format_args!("connecting to {addr}"))),
        }
    }
}

/// How a client's handshake attempt failed.
enum Attempt {
    /// The listener greeted us, then closed the connection without
    /// refusing our proof: it shed the handshake; another try may pass.
    Dropped(io::Error),
    Final(io::Error),
}

impl From<io::Error> for Attempt {
    fn from(e: io::Error) -> Attempt {
        Attempt::Final(e)
    }
}

fn client_handshake(
    stream: &mut TcpStream,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<(), Attempt> {
    stream.set_nodelay(true)?;
    set_write_deadline(stream, deadline)?;
    // A listener greets as soon as it accepts; on a loaded host that may
    // take a while, so wait until the deadline.
    let mut greeting = [0u8; GREETING_LEN];
    read_exact_until(stream, &mut greeting, deadline, stop)?;
    check_header(&greeting, "listener")?;
    let server_nonce = &greeting[12..];
    let client_nonce = nonce()?;
    let tag = mac(secret, CLIENT_LABEL, server_nonce, &client_nonce)
        .finalize()
        .into_bytes();
    let mut response = [0u8; RESPONSE_LEN];
    response[..8].copy_from_slice(&MAGIC);
    response[8..12].copy_from_slice(&VERSION.to_le_bytes());
    response[12..12 + NONCE_LEN].copy_from_slice(&client_nonce);
    response[12 + NONCE_LEN..].copy_from_slice(&tag);
    let dropped = |e: io::Error| {
        if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ) {
            Attempt::Dropped(err(
                e.kind(),
                format!("the listener dropped the connection before authenticating it: {e}"),
            ))
        } else {
            Attempt::Final(e)
        }
    };
    stream.write_all(&response).map_err(dropped)?;
    let proof_deadline = deadline.min(Instant::now() + DEFAULT_HANDSHAKE_TIMEOUT);
    let mut proof = [0u8; MAC_LEN];
    read_exact_until(stream, &mut proof, proof_deadline, stop).map_err(dropped)?;
    if proof == DENIED {
        return Err(Attempt::Final(err(
            io::ErrorKind::PermissionDenied,
            "the listener refused this connection's proof: it serves a different secret",
        )));
    }
    mac(secret, SERVER_LABEL, server_nonce, &client_nonce)
        .verify_slice(&proof)
        .map_err(|_| {
            err(
                io::ErrorKind::PermissionDenied,
                "the listener failed to prove it knows the secret",
            )
        })?;
    write_frame(stream, hello)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(())
}

/// Waits until one of `fds` is readable or `timeout` passes.
fn wait_readable(fds: &[RawFd], timeout: Duration) -> io::Result<()> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfds` is a valid array of `pfds.len()` initialised pollfds
    // that lives across the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Unauthenticated handshakes a listener holds at once from one source
/// address; a new connection from a source at the cap sheds that source's
/// oldest.
pub const MAX_PENDING_PER_SOURCE: usize = 32;
/// Unauthenticated handshakes a listener holds at once in all; a new
/// connection beyond it sheds the oldest.
pub const MAX_PENDING: usize = 128;
/// Connections accepted per [`AuthListener::progress`], so that a flood of
/// new ones cannot starve the handshakes already under way.
const ACCEPT_BATCH: usize = 64;

/// What a listener sends instead of its proof when the client's proof
/// fails, so that the client can tell a refusal from a shed handshake.
const DENIED: [u8; MAC_LEN] = *b"RCCLDENY: wrong secret, go away!";

/// Where a server-side handshake stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    /// Greeted; waiting for the client's response (unauthenticated).
    Response,
    /// Authenticated; waiting for the hello frame's length.
    HelloLength,
    /// Waiting for the hello's bytes.
    Hello,
}

/// One server-side handshake, driven without blocking.
struct Handshake {
    stream: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    nonce: [u8; NONCE_LEN],
    step: Step,
    /// Bytes of the current step so far, and how many it needs.
    buf: Vec<u8>,
    need: usize,
}

/// What one call to [`Handshake::advance`] came to.
enum Advance {
    Waiting,
    Done(Vec<u8>),
    Failed(io::Error),
}

impl Handshake {
    /// Takes an accepted `stream` and sends the greeting.
    fn start(stream: TcpStream, peer: SocketAddr, deadline: Instant) -> io::Result<Handshake> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let nonce = nonce()?;
        let mut greeting = [0u8; GREETING_LEN];
        greeting[..8].copy_from_slice(&MAGIC);
        greeting[8..12].copy_from_slice(&VERSION.to_le_bytes());
        greeting[12..].copy_from_slice(&nonce);
        write_whole(&stream, &greeting)?;
        Ok(Handshake {
            stream,
            peer,
            deadline,
            nonce,
            step: Step::Response,
            buf: Vec::with_capacity(RESPONSE_LEN),
            need: RESPONSE_LEN,
        })
    }

    fn authenticated(&self) -> bool {
        self.step != Step::Response
    }

    /// Reads what has arrived (never past the hello, so the client's first
    /// message stays in the socket) and moves through the steps.
    fn advance(&mut self, secret: &Secret) -> Advance {
        loop {
            while self.buf.len() < self.need {
                let have = self.buf.len();
                self.buf.resize(self.need, 0);
                let got = (&self.stream).read(&mut self.buf[have..]);
                self.buf.truncate(have + *got.as_ref().unwrap_or(&0));
                match got {
                    Ok(0) => {
                        return Advance::Failed(err(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "connection closed by the client ({have} of {} bytes of the {:?} step received)",
                                self.need, self.step
                            ),
                        ))
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Advance::Waiting,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Advance::Failed(e),
                }
            }
            match self.step {
                Step::Response => {
                    if let Err(e) = self.check_response(secret) {
                        return Advance::Failed(e);
                    }
                    self.step = Step::HelloLength;
                    self.need = 4;
                }
                Step::HelloLength => {
                    let header: [u8; 4] = self.buf[..4].try_into().expect("4 bytes read");
                    match check_len(header, MAX_HELLO) {
                        Ok(0) => return self.finish(Vec::new()),
                        Ok(len) => {
                            self.step = Step::Hello;
                            self.need = len;
                        }
                        Err(e) => return Advance::Failed(e),
                    }
                }
                Step::Hello => {
                    let hello = std::mem::take(&mut self.buf);
                    return self.finish(hello);
                }
            }
            self.buf.clear();
        }
    }

    /// Checks the client's response; answers with our proof, or with
    /// [`DENIED`] when the client's fails.
    fn check_response(&self, secret: &Secret) -> io::Result<()> {
        let response = &self.buf;
        check_header(response, "client")?;
        let client_nonce = &response[12..12 + NONCE_LEN];
        if mac(secret, CLIENT_LABEL, &self.nonce, client_nonce)
            .verify_slice(&response[12 + NONCE_LEN..])
            .is_err()
        {
            let _ = write_whole(&self.stream, &DENIED);
            return Err(err(
                io::ErrorKind::PermissionDenied,
                "authentication failed (wrong secret)",
            ));
        }
        let proof = mac(secret, SERVER_LABEL, &self.nonce, client_nonce)
            .finalize()
            .into_bytes();
        write_whole(&self.stream, &proof)
    }

    fn finish(&mut self, hello: Vec<u8>) -> Advance {
        match self.stream.set_nonblocking(false) {
            Ok(()) => Advance::Done(hello),
            Err(e) => Advance::Failed(e),
        }
    }
}

/// Writes `bytes` to a non-blocking socket at once: a handshake message is
/// far smaller than a fresh socket's send buffer, so a short write means a
/// broken connection.
fn write_whole(stream: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    loop {
        match (&*stream).write(bytes) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) => {
                return Err(err(
                    io::ErrorKind::WriteZero,
                    format!("the socket took {n} of {} handshake bytes", bytes.len()),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Counts of connections a listener turned away, for reports that must
/// not blame a peer for what strangers did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Handshakes that failed (wrong secret, garbage, timeout, closed).
    pub failed: u64,
    /// Unauthenticated handshakes shed to make room for newer ones.
    pub shed: u64,
    /// The last refused client and why.
    pub last: Option<(SocketAddr, String)>,
}

impl fmt::Display for Refusals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} connection(s) that failed the handshake and shed {} unauthenticated one(s)",
            self.failed, self.shed
        )?;
        if let Some((peer, why)) = &self.last {
            write!(f, "; the last from {peer}: {why}")?;
        }
        Ok(())
    }
}

/// Whether an error of accept(2) is the pending connection's own network
/// error, which Linux passes on through accept: that connection is lost,
/// the listener is fine.
fn is_pending_connection_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EPROTO
                | libc::ENOPROTOOPT
                | libc::ENETDOWN
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::EHOSTUNREACH
                | libc::ENONET
                | libc::EOPNOTSUPP
                | libc::EPERM
        )
    )
}

/// A TCP listener that only hands out connections whose client proved it
/// knows the secret.
///
/// Handshakes run concurrently, driven without blocking by
/// [`AuthListener::progress`]: a silent or slow client holds a slot for at
/// most the handshake timeout and delays nobody. At most
/// [`MAX_PENDING_PER_SOURCE`] unauthenticated handshakes per source
/// address and [`MAX_PENDING`] in all are held; a new connection beyond
/// that sheds the oldest (whose client, if it is one of ours, tries again).
pub struct AuthListener {
    listener: TcpListener,
    secret: Secret,
    local: SocketAddr,
    handshake_timeout: Duration,
    /// Handshakes under way, oldest first.
    pending: Vec<Handshake>,
    /// Authenticated connections not yet taken.
    ready: VecDeque<(TcpStream, Vec<u8>)>,
    refusals: Refusals,
}

impl fmt::Debug for AuthListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthListener")
            .field("local", &self.local)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl AuthListener {
    /// Binds `addr` (port 0: any free port).
    pub fn bind(addr: SocketAddr, secret: Secret) -> io::Result<AuthListener> {
        let listener =
            TcpListener::bind(addr).map_err(|e| context(e, format_args!("binding {addr}")))?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        Ok(AuthListener {
            listener,
            secret,
            local,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            pending: Vec::new(),
            ready: VecDeque::new(),
            refusals: Refusals::default(),
        })
    }

    /// The address the listener is bound to (with the real port).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// How long one client may take to complete its handshake.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    /// Sets how long one client may take to complete its handshake.
    pub fn set_handshake_timeout(&mut self, timeout: Duration) {
        self.handshake_timeout = timeout.max(Duration::from_millis(1));
    }

    /// The connections turned away so far.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// Accepts the next connection that authenticates, returning it with
    /// its hello payload. Connections that fail the handshake are closed,
    /// logged, and accepting continues.
    ///
    /// Returns `TimedOut` at `deadline` and `Interrupted` soon (within
    /// ~10 ms) after `stop` becomes true.
    pub fn accept(
        &mut self,
        deadline: Instant,
        stop: &AtomicBool,
    ) -> io::Result<(TcpStream, Vec<u8>)> {
        let mut fds = Vec::new();
        loop {
            if let Some(accepted) = self.accept_pending()? {
                return Ok(accepted);
            }
            if stop.load(Ordering::Relaxed) {
                return Err(interrupted());
            }
            if Instant::now() >= deadline {
                return Err(timed_out(&format!(
                    "waiting for a connection on {}",
                    self.local
                )));
            }
            fds.clear();
            fds.extend(self.poll_fds());
            wait_readable(&fds, self.poll_timeout(slice_until(deadline)))?;
        }
    }

    /// Drives the handshakes ([`AuthListener::progress`]) and returns an
    /// authenticated connection, if one is ready. Never blocks.
    pub fn accept_pending(&mut self) -> io::Result<Option<(TcpStream, Vec<u8>)>> {
        if self.ready.is_empty() {
            self.progress()?;
        }
        Ok(self.ready.pop_front())
    }

    /// The descriptors whose readability calls for
    /// [`AuthListener::progress`]: the listening socket and the handshakes
    /// under way.
    pub fn poll_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        std::iter::once(self.listener.as_raw_fd())
            .chain(self.pending.iter().map(|h| h.stream.as_raw_fd()))
    }

    /// `limit`, shortened to the next handshake deadline (but not below
    /// 1 ms, unless `limit` is): how long a poll over
    /// [`AuthListener::poll_fds`] may wait before
    /// [`AuthListener::progress`] has a handshake to expire. A caller
    /// serving several listeners passes what the others left, which may
    /// be nothing.
    pub fn poll_timeout(&self, limit: Duration) -> Duration {
        match self.pending.iter().map(|h| h.deadline).min() {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
                .min(limit),
            None => limit,
        }
    }

    /// Advances every handshake that can advance, drops those past their
    /// deadline, then accepts new connections and greets them. Never
    /// blocks; authenticated connections queue for
    /// [`AuthListener::accept_pending`]. An error from `accept(2)` (such
    /// as running out of file descriptors) is returned after the rest.
    pub fn progress(&mut self) -> io::Result<()> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let outcome = match self.pending[i].advance(&self.secret) {
                Advance::Waiting if now >= self.pending[i].deadline => Advance::Failed(err(
                    io::ErrorKind::TimedOut,
                    format!(
                        "timed out after {:?} in the {:?} step",
                        self.handshake_timeout, self.pending[i].step
                    ),
                )),
                outcome => outcome,
            };
            match outcome {
                Advance::Waiting => i += 1,
                Advance::Done(hello) => {
                    let h = self.pending.remove(i);
                    self.ready.push_back((h.stream, hello));
                }
                Advance::Failed(e) => {
                    let h = self.pending.remove(i);
                    self.refuse(h, e.to_string());
                }
            }
        }
        for _ in 0..ACCEPT_BATCH {
            let (stream, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) || is_pending_connection_error(&e) =>
                {
                    continue
                }
                // The listener itself cannot go on (out of file descriptors
                // or memory): accepting again would fail the same way.
                Err(e) => return Err(context(e, format_args!("accepting on {}", self.local))),
            };
            self.make_room(peer);
            let deadline = after(Instant::now(), self.handshake_timeout);
            match Handshake::start(stream, peer, deadline) {
                Ok(mut h) => match h.advance(&self.secret) {
                    Advance::Waiting => self.pending.push(h),
                    Advance::Done(hello) => self.ready.push_back((h.stream, hello)),
                    Advance::Failed(e) => self.refuse(h, e.to_string()),
                },
                Err(e) => self.note_refusal(peer, format!("greeting failed: {e}")),
            }
        }
        Ok(())
    }

    /// Sheds the oldest unauthenticated handshake from `peer`'s address if
    /// it is at its cap, and the oldest of all if the listener is.
    fn make_room(&mut self, peer: SocketAddr) {
        let unauthenticated = |h: &&Handshake| !h.authenticated();
        let from_peer = self
            .pending
            .iter()
            .filter(unauthenticated)
            .filter(|h| h.peer.ip() == peer.ip())
            .count();
        if from_peer >= MAX_PENDING_PER_SOURCE {
            self.shed(|h| h.peer.ip() == peer.ip());
        }
        if self.pending.iter().filter(unauthenticated).count() >= MAX_PENDING {
            self.shed(|_| true);
        }
    }

    fn shed(&mut self, which: impl Fn(&Handshake) -> bool) {
        if let Some(i) = self
            .pending
            .iter()
            .position(|h| !h.authenticated() && which(h))
        {
            let h = self.pending.remove(i);
            tracing::debug!(
                remote = %h.peer,
                listener = %self.local,
                "shed an unauthenticated handshake to make room"
            );
            self.refusals.shed += 1;
            let _ = h.stream.shutdown(Shutdown::Both);
        }
    }

    fn refuse(&mut self, h: Handshake, why: String) {
        tracing::warn!(
            remote = %h.peer,
            listener = %self.local,
            "rejected a connection that failed the handshake: {why}"
        );
        let _ = h.stream.shutdown(Shutdown::Both);
        self.note_refusal(h.peer, why);
    }

    fn note_refusal(&mut self, peer: SocketAddr, why: String) {
        self.refusals.failed += 1;
        self.refusals.last = Some((peer, why));
    }
}

impl AsRawFd for AuthListener {
    fn as_raw_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;
    use std::net::{IpAddr, Ipv4Addr};
    use std::thread;

    fn loopback() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
    }

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    fn listener(secret: Secret) -> AuthListener {
        let mut l = AuthListener::bind(loopback(), secret).unwrap();
        l.set_handshake_timeout(Duration::from_millis(200));
        l
    }

    /// A good client connects and exchanges a frame both ways.
    fn good_client(
        addr: SocketAddr,
        secret: Secret,
        hello: &'static [u8],
    ) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let mut s = connect(addr, &secret, hello, soon(5000)).unwrap();
            write_frame(&mut s, b"ping").unwrap();
            assert_eq!(read_frame(&mut s, 16).unwrap(), b"pong");
        })
    }

    fn serve_good(l: &mut AuthListener, hello: &[u8]) {
        let stop = AtomicBool::new(false);
        let (mut s, got) = l.accept(soon(5000), &stop).unwrap();
        assert_eq!(got, hello);
        assert!(s.nodelay().unwrap());
        assert_eq!(read_frame(&mut s, 16).unwrap(), b"ping");
        write_frame(&mut s, b"pong").unwrap();
    }

    #[test]
    fn secret_debug_hides_bytes() {
        let s = Secret([0xab; 32]);
        let d = format!("{s:?}");
        assert!(!d.contains("ab") && !d.contains("171"), "{d}");
        assert_ne!(Secret::random(), Secret::random());
    }

    #[test]
    fn connect_with_hello() {
        let secret = Secret::random();
        let mut l = listener(secret);
        let c = good_client(l.local_addr(), secret, b"hello there");
        serve_good(&mut l, b"hello there");
        c.join().unwrap();
    }

    #[test]
    fn empty_and_max_hello() {
        let secret = Secret::random();
        let mut l = listener(secret);
        let c = good_client(l.local_addr(), secret, b"");
        serve_good(&mut l, b"");
        c.join().unwrap();
        let big: &'static [u8] = Box::leak(vec![7u8; MAX_HELLO].into_boxed_slice());
        let c = good_client(l.local_addr(), secret, big);
        serve_good(&mut l, big);
        c.join().unwrap();
        let e = connect(l.local_addr(), &secret, &[0; MAX_HELLO + 1], soon(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn wrong_secret_refused_then_good_client_accepted() {
        let secret = Secret::random();
        let mut l = listener(secret);
        let addr = l.local_addr();
        let bad = thread::spawn(move || {
            let t = Instant::now();
            (
                connect(addr, &Secret::random(), b"x", soon(5000)),
                t.elapsed(),
            )
        });
        let stop = AtomicBool::new(false);
        // Only the bad client is there: nothing is accepted.
        let e = l.accept(soon(500), &stop).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let (e, took) = bad.join().unwrap();
        let e = e.unwrap_err();
        // Refused outright: not taken for a shed handshake and retried.
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("refused"), "{e}");
        assert!(took < Duration::from_secs(1), "{took:?}");
        let c = good_client(addr, secret, b"good");
        serve_good(&mut l, b"good");
        c.join().unwrap();
    }

    #[test]
    fn client_refuses_listener_with_other_secret() {
        // The client must not accept a listener that cannot prove the secret,
        // even if that listener skips verification: emulate one by hand.
        let raw = TcpListener::bind(loopback()).unwrap();
        let addr = raw.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = raw.accept().unwrap();
            let mut g = [0u8; GREETING_LEN];
            g[..8].copy_from_slice(&MAGIC);
            g[8..12].copy_from_slice(&VERSION.to_le_bytes());
            s.write_all(&g).unwrap();
            let mut r = [0u8; RESPONSE_LEN];
            s.read_exact(&mut r).unwrap();
            s.write_all(&[0u8; MAC_LEN]).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            rest
        });
        let e = connect(addr, &Secret::random(), b"secret hello", soon(5000)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        // The hello never reached the impostor.
        assert!(server.join().unwrap().is_empty());
    }

    #[test]
    fn garbage_truncated_and_silent_clients_refused() {
        let secret = Secret::random();
        let mut l = listener(secret);
        let addr = l.local_addr();
        // Garbage.
        let mut garbage = TcpStream::connect(addr).unwrap();
        garbage.write_all(&[0x55; 200]).unwrap();
        // Truncated: a valid header, then the connection ends.
        let mut truncated = TcpStream::connect(addr).unwrap();
        let mut partial = MAGIC.to_vec();
        partial.extend_from_slice(&VERSION.to_le_bytes());
        partial.extend_from_slice(&[1; 10]);
        truncated.write_all(&partial).unwrap();
        truncated.shutdown(Shutdown::Write).unwrap();
        // Silent: connects and sends nothing.
        let silent = TcpStream::connect(addr).unwrap();
        // Wrong protocol version.
        let mut version = TcpStream::connect(addr).unwrap();
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&99u32.to_le_bytes());
        v.resize(RESPONSE_LEN, 0);
        version.write_all(&v).unwrap();
        let c = good_client(addr, secret, b"after the bad ones");
        let t = Instant::now();
        serve_good(&mut l, b"after the bad ones");
        // One silent client costs at most one handshake timeout.
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        c.join().unwrap();
        drop((garbage, truncated, silent, version));
    }

    #[test]
    fn silent_clients_do_not_delay_a_real_one() {
        let secret = Secret::random();
        let mut l = listener(secret);
        l.set_handshake_timeout(Duration::from_secs(1));
        let addr = l.local_addr();
        let silent: Vec<TcpStream> = (0..60).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let c = good_client(addr, secret, b"among the silent");
        let t = Instant::now();
        serve_good(&mut l, b"among the silent");
        // One at a time, the silent ones would cost 60 handshake timeouts.
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        c.join().unwrap();
        drop(silent);
    }

    #[test]
    fn poll_timeout_never_exceeds_the_limit_given() {
        let mut l = listener(Secret::random());
        l.set_handshake_timeout(Duration::from_secs(30));
        let silent = TcpStream::connect(l.local_addr()).unwrap();
        while l.pending.is_empty() {
            l.progress().unwrap();
        }
        // What another listener's expired deadline leaves of a poll.
        assert_eq!(l.poll_timeout(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            l.poll_timeout(Duration::from_millis(5)),
            Duration::from_millis(5)
        );
        let waits = l.poll_timeout(Duration::from_secs(60));
        assert!(
            waits > Duration::from_secs(25) && waits <= Duration::from_secs(30),
            "{waits:?}"
        );
        drop(silent);
    }

    #[test]
    fn a_flood_from_one_source_is_capped_and_sheds_the_oldest() {
        let secret = Secret::random();
        let mut l = listener(secret);
        l.set_handshake_timeout(Duration::from_secs(30));
        let addr = l.local_addr();
        let flood = MAX_PENDING_PER_SOURCE + 20;
        let silent: Vec<TcpStream> = (0..flood)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let deadline = soon(5000);
        while l.pending.len() + (l.refusals().shed as usize) < flood && Instant::now() < deadline {
            l.progress().unwrap();
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(l.pending.len(), MAX_PENDING_PER_SOURCE);
        assert_eq!(l.refusals().shed as usize, flood - MAX_PENDING_PER_SOURCE);
        // The oldest went: the first client sees its connection closed.
        let mut first = &silent[0];
        first
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut greeting = [0u8; GREETING_LEN];
        first.read_exact(&mut greeting).unwrap();
        assert_eq!(first.read(&mut [0u8; 1]).unwrap(), 0);
        // The newest is still held, and a real client gets through.
        assert_eq!(
            l.pending.last().unwrap().peer,
            silent[flood - 1].local_addr().unwrap()
        );
        let c = good_client(addr, secret, b"after the flood");
        serve_good(&mut l, b"after the flood");
        c.join().unwrap();
    }

    #[test]
    fn a_client_whose_handshake_was_shed_tries_again() {
        // A listener that greets, takes the response, then drops the
        // connection (as a busy one sheds it), and comes back properly.
        let raw = TcpListener::bind(loopback()).unwrap();
        let addr = raw.local_addr().unwrap();
        let secret = Secret::random();
        let server = thread::spawn(move || {
            let (mut s, _) = raw.accept().unwrap();
            let mut g = [0u8; GREETING_LEN];
            g[..8].copy_from_slice(&MAGIC);
            g[8..12].copy_from_slice(&VERSION.to_le_bytes());
            s.write_all(&g).unwrap();
            let mut r = [0u8; RESPONSE_LEN];
            s.read_exact(&mut r).unwrap();
            drop((s, raw));
            let mut l = AuthListener::bind(addr, secret).unwrap();
            serve_good(&mut l, b"second try");
        });
        let mut s = connect(addr, &secret, b"second try", soon(5000)).unwrap();
        write_frame(&mut s, b"ping").unwrap();
        assert_eq!(read_frame(&mut s, 16).unwrap(), b"pong");
        server.join().unwrap();
    }

    #[test]
    fn accept_times_out_and_stops() {
        let mut l = listener(Secret::random());
        let stop = AtomicBool::new(false);
        let t = Instant::now();
        let e = l.accept(soon(100), &stop).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(100));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let setter = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            s2.store(true, Ordering::Relaxed);
        });
        let t = Instant::now();
        let e = l.accept(soon(10_000), &stop).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        assert!(t.elapsed() < Duration::from_secs(1));
        setter.join().unwrap();
    }

    #[test]
    fn connect_retries_until_listener_appears() {
        // Reserve a port, free it, and bind it again a little later.
        let port = TcpListener::bind(loopback())
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let secret = Secret::random();
        let server = thread::spawn(move || {
            thread::sleep(Duration::from_millis(150));
            let mut l = AuthListener::bind(addr, secret).unwrap();
            serve_good(&mut l, b"late");
        });
        let mut s = connect(addr, &secret, b"late", soon(5000)).unwrap();
        write_frame(&mut s, b"ping").unwrap();
        assert_eq!(read_frame(&mut s, 16).unwrap(), b"pong");
        server.join().unwrap();
        // Nobody listening: TimedOut at the deadline.
        drop(s);
        let port = TcpListener::bind(loopback())
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let e = connect(addr, &secret, b"", soon(100)).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::ConnectionRefused
            ),
            "{e}"
        );
    }

    #[test]
    fn frames_round_trip_and_limits() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"abc").unwrap();
        write_frame(&mut buf, b"").unwrap();
        let big = vec![9u8; 3 << 20];
        write_frame(&mut buf, &big).unwrap();
        let mut r = Cursor::new(buf);
        assert_eq!(read_frame(&mut r, 8).unwrap(), b"abc");
        assert_eq!(read_frame(&mut r, 0).unwrap(), b"");
        assert_eq!(read_frame(&mut r, 4 << 20).unwrap(), big);
        let e = read_frame(&mut r, 8).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // A huge announced length is refused before any allocation.
        let mut r = Cursor::new(u32::MAX.to_le_bytes().to_vec());
        let e = read_frame(&mut r, 1024).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // A truncated payload is an error, not a short frame.
        let mut r = Cursor::new([5, 0, 0, 0, 1, 2].to_vec());
        assert_eq!(
            read_frame(&mut r, 1024).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn read_frame_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 0usize..32) {
            let mut r = Cursor::new(bytes.clone());
            match read_frame(&mut r, max) {
                Ok(p) => {
                    prop_assert!(p.len() <= max);
                    prop_assert_eq!(&p[..], &bytes[4..4 + p.len()]);
                }
                Err(e) => prop_assert!(matches!(
                    e.kind(),
                    io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                )),
            }
        }

        #[test]
        fn server_handshake_rejects_arbitrary_bytes(
            valid_header in any::<bool>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..160),
        ) {
            let mut l = listener(Secret::random());
            let mut c = TcpStream::connect(l.local_addr()).unwrap();
            let mut msg = Vec::new();
            if valid_header {
                msg.extend_from_slice(&MAGIC);
                msg.extend_from_slice(&VERSION.to_le_bytes());
            }
            msg.extend_from_slice(&bytes);
            c.write_all(&msg).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            wait_readable(&[l.as_raw_fd()], Duration::from_secs(2)).unwrap();
            prop_assert!(l.accept_pending().unwrap().is_none());
        }
    }
}
