//! Encryption of authenticated connections (NCCL's `ncclSetEncryption`
//! with a pre-shared key).
//!
//! When the process holds a [`Psk`], every connection's handshake is the
//! Noise protocol `NNpsk0_25519_ChaChaPoly_SHA256` (the `snow` crate)
//! instead of the plaintext HMAC exchange: its key is
//! `HMAC-SHA256(psk, "rccl-rs session" || communicator secret)`, so both
//! the PSK and the communicator's secret must match. The listener is the
//! Noise initiator (it speaks first, as in the plaintext exchange):
//!
//! 1. listener → client: Noise message 1 (ephemeral key, sealed empty payload)
//! 2. client → listener: Noise message 2 (ephemeral key, sealed empty payload)
//! 3. listener → client: a sealed empty record (it accepted the client)
//! 4. client → listener: the hello, sealed
//!
//! Fresh ephemeral keys make a fresh session key per connection; each
//! direction numbers its records (Noise's implicit nonce), so a tampered,
//! replayed, reordered or dropped record fails authentication. A record
//! on the wire is its ciphertext's length (`u16`, big-endian) and the
//! ciphertext (at most 65,535 bytes, 16 of them the tag).

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use parking_lot::RwLock;

use super::*;

/// The shortest PSK accepted (NCCL's minimum).
pub const MIN_PSK_BYTES: usize = 32;
const NOISE: &str = "Noise_NNpsk0_25519_ChaChaPoly_SHA256";
const PROLOGUE: &[u8] = b"rccl-rs noise v1";
const TAG_LEN: usize = 16;
/// Bytes of Noise messages 1 and 2: an X25519 key and an empty payload's tag.
pub(crate) const NOISE_MSG_LEN: usize = 32 + TAG_LEN;
/// Bytes of a record's length field.
pub(crate) const RECORD_HEADER: usize = 2;
/// Most ciphertext bytes of one record (Noise's message limit).
const MAX_RECORD: usize = 65_535;
/// Most plaintext bytes of one record.
const MAX_PLAIN: usize = MAX_RECORD - TAG_LEN;
/// Bytes of the listener's acceptance record.
pub(crate) const ACCEPT_LEN: usize = RECORD_HEADER + TAG_LEN;
/// Most plaintext one non-blocking write seals before it returns, so that
/// a large send interleaves with reads.
const WRITE_BATCH: usize = 1 << 20;

/// A pre-shared key, reduced to 32 bytes (`HMAC-SHA256(psk, "rccl-rs psk")`).
#[derive(Clone, PartialEq, Eq)]
pub struct Psk(Arc<[u8; 32]>);

impl Psk {
    /// A key from the bytes the user gave (at least [`MIN_PSK_BYTES`]).
    pub fn new(bytes: &[u8]) -> io::Result<Psk> {
        if bytes.len() < MIN_PSK_BYTES {
            return Err(err(
                io::ErrorKind::InvalidInput,
                format!(
                    "a PSK of {} bytes is too short: it needs at least {MIN_PSK_BYTES}",
                    bytes.len()
                ),
            ));
        }
        let mut m = HmacSha256::new_from_slice(bytes).expect("HMAC accepts any key length");
        m.update(b"rccl-rs psk");
        Ok(Psk(Arc::new(m.finalize().into_bytes().into())))
    }

    /// The Noise key of a connection between members of `secret`'s
    /// communicator.
    fn session_key(&self, secret: &Secret) -> [u8; 32] {
        let mut m = HmacSha256::new_from_slice(&self.0[..]).expect("HMAC accepts any key length");
        m.update(b"rccl-rs session");
        m.update(&secret.0);
        m.finalize().into_bytes().into()
    }
}

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psk(<redacted>)")
    }
}

static PROCESS_PSK: RwLock<Option<Psk>> = RwLock::new(None);

/// Sets the process's encryption: `Some(psk)` encrypts every connection
/// made from now on (listeners take it when they bind, connections when
/// they start); `None` goes back to plaintext. Every process of a job must
/// hold the same key before its communicators are made.
pub fn set_encryption(psk: Option<Psk>) {
    *PROCESS_PSK.write() = psk;
}

/// The process's encryption key, if it encrypts.
pub fn encryption() -> Option<Psk> {
    PROCESS_PSK.read().clone()
}

fn noise(initiator: bool, psk: &Psk, secret: &Secret) -> io::Result<snow::HandshakeState> {
    let key = psk.session_key(secret);
    let builder = snow::Builder::new(NOISE.parse().expect("a valid Noise pattern"))
        .psk(0, &key)
        .prologue(PROLOGUE);
    let state = if initiator {
        builder.build_initiator()
    } else {
        builder.build_responder()
    };
    state.map_err(|e| err(io::ErrorKind::Other, format!("starting Noise: {e}")))
}

fn wrong_key(peer: &str) -> io::Error {
    err(
        io::ErrorKind::PermissionDenied,
        format!(
            "the {peer} holds a different encryption key: the processes' PSKs \
             (ncclSetEncryption) or the communicator's secret differ"
        ),
    )
}

/// The listener's side of an encrypted handshake.
pub(crate) struct NoiseListener(Box<snow::HandshakeState>);

impl NoiseListener {
    /// Starts a handshake: the state and message 1.
    pub(crate) fn start(psk: &Psk, secret: &Secret) -> io::Result<(NoiseListener, Vec<u8>)> {
        let mut state = noise(true, psk, secret)?;
        let mut msg = vec![0u8; NOISE_MSG_LEN];
        let n = state
            .write_message(&[], &mut msg)
            .map_err(|e| err(io::ErrorKind::Other, format!("Noise message 1: {e}")))?;
        debug_assert_eq!(n, NOISE_MSG_LEN);
        Ok((NoiseListener(Box::new(state)), msg))
    }

    /// Checks message 2; the channel and the acceptance record.
    pub(crate) fn finish(mut self, msg: &[u8]) -> io::Result<(Seal, Vec<u8>)> {
        let mut payload = [0u8; NOISE_MSG_LEN];
        self.0
            .read_message(msg, &mut payload)
            .map_err(|_| wrong_key("client"))?;
        let mut seal = Seal::new(*self.0)?;
        let accept = seal.record(&[])?;
        Ok((seal, accept))
    }
}

/// The client's side: answers message 1 with message 2, or says that the
/// listener holds another key.
pub(crate) fn noise_answer(psk: &Psk, secret: &Secret, msg: &[u8]) -> io::Result<(Seal, Vec<u8>)> {
    let mut state = noise(false, psk, secret)?;
    let mut payload = [0u8; NOISE_MSG_LEN];
    state
        .read_message(msg, &mut payload)
        .map_err(|_| wrong_key("listener"))?;
    let mut answer = vec![0u8; NOISE_MSG_LEN];
    state
        .write_message(&[], &mut answer)
        .map_err(|e| err(io::ErrorKind::Other, format!("Noise message 2: {e}")))?;
    Ok((Seal::new(state)?, answer))
}

/// The length a record header announces, checked.
pub(crate) fn record_len(header: [u8; RECORD_HEADER]) -> io::Result<usize> {
    let len = u16::from_be_bytes(header) as usize;
    if len < TAG_LEN {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("an encrypted record of {len} bytes is shorter than its tag"),
        ));
    }
    Ok(len)
}

fn open_into(
    transport: &mut snow::TransportState,
    ciphertext: &[u8],
    plain: &mut [u8],
) -> io::Result<usize> {
    transport.read_message(ciphertext, plain).map_err(|_| {
        err(
            io::ErrorKind::InvalidData,
            "an encrypted record failed authentication (tampered, replayed, reordered or \
             sealed with another key)",
        )
    })
}

/// An encrypted connection's cipher state and buffers.
pub struct Seal {
    transport: snow::TransportState,
    /// Ciphertext received, not yet opened, from `inbox_at`.
    inbox: Vec<u8>,
    inbox_at: usize,
    /// Plaintext opened, not yet read, from `plain_at`.
    plain: Vec<u8>,
    plain_at: usize,
    /// Ciphertext sealed, not yet written, from `out_at`.
    out: Vec<u8>,
    out_at: usize,
}

impl Seal {
    fn new(state: snow::HandshakeState) -> io::Result<Seal> {
        let transport = state
            .into_transport_mode()
            .map_err(|e| err(io::ErrorKind::Other, format!("finishing Noise: {e}")))?;
        Ok(Seal {
            transport,
            inbox: Vec::new(),
            inbox_at: 0,
            plain: Vec::new(),
            plain_at: 0,
            out: Vec::new(),
            out_at: 0,
        })
    }

    /// Seals `plain` (at most one record's worth) as a record.
    pub(crate) fn record(&mut self, plain: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.seal_into(plain, &mut out)?;
        Ok(out)
    }

    fn seal_into(&mut self, plain: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        debug_assert!(plain.len() <= MAX_PLAIN);
        let start = out.len();
        let len = plain.len() + TAG_LEN;
        out.resize(start + RECORD_HEADER + len, 0);
        out[start..start + RECORD_HEADER].copy_from_slice(&(len as u16).to_be_bytes());
        self.transport
            .write_message(plain, &mut out[start + RECORD_HEADER..])
            .map_err(|e| err(io::ErrorKind::Other, format!("sealing a record: {e}")))?;
        Ok(())
    }

    /// Opens one record's ciphertext (without its header).
    pub(crate) fn open(&mut self, ciphertext: &[u8]) -> io::Result<Vec<u8>> {
        let mut plain = vec![0u8; ciphertext.len()];
        let n = open_into(&mut self.transport, ciphertext, &mut plain)?;
        plain.truncate(n);
        Ok(plain)
    }

    /// The ciphertext length of the complete record at the inbox's front,
    /// if one is there.
    fn front_record(&self) -> io::Result<Option<usize>> {
        let inbox = &self.inbox[self.inbox_at..];
        if inbox.len() < RECORD_HEADER {
            return Ok(None);
        }
        let len = record_len([inbox[0], inbox[1]])?;
        Ok((inbox.len() - RECORD_HEADER >= len).then_some(len))
    }

    fn read(&mut self, mut stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.plain_at < self.plain.len() {
                let n = buf.len().min(self.plain.len() - self.plain_at);
                buf[..n].copy_from_slice(&self.plain[self.plain_at..self.plain_at + n]);
                self.plain_at += n;
                if self.plain_at == self.plain.len() {
                    self.plain.clear();
                    self.plain_at = 0;
                }
                return Ok(n);
            }
            if buf.is_empty() {
                return Ok(0);
            }
            if let Some(len) = self.front_record()? {
                let body = self.inbox_at + RECORD_HEADER..self.inbox_at + RECORD_HEADER + len;
                self.inbox_at = body.end;
                if len - TAG_LEN <= buf.len() {
                    // Straight into the reader's buffer: one copy fewer. An
                    // empty record is no end of the stream: read on.
                    let n = open_into(&mut self.transport, &self.inbox[body], buf)?;
                    if n > 0 {
                        return Ok(n);
                    }
                    continue;
                }
                self.plain.resize(len, 0);
                let n = open_into(&mut self.transport, &self.inbox[body], &mut self.plain)?;
                self.plain.truncate(n);
                continue;
            }
            self.inbox.drain(..self.inbox_at);
            self.inbox_at = 0;
            let have = self.inbox.len();
            self.inbox
                .resize(have + 4 * (RECORD_HEADER + MAX_RECORD), 0);
            let got = stream.read(&mut self.inbox[have..]);
            self.inbox.truncate(have + *got.as_ref().unwrap_or(&0));
            if got? == 0 {
                if have == 0 {
                    return Ok(0);
                }
                return Err(err(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed in the middle of an encrypted record ({have} bytes of it received)"
                    ),
                ));
            }
        }
    }

    /// Writes sealed bytes until none are left (`Ok(true)`) or the socket
    /// would block (`Ok(false)`).
    fn flush(&mut self, mut stream: &TcpStream) -> io::Result<bool> {
        while self.out_at < self.out.len() {
            match stream.write(&self.out[self.out_at..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_at = 0;
        Ok(true)
    }

    /// Seals up to [`WRITE_BATCH`] bytes of `bufs` (once earlier output is
    /// written) and starts writing them: the plaintext bytes taken.
    fn write(&mut self, stream: &TcpStream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if !self.flush(stream)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut staged = Vec::with_capacity(MAX_PLAIN);
        let mut taken = 0;
        let mut out = std::mem::take(&mut self.out);
        for buf in bufs {
            let mut rest: &[u8] = buf;
            while !rest.is_empty() && taken < WRITE_BATCH {
                let n = rest
                    .len()
                    .min(MAX_PLAIN - staged.len())
                    .min(WRITE_BATCH - taken);
                if staged.is_empty() && n == MAX_PLAIN {
                    // A whole record from the caller's bytes: no staging copy.
                    self.seal_into(&rest[..n], &mut out)?;
                    rest = &rest[n..];
                    taken += n;
                    continue;
                }
                staged.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
                taken += n;
                if staged.len() == MAX_PLAIN {
                    self.seal_into(&staged, &mut out)?;
                    staged.clear();
                }
            }
        }
        if !staged.is_empty() {
            self.seal_into(&staged, &mut out)?;
        }
        self.out = out;
        self.flush(stream)?;
        Ok(taken)
    }
}

/// An authenticated connection: a TCP stream, encrypted when the process
/// holds a PSK. Reads and writes go through [`Read`] / [`Write`] (or
/// [`AuthStream::write_gather`]), blocking or not as the socket is; a
/// non-blocking reader must read until `WouldBlock` before it polls the
/// descriptor (opened plaintext may wait in the stream), and a
/// non-blocking writer calls [`AuthStream::flush_output`] until it says
/// nothing is left.
pub struct AuthStream {
    stream: TcpStream,
    seal: Option<Box<Seal>>,
}

impl fmt::Debug for AuthStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthStream")
            .field("stream", &self.stream)
            .field("encrypted", &self.seal.is_some())
            .finish()
    }
}

impl AuthStream {
    pub(crate) fn new(stream: TcpStream, seal: Option<Box<Seal>>) -> AuthStream {
        AuthStream { stream, seal }
    }

    /// The TCP stream (for its options and address; bytes written to it
    /// directly bypass the encryption).
    pub fn tcp(&self) -> &TcpStream {
        &self.stream
    }

    /// The TCP stream of a plaintext connection (whose handshake the caller
    /// made plaintext: NCCL encrypts no connection of the IB network).
    pub(crate) fn into_tcp(self) -> TcpStream {
        debug_assert!(self.seal.is_none(), "an encrypted stream used as plaintext");
        self.stream
    }

    /// Whether the connection is encrypted.
    pub fn encrypted(&self) -> bool {
        self.seal.is_some()
    }

    /// Whether opened plaintext waits to be read (the descriptor may not
    /// be readable then).
    pub fn buffered(&self) -> bool {
        self.seal
            .as_ref()
            .is_some_and(|s| s.plain_at < s.plain.len())
    }

    /// Writes what earlier writes sealed but could not write: `Ok(true)`
    /// once nothing is left.
    pub fn flush_output(&mut self) -> io::Result<bool> {
        match &mut self.seal {
            Some(seal) => seal.flush(&self.stream),
            None => Ok(true),
        }
    }

    /// Writes from several buffers in order (`sendmsg` when plaintext):
    /// the bytes taken. Encrypted, bytes taken may still wait in the
    /// stream: see [`AuthStream::flush_output`].
    pub fn write_gather(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &mut self.seal {
            Some(seal) => seal.write(&self.stream, bufs),
            None => {
                // SAFETY: msghdr is plain data; all-zero is valid.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = bufs.len() as _;
                // SAFETY: IoSlice is ABI-compatible with iovec; every one
                // points at bytes borrowed for the call; sendmsg only reads.
                let n = unsafe {
                    libc::sendmsg(
                        self.stream.as_raw_fd(),
                        &msg,
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    )
                };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(n as usize)
            }
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    /// Shuts the TCP stream down.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.stream.shutdown(how)
    }
}

impl Read for AuthStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.seal {
            Some(seal) => seal.read(&self.stream, buf),
            None => self.stream.read(buf),
        }
    }
}

impl Write for AuthStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.seal {
            Some(seal) => {
                // Meant for blocking sockets, which write it all; what a
                // write timeout left behind is an error.
                let n = seal.write(&self.stream, &[IoSlice::new(buf)])?;
                if !seal.flush(&self.stream)? {
                    return Err(timed_out("writing an encrypted record"));
                }
                Ok(n)
            }
            None => self.stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.flush_output()? {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }
}

impl AsRawFd for AuthStream {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}
