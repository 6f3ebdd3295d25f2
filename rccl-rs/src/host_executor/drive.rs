//! Driving a launch: makes sure the connections its work needs exist,
//! then drives every channel of every communicator of the launch from the
//! calling thread until all complete; a lone small all-reduce on an
//! existing board skips the bookkeeping.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use rccl_algorithms::CollKind;
use rccl_transports::Tag;

use super::diagnose::{
    compare_with_waiting_peers, failed_peer_in_process, find_mismatch, hang_report, publish_stall,
};
use super::executor::{self, BoardRun, ChannelRun, Driven, Run};
use crate::agreement::stuck::{self, Notices};
use crate::comm::{close_links, Activity, CommInner, ExecState, LoneBoardCall};
use crate::connect::connect;
use crate::error::{Error, Result};
use crate::kernels::Reduction;
use crate::op::RawOp;
use crate::plan::BoardOp;
use crate::plan::{
    board_op, choose_collective, is_in_place, log_start, runs_on_board, start_collective,
    CommLaunch, Planned, Started, INLINE_COMMS,
};
use crate::tuning;
use crate::types::{Executor, OpKind, RedOp};

/// Polls a lone board call inline this many times before it waits the
/// general way (with stall checks, parking and hang reports): covers a
/// peer that is a few microseconds behind, where ranks have cores of
/// their own.
const INLINE_POLLS: u32 = 256;

/// A lone all-reduce that the tuner sends through a board that already
/// exists (the first one, which makes the board, goes the general way):
/// run without a launch's bookkeeping, which costs more than the smallest
/// calls themselves. `None` when the call is not one.
pub(crate) fn on_board_alone(op: &RawOp) -> Option<Result<()>> {
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
    // A profiled call goes the general way, which reports its events.
    if op.count * op.dtype.size() > comm.board_bytes() || comm.profiler.is_some() {
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
    let inline_polls = if rccl_transports::spinning() {
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
        log_start(op, seq, &memo.choice, in_place, " via the board");
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
    let started = start_collective(op, &choice, in_place, " via the board", Executor::Host)?;
    *memo = remember(started.reduction.clone(), started.tag.call);
    Ok(Some(board_op(op, started)))
}

/// Runs calls on host memory (a group, or a single call) to completion.
/// Allocates little for a lone call or a group over two communicators:
/// the smallest calls cost about as much as this bookkeeping, so the plan
/// is made and run in place, never moved.
pub(crate) fn launch(ops: impl IntoIterator<Item = RawOp>) -> Result<()> {
    let mut planned = Planned::default();
    planned.plan(ops, Executor::Host)?;
    if planned.is_empty() {
        return Ok(());
    }
    run(&mut planned)
}

/// Opens the connections a planned launch needs and drives every channel
/// of every communicator from the calling thread until all complete.
pub(crate) fn run(planned: &mut Planned) -> Result<()> {
    let launches = planned.launches_mut();
    // Lock communicators in address order so that two threads launching
    // overlapping groups cannot deadlock.
    launches.sort_by_key(|l| Arc::as_ptr(&l.comm) as usize);
    let comms: SmallVec<[Arc<CommInner>; INLINE_COMMS]> =
        launches.iter().map(|l| l.comm.clone()).collect();
    let mut guards: SmallVec<[_; INLINE_COMMS]> =
        comms.iter().map(|comm| comm.exec.lock()).collect();
    // One clock reading bounds both the connection setup and the run.
    let started = std::time::Instant::now();
    if let Err(error) = connect(launches, &mut guards, started) {
        // A peer that made its side of a link made so far may already
        // wait on it: its note tells it at once why.
        for (comm, guard) in comms.iter().zip(&guards) {
            if let Some(why) = comm.poisoned.get() {
                close_links(comm, guard, why);
            }
        }
        return Err(error);
    }

    let deadline = launches
        .iter()
        .map(|l| started + l.comm.config.timeout)
        .min()
        .expect("a launch has at least one communicator");
    // What each communicator runs, published for hang reports once the
    // launch is stuck (most launches finish long before).
    let summaries: SmallVec<[Summary; INLINE_COMMS]> =
        launches.iter().map(CommLaunch::summary).collect();
    let mut runs: SmallVec<[Driven<'_, '_>; 2]> = SmallVec::new();
    for (index, (launch, guard)) in launches.iter_mut().zip(&guards).enumerate() {
        for (channel, work) in launch.channels.iter_mut().enumerate() {
            if work.is_empty() {
                continue;
            }
            let mut run = ChannelRun::new(channel, &guard.links_for(launch.executor)[channel]);
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
    guards: &[parking_lot::MutexGuard<'_, ExecState>],
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
        find_mismatch(comms, guards, runs)
            .or_else(|| failed_peer_in_process(comms, runs))
            .or_else(|| {
                if stalled < stuck::NOTICE_AFTER {
                    return None;
                }
                if notices.is_empty() {
                    notices.extend(comms.iter().map(|comm| Notices::new(&**comm)));
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
