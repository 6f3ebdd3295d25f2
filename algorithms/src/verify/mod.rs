//! The symbolic executor: runs every rank's schedule together and proves
//! what it computes.
//!
//! # Model
//!
//! * **Memory.** Each rank has its send and receive buffers (lengths from
//!   [`CollKind::send_len`] / [`CollKind::recv_len`]). In place, the smaller
//!   buffer lives inside the larger one at
//!   [`CollKind::in_place_send_offset`] / [`CollKind::in_place_recv_offset`],
//!   so a write through one is seen through the other. (A rank whose smaller
//!   buffer does not fit in the larger one, such as a non-root rank of an
//!   in-place Reduce, and the collectives without an in-place form, such as
//!   AlltoAll, keep separate buffers.) Element `i` of rank `r`'s send buffer
//!   starts as the symbolic input [`Term`] `(r, i)`; the receive buffer
//!   starts uninitialized.
//! * **Values.** A value is the ordered list of the inputs reduced into it,
//!   in accumulation order (`acc op input` appends), plus a `finished` flag
//!   set by `recvReduceCopy` / `recvReduceCopySend`, whose output is a final
//!   result. Reducing a finished value again is an error, as is reading the
//!   send buffer of a reducing collective (which applies the op's input
//!   transform) after it was overwritten.
//! * **Connections.** Every `(channel, from, to)` pair is a FIFO of
//!   `fifo_elems` elements; each queued element is tagged with the message
//!   it belongs to. A receiving primitive consumes exactly one whole message
//!   of exactly its own length.
//! * **Progress.** Execution is element-granular. A primitive has an
//!   element side, which receives, reduces and writes its elements one at a
//!   time and in order (receiving element `j` needs it at the head of the
//!   incoming FIFO), and a send side, which sends element `j` once the
//!   element side has produced it and the outgoing FIFO has room (fewer
//!   than `fifo_elems` queued). So a forwarding primitive never sends
//!   element `j` before receiving it, and holds at most its own message.
//!   The primitives of a step interleave freely, except that primitives
//!   sharing a send peer (or a receive peer) move their messages in listed
//!   order. A step ends when all its primitives are done; the steps of a
//!   channel run in order; channels run independently.
//! * **Races.** Because the primitives of a step and the channels of a rank
//!   run concurrently, they must not touch the same memory unless all of
//!   them only read it; the executor checks this before running, so that its
//!   results do not depend on the order it happens to pick.
//!
//! When no rank can move and some rank has not finished, the schedules
//! deadlock. At the end every FIFO must be empty and every output element
//! must hold exactly the right inputs, each once; reducing collectives (with
//! more than one rank) must have finished every output element, and
//! AllReduce must have reduced every element in the same order on every rank
//! (bitwise-identical results).

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::{Algorithm, Buf, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Topology};

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

/// What a verified set of schedules does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps run, over all ranks and channels.
    pub steps: usize,
    /// The most steps of one channel of one rank (the critical path).
    pub max_steps: usize,
    /// Primitives run.
    pub prims: usize,
    /// Messages sent.
    pub messages: usize,
    /// Elements sent over connections.
    pub elements_sent: usize,
    /// Elements reduced (one per `acc op input`).
    pub elements_reduced: usize,
    /// Elements copied locally by `copy` and `copySend` (no-op copies
    /// excluded).
    pub elements_copied: usize,
}

/// Build every rank's schedule with `alg` on one host and verify them
/// together, with FIFOs of `params.chunk_elems` elements: [`verify_on`] with
/// [`Topology::flat`].
///
/// `in_place` aliases the buffers as NCCL's in-place forms do (see the
/// module documentation); collectives without an in-place form (AlltoAll)
/// are verified with separate buffers either way.
pub fn verify(
    alg: &dyn Algorithm,
    spec: &CollSpec,
    params: &Params,
    in_place: bool,
) -> Result<Stats, VerifyError> {
    verify_on(alg, spec, params, &Topology::flat(spec.nranks), in_place)
}

/// Build every rank's schedule with `alg` for the ranks placed as `topo`
/// says, and verify them together, with FIFOs of `params.chunk_elems`
/// elements.
pub fn verify_on(
    alg: &dyn Algorithm,
    spec: &CollSpec,
    params: &Params,
    topo: &Topology,
    in_place: bool,
) -> Result<Stats, VerifyError> {
    if !alg.supports(spec.kind) {
        return Err(VerifyError::Unsupported {
            alg: alg.name(),
            kind: spec.kind.name(),
        });
    }
    check_call(spec)?;
    if params.nchannels == 0 || params.chunk_elems == 0 {
        return Err(VerifyError::InvalidCall(format!(
            "nchannels ({}) and chunk_elems ({}) must be at least 1",
            params.nchannels, params.chunk_elems
        )));
    }
    if topo.nranks() != spec.nranks {
        return Err(VerifyError::InvalidCall(format!(
            "topology of {} ranks for a call of {}",
            topo.nranks(),
            spec.nranks
        )));
    }
    if !alg.supports_topology(topo) {
        return Err(VerifyError::InvalidCall(format!(
            "{} does not support this placement of ranks on hosts",
            alg.name()
        )));
    }
    if in_place && !alg.supports_in_place(spec.kind) {
        return Err(VerifyError::InPlaceUnsupported {
            alg: alg.name(),
            kind: spec.kind.name(),
        });
    }
    let schedules: Vec<Schedule> = (0..spec.nranks)
        .map(|r| alg.schedule(spec, r, params, topo))
        .collect();
    verify_schedules(spec, &schedules, in_place, params.chunk_elems)
}

fn check_call(spec: &CollSpec) -> Result<(), VerifyError> {
    if spec.nranks == 0 {
        return Err(VerifyError::InvalidCall("no ranks".into()));
    }
    if spec.kind.has_root() && spec.root >= spec.nranks {
        return Err(VerifyError::InvalidCall(format!(
            "root {} out of range ({} ranks)",
            spec.root, spec.nranks
        )));
    }
    let max = spec
        .kind
        .send_len(spec.count, spec.nranks, spec.root, spec.root);
    let max = max.max(
        spec.kind
            .recv_len(spec.count, spec.nranks, spec.root, spec.root),
    );
    if spec.nranks > u32::MAX as usize || max > u32::MAX as usize {
        return Err(VerifyError::InvalidCall("call too large to verify".into()));
    }
    Ok(())
}

/// Verify the schedules of every rank (`schedules[r]` is rank `r`'s) for
/// `spec`, with FIFOs of `fifo_elems` elements per `(channel, from, to)`.
///
/// This is how a user-supplied schedule is checked before it is run.
pub fn verify_schedules(
    spec: &CollSpec,
    schedules: &[Schedule],
    in_place: bool,
    fifo_elems: usize,
) -> Result<Stats, VerifyError> {
    check_call(spec)?;
    if fifo_elems == 0 {
        return Err(VerifyError::InvalidCall("FIFOs of zero elements".into()));
    }
    if schedules.len() != spec.nranks {
        return Err(VerifyError::WrongScheduleCount {
            got: schedules.len(),
            nranks: spec.nranks,
        });
    }
    let mut sim = Sim::new(spec, schedules, in_place, fifo_elems);
    sim.check_static()?;
    sim.run()?;
    sim.check_result()?;
    Ok(sim.stats)
}

// ---------------------------------------------------------------------------
// Values

const NIL: u32 = u32::MAX;

/// Interned reduction orders: a value is a node whose chain of parents lists
/// its inputs in accumulation order. Equal ids mean equal ordered lists.
#[derive(Default)]
struct Chains {
    nodes: Vec<(u32, Term)>,
    index: HashMap<(u32, Term), u32>,
}

impl Chains {
    fn push(&mut self, prev: u32, term: Term) -> u32 {
        let next = self.nodes.len() as u32;
        *self.index.entry((prev, term)).or_insert_with(|| {
            self.nodes.push((prev, term));
            next
        })
    }

    /// The inputs of `id`, in accumulation order.
    fn terms(&self, mut id: u32, out: &mut Vec<Term>) {
        out.clear();
        while id != NIL {
            let (prev, t) = self.nodes[id as usize];
            out.push(t);
            id = prev;
        }
        out.reverse();
    }

    fn show(&self, v: Val) -> String {
        let mut t = Vec::new();
        self.terms(v.chain, &mut t);
        let body = t
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join("+");
        if v.finished {
            format!("final[{body}]")
        } else {
            format!("[{body}]")
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Val {
    chain: u32,
    finished: bool,
}

/// A primitive's place, without the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct At {
    channel: u32,
    step: u32,
    prim: u32,
}

#[derive(Clone, Copy)]
struct Cell {
    /// `NIL` while uninitialized.
    chain: u32,
    finished: bool,
    /// Still the rank's untouched input.
    input: bool,
    writer: Option<At>,
}

/// One rank's memory: both user buffers, aliased when in place.
struct Mem {
    send_base: usize,
    send_len: usize,
    recv_base: usize,
    recv_len: usize,
    cells: Vec<Cell>,
}

impl Mem {
    fn new(spec: &CollSpec, rank: Rank, in_place: bool, chains: &mut Chains) -> Mem {
        let (kind, count, n, root) = (spec.kind, spec.count, spec.nranks, spec.root);
        let send_len = kind.send_len(count, n, rank, root);
        let recv_len = kind.recv_len(count, n, rank, root);
        let send_in_recv = kind
            .in_place_send_offset(count, rank, root)
            .filter(|o| in_place && o + send_len <= recv_len);
        let recv_in_send = kind
            .in_place_recv_offset(count, rank, root)
            .filter(|o| in_place && o + recv_len <= send_len);
        let (send_base, recv_base, total) = match (send_in_recv, recv_in_send) {
            (Some(o), _) => (o, 0, recv_len),
            (None, Some(o)) => (0, o, send_len),
            (None, None) => (0, send_len, send_len + recv_len),
        };
        let uninit = Cell {
            chain: NIL,
            finished: false,
            input: false,
            writer: None,
        };
        let mut cells = vec![uninit; total];
        for i in 0..send_len {
            let term = Term {
                rank: rank as u32,
                index: i as u32,
            };
            cells[send_base + i] = Cell {
                chain: chains.push(NIL, term),
                finished: false,
                input: true,
                writer: None,
            };
        }
        Mem {
            send_base,
            send_len,
            recv_base,
            recv_len,
            cells,
        }
    }

    fn len(&self, buf: Buf) -> usize {
        match buf {
            Buf::Send => self.send_len,
            Buf::Recv => self.recv_len,
        }
    }

    fn addr(&self, s: &Slice, j: usize) -> usize {
        match s.buf {
            Buf::Send => self.send_base + s.offset + j,
            Buf::Recv => self.recv_base + s.offset + j,
        }
    }
}

// ---------------------------------------------------------------------------
// The executor

struct Elem {
    val: Val,
    msg_len: usize,
    step: u32,
    prim: u32,
}

/// Progress of a channel's current step.
///
/// Each primitive has two sides: the element side (receive, compute, write)
/// and the send side, which sends element `j` only once the element side has
/// produced it. Produced elements not yet sent wait in `pending`.
struct Active {
    /// Elements produced (received / read and computed).
    made: Vec<usize>,
    /// Elements sent.
    sent: Vec<usize>,
    /// Produced elements waiting for room in the outgoing FIFO.
    pending: Vec<VecDeque<Val>>,
    /// The previous primitive of the step with the same receive peer.
    prev_recv: Vec<usize>,
    /// The previous primitive of the step with the same send peer.
    prev_send: Vec<usize>,
}

const NONE: usize = usize::MAX;

impl Active {
    fn new(prims: &[Prim]) -> Active {
        let mut last_recv = HashMap::new();
        let mut last_send = HashMap::new();
        let mut prev_recv = Vec::with_capacity(prims.len());
        let mut prev_send = Vec::with_capacity(prims.len());
        for (i, p) in prims.iter().enumerate() {
            prev_recv.push(match p.recv_peer() {
                Some(peer) => last_recv.insert(peer, i).unwrap_or(NONE),
                None => NONE,
            });
            prev_send.push(match p.send_peer() {
                Some(peer) => last_send.insert(peer, i).unwrap_or(NONE),
                None => NONE,
            });
        }
        Active {
            made: vec![0; prims.len()],
            sent: vec![0; prims.len()],
            pending: (0..prims.len()).map(|_| VecDeque::new()).collect(),
            prev_recv,
            prev_send,
        }
    }

    /// Whether primitive `q` (or none) has received / produced everything.
    fn made_all(&self, prims: &[Prim], q: usize) -> bool {
        q == NONE || self.made[q] == prims[q].len()
    }

    /// Whether primitive `q` (or none) has sent everything.
    fn sent_all(&self, prims: &[Prim], q: usize) -> bool {
        q == NONE || prims[q].send_peer().is_none() || self.sent[q] == prims[q].len()
    }

    /// Whether primitive `q` is done.
    fn finished(&self, prims: &[Prim], q: usize) -> bool {
        self.made_all(prims, q) && self.sent_all(prims, q)
    }
}

struct Chan {
    step: usize,
    active: Option<Active>,
}

struct Sim<'a> {
    spec: CollSpec,
    scheds: &'a [Schedule],
    n: usize,
    nch: usize,
    cap: usize,
    mems: Vec<Mem>,
    chains: Chains,
    fifos: Vec<VecDeque<Elem>>,
    chans: Vec<Vec<Chan>>,
    stats: Stats,
    scratch_a: Vec<Term>,
    scratch_b: Vec<Term>,
}

impl<'a> Sim<'a> {
    fn new(spec: &CollSpec, scheds: &'a [Schedule], in_place: bool, cap: usize) -> Sim<'a> {
        let n = spec.nranks;
        let nch = scheds.iter().map(|s| s.channels.len()).max().unwrap_or(0);
        let mut chains = Chains::default();
        let mems = (0..n)
            .map(|r| Mem::new(spec, r, in_place, &mut chains))
            .collect();
        let chans = (0..n)
            .map(|_| {
                (0..nch)
                    .map(|_| Chan {
                        step: 0,
                        active: None,
                    })
                    .collect()
            })
            .collect();
        Sim {
            spec: *spec,
            scheds,
            n,
            nch,
            cap,
            mems,
            chains,
            fifos: (0..nch * n * n).map(|_| VecDeque::new()).collect(),
            chans,
            stats: Stats::default(),
            scratch_a: Vec::new(),
            scratch_b: Vec::new(),
        }
    }

    fn loc(&self, rank: Rank, channel: usize, step: usize, prim: usize) -> Loc {
        let name = self.scheds[rank].channels[channel][step].prims[prim].name();
        Loc {
            rank,
            channel,
            step,
            prim,
            name,
        }
    }

    fn loc_at(&self, rank: Rank, at: At) -> Loc {
        self.loc(
            rank,
            at.channel as usize,
            at.step as usize,
            at.prim as usize,
        )
    }

    fn conn(&self, channel: usize, from: Rank, to: Rank) -> usize {
        (channel * self.n + from) * self.n + to
    }

    /// Checks that need no execution: peers, lengths, bounds and races.
    fn check_static(&self) -> Result<(), VerifyError> {
        let n = self.n;
        for (r, sched) in self.scheds.iter().enumerate() {
            let mem = &self.mems[r];
            let total = mem.cells.len();
            // Per element: the channel that writes it, and the primitive of
            // the current step that writes it.
            let mut chan_writer: Vec<Option<At>> = vec![None; total];
            let mut step_writer: Vec<(usize, u32)> = vec![(NONE, 0); total];
            let mut uid = 0;
            for (c, steps) in sched.channels.iter().enumerate() {
                for (s, step) in steps.iter().enumerate() {
                    uid += 1;
                    for (p, prim) in step.prims.iter().enumerate() {
                        let at = Loc {
                            rank: r,
                            channel: c,
                            step: s,
                            prim: p,
                            name: prim.name(),
                        };
                        for peer in prim.send_peer().into_iter().chain(prim.recv_peer()) {
                            if peer >= n {
                                return Err(VerifyError::PeerOutOfRange {
                                    at,
                                    peer,
                                    nranks: n,
                                });
                            }
                            if peer == r {
                                return Err(VerifyError::SelfPeer { at, peer });
                            }
                        }
                        let (src, dst) = prim.slices();
                        if let (Some(src), Some(dst)) = (src, dst) {
                            if src.len != dst.len {
                                return Err(VerifyError::SliceLengthMismatch {
                                    at,
                                    src: src.len,
                                    dst: dst.len,
                                });
                            }
                        }
                        if prim.is_empty() {
                            return Err(VerifyError::EmptyPrim { at });
                        }
                        for slice in src.iter().chain(dst.iter()) {
                            let buf_len = mem.len(slice.buf);
                            let fits = matches!(
                                slice.offset.checked_add(slice.len),
                                Some(end) if end <= buf_len
                            );
                            if !fits {
                                return Err(VerifyError::OutOfBounds {
                                    at,
                                    slice: *slice,
                                    buf_len,
                                });
                            }
                        }
                        if let (Some(src), Some(dst)) = (src, dst) {
                            let (a, b) = (mem.addr(&src, 0), mem.addr(&dst, 0));
                            if a != b && a < b + dst.len && b < a + src.len {
                                return Err(VerifyError::OverlappingSlices { at, src, dst });
                            }
                        }
                        // Writes first, then reads, against earlier
                        // primitives of the step and other channels.
                        let me = At {
                            channel: c as u32,
                            step: s as u32,
                            prim: p as u32,
                        };
                        for (slice, writes) in dst
                            .iter()
                            .map(|d| (d, true))
                            .chain(src.iter().map(|s| (s, false)))
                        {
                            for j in 0..slice.len {
                                let a = mem.addr(slice, j);
                                let race = |other: At| VerifyError::Race {
                                    at,
                                    other: self.loc_at(r, other),
                                    buf: slice.buf,
                                    index: slice.offset + j,
                                };
                                if let Some(w) = chan_writer[a] {
                                    if w.channel != me.channel {
                                        return Err(race(w));
                                    }
                                }
                                let (u, wp) = step_writer[a];
                                if u == uid && wp != me.prim {
                                    return Err(race(At { prim: wp, ..me }));
                                }
                                if writes {
                                    chan_writer[a] = Some(me);
                                    step_writer[a] = (uid, me.prim);
                                }
                            }
                        }
                    }
                    // Reads of an element written by a later primitive of
                    // the same step.
                    for (p, prim) in step.prims.iter().enumerate() {
                        if let (Some(src), _) = prim.slices() {
                            for j in 0..src.len {
                                let (u, wp) = step_writer[mem.addr(&src, j)];
                                if u == uid && wp as usize > p {
                                    let other = self.loc(r, c, s, wp as usize);
                                    return Err(VerifyError::Race {
                                        at: other,
                                        other: self.loc(r, c, s, p),
                                        buf: src.buf,
                                        index: src.offset + j,
                                    });
                                }
                            }
                        }
                    }
                }
            }
            // Reads by an earlier channel of elements a later channel writes.
            let mut chan_reader: Vec<Option<At>> = vec![None; total];
            for (c, steps) in sched.channels.iter().enumerate() {
                for (s, step) in steps.iter().enumerate() {
                    for (p, prim) in step.prims.iter().enumerate() {
                        if let (Some(src), _) = prim.slices() {
                            for j in 0..src.len {
                                let a = mem.addr(&src, j);
                                if chan_reader[a].is_none() {
                                    chan_reader[a] = Some(At {
                                        channel: c as u32,
                                        step: s as u32,
                                        prim: p as u32,
                                    });
                                }
                            }
                        }
                    }
                }
            }
            for a in 0..total {
                if let (Some(rd), Some(w)) = (chan_reader[a], chan_writer[a]) {
                    if rd.channel != w.channel {
                        let (buf, index) = if a >= mem.recv_base && a < mem.recv_base + mem.recv_len
                        {
                            (Buf::Recv, a - mem.recv_base)
                        } else {
                            (Buf::Send, a - mem.send_base)
                        };
                        return Err(VerifyError::Race {
                            at: self.loc_at(r, w),
                            other: self.loc_at(r, rd),
                            buf,
                            index,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), VerifyError> {
        loop {
            let mut progressed = false;
            for r in 0..self.n {
                for c in 0..self.nch {
                    progressed |= self.advance(r, c)?;
                }
            }
            if !progressed {
                break;
            }
        }
        let mut stuck = Vec::new();
        for r in 0..self.n {
            for c in 0..self.nch {
                if let Some(s) = self.stuck(r, c) {
                    stuck.push(s);
                }
            }
        }
        if !stuck.is_empty() {
            return Err(VerifyError::Deadlock { stuck });
        }
        for c in 0..self.nch {
            for from in 0..self.n {
                for to in 0..self.n {
                    let q = &self.fifos[self.conn(c, from, to)];
                    if let Some(e) = q.front() {
                        return Err(VerifyError::LeftoverMessages {
                            channel: c,
                            from,
                            to,
                            elements: q.len(),
                            sender: self.loc(from, c, e.step as usize, e.prim as usize),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Why channel `c` of rank `r` cannot finish, if it has not.
    fn stuck(&self, r: Rank, c: usize) -> Option<Stuck> {
        let steps = self.scheds[r].channels.get(c)?;
        let st = &self.chans[r][c];
        let step = steps.get(st.step)?;
        let active = st.active.as_ref()?;
        let prims = &step.prims;
        for (p, prim) in prims.iter().enumerate() {
            if let Some(from) = prim.recv_peer() {
                if !active.made_all(prims, p)
                    && active.made_all(prims, active.prev_recv[p])
                    && self.fifos[self.conn(c, from, r)].is_empty()
                {
                    return Some(Stuck {
                        at: self.loc(r, c, st.step, p),
                        waits: Wait::RecvFrom(from),
                    });
                }
            }
            if let Some(to) = prim.send_peer() {
                if !active.pending[p].is_empty()
                    && active.sent_all(prims, active.prev_send[p])
                    && self.fifos[self.conn(c, r, to)].len() >= self.cap
                {
                    return Some(Stuck {
                        at: self.loc(r, c, st.step, p),
                        waits: Wait::SendTo(to),
                    });
                }
            }
        }
        None
    }

    /// Move channel `c` of rank `r` as far as it goes; whether it moved.
    fn advance(&mut self, r: Rank, c: usize) -> Result<bool, VerifyError> {
        let scheds = self.scheds;
        let Some(steps) = scheds[r].channels.get(c) else {
            return Ok(false);
        };
        let mut any = false;
        loop {
            let s = self.chans[r][c].step;
            let Some(step) = steps.get(s) else {
                return Ok(any);
            };
            let mut active = self.chans[r][c]
                .active
                .take()
                .unwrap_or_else(|| Active::new(&step.prims));
            let mut moved = false;
            for p in 0..step.prims.len() {
                moved |= self.move_prim(r, c, s, p, &step.prims, &mut active)?;
            }
            if (0..step.prims.len()).all(|p| active.finished(&step.prims, p)) {
                let chan = &mut self.chans[r][c];
                chan.step += 1;
                self.stats.steps += 1;
                self.stats.prims += step.prims.len();
                self.stats.max_steps = self.stats.max_steps.max(chan.step);
                any = true;
                continue;
            }
            self.chans[r][c].active = Some(active);
            any |= moved;
            if !moved {
                return Ok(any);
            }
        }
    }

    /// Move primitive `p` as far as it goes; whether it moved.
    fn move_prim(
        &mut self,
        r: Rank,
        c: usize,
        s: usize,
        p: usize,
        prims: &[Prim],
        active: &mut Active,
    ) -> Result<bool, VerifyError> {
        let prim = &prims[p];
        let len = prim.len();
        let mut moved = false;
        let name = prim.name();
        let at = move || Loc {
            rank: r,
            channel: c,
            step: s,
            prim: p,
            name,
        };

        // The element side: receive, compute, write.
        if active.made[p] < len && active.made_all(prims, active.prev_recv[p]) {
            let me = At {
                channel: c as u32,
                step: s as u32,
                prim: p as u32,
            };
            let reduces = self.spec.kind.reduces();
            let inq = prim.recv_peer().map(|f| self.conn(c, f, r));
            let start = active.made[p];
            let mut j = start;
            while j < len {
                let mut incoming = None;
                if let Some(i) = inq {
                    let Some(head) = self.fifos[i].front() else {
                        break;
                    };
                    if j == 0 && head.msg_len != len {
                        let from = prim.recv_peer().unwrap_or(NONE);
                        return Err(VerifyError::MessageLengthMismatch {
                            at: at(),
                            from,
                            expected: len,
                            got: head.msg_len,
                            sender: self.loc(from, c, head.step as usize, head.prim as usize),
                        });
                    }
                    incoming = self.fifos[i].pop_front().map(|e| e.val);
                }
                let out = self.produce(r, prim, j, incoming, reduces, me, at)?;
                if let Some(v) = out {
                    active.pending[p].push_back(v);
                }
                j += 1;
            }
            active.made[p] = j;
            moved |= j > start;
        }

        // The send side: element j leaves once it is produced.
        if let Some(to) = prim.send_peer() {
            if active.sent_all(prims, active.prev_send[p]) {
                let o = self.conn(c, r, to);
                while self.fifos[o].len() < self.cap {
                    let Some(val) = active.pending[p].pop_front() else {
                        break;
                    };
                    if active.sent[p] == 0 {
                        self.stats.messages += 1;
                    }
                    self.stats.elements_sent += 1;
                    self.fifos[o].push_back(Elem {
                        val,
                        msg_len: len,
                        step: s as u32,
                        prim: p as u32,
                    });
                    active.sent[p] += 1;
                    moved = true;
                }
            }
        }
        Ok(moved)
    }

    /// Element `j` of `prim`: read, reduce, write; what it sends, if it
    /// sends.
    #[allow(clippy::too_many_arguments)]
    fn produce(
        &mut self,
        r: Rank,
        prim: &Prim,
        j: usize,
        incoming: Option<Val>,
        reduces: bool,
        me: At,
        at: impl Fn() -> Loc + Copy,
    ) -> Result<Option<Val>, VerifyError> {
        let received = || incoming.expect("receiving primitive with a message");
        Ok(match *prim {
            Prim::Send { src, .. } => Some(self.read(r, &src, j, reduces, at)?),
            Prim::Recv { dst, .. } => {
                self.write(r, &dst, j, received(), me);
                None
            }
            Prim::Copy { src, dst } => {
                let v = self.read(r, &src, j, reduces, at)?;
                self.copy(r, &src, &dst, j, v, me);
                None
            }
            Prim::CopySend { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                self.copy(r, &src, &dst, j, v, me);
                Some(v)
            }
            Prim::RecvReduceSend { src, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                Some(self.reduce(received(), v, j, at)?)
            }
            Prim::RecvReduceCopy { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                let mut v = self.reduce(received(), v, j, at)?;
                v.finished = true;
                self.write(r, &dst, j, v, me);
                None
            }
            Prim::RecvReduceCopySend { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                let mut v = self.reduce(received(), v, j, at)?;
                v.finished = true;
                self.write(r, &dst, j, v, me);
                Some(v)
            }
            Prim::RecvCopySend { dst, .. } => {
                let v = received();
                self.write(r, &dst, j, v, me);
                Some(v)
            }
            Prim::RecvReduceCopyPartial { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                let v = self.reduce(received(), v, j, at)?;
                self.write(r, &dst, j, v, me);
                None
            }
            Prim::ReduceCopy { src, dst } | Prim::ReduceCopyPartial { src, dst } => {
                let a = self.read(r, &src, j, reduces, at)?;
                let b = self.read(r, &dst, j, reduces, at)?;
                let mut v = self.reduce(a, b, j, at)?;
                v.finished = matches!(prim, Prim::ReduceCopy { .. });
                self.write(r, &dst, j, v, me);
                None
            }
        })
    }

    fn read(
        &self,
        r: Rank,
        src: &Slice,
        j: usize,
        reduces: bool,
        at: impl Fn() -> Loc,
    ) -> Result<Val, VerifyError> {
        let mem = &self.mems[r];
        let cell = mem.cells[mem.addr(src, j)];
        if cell.chain == NIL {
            return Err(VerifyError::Uninitialized {
                at: at(),
                buf: src.buf,
                index: src.offset + j,
            });
        }
        if reduces && src.buf == Buf::Send && !cell.input {
            return Err(VerifyError::InputOverwritten {
                at: at(),
                index: src.offset + j,
                writer: cell.writer.map(|w| self.loc_at(r, w)),
            });
        }
        if reduces && src.buf == Buf::Recv && cell.input {
            return Err(VerifyError::UntransformedInput {
                at: at(),
                index: src.offset + j,
            });
        }
        Ok(Val {
            chain: cell.chain,
            finished: cell.finished,
        })
    }

    fn write(&mut self, r: Rank, dst: &Slice, j: usize, v: Val, me: At) {
        let mem = &mut self.mems[r];
        let a = mem.addr(dst, j);
        mem.cells[a] = Cell {
            chain: v.chain,
            finished: v.finished,
            input: false,
            writer: Some(me),
        };
    }

    /// `dst = src`: a no-op when both name the same memory.
    fn copy(&mut self, r: Rank, src: &Slice, dst: &Slice, j: usize, v: Val, me: At) {
        let mem = &self.mems[r];
        if mem.addr(src, j) != mem.addr(dst, j) {
            self.stats.elements_copied += 1;
            self.write(r, dst, j, v, me);
        }
    }

    /// `acc op input`.
    fn reduce(
        &mut self,
        acc: Val,
        input: Val,
        j: usize,
        at: impl Fn() -> Loc,
    ) -> Result<Val, VerifyError> {
        for v in [acc, input] {
            if v.finished {
                return Err(VerifyError::DoubleReduction {
                    at: at(),
                    index: j,
                    value: self.chains.show(v),
                });
            }
        }
        let (mut a, mut b) = (
            std::mem::take(&mut self.scratch_a),
            std::mem::take(&mut self.scratch_b),
        );
        self.chains.terms(acc.chain, &mut a);
        self.chains.terms(input.chain, &mut b);
        let elem = a[0].index;
        let mut chain = acc.chain;
        let mut result = Ok(());
        for (k, &t) in b.iter().enumerate() {
            if t.index != elem {
                result = Err(VerifyError::MixedElements {
                    at: at(),
                    index: j,
                    value: self.chains.show(acc),
                    other: self.chains.show(input),
                });
                break;
            }
            if a.contains(&t) || b[..k].contains(&t) {
                result = Err(VerifyError::DuplicateInput {
                    at: at(),
                    index: j,
                    term: t,
                    value: self.chains.show(acc),
                });
                break;
            }
            chain = self.chains.push(chain, t);
        }
        self.scratch_a = a;
        self.scratch_b = b;
        result?;
        self.stats.elements_reduced += 1;
        Ok(Val {
            chain,
            finished: false,
        })
    }

    /// The inputs each output element must hold, sorted.
    fn expected(&self, rank: Rank, index: usize, out: &mut Vec<Term>) {
        let CollSpec {
            kind,
            nranks,
            root,
            count,
        } = self.spec;
        let t = |r: usize, i: usize| Term {
            rank: r as u32,
            index: i as u32,
        };
        out.clear();
        match kind {
            CollKind::AllReduce | CollKind::Reduce => out.extend((0..nranks).map(|q| t(q, index))),
            CollKind::ReduceScatter => out.extend((0..nranks).map(|q| t(q, rank * count + index))),
            CollKind::Broadcast => out.push(t(root, index)),
            CollKind::AllGather | CollKind::Gather => out.push(t(index / count, index % count)),
            CollKind::AllToAll => out.push(t(index / count, rank * count + index % count)),
            CollKind::Scatter => out.push(t(root, rank * count + index)),
        }
    }

    fn check_result(&self) -> Result<(), VerifyError> {
        let reduces = self.spec.kind.reduces();
        let mut expected = Vec::new();
        let mut got = Vec::new();
        let mut first: Option<VerifyError> = None;
        let mut wrong = 0;
        for (r, mem) in self.mems.iter().enumerate() {
            for i in 0..mem.recv_len {
                let cell = mem.cells[mem.recv_base + i];
                self.expected(r, i, &mut expected);
                let writer = cell.writer.map(|w| self.loc_at(r, w));
                let val = Val {
                    chain: cell.chain,
                    finished: cell.finished,
                };
                let ok = cell.chain != NIL && {
                    self.chains.terms(cell.chain, &mut got);
                    got.sort_unstable();
                    got == expected
                };
                if !ok {
                    wrong += 1;
                    if first.is_none() {
                        let show = |t: &[Term]| {
                            let body: Vec<String> = t.iter().map(|t| t.to_string()).collect();
                            format!("{{{}}}", body.join(","))
                        };
                        first = Some(VerifyError::WrongValue {
                            rank: r,
                            index: i,
                            expected: show(&expected),
                            got: if cell.chain == NIL {
                                "uninitialized memory".to_string()
                            } else {
                                self.chains.show(val)
                            },
                            writer,
                            wrong: 0,
                        });
                    }
                } else if reduces && self.n > 1 && !cell.finished && first.is_none() {
                    first = Some(VerifyError::NotFinished {
                        rank: r,
                        index: i,
                        got: self.chains.show(val),
                        writer,
                    });
                }
            }
        }
        match first {
            Some(VerifyError::WrongValue {
                rank,
                index,
                expected,
                got,
                writer,
                ..
            }) => {
                return Err(VerifyError::WrongValue {
                    rank,
                    index,
                    expected,
                    got,
                    writer,
                    wrong,
                })
            }
            Some(e) => return Err(e),
            None => {}
        }
        if self.spec.kind == CollKind::AllReduce {
            let base = &self.mems[0];
            for (r, mem) in self.mems.iter().enumerate().skip(1) {
                for i in 0..mem.recv_len {
                    let a = base.cells[base.recv_base + i];
                    let b = mem.cells[mem.recv_base + i];
                    if a.chain != b.chain {
                        let show = |c: Cell| {
                            self.chains.show(Val {
                                chain: c.chain,
                                finished: c.finished,
                            })
                        };
                        return Err(VerifyError::NotIdentical {
                            index: i,
                            rank_a: 0,
                            order_a: show(a),
                            rank_b: r,
                            order_b: show(b),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}
