//! The root: one service thread per process serves every root rendezvous
//! (registration, checks, the answer with every rank's listener address).

use super::*;

/// Roots nobody has registered at yet that one process keeps; creating
/// another releases the oldest (its port closes).
pub(super) const MAX_UNSERVED_ROOTS: usize = 64;
/// How long the root of a job its launcher does not name waits after the
/// last rank registered before answering: a second job started at the same
/// moment on the same address shows up as a rank registered twice (and
/// fails both) instead of mixing with this one.
pub(super) const UNNAMED_JOB_SETTLE: Duration = Duration::from_millis(250);

/// The roots handed to the root service, and the service thread's state.
pub(super) struct RootQueue {
    incoming: Vec<Root>,
    /// Wakes the service thread; `None` when no thread runs.
    wake: Option<UnixStream>,
    /// The process whose thread `wake` reaches: a child forked while it ran
    /// has the queue but not the thread.
    pid: u32,
}

pub(super) static ROOT_QUEUE: std::sync::Mutex<RootQueue> = std::sync::Mutex::new(RootQueue {
    incoming: Vec::new(),
    wake: None,
    pid: 0,
});

/// Hands `root` to the root service: one thread per process serves every
/// root, and exits when none is left.
pub(super) fn spawn_root(root: Root) -> Result<()> {
    let addr = root.addr;
    let mut queue = ROOT_QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    if queue.wake.is_some() && queue.pid != std::process::id() {
        // Forked: the roots queued before are the parent's to serve (this
        // drops only the child's copies of their sockets).
        queue.wake = None;
        queue.incoming.clear();
    }
    queue.incoming.push(root);
    if let Some(wake) = &queue.wake {
        // A full wake-up pipe already has the thread's attention.
        let _ = (&*wake).write(&[1]);
        return Ok(());
    }
    start_service(&mut queue).map_err(|e| {
        queue.incoming.pop();
        Error::io(
            format!("bootstrap: starting the root service for {addr}"),
            e,
        )
    })
}

/// Starts the thread that serves `queue`'s roots.
fn start_service(queue: &mut RootQueue) -> io::Result<()> {
    let (wake, wake_rx) = UnixStream::pair()?;
    wake.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    thread::Builder::new()
        .name("rccl-boot-root".into())
        .spawn(move || serve_roots(wake_rx))?;
    queue.wake = Some(wake);
    queue.pid = std::process::id();
    Ok(())
}

/// Should the service thread panic, its roots close (their ranks hear
/// the root hang up instead of waiting out their timeouts) and a new
/// thread serves the roots queued since.
struct ServiceGuard;

impl Drop for ServiceGuard {
    fn drop(&mut self) {
        if !thread::panicking() {
            return;
        }
        let mut queue = ROOT_QUEUE.lock().unwrap_or_else(|e| e.into_inner());
        queue.wake = None;
        tracing::error!("bootstrap: the root service failed; its rendezvous are closed");
        if !queue.incoming.is_empty() {
            if let Err(e) = start_service(&mut queue) {
                tracing::error!("bootstrap: restarting the root service: {e}");
                queue.incoming.clear();
            }
        }
    }
}

/// The root service: drives every root's listener and rendezvous from one
/// poll loop.
pub(super) fn serve_roots(wake: UnixStream) {
    let _guard = ServiceGuard;
    let mut roots: Vec<Root> = Vec::new();
    let mut pfds: Vec<libc::pollfd> = Vec::new();
    loop {
        {
            let mut queue = ROOT_QUEUE.lock().unwrap_or_else(|e| e.into_inner());
            roots.append(&mut queue.incoming);
            if roots.is_empty() {
                queue.wake = None;
                return;
            }
        }
        let unserved = roots.iter().filter(|r| !r.served()).count();
        for _ in MAX_UNSERVED_ROOTS..unserved {
            let oldest = roots
                .iter()
                .position(|r| !r.served())
                .expect("counted above");
            let root = roots.remove(oldest);
            tracing::warn!(
                root = %root.addr,
                "bootstrap root: releasing the oldest of more than {MAX_UNSERVED_ROOTS} unique ids nobody has registered at"
            );
        }
        pfds.clear();
        let mut timeout = Duration::from_secs(1);
        for fd in std::iter::once(wake.as_raw_fd())
            .chain(roots.iter().flat_map(|r| r.listener.poll_fds()))
        {
            pfds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let now = Instant::now();
        for root in &roots {
            timeout = root.listener.poll_timeout(timeout);
            timeout = timeout.min(root.wake_at().saturating_duration_since(now));
        }
        let ms = timeout.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: `pfds` is a valid array of `pfds.len()` initialised
        // pollfds that outlives the call.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::warn!("bootstrap root service: poll failed: {e}");
                thread::sleep(ABORT_POLL);
            }
        }
        let mut b = [0u8; 64];
        while matches!((&wake).read(&mut b), Ok(n) if n > 0) {}
        roots.retain_mut(|root| !root.step());
    }
}

/// A rank registered at the root.
pub(super) struct Registrant {
    stream: AuthStream,
    nranks: usize,
    listen: SocketAddr,
    /// Its host, pid and address, for messages.
    who: String,
}

pub(super) fn root_timeout() -> Duration {
    rccl_env::var("RCCL_BOOTSTRAP_ROOT_TIMEOUT")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_ROOT_TIMEOUT)
}

pub(super) fn root_answer(stream: &mut AuthStream, status: u8, body: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(1 + body.len());
    msg.push(status);
    msg.extend_from_slice(body);
    stream
        .tcp()
        .set_write_timeout(Some(Duration::from_secs(5)))?;
    auth_tcp::write_frame(stream, &msg)
}

/// Whether the peer of `stream` has closed it.
pub(super) fn is_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let closed = match stream.peek(&mut [0u8]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    let _ = stream.set_nonblocking(false);
    closed
}

/// One rendezvous: collects every rank's registration, checks them,
/// answers every rank with the address table (or with the error).
pub(super) struct Root {
    listener: AuthListener,
    addr: SocketAddr,
    /// Wait [`UNNAMED_JOB_SETTLE`] between the last registration and the
    /// answer.
    settle: bool,
    /// Until a rank registers: the root's expiry. Then: when the earliest
    /// registered rank gives up.
    pub(super) deadline: Instant,
    first_timeout: Option<Duration>,
    ranks: HashMap<usize, Registrant>,
    failure: Option<(u8, String)>,
    /// When to answer, once every rank has registered.
    answer_at: Option<Instant>,
}

impl Root {
    pub(super) fn new(listener: AuthListener, settle: bool) -> Root {
        Root {
            addr: listener.local_addr(),
            listener,
            settle,
            deadline: after(Instant::now(), root_timeout()),
            first_timeout: None,
            ranks: HashMap::new(),
            failure: None,
            answer_at: None,
        }
    }

    /// Whether a rank has registered.
    fn served(&self) -> bool {
        self.first_timeout.is_some()
    }

    /// When [`Root::step`] has something to do without a connection.
    fn wake_at(&self) -> Instant {
        self.answer_at.unwrap_or(self.deadline)
    }

    /// Takes what arrived and acts on the time; true once the root is done.
    fn step(&mut self) -> bool {
        loop {
            match self.listener.accept_pending() {
                Ok(Some((stream, hello))) => self.register(stream, &hello),
                Ok(None) => break,
                Err(e) => {
                    // Out of file descriptors, say: tell the ranks that
                    // registered, whose streams close and free what they
                    // held, and answer later ones the same until the
                    // deadline (accepting may work again meanwhile).
                    if self.failure.is_none() {
                        let msg = format!(
                            "bootstrap: the root at {} cannot take registrations: {e}",
                            self.addr
                        );
                        tracing::warn!("{msg}");
                        self.fail(ROOT_SYSTEM, msg);
                    }
                    thread::sleep(ABORT_POLL);
                    break;
                }
            }
        }
        let now = Instant::now();
        if self.failure.is_none() && self.answer_at.is_some_and(|t| now >= t) {
            self.answer_table();
            return true;
        }
        if now < self.deadline {
            return false;
        }
        if self.failure.is_some() {
            return true;
        }
        let Some(n) = self.ranks.values().next().map(|r| r.nranks) else {
            tracing::warn!(root = %self.addr, "bootstrap root: no rank registered; releasing the unique id");
            return true;
        };
        let mut missing: Vec<usize> = (0..n).filter(|r| !self.ranks.contains_key(r)).collect();
        missing.truncate(64);
        let msg = format!(
            "bootstrap: timed out after {} waiting for rank(s) {missing:?} of {n} to register at the root {} ({} of {n} registered)",
            secs(self.first_timeout.unwrap_or_default()),
            self.addr,
            self.ranks.len()
        );
        tracing::warn!("{msg}");
        self.fail(ROOT_SYSTEM, msg);
        true
    }

    /// Answers every registered rank with the error and keeps it for
    /// those still to come.
    fn fail(&mut self, status: u8, msg: String) {
        for (_, mut r) in self.ranks.drain() {
            let _ = root_answer(&mut r.stream, status, msg.as_bytes());
        }
        self.failure = Some((status, msg));
        self.answer_at = None;
    }

    fn answer_table(&mut self) {
        let nranks = self.ranks.len();
        let mut table = Vec::with_capacity(4 + nranks * ADDR_LEN);
        table.extend_from_slice(&(nranks as u32).to_le_bytes());
        for r in 0..nranks {
            encode_addr(&self.ranks[&r].listen, &mut table);
        }
        for (r, reg) in self.ranks.iter_mut() {
            if let Err(e) = root_answer(&mut reg.stream, ROOT_OK, &table) {
                tracing::warn!(root = %self.addr, "bootstrap root: cannot answer rank {r} ({}): {e}", reg.who);
            }
        }
    }

    fn register(&mut self, mut stream: AuthStream, hello: &[u8]) {
        let root = self.addr;
        let from = stream.peer_addr().unwrap_or(root);
        // Registration: magic, rank, nranks, timeout (ms), listener
        // address, pid, host name.
        let Some(reg) = Registration::decode(hello) else {
            tracing::warn!(remote = %from, root = %root, "bootstrap root: malformed registration; closing");
            return;
        };
        let (rank, nranks) = (reg.rank, reg.nranks);
        let who = format!("host {}, pid {}, from {from}", reg.host, reg.pid);
        // The rendezvous ends when the earliest registered rank gives up
        // (the root's own expiry only bounds the wait for the first).
        let gives_up = after(Instant::now(), reg.timeout);
        if self.first_timeout.is_none() {
            self.first_timeout = Some(reg.timeout);
            self.deadline = gives_up;
        }
        self.deadline = self.deadline.min(gives_up);
        if let Some((status, msg)) = &self.failure {
            let _ = root_answer(&mut stream, *status, msg.as_bytes());
            return;
        }
        let expected = self.ranks.values().next().map(|r| r.nranks);
        let problem = if let Some(n) = expected.filter(|&n| n != nranks) {
            Some(format!(
                "bootstrap: nranks mismatch: rank {rank} ({who}) called init with nranks={nranks}, but other ranks use nranks={n}"
            ))
        } else if rank >= nranks {
            Some(format!(
                "bootstrap: rank {rank} ({who}) is out of range for nranks={nranks}"
            ))
        } else if let Some(old) = self.ranks.get(&rank) {
            if self.answer_at.is_none() && is_closed(old.stream.tcp()) {
                // The earlier registration gave up; this is its retry.
                self.ranks.remove(&rank);
                None
            } else {
                Some(format!(
                    "bootstrap: rank {rank} registered twice at the root {root}: by {} and by {who}; \
                     two jobs may be using this address (give each its own NCCL_COMM_ID or MASTER_PORT, \
                     or launch them with torchrun, Slurm or mpirun, whose job names keep them apart)",
                    old.who
                ))
            }
        } else {
            None
        };
        if let Some(msg) = problem {
            tracing::warn!(root = %root, "{msg}");
            let _ = root_answer(&mut stream, ROOT_USAGE, msg.as_bytes());
            self.fail(ROOT_USAGE, msg);
            return;
        }
        self.ranks.insert(
            rank,
            Registrant {
                stream,
                nranks,
                listen: reg.listen,
                who,
            },
        );
        if self.ranks.len() == nranks {
            let settle = if self.settle {
                UNNAMED_JOB_SETTLE
            } else {
                Duration::ZERO
            };
            self.answer_at = Some(Instant::now() + settle);
        }
    }
}

/// A rank's registration at the root.
pub(super) struct Registration {
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) timeout: Duration,
    pub(super) listen: SocketAddr,
    pub(super) pid: u32,
    pub(super) host: String,
}

impl Registration {
    pub(super) fn encode(&self) -> Vec<u8> {
        let host = &self.host.as_bytes()[..self.host.len().min(255)];
        let mut b = Vec::with_capacity(20 + ADDR_LEN + 5 + host.len());
        b.extend_from_slice(&REG_MAGIC);
        b.extend_from_slice(&(self.rank as u32).to_le_bytes());
        b.extend_from_slice(&(self.nranks as u32).to_le_bytes());
        b.extend_from_slice(&(self.timeout.as_millis().min(u64::MAX as u128) as u64).to_le_bytes());
        encode_addr(&self.listen, &mut b);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.push(host.len() as u8);
        b.extend_from_slice(host);
        b
    }

    pub(super) fn decode(b: &[u8]) -> Option<Registration> {
        let at = 20 + ADDR_LEN;
        if b.len() < at + 5 || b[..4] != REG_MAGIC {
            return None;
        }
        let host_len = b[at + 4] as usize;
        if b.len() != at + 5 + host_len {
            return None;
        }
        Some(Registration {
            rank: read_u32(b, 4) as usize,
            nranks: read_u32(b, 8) as usize,
            timeout: Duration::from_millis(read_u64(b, 12)),
            listen: decode_addr(&b[20..at]).ok()?,
            pid: read_u32(b, at),
            host: String::from_utf8_lossy(&b[at + 5..]).into_owned(),
        })
    }
}
