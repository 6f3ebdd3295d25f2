//! The executor: walks schedules against connections, moving slot-sized
//! pieces and reducing with the host kernels.
//!
//! Each channel of each operation is a [`ChannelRun`], a state machine that
//! [`ChannelRun::poll`] advances as far as it can without blocking. One
//! thread drives every run of a group round-robin ([`drive`]), so a thread
//! that launches operations on several communicators at once (a group over
//! ranks of one process) never deadlocks, and a lone small operation pays no
//! thread hand-off. When nothing can move, the driver parks on the FIFO the
//! first blocked primitive waits for, with the group's deadline.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use rccl_algorithms::{split_even, Buf, Prim, Slice};
use rccl_transports::{Backoff, Fifo, ParkOn, Tag, WaitError};

use super::symmetric;
use crate::agreement::stuck::{note_error, STALL_CHECK_EVERY};
use crate::comm::{BoardLink, Link};
use crate::error::{Error, Result};
use crate::kernels::Store;
use crate::plan::{BoardFold, BoardOp, OpWork};

/// Most pieces one primitive moves per poll, so that channels and
/// primitives sharing a thread take turns.
const PIECES_PER_POLL: usize = 16;

/// Longest park while one run is blocked (it is woken when its FIFO
/// moves; this bounds checks of the abort flag and deadline).
const SINGLE_WAIT_PARK_MAX: std::time::Duration = std::time::Duration::from_millis(5);
/// Longest park while several runs are blocked (only one FIFO wakes us).
const MULTI_WAIT_PARK_MAX: std::time::Duration = std::time::Duration::from_micros(200);

/// What a blocked primitive waits for, for hang reports.
#[derive(Clone, Debug)]
pub struct Blocked {
    /// The operation's sequence number.
    pub seq: u64,
    /// The operation's name.
    pub op: &'static str,
    /// What the operation's pieces carry.
    pub tag: Tag,
    /// Step index within the channel.
    pub step: usize,
    /// The primitive's name.
    pub prim: &'static str,
    /// The peer it waits on.
    pub peer: usize,
    /// True when waiting for data from the peer, false when waiting for
    /// the peer to free FIFO space.
    pub receiving: bool,
}

impl Blocked {
    /// "step 3 (recvReduceSend), waiting for data from `peer`": what the
    /// hang report and the timeout's report say of a blocked primitive.
    pub fn waits(&self, peer: &str) -> String {
        let what = if self.receiving {
            "for data from"
        } else {
            "for FIFO space from"
        };
        format!("step {} ({}), waiting {what} {peer}", self.step, self.prim)
    }
}

/// Outcome of one poll.
pub enum Poll<'a> {
    /// All queued work is finished.
    Done,
    /// Something moved; poll again.
    Progress,
    /// Nothing could move; park here.
    Blocked(ParkOn<'a>),
}

enum PrimPoll<'a> {
    Done,
    Moved,
    Blocked(ParkOn<'a>, usize, bool),
}

/// The state machine of one channel: its queue of operations and the
/// progress of the current step's primitives.
pub struct ChannelRun<'a> {
    channel: usize,
    links: &'a [Option<Link>],
    ops: VecDeque<OpWork>,
    step: usize,
    moved: Vec<usize>,
    blocked: Option<Blocked>,
}

impl<'a> ChannelRun<'a> {
    /// A run over `links` (indexed by peer rank) for `channel`.
    pub fn new(channel: usize, links: &'a [Option<Link>]) -> ChannelRun<'a> {
        ChannelRun {
            channel,
            links,
            ops: VecDeque::new(),
            step: 0,
            moved: Vec::new(),
            blocked: None,
        }
    }

    /// Queues an operation behind those already queued.
    pub fn push(&mut self, work: OpWork) {
        self.ops.push_back(work);
    }

    /// The channel index.
    pub fn channel(&self) -> usize {
        self.channel
    }

    /// What the run waited for when it last blocked.
    pub fn blocked(&self) -> Option<&Blocked> {
        self.blocked.as_ref()
    }

    /// Advances as far as possible without waiting.
    pub fn poll(&mut self) -> Result<Poll<'a>> {
        let mut progressed = false;
        loop {
            let Some(op) = self.ops.front() else {
                return Ok(Poll::Done);
            };
            let Some(step) = op.steps.get(self.step) else {
                self.ops.pop_front();
                self.step = 0;
                self.moved.clear();
                progressed = true;
                continue;
            };
            if self.moved.len() != step.prims.len() {
                self.moved = vec![0; step.prims.len()];
            }
            let mut first_park = None;
            let mut all_done = true;
            for (i, prim) in step.prims.iter().enumerate() {
                if self.moved[i] == prim.len() {
                    continue;
                }
                all_done = false;
                if waits_for_earlier(&step.prims, &self.moved, i) {
                    continue;
                }
                let piece = Piece {
                    links: self.links,
                    op,
                    channel: self.channel,
                };
                match piece.advance(prim, &mut self.moved[i])? {
                    PrimPoll::Done | PrimPoll::Moved => progressed = true,
                    PrimPoll::Blocked(park, peer, receiving) => {
                        if first_park.is_none() {
                            self.blocked = Some(Blocked {
                                seq: op.seq,
                                op: op.name,
                                tag: op.tag,
                                step: self.step,
                                prim: prim.name(),
                                peer,
                                receiving,
                            });
                            first_park = Some(park);
                        }
                    }
                }
            }
            if all_done
                || step
                    .prims
                    .iter()
                    .zip(&self.moved)
                    .all(|(p, &m)| m == p.len())
            {
                self.step += 1;
                self.moved.clear();
                progressed = true;
                continue;
            }
            return Ok(match (progressed, first_park) {
                (true, _) | (false, None) => Poll::Progress,
                (false, Some(park)) => Poll::Blocked(park),
            });
        }
    }
}

/// Whether primitive `i` must wait for an earlier unfinished primitive of
/// its step that uses the same send peer or the same receive peer (their
/// messages travel in order on one connection).
fn waits_for_earlier(prims: &[Prim], moved: &[usize], i: usize) -> bool {
    let (send, recv) = (prims[i].send_peer(), prims[i].recv_peer());
    prims[..i].iter().zip(moved).any(|(p, &m)| {
        m < p.len()
            && ((send.is_some() && p.send_peer() == send)
                || (recv.is_some() && p.recv_peer() == recv))
    })
}

/// Everything one primitive needs to move its pieces.
struct Piece<'r, 'a> {
    links: &'a [Option<Link>],
    op: &'r OpWork,
    channel: usize,
}

impl<'a> Piece<'_, 'a> {
    fn link(&self, peer: usize) -> Result<&'a Link> {
        self.links
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                Error::Internal(format!(
                    "no connection to rank {peer} on channel {}",
                    self.channel
                ))
            })
    }

    /// Fails with the connection's reason if it has failed.
    fn check(&self, link: &Link, fifo: &Fifo) -> Result<()> {
        if fifo.failed() {
            if let Some(note) = link.conn.peer_note() {
                return Err(note_error(
                    &note,
                    &format!(
                        "{} #{} on channel {}: {} closed the connection",
                        self.op.name, self.op.seq, self.channel, link.peer_name
                    ),
                ));
            }
            let why = link
                .conn
                .failure()
                .unwrap_or_else(|| "connection closed".to_string());
            return Err(Error::Remote(format!(
                "{} #{} on channel {}: connection to {}: {why}",
                self.op.name, self.op.seq, self.channel, link.peer_name
            )));
        }
        Ok(())
    }

    /// The address of the `done`-th element of `slice`. Offsets stay
    /// within the buffers: schedules are built for the lengths the caller
    /// validated.
    fn ptr(&self, slice: Slice, done: usize) -> *mut u8 {
        self.op
            .binding
            .address(slice.buf, slice.offset + done, self.op.elem_size)
    }

    /// out = src, through the input transform when `src` is the user's
    /// send buffer of a reducing collective, written with `store`s (a FIFO
    /// slot's always cached, a user's buffer's the operation's
    /// `user_store`).
    ///
    /// # Safety
    /// `src` and `out` are valid for `n` elements and equal or disjoint.
    unsafe fn load(&self, src_buf: Buf, src: *const u8, out: *mut u8, n: usize, store: Store) {
        match &self.op.reduction {
            Some(r) if src_buf == Buf::Send && r.input.has_input_transform() => {
                // SAFETY: forwarded from the caller.
                unsafe { r.input.run_with_store(store, None, src, out, n, false) }
            }
            _ if std::ptr::eq(src, out) => {}
            // SAFETY: forwarded from the caller; distinct pointers of valid
            // ranges never partially overlap in a verified schedule.
            _ => unsafe { store.copy(src, out, n * self.op.elem_size) },
        }
    }

    /// out = acc op src (op's transforms as for `load`), finished when
    /// `finish`, written with `store`s as for `load`.
    ///
    /// # Safety
    /// All pointers valid for `n` elements; `out` equal to or disjoint from
    /// each input.
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce(
        &self,
        src_buf: Buf,
        acc: *const u8,
        src: *const u8,
        out: *mut u8,
        n: usize,
        finish: bool,
        store: Store,
    ) -> Result<()> {
        let reduction = self.op.reduction.as_ref().ok_or_else(|| {
            Error::Internal(format!(
                "{} has a reducing primitive but no op",
                self.op.name
            ))
        })?;
        let kernel = if src_buf == Buf::Send {
            &reduction.input
        } else {
            &reduction.partial
        };
        // SAFETY: forwarded from the caller.
        unsafe { kernel.run_with_store(store, Some(acc), src, out, n, finish) };
        Ok(())
    }

    /// Reserves a send slot to `peer`, returning it and the most elements
    /// it holds.
    fn reserve(&self, peer: usize) -> Result<std::result::Result<(*mut u8, usize), ParkOn<'a>>> {
        let link = self.link(peer)?;
        let fifo = link.conn.send_fifo(self.op.protocol);
        let park = fifo.producer_park();
        match fifo.try_reserve() {
            Some(slot) => Ok(Ok((slot, fifo.slot_bytes() / self.op.elem_size))),
            None => {
                self.check(link, fifo)?;
                Ok(Err(park))
            }
        }
    }

    /// The oldest piece from `peer`, checked against what may still come.
    fn peek(
        &self,
        peer: usize,
        remaining: usize,
    ) -> Result<std::result::Result<(*const u8, usize), ParkOn<'a>>> {
        let link = self.link(peer)?;
        let fifo = link.conn.recv_fifo(self.op.protocol);
        let park = fifo.consumer_park();
        match fifo.try_peek() {
            Some((slot, bytes, tag)) => {
                if tag != self.op.tag {
                    return Err(crate::agreement::call::disagreement(
                        self.op.tag,
                        &link.peer_name,
                        tag,
                    ));
                }
                let elem = self.op.elem_size;
                if bytes == 0 || bytes % elem != 0 || bytes / elem > remaining {
                    return Err(Error::Remote(format!(
                        "{} on channel {}: rank {peer} sent a {bytes}-byte piece where at most \
                         {remaining} elements of {elem} bytes were expected (mismatched calls?)",
                        self.op.name, self.channel
                    )));
                }
                Ok(Ok((slot, bytes / elem)))
            }
            None => {
                self.check(link, fifo)?;
                Ok(Err(park))
            }
        }
    }

    fn publish(&self, peer: usize, elems: usize) -> Result<()> {
        self.link(peer)?
            .conn
            .send_fifo(self.op.protocol)
            .publish(elems * self.op.elem_size, self.op.tag);
        Ok(())
    }

    fn release(&self, peer: usize) -> Result<()> {
        self.link(peer)?.conn.recv_fifo(self.op.protocol).release();
        Ok(())
    }

    /// Moves pieces of `prim` until it is done, blocked, or has had its
    /// turn. `moved` counts the elements already moved.
    fn advance(&self, prim: &Prim, moved: &mut usize) -> Result<PrimPoll<'a>> {
        let len = prim.len();
        let mut pieces = 0;
        while *moved < len {
            if pieces == PIECES_PER_POLL {
                return Ok(PrimPoll::Moved);
            }
            let done = *moved;
            let remaining = len - done;
            match *prim {
                Prim::Copy { src, dst } => {
                    // SAFETY: both slices lie inside the validated buffers.
                    unsafe {
                        self.load(
                            src.buf,
                            self.ptr(src, done),
                            self.ptr(dst, done),
                            remaining,
                            self.op.user_store,
                        )
                    };
                    *moved = len;
                }
                Prim::ReduceCopy { src, dst } | Prim::ReduceCopyPartial { src, dst } => {
                    // dst = src op dst. The kernel transforms its `input`
                    // operand when that is read from the send buffer; the
                    // op is commutative, so either slice may take that role.
                    let (acc, input) = if dst.buf == Buf::Send && src.buf != Buf::Send {
                        (src, dst)
                    } else {
                        (dst, src)
                    };
                    let finish = matches!(prim, Prim::ReduceCopy { .. });
                    // SAFETY: both slices lie inside the validated buffers;
                    // `out` equals `dst`, which is disjoint from `src` in a
                    // verified schedule.
                    unsafe {
                        self.reduce(
                            input.buf,
                            self.ptr(acc, done),
                            self.ptr(input, done),
                            self.ptr(dst, done),
                            remaining,
                            finish,
                            self.op.user_store,
                        )?
                    };
                    *moved = len;
                }
                Prim::Send { to, src } | Prim::CopySend { to, src, .. } => {
                    let (slot, cap) = match self.reserve(to)? {
                        Ok(found) => found,
                        Err(park) => return Ok(PrimPoll::Blocked(park, to, false)),
                    };
                    let n = remaining.min(cap);
                    let from = self.ptr(src, done);
                    // SAFETY: the slot holds `cap` >= n elements; `src` (and
                    // `dst`) lie inside the validated buffers.
                    unsafe {
                        self.load(src.buf, from, slot, n, Store::Cached);
                        if let Prim::CopySend { dst, .. } = *prim {
                            let to_user = self.ptr(dst, done);
                            self.load(src.buf, from, to_user, n, self.op.user_store);
                        }
                    }
                    self.publish(to, n)?;
                    *moved += n;
                }
                Prim::Recv { from, dst } => {
                    let (slot, n) = match self.peek(from, remaining)? {
                        Ok(found) => found,
                        Err(park) => return Ok(PrimPoll::Blocked(park, from, true)),
                    };
                    // SAFETY: the slot holds n elements; dst lies inside the
                    // receive buffer; FIFO memory never aliases user memory.
                    unsafe {
                        self.op
                            .user_store
                            .copy(slot, self.ptr(dst, done), n * self.op.elem_size)
                    };
                    self.release(from)?;
                    *moved += n;
                }
                Prim::RecvReduceCopy { from, src, dst }
                | Prim::RecvReduceCopyPartial { from, src, dst } => {
                    let (slot, n) = match self.peek(from, remaining)? {
                        Ok(found) => found,
                        Err(park) => return Ok(PrimPoll::Blocked(park, from, true)),
                    };
                    let finish = matches!(prim, Prim::RecvReduceCopy { .. });
                    // SAFETY: as for Recv; src and dst are equal or disjoint.
                    unsafe {
                        self.reduce(
                            src.buf,
                            slot,
                            self.ptr(src, done),
                            self.ptr(dst, done),
                            n,
                            finish,
                            self.op.user_store,
                        )?
                    };
                    self.release(from)?;
                    *moved += n;
                }
                Prim::RecvReduceSend { from, src, to }
                | Prim::RecvReduceCopySend { from, src, to, .. }
                | Prim::RecvCopySend { from, to, dst: src } => {
                    // Reserve first: a received piece is only taken when it
                    // can be forwarded at once.
                    let (out, cap) = match self.reserve(to)? {
                        Ok(found) => found,
                        Err(park) => return Ok(PrimPoll::Blocked(park, to, false)),
                    };
                    let (slot, n) = match self.peek(from, remaining)? {
                        Ok(found) => found,
                        Err(park) => return Ok(PrimPoll::Blocked(park, from, true)),
                    };
                    if n > cap {
                        return Err(Error::Remote(format!(
                            "{}: rank {from} sent a piece larger than this rank's slots \
                             (is NCCL_BUFFSIZE the same on every rank?)",
                            self.op.name
                        )));
                    }
                    let bytes = n * self.op.elem_size;
                    // SAFETY: `slot` holds n elements, `out` holds cap >= n;
                    // user slices lie inside the validated buffers and FIFO
                    // memory never aliases them.
                    unsafe {
                        match *prim {
                            Prim::RecvReduceSend { .. } => self.reduce(
                                src.buf,
                                slot,
                                self.ptr(src, done),
                                out,
                                n,
                                false,
                                Store::Cached,
                            )?,
                            Prim::RecvReduceCopySend { dst, .. } => {
                                // Into the cached slot first, then from it
                                // to the user's buffer, whose stores may
                                // bypass the cache unless the result lands
                                // where its input was just read (in place).
                                let (s, d) = (self.ptr(src, done), self.ptr(dst, done));
                                self.reduce(src.buf, slot, s, out, n, true, Store::Cached)?;
                                let store = if std::ptr::eq(s, d) {
                                    Store::Cached
                                } else {
                                    self.op.user_store
                                };
                                store.copy(out, d, bytes);
                            }
                            _ => {
                                self.op.user_store.copy(slot, self.ptr(src, done), bytes);
                                std::ptr::copy_nonoverlapping(slot, out, bytes);
                            }
                        }
                    }
                    self.publish(to, n)?;
                    self.release(from)?;
                    *moved += n;
                }
            }
            pieces += 1;
        }
        Ok(PrimPoll::Done)
    }
}

/// The state machine of a communicator's board operations, run one after
/// another: post this rank's input, then collect every peer's post, then
/// reduce (in two shots: reduce this rank's block, post it, collect every
/// peer's block).
pub struct BoardRun<'a> {
    link: &'a BoardLink,
    rank: usize,
    /// The operations, in call order (usually one: held inline).
    ops: smallvec::SmallVec<[BoardOp; 1]>,
    /// How many of them are done.
    done: usize,
    /// The round of the front operation once it is posted.
    round: Option<u64>,
    /// Whether that round posts reduced blocks (a two-shot fold's second).
    gathering: bool,
    /// The next rank whose post the front operation waits for.
    next_peer: usize,
    /// Whether peers parked on this rank's post of the front operation
    /// have been woken (done once, after the first pass over the posts).
    woken: bool,
    /// The front operation's progress when it runs on symmetric windows
    /// (made for the first such operation: board runs stay small).
    symmetric: Option<Box<symmetric::Progress>>,
    blocked: Option<Blocked>,
}

impl<'a> BoardRun<'a> {
    /// A run of `ops`, in order, for `rank` over `link`.
    pub fn new(
        rank: usize,
        link: &'a BoardLink,
        ops: smallvec::SmallVec<[BoardOp; 1]>,
    ) -> BoardRun<'a> {
        BoardRun {
            link,
            rank,
            ops,
            done: 0,
            round: None,
            gathering: false,
            next_peer: 0,
            woken: false,
            symmetric: None,
            blocked: None,
        }
    }

    /// Advances as far as possible without waiting.
    pub fn poll(&mut self) -> Result<Poll<'a>> {
        let board = &self.link.board;
        let nranks = self.link.names.len();
        let mut progressed = false;
        loop {
            let Some(op) = self.ops.get(self.done) else {
                return Ok(Poll::Done);
            };
            if let Some(sym) = &op.symmetric {
                let progress = self.symmetric.get_or_insert_default();
                match symmetric::poll(progress, self.link, self.rank, op, sym)? {
                    symmetric::Step::Done => {
                        self.done += 1;
                        progressed = true;
                        continue;
                    }
                    symmetric::Step::Waiting {
                        peer,
                        park,
                        prim,
                        moved,
                    } => return self.wait(peer, park, prim, progressed || moved),
                }
            }
            let reduction = op.reduction.as_ref().expect("a board all-reduce reduces");
            let bytes = op.count * op.elem_size;
            let round = match self.round {
                Some(round) => round,
                None => {
                    let round = board.next_round();
                    let post = board.post_data(self.rank, round);
                    // SAFETY: the send buffer holds `count` elements and the
                    // post `capacity` >= bytes (checked when planned); board
                    // memory never aliases user memory.
                    unsafe {
                        if reduction.input.has_input_transform() {
                            reduction.input.run(None, op.send, post, op.count, false);
                        } else {
                            std::ptr::copy_nonoverlapping(op.send, post, bytes);
                        }
                    }
                    board.publish(self.rank, round, op.tag, bytes);
                    self.round = Some(round);
                    self.next_peer = 0;
                    self.woken = false;
                    progressed = true;
                    round
                }
            };
            let mut waiting = None;
            while self.next_peer < nranks {
                let peer = self.next_peer;
                if peer != self.rank {
                    match board.read(peer, round) {
                        Ok(post) => self.check(op, peer, post.tag, post.len)?,
                        Err(park) => {
                            waiting = Some((peer, park));
                            break;
                        }
                    }
                }
                self.next_peer += 1;
            }
            // Once a round: after the first pass over the posts, by when
            // this rank's own post has usually left its store buffer and the
            // fence costs little, and before this rank waits, so that no two
            // ranks wait on each other's wake-up.
            if !self.woken {
                board.wake_readers(self.rank, round);
                self.woken = true;
            }
            if let Some((peer, park)) = waiting {
                let prim = if self.gathering {
                    "readBlocks"
                } else {
                    "readPosts"
                };
                return self.wait(peer, park, prim, progressed);
            }
            if self.gathering {
                self.copy_blocks(op, round);
            } else if op.fold == BoardFold::OrderedTwoShot {
                self.reduce_posts(op, round);
                let (offset, len) = self.block(op, self.rank);
                let next = board.next_round();
                // SAFETY: as for the input's post; the block lies in the
                // receive buffer, which never aliases board memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        op.recv.add(offset).cast_const(),
                        board.post_data(self.rank, next),
                        len,
                    )
                };
                board.publish(self.rank, next, op.tag, len);
                self.round = Some(next);
                self.gathering = true;
                self.next_peer = 0;
                self.woken = false;
                progressed = true;
                continue;
            } else {
                self.reduce_posts(op, round);
            }
            self.done += 1;
            self.round = None;
            self.gathering = false;
            progressed = true;
        }
    }

    /// The front operation waits for `peer`'s post in `prim`: fails with
    /// the note of a rank that closed the board, else records what it
    /// waits for.
    fn wait(
        &mut self,
        peer: usize,
        park: ParkOn<'a>,
        prim: &'static str,
        progressed: bool,
    ) -> Result<Poll<'a>> {
        let op = &self.ops[self.done];
        if let Some(note) = self.link.board.note() {
            return Err(note_error(
                &note,
                &format!("{} #{} on the board", op.name, op.seq),
            ));
        }
        self.blocked = Some(Blocked {
            seq: op.seq,
            op: op.name,
            tag: op.tag,
            step: 0,
            prim,
            peer,
            receiving: true,
        });
        Ok(if progressed {
            Poll::Progress
        } else {
            Poll::Blocked(park)
        })
    }

    /// Rank `owner`'s block of a two-shot fold: (byte offset, bytes).
    fn block(&self, op: &BoardOp, owner: usize) -> (usize, usize) {
        let (offset, len) = split_even(op.count, self.link.names.len())
            .nth(owner)
            .expect("a block per rank");
        (offset * op.elem_size, len * op.elem_size)
    }

    /// Copies every peer's reduced block from its post of `round`.
    fn copy_blocks(&self, op: &BoardOp, round: u64) {
        for peer in (0..self.link.names.len()).filter(|&p| p != self.rank) {
            let (offset, len) = self.block(op, peer);
            // SAFETY: the peer's post of `round` holds its block (checked
            // when read) and stays unchanged until every rank has finished
            // the round; the block lies in the receive buffer, which never
            // aliases board memory.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.link.board.post_data(peer, round).cast_const(),
                    op.recv.add(offset),
                    len,
                )
            };
        }
    }

    fn check(&self, op: &BoardOp, peer: usize, tag: Tag, len: usize) -> Result<()> {
        if tag != op.tag {
            return Err(crate::agreement::call::disagreement(
                op.tag,
                &self.link.names[peer],
                tag,
            ));
        }
        let expected = if self.gathering {
            self.block(op, peer).1
        } else {
            op.count * op.elem_size
        };
        if len != expected {
            return Err(Error::Remote(format!(
                "{} #{}: {} posted {len} bytes where {} were expected",
                op.name, op.seq, self.link.names[peer], expected
            )));
        }
        Ok(())
    }

    /// recv = x0 op (x1 op (... op x(n-1))) ([`BoardFold::OneShot`]), or
    /// each block of `split_even(count, n)` folded in its stated order
    /// (only this rank's block for [`BoardFold::OrderedTwoShot`]); every
    /// input read from its post (inputs were transformed when posted).
    fn reduce_posts(&self, op: &BoardOp, round: u64) {
        let reduction = op.reduction.as_ref().expect("a board all-reduce reduces");
        let board = &self.link.board;
        let n = self.link.names.len();
        let post = |rank: usize, offset: usize| {
            board
                .post_data(rank, round)
                .wrapping_add(offset * op.elem_size)
                .cast_const()
        };
        // Folds the posts of `ranks` (at least two) over the `len`
        // elements at `offset`: the first step reads two posts, sparing a
        // copy; the last finishes.
        let fold = |ranks: &mut dyn Iterator<Item = usize>, offset: usize, len: usize| {
            let out = op.recv.wrapping_add(offset * op.elem_size);
            let first = ranks.next().expect("a board serves two ranks or more");
            let mut acc = post(first, offset);
            let mut ranks = ranks.peekable();
            while let Some(rank) = ranks.next() {
                // SAFETY: every post of this round holds `count` transformed
                // elements (checked when read) and stays unchanged until
                // every rank has finished the round; `offset + len <=
                // count`; the receive buffer holds `count` elements and
                // never aliases board memory.
                unsafe {
                    reduction.partial.run(
                        Some(acc),
                        post(rank, offset),
                        out,
                        len,
                        ranks.peek().is_none(),
                    )
                };
                acc = out.cast_const();
            }
        };
        if op.fold == BoardFold::OneShot {
            fold(&mut (0..n).rev(), 0, op.count);
            return;
        }
        for (owner, (offset, len)) in split_even(op.count, n).enumerate() {
            let mine = owner == self.rank || op.fold == BoardFold::Ordered;
            if len > 0 && mine {
                fold(&mut (1..=n).map(|k| (owner + k) % n), offset, len);
            }
        }
    }

    /// Whether the run still has work queued.
    pub fn busy(&self) -> bool {
        self.done < self.ops.len()
    }

    /// What the run waited for when it last blocked.
    pub fn blocked(&self) -> Option<&Blocked> {
        self.blocked.as_ref()
    }

    fn peer_gone(&self) -> Option<Error> {
        let b = self.blocked.as_ref()?;
        let why = self.link.watch.get(b.peer)?.as_ref()?.gone()?;
        Some(Error::Remote(format!(
            "{} #{} on the board: {} died: {why}",
            b.op, b.seq, self.link.names[b.peer]
        )))
    }
}

/// Work driven by the calling thread: one channel's FIFO schedules, or a
/// communicator's board.
pub enum Run<'a> {
    /// A channel's schedules.
    Channel(ChannelRun<'a>),
    /// Board operations.
    Board(BoardRun<'a>),
}

impl<'a> Run<'a> {
    fn poll(&mut self) -> Result<Poll<'a>> {
        match self {
            Run::Channel(run) => run.poll(),
            Run::Board(run) => run.poll(),
        }
    }

    /// Whether the run still has work queued.
    pub fn busy(&self) -> bool {
        match self {
            Run::Channel(run) => run.busy(),
            Run::Board(run) => run.busy(),
        }
    }

    /// What the run waited for when it last blocked.
    pub fn blocked(&self) -> Option<&Blocked> {
        match self {
            Run::Channel(run) => run.blocked(),
            Run::Board(run) => run.blocked(),
        }
    }

    /// The tags of the operations it has yet to finish.
    pub fn tags(&self) -> impl Iterator<Item = Tag> + '_ {
        let (channel, board) = match self {
            Run::Channel(run) => (Some(run.ops.iter().map(|w| w.tag)), None),
            Run::Board(run) => (None, Some(run.ops[run.done..].iter().map(|o| o.tag))),
        };
        channel
            .into_iter()
            .flatten()
            .chain(board.into_iter().flatten())
    }

    /// Where the run moves data, for reports: "channel 2" or "the board".
    pub fn place(&self) -> String {
        match self {
            Run::Channel(run) => format!("channel {}", run.channel()),
            Run::Board(_) => "the board".to_string(),
        }
    }

    fn peer_gone(&self) -> Option<Error> {
        match self {
            Run::Channel(run) => run.peer_gone(),
            Run::Board(run) => run.peer_gone(),
        }
    }
}

/// A group of runs driven together by the calling thread, each with the
/// abort flag of its communicator.
pub struct Driven<'a, 'f> {
    /// The run.
    pub run: Run<'a>,
    /// Its communicator's abort flag.
    pub abort: &'f AtomicBool,
    /// Index of its communicator in the group, to report errors against.
    pub comm: usize,
}

/// Fruitless spinning polls of a drive between readings of the clock for
/// its stall checks.
const POLLS_PER_CLOCK_READ: u32 = 64;
/// Fruitless polls after which a drive is surely yielding or parking
/// between polls (spinning polls take about 0.1 us each).
const SPINNING_POLLS: u32 = 4096;

impl ChannelRun<'_> {
    /// The peer this run last blocked on, if the transport knows it died.
    fn peer_gone(&self) -> Option<Error> {
        let b = self.blocked.as_ref()?;
        let link = self.links.get(b.peer)?.as_ref()?;
        let why = link.conn.peer_gone()?;
        Some(Error::Remote(format!(
            "{} #{} on channel {}, step {} ({}): {} died: {why}",
            b.op, b.seq, self.channel, b.step, b.prim, link.peer_name
        )))
    }

    /// Whether the run still has work queued.
    pub fn busy(&self) -> bool {
        !self.ops.is_empty()
    }
}

/// Why driving a group stopped early.
pub struct DriveError {
    /// Index of the communicator whose run failed (or first timed out).
    pub comm: usize,
    /// The failure.
    pub error: Error,
    /// For a timeout, what each unfinished run waited for, per
    /// communicator index and place ([`Run::place`]).
    pub waiting: Vec<(usize, String, Option<Blocked>)>,
}

/// Called while a drive is stuck, with its runs and how long they have
/// been stuck; an error (with the index of its communicator) ends it.
pub type StallCheck<'c> =
    dyn FnMut(&[Driven<'_, '_>], std::time::Duration) -> Option<(usize, Error)> + 'c;

/// Drives `runs` round-robin until all are done, the deadline passes, a
/// communicator is aborted, or a run fails.
///
/// While nothing moves, every [`STALL_CHECK_EVERY`] it asks the transports
/// whether the peers the blocked runs wait for are still alive, and calls
/// `stalled` with the runs and how long they have been stuck; an error it
/// returns (with the index of the communicator) ends the drive.
pub fn drive(
    runs: &mut [Driven<'_, '_>],
    deadline: Instant,
    stalled: &mut StallCheck<'_>,
) -> std::result::Result<(), DriveError> {
    let mut backoff = Backoff::new();
    let never_aborted = AtomicBool::new(false);
    let mut stall: Option<(Instant, u32)> = None;
    let mut blocked_polls: u32 = 0;
    loop {
        let mut progressed = false;
        let mut all_done = true;
        let mut park = None;
        let mut blocked = 0;
        for driven in runs.iter_mut() {
            if driven.abort.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(DriveError {
                    comm: driven.comm,
                    error: Error::InvalidUsage("the communicator was aborted".into()),
                    waiting: Vec::new(),
                });
            }
            match driven.run.poll() {
                Ok(Poll::Done) => {}
                Ok(Poll::Progress) => {
                    progressed = true;
                    all_done = false;
                }
                Ok(Poll::Blocked(p)) => {
                    all_done = false;
                    blocked += 1;
                    park.get_or_insert(p);
                }
                Err(error) => {
                    return Err(DriveError {
                        comm: driven.comm,
                        error,
                        waiting: Vec::new(),
                    })
                }
            }
        }
        if all_done {
            return Ok(());
        }
        if progressed {
            backoff.reset();
            stall = None;
            blocked_polls = 0;
            continue;
        }
        // While spinning, read the clock only every so many fruitless polls
        // (a reading costs as much as a poll); once polls are spaced by
        // yields and parks, at every one.
        blocked_polls = blocked_polls.saturating_add(1);
        let now = if blocked_polls > SPINNING_POLLS || blocked_polls % POLLS_PER_CLOCK_READ == 1 {
            Some(Instant::now())
        } else {
            None
        };
        let stall_due = now.and_then(|now| {
            let (since, checks) = stall.get_or_insert((now, 0));
            (now >= *since + STALL_CHECK_EVERY * (*checks + 1)).then_some((now, since, checks))
        });
        if let Some((now, since, checks)) = stall_due {
            *checks += 1;
            for driven in runs.iter().filter(|d| d.run.busy()) {
                if let Some(error) = driven.run.peer_gone() {
                    return Err(DriveError {
                        comm: driven.comm,
                        error,
                        waiting: Vec::new(),
                    });
                }
            }
            if let Some((comm, error)) = stalled(runs, now - *since) {
                return Err(DriveError {
                    comm,
                    error,
                    waiting: Vec::new(),
                });
            }
        }
        // Parked on one of several blocked runs, wake up soon enough to see
        // the others move.
        backoff.set_park_max(if blocked > 1 {
            MULTI_WAIT_PARK_MAX
        } else {
            SINGLE_WAIT_PARK_MAX
        });
        if let Err(WaitError::TimedOut | WaitError::Aborted) =
            backoff.snooze(park, deadline, &never_aborted)
        {
            let waiting: Vec<_> = runs
                .iter()
                .filter(|d| d.run.busy())
                .map(|d| (d.comm, d.run.place(), d.run.blocked().cloned()))
                .collect();
            let comm = waiting.first().map_or(0, |w| w.0);
            return Err(DriveError {
                comm,
                error: Error::System("timed out".into()),
                waiting,
            });
        }
    }
}
