//! The request state machine every provider drives alike: each
//! communicator side's requests in posting order, where each request is
//! ([`OpState`]), the admission of a new one, and `test`, which moves the
//! side along, then claims a finished request once. A request handle
//! dropped unclaimed leaves its request to finish without anyone asking.
//!
//! No I/O happens here: a provider's side moves its bytes in
//! [`Side::progress`] and says what finished with [`OpState::finish`].

use std::collections::VecDeque;
use std::ops::{Deref, Index, IndexMut};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{NetError, Sizes};

/// A communicator side's requests not yet retired, in posting order.
/// Requests are numbered from 0 as they are posted; request `id` is at
/// position `id - first_id`. Indexing is by position.
pub(crate) struct Posted<T> {
    ops: VecDeque<T>,
    first_id: u64,
}

impl<T> Posted<T> {
    pub(crate) fn new() -> Posted<T> {
        Posted {
            ops: VecDeque::new(),
            first_id: 0,
        }
    }

    /// Queues a request; its id.
    pub(crate) fn push(&mut self, op: T) -> u64 {
        self.ops.push_back(op);
        self.next_id() - 1
    }

    /// The id the next request posted will get.
    pub(crate) fn next_id(&self) -> u64 {
        self.first_id + self.ops.len() as u64
    }

    /// Request `id`, which must not be retired yet.
    pub(crate) fn get_mut(&mut self, id: u64) -> &mut T {
        let at = (id - self.first_id) as usize;
        &mut self.ops[at]
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.ops.iter_mut()
    }

    /// Forgets the requests at the front for which `done` holds (nobody
    /// will ask about them again); how many it forgot.
    pub(crate) fn retire(&mut self, done: impl Fn(&T) -> bool) -> usize {
        let mut retired = 0;
        while self.ops.front().is_some_and(&done) {
            self.ops.pop_front();
            self.first_id += 1;
            retired += 1;
        }
        retired
    }
}

impl<T> Deref for Posted<T> {
    type Target = VecDeque<T>;

    fn deref(&self) -> &VecDeque<T> {
        &self.ops
    }
}

impl<T> Index<usize> for Posted<T> {
    type Output = T;

    fn index(&self, at: usize) -> &T {
        &self.ops[at]
    }
}

impl<T> IndexMut<usize> for Posted<T> {
    fn index_mut(&mut self, at: usize) -> &mut T {
        &mut self.ops[at]
    }
}

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpState {
    /// Not all moved yet.
    Pending,
    /// Moved; `test` has not said so yet.
    Done,
    /// `test` said so, or nobody will ask (the request was dropped).
    Spent,
    /// Dropped before it was done: spent once done.
    Abandoned,
}

impl OpState {
    /// All of it moved.
    pub(crate) fn finish(&mut self) {
        *self = match *self {
            OpState::Abandoned => OpState::Spent,
            _ => OpState::Done,
        };
    }

    /// Its request was dropped.
    pub(crate) fn drop_request(&mut self) {
        *self = match *self {
            OpState::Pending => OpState::Abandoned,
            _ => OpState::Spent,
        };
    }
}

/// One side of a communicator (sending or receiving) as the state machine
/// sees it: its requests, and the provider's hooks for moving bytes and
/// saying what a finished request reports.
pub(crate) trait Side {
    /// One request of this side.
    type Op;

    /// The side's requests not yet retired.
    fn posted(&self) -> &Posted<Self::Op>;
    fn posted_mut(&mut self) -> &mut Posted<Self::Op>;
    /// Where `op` is.
    fn op_state(op: &mut Self::Op) -> &mut OpState;
    /// What `test` reports for `op` once it is done.
    fn sizes(op: &Self::Op) -> Sizes;
    /// Moves what can move now, without blocking (the provider's I/O).
    fn progress(&mut self);
    /// Why pending requests cannot complete, if they cannot.
    fn broken(&self) -> Option<NetError>;
    /// Forgets the spent requests at the front.
    fn retire(&mut self);

    /// Whether a new request may be posted: not on a broken side, nor
    /// beyond `limit` requests in flight.
    fn admit(&self, limit: usize) -> Result<(), NetError> {
        if let Some(broken) = self.broken() {
            return Err(broken);
        }
        if self.posted().len() >= limit {
            return Err(NetError::TooManyRequests { limit });
        }
        Ok(())
    }

    /// `test` of request `id`: moves the side along, then its sizes once
    /// it is done (it is then spent), `None` while pending, else why the
    /// side cannot finish it.
    fn test(&mut self, id: u64) -> Result<Option<Sizes>, NetError> {
        self.progress();
        let op = self.posted_mut().get_mut(id);
        if *Self::op_state(op) != OpState::Done {
            return self.broken().map_or(Ok(None), Err);
        }
        *Self::op_state(op) = OpState::Spent;
        let sizes = Self::sizes(op);
        self.retire();
        Ok(Some(sizes))
    }

    /// Request `id` was dropped before `test` said it was done.
    fn drop_request(&mut self, id: u64) {
        Self::op_state(self.posted_mut().get_mut(id)).drop_request();
        self.retire();
    }
}

/// What a request is: a send or receive on a side, by id, or a flush,
/// which has nothing to wait for.
pub(crate) enum Kind<S, R> {
    Send(Arc<Mutex<S>>, u64),
    Recv(Arc<Mutex<R>>, u64),
    Flush,
}

/// A send, receive or flush in flight on a provider whose sides are `S`
/// (sending) and `R` (receiving).
pub(crate) struct Request<S: Side, R: Side> {
    pub(crate) kind: Kind<S, R>,
    /// `test` said it was done.
    spent: bool,
}

impl<S: Side, R: Side> Request<S, R> {
    pub(crate) fn new(kind: Kind<S, R>) -> Request<S, R> {
        Request { kind, spent: false }
    }

    /// `test`: the request's sizes once done, `None` while pending; an
    /// error if it was already reported done or its side failed.
    pub(crate) fn test(&mut self) -> Result<Option<Sizes>, NetError> {
        super::checks::check_unspent(self.spent)?;
        let sizes = match &self.kind {
            Kind::Send(side, id) => side.lock().test(*id)?,
            Kind::Recv(side, id) => side.lock().test(*id)?,
            Kind::Flush => Some(Sizes::new(&[])),
        };
        self.spent = sizes.is_some();
        Ok(sizes)
    }
}

impl<S: Side, R: Side> Drop for Request<S, R> {
    fn drop(&mut self) {
        if self.spent {
            return;
        }
        match &self.kind {
            Kind::Send(side, id) => side.lock().drop_request(*id),
            Kind::Recv(side, id) => side.lock().drop_request(*id),
            Kind::Flush => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A side whose bytes move when the test says so.
    struct Fake {
        ops: Posted<(usize, OpState)>,
        failed: Option<NetError>,
        /// Requests `progress` finishes, by id.
        finishes: Vec<u64>,
    }

    impl Side for Fake {
        type Op = (usize, OpState);

        fn posted(&self) -> &Posted<(usize, OpState)> {
            &self.ops
        }

        fn posted_mut(&mut self) -> &mut Posted<(usize, OpState)> {
            &mut self.ops
        }

        fn op_state(op: &mut (usize, OpState)) -> &mut OpState {
            &mut op.1
        }

        fn sizes(op: &(usize, OpState)) -> Sizes {
            Sizes::new(&[op.0])
        }

        fn progress(&mut self) {
            for id in std::mem::take(&mut self.finishes) {
                self.ops.get_mut(id).1.finish();
            }
            self.retire();
        }

        fn broken(&self) -> Option<NetError> {
            self.failed.clone()
        }

        fn retire(&mut self) {
            self.ops.retire(|op| op.1 == OpState::Spent);
        }
    }

    type FakeRequest = Request<Fake, Fake>;

    fn side() -> Arc<Mutex<Fake>> {
        Arc::new(Mutex::new(Fake {
            ops: Posted::new(),
            failed: None,
            finishes: Vec::new(),
        }))
    }

    fn post(side: &Arc<Mutex<Fake>>, size: usize) -> FakeRequest {
        let id = side.lock().ops.push((size, OpState::Pending));
        Request::new(Kind::Send(side.clone(), id))
    }

    #[test]
    fn a_request_is_claimed_once_when_done_and_retired_in_order() {
        let side = side();
        let (mut first, mut second) = (post(&side, 10), post(&side, 20));
        assert!(first.test().unwrap().is_none());
        side.lock().finishes.push(1);
        assert_eq!(second.test().unwrap().unwrap(), Sizes::new(&[20]));
        assert!(second.test().is_err(), "tested after it was done");
        // The second is spent, but waits behind the first to be retired.
        assert_eq!(side.lock().ops.len(), 2);
        side.lock().finishes.push(0);
        assert_eq!(first.test().unwrap().unwrap(), Sizes::new(&[10]));
        assert_eq!(side.lock().ops.len(), 0);
        assert_eq!(side.lock().ops.next_id(), 2);
    }

    #[test]
    fn a_request_dropped_unclaimed_finishes_without_anyone_asking() {
        let side = side();
        drop(post(&side, 1));
        assert_eq!(side.lock().ops[0].1, OpState::Abandoned);
        side.lock().finishes.push(0);
        side.lock().progress();
        assert!(side.lock().ops.is_empty());
        // Dropped once done: spent at once.
        let done = post(&side, 2);
        side.lock().finishes.push(1);
        side.lock().progress();
        drop(done);
        assert!(side.lock().ops.is_empty());
    }

    #[test]
    fn a_broken_side_fails_pending_requests_and_admits_none() {
        let side = side();
        let mut pending = post(&side, 1);
        assert!(side.lock().admit(1).is_err(), "one in flight is the limit");
        assert!(side.lock().admit(2).is_ok());
        let failure = NetError::Aborted { peer: "p".into() };
        side.lock().failed = Some(failure.clone());
        assert_eq!(pending.test().unwrap_err(), failure);
        assert_eq!(side.lock().admit(2).unwrap_err(), failure);
    }

    #[test]
    fn a_flush_is_done_at_once() {
        let mut flush = FakeRequest::new(Kind::Flush);
        assert_eq!(flush.test().unwrap().unwrap(), Sizes::new(&[]));
        assert!(flush.test().is_err());
    }
}
