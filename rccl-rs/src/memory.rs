//! What a communicator holds in memory: one [`Ledger`] per communicator
//! that every allocation it keeps is entered in (connection FIFOs, the
//! board, device FIFOs, staging and work buffers, windows), each as a
//! [`Hold`] whose drop gives its bytes back. The ledger answers
//! `ncclCommMemStats`, refuses an allocation past the communicator's
//! limit (`NCCL_MAX_MEM_BYTES`) naming what asked, and logs each entry
//! under `NCCL_DEBUG_SUBSYS=ALLOC`.
//!
//! Bytes are counted where a rank maps them: a segment both ranks of a
//! pair map counts at each, a network connection's private FIFOs at
//! their side. Host memory counts as device memory does: a communicator
//! on host buffers reports its host allocations in the statistics.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::debug;
use crate::error::{Error, Result};
use crate::types::Executor;

/// What an allocation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Purpose {
    /// A connection's FIFOs (host work, or device work's).
    Fifo,
    /// The board that the ranks of one host post small calls on.
    Board,
    /// Staging: device work's per-channel piece buffers and input copies.
    Staging,
    /// Words device work polls (its abort word).
    WorkTable,
    /// A registered window (`ncclCommWindowRegister`).
    Window,
    /// A registration cache entry (`ncclCommRegister`).
    Registration,
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Purpose::Fifo => "FIFOs",
            Purpose::Board => "board",
            Purpose::Staging => "staging",
            Purpose::WorkTable => "work table",
            Purpose::Window => "window",
            Purpose::Registration => "registration",
        })
    }
}

/// Where the bytes lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    Host,
    Device,
}

/// One allocation as the ledger knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemUse {
    pub purpose: Purpose,
    /// The peer it serves, when it serves one.
    pub peer: Option<usize>,
    /// The executor whose calls use it, when one does.
    pub executor: Option<Executor>,
    pub place: Place,
    pub bytes: u64,
    /// Whether `ncclCommSuspend` releases it (else it persists).
    pub suspendable: bool,
}

impl MemUse {
    /// An allocation for `purpose` of `bytes` in `place`, suspendable,
    /// serving no peer in particular.
    pub fn new(purpose: Purpose, place: Place, bytes: u64) -> MemUse {
        MemUse {
            purpose,
            peer: None,
            executor: None,
            place,
            bytes,
            suspendable: true,
        }
    }

    /// The same, serving `peer`.
    pub fn peer(self, peer: usize) -> MemUse {
        MemUse {
            peer: Some(peer),
            ..self
        }
    }

    /// The same, used by `executor`'s calls.
    pub fn executor(self, executor: Executor) -> MemUse {
        MemUse {
            executor: Some(executor),
            ..self
        }
    }

    /// The same, kept across `ncclCommSuspend`.
    pub fn persistent(self) -> MemUse {
        MemUse {
            suspendable: false,
            ..self
        }
    }
}

impl fmt::Display for MemUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = match self.place {
            Place::Host => "host",
            Place::Device => "device",
        };
        write!(f, "the {} ({place} memory", self.purpose)?;
        if let Some(peer) = self.peer {
            write!(f, ", to rank {peer}")?;
        }
        f.write_str(")")
    }
}

/// The figures of `ncclCommMemStats`, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    /// Held now that a suspend would give back (`ncclStatGpuMemSuspend`).
    pub suspendable: u64,
    /// Held now that a suspend keeps (`ncclStatGpuMemPersist`).
    pub persistent: u64,
    /// Held now, both kinds (`ncclStatGpuMemTotal`).
    pub total: u64,
    /// Whether the communicator is suspended (`ncclStatGpuMemSuspended`).
    pub suspended: bool,
    /// While suspended, what the suspend gave back.
    pub released: u64,
}

/// A communicator's ledger of what it holds.
pub struct Ledger {
    rank: usize,
    /// `NCCL_MAX_MEM_BYTES`: the most bytes the communicator may hold.
    limit: Option<u64>,
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    next: u64,
    entries: HashMap<u64, MemUse>,
    stats: MemStats,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("rank", &self.rank)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Bytes the ledger counts as held until this is dropped.
#[must_use = "the bytes count as held only while the hold lives"]
pub struct Hold {
    ledger: Arc<Ledger>,
    id: u64,
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold").field("id", &self.id).finish()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.ledger.release(self.id);
    }
}

impl Ledger {
    /// The ledger of rank `rank`'s communicator, holding at most `limit`
    /// bytes.
    pub(crate) fn new(rank: usize, limit: Option<u64>) -> Arc<Ledger> {
        Arc::new(Ledger {
            rank,
            limit,
            book: Mutex::new(Book::default()),
        })
    }

    /// Enters `what` as held, or refuses it where the limit would be
    /// passed: the error names what asked, how much, what is held and the
    /// limit. Its bytes count until the [`Hold`] is dropped.
    pub fn hold(self: &Arc<Self>, what: MemUse) -> Result<Hold> {
        let mut book = self.book.lock();
        let held = book.stats.total;
        if let Some(limit) = self.limit {
            if held.saturating_add(what.bytes) > limit {
                return Err(Error::System(format!(
                    "rank {}: {} bytes for {what} refused: the communicator holds {held} bytes \
                     and NCCL_MAX_MEM_BYTES allows {limit}",
                    self.rank, what.bytes
                )));
            }
        }
        let id = book.next;
        book.next += 1;
        book.stats.total += what.bytes;
        if what.suspendable {
            book.stats.suspendable += what.bytes;
        } else {
            book.stats.persistent += what.bytes;
        }
        tracing::info!(
            target: debug::ALLOC,
            "[{}] Allocated {} bytes for {what}, held {} bytes",
            self.rank,
            what.bytes,
            book.stats.total
        );
        book.entries.insert(id, what);
        Ok(Hold {
            ledger: self.clone(),
            id,
        })
    }

    fn release(&self, id: u64) {
        let mut book = self.book.lock();
        let Some(what) = book.entries.remove(&id) else {
            return;
        };
        book.stats.total -= what.bytes;
        if what.suspendable {
            book.stats.suspendable -= what.bytes;
        } else {
            book.stats.persistent -= what.bytes;
        }
        tracing::info!(
            target: debug::ALLOC,
            "[{}] Freed {} bytes of {what}, held {} bytes",
            self.rank,
            what.bytes,
            book.stats.total
        );
    }

    /// The figures now.
    pub fn stats(&self) -> MemStats {
        self.book.lock().stats
    }

    /// What is held, summed by purpose, peer, executor, place and kind,
    /// in that order.
    pub fn breakdown(&self) -> Vec<MemUse> {
        let book = self.book.lock();
        let mut sums: HashMap<_, u64> = HashMap::new();
        for u in book.entries.values() {
            let key = (u.purpose, u.peer, u.executor, u.place, u.suspendable);
            *sums.entry(key).or_default() += u.bytes;
        }
        let mut out: Vec<MemUse> = sums
            .into_iter()
            .map(
                |((purpose, peer, executor, place, suspendable), bytes)| MemUse {
                    purpose,
                    peer,
                    executor,
                    place,
                    bytes,
                    suspendable,
                },
            )
            .collect();
        out.sort_by_key(|u| (u.purpose, u.peer, u.executor, u.place, u.suspendable));
        out
    }

    /// Marks the communicator suspended once what a suspend releases is
    /// gone: `released` bytes were given back.
    pub(crate) fn set_suspended(&self, released: Option<u64>) {
        let mut book = self.book.lock();
        book.stats.suspended = released.is_some();
        book.stats.released = released.unwrap_or(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_count_until_dropped_and_the_limit_refuses_with_the_figures() {
        let ledger = Ledger::new(3, Some(1000));
        let fifo = ledger
            .hold(MemUse::new(Purpose::Fifo, Place::Host, 600).peer(1))
            .unwrap();
        let table = ledger
            .hold(MemUse::new(Purpose::WorkTable, Place::Device, 100).persistent())
            .unwrap();
        let stats = ledger.stats();
        assert_eq!(
            (stats.suspendable, stats.persistent, stats.total),
            (600, 100, 700)
        );
        let err = ledger
            .hold(MemUse::new(Purpose::Board, Place::Host, 301))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "system error: rank 3: 301 bytes for the board (host memory) refused: the \
             communicator holds 700 bytes and NCCL_MAX_MEM_BYTES allows 1000"
        );
        assert_eq!(ledger.breakdown().len(), 2);
        drop(fifo);
        assert_eq!(ledger.stats().total, 100);
        drop(table);
        assert_eq!(ledger.stats(), MemStats::default());
        assert!(ledger.breakdown().is_empty());
    }
}
