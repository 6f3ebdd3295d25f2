//! What a planned launch hands its executor. The host executor runs each
//! operation's [`OpWork`] per channel (its steps over the user's buffers)
//! or a [`BoardOp`]; the device executor encodes each [`DeviceCall`] for
//! the device (`crate::device_executor`).

use std::sync::Arc;

use rccl_algorithms::{Buf, CollKind, Schedule, Step};
use rccl_transports::{Protocol, Tag};

use crate::comm::CommInner;
use crate::kernels::{Reduction, Store};
use crate::onesided::SymmetricSpan;
use crate::queue::StreamRef;
use crate::tuning::SymmetricSchedule;
use crate::types::OpArgs;

/// The user's buffers of one operation, as raw host pointers.
#[derive(Clone, Copy, Debug)]
pub struct Buffers {
    /// Start of the send buffer.
    pub send: *const u8,
    /// Start of the receive buffer.
    pub recv: *mut u8,
}

/// One call's buffer within a batch laid end to end.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    /// Where the call's bytes start in the batch's layout.
    pub start: usize,
    /// The call's buffer.
    pub base: *mut u8,
}

/// Where the schedule's send and receive slices point.
pub enum Binding {
    /// The collective's two buffers.
    Shared(Buffers),
    /// A batch of sends and receives, each with its own buffer: the
    /// schedule addresses them laid end to end, in `start` order; a slice
    /// never spans two calls.
    Segments {
        /// The send calls' buffers.
        send: Vec<Segment>,
        /// The receive calls' buffers.
        recv: Vec<Segment>,
    },
}

impl Binding {
    /// The address of element `index` of `buf`.
    pub(crate) fn address(&self, buf: Buf, index: usize, elem_size: usize) -> *mut u8 {
        match self {
            Binding::Shared(b) => {
                let base = match buf {
                    Buf::Send => b.send as *mut u8,
                    Buf::Recv => b.recv,
                };
                base.wrapping_add(index * elem_size)
            }
            Binding::Segments { send, recv } => {
                let segments = match buf {
                    Buf::Send => send,
                    Buf::Recv => recv,
                };
                let at = segments.partition_point(|s| s.start <= index) - 1;
                let segment = segments[at];
                segment
                    .base
                    .wrapping_add((index - segment.start) * elem_size)
            }
        }
    }
}

/// One operation's work on one channel.
pub struct OpWork {
    /// The communicator's sequence number of the operation.
    pub seq: u64,
    /// What it is, for reports ("AllReduce", "Send/Recv").
    pub name: &'static str,
    /// What every piece of it carries; a piece with another tag belongs
    /// to a different call, so the ranks disagree on what they run.
    pub tag: Tag,
    /// How its pieces travel.
    pub protocol: Protocol,
    /// The channel's steps.
    pub steps: Vec<Step>,
    /// Buffers the primitives read and write.
    pub binding: Binding,
    /// Bytes per element of the schedule's slices.
    pub elem_size: usize,
    /// The reduction, for reducing collectives.
    pub reduction: Option<Arc<Reduction>>,
    /// How primitives write the user's buffers (FIFO slots are always
    /// written with cached stores: a peer reads them at once).
    pub user_store: Store,
}

/// One all-reduce run through the board (see `rccl_transports::Board`):
/// every rank posts its input and the posts become the result as `fold`
/// says, the same on every rank.
pub struct BoardOp {
    /// The communicator's sequence number of the operation.
    pub seq: u64,
    /// What it is, for reports.
    pub name: &'static str,
    /// What this rank called; every post must carry the same.
    pub tag: Tag,
    /// The send buffer (`count` elements).
    pub send: *const u8,
    /// The receive buffer (`count` elements; may be the send buffer: the
    /// input is staged on the board before the result is written).
    pub recv: *mut u8,
    /// Elements per rank.
    pub count: usize,
    /// Bytes per element.
    pub elem_size: usize,
    /// The reduction (`None` for an all-gather on symmetric windows).
    pub reduction: Option<Reduction>,
    pub fold: BoardFold,
    /// Set for a collective on symmetric windows: the board carries only
    /// its barriers, the data is read from the peers' windows.
    pub symmetric: Option<Box<SymmetricOp>>,
}

/// A collective whose buffers lie in symmetric windows on every rank: it
/// reads (and, two-shot, copies) peers' windows directly, the board's
/// rounds telling each rank when peers' inputs are ready and when they
/// are done reading its own.
pub struct SymmetricOp {
    pub kind: CollKind,
    pub schedule: SymmetricSchedule,
    /// The send buffer on every rank.
    pub send: SymmetricSpan,
    /// The receive buffer on every rank.
    pub recv: SymmetricSpan,
    /// Whether the call is in place (an all-gather's input then lies in
    /// each rank's receive buffer, at its block).
    pub in_place: bool,
    /// What this rank's first barrier post carries, which every rank's
    /// must equal: both windows' numbers and offsets (an in-place
    /// all-gather's send offset and an in-place reduce-scatter's receive
    /// offset less the rank's block) and the schedule.
    pub arrival: [u64; 5],
    /// Counts the calls that ran (`Communicator::symmetric_calls`).
    pub comm: Arc<CommInner>,
}

/// How a board operation's posts become its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoardFold {
    /// Every rank folds every post in the one-shot schedule's order,
    /// `x0 op (x1 op (... op x(n-1)))`: bitwise one-shot over FIFOs.
    OneShot,
    /// Every rank folds each block of `split_even(count, n)` in the order
    /// `rccl_algorithms::reduction_order` states: bitwise the ordered
    /// ring (the deterministic mode's small calls).
    Ordered,
    /// Each rank folds only its own block in that order and posts it in a
    /// second round, from which every rank copies the others' blocks: the
    /// same bits for n times fewer reads of posts, at the cost of a round
    /// (the deterministic mode's larger calls).
    OrderedTwoShot,
}

/// A call the device executor runs, as planned: its schedule, the tuner's
/// protocol, and its buffers; encoded for the device at launch.
pub(crate) enum DeviceCall {
    /// A collective; `staged`: its input is copied aside first (an
    /// in-place one-shot all-reduce, as the board stages).
    Collective {
        args: OpArgs,
        stream: StreamRef,
        schedule: Schedule,
        protocol: Protocol,
        tag: Tag,
        staged: bool,
    },
    /// A batch of sends and receives, their buffers laid end to end.
    P2p {
        schedule: Schedule,
        protocol: Protocol,
        stream: StreamRef,
        sends: Vec<Segment>,
        recvs: Vec<Segment>,
    },
}
