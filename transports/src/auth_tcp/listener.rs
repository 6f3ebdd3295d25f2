//! The listener's side: handshakes run side by side without blocking,
//! each against its own deadline, with caps per source and in all that shed
//! the oldest unauthenticated ones.

use super::sides::ServerSide;
use super::*;

/// Unauthenticated handshakes a listener holds at once from one source
/// address; a new connection from a source at the cap sheds that source's
/// oldest.
pub const MAX_PENDING_PER_SOURCE: usize = 32;
/// Unauthenticated handshakes a listener holds at once in all; a new
/// connection beyond it sheds the oldest.
pub const MAX_PENDING: usize = 128;
/// Connections accepted per [`AuthListener::progress`], so that a flood of
/// new ones cannot starve the handshakes already under way.
pub(super) const ACCEPT_BATCH: usize = 64;

/// Where a server-side handshake stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Step {
    /// Greeted; waiting for the client's response (unauthenticated).
    Response,
    /// Authenticated; waiting for the hello frame's length.
    HelloLength,
    /// Waiting for the hello's bytes.
    Hello,
}

/// One server-side handshake, driven without blocking.
pub(super) struct Handshake {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) deadline: Instant,
    pub(super) side: ServerSide,
    pub(super) step: Step,
    /// Bytes of the current step so far, and how many it needs.
    pub(super) buf: Vec<u8>,
    pub(super) need: usize,
}

/// What one call to [`Handshake::advance`] came to.
pub(super) enum Advance {
    Waiting,
    Done(Vec<u8>),
    Failed(io::Error),
}

impl Handshake {
    /// Takes an accepted `stream` and sends the greeting.
    pub(super) fn start(
        stream: TcpStream,
        peer: SocketAddr,
        deadline: Instant,
        secret: &Secret,
        psk: Option<&Psk>,
    ) -> io::Result<Handshake> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let (side, greeting) = ServerSide::start(secret, psk)?;
        write_whole(&stream, &greeting)?;
        let need = side.response_len();
        Ok(Handshake {
            stream,
            peer,
            deadline,
            side,
            step: Step::Response,
            buf: Vec::with_capacity(need),
            need,
        })
    }

    pub(super) fn authenticated(&self) -> bool {
        self.step != Step::Response
    }

    /// Reads what has arrived (never past the hello, so the client's first
    /// message stays in the socket) and moves through the steps.
    pub(super) fn advance(&mut self, secret: &Secret) -> Advance {
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
                    self.need = self.side.hello_header_len();
                }
                Step::HelloLength => match self.side.hello_len(&self.buf, MAX_HELLO) {
                    Ok(0) => return self.finish(Vec::new()),
                    Ok(len) => {
                        self.step = Step::Hello;
                        self.need = len;
                    }
                    Err(e) => return Advance::Failed(e),
                },
                Step::Hello => {
                    let hello = std::mem::take(&mut self.buf);
                    return self.finish(hello);
                }
            }
            self.buf.clear();
        }
    }

    /// Checks the client's response; answers with our proof, or with
    /// [`DENIED`] when the client's fails the plaintext exchange.
    pub(super) fn check_response(&mut self, secret: &Secret) -> io::Result<()> {
        match self.side.check_response(secret, &self.buf) {
            Ok(proof) => write_whole(&self.stream, &proof),
            Err(refusal) => {
                if let Some(answer) = refusal.answer {
                    let _ = write_whole(&self.stream, answer);
                }
                Err(refusal.error)
            }
        }
    }

    pub(super) fn finish(&mut self, hello: Vec<u8>) -> Advance {
        match self
            .side
            .open_hello(hello)
            .and_then(|hello| self.stream.set_nonblocking(false).map(|()| hello))
        {
            Ok(hello) => Advance::Done(hello),
            Err(e) => Advance::Failed(e),
        }
    }

    /// The connection, once [`Handshake::advance`] is done.
    pub(super) fn into_stream(self) -> AuthStream {
        self.side.into_stream(self.stream)
    }
}

/// Writes `bytes` to a non-blocking socket at once: a handshake message is
/// far smaller than a fresh socket's send buffer, so a short write means a
/// broken connection.
pub(super) fn write_whole(stream: &TcpStream, bytes: &[u8]) -> io::Result<()> {
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
pub(super) fn is_pending_connection_error(e: &io::Error) -> bool {
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
    pub(super) listener: TcpListener,
    pub(super) secret: Secret,
    /// The key of encrypted connections; `None`: plaintext.
    pub(super) psk: Option<Psk>,
    pub(super) local: SocketAddr,
    pub(super) handshake_timeout: Duration,
    /// Handshakes under way, oldest first.
    pub(super) pending: Vec<Handshake>,
    /// Authenticated connections not yet taken.
    pub(super) ready: VecDeque<(AuthStream, Vec<u8>)>,
    pub(super) refusals: Refusals,
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
    /// Binds `addr` (port 0: any free port); its connections are encrypted
    /// when the process holds a PSK ([`super::encryption`]).
    pub fn bind(addr: SocketAddr, secret: Secret) -> io::Result<AuthListener> {
        AuthListener::bind_with(addr, secret, encryption())
    }

    /// [`AuthListener::bind`] encrypting with `psk` (plaintext with
    /// `None`) rather than with the process's key.
    pub fn bind_with(
        addr: SocketAddr,
        secret: Secret,
        psk: Option<Psk>,
    ) -> io::Result<AuthListener> {
        let listener =
            TcpListener::bind(addr).map_err(|e| context(e, format_args!("binding {addr}")))?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        Ok(AuthListener {
            listener,
            secret,
            psk,
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
    ) -> io::Result<(AuthStream, Vec<u8>)> {
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
    pub fn accept_pending(&mut self) -> io::Result<Option<(AuthStream, Vec<u8>)>> {
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
                    self.ready.push_back((h.into_stream(), hello));
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
            match Handshake::start(stream, peer, deadline, &self.secret, self.psk.as_ref()) {
                Ok(mut h) => match h.advance(&self.secret) {
                    Advance::Waiting => self.pending.push(h),
                    Advance::Done(hello) => self.ready.push_back((h.into_stream(), hello)),
                    Advance::Failed(e) => self.refuse(h, e.to_string()),
                },
                Err(e) => self.note_refusal(peer, format!("greeting failed: {e}")),
            }
        }
        Ok(())
    }

    /// Sheds the oldest unauthenticated handshake from `peer`'s address if
    /// it is at its cap, and the oldest of all if the listener is.
    pub(super) fn make_room(&mut self, peer: SocketAddr) {
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

    pub(super) fn shed(&mut self, which: impl Fn(&Handshake) -> bool) {
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

    pub(super) fn refuse(&mut self, h: Handshake, why: String) {
        tracing::warn!(
            remote = %h.peer,
            listener = %self.local,
            "rejected a connection that failed the handshake: {why}"
        );
        let _ = h.stream.shutdown(Shutdown::Both);
        self.note_refusal(h.peer, why);
    }

    pub(super) fn note_refusal(&mut self, peer: SocketAddr, why: String) {
        self.refusals.failed += 1;
        self.refusals.last = Some((peer, why));
    }
}

impl AsRawFd for AuthListener {
    fn as_raw_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }
}
