//! Connection setup: every connection a launch's work needs, made before it
//! runs. Shared memory within a host, TCP otherwise; waits for a peer's
//! side run in slices with the checks of [`crate::stuck`] between them.

use rccl_transports::process::ProcessId;
use rccl_transports::shm::{self, ShmConnection, ShmSegment};
use rccl_transports::tcp::TcpConnection;
use rccl_transports::{Connection, Protocol};

use crate::call::describe_call;
use crate::comm::{failure_note, CommInner};
use crate::error::{Error, Result};
use crate::executor::{self, BoardLink, Link, OpWork};
use crate::plan::CommLaunch;
use crate::stuck::{self, Calls, Notices};

/// Makes sure every connection the planned work needs exists. Dials first
/// for every communicator, then collects the connections peers dialed, so
/// that one thread can set up several communicators of one process.
pub(crate) fn connect(
    launches: &[CommLaunch],
    guards: &mut [parking_lot::MutexGuard<'_, crate::state::ExecState>],
    started: std::time::Instant,
) -> Result<()> {
    let nothing_to_open = launches.iter().zip(guards.iter()).all(|(launch, guard)| {
        launch.channels.is_empty() && (launch.board.is_empty() || guard.board.is_some())
    });
    if nothing_to_open {
        return Ok(());
    }
    for dialing in [true, false] {
        for (launch, guard) in launches.iter().zip(guards.iter_mut()) {
            let comm = &launch.comm;
            let setup = Setup {
                launch,
                deadline: started + comm.config.timeout,
            };
            // Rank 0 makes the board (while dialing), the others map it.
            if !launch.board.is_empty() && guard.board.is_none() && (comm.rank == 0) == dialing {
                guard.board = Some(open_board(&setup).inspect_err(|err| comm.poison(err))?);
            }
            for (channel, work) in launch.channels.iter().enumerate() {
                let peers = peers_of(work);
                for peer in peers {
                    if guard.links[channel][peer].is_some() || comm.tcp.dials(peer) != dialing {
                        continue;
                    }
                    let conn = open_connection(&setup, peer, channel, dialing)
                        .inspect_err(|err| comm.poison(err))?;
                    guard.links[channel][peer] = Some(Link {
                        conn,
                        peer_name: comm.describe(peer),
                    });
                }
            }
        }
    }
    Ok(())
}

/// One communicator's connection setup within a launch.
struct Setup<'l> {
    launch: &'l CommLaunch,
    deadline: std::time::Instant,
}

impl Setup<'_> {
    /// The calls the launch runs on the communicator.
    fn calls(&self) -> Calls {
        let mut calls = Calls::default();
        let launch = self.launch;
        let channels = launch.channels.iter().flatten().map(|w| w.tag);
        channels
            .chain(launch.board.iter().map(|op| op.tag))
            .for_each(|tag| calls.add(tag));
        calls
    }

    /// Waits for `peer` to set up its side of `what`: `attempt(until)`
    /// tries until `until` (`Ok(None)`: nothing yet). Between attempts it
    /// tells the peer what this rank runs and compares what the peer said
    /// (see [`stuck`]), so a peer that runs another call is reported at
    /// once rather than at the deadline.
    fn wait_for<T>(
        &self,
        peer: usize,
        what: impl Fn() -> String,
        mut attempt: impl FnMut(std::time::Instant) -> Result<Option<T>>,
    ) -> Result<T> {
        let comm = &self.launch.comm;
        let start = std::time::Instant::now();
        let mut told: Option<(Notices<'_>, Calls)> = None;
        let result = (|| loop {
            let until = self
                .deadline
                .min(std::time::Instant::now() + executor::STALL_CHECK_EVERY);
            if let Some(got) = attempt(until)? {
                return Ok(got);
            }
            let waited = start.elapsed();
            if std::time::Instant::now() >= self.deadline {
                return Err(Error::System(format!(
                    "rank {} of {}: timed out after {:?} waiting for {} to set up {} for {} \
                     (does it run the same calls?)",
                    comm.rank,
                    comm.nranks,
                    comm.config.timeout,
                    comm.describe(peer),
                    what(),
                    describe_call(self.calls().first())
                )));
            }
            if waited >= stuck::NOTICE_AFTER {
                let (notices, calls) =
                    told.get_or_insert_with(|| (Notices::new(&**comm), self.calls()));
                notices.tell(peer, calls);
                if let Some(error) = notices.check(calls, &[peer], waited) {
                    return Err(error);
                }
            }
        })();
        if let (Err(error), Some((notices, _))) = (&result, &mut told) {
            notices.fail(&failure_note(comm, error));
        }
        result
    }
}

/// Bootstrap tags of shared-memory segment names, one per channel.
const SHM_TAG_BASE: u64 = 2 << 40;

/// Bootstrap tag of the board's segment name.
const BOARD_TAG: u64 = 3 << 40;

/// Starts the message a segment's creator sends in place of its name (names
/// start with `/`) when it could not make the segment, followed by why, so
/// that the peers waiting for the name fail at once with the cause.
const NO_SEGMENT: &[u8] = b"!";

/// Why `creator` sent no segment name, if the message `got` says so.
fn no_segment(comm: &CommInner, creator: usize, got: &[u8], what: &str) -> Option<Error> {
    let why = got.strip_prefix(NO_SEGMENT)?;
    Some(Error::Remote(format!(
        "rank {}: {} could not create {what}: {}",
        comm.rank,
        comm.describe(creator),
        String::from_utf8_lossy(why)
    )))
}

/// The error of a segment that could not be created, with what to change
/// when `/dev/shm` lacks room (`smaller`: the setting that sizes it).
fn creation_failed(e: std::io::Error, smaller: &str) -> String {
    if e.kind() == std::io::ErrorKind::OutOfMemory {
        format!(
            "{e}; give the job a larger /dev/shm (e.g. docker run --shm-size), {smaller}, or \
             set NCCL_SHM_DISABLE=1 (TCP between the ranks of a host)"
        )
    } else {
        e.to_string()
    }
}

/// Makes (rank 0) or maps (the others) the communicator's board. Rank 0
/// removes the segment's name once every rank has posted on it, which
/// proves they all mapped it.
fn open_board(setup: &Setup<'_>) -> Result<BoardLink> {
    let comm = &setup.launch.comm;
    let (nranks, capacity) = (comm.nranks, comm.config.board_bytes);
    let failed = |what: &str, e: std::io::Error| {
        Error::Remote(format!("rank {}: {what} the board: {e}", comm.rank))
    };
    let board = if comm.rank == 0 {
        let board = match rccl_transports::Board::create(nranks, capacity) {
            Ok(board) => board,
            Err(e) => {
                let why = creation_failed(e, "a smaller RCCL_BOARD_BYTES (0 turns the board off)");
                let note = [NO_SEGMENT, why.as_bytes()].concat();
                for peer in 1..nranks {
                    let _ = comm.bootstrap.send(peer, BOARD_TAG, &note);
                }
                return Err(Error::System(format!(
                    "rank {}: creating the board: {why}",
                    comm.rank
                )));
            }
        };
        for peer in 1..nranks {
            comm.bootstrap
                .send(peer, BOARD_TAG, board.name().as_bytes())?;
        }
        board
    } else {
        let name = setup.wait_for(
            0,
            || "the board".to_string(),
            |until| comm.bootstrap.recv_until(0, BOARD_TAG, until),
        )?;
        if let Some(err) = no_segment(comm, 0, &name, "the board") {
            return Err(err);
        }
        let name = String::from_utf8(name).map_err(|_| {
            Error::Remote(format!("{} sent a malformed board name", comm.describe(0)))
        })?;
        rccl_transports::Board::open(&name, nranks, capacity).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                // A creator that closes its board removes the name.
                Error::Remote(format!(
                    "rank {}: the board of {} was removed before this rank mapped it: {} gave \
                     up on the communicator (a failed call, an abort or its destruction)",
                    comm.rank,
                    comm.describe(0),
                    comm.describe(0)
                ))
            } else {
                failed("mapping", e)
            }
        })?
    };
    tracing::info!(
        target: crate::debug::SHM,
        "[{}] Board: {nranks} ranks x 2 posts of {capacity} bytes via SHM",
        comm.rank
    );
    let own_pid = std::process::id();
    let watch = comm
        .peers
        .iter()
        .map(|info| {
            let process = ProcessId {
                pid: info.pid,
                start: info.start,
            };
            (info.start != 0 && info.pid != own_pid && process.visible()).then_some(process)
        })
        .collect();
    Ok(BoardLink {
        board,
        watch,
        names: (0..nranks).map(|r| comm.describe(r)).collect(),
    })
}

/// Opens this rank's side of the connection to `peer` on `channel`: the
/// dialing (lower) rank creates it, the other side joins what was created.
/// Shared memory within a host, TCP otherwise.
fn open_connection(
    setup: &Setup<'_>,
    peer: usize,
    channel: usize,
    creating: bool,
) -> Result<Box<dyn Connection>> {
    let comm = &setup.launch.comm;
    let shape = comm.config.fifo_shape();
    let failed = |what: &str, e: std::io::Error| {
        Error::Remote(format!(
            "rank {}: {what} {} on channel {channel}: {e}",
            comm.rank,
            comm.describe(peer)
        ))
    };
    if comm.shares_memory_with(peer) {
        let tag = SHM_TAG_BASE + channel as u64;
        let len = shm::segment_bytes(&shape);
        let segment = if creating {
            let segment = match ShmSegment::create(len) {
                Ok(segment) => segment,
                Err(e) => {
                    let why = creation_failed(e, "a smaller NCCL_BUFFSIZE or NCCL_MAX_NCHANNELS");
                    let _ = comm
                        .bootstrap
                        .send(peer, tag, &[NO_SEGMENT, why.as_bytes()].concat());
                    return Err(Error::System(format!(
                        "rank {}: creating shared memory for {} on channel {channel}: {why}",
                        comm.rank,
                        comm.describe(peer)
                    )));
                }
            };
            comm.bootstrap.send(peer, tag, segment.name().as_bytes())?;
            segment
        } else {
            let name = setup.wait_for(
                peer,
                || format!("the shared-memory connection on channel {channel}"),
                |until| comm.bootstrap.recv_until(peer, tag, until),
            )?;
            let what = format!("shared memory for channel {channel}");
            if let Some(err) = no_segment(comm, peer, &name, &what) {
                return Err(err);
            }
            let name = String::from_utf8(name).map_err(|_| {
                Error::Remote(format!(
                    "{} sent a malformed segment name",
                    comm.describe(peer)
                ))
            })?;
            let segment =
                ShmSegment::open(&name, len).map_err(|e| failed("mapping shared memory of", e))?;
            segment
                .unlink()
                .map_err(|e| failed("unlinking shared memory of", e))?;
            segment
        };
        tracing::info!(
            target: crate::debug::SHM,
            "[{}] Channel {channel:02} : {} -> {peer} via SHM/direct",
            comm.rank,
            comm.rank
        );
        let mut conn = ShmConnection::new(segment, creating, &shape);
        let info = &comm.peers[peer];
        if info.start != 0 {
            conn.watch_peer(ProcessId {
                pid: info.pid,
                start: info.start,
            });
        }
        return Ok(Box::new(conn));
    }
    let stream = if creating {
        comm.tcp
            .dial(peer, comm.peers[peer].data_addr, channel, setup.deadline)
            .map_err(|e| failed("connecting to", e))?
    } else {
        setup.wait_for(
            peer,
            || format!("the network connection on channel {channel}"),
            |until| match comm.tcp.accept_from(peer, channel, until, &comm.abort) {
                Ok(stream) => Ok(Some(stream)),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(None),
                Err(e) => Err(failed("connecting to", e)),
            },
        )?
    };
    tracing::info!(
        target: crate::debug::NET,
        "[{}] Channel {channel:02} : {} -> {peer} via NET/Socket ({})",
        comm.rank,
        comm.rank,
        comm.peers[peer].data_addr
    );
    let conn = TcpConnection::start(stream, shape.nslots, shape.slot_bytes(Protocol::Simple))
        .map_err(|e| Error::io("starting connection proxies", e))?;
    Ok(Box::new(conn))
}

fn peers_of(work: &[OpWork]) -> Vec<usize> {
    let mut peers: Vec<usize> = work
        .iter()
        .flat_map(|w| w.steps.iter())
        .flat_map(|s| s.prims.iter())
        .flat_map(|p| p.send_peer().into_iter().chain(p.recv_peer()))
        .collect();
    peers.sort_unstable();
    peers.dedup();
    peers
}
