//! What a stuck launch waits for: the report published for hang reports on
//! request and printed at a timeout, and the mismatches a stuck rank can
//! see (a peer's tagged pieces or posts of another call, or a waiting
//! peer's word that it runs another call).

use std::sync::Arc;

use smallvec::SmallVec;

use rccl_transports::Protocol;

use super::executor::{self, Driven, Run};
use crate::agreement::call::{disagreement, P2P_CALL};
use crate::agreement::stuck::{Calls, Notices};
use crate::comm::CommInner;
use crate::error::Error;

/// Records what the stuck channels of a launch wait for, for hang reports
/// on request.
pub(crate) fn publish_stall(
    comms: &[Arc<CommInner>],
    runs: &[Driven<'_, '_>],
    stalled: std::time::Duration,
) {
    for (index, comm) in comms.iter().enumerate() {
        let waiting = runs
            .iter()
            .filter(|d| d.comm == index && d.run.busy())
            .map(|d| match d.run.blocked() {
                Some(b) => format!(
                    "{}: operation #{} {}, {}",
                    d.run.place(),
                    b.seq,
                    b.op,
                    b.waits(&comm.describe(b.peer))
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
pub(crate) fn find_mismatch(
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
                .host_links
                .iter()
                .chain(&state.staged_links)
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

/// A peer of this process that a stuck run waits on and that failed (see
/// [`CommInner::peer_failure_in_process`]).
pub(crate) fn failed_peer_in_process(
    comms: &[Arc<CommInner>],
    runs: &[Driven<'_, '_>],
) -> Option<(usize, Error)> {
    runs.iter().filter(|d| d.run.busy()).find_map(|driven| {
        let peer = driven.run.blocked()?.peer;
        let error = comms[driven.comm].peer_failure_in_process(&[peer])?;
        Some((driven.comm, error))
    })
}

/// Tells the peers that the stuck runs wait on which calls they run, and
/// compares what waiting peers said with those calls (see [`stuck`]).
pub(crate) fn compare_with_waiting_peers(
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
pub(crate) fn hang_report(
    comms: &[Arc<CommInner>],
    waiting: &[(usize, String, Option<executor::Blocked>)],
) -> String {
    let mut lines = Vec::new();
    for (comm_index, place, blocked) in waiting {
        let comm = &comms[*comm_index];
        let line = match blocked {
            Some(b) => format!(
                "rank {} of {}: timed out after {:?} in operation #{} {} on {place}, {}",
                comm.rank,
                comm.nranks,
                comm.config.timeout,
                b.seq,
                b.op,
                b.waits(&comm.describe(b.peer))
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
