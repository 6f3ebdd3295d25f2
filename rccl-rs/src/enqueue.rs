//! Enqueue and group semantics: operations are collected inside a group
//! (per thread, as NCCL's `ncclGroupStart` / `ncclGroupEnd`) and launched
//! together at its end; outside a group each call is a group of one.
//!
//! A launch turns each operation into per-channel schedules, makes sure the
//! connections they need exist, and drives every channel of every
//! communicator of the group from the calling thread until all complete.
//! A simulated end ([`group_simulate_end`]) plans the operations the same
//! way and hands the plan back instead of running it.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use rccl_algorithms::{p2p_schedule, CollKind, CollSpec, P2pOp, Schedule, Topology};
use rccl_transports::process::ProcessId;
use rccl_transports::shm::{self, ShmConnection, ShmSegment};
use rccl_transports::tcp::TcpConnection;
use rccl_transports::{Connection, Protocol, Tag};

use crate::comm::{Activity, CommInner};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::executor::{
    self, Binding, BoardLink, BoardOp, BoardRun, Buffers, ChannelRun, Driven, Link, OpWork,
    Reduction, Run, Segment,
};
use crate::kernels::{ReduceKernel, Store};
use crate::stuck::{self, Calls, Notices};
use crate::tuning;
use crate::types::{DataType, RedOp};

/// What an operation does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKind {
    /// A collective with its root (0 when rootless) and reduction op.
    Coll {
        kind: CollKind,
        root: usize,
        op: RedOp,
    },
    /// A point-to-point send to `peer`.
    Send { peer: usize },
    /// A point-to-point receive from `peer`.
    Recv { peer: usize },
}

/// One user call, with raw buffers already validated by the caller.
pub(crate) struct RawOp {
    pub comm: Arc<CommInner>,
    pub kind: OpKind,
    pub send: *const u8,
    pub recv: *mut u8,
    pub count: usize,
    pub dtype: DataType,
}

struct GroupState {
    depth: usize,
    ops: Vec<RawOp>,
    error: Option<Error>,
}

thread_local! {
    // Initialized in place: every call checks the group, and a lazily
    // initialized slot would test its state first.
    static GROUP: RefCell<GroupState> = const {
        RefCell::new(GroupState {
            depth: 0,
            ops: Vec::new(),
            error: None,
        })
    };
}

/// Opens a group on this thread (`ncclGroupStart`); groups nest.
pub fn group_start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Closes a group (`ncclGroupEnd`); the outermost end launches everything
/// collected since the outermost start and returns when all of it has
/// completed, or with the first error (including one raised by a call
/// inside the group).
pub fn group_end() -> Result<()> {
    match close_group()? {
        Some(ops) => launch(ops),
        None => Ok(()),
    }
}

/// Closes one level of the group: `None` while an outer level stays open,
/// else what the group collected, or the first error raised inside it.
fn close_group() -> Result<Option<Vec<RawOp>>> {
    let (ops, error) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return (
                None,
                Some(Error::InvalidUsage("group end without group start".into())),
            );
        }
        g.depth -= 1;
        if g.depth > 0 {
            return (None, None);
        }
        (Some(std::mem::take(&mut g.ops)), g.error.take())
    });
    match error {
        Some(err) => Err(err),
        None => Ok(ops),
    }
}

/// A collective of a simulated group, as the engine would have run it: the
/// call and the tuner's choice for it on its communicator.
pub struct PlannedCollective {
    /// The call (its `count` is NCCL's count).
    pub spec: CollSpec,
    /// Bytes per element.
    pub elem_size: usize,
    /// Algorithm, protocol, channels and chunk, as the launch would use.
    pub choice: tuning::Choice,
}

/// One communicator's share of a simulated group.
pub struct PlannedComm {
    /// The rank of this communicator.
    pub rank: usize,
    /// Which ranks share a host.
    pub topology: Topology,
    /// The communicator's settings (shared memory, FIFO sizes, ...).
    pub config: Config,
    /// The group's collectives on this communicator, in call order.
    pub collectives: Vec<PlannedCollective>,
    /// The group's sends and receives on this communicator, if any.
    pub p2p: Option<PlannedP2p>,
}

/// The sends and receives of a simulated group on one communicator, as the
/// launch would have run them: one batch after the collectives, every
/// message progressing at once.
pub struct PlannedP2p {
    /// Every call in call order (peer, direction, length), lengths and
    /// offsets in bytes, the group's buffers laid end to end.
    pub calls: Vec<P2pOp>,
    /// Channels the batch is split across.
    pub nchannels: usize,
    /// The protocol (the point-to-point path always uses Simple).
    pub protocol: Protocol,
    /// The pipeline chunk, bytes.
    pub chunk_bytes: usize,
}

/// Closes a group as [`group_end`] does, but runs none of what it
/// collected (`ncclGroupSimulateEnd`): returns, per communicator in the
/// order first used, what a launch would have run, with the tuner's choice
/// for every collective and the channels, protocol and chunk of the batch
/// of sends and receives (refused, as the launch would refuse it, when
/// sends to the rank itself do not pair with its receives). Nothing is
/// sent, no connection is opened and no sequence number is taken, so the
/// communicators go on as if the group had been empty. `None` when only an inner level of nested groups closed
/// (the outermost end decides).
pub fn group_simulate_end() -> Result<Option<Vec<PlannedComm>>> {
    let Some(ops) = close_group()? else {
        return Ok(None);
    };
    // Per communicator: its plan, and its sends and receives in call order.
    let mut comms: Vec<(Arc<CommInner>, PlannedComm, Vec<&RawOp>)> = Vec::new();
    for op in &ops {
        let index = match comms.iter().position(|(c, _, _)| Arc::ptr_eq(c, &op.comm)) {
            Some(i) => i,
            None => {
                op.comm.check_usable()?;
                comms.push((
                    op.comm.clone(),
                    PlannedComm {
                        rank: op.comm.rank,
                        topology: op.comm.topology.clone(),
                        config: op.comm.config.clone(),
                        collectives: Vec::new(),
                        p2p: None,
                    },
                    Vec::new(),
                ));
                comms.len() - 1
            }
        };
        let (_, planned, p2p) = &mut comms[index];
        match op.kind {
            OpKind::Coll { .. } => {
                let (spec, choice, in_place) = choose_collective(op)?;
                log_choice(op, &choice, in_place, " (simulated, not run)");
                planned.collectives.push(PlannedCollective {
                    spec,
                    elem_size: op.dtype.size(),
                    choice,
                });
            }
            OpKind::Send { .. } | OpKind::Recv { .. } => p2p.push(op),
        }
    }
    for (comm, planned, p2p) in &mut comms {
        if p2p.is_empty() {
            continue;
        }
        let calls = p2p_calls(p2p.iter().copied());
        let (nchannels, protocol, chunk_bytes) = p2p_shape(comm, &calls)?;
        tracing::info!(
            target: crate::debug::TUNING,
            "[{}] Send/Recv: {} calls, largest {} Bytes -> proto {} channel {} chunk {} Bytes \
             (simulated, not run)",
            comm.rank,
            calls.len(),
            calls.iter().map(P2pOp::length).max().unwrap_or(0),
            protocol.name(),
            nchannels,
            chunk_bytes
        );
        planned.p2p = Some(PlannedP2p {
            calls,
            nchannels,
            protocol,
            chunk_bytes,
        });
    }
    Ok(Some(comms.into_iter().map(|(_, p, _)| p).collect()))
}

/// The calls of a batch of sends and receives, laid out as the launch
/// lays their buffers: the sends end to end, the receives end to end
/// (offsets and lengths in bytes).
fn p2p_calls<'a>(ops: impl IntoIterator<Item = &'a RawOp>) -> Vec<P2pOp> {
    let (mut send_end, mut recv_end) = (0, 0);
    ops.into_iter()
        .map(|op| {
            let len = op.count * op.dtype.size();
            match op.kind {
                OpKind::Send { peer } => {
                    send_end += len;
                    P2pOp::Send {
                        peer,
                        offset: send_end - len,
                        len,
                    }
                }
                OpKind::Recv { peer } => {
                    recv_end += len;
                    P2pOp::Recv {
                        peer,
                        offset: recv_end - len,
                        len,
                    }
                }
                OpKind::Coll { .. } => unreachable!("a batch of sends and receives"),
            }
        })
        .collect()
}

/// The channels, protocol and chunk (bytes) a batch of sends and receives
/// runs with on `comm`; fails when sends to the rank itself do not pair
/// with its receives from itself.
fn p2p_shape(comm: &CommInner, calls: &[P2pOp]) -> Result<(usize, Protocol, usize)> {
    check_self_pairs(comm.rank, calls)?;
    let largest = calls.iter().map(P2pOp::length).max().unwrap_or(0);
    let (nchannels, protocol) = tuning::p2p_choice(&comm.config, largest);
    Ok((
        nchannels,
        protocol,
        tuning::chunk_bytes(&comm.config, protocol),
    ))
}

/// The depth of groups open on this thread.
pub fn group_depth() -> usize {
    GROUP.with(|g| g.borrow().depth)
}

/// Records a failed call inside a group, so that the group's end reports
/// it (NCCL reports argument errors at the call and again at group end) and
/// launches nothing. Outside a group it does nothing. Public for the C ABI,
/// whose own argument checks fail calls before they reach the engine.
pub fn group_fail(err: &Error) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.error.get_or_insert_with(|| err.clone());
        }
    });
}

/// Runs `op` now, or collects it when a group is open.
///
/// # Safety
/// The op's buffers must stay valid (and, for the receive buffer, not be
/// accessed by anyone else) until the operation completes: when this
/// returns outside a group, or at the outermost [`group_end`].
pub(crate) unsafe fn enqueue(op: RawOp) -> Result<()> {
    op.comm.check_usable()?;
    // Asked before the op moves: a lone call need not travel through the
    // group's slot.
    if GROUP.with(|g| g.borrow().depth > 0) {
        GROUP.with(|g| g.borrow_mut().ops.push(op));
        return Ok(());
    }
    match on_board_alone(&op) {
        Some(done) => done,
        None => launch(std::iter::once(op)),
    }
}

/// Polls a lone board call inline this many times before it waits the
/// general way (with stall checks, parking and hang reports): covers a
/// peer that is a few microseconds behind, where ranks have cores of
/// their own.
const INLINE_POLLS: u32 = 256;

/// A lone all-reduce that the tuner sends through a board that already
/// exists (the first one, which makes the board, goes the general way):
/// run without a launch's bookkeeping, which costs more than the smallest
/// calls themselves. `None` when the call is not one.
fn on_board_alone(op: &RawOp) -> Option<Result<()>> {
    let comm = &op.comm;
    // Other calls, and larger ones, go the general way without taking the
    // lock or asking the tuner twice.
    let OpKind::Coll {
        kind: CollKind::AllReduce,
        op: red_op,
        ..
    } = op.kind
    else {
        return None;
    };
    if op.count * op.dtype.size() > comm.board_bytes() {
        return None;
    }
    let mut guard = comm.exec.lock();
    guard.board.as_ref()?;
    let work = match lone_board_work(&mut guard.lone, op, red_op) {
        Ok(Some(work)) => work,
        Ok(None) => return None,
        Err(err) => return Some(Err(err)),
    };
    let seq = work.seq;
    let guards = [guard];
    let link = guards[0].board.as_ref()?;
    let mut run = BoardRun::new(comm.rank, link, smallvec::smallvec![work]);
    // Spinning only pays where the peers have cores of their own.
    let inline_polls = if rccl_transports::wait::spinning() {
        INLINE_POLLS
    } else {
        1
    };
    for _ in 0..inline_polls {
        match run.poll() {
            Ok(executor::Poll::Done) => return Some(Ok(())),
            Ok(_) => std::hint::spin_loop(),
            // The general path reports it, with everything a failure does.
            Err(_) => break,
        }
    }
    // The deadline counts from here: the inline polls took microseconds.
    let started = std::time::Instant::now();
    let comms = [comm.clone()];
    let mut runs = [Driven {
        run: Run::Board(run),
        abort: &comm.abort,
        comm: 0,
    }];
    Some(drive_to_the_end(
        &comms,
        &guards,
        &mut runs,
        &[((seq, CollKind::AllReduce.name()), 1)],
        started,
        started + comm.config.timeout,
    ))
}

/// The last lone all-reduce that asked whether it runs on the board, with
/// the answer and, when it does, what its run needs: a training loop
/// repeats the same call, and asking the tuner, building the reduction and
/// packing the call's tag cost more than the exchange of a small one.
pub(crate) struct LoneBoardCall {
    /// The tuner generation the answer was given under.
    generation: u64,
    count: usize,
    dtype: DataType,
    op: RedOp,
    in_place: bool,
    choice: tuning::Choice,
    /// The call's reduction when it runs on the board; `None` when the
    /// tuner sends it elsewhere.
    reduction: Option<Reduction>,
    /// The call word of its tag (all but the sequence number and count).
    call: u32,
}

/// The board work of a lone all-reduce, taken from the remembered call
/// when this one repeats it (same count, type, op and placement, same
/// tuner generation, no tuner plug-in), else planned afresh and
/// remembered. `None` when the tuner does not send the call through the
/// board.
fn lone_board_work(
    memo: &mut Option<LoneBoardCall>,
    op: &RawOp,
    red_op: RedOp,
) -> Result<Option<BoardOp>> {
    let comm = &op.comm;
    let in_place = is_in_place(op, CollKind::AllReduce, 0, comm.rank);
    let generation = tuning::generation();
    let repeated = memo.as_ref().filter(|m| {
        m.generation == generation
            && m.count == op.count
            && m.dtype == op.dtype
            && m.op == red_op
            && m.in_place == in_place
            && !tuning::has_plugin()
    });
    if let Some(memo) = repeated {
        let Some(reduction) = &memo.reduction else {
            return Ok(None);
        };
        let seq = comm.next_seq.fetch_add(1, Ordering::Relaxed);
        log_start(op, seq, &memo.choice, in_place, true);
        let started = Started {
            seq,
            tag: Tag {
                seq: seq as u32,
                call: memo.call,
                count: op.count as u32,
            },
            reduction: Some(reduction.clone()),
        };
        return Ok(Some(board_op(op, started)));
    }
    let (_, choice, _) = choose_collective(op)?;
    let remember = |reduction: Option<Reduction>, call: u32| {
        (!tuning::has_plugin()).then_some(LoneBoardCall {
            generation,
            count: op.count,
            dtype: op.dtype,
            op: red_op,
            in_place,
            choice,
            reduction,
            call,
        })
    };
    if !runs_on_board(op, &choice) {
        *memo = remember(None, 0);
        return Ok(None);
    }
    let started = start_collective(op, &choice, in_place, true)?;
    *memo = remember(started.reduction.clone(), started.tag.call);
    Ok(Some(board_op(op, started)))
}

/// One communicator's share of a launch.
struct CommLaunch {
    comm: Arc<CommInner>,
    /// Per channel, the work queued on it (empty until a schedule is
    /// queued: a launch that only uses the board allocates none).
    channels: Vec<Vec<OpWork>>,
    /// The work run through the board.
    board: SmallVec<[BoardOp; 1]>,
    /// The sends and receives, planned together once all are known.
    p2p: Vec<RawOp>,
}

/// Runs `ops` (a group, or a single call) to completion. Allocates little
/// for a lone call: the smallest calls cost about as much as this
/// bookkeeping.
fn launch(ops: impl IntoIterator<Item = RawOp>) -> Result<()> {
    #[cfg(feature = "fault-injection")]
    crate::fault::point("launch");
    // Inline storage: a lone call allocates nothing here.
    let mut launches: SmallVec<[CommLaunch; 1]> = SmallVec::new();
    for op in ops {
        let index = match launches.iter().position(|l| Arc::ptr_eq(&l.comm, &op.comm)) {
            Some(i) => i,
            None => {
                op.comm.check_usable()?;
                launches.push(CommLaunch {
                    comm: op.comm.clone(),
                    channels: Vec::new(),
                    board: SmallVec::new(),
                    p2p: Vec::new(),
                });
                launches.len() - 1
            }
        };
        match op.kind {
            OpKind::Coll { .. } => plan_collective(&mut launches[index], &op)?,
            OpKind::Send { .. } | OpKind::Recv { .. } => launches[index].p2p.push(op),
        }
    }
    if launches.is_empty() {
        return Ok(());
    }
    for launch in &mut launches {
        if !launch.p2p.is_empty() {
            let p2p = std::mem::take(&mut launch.p2p);
            plan_p2p(launch, &p2p)?;
        }
    }
    // Lock communicators in address order so that two threads launching
    // overlapping groups cannot deadlock.
    launches.sort_by_key(|l| Arc::as_ptr(&l.comm) as usize);
    let comms: SmallVec<[Arc<CommInner>; 1]> = launches.iter().map(|l| l.comm.clone()).collect();
    let mut guards: SmallVec<[_; 1]> = comms.iter().map(|comm| comm.exec.lock()).collect();
    // One clock reading bounds both the connection setup and the run.
    let started = std::time::Instant::now();
    connect(&launches, &mut guards, started)?;

    let deadline = launches
        .iter()
        .map(|l| started + l.comm.config.timeout)
        .min()
        .expect("a launch has at least one communicator");
    // What each communicator runs, published for hang reports once the
    // launch is stuck (most launches finish long before).
    let summaries: SmallVec<[Summary; 1]> = launches
        .iter()
        .map(|launch| {
            let board_ops = launch.board.iter().map(|w| (w.seq, w.name));
            let mut ops = launch
                .channels
                .iter()
                .flatten()
                .map(|w| (w.seq, w.name))
                .chain(board_ops);
            let first = ops.next().unwrap_or((0, "nothing"));
            (first, 1 + ops.filter(|&op| op != first).count())
        })
        .collect();
    let mut runs: SmallVec<[Driven<'_, '_>; 2]> = SmallVec::new();
    for (index, (launch, guard)) in launches.iter_mut().zip(&guards).enumerate() {
        for (channel, work) in launch.channels.iter_mut().enumerate() {
            if work.is_empty() {
                continue;
            }
            let mut run = ChannelRun::new(channel, &guard.links[channel]);
            for op in work.drain(..) {
                run.push(op);
            }
            runs.push(Driven {
                run: Run::Channel(run),
                abort: &comms[index].abort,
                comm: index,
            });
        }
        if !launch.board.is_empty() {
            let link = guard
                .board
                .as_ref()
                .expect("connect made the board of every launch that uses it");
            let run = BoardRun::new(launch.comm.rank, link, std::mem::take(&mut launch.board));
            runs.push(Driven {
                run: Run::Board(run),
                abort: &comms[index].abort,
                comm: index,
            });
        }
    }
    let result = drive_to_the_end(&comms, &guards, &mut runs, &summaries, started, deadline);
    drop(runs);
    drop(guards);
    result
}

/// What a launch runs on one communicator, for hang reports: the first
/// operation (sequence number and name) and how many there are.
type Summary = ((u64, &'static str), usize);

/// Drives `runs` (over `comms`, whose executor states `guards` are) until
/// they finish, publishing what they wait for once stuck; on failure,
/// poisons every communicator of the launch and closes its connections,
/// telling the peers why.
fn drive_to_the_end(
    comms: &[Arc<CommInner>],
    guards: &[parking_lot::MutexGuard<'_, crate::comm::ExecState>],
    runs: &mut [Driven<'_, '_>],
    summaries: &[Summary],
    started: std::time::Instant,
    deadline: std::time::Instant,
) -> Result<()> {
    let mut published = false;
    // Created once the launch has waited long enough to tell its peers;
    // dropped (taking the word back) when it ends.
    let mut notices: SmallVec<[Notices<'_>; 1]> = SmallVec::new();
    let result = executor::drive(runs, deadline, &mut |runs, stalled| {
        if !published {
            for (comm, &(first, ops)) in comms.iter().zip(summaries) {
                *comm.activity.lock() = Activity {
                    since: Some(started),
                    first,
                    ops,
                    stalled: None,
                    waiting: Vec::new(),
                };
            }
            published = true;
        }
        publish_stall(comms, runs, stalled);
        find_mismatch(comms, guards, runs).or_else(|| {
            if stalled < stuck::NOTICE_AFTER {
                return None;
            }
            if notices.is_empty() {
                notices.extend(comms.iter().map(|comm| Notices::new(comm)));
            }
            compare_with_waiting_peers(&mut notices, runs, stalled)
        })
    });
    if published {
        for comm in comms {
            *comm.activity.lock() = Activity::default();
        }
    }
    result.map_err(|failure| {
        let error = if comms[failure.comm].abort.load(Ordering::Relaxed) {
            comms[failure.comm].ended_error()
        } else if failure.waiting.is_empty() {
            failure.error
        } else {
            let report = hang_report(comms, &failure.waiting);
            eprintln!("{report}");
            Error::System(report)
        };
        // The group's other operations stopped mid-flight too, with pieces
        // left in their connections: none of its communicators can go on.
        for (index, (comm, guard)) in comms.iter().zip(guards).enumerate() {
            comm.poison(&error);
            let note = close_links(comm, guard, &error);
            if let Some(notices) = notices.get_mut(index) {
                notices.fail(&note);
            }
        }
        error
    })
}

/// Closes every connection of a failed communicator, telling each peer
/// why, so that ranks waiting on this one stop at once with the cause
/// instead of timing out. A failure that came from a peer's note is passed
/// on unchanged: every rank names the rank where it started. Returns the
/// note.
pub(crate) fn close_links(
    comm: &CommInner,
    state: &crate::comm::ExecState,
    error: &Error,
) -> String {
    let links = || state.links.iter().flatten().flatten();
    let note = links()
        .find_map(|link| link.conn.peer_note())
        .or_else(|| state.board.as_ref().and_then(|link| link.board.note()))
        .unwrap_or_else(|| failure_note(comm, error));
    for link in links() {
        link.conn.close_with(&note);
    }
    if let Some(link) = &state.board {
        link.board.close_with(&note);
    }
    note
}

/// What peers are told of this rank's failure: who failed and why, marked
/// as a usage error every rank shares where it is one.
fn failure_note(comm: &CommInner, error: &Error) -> String {
    if comm.abort.load(Ordering::Relaxed) {
        return format!(
            "{} {} its communicator",
            comm.describe(comm.rank),
            comm.ended_how()
        );
    }
    let usage = matches!(error, Error::InvalidUsage(_));
    format!(
        "{}{} failed: {error}",
        if usage { executor::USAGE_NOTE } else { "" },
        comm.describe(comm.rank)
    )
}

/// Records what the stuck channels of a launch wait for, for hang reports
/// on request.
fn publish_stall(comms: &[Arc<CommInner>], runs: &[Driven<'_, '_>], stalled: std::time::Duration) {
    for (index, comm) in comms.iter().enumerate() {
        let waiting = runs
            .iter()
            .filter(|d| d.comm == index && d.run.busy())
            .map(|d| match d.run.blocked() {
                Some(b) => format!(
                    "{}: operation #{} {}, step {} ({}), waiting {} {}",
                    d.run.place(),
                    b.seq,
                    b.op,
                    b.step,
                    b.prim,
                    if b.receiving {
                        "for data from"
                    } else {
                        "for FIFO space from"
                    },
                    comm.describe(b.peer)
                ),
                None => format!("{}: not started", d.run.place()),
            })
            .collect();
        let mut activity = comm.activity.lock();
        activity.stalled = Some(stalled);
        activity.waiting = waiting;
    }
}

/// A peer that runs another call than a stuck run: found when one side
/// runs through the board and the other through FIFOs, where neither
/// receives the other's tagged pieces. A board run looks at the pieces its
/// FIFOs from the peer hold; a FIFO run looks at the peer's posts.
fn find_mismatch(
    comms: &[Arc<CommInner>],
    states: &[parking_lot::MutexGuard<'_, crate::comm::ExecState>],
    runs: &[Driven<'_, '_>],
) -> Option<(usize, Error)> {
    for driven in runs.iter().filter(|d| d.run.busy()) {
        // Sends and receives pair with any call of the peer's: only
        // collectives are compared.
        let Some(blocked) = driven.run.blocked().filter(|b| b.tag.call != P2P_CALL) else {
            continue;
        };
        let (comm, state) = (&comms[driven.comm], &states[driven.comm]);
        let peer = blocked.peer;
        let theirs = match driven.run {
            Run::Board(_) => state
                .links
                .iter()
                .filter_map(|channel| channel[peer].as_ref())
                .flat_map(|link| Protocol::ALL.map(|p| link.conn.recv_fifo(p).try_peek()))
                .flatten()
                .map(|(_, _, tag)| tag)
                .find(|tag| {
                    tag.call != P2P_CALL && tag.seq == blocked.tag.seq && *tag != blocked.tag
                }),
            Run::Channel(_) => state
                .board
                .as_ref()
                .and_then(|link| link.board.posted_call(peer, blocked.tag.seq))
                .filter(|tag| *tag != blocked.tag),
        };
        if let Some(tag) = theirs {
            let error = disagreement(blocked.tag, &comm.describe(peer), tag);
            return Some((driven.comm, error));
        }
    }
    None
}

/// Tells the peers that the stuck runs wait on which calls they run, and
/// compares what waiting peers said with those calls (see [`stuck`]).
fn compare_with_waiting_peers(
    notices: &mut [Notices<'_>],
    runs: &[Driven<'_, '_>],
    stalled: std::time::Duration,
) -> Option<(usize, Error)> {
    for (index, notices) in notices.iter_mut().enumerate() {
        let mut calls = Calls::default();
        let mut waiting_on: SmallVec<[usize; 4]> = SmallVec::new();
        for driven in runs.iter().filter(|d| d.comm == index && d.run.busy()) {
            driven.run.tags().for_each(|tag| calls.add(tag));
            if let Some(blocked) = driven.run.blocked() {
                waiting_on.push(blocked.peer);
            }
        }
        for &peer in &waiting_on {
            notices.tell(peer, &calls);
        }
        if let Some(error) = notices.check(&calls, &waiting_on, stalled) {
            return Some((index, error));
        }
    }
    None
}

/// What each rank waits for, one line per stuck channel, so a user can
/// find the one bad rank from every rank's log.
fn hang_report(
    comms: &[Arc<CommInner>],
    waiting: &[(usize, String, Option<executor::Blocked>)],
) -> String {
    let mut lines = Vec::new();
    for (comm_index, place, blocked) in waiting {
        let comm = &comms[*comm_index];
        let line = match blocked {
            Some(b) => format!(
                "rank {} of {}: timed out after {:?} in operation #{} {} on {place}, step {} \
                 ({}), waiting {} {}",
                comm.rank,
                comm.nranks,
                comm.config.timeout,
                b.seq,
                b.op,
                b.step,
                b.prim,
                if b.receiving {
                    "for data from"
                } else {
                    "for FIFO space from"
                },
                comm.describe(b.peer)
            ),
            None => format!(
                "rank {} of {}: timed out after {:?} on {place}",
                comm.rank, comm.nranks, comm.config.timeout
            ),
        };
        lines.push(line);
    }
    lines.join("\n")
}

/// Builds the per-channel work of a collective.
fn plan_collective(launch: &mut CommLaunch, op: &RawOp) -> Result<()> {
    let comm = &launch.comm;
    let (spec, choice, in_place) = choose_collective(op)?;
    let on_board = runs_on_board(op, &choice);
    let started = start_collective(op, &choice, in_place, on_board)?;
    if on_board {
        launch.board.push(board_op(op, started));
        return Ok(());
    }
    let Started {
        seq,
        tag,
        reduction,
    } = started;
    let schedule = choice
        .algorithm
        .schedule(&spec, comm.rank, &choice.params, &comm.topology);
    let buffers = Buffers {
        send: op.send,
        recv: op.recv,
    };
    let buffer_elems = spec
        .kind
        .send_len(op.count, comm.nranks, comm.rank, spec.root)
        + spec
            .kind
            .recv_len(op.count, comm.nranks, comm.rank, spec.root);
    let work = Work {
        seq,
        name: spec.kind.name(),
        tag,
        protocol: choice.protocol,
        elem_size: op.dtype.size(),
        reduction: reduction.map(Arc::new),
        user_store: comm.config.user_store(buffer_elems * op.dtype.size()),
    };
    push_schedule(launch, schedule, &work, || Binding::Shared(buffers));
    Ok(())
}

/// Whether a collective that the tuner gave `choice` runs through its
/// communicator's board: a one-shot all-reduce that fits a post.
fn runs_on_board(op: &RawOp, choice: &tuning::Choice) -> bool {
    let bytes = op.count * op.dtype.size();
    matches!(
        op.kind,
        OpKind::Coll {
            kind: CollKind::AllReduce,
            ..
        }
    ) && choice.algorithm.name() == tuning::BOARD_ALGORITHM
        && bytes > 0
        && bytes <= op.comm.board_bytes()
}

/// A collective call on its way to run.
struct Started {
    /// The communicator's sequence number of the call.
    seq: u64,
    /// What its pieces (or posts) carry.
    tag: Tag,
    /// Its reduction, for reducing collectives.
    reduction: Option<Reduction>,
}

/// Takes a collective call's sequence number, logs the call and the
/// tuner's choice for it (`NCCL_DEBUG` subsystems COLL and TUNING), and
/// prepares its reduction.
fn start_collective(
    op: &RawOp,
    choice: &tuning::Choice,
    in_place: bool,
    on_board: bool,
) -> Result<Started> {
    let OpKind::Coll {
        kind,
        root,
        op: red_op,
    } = op.kind
    else {
        unreachable!("start_collective takes collectives");
    };
    let comm = &op.comm;
    let seq = comm.next_seq.fetch_add(1, Ordering::Relaxed);
    log_start(op, seq, choice, in_place, on_board);
    let reduction = if kind.reduces() {
        Some(reduction_of(op.dtype, red_op, comm.nranks)?)
    } else {
        None
    };
    Ok(Started {
        seq,
        tag: call_tag(seq, kind, op.count, op.dtype, red_op, root),
        reduction,
    })
}

/// Logs a collective call (`NCCL_DEBUG` subsystem COLL) and the tuner's
/// choice for it (TUNING).
fn log_start(op: &RawOp, seq: u64, choice: &tuning::Choice, in_place: bool, on_board: bool) {
    let OpKind::Coll {
        kind,
        root,
        op: red_op,
    } = op.kind
    else {
        return;
    };
    let comm = &op.comm;
    tracing::info!(
        target: crate::debug::COLL,
        "[{}] {}: opCount {seq} sendbuff {:p} recvbuff {:p} count {} datatype {} op {} root {root} comm {:p} [nranks={}]",
        comm.rank,
        kind.name(),
        op.send,
        op.recv,
        op.count,
        op.dtype.name(),
        red_op.name(),
        Arc::as_ptr(comm),
        comm.nranks
    );
    log_choice(
        op,
        choice,
        in_place,
        if on_board { " via the board" } else { "" },
    );
}

/// Logs the tuner's choice for a collective call (`NCCL_DEBUG` subsystem
/// TUNING), `how` it runs appended.
fn log_choice(op: &RawOp, choice: &tuning::Choice, in_place: bool, how: &str) {
    let OpKind::Coll { kind, .. } = op.kind else {
        return;
    };
    tracing::info!(
        target: crate::debug::TUNING,
        "[{}] {}: {} Bytes -> Algo {} proto {} channel {} chunk {} elements{}{how}",
        op.comm.rank,
        kind.name(),
        op.count * op.dtype.size(),
        choice.algorithm.name(),
        choice.protocol.name(),
        choice.params.nchannels,
        choice.params.chunk_elems,
        if in_place { " (in place)" } else { "" },
    );
}

/// The board operation of an all-reduce that [`runs_on_board`].
fn board_op(op: &RawOp, started: Started) -> BoardOp {
    BoardOp {
        seq: started.seq,
        name: CollKind::AllReduce.name(),
        tag: started.tag,
        send: op.send,
        recv: op.recv,
        count: op.count,
        elem_size: op.dtype.size(),
        reduction: started.reduction.expect("all-reduce reduces"),
    }
}

/// The kernels of a reduction by `op` over `nranks` ranks.
fn reduction_of(dtype: DataType, op: RedOp, nranks: usize) -> Result<Reduction> {
    Ok(Reduction {
        input: ReduceKernel::new(dtype, op, nranks)?,
        partial: ReduceKernel::new(dtype, partial_op(dtype, op), nranks)?,
    })
}

/// The call a collective op makes, the tuner's choice for it on its
/// communicator, and whether it is in place.
fn choose_collective(op: &RawOp) -> Result<(CollSpec, tuning::Choice, bool)> {
    let OpKind::Coll { kind, root, .. } = op.kind else {
        unreachable!("choose_collective takes collectives");
    };
    let comm = &op.comm;
    let spec = CollSpec {
        kind,
        nranks: comm.nranks,
        root,
        count: op.count,
    };
    let in_place = is_in_place(op, kind, root, comm.rank);
    let choice = comm.choose(&spec, op.dtype.size(), in_place)?;
    Ok((spec, choice, in_place))
}

/// Whether a call is in place by NCCL's conventions: the send buffer at
/// the collective's offset inside the receive buffer, or the reverse.
fn is_in_place(op: &RawOp, kind: CollKind, root: usize, rank: usize) -> bool {
    // Empty buffers may share a dangling address without aliasing anything.
    if op.count == 0 {
        return false;
    }
    let size = op.dtype.size();
    let at = |base: *const u8, offset: Option<usize>| offset.map(|o| base.wrapping_add(o * size));
    at(op.recv, kind.in_place_send_offset(op.count, rank, root)) == Some(op.send)
        || at(op.send, kind.in_place_recv_offset(op.count, rank, root))
            == Some(op.recv as *const u8)
}

/// What every channel's work of one operation shares.
struct Work {
    seq: u64,
    name: &'static str,
    tag: Tag,
    protocol: Protocol,
    elem_size: usize,
    reduction: Option<Arc<Reduction>>,
    user_store: Store,
}

/// The tag of pieces of batched sends and receives: any send meets any
/// receive, so only the kind of operation is checked.
pub(crate) const P2P_CALL: u32 = 0xf;

/// Packs a collective call into the tag its pieces carry.
fn call_tag(
    seq: u64,
    kind: CollKind,
    count: usize,
    dtype: DataType,
    op: RedOp,
    root: usize,
) -> Tag {
    let kind_code = CollKind::ALL.iter().position(|&k| k == kind).unwrap_or(0) as u32;
    let op_code = match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        RedOp::PreMulSum { .. } => 5,
    };
    Tag {
        seq: seq as u32,
        call: kind_code | (dtype as u32) << 4 | op_code << 8 | ((root as u32) & 0xf_ffff) << 12,
        count: count as u32,
    }
}

/// Describes the call a tag was packed from, for mismatch errors.
pub(crate) fn describe_call(tag: Tag) -> String {
    let kind_code = (tag.call & 0xf) as usize;
    if tag.call == P2P_CALL {
        return "Send/Recv".to_string();
    }
    let Some(kind) = CollKind::ALL.get(kind_code) else {
        return format!("an unknown call ({:#x})", tag.call);
    };
    let dtype = DataType::from_raw(((tag.call >> 4) & 0xf) as i32)
        .map(DataType::name)
        .unwrap_or("?");
    let op = ["sum", "prod", "max", "min", "avg", "premulsum"]
        .get(((tag.call >> 8) & 0xf) as usize)
        .copied()
        .unwrap_or("?");
    let mut text = format!("{} #{} (count {}, {dtype}", kind.name(), tag.seq, tag.count);
    if kind.reduces() {
        text += &format!(", {op}");
    }
    if kind.has_root() {
        text += &format!(", root {}", tag.call >> 12);
    }
    text + ")"
}

/// The error of a rank that runs `mine` while `peer` (described) runs
/// `theirs`.
pub(crate) fn disagreement(mine: Tag, peer: &str, theirs: Tag) -> Error {
    Error::InvalidUsage(format!(
        "ranks disagree on the operation: this rank called {} but {peer} called {}",
        describe_call(mine),
        describe_call(theirs)
    ))
}

/// The op that combines values already transformed on input: PreMulSum
/// and float Avg multiply each input once, so partial results are summed.
fn partial_op(dtype: DataType, op: RedOp) -> RedOp {
    match op {
        RedOp::PreMulSum { .. } => RedOp::Sum,
        RedOp::Avg if dtype.is_float() => RedOp::Sum,
        other => other,
    }
}

fn push_schedule(
    launch: &mut CommLaunch,
    schedule: Schedule,
    work: &Work,
    binding: impl Fn() -> Binding,
) {
    for (channel, steps) in schedule.channels.into_iter().enumerate() {
        if steps.is_empty() {
            continue;
        }
        if launch.channels.is_empty() {
            let nchannels = launch.comm.config.max_channels;
            launch.channels.resize_with(nchannels, Vec::new);
        }
        launch.channels[channel].push(OpWork {
            seq: work.seq,
            name: work.name,
            tag: work.tag,
            protocol: work.protocol,
            steps,
            binding: binding(),
            elem_size: work.elem_size,
            reduction: work.reduction.clone(),
            user_store: work.user_store,
        });
    }
}

/// Builds the work of a batch of sends and receives: every message of the
/// batch progresses at once, split across channels. The schedule sees the
/// batch's buffers laid end to end, in bytes; the executor maps each slice
/// back to its call's buffer.
fn plan_p2p(launch: &mut CommLaunch, ops: &[RawOp]) -> Result<()> {
    let comm = &launch.comm;
    let seq = comm.next_p2p_seq.fetch_add(1, Ordering::Relaxed);
    let calls = p2p_calls(ops);
    // Each call's buffer is bound at its offset in the batch.
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    for (op, call) in ops.iter().zip(&calls) {
        match *call {
            P2pOp::Send { offset, .. } => sends.push(Segment {
                start: offset,
                base: op.send as *mut u8,
            }),
            P2pOp::Recv { offset, .. } => recvs.push(Segment {
                start: offset,
                base: op.recv,
            }),
        }
    }
    let (nchannels, protocol, chunk_bytes) = p2p_shape(comm, &calls)?;
    let schedule = p2p_schedule(comm.rank, &calls, nchannels, chunk_bytes);
    let binding = || Binding::Segments {
        send: sends.clone(),
        recv: recvs.clone(),
    };
    let work = Work {
        seq,
        name: "Send/Recv",
        tag: Tag {
            seq: 0,
            call: P2P_CALL,
            count: 0,
        },
        protocol,
        elem_size: 1,
        reduction: None,
        user_store: comm
            .config
            .user_store(calls.iter().map(P2pOp::length).sum()),
    };
    push_schedule(launch, schedule, &work, binding);
    Ok(())
}

/// A send to this rank itself must be matched by a receive from itself of
/// the same size, in order (they become one copy).
fn check_self_pairs(rank: usize, calls: &[P2pOp]) -> Result<()> {
    match rccl_algorithms::unpaired_self_calls(rank, calls) {
        Some(why) => Err(Error::InvalidUsage(format!(
            "rank {rank}: {why} in this group (lengths in bytes)"
        ))),
        None => Ok(()),
    }
}

/// Makes sure every connection the planned work needs exists. Dials first
/// for every communicator, then collects the connections peers dialed, so
/// that one thread can set up several communicators of one process.
fn connect(
    launches: &[CommLaunch],
    guards: &mut [parking_lot::MutexGuard<'_, crate::comm::ExecState>],
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
                    told.get_or_insert_with(|| (Notices::new(comm), self.calls()));
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
