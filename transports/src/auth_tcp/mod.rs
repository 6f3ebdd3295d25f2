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
//!
//! When the process holds a pre-shared key ([`set_encryption`]), the
//! handshake is a Noise exchange keyed by the PSK and the secret instead,
//! and everything after it is encrypted ([`seal`]). Either way a connection
//! is an [`AuthStream`].

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

mod client;
mod frame;
mod listener;
pub mod seal;
#[cfg(test)]
pub(crate) mod seal_tests;
pub(crate) mod sides;
#[cfg(test)]
mod tests;

pub use client::{connect, connect_until, connect_with};
pub use frame::{read_exact_until, read_frame, read_frame_until, write_frame, TimedRead};
pub use listener::{AuthListener, Refusals, MAX_PENDING, MAX_PENDING_PER_SOURCE};
pub use seal::{encryption, set_encryption, AuthStream, Psk, MIN_PSK_BYTES};

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
/// What a listener sends instead of its proof when the client's proof
/// fails, so that the client can tell a refusal from a shed handshake.
const DENIED: [u8; MAC_LEN] = *b"RCCLDENY: wrong secret, go away!";

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

pub(crate) fn check_header(buf: &[u8], peer: &str) -> io::Result<()> {
    if buf[..8] != MAGIC {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!(
                "bad handshake magic (the {peer} is not rccl-rs, or it encrypts its \
                 connections and this process does not: every process must make the \
                 same ncclSetEncryption call)"
            ),
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
