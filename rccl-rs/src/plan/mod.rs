//! Planning: each operation of a launch becomes per-channel work (the
//! tuner's algorithm, protocol and channels, its schedule, the tag its
//! pieces carry), or board work; sends and receives are planned together.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use rccl_algorithms::{p2p_schedule, CollKind, CollSpec, P2pOp, Schedule, Topology};
use rccl_transports::{Protocol, Tag};

use crate::agreement::call::{call_tag, P2P_CALL};
use crate::comm::CommInner;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kernels::{ReduceKernel, Reduction, Store};
use crate::op::RawOp;
use crate::tuning;
use crate::types::{DataType, RedOp};
use crate::types::{Executor, OpKind};

mod symmetric;
mod work;

pub(crate) use symmetric::{symmetric_work, ARRIVAL_BYTES};
pub(crate) use work::SymmetricOp;
pub(crate) use work::{Binding, BoardFold, BoardOp, Buffers, DeviceCall, OpWork, Segment};

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
    /// NICs per host its channels spread over.
    pub rails: usize,
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

/// The calls of a batch of sends and receives, laid out as the launch
/// lays their buffers: the sends end to end, the receives end to end
/// (offsets and lengths in bytes).
pub(crate) fn p2p_calls<'a>(ops: impl IntoIterator<Item = &'a RawOp>) -> Vec<P2pOp> {
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
pub(crate) fn p2p_shape(comm: &CommInner, calls: &[P2pOp]) -> Result<(usize, Protocol, usize)> {
    check_self_pairs(comm.rank, calls)?;
    let largest = calls.iter().map(P2pOp::length).max().unwrap_or(0);
    let (nchannels, protocol) = tuning::p2p_choice(&comm.config, largest, comm.rails);
    Ok((
        nchannels,
        protocol,
        tuning::chunk_bytes(&comm.config, protocol),
    ))
}

/// Communicators a launch holds without allocating: a lone call, or a
/// group over two (one thread driving two ranks).
pub(crate) const INLINE_COMMS: usize = 2;

/// A launch planned and not yet run: per communicator, its work.
#[derive(Default)]
pub(crate) struct Planned {
    launches: SmallVec<[CommLaunch; INLINE_COMMS]>,
}

impl Planned {
    /// Plans `ops` for `executor`: the tuner's choices, the schedules,
    /// the sequence numbers (taken here, so calls keep their order).
    pub(crate) fn plan(
        &mut self,
        ops: impl IntoIterator<Item = RawOp>,
        executor: Executor,
    ) -> Result<()> {
        #[cfg(feature = "fault-injection")]
        crate::fault::point("launch");
        let launches = &mut self.launches;
        for op in ops {
            let index = match launches.iter().position(|l| Arc::ptr_eq(&l.comm, &op.comm)) {
                Some(i) => i,
                None => {
                    op.comm.check_usable()?;
                    launches.push(CommLaunch {
                        events: Default::default(),
                        comm: op.comm.clone(),
                        channels: Vec::new(),
                        board: SmallVec::new(),
                        p2p: Vec::new(),
                        executor,
                        device_calls: Vec::new(),
                    });
                    launches.len() - 1
                }
            };
            match op.kind {
                OpKind::Coll { .. } => plan_collective(&mut launches[index], &op)?,
                OpKind::Send { .. } | OpKind::Recv { .. } => launches[index].p2p.push(op),
            }
        }
        for launch in launches.iter_mut() {
            if !launch.p2p.is_empty() {
                let p2p = std::mem::take(&mut launch.p2p);
                plan_p2p(launch, &p2p)?;
            }
        }
        Ok(())
    }

    /// Whether there is nothing to run.
    pub(crate) fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    /// The communicators of the launch.
    pub(crate) fn comms(&self) -> impl Iterator<Item = &Arc<CommInner>> {
        self.launches.iter().map(|l| &l.comm)
    }

    /// The communicators' shares of the launch, to run in place.
    pub(crate) fn launches_mut(&mut self) -> &mut SmallVec<[CommLaunch; INLINE_COMMS]> {
        &mut self.launches
    }

    /// The communicators' shares of the launch.
    pub(crate) fn into_launches(self) -> SmallVec<[CommLaunch; INLINE_COMMS]> {
        self.launches
    }
}

/// One communicator's share of a launch.
pub(crate) struct CommLaunch {
    /// Its profiler events; first, so they stop before the communicator
    /// (and its profiler context) can go.
    pub events: crate::plugins::profiler::LaunchEvents,
    pub comm: Arc<CommInner>,
    /// Per channel, the work queued on it (empty until a schedule is
    /// queued: a launch that only uses the board allocates none).
    pub channels: Vec<Vec<OpWork>>,
    /// The work run through the board.
    pub board: SmallVec<[BoardOp; 1]>,
    /// The sends and receives, planned together once all are known.
    pub p2p: Vec<RawOp>,
    /// The executor that runs it.
    pub executor: Executor,
    /// Its operations run as device work, in call order (calls on device
    /// memory of a communicator whose ranks are all in this process).
    pub device_calls: Vec<DeviceCall>,
}

impl CommLaunch {
    /// What the launch runs, for hang reports: its first operation
    /// (sequence number and name) and how many it holds.
    pub fn summary(&self) -> ((u64, &'static str), usize) {
        let board_ops = self.board.iter().map(|w| (w.seq, w.name));
        let mut ops = self
            .channels
            .iter()
            .flatten()
            .map(|w| (w.seq, w.name))
            .chain(board_ops);
        let first = ops.next().unwrap_or((0, "nothing"));
        (first, 1 + ops.filter(|&op| op != first).count())
    }
}

/// Builds the per-channel work of a collective.
pub(crate) fn plan_collective(launch: &mut CommLaunch, op: &RawOp) -> Result<()> {
    let comm = &launch.comm;
    let (spec, choice, in_place) = choose_collective(op)?;
    let as_device_work = launch.executor == Executor::Device;
    let choice = if as_device_work {
        tuning::for_device_work(&comm.config, choice)
    } else {
        choice
    };
    let on_board = runs_on_board(op, &choice);
    // A call the board serves moves its data with one barrier, where
    // symmetric windows take two: the board stays cheaper.
    if !as_device_work && !on_board {
        if let Some(symmetric) = symmetric_work(op, in_place) {
            let how = symmetric.how();
            let started = start_collective(op, &choice, in_place, how, launch.executor)?;
            if let Some(profiler) = &comm.profiler {
                launch
                    .events
                    .collective(profiler, op.args(), op.api_event, &choice, started.seq);
            }
            launch.board.push(symmetric.board_op(op, started));
            return Ok(());
        }
    }
    let how = if on_board { " via the board" } else { "" };
    let started = start_collective(op, &choice, in_place, how, launch.executor)?;
    if let Some(profiler) = &comm.profiler {
        launch
            .events
            .collective(profiler, op.args(), op.api_event, &choice, started.seq);
    }
    if on_board && !as_device_work {
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
    if as_device_work {
        if schedule.channels.iter().any(|steps| !steps.is_empty()) {
            // One-shot reads every input after writing the output: in
            // place, the board stages the input; device work does too.
            launch.device_calls.push(DeviceCall::Collective {
                args: op.args(),
                stream: op
                    .stream
                    .clone()
                    .expect("a call on device memory has a stream"),
                schedule,
                protocol: choice.protocol,
                tag,
                staged: on_board && in_place,
            });
        }
        return Ok(());
    }
    let buffers = Buffers {
        send: op.send,
        recv: op.recv,
    };
    let (send_bytes, recv_bytes) = op.buffer_bytes();
    let work = Work {
        seq,
        name: spec.kind.name(),
        tag,
        protocol: choice.protocol,
        elem_size: op.dtype.size(),
        reduction: reduction.map(Arc::new),
        user_store: comm.config.user_store(send_bytes + recv_bytes),
    };
    push_schedule(launch, schedule, &work, || Binding::Shared(buffers));
    Ok(())
}

/// Whether a collective that the tuner gave `choice` runs through its
/// communicator's board: a one-shot all-reduce that fits a post.
pub(crate) fn runs_on_board(op: &RawOp, choice: &tuning::Choice) -> bool {
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
pub(crate) struct Started {
    /// The communicator's sequence number of the call.
    pub seq: u64,
    /// What its pieces (or posts) carry.
    pub tag: Tag,
    /// Its reduction, for reducing collectives.
    pub reduction: Option<Reduction>,
}

/// Takes a collective call's sequence number, logs the call and the
/// tuner's choice for it (`NCCL_DEBUG` subsystems COLL and TUNING), and
/// prepares its reduction when `executor` reduces on the host.
pub(crate) fn start_collective(
    op: &RawOp,
    choice: &tuning::Choice,
    in_place: bool,
    how: &str,
    executor: Executor,
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
    log_start(op, seq, choice, in_place, how);
    // Device work reduces with the kernels' own code.
    let reduction = if kind.reduces() && executor != Executor::Device {
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
pub(crate) fn log_start(op: &RawOp, seq: u64, choice: &tuning::Choice, in_place: bool, how: &str) {
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
    log_choice(op, choice, in_place, how);
}

/// Logs the tuner's choice for a collective call (`NCCL_DEBUG` subsystem
/// TUNING), `how` it runs appended.
pub(crate) fn log_choice(op: &RawOp, choice: &tuning::Choice, in_place: bool, how: &str) {
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

/// From this many bytes a deterministic board all-reduce folds in two
/// shots: below it the second round costs more than the reads it saves.
const BOARD_TWO_SHOT_BYTES: usize = 8 << 10;

/// The board operation of an all-reduce that [`runs_on_board`].
pub(crate) fn board_op(op: &RawOp, started: Started) -> BoardOp {
    let bytes = op.count * op.dtype.size();
    let fold = match (op.comm.config.deterministic, bytes >= BOARD_TWO_SHOT_BYTES) {
        (false, _) => BoardFold::OneShot,
        (true, false) => BoardFold::Ordered,
        (true, true) => BoardFold::OrderedTwoShot,
    };
    BoardOp {
        seq: started.seq,
        name: CollKind::AllReduce.name(),
        tag: started.tag,
        send: op.send,
        recv: op.recv,
        count: op.count,
        elem_size: op.dtype.size(),
        reduction: Some(started.reduction.expect("all-reduce reduces")),
        fold,
        symmetric: None,
    }
}

/// The kernels of a reduction by `op` over `nranks` ranks.
fn reduction_of(dtype: DataType, op: RedOp, nranks: usize) -> Result<Reduction> {
    let op = host_op(dtype, op)?;
    Ok(Reduction {
        input: ReduceKernel::new(dtype, op, nranks)?,
        partial: ReduceKernel::new(dtype, partial_op(dtype, op), nranks)?,
    })
}

/// `op` as the host executor runs it: its kernels take PreMulSum's scalar
/// when planned, so a scalar in device memory is read now (a synchronous
/// copy), unlike device work, which reads it when the collective runs.
fn host_op(dtype: DataType, op: RedOp) -> Result<RedOp> {
    let RedOp::PreMulSumDevice { scalar: at } = op else {
        return Ok(op);
    };
    let device = rccl_device::active().ok_or_else(|| {
        Error::InvalidUsage(format!(
            "the PreMulSum scalar at {at:#x} is device memory, but no device is active"
        ))
    })?;
    let mut scalar = [0u8; 8];
    // SAFETY: ncclScalarDevice's contract: the scalar stays readable while
    // its op lives; `scalar` holds any element.
    unsafe { device.copy(scalar.as_mut_ptr(), at as *const u8, dtype.size()) }
        .map_err(Error::from)?;
    Ok(RedOp::PreMulSum { scalar })
}

/// The call a collective op makes, the tuner's choice for it on its
/// communicator, and whether it is in place.
pub(crate) fn choose_collective(op: &RawOp) -> Result<(CollSpec, tuning::Choice, bool)> {
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
pub(crate) fn is_in_place(op: &RawOp, kind: CollKind, root: usize, rank: usize) -> bool {
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

/// The op that combines values already transformed on input: PreMulSum
/// and float Avg multiply each input once, so partial results are summed.
fn partial_op(dtype: DataType, op: RedOp) -> RedOp {
    match op {
        RedOp::PreMulSum { .. } | RedOp::PreMulSumDevice { .. } => RedOp::Sum,
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
pub(crate) fn plan_p2p(launch: &mut CommLaunch, ops: &[RawOp]) -> Result<()> {
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
    if let Some(profiler) = &comm.profiler {
        let args = ops.iter().map(|op| (op.args(), op.api_event));
        launch.events.p2p(profiler, args, nchannels);
    }
    let schedule = p2p_schedule(comm.rank, &calls, nchannels, chunk_bytes);
    if launch.executor == Executor::Device {
        if schedule.channels.iter().any(|steps| !steps.is_empty()) {
            let stream = ops[0]
                .stream
                .clone()
                .expect("a call on device memory has a stream");
            launch.device_calls.push(DeviceCall::P2p {
                schedule,
                protocol,
                stream,
                sends,
                recvs,
            });
        }
        return Ok(());
    }
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
