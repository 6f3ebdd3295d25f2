//! What the executor reports: the symbolic inputs and places it names, and
//! every way a set of schedules can be wrong ([`VerifyError`]).

use std::fmt;

use crate::{Buf, Rank, Slice};

/// A symbolic input: element `index` of rank `rank`'s send buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Term {
    /// The rank that contributed the input.
    pub rank: u32,
    /// Its index in that rank's send buffer.
    pub index: u32,
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({},{})", self.rank, self.index)
    }
}

/// Where a primitive sits in the schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    /// The rank whose schedule it is.
    pub rank: Rank,
    /// The channel.
    pub channel: usize,
    /// The step index within the channel.
    pub step: usize,
    /// The primitive's index within the step.
    pub prim: usize,
    /// NCCL's name of the primitive.
    pub name: &'static str,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} channel {} step {} prim {} ({})",
            self.rank, self.channel, self.step, self.prim, self.name
        )
    }
}

/// What a stuck primitive waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A message from this peer (its FIFO is empty).
    RecvFrom(Rank),
    /// Room in the FIFO to this peer (it is full).
    SendTo(Rank),
}

/// A rank's channel that cannot move, in a deadlock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stuck {
    /// The first blocked primitive of the channel's current step.
    pub at: Loc,
    /// What it waits for.
    pub waits: Wait,
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.waits {
            Wait::RecvFrom(p) => write!(f, "{} waits to receive from rank {p}", self.at),
            Wait::SendTo(p) => write!(f, "{} waits to send to rank {p} (FIFO full)", self.at),
        }
    }
}

fn list_stuck(stuck: &[Stuck]) -> String {
    const SHOWN: usize = 16;
    let mut s: Vec<String> = stuck.iter().take(SHOWN).map(|x| x.to_string()).collect();
    if stuck.len() > SHOWN {
        s.push(format!("and {} more", stuck.len() - SHOWN));
    }
    s.join("; ")
}

fn buf_name(buf: Buf) -> &'static str {
    match buf {
        Buf::Send => "send",
        Buf::Recv => "recv",
    }
}

fn show_slice(s: &Slice) -> String {
    format!("{}[{}..{}]", buf_name(s.buf), s.offset, s.offset + s.len)
}

fn show_writer(w: &Option<Loc>) -> String {
    match w {
        Some(l) => format!("last written by {l}"),
        None => "never written".to_string(),
    }
}

/// Why a set of schedules is wrong. Errors found in a schedule name the
/// first bad primitive by rank, channel, step index and primitive.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The call itself is invalid (no ranks, root out of range, ...).
    #[error("invalid call: {0}")]
    InvalidCall(String),
    /// The algorithm does not implement the collective.
    #[error("algorithm {alg} does not implement {kind}")]
    Unsupported {
        /// The algorithm's name.
        alg: &'static str,
        /// The collective's name.
        kind: &'static str,
    },
    /// The algorithm does not implement the in-place form of the
    /// collective.
    #[error("algorithm {alg} does not implement {kind} in place")]
    InPlaceUnsupported {
        /// The algorithm's name.
        alg: &'static str,
        /// The collective's name.
        kind: &'static str,
    },
    /// A read, through the receive buffer, of an element that still holds
    /// the rank's untouched input in a reducing collective: the engine
    /// applies the op's input transform only to reads of the send buffer.
    #[error("{at}: reads recv element {index}, which still holds an untransformed input (read it through the send buffer)")]
    UntransformedInput {
        /// The reading primitive.
        at: Loc,
        /// The element of the receive buffer.
        index: usize,
    },
    /// Not one schedule per rank.
    #[error("{got} schedules given for {nranks} ranks")]
    WrongScheduleCount {
        /// Schedules given.
        got: usize,
        /// Ranks in the call.
        nranks: usize,
    },
    /// A primitive that moves no elements.
    #[error("{at}: moves zero elements")]
    EmptyPrim {
        /// The primitive.
        at: Loc,
    },
    /// A primitive whose slices differ in length.
    #[error("{at}: slices of different lengths ({src} and {dst} elements)")]
    SliceLengthMismatch {
        /// The primitive.
        at: Loc,
        /// Length of the source slice.
        src: usize,
        /// Length of the destination slice.
        dst: usize,
    },
    /// A slice outside its buffer.
    #[error("{at}: {} is out of bounds of the {} buffer ({buf_len} elements)", show_slice(.slice), buf_name(.slice.buf))]
    OutOfBounds {
        /// The primitive.
        at: Loc,
        /// The slice.
        slice: Slice,
        /// Elements in the buffer.
        buf_len: usize,
    },
    /// A peer that is not a rank of the communicator.
    #[error("{at}: peer {peer} is out of range ({nranks} ranks)")]
    PeerOutOfRange {
        /// The primitive.
        at: Loc,
        /// The peer.
        peer: Rank,
        /// Ranks in the call.
        nranks: usize,
    },
    /// A primitive that sends to or receives from its own rank.
    #[error("{at}: peer {peer} is the rank itself (use copy)")]
    SelfPeer {
        /// The primitive.
        at: Loc,
        /// The peer.
        peer: Rank,
    },
    /// A primitive whose source and destination partly overlap.
    #[error("{at}: source {} and destination {} partly overlap", show_slice(.src), show_slice(.dst))]
    OverlappingSlices {
        /// The primitive.
        at: Loc,
        /// Its source.
        src: Slice,
        /// Its destination.
        dst: Slice,
    },
    /// Two concurrent primitives (of one step, or of two channels) touch the
    /// same element and at least one writes it.
    #[error("{at}: {} element {index} races with {other}, which runs concurrently; one of them writes it", buf_name(*.buf))]
    Race {
        /// The later primitive in schedule order.
        at: Loc,
        /// The primitive it races with.
        other: Loc,
        /// The buffer, as `at` names it.
        buf: Buf,
        /// The element, as `at` names it.
        index: usize,
    },
    /// A receive whose length differs from the message it gets.
    #[error("{at}: expects a message of {expected} elements from rank {from} but the next one, sent by {sender}, has {got}")]
    MessageLengthMismatch {
        /// The receiving primitive.
        at: Loc,
        /// The peer.
        from: Rank,
        /// The receiving primitive's length.
        expected: usize,
        /// The message's length.
        got: usize,
        /// The primitive that sent the message.
        sender: Loc,
    },
    /// A read of memory nobody has written.
    #[error("{at}: reads uninitialized {} element {index}", buf_name(*.buf))]
    Uninitialized {
        /// The reading primitive.
        at: Loc,
        /// The buffer.
        buf: Buf,
        /// The element.
        index: usize,
    },
    /// A read of the send buffer of a reducing collective (an input) after
    /// the element was overwritten.
    #[error("{at}: reads send element {index} as an input, but it was overwritten ({})", show_writer(.writer))]
    InputOverwritten {
        /// The reading primitive.
        at: Loc,
        /// The element.
        index: usize,
        /// Who overwrote it.
        writer: Option<Loc>,
    },
    /// A finished result reduced again.
    #[error("{at}: reduces a finished result again (element {index} of the message): {value}")]
    DoubleReduction {
        /// The reducing primitive.
        at: Loc,
        /// Element of the primitive.
        index: usize,
        /// The finished value.
        value: String,
    },
    /// A reduction that would count an input twice.
    #[error("{at}: counts input {term} twice (element {index} of the message): {value}")]
    DuplicateInput {
        /// The reducing primitive.
        at: Loc,
        /// Element of the primitive.
        index: usize,
        /// The input counted twice.
        term: Term,
        /// The value it is reduced into.
        value: String,
    },
    /// A reduction of inputs of different elements.
    #[error("{at}: reduces inputs of different elements (element {index} of the message): {value} with {other}")]
    MixedElements {
        /// The reducing primitive.
        at: Loc,
        /// Element of the primitive.
        index: usize,
        /// The accumulated value.
        value: String,
        /// The value reduced into it.
        other: String,
    },
    /// No rank can move but some have not finished.
    #[error("deadlock: {}", list_stuck(.stuck))]
    Deadlock {
        /// For every stuck rank and channel, the first blocked primitive.
        stuck: Vec<Stuck>,
    },
    /// Messages nobody received.
    #[error("{elements} element(s) left in the FIFO of channel {channel} from rank {from} to rank {to}, the first sent by {sender}")]
    LeftoverMessages {
        /// The channel.
        channel: usize,
        /// The sending rank.
        from: Rank,
        /// The receiving rank.
        to: Rank,
        /// Elements left.
        elements: usize,
        /// The primitive that sent the first of them.
        sender: Loc,
    },
    /// An output element with the wrong content.
    #[error("rank {rank} recv[{index}] holds {got}, expected {expected} ({}); {wrong} wrong output element(s) in all", show_writer(.writer))]
    WrongValue {
        /// The rank.
        rank: Rank,
        /// The element of the receive buffer.
        index: usize,
        /// The expected inputs.
        expected: String,
        /// What it holds.
        got: String,
        /// The primitive that wrote it last.
        writer: Option<Loc>,
        /// How many output elements are wrong, over all ranks.
        wrong: usize,
    },
    /// An output element of a reducing collective that is not a finished
    /// result (its output transform was never applied).
    #[error("rank {rank} recv[{index}] holds the right inputs but is not a finished result: {got} ({})", show_writer(.writer))]
    NotFinished {
        /// The rank.
        rank: Rank,
        /// The element of the receive buffer.
        index: usize,
        /// What it holds.
        got: String,
        /// The primitive that wrote it last.
        writer: Option<Loc>,
    },
    /// AllReduce results that would not be bitwise identical across ranks.
    #[error("element {index} is reduced in different orders: rank {rank_a} holds {order_a}, rank {rank_b} holds {order_b}")]
    NotIdentical {
        /// The element.
        index: usize,
        /// One rank.
        rank_a: Rank,
        /// Its value.
        order_a: String,
        /// Another rank.
        rank_b: Rank,
        /// Its value.
        order_b: String,
    },
}
