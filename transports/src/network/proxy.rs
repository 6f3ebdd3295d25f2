//! The network proxy: one thread per process that moves every network
//! connection's slots (every rank, communicator, peer and channel of the
//! process), as NCCL's proxy thread does. The number of threads no longer
//! grows with peers x channels.
//!
//! The thread is started by the first connection and ends when the last
//! one is gone (a later connection starts a new one), so a process without
//! network connections has no proxy thread.
//!
//! Each pass asks every connection to move what it can without waiting
//! ([`Work::progress`]). When a pass moves nothing, the thread yields a
//! little, then announces that it sleeps, looks once more, and sleeps in
//! `ppoll(2)` on what the pending requests wait for ([`Work::wait_on`]) and
//! on its doorbell, an eventfd that the FIFOs ring when the executor
//! publishes, releases or fails a slot ([`Bell`]). Ringing costs the
//! executor one atomic load unless the proxy sleeps. The sleep is bounded
//! ([`PARK_MAX`]), so a lost wake-up costs latency, never a hang.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::fifo::Doorbell;

/// Longest one sleep of the proxy: bounds a lost wake-up.
const PARK_MAX: Duration = Duration::from_millis(100);
/// Sleep when some pending request cannot say what it waits for (a net
/// plug-in's requests: nothing to sleep on, so they are tested again).
const PARK_UNKNOWN: Duration = Duration::from_millis(1);
/// The same sleep within [`RECENT`] of the last movement, when the next
/// message of an operation in progress is likely close.
const PARK_UNKNOWN_RECENT: Duration = Duration::from_micros(50);
/// How long after the last movement the proxy keeps its sleeps short.
const RECENT: Duration = Duration::from_millis(5);
/// How long a proxy that found nothing to do yields before it sleeps:
/// the executor usually answers within this, and a yield is cheaper than
/// a wake-up.
const YIELD_FOR: Duration = Duration::from_micros(50);

/// How many [`Polling`] guards live.
static POLLING: AtomicUsize = AtomicUsize::new(0);

/// While it lives, the proxy yields between passes instead of sleeping:
/// device work publishes and releases slots without ringing the doorbell,
/// so the proxy watches them the way NCCL's proxy spins while operations
/// are in flight. Held from a device launch's enqueue to its end.
pub struct Polling(());

/// Keeps the proxy polling until the guard is dropped.
pub fn keep_polling() -> Polling {
    POLLING.fetch_add(1, Ordering::SeqCst);
    if let Some(proxy) = PROXY.get() {
        proxy.bell.ring();
    }
    Polling(())
}

impl Drop for Polling {
    fn drop(&mut self) {
        POLLING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one pass over a connection did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing could move.
    Idle,
    /// Something moved.
    Moved,
    /// The connection is closed and released: forget it.
    Finished,
}

/// A connection as the proxy drives it.
pub(crate) trait Work: Send {
    /// Moves what can move without waiting.
    fn progress(&mut self) -> Progress;
    /// Adds what the connection's pending requests wait for to `fds`;
    /// `false` when some pending request cannot say.
    fn wait_on(&self, fds: &mut Vec<libc::pollfd>) -> bool;
}

/// The proxy's doorbell: an eventfd written only while the proxy sleeps.
pub(crate) struct Bell {
    fd: OwnedFd,
    sleeping: AtomicBool,
}

impl Doorbell for Bell {
    fn ring(&self) {
        if self.sleeping.load(Ordering::SeqCst) && self.sleeping.swap(false, Ordering::SeqCst) {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own;
            // a full counter (EAGAIN) already means "woken".
            unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

impl Bell {
    fn new() -> io::Result<Bell> {
        // SAFETY: plain eventfd(2) call; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Bell {
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
        })
    }

    /// Empties the eventfd after a sleep.
    fn drain(&self) {
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64 from a
        // non-blocking eventfd we own.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

struct Proxy {
    bell: Arc<Bell>,
    /// Connections handed over and not yet taken by the thread, and
    /// whether a thread runs.
    adopted: Mutex<(Vec<Box<dyn Work>>, bool)>,
    /// Whether `adopted` holds connections (read on every pass).
    news: AtomicBool,
}

static PROXY: OnceLock<Proxy> = OnceLock::new();

fn proxy() -> io::Result<&'static Proxy> {
    if let Some(proxy) = PROXY.get() {
        return Ok(proxy);
    }
    let bell = Arc::new(Bell::new()?);
    Ok(PROXY.get_or_init(|| Proxy {
        bell,
        adopted: Mutex::new((Vec::new(), false)),
        news: AtomicBool::new(false),
    }))
}

/// The doorbell FIFO handles ring to wake the proxy.
pub(crate) fn bell() -> io::Result<Arc<Bell>> {
    Ok(proxy()?.bell.clone())
}

/// Hands `work` to the proxy thread, starting the thread if none runs.
pub(crate) fn adopt(work: Box<dyn Work>) -> io::Result<()> {
    let proxy = proxy()?;
    {
        let mut adopted = proxy.adopted.lock();
        adopted.0.push(work);
        if !adopted.1 {
            if let Err(err) = std::thread::Builder::new()
                .name("rccl-net-proxy".into())
                .spawn(move || run(proxy))
            {
                adopted.0.pop();
                return Err(err);
            }
            adopted.1 = true;
        }
        proxy.news.store(true, Ordering::SeqCst);
    }
    proxy.bell.ring();
    Ok(())
}

/// Lets the next connection start a new thread if this one unwinds (a
/// bug): its connections are dropped, so their peers see them closed.
struct Running(&'static Proxy);

impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.adopted.lock().1 = false;
        }
    }
}

fn run(proxy: &'static Proxy) {
    let _running = Running(proxy);
    let mut links: Vec<Box<dyn Work>> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        if links.is_empty() || proxy.news.load(Ordering::Acquire) {
            let mut adopted = proxy.adopted.lock();
            proxy.news.store(false, Ordering::SeqCst);
            links.append(&mut adopted.0);
            if links.is_empty() {
                adopted.1 = false;
                return;
            }
        }
        if pass(&mut links) {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < YIELD_FOR || POLLING.load(Ordering::Relaxed) > 0 {
            std::thread::yield_now();
            continue;
        }
        // Announce the sleep, then look once more: a FIFO moved after this
        // look rings the bell, which ends the sleep at once.
        proxy.bell.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if proxy.news.load(Ordering::SeqCst)
            || POLLING.load(Ordering::SeqCst) > 0
            || pass(&mut links)
        {
            proxy.bell.sleeping.store(false, Ordering::SeqCst);
            idle_since = None;
            continue;
        }
        fds.clear();
        fds.push(libc::pollfd {
            fd: proxy.bell.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let mut exact = true;
        for link in &links {
            exact &= link.wait_on(&mut fds);
        }
        let park = park_for(exact, since.elapsed());
        let timeout = libc::timespec {
            tv_sec: park.as_secs() as libc::time_t,
            tv_nsec: park.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `fds` holds `fds.len()` initialised pollfds and lives
        // across the call; a valid timeout and no signal mask. Errors
        // (EINTR) just end the sleep.
        unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &timeout,
                std::ptr::null(),
            )
        };
        proxy.bell.sleeping.store(false, Ordering::SeqCst);
        if fds[0].revents != 0 {
            proxy.bell.drain();
        }
    }
}

/// How long the proxy sleeps, idle for `idle`: until woken when every
/// pending request said what it waits for (`exact`), else briefly, so that
/// requests nothing wakes for (a net plug-in's) are tested again; shortly
/// after the last movement more briefly still, so that the next message of
/// an operation in progress is not paced by the sleep.
fn park_for(exact: bool, idle: Duration) -> Duration {
    match (exact, idle < RECENT) {
        (true, _) => PARK_MAX,
        (false, true) => PARK_UNKNOWN_RECENT,
        (false, false) => PARK_UNKNOWN,
    }
}

/// One pass over every connection: whether anything moved. Finished
/// connections are dropped.
fn pass(links: &mut Vec<Box<dyn Work>>) -> bool {
    let mut moved = false;
    links.retain_mut(|link| match link.progress() {
        Progress::Idle => true,
        Progress::Moved => {
            moved = true;
            true
        }
        Progress::Finished => {
            moved = true;
            false
        }
    });
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While messages flow, a plug-in's requests are tested again within
    /// 50 us, not 1 ms: with 1 ms sleeps, 199 round trips with another
    /// process through the C test plug-in took 710 ms against 40-160 ms.
    #[test]
    fn sleeps_on_untellable_requests_stay_short_while_messages_flow() {
        let short = Duration::from_micros(50);
        assert_eq!(park_for(false, Duration::ZERO), short);
        assert_eq!(park_for(false, RECENT - Duration::from_micros(1)), short);
        assert_eq!(park_for(false, RECENT), Duration::from_millis(1));
        // Requests that name their file descriptors sleep until woken.
        assert_eq!(park_for(true, Duration::ZERO), PARK_MAX);
    }
}
