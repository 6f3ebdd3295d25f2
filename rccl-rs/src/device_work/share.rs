//! Device work between processes of one host. As NCCL's P2P transport,
//! the receiver owns a FIFO: a rank allocates the FIFOs it receives on
//! from ranks of other processes as shareable device memory, exports each
//! (a file descriptor: CUDA's cuMem POSIX handle, the emulated GPU's
//! memfd) and hands it to the sender over a Unix socket (`SCM_RIGHTS`),
//! opened only by the token the authenticated bootstrap carries; the
//! sender maps it. Both FIFOs of a link then sit in `device_links` as for
//! ranks of one process, and the kernels' interpreter runs over them.
//!
//! While such work runs, the processes of the communicator's other ranks
//! are watched: one that dies stops the work with an error naming its
//! rank, as the host path's shared-memory links do.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rccl_device::Device;
use rccl_transports::fd_pass::{self, recv_fd, send_fd, ExportListener, NAME_PREFIX, TOKEN};
use rccl_transports::fifo::fifo_bytes;
use rccl_transports::process::ProcessId;
use rccl_transports::{FifoShape, Protocol};

use crate::comm::{CommInner, PeerWatch};
use crate::device_work::links::{DeviceMem, FifoPair};
use crate::error::{Error, Result};

/// Bootstrap tag of a rank's offer of its exported FIFOs to a peer.
const SHARE_TAG: u64 = 5 << 40;

/// How often a running launch looks at its peers' processes.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// How long a wait for a peer's offer lasts between checks of the peers.
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// How long a launch may go on after a peer's process was seen gone.
const DEAD_PEER_GRACE: Duration = Duration::from_secs(2);

/// Whether this rank's device work reaches the ranks of `comm` in other
/// processes of this host: the device shares memory between processes,
/// unless `NCCL_P2P_DISABLE` (the conditions of the `P2P/IPC` transport).
pub(crate) fn available(comm: &CommInner) -> bool {
    !comm.config.p2p_disable && rccl_device::active().is_some_and(|device| device.shares_memory())
}

/// Connects the links `wanted` (`(channel, peer)`, every peer in another
/// process) for `protocol`: exports this rank's receiving FIFOs to the
/// peers and maps theirs. Every peer makes the same call (the links of a
/// schedule come in pairs); returns the links once all are made, or fails
/// at the communicator's timeout.
pub(crate) fn connect(
    comm: &CommInner,
    device: &'static dyn Device,
    shape: &FifoShape,
    protocol: Protocol,
    wanted: &[(usize, usize)],
) -> Result<Vec<(usize, usize, FifoPair)>> {
    let bytes = fifo_bytes(protocol, shape.nslots, shape.slot_bytes(protocol));
    let deadline = Instant::now() + comm.config.timeout;
    let rank = comm.rank;
    let fail = |peer: usize, what: &str, e: &dyn std::fmt::Display| {
        Error::System(format!(
            "rank {rank}: device work with {}: {what}: {e}",
            comm.describe(peer)
        ))
    };
    let mut channels: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(channel, peer) in wanted {
        channels.entry(peer).or_default().push(channel);
    }
    // This rank's receiving FIFOs, and their handles for the peers.
    let mut inbound: BTreeMap<usize, Vec<Arc<DeviceMem>>> = BTreeMap::new();
    let mut handles: BTreeMap<usize, Vec<OwnedFd>> = BTreeMap::new();
    for (&peer, list) in &channels {
        for _ in list {
            let fifo = DeviceMem::own(device, device.alloc_shareable(bytes)?);
            let (handle, _) = device.export(fifo.ptr)?;
            inbound.entry(peer).or_default().push(fifo);
            handles.entry(peer).or_default().push(handle);
        }
    }
    let mut export = fd_pass::listen()
        .map_err(|e| Error::System(format!("rank {rank}: device work: a Unix socket: {e}")))?;
    for (&peer, list) in &channels {
        let mut offer = export.token.to_vec();
        offer.extend_from_slice(&(list.len() as u32).to_le_bytes());
        list.iter()
            .for_each(|c| offer.extend_from_slice(&(*c as u32).to_le_bytes()));
        offer.extend_from_slice(export.name.as_bytes());
        comm.bootstrap.send(peer, SHARE_TAG, &offer)?;
    }
    // Set when fetching fails: the hand-over stops with it.
    let given_up = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let server = scope.spawn(|| {
            let mut watch = PeerWatch::default();
            serve(&mut export, handles, deadline, &given_up, |waiting| {
                watch.check(comm, waiting)
            })
        });
        let fetched: Result<Vec<_>> = channels.iter().try_fold(
            Vec::with_capacity(wanted.len()),
            |mut links, (&peer, list)| {
                let outbound = fetch(comm, peer, list, deadline)
                    .map_err(|e| match e {
                        Fetch::Io(what, e) => fail(peer, what, &e),
                        Fetch::Engine(e) => e,
                    })?
                    .into_iter()
                    .map(|handle| Ok(DeviceMem::own(device, device.import(handle, bytes)?)))
                    .collect::<Result<Vec<_>>>()?;
                for ((&channel, send), recv) in list.iter().zip(outbound).zip(&inbound[&peer]) {
                    links.push((channel, peer, (send, recv.clone())));
                }
                Ok(links)
            },
        );
        if fetched.is_err() {
            given_up.store(true, Ordering::Relaxed);
        }
        let served = match server.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err((peer, Fetch::Io(what, e)))) => Err(fail(peer, what, &e)),
            Ok(Err((_, Fetch::Engine(e)))) => Err(e),
            Err(_) => Err(Error::Internal("the FIFO hand-over thread panicked".into())),
        };
        let links = fetched?;
        served.map(|()| links)
    })
}

/// Why fetching a peer's FIFOs failed.
enum Fetch {
    Io(&'static str, io::Error),
    Engine(Error),
}

/// The handles of `peer`'s FIFOs to this rank on `channels`: reads its
/// offer from the bootstrap, calls its socket with the token.
fn fetch(
    comm: &CommInner,
    peer: usize,
    channels: &[usize],
    deadline: Instant,
) -> std::result::Result<Vec<OwnedFd>, Fetch> {
    let mut watch = PeerWatch::default();
    let offer = loop {
        let until = deadline.min(Instant::now() + WAIT_SLICE);
        if let Some(offer) = comm
            .bootstrap
            .recv_until(peer, SHARE_TAG, until)
            .map_err(Fetch::Engine)?
        {
            break offer;
        }
        if Instant::now() >= deadline {
            return Err(Fetch::Io("its offer", io::ErrorKind::TimedOut.into()));
        }
        watch.check(comm, &[peer]).map_err(Fetch::Engine)?;
    };
    let malformed = || Fetch::Io("its offer", io::ErrorKind::InvalidData.into());
    let (token, rest) = offer.split_at_checked(TOKEN).ok_or_else(malformed)?;
    let (count, rest) = rest.split_at_checked(4).ok_or_else(malformed)?;
    let count = u32::from_le_bytes(count.try_into().expect("4 bytes")) as usize;
    let (list, name) = rest.split_at_checked(count * 4).ok_or_else(malformed)?;
    let theirs: Vec<usize> = list
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as usize)
        .collect();
    if theirs != channels || !name.starts_with(NAME_PREFIX.as_bytes()) {
        return Err(Fetch::Engine(Error::InvalidUsage(format!(
            "rank {}: device work: {} links channels {theirs:?}, this rank {channels:?}: the \
             ranks' calls differ",
            comm.rank,
            comm.describe(peer)
        ))));
    }
    let io = |what| move |e| Fetch::Io(what, e);
    let stream = fd_pass::call(name, &[token, &(comm.rank as u32).to_le_bytes()].concat())
        .map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => Fetch::Engine(left_setup(comm, peer, &e)),
            _ => Fetch::Io("calling its socket", e),
        })?;
    let mut handles = Vec::with_capacity(channels.len());
    while handles.len() < channels.len() {
        match recv_fd(&stream).map_err(io("receiving a handle"))? {
            Some(handle) => handles.push(handle),
            None if Instant::now() < deadline => {
                watch.check(comm, &[peer]).map_err(Fetch::Engine)?;
                std::thread::sleep(Duration::from_millis(1));
            }
            None => {
                return Err(Fetch::Io(
                    "receiving a handle",
                    io::ErrorKind::TimedOut.into(),
                ))
            }
        }
    }
    Ok(handles)
}

/// Hands each peer its handles once it calls with the token and its rank;
/// a caller without the token gets nothing, and callers that say nothing
/// delay nobody (see [`ExportListener`]). Fails with the first peer not
/// served by `deadline`, as soon as `still_there` fails for the peers not
/// served yet (this rank aborted, one of them gone), or once `given_up` is
/// set.
fn serve(
    export: &mut ExportListener,
    mut handles: BTreeMap<usize, Vec<OwnedFd>>,
    deadline: Instant,
    given_up: &AtomicBool,
    mut still_there: impl FnMut(&[usize]) -> Result<()>,
) -> std::result::Result<(), (usize, Fetch)> {
    let first = |handles: &BTreeMap<usize, Vec<OwnedFd>>| *handles.keys().next().expect("some");
    let io = |peer, e| (peer, Fetch::Io("handing over its FIFOs", e));
    while !handles.is_empty() && !given_up.load(Ordering::Relaxed) {
        let (stream, said) = match export.next_caller(4) {
            Ok(Some(caller)) => caller,
            Ok(None) if Instant::now() < deadline => {
                let waiting: Vec<usize> = handles.keys().copied().collect();
                still_there(&waiting).map_err(|e| (first(&handles), Fetch::Engine(e)))?;
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Ok(None) => return Err(io(first(&handles), io::ErrorKind::TimedOut.into())),
            Err(e) => return Err(io(first(&handles), e)),
        };
        let caller = u32::from_le_bytes(said[..].try_into().expect("4 bytes")) as usize;
        let Some(theirs) = handles.remove(&caller) else {
            continue;
        };
        for handle in &theirs {
            send_fd(&stream, handle).map_err(|e| io(caller, e))?;
        }
    }
    Ok(())
}

/// Why `peer`, whose offer came, refused the call to its hand-over
/// socket: it closed the socket, so it left this setup. The failure it
/// told says why, when it told one; else it destroyed or aborted its
/// communicator, or its process ended (said when seen).
fn left_setup(comm: &CommInner, peer: usize, refused: &io::Error) -> Error {
    if let Some(told) = crate::stuck::peer_failure(comm) {
        return told;
    }
    let ended = comm.processes[peer]
        .and_then(|process| process.gone())
        .map_or(String::new(), |why| format!(" ({why})"));
    Error::Remote(format!(
        "rank {}: device work with {}: it left this setup before this rank called its \
         hand-over socket ({refused}): it destroyed or aborted its communicator, or its \
         process ended{ended}",
        comm.rank,
        comm.describe(peer)
    ))
}

/// A peer seen gone: since when, which rank, why.
type Gone = (Instant, usize, String);

/// A watch over the processes of a communicator's ranks elsewhere on this
/// host, for a running launch.
pub(crate) struct Watch {
    comm: Arc<CommInner>,
    peers: Vec<(usize, ProcessId)>,
    /// When to look next; the first peer seen gone.
    state: Mutex<(Instant, Option<Gone>)>,
}

impl Watch {
    /// `None` when no rank of `comm` is in another process of this host
    /// (a process id means nothing on another host: the network
    /// connections tell those ranks' ends).
    pub(crate) fn new(comm: &Arc<CommInner>) -> Option<Watch> {
        let here = &comm.peers[comm.rank].host_id;
        let peers: Vec<(usize, ProcessId)> = (0..comm.nranks)
            .filter(|&peer| {
                let p = &comm.peers[peer];
                comm.in_other_process(peer) && p.start != 0 && p.host_id == *here
            })
            .map(|peer| {
                let p = &comm.peers[peer];
                (
                    peer,
                    ProcessId {
                        pid: p.pid,
                        start: p.start,
                    },
                )
            })
            .collect();
        (!peers.is_empty()).then(|| Watch {
            comm: comm.clone(),
            peers,
            state: Mutex::new((Instant::now(), None)),
        })
    }

    /// Whether a peer's process has died while this launch still needs it
    /// (looked at every [`WATCH_EVERY`]); the first one found poisons the
    /// communicator with an error naming it. A peer may finish its part
    /// and exit while this rank still drains what it wrote (the FIFOs stay
    /// mapped here), so a launch fails only when it still runs
    /// [`DEAD_PEER_GRACE`] after the peer was seen gone.
    pub(crate) fn peer_died(&self) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock();
        if now < state.0 {
            return false;
        }
        state.0 = now + WATCH_EVERY;
        if state.1.is_none() {
            state.1 = self
                .peers
                .iter()
                .find_map(|(peer, process)| Some((now, *peer, process.gone()?)));
        }
        // The first peer seen gone is named: the others may have failed
        // and exited because of it.
        let Some((since, peer, why)) = &state.1 else {
            return false;
        };
        if now.duration_since(*since) < DEAD_PEER_GRACE {
            return false;
        }
        self.comm.poison(&Error::Remote(format!(
            "rank {}: device work: {} died: {why}",
            self.comm.rank,
            self.comm.describe(*peer)
        )));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};

    #[test]
    fn callers_that_say_nothing_or_half_the_token_do_not_delay_the_peer() {
        let mut export = fd_pass::listen().unwrap();
        let at = SocketAddr::from_abstract_name(&export.name).unwrap();
        let silent = UnixStream::connect_addr(&at).unwrap();
        let mut half = UnixStream::connect_addr(&at).unwrap();
        half.write_all(&export.token[..TOKEN / 2]).unwrap();
        let hello = [&export.token[..], &1u32.to_le_bytes()].concat();
        let peer = fd_pass::call(export.name.as_bytes(), &hello).unwrap();
        let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let handles = BTreeMap::from([(1, vec![null])]);
        let served = serve(
            &mut export,
            handles,
            Instant::now() + Duration::from_secs(3),
            &AtomicBool::new(false),
            |_| Ok(()),
        );
        assert!(served.is_ok(), "the peer was not served");
        let handle = loop {
            if let Some(handle) = recv_fd(&peer).unwrap() {
                break handle;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let target = std::fs::read_link(format!("/proc/self/fd/{}", handle.as_raw_fd())).unwrap();
        assert_eq!(target, std::path::Path::new("/dev/null"));
        drop((silent, half));
    }
}
