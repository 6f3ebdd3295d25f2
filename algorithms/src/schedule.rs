//! The schedule vocabulary: what one rank does, step by step, on each channel.
//!
//! A [`Schedule`] is pure data. The engine's executor walks it against real
//! connections; the [`crate::verify`](mod@crate::verify) module walks it symbolically for every
//! rank at once and proves what it computes.

/// The collectives a schedule can describe, with NCCL's buffer semantics.
///
/// `count` in [`CollSpec`] is NCCL's per-call count: for AllGather it is the
/// count each rank contributes, for ReduceScatter the count each rank
/// receives, for AlltoAll / Gather / Scatter the count per peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// send\[count\] on every rank -> recv\[count\] on every rank, reduced.
    AllReduce,
    /// root's send\[count\] -> recv\[count\] on every rank.
    Broadcast,
    /// send\[count\] on every rank -> root's recv\[count\], reduced.
    Reduce,
    /// send\[count\] on rank r -> recv\[r*count..\] on every rank.
    AllGather,
    /// send\[nranks*count\] on every rank -> recv\[count\] on rank r holds the
    /// reduction of every rank's send\[r*count..\].
    ReduceScatter,
    /// send\[j*count..\] on rank i -> recv\[i*count..\] on rank j.
    AllToAll,
    /// send\[count\] on rank r -> root's recv\[r*count..\].
    Gather,
    /// root's send\[r*count..\] -> recv\[count\] on rank r.
    Scatter,
}

impl CollKind {
    /// Every collective, for exhaustive tests.
    pub const ALL: [CollKind; 8] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
    ];

    /// Whether the collective combines values with a reduction operator.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        )
    }

    /// Whether the collective has a root rank.
    pub fn has_root(self) -> bool {
        matches!(
            self,
            CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
        )
    }

    /// NCCL's name for the collective, as printed in logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "AllReduce",
            CollKind::Broadcast => "Broadcast",
            CollKind::Reduce => "Reduce",
            CollKind::AllGather => "AllGather",
            CollKind::ReduceScatter => "ReduceScatter",
            CollKind::AllToAll => "AlltoAll",
            CollKind::Gather => "Gather",
            CollKind::Scatter => "Scatter",
        }
    }

    /// Elements in the send buffer of `rank` for a call with `count`.
    pub fn send_len(self, count: usize, nranks: usize, rank: usize, root: usize) -> usize {
        match self {
            CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Gather => {
                count
            }
            CollKind::Broadcast => {
                if rank == root {
                    count
                } else {
                    0
                }
            }
            CollKind::ReduceScatter | CollKind::AllToAll => count * nranks,
            CollKind::Scatter => {
                if rank == root {
                    count * nranks
                } else {
                    0
                }
            }
        }
    }

    /// Elements in the receive buffer of `rank` for a call with `count`.
    pub fn recv_len(self, count: usize, nranks: usize, rank: usize, root: usize) -> usize {
        match self {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::ReduceScatter => count,
            CollKind::Scatter => count,
            CollKind::Reduce => {
                if rank == root {
                    count
                } else {
                    0
                }
            }
            CollKind::AllGather | CollKind::AllToAll => count * nranks,
            CollKind::Gather => {
                if rank == root {
                    count * nranks
                } else {
                    0
                }
            }
        }
    }

    /// Where the send buffer starts inside the receive buffer (in elements)
    /// when a call is in place, following NCCL's in-place conventions; `None`
    /// when the receive buffer starts inside the send buffer instead (see
    /// [`CollKind::in_place_recv_offset`]) or the collective has no in-place
    /// form.
    pub fn in_place_send_offset(self, count: usize, rank: usize, root: usize) -> Option<usize> {
        match self {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => Some(0),
            CollKind::AllGather => Some(rank * count),
            CollKind::Gather => Some(root * count),
            _ => None,
        }
    }

    /// Where the receive buffer starts inside the send buffer (in elements)
    /// for the in-place forms where the send buffer is the larger one.
    pub fn in_place_recv_offset(self, count: usize, rank: usize, root: usize) -> Option<usize> {
        match self {
            CollKind::ReduceScatter => Some(rank * count),
            CollKind::Scatter => Some(root * count),
            _ => None,
        }
    }
}

/// One call of a collective, as every rank sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CollSpec {
    /// Which collective.
    pub kind: CollKind,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The root rank (ignored by rootless collectives).
    pub root: usize,
    /// NCCL's count for the call (see [`CollKind`]).
    pub count: usize,
}

/// How a schedule is cut: channels run in parallel, each on its own
/// connections; within a channel, work is pipelined in chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Channels to split the work across (at least 1).
    pub nchannels: usize,
    /// Pipeline chunk, in elements: the most one message of a step carries
    /// (at least 1). The transport splits a message further into slots.
    pub chunk_elems: usize,
}

/// Which of the user's buffers a slice refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The user's send buffer.
    Send,
    /// The user's receive buffer.
    Recv,
}

/// A range of elements in one of the user's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slice {
    /// Which buffer.
    pub buf: Buf,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Slice {
    /// A slice of the send buffer.
    pub fn send(offset: usize, len: usize) -> Slice {
        Slice {
            buf: Buf::Send,
            offset,
            len,
        }
    }

    /// A slice of the receive buffer.
    pub fn recv(offset: usize, len: usize) -> Slice {
        Slice {
            buf: Buf::Recv,
            offset,
            len,
        }
    }
}

/// A rank index within the communicator.
pub type Rank = usize;

/// One primitive, in NCCL's device-primitive vocabulary.
///
/// Reading the send buffer of a reducing collective applies the op's input
/// transform (PreMulSum's scalar, Avg's 1/n for floats); the output written
/// by `RecvReduceCopy` and `RecvReduceCopySend` is a final result and gets the
/// op's output transform (Avg's division for integers), as is that of
/// `ReduceCopy`; the `...Partial` forms write partial results (NCCL's
/// `postOp = false`) that more inputs join later. Every message a primitive
/// sends or receives is as long as its slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prim {
    /// send(src)
    Send { to: Rank, src: Slice },
    /// dst = recv()
    Recv { from: Rank, dst: Slice },
    /// dst = src (a no-op when both name the same memory)
    Copy { src: Slice, dst: Slice },
    /// dst = src; send(src)
    CopySend { src: Slice, dst: Slice, to: Rank },
    /// send(recv() op src)
    RecvReduceSend { from: Rank, src: Slice, to: Rank },
    /// dst = recv() op src
    RecvReduceCopy { from: Rank, src: Slice, dst: Slice },
    /// dst = recv() op src; send(dst)
    RecvReduceCopySend {
        from: Rank,
        src: Slice,
        dst: Slice,
        to: Rank,
    },
    /// dst = recv(); send(dst)
    RecvCopySend { from: Rank, dst: Slice, to: Rank },
    /// dst = recv() op src, a partial result: NCCL's `recvReduceCopy`
    /// without its `postOp` (no output transform), for accumulating into the
    /// receive buffer before more inputs join.
    RecvReduceCopyPartial { from: Rank, src: Slice, dst: Slice },
    /// dst = src op dst, a final result (output transform applied): a local
    /// reduction, NCCL's `reduceCopy` of two sources into one of them.
    ReduceCopy { src: Slice, dst: Slice },
    /// dst = src op dst, a partial result (no output transform).
    ReduceCopyPartial { src: Slice, dst: Slice },
}

impl Prim {
    /// Elements moved by the primitive (the length of each of its slices).
    pub fn len(&self) -> usize {
        match *self {
            Prim::Send { src, .. } => src.len,
            Prim::Recv { dst, .. } => dst.len,
            Prim::Copy { src, .. } => src.len,
            Prim::CopySend { src, .. } => src.len,
            Prim::RecvReduceSend { src, .. } => src.len,
            Prim::RecvReduceCopy { src, .. } => src.len,
            Prim::RecvReduceCopySend { src, .. } => src.len,
            Prim::RecvCopySend { dst, .. } => dst.len,
            Prim::RecvReduceCopyPartial { src, .. } => src.len,
            Prim::ReduceCopy { src, .. } | Prim::ReduceCopyPartial { src, .. } => src.len,
        }
    }

    /// Whether the primitive moves no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The peer this primitive receives from, if any.
    pub fn recv_peer(&self) -> Option<Rank> {
        match *self {
            Prim::Recv { from, .. }
            | Prim::RecvReduceSend { from, .. }
            | Prim::RecvReduceCopy { from, .. }
            | Prim::RecvReduceCopySend { from, .. }
            | Prim::RecvCopySend { from, .. }
            | Prim::RecvReduceCopyPartial { from, .. } => Some(from),
            Prim::Send { .. }
            | Prim::Copy { .. }
            | Prim::CopySend { .. }
            | Prim::ReduceCopy { .. }
            | Prim::ReduceCopyPartial { .. } => None,
        }
    }

    /// The peer this primitive sends to, if any.
    pub fn send_peer(&self) -> Option<Rank> {
        match *self {
            Prim::Send { to, .. }
            | Prim::CopySend { to, .. }
            | Prim::RecvReduceSend { to, .. }
            | Prim::RecvReduceCopySend { to, .. }
            | Prim::RecvCopySend { to, .. } => Some(to),
            Prim::Recv { .. }
            | Prim::Copy { .. }
            | Prim::RecvReduceCopy { .. }
            | Prim::RecvReduceCopyPartial { .. }
            | Prim::ReduceCopy { .. }
            | Prim::ReduceCopyPartial { .. } => None,
        }
    }

    /// The slice of the local buffers the primitive reads (its source) and
    /// the one it writes (its destination), where it has them: a send
    /// only reads, a receive only writes.
    pub fn slices(&self) -> (Option<Slice>, Option<Slice>) {
        match *self {
            Prim::Send { src, .. } | Prim::RecvReduceSend { src, .. } => (Some(src), None),
            Prim::Recv { dst, .. } | Prim::RecvCopySend { dst, .. } => (None, Some(dst)),
            Prim::Copy { src, dst }
            | Prim::CopySend { src, dst, .. }
            | Prim::RecvReduceCopy { src, dst, .. }
            | Prim::RecvReduceCopySend { src, dst, .. }
            | Prim::RecvReduceCopyPartial { src, dst, .. }
            | Prim::ReduceCopy { src, dst }
            | Prim::ReduceCopyPartial { src, dst } => (Some(src), Some(dst)),
        }
    }

    /// [`Prim::slices`], to change in place.
    pub fn slices_mut(&mut self) -> (Option<&mut Slice>, Option<&mut Slice>) {
        match self {
            Prim::Send { src, .. } | Prim::RecvReduceSend { src, .. } => (Some(src), None),
            Prim::Recv { dst, .. } | Prim::RecvCopySend { dst, .. } => (None, Some(dst)),
            Prim::Copy { src, dst }
            | Prim::CopySend { src, dst, .. }
            | Prim::RecvReduceCopy { src, dst, .. }
            | Prim::RecvReduceCopySend { src, dst, .. }
            | Prim::RecvReduceCopyPartial { src, dst, .. }
            | Prim::ReduceCopy { src, dst }
            | Prim::ReduceCopyPartial { src, dst } => (Some(src), Some(dst)),
        }
    }

    /// NCCL's name for the primitive.
    pub fn name(&self) -> &'static str {
        match self {
            Prim::Send { .. } => "send",
            Prim::Recv { .. } => "recv",
            Prim::Copy { .. } => "copy",
            Prim::CopySend { .. } => "copySend",
            Prim::RecvReduceSend { .. } => "recvReduceSend",
            Prim::RecvReduceCopy { .. } => "recvReduceCopy",
            Prim::RecvReduceCopySend { .. } => "recvReduceCopySend",
            Prim::RecvCopySend { .. } => "recvCopySend",
            Prim::RecvReduceCopyPartial { .. } => "recvReduceCopyPartial",
            Prim::ReduceCopy { .. } => "reduceCopy",
            Prim::ReduceCopyPartial { .. } => "reduceCopyPartial",
        }
    }
}

/// A set of primitives that progress concurrently. Steps of a channel run in
/// order; primitives of one step interleave, except that primitives sharing
/// a send peer (or a receive peer) move their messages in the order listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The primitives of the step.
    pub prims: Vec<Prim>,
}

impl Step {
    /// A step of one primitive.
    pub fn one(prim: Prim) -> Step {
        Step { prims: vec![prim] }
    }
}

/// What one rank does for one collective call: a list of steps per channel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// `channels[c]` is the ordered step list of channel `c`.
    pub channels: Vec<Vec<Step>>,
}

impl Schedule {
    /// An empty schedule over `nchannels` channels.
    pub fn new(nchannels: usize) -> Schedule {
        Schedule {
            channels: vec![Vec::new(); nchannels],
        }
    }

    /// Every peer this schedule sends to or receives from, on any channel.
    pub fn peers(&self) -> Vec<Rank> {
        let mut peers: Vec<Rank> = self
            .channels
            .iter()
            .flatten()
            .flat_map(|step| step.prims.iter())
            .flat_map(|p| p.send_peer().into_iter().chain(p.recv_peer()))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }
}

/// Split `count` elements into `parts` contiguous ranges as evenly as
/// possible (the first `count % parts` ranges are one longer).
pub fn split_even(count: usize, parts: usize) -> impl Iterator<Item = (usize, usize)> {
    let base = count / parts;
    let extra = count % parts;
    (0..parts).map(move |i| {
        let offset = i * base + i.min(extra);
        let len = base + usize::from(i < extra);
        (offset, len)
    })
}
