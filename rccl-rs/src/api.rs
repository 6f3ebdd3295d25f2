//! The safe, typed Rust API: collectives over slices of plain numeric
//! types, and groups that batch them.

use std::marker::PhantomData;

use rccl_algorithms::CollKind;

use crate::comm::Communicator;
use crate::device_executor::{stream_for, Buffer, CallName};
use crate::error::{Error, Result};
use crate::group as enqueue;
use crate::op::RawOp;
use crate::queue::StreamRef;
use crate::types::OpKind;
use crate::types::{DataType, RedOp};

/// An element type the library can move and reduce.
pub trait Element: bytemuck::Pod {
    /// Its datatype.
    const DATATYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DATATYPE: DataType = DataType::$d; })*
    };
}

element!(
    i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64,
    half::f16 => Float16, f32 => Float32, f64 => Float64, half::bf16 => Bfloat16,
    F8E4M3 => Float8e4m3, F8E5M2 => Float8e5m2,
);

/// An 8-bit float with 4 exponent and 3 mantissa bits (`ncclFloat8e4m3`),
/// as its raw bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// An 8-bit float with 5 exponent and 2 mantissa bits (`ncclFloat8e5m2`),
/// as its raw bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

/// One collective call's shape: what NCCL's collective entry points take
/// besides the buffers and the communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollCall {
    /// Which collective.
    pub kind: CollKind,
    /// NCCL's count for the call (see [`CollKind`]).
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
    /// The reduction (ignored by collectives that do not reduce).
    pub op: RedOp,
    /// The root rank (ignored by rootless collectives).
    pub root: usize,
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::InvalidArgument(format!(
            "{what} holds {got} elements where {want} are needed"
        )));
    }
    Ok(())
}

fn check_root(kind: CollKind, root: usize, nranks: usize) -> Result<()> {
    if kind.has_root() && root >= nranks {
        return Err(Error::InvalidArgument(format!(
            "{}: root {root} is out of range for {nranks} ranks",
            kind.name()
        )));
    }
    Ok(())
}

fn per_rank(what: &str, len: usize, nranks: usize) -> Result<usize> {
    if !len.is_multiple_of(nranks) {
        return Err(Error::InvalidArgument(format!(
            "{what} holds {len} elements, not a multiple of the {nranks} ranks"
        )));
    }
    Ok(len / nranks)
}

impl Communicator {
    /// [`stream_for`] of a call of this communicator. A device that cannot
    /// tell where the buffers are (its context failed) fails the
    /// communicator, as a launch that fails on its way to the device does:
    /// the peers would wait for this rank's part.
    fn stream_for(
        &self,
        call: CallName<'_>,
        buffers: [Buffer<'_>; 2],
        stream: Option<usize>,
    ) -> Result<Option<StreamRef>> {
        stream_for(call, buffers, stream).inspect_err(|err| {
            if matches!(err, Error::System(_)) {
                self.inner.poison(err);
            }
        })
    }

    /// Builds a validated raw collective (the checks every entry point
    /// shares, typed or C). `stream`: the raw `cudaStream_t` of a call
    /// that may take device memory, `None` for host memory only.
    ///
    /// # Safety
    /// `send` and `recv` must be valid for the lengths the collective
    /// implies for this rank (see [`CollKind::send_len`]) until the
    /// operation completes.
    pub(crate) unsafe fn raw_collective(
        &self,
        call: CollCall,
        send: *const u8,
        recv: *mut u8,
        stream: Option<usize>,
    ) -> Result<RawOp> {
        let CollCall {
            kind,
            count,
            dtype,
            op,
            root,
        } = call;
        let (rank, nranks) = (self.rank(), self.count());
        check_root(kind, root, nranks)?;
        let send_len = kind.send_len(count, nranks, rank, root);
        let recv_len = kind.recv_len(count, nranks, rank, root);
        let bytes = |len: usize| {
            len.checked_mul(dtype.size())
                .filter(|&b| b <= isize::MAX as usize)
        };
        if bytes(send_len).is_none() || bytes(recv_len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{}: count {count} of {} overflows the address space",
                kind.name(),
                dtype.name()
            )));
        }
        if send_len > 0 && send.is_null() {
            return Err(Error::InvalidArgument(format!(
                "{}: sendbuff is NULL",
                kind.name()
            )));
        }
        if recv_len > 0 && recv.is_null() {
            return Err(Error::InvalidArgument(format!(
                "{}: recvbuff is NULL",
                kind.name()
            )));
        }
        let (send_bytes, recv_bytes) = (send_len * dtype.size(), recv_len * dtype.size());
        let stream = self.stream_for(
            (kind.name(), count),
            [
                ("sendbuff", send, send_bytes),
                ("recvbuff", recv, recv_bytes),
            ],
            stream,
        )?;
        Ok(RawOp {
            comm: self.inner.clone(),
            kind: OpKind::Coll { kind, root, op },
            send,
            recv,
            count,
            dtype,
            stream,
            api_event: Default::default(),
        })
    }

    /// Builds a validated raw send or receive (`stream` as for
    /// [`Communicator::raw_collective`]).
    pub(crate) fn raw_p2p(
        &self,
        sending: bool,
        buf: *mut u8,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: Option<usize>,
    ) -> Result<RawOp> {
        let what = if sending { "Send" } else { "Recv" };
        if peer >= self.count() {
            return Err(Error::InvalidArgument(format!(
                "{what}: peer {peer} is out of range for {} ranks",
                self.count()
            )));
        }
        if count
            .checked_mul(dtype.size())
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(Error::InvalidArgument(format!(
                "{what}: count {count} overflows"
            )));
        }
        if count > 0 && buf.is_null() {
            return Err(Error::InvalidArgument(format!("{what}: buffer is NULL")));
        }
        let name = if sending { "sendbuff" } else { "recvbuff" };
        let bytes = count * dtype.size();
        let stream = self.stream_for((what, count), [(name, buf, bytes), ("", buf, 0)], stream)?;
        Ok(RawOp {
            comm: self.inner.clone(),
            kind: if sending {
                OpKind::Send { peer }
            } else {
                OpKind::Recv { peer }
            },
            send: buf,
            recv: buf,
            count,
            dtype,
            stream,
            api_event: Default::default(),
        })
    }

    /// Runs (or, inside a group, queues) a collective on raw host
    /// buffers; device memory is refused (see
    /// [`Communicator::collective_raw_on_stream`]).
    ///
    /// # Safety
    /// The buffers must be valid host memory for the lengths the collective
    /// implies for this rank, until the operation completes (on return, or
    /// at the end of the enclosing group).
    pub unsafe fn collective_raw(
        &self,
        call: CollCall,
        send: *const u8,
        recv: *mut u8,
    ) -> Result<()> {
        // SAFETY: the caller's contract covers the buffers.
        let raw = unsafe { self.raw_collective(call, send, recv, None) };
        submit(raw)
    }

    /// A collective on raw buffers, as the C ABI runs it: on host memory
    /// as [`Communicator::collective_raw`]; on device memory enqueued on
    /// `stream` (a raw `cudaStream_t` of the active device, 0 for its
    /// default stream), returning at once (inside a group: at the
    /// outermost end). Its failures then surface through
    /// [`Communicator::async_error`] and the next call.
    ///
    /// # Safety
    /// The buffers must be valid for the lengths the collective implies
    /// for this rank until the operation completes: on host memory when
    /// it returns (or at the end of the group), on device memory once the
    /// stream has run it.
    pub unsafe fn collective_raw_on_stream(
        &self,
        call: CollCall,
        send: *const u8,
        recv: *mut u8,
        stream: usize,
    ) -> Result<()> {
        // SAFETY: the caller's contract covers the buffers.
        let raw = unsafe { self.raw_collective(call, send, recv, Some(stream)) };
        submit(raw)
    }

    /// Sends (or queues a send of) `count` elements of host memory at
    /// `buf` to `peer`.
    ///
    /// # Safety
    /// `buf` must be valid for `count` elements until the send completes.
    pub unsafe fn send_raw(
        &self,
        buf: *const u8,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        submit(self.raw_p2p(true, buf as *mut u8, count, dtype, peer, None))
    }

    /// As [`Communicator::send_raw`], on host or device memory (`stream`
    /// as for [`Communicator::collective_raw_on_stream`]).
    ///
    /// # Safety
    /// `buf` must be valid for `count` elements until the send completes.
    pub unsafe fn send_raw_on_stream(
        &self,
        buf: *const u8,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: usize,
    ) -> Result<()> {
        submit(self.raw_p2p(true, buf as *mut u8, count, dtype, peer, Some(stream)))
    }

    /// Receives (or queues a receive of) `count` elements from `peer` into
    /// host memory.
    ///
    /// # Safety
    /// `buf` must be valid and writable for `count` elements until the
    /// receive completes.
    pub unsafe fn recv_raw(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        submit(self.raw_p2p(false, buf, count, dtype, peer, None))
    }

    /// As [`Communicator::recv_raw`], on host or device memory (`stream`
    /// as for [`Communicator::collective_raw_on_stream`]).
    ///
    /// # Safety
    /// `buf` must be valid and writable for `count` elements until the
    /// receive completes.
    pub unsafe fn recv_raw_on_stream(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: usize,
    ) -> Result<()> {
        submit(self.raw_p2p(false, buf, count, dtype, peer, Some(stream)))
    }

    fn typed<T: Element>(
        &self,
        kind: CollKind,
        send: &[T],
        recv: &mut [T],
        count: usize,
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        let (rank, n) = (self.rank(), self.count());
        check_root(kind, root, n)?;
        check_len(
            "the send buffer",
            send.len(),
            kind.send_len(count, n, rank, root),
        )?;
        check_len(
            "the receive buffer",
            recv.len(),
            kind.recv_len(count, n, rank, root),
        )?;
        let call = CollCall {
            kind,
            count,
            dtype: T::DATATYPE,
            op,
            root,
        };
        // SAFETY: the slices are valid for the checked lengths and borrowed
        // until this call returns, which is when the operation completes
        // (a typed call inside a C-style group would escape the borrow, so
        // it is refused).
        unsafe { self.typed_raw(call, send.as_ptr().cast(), recv.as_mut_ptr().cast()) }
    }

    /// In-place form: `buf` is both buffers, offset as NCCL's in-place
    /// convention for `kind` says.
    fn typed_in_place<T: Element>(
        &self,
        kind: CollKind,
        buf: &mut [T],
        count: usize,
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        let (rank, n) = (self.rank(), self.count());
        check_root(kind, root, n)?;
        let send_len = kind.send_len(count, n, rank, root);
        let recv_len = kind.recv_len(count, n, rank, root);
        check_len("the buffer", buf.len(), send_len.max(recv_len))?;
        let base = buf.as_mut_ptr();
        let (send, recv) = match (
            kind.in_place_send_offset(count, rank, root),
            kind.in_place_recv_offset(count, rank, root),
        ) {
            // A rank with only one of the two buffers (a non-root of gather,
            // scatter, broadcast or reduce) has nothing to alias.
            _ if send_len == 0 || recv_len == 0 => (base as *const T, base),
            (Some(offset), _) => (base.wrapping_add(offset) as *const T, base),
            (None, Some(offset)) => (base as *const T, base.wrapping_add(offset)),
            (None, None) => {
                return Err(Error::InvalidUsage(format!(
                    "{} has no in-place form",
                    kind.name()
                )))
            }
        };
        let call = CollCall {
            kind,
            count,
            dtype: T::DATATYPE,
            op,
            root,
        };
        // SAFETY: both pointers lie inside `buf`, which covers the larger of
        // the two lengths, and stays borrowed until the call returns.
        unsafe { self.typed_raw(call, send.cast(), recv.cast()) }
    }

    unsafe fn typed_raw(&self, call: CollCall, send: *const u8, recv: *mut u8) -> Result<()> {
        if enqueue::group_depth() > 0 {
            return Err(Error::InvalidUsage(
                "typed calls borrow their slices only for the call: inside a group use rccl::Group"
                    .into(),
            ));
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.collective_raw(call, send, recv) }
    }

    /// recv = op over every rank's send (`ncclAllReduce`).
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        self.typed(CollKind::AllReduce, send, recv, send.len(), op, 0)
    }

    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        self.typed_in_place(CollKind::AllReduce, buf, buf.len(), op, 0)
    }

    /// Copies root's `send` into every rank's `recv` (`ncclBroadcast`);
    /// `send` is read on the root only (pass `&[]` elsewhere).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.typed(
            CollKind::Broadcast,
            send,
            recv,
            recv.len(),
            RedOp::Sum,
            root,
        )
    }

    /// In-place broadcast.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.typed_in_place(CollKind::Broadcast, buf, buf.len(), RedOp::Sum, root)
    }

    /// Reduces every rank's `send` into root's `recv` (`ncclReduce`);
    /// `recv` is written on the root only (pass `&mut []` elsewhere).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        self.typed(CollKind::Reduce, send, recv, send.len(), op, root)
    }

    /// In-place reduce: the root's `buf` receives the result.
    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp, root: usize) -> Result<()> {
        self.typed_in_place(CollKind::Reduce, buf, buf.len(), op, root)
    }

    /// Gathers every rank's `send` into every rank's `recv`, in rank order
    /// (`ncclAllGather`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.typed(CollKind::AllGather, send, recv, send.len(), RedOp::Sum, 0)
    }

    /// In-place all-gather: this rank's block of `buf` is its input.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = per_rank("the buffer", buf.len(), self.count())?;
        self.typed_in_place(CollKind::AllGather, buf, count, RedOp::Sum, 0)
    }

    /// Reduces every rank's `send` and leaves block `rank` of the result in
    /// `recv` (`ncclReduceScatter`).
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        self.typed(CollKind::ReduceScatter, send, recv, recv.len(), op, 0)
    }

    /// In-place reduce-scatter: the result lands in this rank's block of
    /// `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        let count = per_rank("the buffer", buf.len(), self.count())?;
        self.typed_in_place(CollKind::ReduceScatter, buf, count, op, 0)
    }

    /// Block j of `send` goes to rank j; block i of `recv` comes from rank i
    /// (`ncclAlltoAll`).
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = per_rank("the send buffer", send.len(), self.count())?;
        self.typed(CollKind::AllToAll, send, recv, count, RedOp::Sum, 0)
    }

    /// Gathers every rank's `send` into root's `recv` (`ncclGather`).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.typed(CollKind::Gather, send, recv, send.len(), RedOp::Sum, root)
    }

    /// Scatters root's `send`, block j to rank j (`ncclScatter`).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.typed(CollKind::Scatter, send, recv, recv.len(), RedOp::Sum, root)
    }

    /// Sends `buf` to `peer` (`ncclSend`); the peer must post a matching
    /// receive. To exchange with a peer that also sends, batch both in a
    /// [`Group`].
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        Group::new().send(self, buf, peer)?.run()
    }

    /// Receives into `buf` from `peer` (`ncclRecv`).
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        Group::new().recv(self, buf, peer)?.run()
    }
}

#[inline]
fn submit(raw: Result<RawOp>) -> Result<()> {
    let result = raw.and_then(|raw| {
        // SAFETY: the raw op's buffers were validated by its builder and the
        // caller promised they stay valid until completion.
        unsafe { enqueue::enqueue(raw) }
    });
    if let Err(err) = &result {
        enqueue::group_fail(err);
    }
    result
}

/// A batch of operations, on one or several communicators, launched
/// together: sends and receives that depend on each other, or one thread
/// driving several ranks of one process. The borrows of every buffer last
/// until [`Group::run`] returns.
///
/// ```
/// use rccl::{Communicator, Group};
///
/// let comms = Communicator::init_all(2).unwrap();
/// let mine: Vec<[u32; 3]> = (0..2).map(|r| [r as u32; 3]).collect();
/// let mut theirs = vec![[0u32; 3]; 2];
/// let mut group = Group::new();
/// for (rank, out) in theirs.iter_mut().enumerate() {
///     let peer = 1 - rank;
///     group.send(&comms[rank], &mine[rank], peer).unwrap();
///     group.recv(&comms[rank], out, peer).unwrap();
/// }
/// group.run().unwrap();
/// assert_eq!(theirs, [[1; 3], [0; 3]]);
/// ```
#[derive(Default)]
pub struct Group<'a> {
    ops: Vec<RawOp>,
    borrows: PhantomData<&'a mut ()>,
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Group<'a> {
        Group {
            ops: Vec::new(),
            borrows: PhantomData,
        }
    }

    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(
        &mut self,
        comm: &Communicator,
        buf: &'a [T],
        peer: usize,
    ) -> Result<&mut Self> {
        let op = comm.raw_p2p(
            true,
            buf.as_ptr() as *mut u8,
            buf.len(),
            T::DATATYPE,
            peer,
            None,
        )?;
        self.ops.push(op);
        Ok(self)
    }

    /// Adds a receive into `buf` from `peer`.
    pub fn recv<T: Element>(
        &mut self,
        comm: &Communicator,
        buf: &'a mut [T],
        peer: usize,
    ) -> Result<&mut Self> {
        let op = comm.raw_p2p(
            false,
            buf.as_mut_ptr().cast(),
            buf.len(),
            T::DATATYPE,
            peer,
            None,
        )?;
        self.ops.push(op);
        Ok(self)
    }

    /// Adds an all-reduce.
    pub fn all_reduce<T: Element>(
        &mut self,
        comm: &Communicator,
        send: &'a [T],
        recv: &'a mut [T],
        op: RedOp,
    ) -> Result<&mut Self> {
        check_len("the receive buffer", recv.len(), send.len())?;
        // SAFETY: both slices are valid for `send.len()` elements and stay
        // borrowed until `run` returns.
        let raw = unsafe {
            let call = CollCall {
                kind: CollKind::AllReduce,
                count: send.len(),
                dtype: T::DATATYPE,
                op,
                root: 0,
            };
            comm.raw_collective(call, send.as_ptr().cast(), recv.as_mut_ptr().cast(), None)
        }?;
        self.ops.push(raw);
        Ok(self)
    }

    /// Launches everything added and waits for it.
    pub fn run(&mut self) -> Result<()> {
        let ops = std::mem::take(&mut self.ops);
        enqueue::group_start();
        let mut first = Ok(());
        for op in ops {
            // SAFETY: every op's buffers are borrowed for 'a, which outlives
            // this call, and the group completes before it returns.
            if let Err(err) = unsafe { enqueue::enqueue(op) } {
                enqueue::group_fail(&err);
                first = first.and(Err(err));
            }
        }
        let end = enqueue::group_end();
        first.and(end)
    }
}
