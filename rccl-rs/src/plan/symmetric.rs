//! Planning collectives on symmetric windows: a call whose send and
//! receive buffers lie in windows registered with
//! `NCCL_WIN_COLL_SYMMETRIC`, with every rank on this host, runs as a
//! [`SymmetricOp`] on the board (which carries only its barriers) when
//! the tuner says it serves.
//!
//! Every rank decides alike from facts they share: the windows were
//! registered collectively with equal sizes, and NCCL asks a call's
//! buffers to lie at the same offsets of the same windows on every rank,
//! so a call in a window here is in the same window everywhere. The run
//! checks it: each rank's first barrier carries its windows and offsets,
//! and a peer that differs fails the call on both before any byte is read.

use std::sync::Arc;

use rccl_algorithms::CollKind;

use super::{BoardFold, BoardOp, Started, SymmetricOp};
use crate::onesided::symmetric_span;
use crate::op::RawOp;
use crate::tuning::{self, SymmetricSchedule};
use crate::types::OpKind;

/// Bytes of a rank's first barrier post (`SymmetricOp::arrival`).
pub(crate) const ARRIVAL_BYTES: usize = 40;

/// What a collective on symmetric windows needs, found while planning.
pub(crate) struct SymmetricWork {
    op: SymmetricOp,
}

/// The symmetric work of `op`, when its buffers lie in symmetric windows
/// reachable from this process and the tuner sends it that way.
pub(crate) fn symmetric_work(op: &RawOp, in_place: bool) -> Option<SymmetricWork> {
    let OpKind::Coll { kind, .. } = op.kind else {
        return None;
    };
    let comm = &op.comm;
    // The board carries the barriers: every rank on this host.
    if comm.board_bytes() < ARRIVAL_BYTES {
        return None;
    }
    let (send_bytes, recv_bytes) = op.buffer_bytes();
    let schedule =
        tuning::symmetric_schedule(&comm.config, kind, op.count * op.dtype.size(), in_place)?;
    let send = symmetric_span(comm, op.send, send_bytes)?;
    let recv = symmetric_span(comm, op.recv, recv_bytes)?;
    // In place, the rank's block moves with the rank.
    let own_block = comm.rank * op.count * op.dtype.size();
    let (send_at, recv_at) = match (kind, in_place) {
        (CollKind::AllGather, true) => (send.offset.wrapping_sub(own_block), recv.offset),
        (CollKind::ReduceScatter, true) => (send.offset, recv.offset.wrapping_sub(own_block)),
        _ => (send.offset, recv.offset),
    };
    let arrival = [
        send.window,
        send_at as u64,
        recv.window,
        recv_at as u64,
        u64::from(schedule == SymmetricSchedule::TwoShot),
    ];
    Some(SymmetricWork {
        op: SymmetricOp {
            kind,
            schedule,
            send,
            recv,
            in_place,
            arrival,
            comm: Arc::clone(comm),
        },
    })
}

impl SymmetricWork {
    /// How the call runs, for the tuner's log line.
    pub(crate) fn how(&self) -> &'static str {
        match self.op.schedule {
            SymmetricSchedule::OneShot => " -> symmetric one-shot on windows",
            SymmetricSchedule::TwoShot => " -> symmetric two-shot on windows",
        }
    }

    /// The board operation that runs the call.
    pub(crate) fn board_op(self, op: &RawOp, started: Started) -> BoardOp {
        BoardOp {
            seq: started.seq,
            name: self.op.kind.name(),
            tag: started.tag,
            send: op.send,
            recv: op.recv,
            count: op.count,
            elem_size: op.dtype.size(),
            reduction: started.reduction,
            fold: BoardFold::OneShot,
            symmetric: Some(Box::new(self.op)),
        }
    }
}
