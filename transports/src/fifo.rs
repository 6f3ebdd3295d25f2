//! The slot FIFO every connection is made of.
//!
//! One producer fills slots and publishes them by advancing `tail`; one
//! consumer reads them and frees them by advancing `head` (NCCL's Simple
//! protocol). The header and the slots live in one block of memory that may
//! be private heap memory (the network transport's staging buffers, read and
//! written by a proxy thread) or a shared mapping written directly by a peer
//! in another process.
//!
//! Publication is release/acquire on `tail` and `head`; both counters double
//! as futex words so either side can park until the other moves. A side
//! that parks announces itself in `sleepers`, so the other side makes the
//! wake-up system call only when someone sleeps.

use std::alloc::{self, Layout};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::futex;
use crate::wait::ParkOn;

/// Most slots a FIFO may have (NCCL uses 8 steps).
pub const MAX_SLOTS: usize = 16;
/// Alignment of the header and of each slot.
const ALIGN: usize = 4096;

/// No error: the connection is open.
pub const OPEN: u32 = 0;
/// The connection was closed or failed; both sides must stop.
pub const FAILED: u32 = 1;

#[repr(C, align(64))]
struct CacheLine(AtomicU32);

/// The control block at the start of a FIFO's memory.
#[repr(C)]
struct Header {
    tail: CacheLine,
    head: CacheLine,
    sleepers: CacheLine,
    state: CacheLine,
    sizes: [AtomicU32; MAX_SLOTS],
}

/// Memory that holds one FIFO: its header, then its slots.
pub trait FifoMemory: Send + Sync {
    /// The first byte; aligned to 4096 and valid for [`FifoMemory::len`]
    /// bytes for as long as the memory lives.
    fn base(&self) -> *mut u8;
    /// Size of the block in bytes.
    fn len(&self) -> usize;
    /// Whether the block is empty (never, for a usable FIFO).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Zeroed, page-aligned heap memory.
pub struct HeapMemory {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: HeapMemory owns its allocation exclusively; all access to the bytes
// goes through the FIFO protocol's atomics, which order it between threads.
unsafe impl Send for HeapMemory {}
// SAFETY: as above; shared references only hand out the raw base pointer.
unsafe impl Sync for HeapMemory {}

impl HeapMemory {
    /// Allocates `len` zeroed bytes aligned to 4096.
    pub fn new(len: usize) -> HeapMemory {
        let layout = Layout::from_size_align(len.max(ALIGN), ALIGN).expect("FIFO layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        HeapMemory { ptr, layout }
    }
}

impl Drop for HeapMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this same layout.
        unsafe { alloc::dealloc(self.ptr, self.layout) }
    }
}

impl FifoMemory for HeapMemory {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

/// Bytes a FIFO of `nslots` slots of `slot_bytes` each needs.
pub fn fifo_bytes(nslots: usize, slot_bytes: usize) -> usize {
    header_bytes() + nslots * round_up(slot_bytes, ALIGN)
}

fn header_bytes() -> usize {
    round_up(std::mem::size_of::<Header>(), ALIGN)
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// A handle on a FIFO; the producer and the consumer each hold one.
#[derive(Clone)]
pub struct Fifo {
    mem: Arc<dyn FifoMemory>,
    nslots: u32,
    slot_bytes: usize,
    slot_stride: usize,
}

impl std::fmt::Debug for Fifo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fifo")
            .field("nslots", &self.nslots)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

impl Fifo {
    /// A FIFO in private heap memory.
    pub fn on_heap(nslots: usize, slot_bytes: usize) -> Fifo {
        let mem = Arc::new(HeapMemory::new(fifo_bytes(nslots, slot_bytes)));
        Fifo::in_memory(mem, nslots, slot_bytes)
    }

    /// A FIFO laid out in `mem`, which must be zeroed when first used and at
    /// least [`fifo_bytes`] long.
    pub fn in_memory(mem: Arc<dyn FifoMemory>, nslots: usize, slot_bytes: usize) -> Fifo {
        assert!((1..=MAX_SLOTS).contains(&nslots), "FIFO slot count");
        assert!(slot_bytes > 0, "FIFO slot size");
        assert!(
            mem.len() >= fifo_bytes(nslots, slot_bytes),
            "FIFO memory too small"
        );
        assert_eq!(mem.base() as usize % ALIGN, 0, "FIFO memory alignment");
        Fifo {
            mem,
            nslots: nslots as u32,
            slot_bytes,
            slot_stride: round_up(slot_bytes, ALIGN),
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: the memory is at least `fifo_bytes` long and 4096-aligned
        // (checked in `in_memory`), so a Header fits at its start; Header is
        // all atomics, for which any bit pattern (zero at creation) is valid,
        // and the memory lives as long as `self.mem`.
        unsafe { &*(self.mem.base() as *const Header) }
    }

    fn slot_ptr(&self, counter: u32) -> *mut u8 {
        let index = (counter % self.nslots) as usize;
        // SAFETY: index < nslots and the block holds nslots strides after the
        // header, so the offset stays inside the allocation.
        unsafe {
            self.mem
                .base()
                .add(header_bytes() + index * self.slot_stride)
        }
    }

    /// Capacity of one slot in bytes.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Number of slots.
    pub fn nslots(&self) -> usize {
        self.nslots as usize
    }

    /// Whether the connection has failed or been closed.
    pub fn failed(&self) -> bool {
        self.header().state.0.load(Ordering::Acquire) != OPEN
    }

    /// Marks the connection failed and wakes both sides.
    pub fn fail(&self) {
        let header = self.header();
        header.state.0.store(FAILED, Ordering::Release);
        // Bump both counters' futex words' neighbours by waking them: a
        // parked waiter re-checks `failed()` after every wake-up.
        futex::wake_all(&header.tail.0);
        futex::wake_all(&header.head.0);
    }

    // ---- producer side ----

    /// The next free slot, if the consumer has left one.
    pub fn try_reserve(&self) -> Option<*mut u8> {
        let header = self.header();
        let tail = header.tail.0.load(Ordering::Relaxed);
        let head = header.head.0.load(Ordering::Acquire);
        if tail.wrapping_sub(head) < self.nslots {
            Some(self.slot_ptr(tail))
        } else {
            None
        }
    }

    /// Publishes the reserved slot holding `len` bytes.
    pub fn publish(&self, len: usize) {
        debug_assert!(len <= self.slot_bytes);
        let header = self.header();
        let tail = header.tail.0.load(Ordering::Relaxed);
        header.sizes[(tail % self.nslots) as usize].store(len as u32, Ordering::Relaxed);
        header.tail.0.store(tail.wrapping_add(1), Ordering::SeqCst);
        if header.sleepers.0.load(Ordering::SeqCst) != 0 {
            futex::wake_all(&header.tail.0);
        }
    }

    /// Where a producer waiting for a free slot parks.
    pub fn producer_park(&self) -> ParkOn<'_> {
        let header = self.header();
        ParkOn {
            word: &header.head.0,
            seen: header.head.0.load(Ordering::Acquire),
            sleepers: Some(&header.sleepers.0),
        }
    }

    // ---- consumer side ----

    /// The oldest published slot and its length, if any.
    pub fn try_peek(&self) -> Option<(*const u8, usize)> {
        let header = self.header();
        let head = header.head.0.load(Ordering::Relaxed);
        let tail = header.tail.0.load(Ordering::Acquire);
        if tail != head {
            let len = header.sizes[(head % self.nslots) as usize].load(Ordering::Relaxed) as usize;
            Some((self.slot_ptr(head) as *const u8, len.min(self.slot_bytes)))
        } else {
            None
        }
    }

    /// Frees the oldest published slot.
    pub fn release(&self) {
        let header = self.header();
        let head = header.head.0.load(Ordering::Relaxed);
        header.head.0.store(head.wrapping_add(1), Ordering::SeqCst);
        if header.sleepers.0.load(Ordering::SeqCst) != 0 {
            futex::wake_all(&header.head.0);
        }
    }

    /// Where a consumer waiting for data parks.
    pub fn consumer_park(&self) -> ParkOn<'_> {
        let header = self.header();
        ParkOn {
            word: &header.tail.0,
            seen: header.tail.0.load(Ordering::Acquire),
            sleepers: Some(&header.sleepers.0),
        }
    }

    /// Whether every published slot has been consumed.
    pub fn is_drained(&self) -> bool {
        let header = self.header();
        header.tail.0.load(Ordering::Acquire) == header.head.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use crate::wait::Backoff;

    #[test]
    fn slots_flow_in_order_between_threads() {
        let fifo = Fifo::on_heap(4, 64);
        let consumer = fifo.clone();
        let abort = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(10);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut backoff = Backoff::new();
                for i in 0..1000u32 {
                    let slot = loop {
                        match fifo.try_reserve() {
                            Some(slot) => break slot,
                            None => backoff
                                .snooze(Some(fifo.producer_park()), deadline, &abort)
                                .unwrap(),
                        }
                    };
                    // SAFETY: the slot is 64 bytes and reserved for us.
                    unsafe { slot.cast::<u32>().write(i) };
                    fifo.publish(4);
                }
            });
            let mut backoff = Backoff::new();
            for i in 0..1000u32 {
                let (slot, len) = loop {
                    match consumer.try_peek() {
                        Some(found) => break found,
                        None => backoff
                            .snooze(Some(consumer.consumer_park()), deadline, &abort)
                            .unwrap(),
                    }
                };
                assert_eq!(len, 4);
                // SAFETY: the slot was published with 4 bytes.
                assert_eq!(unsafe { slot.cast::<u32>().read() }, i);
                consumer.release();
            }
        });
        assert!(fifo.is_drained());
    }

    #[test]
    fn full_fifo_refuses_reservation_until_release() {
        let fifo = Fifo::on_heap(2, 8);
        for _ in 0..2 {
            assert!(fifo.try_reserve().is_some());
            fifo.publish(8);
        }
        assert!(fifo.try_reserve().is_none());
        fifo.release();
        assert!(fifo.try_reserve().is_some());
    }

    #[test]
    fn failure_is_seen_by_both_handles() {
        let fifo = Fifo::on_heap(2, 8);
        let other = fifo.clone();
        assert!(!other.failed());
        fifo.fail();
        assert!(other.failed());
    }
}
