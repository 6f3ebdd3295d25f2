//! Calls that differ between ranks yet leave each rank waiting, so that no
//! tagged piece ever shows the difference: a reduce whose ranks disagree on
//! the root, or a first call whose connections a peer never sets up because
//! it runs another call.
//!
//! A rank whose launch has waited [`NOTICE_AFTER`] on a peer tells that
//! peer, through the bootstrap, which calls it runs, and takes it back when
//! the wait ends (nothing is sent by a launch that never waits that long).
//! A launch that fails setting up its connections tells every peer it
//! connects to why. A waiting rank stops with a peer's failure, and
//! compares what its peers told it with its own calls:
//! - a collective of the same sequence number with another call is a
//!   mismatch at once (every rank numbers its collectives alike);
//! - a peer that runs only sends and receives and waits on this rank, while
//!   this rank runs only collectives and waits on that peer (or the other
//!   way round), is a mismatch once both have waited [`DEADLOCK_AFTER`]
//!   with the word not taken back: neither can move before the other.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use rccl_transports::Tag;
use smallvec::SmallVec;

use super::call::{disagreement, P2P_CALL};
use crate::bootstrap::Bootstrap;
use crate::error::Error;

/// How long a launch waits on a peer before telling it.
pub(crate) const NOTICE_AFTER: Duration = Duration::from_millis(200);
/// How long a rank and its peer must both have waited on each other, in
/// calls of different kinds, before this rank calls it a mismatch: the
/// peer's word could be one it is about to take back.
const DEADLOCK_AFTER: Duration = Duration::from_secs(1);
/// Bootstrap tag of stuck notices and their retractions.
const STUCK_TAG: u64 = 4 << 40;
/// The first byte of a notice, of a retraction and of a failure (whose
/// closing note follows).
const NOTICE: u8 = 1;
const RETRACTION: u8 = 0;
const FAILURE: u8 = 2;
/// How long telling a peer may take to connect to it: the word is worth
/// little late, and a peer that cannot be reached is found otherwise.
const CONNECT_WITHIN: Duration = Duration::from_millis(200);

/// How often a wait that has made no progress checks whether the peers it
/// waits for are still alive, and publishes what it waits for.
pub(crate) const STALL_CHECK_EVERY: Duration = Duration::from_millis(100);

/// Prefix of a closing note that says the sender's failure was a usage
/// error every rank shares (ranks disagree on the calls), so receivers
/// report it as one too; other notes become remote errors.
pub(crate) const USAGE_NOTE: &str = "usage|";

/// The error a rank reports when a peer closed a connection with `note`.
pub(crate) fn note_error(note: &str, context: &str) -> Error {
    match note.strip_prefix(USAGE_NOTE) {
        Some(rest) => Error::InvalidUsage(format!("{context}: {rest}")),
        None => Error::Remote(format!("{context}: {note}")),
    }
}

/// The calls a launch runs on one communicator: the tags of its
/// collectives, and whether it sends or receives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    collectives: SmallVec<[Tag; 2]>,
    p2p: bool,
}

impl Calls {
    pub fn add(&mut self, tag: Tag) {
        if tag.call == P2P_CALL {
            self.p2p = true;
        } else if !self.collectives.contains(&tag) {
            self.collectives.push(tag);
        }
    }

    /// Only collectives (`Some(true)`), only sends and receives
    /// (`Some(false)`), or both.
    fn only_collectives(&self) -> Option<bool> {
        match (self.collectives.is_empty(), self.p2p) {
            (false, false) => Some(true),
            (true, true) => Some(false),
            _ => None,
        }
    }

    /// A call to name in a message: the first collective, or Send/Recv.
    pub fn first(&self) -> Tag {
        self.collectives.first().copied().unwrap_or(Tag {
            seq: 0,
            call: P2P_CALL,
            count: 0,
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![NOTICE, u8::from(self.p2p)];
        for tag in &self.collectives {
            for word in [tag.seq, tag.call, tag.count] {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Calls> {
        let (&[NOTICE, p2p], rest) = bytes.split_first_chunk::<2>()? else {
            return None;
        };
        if rest.len() % 12 != 0 || p2p > 1 {
            return None;
        }
        let word = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let collectives = rest
            .chunks_exact(12)
            .map(|t| Tag {
                seq: word(&t[0..4]),
                call: word(&t[4..8]),
                count: word(&t[8..12]),
            })
            .collect();
        Some(Calls {
            collectives,
            p2p: p2p == 1,
        })
    }
}

/// What peers said of the calls they wait in, per communicator: the calls
/// and when this rank first heard them.
#[derive(Default)]
pub(crate) struct Heard(HashMap<usize, (Calls, Instant)>);

/// What the notices need of a communicator.
pub(crate) trait Member {
    /// This rank.
    fn rank(&self) -> usize;
    /// How messages name `rank`.
    fn describe(&self, rank: usize) -> String;
    /// Where notices travel.
    fn bootstrap(&self) -> &Bootstrap;
    /// What waiting peers said, kept between waits.
    fn heard(&self) -> &Mutex<Heard>;
}

/// One launch's word to the peers of one communicator: who was told, so
/// that the word is taken back when the launch ends.
pub(crate) struct Notices<'c> {
    comm: &'c dyn Member,
    told: SmallVec<[usize; 2]>,
    /// What the told peers get when the wait ends: a retraction, or the
    /// launch's failure.
    last_word: Vec<u8>,
}

impl<'c> Notices<'c> {
    pub fn new(comm: &'c dyn Member) -> Notices<'c> {
        Notices {
            comm,
            told: SmallVec::new(),
            last_word: vec![RETRACTION],
        }
    }

    /// Tells the told peers, as the wait ends, that the launch failed, with
    /// the closing `note` its connections get.
    pub fn fail(&mut self, note: &str) {
        let note = rccl_transports::bounded_note(note);
        self.last_word = [&[FAILURE], note.as_bytes()].concat();
    }

    /// Tells `peer`, once per launch, that this rank waits on it in
    /// `calls`. Best effort: a peer that cannot be told is found by the
    /// other checks or the deadline.
    pub fn tell(&mut self, peer: usize, calls: &Calls) {
        if self.told.contains(&peer) {
            return;
        }
        self.told.push(peer);
        let _ = self
            .comm
            .bootstrap()
            .send_within(peer, STUCK_TAG, &calls.encode(), CONNECT_WITHIN);
    }

    /// Counts `peer` among the told without telling it now: it gets the
    /// last word (a failure) when the wait ends.
    pub fn tell_at_end(&mut self, peer: usize) {
        if !self.told.contains(&peer) {
            self.told.push(peer);
        }
    }

    /// Compares what waiting peers said with `mine`, the calls this rank
    /// waits in on `waiting_on` (peers), after waiting `waited`; a peer's
    /// failure comes first.
    pub fn check(&self, mine: &Calls, waiting_on: &[usize], waited: Duration) -> Option<Error> {
        if let Some(failure) = peer_failure(self.comm) {
            return Some(failure);
        }
        let comm = self.comm;
        let heard = comm.heard().lock();
        let now = Instant::now();
        for (&peer, (theirs, since)) in &heard.0 {
            for their in &theirs.collectives {
                if let Some(own) = mine.collectives.iter().find(|t| t.seq == their.seq) {
                    if own != their {
                        return Some(disagreement(*own, &comm.describe(peer), *their));
                    }
                }
            }
            let kinds_differ = matches!(
                (mine.only_collectives(), theirs.only_collectives()),
                (Some(a), Some(b)) if a != b
            );
            if kinds_differ
                && waiting_on.contains(&peer)
                && waited >= DEADLOCK_AFTER
                && now.duration_since(*since) >= DEADLOCK_AFTER
            {
                return Some(disagreement(
                    mine.first(),
                    &comm.describe(peer),
                    theirs.first(),
                ));
            }
        }
        None
    }
}

/// The failure a peer of `comm` told this rank of, if one came (what
/// waiting peers said meanwhile is kept for [`Notices::check`]).
pub(crate) fn peer_failure(comm: &dyn Member) -> Option<Error> {
    let mut heard = comm.heard().lock();
    let now = Instant::now();
    let mut failure = None;
    for (peer, bytes) in comm.bootstrap().take_all(STUCK_TAG) {
        match bytes.split_first() {
            Some((&FAILURE, note)) => {
                failure.get_or_insert((peer, String::from_utf8_lossy(note).into_owned()));
            }
            _ => match Calls::decode(&bytes) {
                Some(calls) => {
                    heard.0.insert(peer, (calls, now));
                }
                None => {
                    heard.0.remove(&peer);
                }
            },
        }
    }
    let (peer, note) = failure?;
    let context = format!("rank {}: word from {}", comm.rank(), comm.describe(peer));
    Some(note_error(&note, &context))
}

/// The failure to report for `error`: when it came from a peer (its
/// connection or its process ended), the failure a peer told this rank
/// of, if one did (a peer that fails, then exits, tells its failure
/// before its sockets close); else `error`.
pub(crate) fn cause(comm: &dyn Member, error: Error) -> Error {
    match error {
        Error::Remote(_) => peer_failure(comm).unwrap_or(error),
        error => error,
    }
}

impl Drop for Notices<'_> {
    fn drop(&mut self) {
        for &peer in &self.told {
            let _ =
                self.comm
                    .bootstrap()
                    .send_within(peer, STUCK_TAG, &self.last_word, CONNECT_WITHIN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn calls_round_trip() {
        let mut calls = Calls::default();
        calls.add(Tag {
            seq: 7,
            call: 0x1234,
            count: 99,
        });
        calls.add(Tag {
            seq: 0,
            call: P2P_CALL,
            count: 0,
        });
        assert_eq!(Calls::decode(&calls.encode()), Some(calls));
        assert_eq!(Calls::decode(&[RETRACTION]), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_notices_decode_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Some(calls) = Calls::decode(&bytes) {
                prop_assert_eq!(calls.encode(), bytes);
            }
        }
    }
}
