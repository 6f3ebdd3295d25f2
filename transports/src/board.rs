//! The board: one shared-memory segment for all ranks of a communicator
//! that live on one host, where each rank posts its input to a small
//! collective once and reads every peer's post in place.
//!
//! One-shot all-reduce over per-pair FIFOs writes the same bytes into
//! `n - 1` FIFOs and pays each FIFO's bookkeeping; ranks of one host can all
//! read one another's memory, so one post per rank is enough. Posting is a
//! copy and a release store of the round number into the post's header;
//! reading is an acquire load of that word, then the data.
//!
//! Each rank owns two posts and uses them in alternate rounds. It writes a
//! post again two rounds later, when every peer has read it: a rank enters
//! round `r` only after completing round `r - 1`, which needed every peer's
//! post of round `r - 1`; a peer posts round `r - 1` only after completing
//! round `r - 2`, the last round in which it read this rank's post of the
//! same parity. So no acknowledgement travels back.
//!
//! A post's header (round number and the call's tag) shares its cache line
//! with the first bytes of its data, so a reader of a small post takes one
//! line from the poster's cache, not two.
//!
//! A waiter parks on the round word of the post it waits for; the poster
//! makes the wake-up system call only when the post's sleeper count (kept
//! apart from the posts, so that readers never write to a poster's lines)
//! says someone parked. A rank that gives up leaves a note in the control
//! page and wakes every waiter, which then fails with the note.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::futex;
use crate::shm::ShmSegment;
use crate::wait::ParkOn;
use crate::{bounded_note, Tag, MAX_NOTE};

/// Bytes of the control page that holds the closing note.
const CONTROL: usize = 4096;
/// Bytes of a post's header; its data follows at once, in the same line.
const HEADER: usize = 32;
/// Posts start on 128-byte boundaries (adjacent-line prefetch pairs), so
/// no two ranks' posts share a line.
const POST_ALIGN: usize = 128;

// Words of a post's header.
const ROUND: usize = 0;
const TAG_SEQ: usize = 1;
const TAG_CALL: usize = 2;
const TAG_COUNT: usize = 3;
const LEN: usize = 4;

// Words of the control page, and where the note's text starts.
const CLOSED: usize = 0;
const NOTE_LEN: usize = 1;
/// How many peers have mapped the board.
const MAPPED: usize = 2;
const NOTE_TEXT: usize = 64;
/// `CLOSED` values: open, note being written, note readable.
const OPEN: u32 = 0;
const WRITING: u32 = 1;
const NOTED: u32 = 2;

/// One rank's mapping of a communicator's board.
pub struct Board {
    segment: ShmSegment,
    nranks: usize,
    capacity: usize,
    stride: usize,
    /// Offset of the first post in the segment.
    posts: usize,
    /// Rounds this rank has started.
    rounds: AtomicU64,
}

/// A post read from the board.
#[derive(Clone, Copy, Debug)]
pub struct Post {
    /// The call the poster made.
    pub tag: Tag,
    /// Bytes posted.
    pub len: usize,
    /// The posted bytes.
    pub data: *const u8,
}

impl Board {
    /// Bytes of a board for `nranks` ranks posting at most `capacity`
    /// bytes each.
    pub fn segment_bytes(nranks: usize, capacity: usize) -> usize {
        CONTROL + sleepers_bytes(nranks) + nranks * 2 * stride(capacity)
    }

    /// Creates a board (mode 0600) for the others to open by its name.
    pub fn create(nranks: usize, capacity: usize) -> io::Result<Board> {
        let segment = ShmSegment::create(Board::segment_bytes(nranks, capacity))?;
        Ok(Board::over(segment, nranks, capacity))
    }

    /// Maps the board `name` created by a peer with the same shape. The
    /// last of the `nranks - 1` peers to map it removes the name, so that
    /// from then on no crash leaves it in `/dev/shm` (until then, the
    /// creator's drop removes it).
    pub fn open(name: &str, nranks: usize, capacity: usize) -> io::Result<Board> {
        let segment = ShmSegment::open(name, Board::segment_bytes(nranks, capacity))?;
        let board = Board::over(segment, nranks, capacity);
        if board.control(MAPPED).fetch_add(1, Ordering::AcqRel) + 1 == nranks as u32 - 1 {
            board.segment.unlink()?;
        }
        Ok(board)
    }

    fn over(segment: ShmSegment, nranks: usize, capacity: usize) -> Board {
        Board {
            segment,
            nranks,
            capacity,
            stride: stride(capacity),
            posts: CONTROL + sleepers_bytes(nranks),
            rounds: AtomicU64::new(0),
        }
    }

    /// The segment's name, for the peers to open.
    pub fn name(&self) -> &str {
        self.segment.name()
    }

    /// Most bytes one post holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Starts this rank's next round, returning its number (1, 2, ...).
    /// Every rank counts the same rounds.
    pub fn next_round(&self) -> u64 {
        self.rounds.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Which of the 2 x nranks posts `rank` uses in `round`.
    fn post_index(&self, rank: usize, round: u64) -> usize {
        assert!(rank < self.nranks, "rank {rank} is not on this board");
        rank * 2 + (round & 1) as usize
    }

    fn post_base(&self, rank: usize, round: u64) -> *mut u8 {
        // In bounds: the 2 * nranks posts of `stride` bytes follow the
        // control page and the sleeper counts.
        self.segment
            .base()
            .wrapping_add(self.posts + self.post_index(rank, round) * self.stride)
    }

    fn post(&self, rank: usize, round: u64) -> PostAt<'_> {
        PostAt {
            base: self.post_base(rank, round),
            board: std::marker::PhantomData,
        }
    }

    fn header(&self, rank: usize, round: u64, word: usize) -> &AtomicU32 {
        self.post(rank, round).word(word)
    }

    /// How many waiters sleep on `rank`'s post of `round`.
    fn sleepers(&self, rank: usize, round: u64) -> &AtomicU32 {
        // SAFETY: the counts follow the control page, one aligned word per
        // post, only accessed atomically.
        unsafe {
            &*self
                .segment
                .base()
                .add(CONTROL)
                .cast::<AtomicU32>()
                .add(self.post_index(rank, round))
        }
    }

    fn control(&self, word: usize) -> &AtomicU32 {
        // SAFETY: the control page starts the page-aligned mapping and its
        // first words are only accessed atomically.
        unsafe { &*self.segment.base().cast::<AtomicU32>().add(word) }
    }

    /// Where `rank` writes its post of `round`: [`Board::capacity`] bytes,
    /// 32-byte aligned. Write it only between starting the round and
    /// [`Board::publish`].
    pub fn post_data(&self, rank: usize, round: u64) -> *mut u8 {
        self.post_base(rank, round).wrapping_add(HEADER)
    }

    /// Makes `rank`'s post of `round` (`len` bytes, already written)
    /// visible to the peers. Peers parked on it are woken by
    /// [`Board::wake_readers`], which the poster must call before it waits
    /// on anything: kept apart so that the post's line can travel while
    /// the poster goes on to read its peers' posts, rather than stalling
    /// the poster on the fence a wake-up decision needs.
    pub fn publish(&self, rank: usize, round: u64, tag: Tag, len: usize) {
        assert!(
            len <= self.capacity,
            "a post of {len} bytes overflows the board"
        );
        let post = self.post(rank, round);
        post.word(TAG_CALL).store(tag.call, Ordering::Relaxed);
        post.word(TAG_COUNT).store(tag.count, Ordering::Relaxed);
        // Released after the call's words, for `latest_calls`.
        post.word(TAG_SEQ).store(tag.seq, Ordering::Release);
        post.word(LEN).store(len as u32, Ordering::Relaxed);
        post.word(ROUND).store(round as u32, Ordering::Release);
    }

    /// Wakes the peers parked on `rank`'s post of `round`, if any.
    pub fn wake_readers(&self, rank: usize, round: u64) {
        // The fence orders the post's round store before the sleeper
        // count's load, against a waiter's count increment (SeqCst) before
        // its futex wait: either the waiter's wait sees the new round, or
        // this load sees the waiter.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleepers(rank, round).load(Ordering::Relaxed) != 0 {
            futex::wake_all(self.post(rank, round).word(ROUND));
        }
    }

    /// `peer`'s post of `round`, or where to park until it comes.
    pub fn read(&self, peer: usize, round: u64) -> Result<Post, ParkOn<'_>> {
        let post = self.post(peer, round);
        let word = post.word(ROUND);
        let seen = word.load(Ordering::Acquire);
        if seen != round as u32 {
            return Err(ParkOn {
                word,
                seen,
                sleepers: Some(self.sleepers(peer, round)),
            });
        }
        let tag = Tag {
            seq: post.word(TAG_SEQ).load(Ordering::Relaxed),
            call: post.word(TAG_CALL).load(Ordering::Relaxed),
            count: post.word(TAG_COUNT).load(Ordering::Relaxed),
        };
        let len = (post.word(LEN).load(Ordering::Relaxed) as usize).min(self.capacity);
        Ok(Post {
            tag,
            len,
            data: post.data(),
        })
    }

    /// The call `peer` posted as its operation `seq`, if one of its two
    /// latest posts is that operation: for telling a peer that runs another
    /// call than this rank apart from a slow one. Consistent while the peer
    /// posts: the sequence number is read first, with acquire, and written
    /// last, with release.
    pub fn posted_call(&self, peer: usize, seq: u32) -> Option<Tag> {
        [0, 1].into_iter().find_map(|parity| {
            if self.header(peer, parity, ROUND).load(Ordering::Acquire) == 0 {
                return None;
            }
            let posted = self.header(peer, parity, TAG_SEQ).load(Ordering::Acquire);
            (posted == seq).then(|| Tag {
                seq,
                call: self.header(peer, parity, TAG_CALL).load(Ordering::Relaxed),
                count: self.header(peer, parity, TAG_COUNT).load(Ordering::Relaxed),
            })
        })
    }

    /// Gives up on the board, leaving `note` (the first closer's only) for
    /// every peer, and wakes every waiter. Also removes the board's name if
    /// a peer has yet to map it: a closed board serves no more calls, and a
    /// process that exits without dropping it would otherwise leave the
    /// name in `/dev/shm`.
    pub fn close_with(&self, note: &str) {
        // Already gone once every peer mapped it (ENOENT then).
        let _ = self.segment.unlink();
        if self
            .control(CLOSED)
            .compare_exchange(OPEN, WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let note = bounded_note(note).as_bytes();
            // SAFETY: the note area (NOTE_TEXT + MAX_NOTE bytes) lies inside
            // the control page; only the winner of the exchange above writes
            // it, once, and readers read it only after NOTED is published.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    note.as_ptr(),
                    self.segment.base().add(NOTE_TEXT),
                    note.len(),
                )
            };
            self.control(NOTE_LEN)
                .store(note.len() as u32, Ordering::Relaxed);
            self.control(CLOSED).store(NOTED, Ordering::Release);
        }
        for rank in 0..self.nranks {
            for round in [0, 1] {
                futex::wake_all(self.header(rank, round, ROUND));
            }
        }
    }

    /// The note of the rank that closed the board, once it is readable.
    pub fn note(&self) -> Option<String> {
        if self.control(CLOSED).load(Ordering::Acquire) != NOTED {
            return None;
        }
        let len = (self.control(NOTE_LEN).load(Ordering::Relaxed) as usize).min(MAX_NOTE);
        // SAFETY: the closer wrote `len` bytes before publishing NOTED; the
        // area holds MAX_NOTE bytes.
        let bytes = unsafe { std::slice::from_raw_parts(self.segment.base().add(NOTE_TEXT), len) };
        Some(String::from_utf8_lossy(bytes).into_owned())
    }
}

const _: () = assert!(NOTE_TEXT + MAX_NOTE <= CONTROL);

/// One post of a board, located once for several accesses to its header.
#[derive(Clone, Copy)]
struct PostAt<'a> {
    base: *mut u8,
    board: std::marker::PhantomData<&'a Board>,
}

impl<'a> PostAt<'a> {
    /// Word `word` of the post's header.
    fn word(self, word: usize) -> &'a AtomicU32 {
        // SAFETY: `base` is a post's base inside the mapping (only
        // `Board::post` makes a `PostAt`), 128-byte aligned; header words
        // are only accessed atomically; the mapping lives as long as the
        // board borrowed for 'a.
        unsafe { &*self.base.cast::<AtomicU32>().add(word) }
    }

    /// The post's data, right after its header.
    fn data(self) -> *mut u8 {
        self.base.wrapping_add(HEADER)
    }
}

/// Bytes from one post to the next: header and data, rounded up.
fn stride(capacity: usize) -> usize {
    (HEADER + capacity).div_ceil(POST_ALIGN) * POST_ALIGN
}

/// Bytes of the sleeper counts, one word per post, rounded up.
fn sleepers_bytes(nranks: usize) -> usize {
    (nranks * 2 * 4).div_ceil(POST_ALIGN) * POST_ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(seq: u32) -> Tag {
        Tag {
            seq,
            call: 7,
            count: 3,
        }
    }

    #[test]
    fn posts_alternate_and_carry_their_tag() {
        let a = Board::create(2, 256).unwrap();
        let b = Board::open(a.name(), 2, 256).unwrap();
        for seq in 0..5u32 {
            let (ra, rb) = (a.next_round(), b.next_round());
            assert_eq!(ra, rb);
            assert!(
                b.read(0, ra).is_err(),
                "round {ra} read before it was posted"
            );
            // SAFETY: the post holds 256 bytes; nobody reads it before publish.
            unsafe { a.post_data(0, ra).write_bytes(seq as u8 + 1, 100) };
            a.publish(0, ra, tag(seq), 100);
            a.wake_readers(0, ra);
            let post = b.read(0, rb).unwrap();
            assert_eq!((post.tag, post.len), (tag(seq), 100));
            // SAFETY: the post was published with 100 bytes.
            let bytes = unsafe { std::slice::from_raw_parts(post.data, 100) };
            assert!(bytes.iter().all(|&x| x == seq as u8 + 1));
            // The other parity still holds the previous round, not this one.
            assert!(b.read(0, rb + 1).is_err());
        }
    }

    #[test]
    fn the_last_peer_to_map_the_board_removes_its_name() {
        let a = Board::create(3, 64).unwrap();
        let path = std::path::Path::new("/dev/shm").join(a.name().trim_start_matches('/'));
        assert!(path.exists(), "{path:?} missing after create");
        let _b = Board::open(a.name(), 3, 64).unwrap();
        assert!(
            path.exists(),
            "{path:?} removed before every peer mapped it"
        );
        let _c = Board::open(a.name(), 3, 64).unwrap();
        assert!(!path.exists(), "{path:?} left after every peer mapped it");
    }

    #[test]
    fn closing_a_board_a_peer_never_mapped_removes_its_name() {
        let a = Board::create(2, 64).unwrap();
        let path = std::path::Path::new("/dev/shm").join(a.name().trim_start_matches('/'));
        assert!(path.exists(), "{path:?} missing after create");
        a.close_with("rank 0 timed out");
        assert!(!path.exists(), "{path:?} left after the board closed");
        // Leaked as a process that exits without dropping it would.
        std::mem::forget(a);
    }

    #[test]
    fn a_parked_reader_is_woken_by_the_post() {
        // The reader parks the way waiters do, but for far longer than any
        // backoff would: only the poster's wake-up can end its wait early.
        let board = std::sync::Arc::new(Board::create(2, 64).unwrap());
        let reader = {
            let board = board.clone();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                loop {
                    match board.read(1, 1) {
                        Ok(post) => return (post.tag, started.elapsed()),
                        Err(park) => {
                            let sleepers = park.sleepers.unwrap();
                            sleepers.fetch_add(1, Ordering::SeqCst);
                            futex::wait(park.word, park.seen, std::time::Duration::from_secs(30));
                            sleepers.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        board.publish(1, 1, tag(9), 0);
        board.wake_readers(1, 1);
        let (tag_read, waited) = reader.join().unwrap();
        assert_eq!(tag_read, tag(9));
        assert!(
            waited < std::time::Duration::from_secs(10),
            "woken after {waited:?}"
        );
    }

    #[test]
    fn the_first_closing_note_wins() {
        let a = Board::create(3, 64).unwrap();
        let b = Board::open(a.name(), 3, 64).unwrap();
        assert_eq!(b.note(), None);
        a.close_with("rank 0 failed: out of memory");
        b.close_with("rank 1 failed too");
        assert_eq!(b.note().as_deref(), Some("rank 0 failed: out of memory"));
        assert_eq!(a.note().as_deref(), Some("rank 0 failed: out of memory"));
    }

    #[test]
    fn a_board_of_another_shape_is_refused() {
        let a = Board::create(2, 64).unwrap();
        assert!(Board::open(a.name(), 4, 64).is_err());
    }
}
