//! Connection setup: every connection a launch's work needs, made before it
//! runs, through the transport table ([`rccl_transports::table`]): the
//! first entry that can connect a pair (for host work here, for device
//! work in `crate::device_executor`) sets up each side, the sides trade
//! what the other needs through the bootstrap, then connect. Both kinds of work
//! share one context builder ([`context`]), one setup ([`set_up`]) and one
//! loop ([`finish`]); they differ in the entries that may serve
//! (`table::choose` or `table::choose_for_device`), what a link carries,
//! and, told through [`Setups`], where a link goes once made and what a
//! wait checks. Waits for a peer's side run in slices
//! with the checks of [`crate::agreement::stuck`] between them. The board,
//! one segment for every rank of a host, is made here too.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rccl_transports::table;
use rccl_transports::{Connection, ProcessId, Protocol};
use rccl_transports::{Context, Endpoint, FifoPlacement, Pending, Setup, Transport};

use crate::agreement::call::describe_call;
use crate::agreement::stuck::{self, Calls, Notices, STALL_CHECK_EVERY};
use crate::comm::{failure_note, Activity, CommInner, ExecState, PeerWatch};
use crate::comm::{BoardLink, Link};
use crate::error::{Error, Result};
use crate::memory::{MemUse, Place, Purpose};
use crate::plan::CommLaunch;
use crate::plan::OpWork;

/// Makes sure every connection the planned work needs exists: the boards
/// first, then every missing connection of every communicator is set up
/// (and its setup sent to the peer) before any is waited for, so that one
/// thread can set up several communicators of one process.
pub(crate) fn connect(
    launches: &[CommLaunch],
    guards: &mut [parking_lot::MutexGuard<'_, ExecState>],
    started: Instant,
) -> Result<()> {
    // Checked without allocating: a launch over existing connections (the
    // common case) pays nothing more here.
    let nothing_to_open = launches.iter().zip(guards.iter()).all(|(launch, guard)| {
        (launch.board.is_empty() || guard.board.is_some())
            && launch.channels.iter().enumerate().all(|(channel, work)| {
                peers_in(work).all(|peer| guard.links_for(launch.executor)[channel][peer].is_some())
            })
    });
    if nothing_to_open {
        return Ok(());
    }
    let mut waits: Vec<Waits<'_>> = launches
        .iter()
        .map(|launch| Waits::new(launch, started + launch.comm.config.timeout))
        .collect();
    // Rank 0 makes the board (first), the others map it.
    for making in [true, false] {
        for ((launch, guard), waits) in launches.iter().zip(guards.iter_mut()).zip(&mut waits) {
            let comm = &launch.comm;
            if !launch.board.is_empty() && guard.board.is_none() && (comm.rank == 0) == making {
                guard.board = Some(open_board(waits).inspect_err(|err| comm.poison(err))?);
            }
        }
    }
    let endpoints: Vec<Vec<Endpoint>> = launches.iter().map(|l| endpoints(&l.comm)).collect();
    let contexts: Vec<Context<'_>> = launches
        .iter()
        .zip(&endpoints)
        .map(|(launch, endpoints)| context(&launch.comm, endpoints, None))
        .collect();
    let mut pending = Vec::new();
    for (index, ((launch, guard), cx)) in launches
        .iter()
        .zip(guards.iter())
        .zip(&contexts)
        .enumerate()
    {
        for (channel, work) in launch.channels.iter().enumerate() {
            for peer in peers_of(work) {
                if guard.links_for(launch.executor)[channel][peer].is_none() {
                    let comm = &launch.comm;
                    let chosen = table::choose(cx, peer).ok_or_else(|| {
                        Error::InvalidUsage(format!(
                            "rank {}: no transport can connect {} (NCCL_SHM_DISABLE?)",
                            comm.rank,
                            comm.describe(peer)
                        ))
                    });
                    let link = set_up(comm, peer, channel, CONNECT_TAG_BASE, chosen, |t| {
                        t.setup(cx, peer, channel)
                    })
                    .map_err(|err| waits[index].fail(err))?;
                    pending.push((index, link));
                }
            }
        }
    }
    let mut host = HostSetups {
        launches,
        contexts: &contexts,
        guards,
        waits: &mut waits,
    };
    finish(&mut pending, &mut host)
}

/// The connections of a launch's host work under way, for [`finish`]:
/// per communicator of the launch (the index of a pending link), its
/// context, its executor state that takes each connection made, and its
/// waits.
struct HostSetups<'s, 'l, 'g, 'c> {
    launches: &'l [CommLaunch],
    contexts: &'s [Context<'c>],
    guards: &'s mut [parking_lot::MutexGuard<'g, ExecState>],
    waits: &'s mut [Waits<'l>],
}

impl Setups<Box<dyn Connection>> for HostSetups<'_, '_, '_, '_> {
    fn comm(&self, index: usize) -> &CommInner {
        &self.launches[index].comm
    }

    fn context(&self, index: usize) -> &Context<'_> {
        &self.contexts[index]
    }

    fn made(&mut self, index: usize, link: PendingLink, conn: Box<dyn Connection>) -> Result<()> {
        let comm = &self.launches[index].comm;
        log_host_connection(comm, &self.contexts[index], &link);
        let send_fifo = conn.send_fifo(Protocol::Simple);
        if let Some(observer) = comm
            .profiler
            .as_ref()
            .and_then(|p| p.step_observer(link.channel, link.peer, send_fifo))
        {
            conn.observe_steps(observer);
        }
        let executor = self.launches[index].executor;
        let bytes = conn.held_bytes() as u64;
        let held = comm.memory.hold(
            MemUse::new(Purpose::Fifo, Place::Host, bytes)
                .peer(link.peer)
                .executor(executor),
        )?;
        self.guards[index].links_for_mut(executor)[link.channel][link.peer] = Some(Link {
            conn,
            peer_name: comm.describe(link.peer),
            _held: held,
        });
        Ok(())
    }

    fn fail(&mut self, index: usize, error: Error) -> Error {
        self.waits[index].fail(error)
    }

    fn stalled(&mut self, pending: &[(usize, PendingLink)]) -> Result<()> {
        for (index, waits) in self.waits.iter_mut().enumerate() {
            let mine: Vec<&PendingLink> = pending
                .iter()
                .filter(|(i, _)| *i == index)
                .map(|(_, link)| link)
                .collect();
            let Some(first) = mine.first() else {
                continue;
            };
            let what = || first.what();
            let peers: Vec<usize> = mine.iter().map(|link| link.peer).collect();
            waits.check(&peers, what)?;
        }
        Ok(())
    }

    fn poll_until(&self, now: Instant) -> Instant {
        now + SETUP_POLL
    }
}

/// What [`finish`] needs of the connections it drives to the end: the
/// communicator and context of each (by the index a pending link carries),
/// where a link goes once made, and the checks of a setup that waits.
pub(crate) trait Setups<Made> {
    fn comm(&self, index: usize) -> &CommInner;
    fn context(&self, index: usize) -> &Context<'_>;
    /// Takes `link`, connected as `made`, entering its memory in the
    /// communicator's ledger (which may refuse it: over its limit).
    fn made(&mut self, index: usize, link: PendingLink<Made>, made: Made) -> Result<()>;
    /// The error a failed link of communicator `index` ends the setup with.
    fn fail(&mut self, index: usize, error: Error) -> Error;
    /// Called while nothing moved: fails at a deadline, or with a peer's
    /// failure, naming what is still `pending`.
    fn stalled(&mut self, pending: &[(usize, PendingLink<Made>)]) -> Result<()>;
    /// Until when a link that awaits its peer's setup waits for it at once.
    fn poll_until(&self, now: Instant) -> Instant;
}

/// The one connect loop of host and device work: advances every pending
/// link (each sent its setup to the peer already) until all are made,
/// checking the waits whenever nothing moved.
pub(crate) fn finish<Made>(
    pending: &mut Vec<(usize, PendingLink<Made>)>,
    setups: &mut impl Setups<Made>,
) -> Result<()> {
    while !pending.is_empty() {
        let mut moved = false;
        let mut i = 0;
        while i < pending.len() {
            let (index, link) = &mut pending[i];
            let index = *index;
            match link.advance(setups.comm(index), setups.context(index)) {
                Ok(Some(made)) => {
                    let (index, link) = pending.swap_remove(i);
                    setups
                        .made(index, link, made)
                        .map_err(|err| setups.fail(index, err))?;
                    moved = true;
                }
                Ok(None) => i += 1,
                Err(err) => return Err(setups.fail(index, err)),
            }
        }
        if moved || pending.is_empty() {
            continue;
        }
        setups.stalled(pending)?;
        // Nothing moved: wait for the peers' setup a little.
        let (index, link) = &mut pending[0];
        let index = *index;
        if link.pending.awaits_peer_info() && link.info.is_none() {
            let until = setups.poll_until(Instant::now());
            link.take_info(setups.comm(index), until)
                .map_err(|err| setups.fail(index, err))?;
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(())
}

/// How long a setup with nothing to do waits for a peer's word at once.
pub(crate) const SETUP_POLL: Duration = Duration::from_millis(10);

/// Bootstrap tags of the setup a transport sends the peer, per channel.
const CONNECT_TAG_BASE: u64 = 2 << 40;
/// The first byte of a setup sent to the peer: the transport's bytes
/// follow, or why this side could not set up.
const SETUP_OK: u8 = 0;
const SETUP_FAILED: u8 = 1;

/// A connection under way (a [`Connection`] for host work, a
/// `DeviceLink` for device work): this side's transport, its pending
/// work, and the peer's setup once it came.
pub(crate) struct PendingLink<Made = Box<dyn Connection>> {
    pub peer: usize,
    pub channel: usize,
    /// The bootstrap tag both sides' setups travel under.
    tag: u64,
    pub transport: &'static str,
    pending: Box<dyn Pending<Made>>,
    info: Option<Vec<u8>>,
}

impl<Made> PendingLink<Made> {
    pub fn what(&self) -> String {
        format!(
            "the {} connection on channel {}",
            self.transport, self.channel
        )
    }

    /// Takes the peer's setup if it came, and connects once it has.
    fn advance(&mut self, comm: &CommInner, cx: &Context<'_>) -> Result<Option<Made>> {
        let awaits = self.pending.awaits_peer_info();
        if awaits && self.info.is_none() {
            self.take_info(comm, Instant::now())?;
        }
        let info = match &self.info {
            Some(info) => info.as_slice(),
            None if awaits => return Ok(None),
            None => &[],
        };
        let until = Instant::now() + Duration::from_millis(1);
        self.pending
            .connect(cx, self.peer, info, until)
            .map_err(|e| {
                Error::Remote(format!(
                    "rank {}: connecting to {} on channel {} via {}: {}",
                    comm.rank,
                    comm.describe(self.peer),
                    self.channel,
                    self.transport,
                    rccl_transports::explain_fd_limit(e)
                ))
            })
    }
}

/// Logs a connection of host work as NCCL does, under the subsystem of
/// its transport.
fn log_host_connection(comm: &CommInner, cx: &Context<'_>, link: &PendingLink) {
    let (rank, channel, peer, via) = (comm.rank, link.channel, link.peer, link.transport);
    if via.starts_with("NET") {
        let addr = cx.endpoints[peer].data_addr.ip();
        tracing::info!(
            target: crate::debug::INIT_NET,
            "[{rank}] Channel {channel:02} : {rank} -> {peer} via {via} ({addr})"
        );
    } else if via.starts_with("P2P") {
        tracing::info!(
            target: crate::debug::INIT_P2P,
            "[{rank}] Channel {channel:02} : {rank} -> {peer} via {via}"
        );
    } else {
        tracing::info!(
            target: crate::debug::INIT_SHM,
            "[{rank}] Channel {channel:02} : {rank} -> {peer} via {via}"
        );
    }
}

impl<Made> PendingLink<Made> {
    /// Takes the peer's setup if it arrives by `until`.
    fn take_info(&mut self, comm: &CommInner, until: Instant) -> Result<()> {
        let Some(got) = comm.bootstrap.recv_until(self.peer, self.tag, until)? else {
            return Ok(());
        };
        match got.split_first() {
            Some((&SETUP_OK, info)) => {
                self.info = Some(info.to_vec());
                Ok(())
            }
            Some((&SETUP_FAILED, why)) => Err(Error::Remote(format!(
                "rank {}: {} could not set up {}: {}",
                comm.rank,
                comm.describe(self.peer),
                self.what(),
                String::from_utf8_lossy(why)
            ))),
            _ => Err(Error::Remote(format!(
                "{} sent a malformed connection setup",
                comm.describe(self.peer)
            ))),
        }
    }
}

/// Sets up this side of the connection to `peer` on `channel` with
/// `transport` (the first of the table that can make it) through `setup`,
/// and sends the peer what it needs under `tag_base` + `channel` (or, if
/// this side cannot, why, so that the peer fails at once with the cause).
pub(crate) fn set_up<Made>(
    comm: &CommInner,
    peer: usize,
    channel: usize,
    tag_base: u64,
    transport: Result<Arc<dyn Transport>>,
    setup: impl FnOnce(&dyn Transport) -> std::io::Result<Setup<Made>>,
) -> Result<PendingLink<Made>> {
    let tag = tag_base + channel as u64;
    let setup = transport.and_then(|t| {
        setup(&*t).map(|setup| (t.name(), setup)).map_err(|e| {
            Error::System(format!(
                "rank {}: setting up the {} connection to {} on channel {channel}: {}",
                comm.rank,
                t.name(),
                comm.describe(peer),
                rccl_transports::explain_fd_limit(e)
            ))
        })
    });
    match setup {
        Ok((name, setup)) => {
            if let Some(info) = &setup.info {
                comm.bootstrap
                    .send(peer, tag, &[&[SETUP_OK], info.as_slice()].concat())
                    .map_err(|e| left_setup(comm, peer, &e))?;
            }
            Ok(PendingLink {
                peer,
                channel,
                tag,
                transport: name,
                pending: setup.pending,
                info: None,
            })
        }
        Err(err) => {
            let why = err.to_string();
            let _ = comm
                .bootstrap
                .send(peer, tag, &[&[SETUP_FAILED], why.as_bytes()].concat());
            Err(err)
        }
    }
}

/// Why this rank's setup could not reach `peer` (`failed`): it left the
/// setup, its bootstrap connection closed. The failure it told says why,
/// when it told one; else it destroyed or aborted its communicator, or
/// its process ended (said when seen).
fn left_setup(comm: &CommInner, peer: usize, failed: &Error) -> Error {
    if let Some(told) = stuck::peer_failure(comm) {
        return told;
    }
    let ended = comm.processes[peer]
        .and_then(|process| process.gone())
        .map_or(String::new(), |why| format!(" ({why})"));
    Error::Remote(format!(
        "rank {}: {} left this setup before this rank's side reached it ({failed}): it \
         destroyed or aborted its communicator, or its process ended{ended}",
        comm.rank,
        comm.describe(peer)
    ))
}

/// Bootstrap tags of the links of device work, per channel.
pub(crate) const DEVICE_CONNECT_TAG_BASE: u64 = 6 << 40;

/// What the transports see of every rank of `comm`.
pub(crate) fn endpoints(comm: &CommInner) -> Vec<Endpoint> {
    comm.peers
        .iter()
        .map(|p| Endpoint {
            host_id: p.host_id.clone(),
            process: ProcessId {
                pid: p.pid,
                start: p.start,
            },
            data_addr: p.data_addr,
        })
        .collect()
}

/// The transports' view of `comm`, for host work (`device_fifos`:
/// `None`) or for device work, whose FIFOs `device_fifos` puts where the
/// device's work reaches them.
pub(crate) fn context<'a>(
    comm: &'a CommInner,
    endpoints: &'a [Endpoint],
    device_fifos: Option<&'a dyn FifoPlacement>,
) -> Context<'a> {
    Context {
        rank: comm.rank,
        secret: comm.connection_secret(),
        endpoints,
        fifo: comm.config.fifo_shape(),
        shm_disable: comm.config.shm_disable,
        p2p_disable: comm.config.p2p_disable,
        device_fifos,
        net: &comm.net,
        abort: &comm.abort,
    }
}

/// One communicator's waits during a launch's setup: when it started, and
/// the word given to the peers waited for.
struct Waits<'l> {
    launch: &'l CommLaunch,
    deadline: Instant,
    start: Instant,
    told: Option<(Notices<'l>, Calls)>,
    /// Whether what it waits for is published for hang reports (taken
    /// back when the waits end).
    published: bool,
    /// Whether the peers waited for are gone.
    watch: PeerWatch,
}

impl Drop for Waits<'_> {
    fn drop(&mut self) {
        if self.published {
            *self.launch.comm.activity.lock() = Activity::default();
        }
    }
}

impl<'l> Waits<'l> {
    fn new(launch: &'l CommLaunch, deadline: Instant) -> Waits<'l> {
        Waits {
            launch,
            deadline,
            start: Instant::now(),
            told: None,
            published: false,
            watch: PeerWatch::default(),
        }
    }

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

    /// Called while this rank waits for `peers` to set up their side of
    /// `what`: fails at the deadline, naming it, and past
    /// [`stuck::NOTICE_AFTER`] tells the peers what this rank runs and
    /// compares what they said (see [`stuck`]), so a peer that runs
    /// another call is reported at once rather than at the deadline.
    fn check(&mut self, peers: &[usize], what: impl Fn() -> String) -> Result<()> {
        self.check_inner(peers, what)
            .map_err(|error| self.fail(error))
    }

    fn check_inner(&mut self, peers: &[usize], what: impl Fn() -> String) -> Result<()> {
        let comm = &self.launch.comm;
        if comm.abort.load(Ordering::Relaxed) {
            return Err(comm.ended_error());
        }
        if let Some(error) = comm.peer_failure_in_process(peers) {
            return Err(error);
        }
        self.watch.check(comm, peers)?;
        let waited = self.start.elapsed();
        if waited >= STALL_CHECK_EVERY {
            self.publish(peers, &what, waited);
        }
        if Instant::now() >= self.deadline {
            return Err(Error::System(format!(
                "rank {} of {}: timed out after {:?} waiting for {} to set up {} for {} \
                 (does it run the same calls?)",
                comm.rank,
                comm.nranks,
                comm.config.timeout,
                comm.describe(peers[0]),
                what(),
                describe_call(self.calls().first())
            )));
        }
        if waited >= stuck::NOTICE_AFTER {
            let calls = self.calls();
            let (notices, calls) = self
                .told
                .get_or_insert_with(|| (Notices::new(&**comm), calls));
            for &peer in peers {
                notices.tell(peer, calls);
            }
            if let Some(error) = notices.check(calls, peers, waited) {
                return Err(error);
            }
        }
        Ok(())
    }

    /// Publishes for hang reports that the launch has waited `waited` for
    /// `peers` to set up their side of `what`.
    fn publish(&mut self, peers: &[usize], what: impl Fn() -> String, waited: Duration) {
        let comm = &self.launch.comm;
        let others = match peers.len() {
            0 | 1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        let (first, ops) = self.launch.summary();
        *comm.activity.lock() = Activity {
            since: Some(self.start),
            first,
            ops,
            stalled: Some(waited),
            waiting: vec![format!(
                "setting up {}, waiting for {}{others} to set up its side",
                what(),
                comm.describe(peers[0])
            )],
        };
        self.published = true;
    }

    /// Poisons the communicator with the failure and tells every peer the
    /// launch connects to, as the waits end, that it failed: a peer
    /// waiting on this rank's side of a connection would otherwise wait
    /// for its deadline. Returns the failure ([`stuck::cause`]).
    fn fail(&mut self, error: Error) -> Error {
        let launch = self.launch;
        let error = stuck::cause(&*launch.comm, error);
        launch.comm.poison(&error);
        let calls = self.calls();
        let (notices, _) = self
            .told
            .get_or_insert_with(|| (Notices::new(&*launch.comm), calls));
        for work in &launch.channels {
            peers_in(work).for_each(|peer| notices.tell_at_end(peer));
        }
        notices.fail(&failure_note(&launch.comm, &error));
        error
    }

    /// Waits for `peer` to set up its side of `what`: `attempt(until)`
    /// tries until `until` (`Ok(None)`: nothing yet), with the checks of
    /// [`Waits::check`] between attempts.
    fn wait_for<T>(
        &mut self,
        peer: usize,
        what: impl Fn() -> String,
        mut attempt: impl FnMut(Instant) -> Result<Option<T>>,
    ) -> Result<T> {
        loop {
            let until = self.deadline.min(Instant::now() + STALL_CHECK_EVERY);
            match attempt(until) {
                Ok(Some(got)) => return Ok(got),
                Ok(None) => self.check(&[peer], &what)?,
                Err(error) => return Err(self.fail(error)),
            }
        }
    }
}

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

/// Makes (rank 0) or maps (the others) the communicator's board. Rank 0
/// removes the segment's name once every rank has posted on it, which
/// proves they all mapped it.
fn open_board(waits: &mut Waits<'_>) -> Result<BoardLink> {
    let comm = &waits.launch.comm;
    let (nranks, capacity) = (comm.nranks, comm.config.board_bytes);
    let failed = |what: &str, e: std::io::Error| {
        Error::Remote(format!("rank {}: {what} the board: {e}", comm.rank))
    };
    let bytes = rccl_transports::Board::segment_bytes(nranks, capacity) as u64;
    let held = comm
        .memory
        .hold(MemUse::new(Purpose::Board, Place::Host, bytes));
    let board = if comm.rank == 0 {
        // On failure: the error, and why as the peers are told.
        let made = match &held {
            Ok(_) => rccl_transports::Board::create(nranks, capacity).map_err(|e| {
                let why = rccl_transports::explain_no_room(
                    e,
                    "a smaller RCCL_BOARD_BYTES (0 turns the board off)",
                )
                .to_string();
                let err = Error::System(format!("rank {}: creating the board: {why}", comm.rank));
                (err, why)
            }),
            Err(refused) => Err((refused.clone(), refused.to_string())),
        };
        let board = match made {
            Ok(board) => board,
            Err((err, why)) => {
                let note = [NO_SEGMENT, why.as_bytes()].concat();
                for peer in 1..nranks {
                    let _ = comm.bootstrap.send(peer, BOARD_TAG, &note);
                }
                return Err(err);
            }
        };
        for peer in 1..nranks {
            comm.bootstrap
                .send(peer, BOARD_TAG, board.name().as_bytes())?;
        }
        board
    } else {
        if let Err(refused) = &held {
            return Err(refused.clone());
        }
        let name = waits.wait_for(
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
        target: crate::debug::INIT_SHM,
        "[{}] Board: {nranks} ranks x 2 posts of {capacity} bytes via SHM",
        comm.rank
    );
    Ok(BoardLink {
        board,
        watch: comm.processes.clone(),
        names: (0..nranks).map(|r| comm.describe(r)).collect(),
        _held: held?,
    })
}

/// Every peer `work` sends to or receives from, repeats included.
fn peers_in(work: &[OpWork]) -> impl Iterator<Item = usize> + '_ {
    work.iter()
        .flat_map(|w| w.steps.iter())
        .flat_map(|s| s.prims.iter())
        .flat_map(|p| p.send_peer().into_iter().chain(p.recv_peer()))
}

fn peers_of(work: &[OpWork]) -> Vec<usize> {
    let mut peers: Vec<usize> = peers_in(work).collect();
    peers.sort_unstable();
    peers.dedup();
    peers
}
