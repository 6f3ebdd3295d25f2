//! Groups (per thread, as NCCL's `ncclGroupStart` / `ncclGroupEnd`):
//! operations are collected inside a group and launched together at its
//! end; outside a group each call is a group of one. A simulated end
//! ([`group_simulate_end`]) plans the operations the same way and hands the
//! plan back instead of running it.

use std::cell::RefCell;
use std::sync::Arc;

use rccl_algorithms::P2pOp;

use crate::comm::CommInner;
use crate::error::{Error, Result};
use crate::launch::{launch_alone, launch_group};
use crate::op::RawOp;
use crate::plan::{
    choose_collective, log_choice, p2p_calls, p2p_shape, PlannedCollective, PlannedComm, PlannedP2p,
};
use crate::types::OpKind;

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
/// inside the group). A group of calls on device memory is enqueued on
/// their streams instead, as one task, and this returns at once.
pub fn group_end() -> Result<()> {
    let closed = close_group();
    // The outermost end, run or failed: the group's API event ends with it.
    let _api_event = (group_depth() == 0).then(crate::plugins::profiler::GroupApiEnd::begin);
    match closed? {
        Some(ops) => launch_group(ops),
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
    let closed = close_group();
    let _api_event = (group_depth() == 0).then(crate::plugins::profiler::GroupApiEnd::begin);
    let Some(ops) = closed? else {
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
                        rails: op.comm.rails,
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

/// Runs `op` now (on device memory: enqueues it on its stream), or
/// collects it when a group is open.
///
/// # Safety
/// The op's buffers must stay valid (and, for the receive buffer, not be
/// accessed by anyone else) until the operation completes: when this
/// returns outside a group, or at the outermost [`group_end`]; on device
/// memory, when its stream has run it.
pub(crate) unsafe fn enqueue(mut op: RawOp) -> Result<()> {
    op.comm.check_usable()?;
    if let Some(profiler) = &op.comm.profiler {
        op.api_event = profiler.api_call(op.args(), group_depth());
    }
    // Asked before the op moves: a lone call need not travel through the
    // group's slot.
    if GROUP.with(|g| g.borrow().depth > 0) {
        GROUP.with(|g| g.borrow_mut().ops.push(op));
        return Ok(());
    }
    // A call outside any group is a group of its own for the profiler.
    let _api_event = op
        .comm
        .profiler
        .is_some()
        .then(crate::plugins::profiler::GroupApiEnd::begin);
    launch_alone(op)
}
