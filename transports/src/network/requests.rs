//! The request bookkeeping every provider keeps alike: each communicator
//! side's requests in posting order, and the request handle that `test`
//! claims and that, dropped unclaimed, leaves its request to finish
//! without anyone asking.

use std::collections::VecDeque;
use std::ops::{Deref, Index, IndexMut};
use std::sync::Arc;

use parking_lot::Mutex;

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

/// The state of one side of a communicator, which its requests point to.
pub(crate) trait Side {
    /// Request `id` was dropped before `test` said it was done.
    fn drop_request(&mut self, id: u64);
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
    pub(crate) spent: bool,
}

impl<S: Side, R: Side> Request<S, R> {
    pub(crate) fn new(kind: Kind<S, R>) -> Request<S, R> {
        Request { kind, spent: false }
    }
}

impl<S: Side, R: Side> Drop for Request<S, R> {
    fn drop(&mut self) {
        if self.spent {
            return;
        }
        match &self.kind {
            Kind::Send(state, id) => state.lock().drop_request(*id),
            Kind::Recv(state, id) => state.lock().drop_request(*id),
            Kind::Flush => {}
        }
    }
}
