//! Running a collective on symmetric windows: every rank reads its
//! peers' windows in place, the board carrying only barriers.
//!
//! A call runs in rounds of the communicator's board, every rank posting
//! in each and going on once it has read every peer's post:
//! 1. *arrival*: the rank's inputs are ready; the post carries its
//!    windows' numbers, offsets and the schedule, which must equal every
//!    peer's (else the call fails on both, before any byte is read). Then
//!    one shot: all-reduce folds every rank's input into the receive
//!    buffer; all-gather copies them; reduce-scatter folds its block of
//!    each. Two-shot all-reduce folds only its block of `split_even`.
//! 2. two-shot only, *blocks*: every rank's block is folded; each copies
//!    its peers' blocks out of their receive buffers.
//! 3. *departure*: the rank has finished reading its peers' buffers. A
//!    rank returns only once every peer has, so the user may overwrite its
//!    buffers (the next call's inputs) without racing a reader.
//!
//! A rank writes only its own receive buffer, and never a byte a peer
//! reads in the same round: in place, a fold starts from the rank's own
//! input (the output's own range), one shot is never in place (the tuner
//! gives in-place all-reduce two shots), and an in-place all-gather or
//! reduce-scatter writes only blocks no peer reads. Every rank folds each
//! element in one order (one shot: ranks `n-1` down to 0, as the board;
//! two shots and reduce-scatter: one rank folds each block), so every
//! rank ends with the same bits. Waits go through the driver, with its
//! deadline, abort flag and hang reports.

use rccl_algorithms::{split_even, CollKind};
use rccl_transports::ParkOn;

use crate::comm::BoardLink;
use crate::error::{Error, Result};
use crate::plan::{BoardOp, SymmetricOp};
use crate::tuning::SymmetricSchedule;

/// Where a rank is in its front call.
#[derive(Default)]
pub struct Progress {
    phase: Phase,
    /// The round of the current phase once posted.
    round: Option<u64>,
    /// The next rank whose post of the round is awaited.
    next_peer: usize,
    /// Whether peers parked on this rank's post were woken.
    woken: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    #[default]
    Arrival,
    Blocks,
    Departure,
}

/// What one poll of the front call came to.
pub enum Step<'a> {
    /// The call is done.
    Done,
    /// Waiting for `peer`'s post; `moved` when something moved first.
    Waiting {
        peer: usize,
        park: ParkOn<'a>,
        prim: &'static str,
        moved: bool,
    },
}

/// Advances the front call `op` (running on symmetric windows `sym`) of
/// `rank` as far as it can without waiting.
pub fn poll<'a>(
    progress: &mut Progress,
    link: &'a BoardLink,
    rank: usize,
    op: &BoardOp,
    sym: &SymmetricOp,
) -> Result<Step<'a>> {
    let mut moved = false;
    loop {
        let arrival;
        let payload: &[u8] = if progress.phase == Phase::Arrival {
            arrival = arrival_post(sym);
            &arrival
        } else {
            &[]
        };
        if let Some((peer, park)) = round(progress, link, rank, op, payload, &mut moved)? {
            let prim = match progress.phase {
                Phase::Arrival => "symmetricArrival",
                Phase::Blocks => "symmetricBlocks",
                Phase::Departure => "symmetricDeparture",
            };
            return Ok(Step::Waiting {
                peer,
                park,
                prim,
                moved,
            });
        }
        progress.round = None;
        moved = true;
        let nranks = link.names.len();
        progress.phase = match progress.phase {
            Phase::Arrival => {
                #[cfg(feature = "fault-injection")]
                crate::fault::delay("symmetric-read");
                // SAFETY: every rank's inputs are ready (its arrival post
                // was read) and lie at the same offsets of windows of the
                // same size (checked against its post); see `compute`.
                unsafe { compute(op, sym, rank, nranks) };
                if sym.schedule == SymmetricSchedule::TwoShot {
                    Phase::Blocks
                } else {
                    Phase::Departure
                }
            }
            Phase::Blocks => {
                #[cfg(feature = "fault-injection")]
                crate::fault::delay("symmetric-read");
                // SAFETY: every rank folded its block (its post of this
                // round was read) and keeps its buffers until departure.
                unsafe { copy_blocks(op, sym, rank, nranks) };
                Phase::Departure
            }
            Phase::Departure => {
                *progress = Progress::default();
                sym.comm
                    .symmetric_calls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(Step::Done);
            }
        };
    }
}

/// The arrival post: both windows' numbers and offsets, and the schedule.
fn arrival_post(sym: &SymmetricOp) -> [u8; crate::plan::ARRIVAL_BYTES] {
    let mut post = [0u8; crate::plan::ARRIVAL_BYTES];
    for (chunk, word) in post.chunks_exact_mut(8).zip(sym.arrival) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    post
}

/// Posts this rank's `payload` for the current phase (once), then reads
/// every peer's post of it; `Some` with the first peer not there yet.
fn round<'a>(
    progress: &mut Progress,
    link: &'a BoardLink,
    rank: usize,
    op: &BoardOp,
    payload: &[u8],
    moved: &mut bool,
) -> Result<Option<(usize, ParkOn<'a>)>> {
    let board = &link.board;
    let round = match progress.round {
        Some(round) => round,
        None => {
            let round = board.next_round();
            // SAFETY: the post holds the board's capacity, at least
            // `ARRIVAL_BYTES` (checked when planned); board memory never
            // aliases `payload`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    payload.as_ptr(),
                    board.post_data(rank, round),
                    payload.len(),
                )
            };
            board.publish(rank, round, op.tag, payload.len());
            *progress = Progress {
                phase: progress.phase,
                round: Some(round),
                next_peer: 0,
                woken: false,
            };
            *moved = true;
            round
        }
    };
    let mut waiting = None;
    while progress.next_peer < link.names.len() {
        let peer = progress.next_peer;
        if peer != rank {
            match board.read(peer, round) {
                Ok(post) => {
                    // SAFETY: a read post's `len` bytes stay unchanged
                    // until every rank has finished the round.
                    let theirs = unsafe { std::slice::from_raw_parts(post.data, post.len) };
                    check(link, op, peer, post.tag, payload, theirs)?;
                }
                Err(park) => {
                    waiting = Some((peer, park));
                    break;
                }
            }
        }
        progress.next_peer += 1;
    }
    // Once a round, before this rank waits, so no two ranks wait on each
    // other's wake-up.
    if !progress.woken {
        board.wake_readers(rank, round);
        progress.woken = true;
    }
    Ok(waiting)
}

/// Checks `peer`'s post against this rank's: the same call, the same
/// windows and offsets.
fn check(
    link: &BoardLink,
    op: &BoardOp,
    peer: usize,
    tag: rccl_transports::Tag,
    mine: &[u8],
    theirs: &[u8],
) -> Result<()> {
    if tag != op.tag {
        return Err(crate::agreement::call::disagreement(
            op.tag,
            &link.names[peer],
            tag,
        ));
    }
    if mine != theirs {
        let describe = |post: &[u8]| {
            let word = |i: usize| {
                post.get(i * 8..i * 8 + 8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            };
            format!(
                "send at offset {} of window #{}, receive at offset {} of window #{}{}",
                word(1) as i64,
                word(0),
                word(3) as i64,
                word(2),
                if word(4) == 1 { " (two shots)" } else { "" }
            )
        };
        return Err(Error::InvalidUsage(format!(
            "{} #{} on symmetric windows: this rank passes its {}, {} passes its {} (in place, less \
             the rank's block): NCCL_WIN_COLL_SYMMETRIC asks every rank's buffers at the same \
             offsets of the same windows",
            op.name,
            op.seq,
            describe(mine),
            link.names[peer],
            describe(theirs)
        )));
    }
    Ok(())
}

/// The arrival round's work on this rank.
///
/// # Safety
/// Every rank's inputs are ready and stay unchanged until departure;
/// `sym`'s spans give every rank's buffers of the call's lengths.
unsafe fn compute(op: &BoardOp, sym: &SymmetricOp, rank: usize, nranks: usize) {
    let size = op.elem_size;
    let send = |r: usize, elems: usize| sym.send.peers[r].wrapping_add(elems * size).cast_const();
    let out = sym.recv.peers[rank];
    // Folds every rank's `len` elements at `at(rank)` into `dst`, ranks
    // in `order` (the first is this rank's own when in place: its output
    // range is its own input's).
    let fold = |order: &mut dyn Iterator<Item = usize>, at: usize, dst: *mut u8, len: usize| {
        let reduction = op.reduction.as_ref().expect("a reducing collective");
        let first = order.next().expect("two ranks or more");
        // SAFETY: (the caller's) every input holds `len` elements at `at`;
        // `dst` is this rank's receive buffer, identical to or disjoint
        // from each input.
        unsafe { reduction.input.run(None, send(first, at), dst, len, false) };
        let mut order = order.peekable();
        while let Some(r) = order.next() {
            // SAFETY: as above; `dst` holds the fold so far.
            unsafe {
                reduction.input.run(
                    Some(dst.cast_const()),
                    send(r, at),
                    dst,
                    len,
                    order.peek().is_none(),
                )
            };
        }
    };
    let from_me = |n: usize| (0..n).map(move |k| (rank + k) % n);
    match (sym.kind, sym.schedule) {
        (CollKind::AllReduce, SymmetricSchedule::OneShot) => {
            fold(&mut (0..nranks).rev(), 0, out, op.count);
        }
        (CollKind::AllReduce, SymmetricSchedule::TwoShot) => {
            let (at, len) = block(op, rank, nranks);
            if len > 0 {
                fold(&mut from_me(nranks), at, out.wrapping_add(at * size), len);
            }
        }
        (CollKind::ReduceScatter, _) => {
            fold(&mut from_me(nranks), rank * op.count, out, op.count);
        }
        (CollKind::AllGather, _) => {
            let bytes = op.count * size;
            for r in 0..nranks {
                let dst = out.wrapping_add(r * bytes);
                let src = if sym.in_place {
                    sym.recv.peers[r].wrapping_add(r * bytes).cast_const()
                } else {
                    send(r, 0)
                };
                if std::ptr::eq(src, dst) {
                    continue;
                }
                // SAFETY: rank `r`'s input (its send buffer, or in place
                // its block of its receive buffer) holds `count` elements;
                // block `r` of this rank's receive buffer too; a peer's
                // buffer is disjoint from it, this rank's own send buffer
                // is disjoint or (in place) skipped above.
                unsafe { std::ptr::copy(src, dst, bytes) };
            }
        }
        (kind, _) => unreachable!("{} is not planned on symmetric windows", kind.name()),
    }
}

/// Copies every peer's folded block out of its receive buffer (two-shot
/// all-reduce).
///
/// # Safety
/// Every rank has folded its block and keeps it until departure.
unsafe fn copy_blocks(op: &BoardOp, sym: &SymmetricOp, rank: usize, nranks: usize) {
    for peer in (0..nranks).filter(|&p| p != rank) {
        let (at, len) = block(op, peer, nranks);
        let bytes = at * op.elem_size;
        // SAFETY: the peer's receive buffer holds `count` elements, the
        // block among them; this rank's is a distinct buffer of the same
        // length.
        unsafe {
            std::ptr::copy_nonoverlapping(
                sym.recv.peers[peer].wrapping_add(bytes).cast_const(),
                sym.recv.peers[rank].wrapping_add(bytes),
                len * op.elem_size,
            )
        };
    }
}

/// Rank `owner`'s block of a two-shot all-reduce: (first element, count).
fn block(op: &BoardOp, owner: usize, nranks: usize) -> (usize, usize) {
    split_even(op.count, nranks)
        .nth(owner)
        .expect("a block per rank")
}
