//! The watch over the processes of a running launch's peers elsewhere on
//! this host. One thread per process sleeps in `poll(2)` on the peers'
//! process file descriptors (`pidfd_open`), which the kernel makes readable
//! when the process ends: a death is seen as it happens, not at the next
//! look of a poller. Once the grace has passed the thread stops the launch
//! itself: it poisons the communicator with an error naming the peer and
//! sets the launch's abort word, which the device's waiting channels read,
//! so nothing on the device side has to run, however loaded the machine,
//! for the launch to be told.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rccl_transports::ProcessId;

use super::links::DeviceMem;
use crate::comm::CommInner;
use crate::error::Error;

/// How long a launch may go on after a peer's process was first seen gone
/// (by any launch of this process): a peer may finish its part and exit
/// while this rank still drains what it wrote (the FIFOs stay mapped
/// here).
const DEAD_PEER_GRACE: Duration = Duration::from_secs(2);

/// How often a peer whose process file descriptor could not be opened
/// (other than for being gone) is looked at in `/proc` instead.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// A peer seen gone: since when, which rank, why.
type Gone = (Instant, usize, String);

/// A rank in another process of this host, as one launch watches it.
struct Peer {
    rank: usize,
    process: ProcessId,
    /// Readable once the process has ended; `None` when it could not be
    /// opened (looked at every [`LOOK_EVERY`] instead).
    pidfd: Option<OwnedFd>,
}

/// What stops a launch once a peer it watches has been gone for the
/// grace: told the peer's rank and why it is gone.
type Stop = Box<dyn Fn(usize, &str) + Send + Sync>;

/// One running launch's watch, shared with the watching thread.
struct Watched {
    peers: Vec<Peer>,
    stop: Stop,
    /// The first peer seen gone: the others may have failed and exited
    /// because of it.
    gone: Mutex<Option<Gone>>,
    /// Whether the thread has looked at every peer in `/proc` once since
    /// the watch began.
    looked: AtomicBool,
}

/// A watch over the peers of one communicator of a running launch;
/// dropped when the launch ends.
pub(crate) struct Watch {
    watched: Arc<Watched>,
}

impl Watch {
    /// Starts watching the ranks of `comm` in other processes of this host
    /// for a launch whose abort word for `comm` is `abort`; `None` when
    /// there are none (a process id means nothing on another host: the
    /// network connections tell those ranks' ends) or no thread can watch.
    pub(crate) fn new(comm: &Arc<CommInner>, abort: &Arc<DeviceMem>) -> Option<Watch> {
        let here = &comm.peers[comm.rank].host_id;
        let peers: Vec<(usize, ProcessId)> = (0..comm.nranks)
            .filter(|&peer| {
                let p = &comm.peers[peer];
                comm.in_other_process(peer) && p.start != 0 && p.host_id == *here
            })
            .map(|rank| {
                let p = &comm.peers[rank];
                let process = ProcessId {
                    pid: p.pid,
                    start: p.start,
                };
                (rank, process)
            })
            .collect();
        let (comm, abort) = (comm.clone(), abort.clone());
        Watch::start(peers, move |peer, why| {
            comm.poison(&Error::Remote(format!(
                "rank {}: device work: {} died: {why}",
                comm.rank,
                comm.describe(peer)
            )));
            // The communicator is poisoned first: a later launch of it
            // that finds the word set ends at once, reporting this failure.
            // SAFETY: the abort word, a 4-byte device word the host writes
            // (emu: host memory; CUDA: mapped page-locked memory), kept
            // allocated by `abort`, read by the device with atomic loads.
            unsafe { AtomicU32::from_ptr(abort.ptr.cast::<u32>()) }.store(1, Ordering::Release);
        })
    }

    /// Watches `peers` (rank, process), calling `stop` once, on the
    /// watching thread, if one of them is gone for [`DEAD_PEER_GRACE`]
    /// before the watch is dropped; `None` when there are none to watch or
    /// no thread can watch.
    fn start(
        peers: Vec<(usize, ProcessId)>,
        stop: impl Fn(usize, &str) + Send + Sync + 'static,
    ) -> Option<Watch> {
        if peers.is_empty() {
            return None;
        }
        let wake = wake_fd()?;
        let peers = peers
            .into_iter()
            .map(|(rank, process)| Peer {
                rank,
                process,
                pidfd: pidfd_open(process.pid),
            })
            .collect();
        let watched = Arc::new(Watched {
            peers,
            stop: Box::new(stop),
            gone: Mutex::new(None),
            looked: AtomicBool::new(false),
        });
        LAUNCHES.lock().push(watched.clone());
        wake_watcher(wake);
        Some(Watch { watched })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        LAUNCHES.lock().retain(|w| !Arc::ptr_eq(w, &self.watched));
        if let Some(wake) = wake_fd() {
            wake_watcher(wake);
        }
    }
}

/// The launches the thread watches.
static LAUNCHES: Mutex<Vec<Arc<Watched>>> = Mutex::new(Vec::new());

/// Each peer process seen gone, and when first: a launch that begins after
/// a peer died (the launch running then finished, the peer having done its
/// part) has what is left of the grace, not a grace of its own.
static SEEN_GONE: Mutex<Vec<(ProcessId, Instant)>> = Mutex::new(Vec::new());

/// The eventfd that wakes the thread when [`LAUNCHES`] changes, with the
/// process that started the thread (a child forked from it has no such
/// thread, and starts its own). No descriptor when it or the thread could
/// not be made: launches then run without the watch, ending at their
/// deadline as any other.
static WAKE: Mutex<Option<(u32, Option<OwnedFd>)>> = Mutex::new(None);

/// The watching thread's eventfd, starting the thread on first use in
/// this process.
fn wake_fd() -> Option<RawFd> {
    let pid = std::process::id();
    let mut wake = WAKE.lock();
    if wake.as_ref().is_none_or(|(owner, _)| *owner != pid) {
        // Those of the process this one was forked from are not its own.
        LAUNCHES.lock().clear();
        SEEN_GONE.lock().clear();
        *wake = Some((pid, start_watcher()));
    }
    wake.as_ref()?.1.as_ref().map(AsRawFd::as_raw_fd)
}

fn start_watcher() -> Option<OwnedFd> {
    // SAFETY: plain eventfd creation; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!("process watch: eventfd: {e}");
        return None;
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let wake = unsafe { OwnedFd::from_raw_fd(fd) };
    // The descriptor stays in WAKE for the life of the process.
    let raw = wake.as_raw_fd();
    let spawned = std::thread::Builder::new()
        .name("rccl-proc-watch".into())
        .spawn(move || watch_forever(raw));
    match spawned {
        Ok(_) => Some(wake),
        Err(e) => {
            tracing::warn!("process watch: cannot start its thread: {e}");
            None
        }
    }
}

fn wake_watcher(wake: RawFd) {
    // SAFETY: the watcher's eventfd, open for the life of the process; an
    // 8-byte counter increment.
    let _ = unsafe { libc::eventfd_write(wake, 1) };
}

/// A descriptor that becomes readable when process `pid` ends, or `None`
/// (an old kernel, out of descriptors, or the process already gone, which
/// a look in `/proc` then reports).
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new
    // descriptor or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a new descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn watch_forever(wake: RawFd) {
    loop {
        let launches = LAUNCHES.lock().clone();
        let now = Instant::now();
        // Each peer is looked at in /proc once: a pid reused before its
        // pidfd was opened names another process (the start time tells),
        // and a peer gone before the launch began leaves no event to wait
        // for. Peers without a pidfd are looked at every LOOK_EVERY.
        for watched in &launches {
            let first = !watched.looked.swap(true, Ordering::Relaxed);
            note_gone(watched, now, |peer| {
                (first || peer.pidfd.is_none()).then(|| peer.process.gone())?
            });
        }
        let mut fds = vec![libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut until: Option<Instant> = None;
        for watched in &launches {
            let due = match &*watched.gone.lock() {
                Some((since, ..)) => Some(*since + DEAD_PEER_GRACE),
                None => {
                    fds.extend(watched.peers.iter().filter_map(|peer| {
                        Some(libc::pollfd {
                            fd: peer.pidfd.as_ref()?.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        })
                    }));
                    let unwatched = watched.peers.iter().any(|peer| peer.pidfd.is_none());
                    unwatched.then(|| now + LOOK_EVERY)
                }
            };
            if let Some(due) = due {
                until = Some(until.map_or(due, |u| u.min(due)));
            }
        }
        let ms = until.map_or(-1, |at| {
            let left = at.saturating_duration_since(Instant::now()).as_millis() + 1;
            left.min(i32::MAX as u128) as i32
        });
        // SAFETY: `fds` is a live array of `fds.len()` pollfds whose
        // descriptors stay open until the call returns (`launches` holds
        // them; the eventfd lives for the process).
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if ready < 0 {
            // Interrupted: look again.
            continue;
        }
        let mut count: libc::eventfd_t = 0;
        // SAFETY: the watcher's eventfd (non-blocking: with nothing to
        // drain it returns at once) into a valid local.
        let _ = unsafe { libc::eventfd_read(wake, &mut count) };
        let ended: Vec<RawFd> = fds[1..]
            .iter()
            .filter(|p| p.revents != 0)
            .map(|p| p.fd)
            .collect();
        let now = Instant::now();
        for watched in &launches {
            note_gone(watched, now, |peer| {
                let fd = peer.pidfd.as_ref()?.as_raw_fd();
                ended.contains(&fd).then(|| {
                    // Its pidfd says it ended: /proc says how, if still
                    // there.
                    peer.process
                        .gone()
                        .unwrap_or_else(|| format!("process {} has exited", peer.process.pid))
                })
            });
        }
        stop_after_grace(now);
    }
}

/// Records the first peer of `watched` that `ended` finds gone (with why,
/// and when it was first seen gone), unless one already was.
fn note_gone(watched: &Watched, now: Instant, ended: impl Fn(&Peer) -> Option<String>) {
    let mut gone = watched.gone.lock();
    if gone.is_none() {
        *gone = watched.peers.iter().find_map(|peer| {
            let why = ended(peer)?;
            Some((first_seen_gone(peer.process, now), peer.rank, why))
        });
    }
}

/// When `process`, gone, was first seen gone: `now` if this is the first.
fn first_seen_gone(process: ProcessId, now: Instant) -> Instant {
    let mut seen = SEEN_GONE.lock();
    if let Some(&(_, at)) = seen.iter().find(|(p, _)| *p == process) {
        return at;
    }
    seen.push((process, now));
    now
}

/// Stops every launch still watched whose first gone peer was seen
/// [`DEAD_PEER_GRACE`] ago, and stops watching it.
fn stop_after_grace(now: Instant) {
    let mut due = Vec::new();
    LAUNCHES.lock().retain(|watched| {
        let late = watched
            .gone
            .lock()
            .as_ref()
            .is_some_and(|(since, ..)| now.duration_since(*since) >= DEAD_PEER_GRACE);
        if late {
            due.push(watched.clone());
        }
        !late
    });
    for watched in due {
        if let Some((_, peer, why)) = &*watched.gone.lock() {
            (watched.stop)(*peer, why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};
    use std::sync::mpsc;

    /// A child that runs until killed, and its process as a watch names it.
    fn sleeper() -> (Child, ProcessId) {
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let (_, start) = rccl_transports::parse_stat(&stat).unwrap();
        (child, ProcessId { pid, start })
    }

    /// What a watch's stop was told, and when.
    type Told = mpsc::Receiver<(Instant, usize, String)>;

    fn watch(rank: usize, process: ProcessId) -> (Watch, Told) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let watch = Watch::start(vec![(rank, process)], move |peer, why| {
            let _ = tx.lock().send((Instant::now(), peer, why.to_string()));
        })
        .unwrap();
        (watch, rx)
    }

    #[test]
    fn a_dead_peer_stops_the_launch_at_the_grace_with_nobody_asking() {
        let (mut child, process) = sleeper();
        let (_watch, told) = watch(3, process);
        // A launch that ended before the grace is never stopped.
        let (ended_early, told_ended) = watch(5, process);
        std::thread::sleep(Duration::from_millis(100));
        let killed = Instant::now();
        child.kill().unwrap();
        child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(ended_early);
        // The grace, then scheduling: 1 s allowed.
        let (at, peer, why) = told
            .recv_timeout(DEAD_PEER_GRACE + Duration::from_secs(1))
            .expect("the watch stopped the launch");
        let after = at.duration_since(killed);
        assert!(after >= DEAD_PEER_GRACE, "{after:?}");
        assert_eq!(peer, 3);
        assert!(why.contains(&process.pid.to_string()), "{why}");
        assert!(told_ended.try_recv().is_err());
        // Once only.
        assert!(told.recv_timeout(Duration::from_millis(200)).is_err());
    }

    #[test]
    fn a_launch_begun_after_a_peer_died_has_what_is_left_of_the_grace() {
        let (mut child, process) = sleeper();
        let (first, told_first) = watch(3, process);
        child.kill().unwrap();
        child.wait().unwrap();
        let killed = Instant::now();
        // The first launch finishes (the peer had done its part), the next
        // begins while the grace runs.
        std::thread::sleep(Duration::from_secs(1));
        drop(first);
        let started = Instant::now();
        let (_next, told) = watch(3, process);
        let (at, peer, _) = told
            .recv_timeout(DEAD_PEER_GRACE + Duration::from_secs(1))
            .expect("the watch stopped the launch");
        assert_eq!(peer, 3);
        // At the grace from the death (which the first launch saw), not
        // a grace after the second launch began.
        assert!(
            at.duration_since(started) < DEAD_PEER_GRACE,
            "stopped {:?} after the death, {:?} after the launch began",
            at.duration_since(killed),
            at.duration_since(started)
        );
        assert!(told_first.try_recv().is_err());
    }

    #[test]
    fn a_peer_gone_before_the_watch_began_is_seen() {
        let (mut child, process) = sleeper();
        child.kill().unwrap();
        child.wait().unwrap();
        let started = Instant::now();
        let (_watch, told) = watch(1, process);
        let (at, peer, why) = told
            .recv_timeout(DEAD_PEER_GRACE + Duration::from_secs(1))
            .expect("the watch stopped the launch");
        assert!(at.duration_since(started) >= DEAD_PEER_GRACE);
        assert_eq!(peer, 1);
        assert!(why.contains("no longer exists"), "{why}");
    }
}
