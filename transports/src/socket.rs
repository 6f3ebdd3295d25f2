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

/// Adds `context` to an I/O error, keeping its kind.
fn context(e: io::Error, context: impl fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{context}: {e}"))
}

/// Connects to `addr`, proves knowledge of `secret` (and checks that the
/// listener knows it too), then sends `hello` (an opaque purpose payload,
/// at most [`MAX_HELLO`] bytes).
///
/// A refused connection is retried with a short backoff until `deadline`
/// (the listener may not be up yet); other failures are returned at once.
/// The stream comes back blocking, without timeouts, with `TCP_NODELAY`.
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
    let mut stream = loop {
        if stop.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(&format!("connecting to {addr}")));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(context(e, format_args!("connecting to {addr}")));
                }
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(context(e, format_args!("connecting to {addr}"))),
        }
    };
    client_handshake(&mut stream, secret, hello, deadline, stop)
        .map_err(|e| context(e, format_args!("handshake with {addr}")))?;
    Ok(stream)
}

fn client_handshake(
    stream: &mut TcpStream,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    set_write_deadline(stream, deadline)?;
    // The listener may be busy with another handshake: wait for its greeting
    // until the deadline.
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
    stream.write_all(&response)?;
    let proof_deadline = deadline.min(Instant::now() + DEFAULT_HANDSHAKE_TIMEOUT);
    let mut proof = [0u8; MAC_LEN];
    read_exact_until(stream, &mut proof, proof_deadline, stop).map_err(|e| {
        if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ) {
            err(
                io::ErrorKind::PermissionDenied,
                "the listener closed the connection during authentication (wrong secret?)",
            )
        } else {
            e
        }
    })?;
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

/// Runs the server side of the handshake; returns the client's hello.
fn server_handshake(
    stream: &mut TcpStream,
    secret: &Secret,
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<Vec<u8>> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    set_write_deadline(stream, deadline)?;
    let server_nonce = nonce()?;
    let mut greeting = [0u8; GREETING_LEN];
    greeting[..8].copy_from_slice(&MAGIC);
    greeting[8..12].copy_from_slice(&VERSION.to_le_bytes());
    greeting[12..].copy_from_slice(&server_nonce);
    stream.write_all(&greeting)?;
    let mut response = [0u8; RESPONSE_LEN];
    read_exact_until(stream, &mut response, deadline, stop)?;
    check_header(&response, "client")?;
    let client_nonce = &response[12..12 + NONCE_LEN];
    mac(secret, CLIENT_LABEL, &server_nonce, client_nonce)
        .verify_slice(&response[12 + NONCE_LEN..])
        .map_err(|_| {
            err(
                io::ErrorKind::PermissionDenied,
                "authentication failed (wrong secret)",
            )
        })?;
    let proof = mac(secret, SERVER_LABEL, &server_nonce, client_nonce)
        .finalize()
        .into_bytes();
    stream.write_all(&proof)?;
    let hello = read_frame_until(stream, MAX_HELLO, deadline, stop)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(hello)
}

/// Waits until `fd` is readable or `timeout` passes.
fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfd` is one valid, initialised pollfd that lives across the
    // call, and we pass a count of 1.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// A TCP listener that only hands out connections whose client proved it
/// knows the secret.
pub struct AuthListener {
    listener: TcpListener,
    secret: Secret,
    local: SocketAddr,
    handshake_timeout: Duration,
}

impl fmt::Debug for AuthListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthListener")
            .field("local", &self.local)
            .field("handshake_timeout", &self.handshake_timeout)
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

    /// Accepts the next connection that authenticates, returning it with
    /// its hello payload. Connections that fail the handshake are closed,
    /// logged, and accepting continues.
    ///
    /// Returns `TimedOut` at `deadline` and `Interrupted` soon (within
    /// ~10 ms) after `stop` becomes true.
    pub fn accept(&self, deadline: Instant, stop: &AtomicBool) -> io::Result<(TcpStream, Vec<u8>)> {
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(interrupted());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(timed_out(&format!(
                    "waiting for a connection on {}",
                    self.local
                )));
            }
            if let Some(accepted) = self.accept_one(deadline, stop)? {
                return Ok(accepted);
            }
            wait_readable(self.listener.as_raw_fd(), slice_until(deadline))?;
        }
    }

    /// Takes one pending connection, if any, and runs its handshake
    /// (blocking for at most the handshake timeout). `Ok(None)` when no
    /// connection was pending or it failed the handshake (then it is closed
    /// and logged).
    pub fn accept_pending(&self, stop: &AtomicBool) -> io::Result<Option<(TcpStream, Vec<u8>)>> {
        self.accept_one(after(Instant::now(), self.handshake_timeout), stop)
    }

    fn accept_one(
        &self,
        deadline: Instant,
        stop: &AtomicBool,
    ) -> io::Result<Option<(TcpStream, Vec<u8>)>> {
        let (mut stream, peer) = match self.listener.accept() {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(context(e, format_args!("accepting on {}", self.local))),
        };
        let hs_deadline = deadline.min(after(Instant::now(), self.handshake_timeout));
        match server_handshake(&mut stream, &self.secret, hs_deadline, stop) {
            Ok(hello) => Ok(Some((stream, hello))),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                tracing::warn!(
                    remote = %peer,
                    listener = %self.local,
                    "rejected a connection that failed the handshake: {e}"
                );
                let _ = stream.shutdown(Shutdown::Both);
                Ok(None)
            }
        }
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

    fn serve_good(l: &AuthListener, hello: &[u8]) {
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
        let l = listener(secret);
        let c = good_client(l.local_addr(), secret, b"hello there");
        serve_good(&l, b"hello there");
        c.join().unwrap();
    }

    #[test]
    fn empty_and_max_hello() {
        let secret = Secret::random();
        let l = listener(secret);
        let c = good_client(l.local_addr(), secret, b"");
        serve_good(&l, b"");
        c.join().unwrap();
        let big: &'static [u8] = Box::leak(vec![7u8; MAX_HELLO].into_boxed_slice());
        let c = good_client(l.local_addr(), secret, big);
        serve_good(&l, big);
        c.join().unwrap();
        let e = connect(l.local_addr(), &secret, &[0; MAX_HELLO + 1], soon(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn wrong_secret_refused_then_good_client_accepted() {
        let secret = Secret::random();
        let l = listener(secret);
        let addr = l.local_addr();
        let bad = thread::spawn(move || connect(addr, &Secret::random(), b"x", soon(5000)));
        let stop = AtomicBool::new(false);
        // Only the bad client is there: nothing is accepted.
        let e = l.accept(soon(500), &stop).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let e = bad.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let c = good_client(addr, secret, b"good");
        serve_good(&l, b"good");
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
        let l = listener(secret);
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
        serve_good(&l, b"after the bad ones");
        // One silent client costs at most one handshake timeout.
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        c.join().unwrap();
        drop((garbage, truncated, silent, version));
    }

    #[test]
    fn accept_times_out_and_stops() {
        let l = listener(Secret::random());
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
            let l = AuthListener::bind(addr, secret).unwrap();
            serve_good(&l, b"late");
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
            let l = listener(Secret::random());
            let mut c = TcpStream::connect(l.local_addr()).unwrap();
            let mut msg = Vec::new();
            if valid_header {
                msg.extend_from_slice(&MAGIC);
                msg.extend_from_slice(&VERSION.to_le_bytes());
            }
            msg.extend_from_slice(&bytes);
            c.write_all(&msg).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            wait_readable(l.as_raw_fd(), Duration::from_secs(2)).unwrap();
            let stop = AtomicBool::new(false);
            prop_assert!(l.accept_pending(&stop).unwrap().is_none());
        }
    }
}
