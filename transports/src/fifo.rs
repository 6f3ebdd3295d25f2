//! The slot FIFO every connection is made of, and the three protocols that
//! say how a slot carries its bytes and their readiness.
//!
//! One producer fills slots; one consumer reads them and frees them by
//! advancing `head`, which is the producer's credit. The header and the
//! slots live in one block of memory that may be private heap memory (the
//! network transport's staging buffers, moved by a proxy thread) or a
//! shared mapping written directly by a peer in another process.
//!
//! - **Simple**: the producer writes a piece and its [`Tag`] into the slot,
//!   then publishes it by advancing `tail` with release ordering; the
//!   consumer polls `tail`.
//! - **LL** (low latency): the slot is a run of 16-byte lines, each two
//!   8-byte words of (4 data bytes, 4-byte flag). Every word is written in
//!   one store and carries the slot's flag for this use, so the consumer
//!   polls the data itself: a word whose flag matches is valid, with no
//!   separate fence or counter to read. Half the bytes are flags.
//! - **LL128**: 128-byte lines of 120 data bytes and an 8-byte flag written
//!   last with release ordering; the consumer polls each line's flag.
//!
//! LL and LL128 encode from, and decode into, a private staging buffer, so
//! the executor sees the same "reserve, fill, publish" and "peek, read,
//! release" for every protocol. Both counters double as futex words so
//! either side can park until the other moves; a side that parks announces
//! itself in `sleepers`, so the other side makes the wake-up system call
//! only when someone sleeps.

use std::alloc::{self, Layout};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::futex;
use crate::wait::ParkOn;
pub use rccl_algorithms::protocol::{fifo_bytes, Protocol, SLOT_HEADER};
use rccl_algorithms::protocol::{
    FIFO_ALIGN, FIFO_CONTROL_BYTES, LL128_DATA, LL128_LINE, LL_HEADER_WORDS,
};

/// Most slots a FIFO may have (NCCL uses 8 steps).
pub const MAX_SLOTS: usize = 16;

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
}

/// The slots of a connection's FIFOs: how many, and each protocol's
/// payload per slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FifoShape {
    /// Slots per FIFO.
    pub nslots: usize,
    /// Payload bytes per slot, indexed like [`Protocol::ALL`].
    pub slot_bytes: [usize; 3],
}

impl FifoShape {
    /// Payload bytes per slot for `proto`.
    pub fn slot_bytes(&self, proto: Protocol) -> usize {
        self.slot_bytes[proto.index()]
    }
}

/// What a piece says about the call it belongs to, so that a receiver can
/// tell a piece of a different call from one of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tag {
    /// The call's sequence number (low bits).
    pub seq: u32,
    /// The call's kind, datatype, op and root, packed by the engine.
    pub call: u32,
    /// The call's count (low bits).
    pub count: u32,
}

/// Writes a Simple slot's header: the piece's length, then its tag's seq,
/// call and count, each a native-endian `u32`.
///
/// # Safety
/// `slot` is 4-byte aligned and valid for 16 bytes of writes.
pub unsafe fn write_slot_header(slot: *mut u8, len: u32, tag: Tag) {
    let meta = [len, tag.seq, tag.call, tag.count];
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(meta.as_ptr(), slot.cast::<u32>(), 4) };
}

/// Reads what [`write_slot_header`] wrote: the length and the tag.
///
/// # Safety
/// `slot` is 4-byte aligned and valid for 16 bytes of reads.
pub unsafe fn read_slot_header(slot: *const u8) -> (u32, Tag) {
    let mut meta = [0u32; 4];
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(slot.cast::<u32>(), meta.as_mut_ptr(), 4) };
    (
        meta[0],
        Tag {
            seq: meta[1],
            call: meta[2],
            count: meta[3],
        },
    )
}

/// Rung by a FIFO handle after it publishes, releases or fails, for a
/// thread that moves many FIFOs and so cannot park on any one FIFO's
/// words (the network proxy).
pub trait Doorbell: Send + Sync {
    /// Someone moved the FIFO.
    fn ring(&self);
}

/// Memory that holds one FIFO: its control block (counters, state, notes),
/// then its slots, or the two apart.
pub trait FifoMemory: Send + Sync {
    /// The control block; aligned to 4096, and valid for
    /// [`FifoMemory::len`] bytes for as long as the memory lives unless the
    /// slots are elsewhere ([`FifoMemory::slots`]).
    fn base(&self) -> *mut u8;
    /// Size of the FIFO in bytes, control block and slots, as
    /// [`fifo_bytes`] counts them.
    fn len(&self) -> usize;
    /// Whether the block is empty (never, for a usable FIFO).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The first slot, aligned to 64: right after the control block unless
    /// the memory keeps its slots apart (device memory that a network
    /// reads and writes, its counters in host memory the network proxy
    /// reads), [`FifoMemory::len`] minus [`control_bytes`] long.
    fn slots(&self) -> *mut u8 {
        self.base().wrapping_add(control_bytes())
    }
    /// Whether the slots are device memory (a network registers them so).
    fn slots_on_device(&self) -> bool {
        false
    }
    /// Device slots exported as a dma-buf: its descriptor and the slots'
    /// offset in it (a network registers them through the file).
    fn slots_dmabuf(&self) -> Option<(RawFd, u64)> {
        None
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
        let layout = Layout::from_size_align(len.max(FIFO_ALIGN), FIFO_ALIGN).expect("FIFO layout");
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

/// Bytes of a FIFO's control block, in front of its slots.
pub fn control_bytes() -> usize {
    FIFO_CONTROL_BYTES
}

const _: () = assert!(std::mem::size_of::<Header>() <= FIFO_CONTROL_BYTES);

/// A private buffer the LL protocols encode from or decode into.
struct Staging {
    words: Box<[u64]>,
    /// For the consumer: the `head` whose slot the buffer holds decoded,
    /// so a piece peeked twice is decoded once.
    decoded: Option<(u32, usize, Tag)>,
}

impl Staging {
    fn new(bytes: usize) -> Mutex<Staging> {
        Mutex::new(Staging {
            words: vec![0u64; bytes.div_ceil(8)].into_boxed_slice(),
            decoded: None,
        })
    }
}

/// A handle on a FIFO; the producer and the consumer each hold one (or
/// clones of one). Each handle has its own staging buffers.
pub struct Fifo {
    mem: Arc<dyn FifoMemory>,
    proto: Protocol,
    nslots: u32,
    slot_bytes: usize,
    slot_stride: usize,
    produce: Mutex<Staging>,
    consume: Mutex<Staging>,
    doorbell: Option<Arc<dyn Doorbell>>,
}

impl Clone for Fifo {
    fn clone(&self) -> Fifo {
        Fifo::in_memory(
            self.mem.clone(),
            self.proto,
            self.nslots as usize,
            self.slot_bytes,
        )
    }
}

impl std::fmt::Debug for Fifo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fifo")
            .field("proto", &self.proto)
            .field("nslots", &self.nslots)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

impl Fifo {
    /// A FIFO in private heap memory.
    pub fn on_heap(proto: Protocol, nslots: usize, slot_bytes: usize) -> Fifo {
        let mem = Arc::new(HeapMemory::new(fifo_bytes(proto, nslots, slot_bytes)));
        Fifo::in_memory(mem, proto, nslots, slot_bytes)
    }

    /// A FIFO laid out in `mem`, which must be zeroed when first used and at
    /// least [`fifo_bytes`] long.
    pub fn in_memory(
        mem: Arc<dyn FifoMemory>,
        proto: Protocol,
        nslots: usize,
        slot_bytes: usize,
    ) -> Fifo {
        assert!((1..=MAX_SLOTS).contains(&nslots), "FIFO slot count");
        assert!(
            slot_bytes > 0 && slot_bytes.is_multiple_of(8),
            "FIFO slot size"
        );
        assert!(
            mem.len() >= fifo_bytes(proto, nslots, slot_bytes),
            "FIFO memory too small"
        );
        assert_eq!(mem.base() as usize % FIFO_ALIGN, 0, "FIFO memory alignment");
        assert_eq!(mem.slots() as usize % 64, 0, "FIFO slot alignment");
        let staging = if proto == Protocol::Simple {
            0
        } else {
            slot_bytes
        };
        Fifo {
            mem,
            proto,
            nslots: nslots as u32,
            slot_bytes,
            slot_stride: proto.slot_stride(slot_bytes),
            produce: Staging::new(staging),
            consume: Staging::new(staging),
            doorbell: None,
        }
    }

    /// This handle, ringing `doorbell` after each publish, release and
    /// failure made through it (clones of it do not ring).
    pub fn with_doorbell(mut self, doorbell: Arc<dyn Doorbell>) -> Fifo {
        self.doorbell = Some(doorbell);
        self
    }

    fn ring(&self) {
        if let Some(doorbell) = &self.doorbell {
            doorbell.ring();
        }
    }

    /// The protocol of this FIFO.
    pub fn protocol(&self) -> Protocol {
        self.proto
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
        // SAFETY: index < nslots and the slots hold nslots strides, so the
        // offset stays inside them.
        unsafe { self.mem.slots().add(index * self.slot_stride) }
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
        self.ring();
    }

    // ---- producer side ----

    /// Where the next piece is to be written, if the consumer has left a
    /// slot free: the slot's payload (Simple) or the staging buffer.
    pub fn try_reserve(&self) -> Option<*mut u8> {
        let header = self.header();
        let tail = header.tail.0.load(Ordering::Relaxed);
        let head = header.head.0.load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= self.nslots {
            return None;
        }
        Some(match self.proto {
            Protocol::Simple => self.slot_ptr(tail).wrapping_add(SLOT_HEADER),
            Protocol::Ll | Protocol::Ll128 => self.produce.lock().words.as_mut_ptr().cast(),
        })
    }

    /// Publishes the reserved piece of `len` bytes, tagged with `tag`.
    pub fn publish(&self, len: usize, tag: Tag) {
        debug_assert!(len <= self.slot_bytes);
        let header = self.header();
        let tail = header.tail.0.load(Ordering::Relaxed);
        let slot = self.slot_ptr(tail);
        let meta = [len as u32, tag.seq, tag.call, tag.count];
        match self.proto {
            Protocol::Simple => {
                // SAFETY: the slot starts with SLOT_HEADER >= 16 bytes,
                // 64-byte aligned, that only the producer writes until the
                // tail moves past it.
                unsafe { write_slot_header(slot, len as u32, tag) };
            }
            Protocol::Ll => {
                let staging = self.produce.lock();
                // SAFETY: the slot holds LL_HEADER_WORDS + slot_bytes/4
                // words, 64-byte aligned, owned by the producer until
                // published; the staging buffer holds slot_bytes.
                unsafe { ll_encode(slot, &meta, &staging.words, len, tail.wrapping_add(1)) };
            }
            Protocol::Ll128 => {
                let staging = self.produce.lock();
                // SAFETY: as for LL, with 1 + slot_bytes/120 lines.
                unsafe { ll128_encode(slot, &meta, &staging.words, len, tail.wrapping_add(1)) };
            }
        }
        header.tail.0.store(tail.wrapping_add(1), Ordering::SeqCst);
        if header.sleepers.0.load(Ordering::SeqCst) != 0 {
            futex::wake_all(&header.tail.0);
        }
        self.ring();
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

    /// The oldest published piece: where its bytes are, how many, and its
    /// tag.
    pub fn try_peek(&self) -> Option<(*const u8, usize, Tag)> {
        let header = self.header();
        let head = header.head.0.load(Ordering::Relaxed);
        let slot = self.slot_ptr(head);
        let flag = head.wrapping_add(1);
        let tag_of = |meta: [u32; 4]| Tag {
            seq: meta[1],
            call: meta[2],
            count: meta[3],
        };
        match self.proto {
            Protocol::Simple => {
                if header.tail.0.load(Ordering::Acquire) == head {
                    return None;
                }
                // SAFETY: the tail passed this slot, so its header and
                // payload are published and stay put until `release`.
                let (len, tag) = unsafe { read_slot_header(slot) };
                let len = (len as usize).min(self.slot_bytes);
                Some((slot.wrapping_add(SLOT_HEADER) as *const u8, len, tag))
            }
            Protocol::Ll | Protocol::Ll128 => {
                let mut staging = self.consume.lock();
                if let Some((at, len, tag)) = staging.decoded {
                    if at == head {
                        return Some((staging.words.as_ptr().cast(), len, tag));
                    }
                }
                let cap = self.slot_bytes;
                // SAFETY: the slot lies inside the FIFO memory with the
                // protocol's stride; decoding only reads it and writes the
                // staging buffer of slot_bytes.
                let meta = unsafe {
                    match self.proto {
                        Protocol::Ll => ll_decode(slot, &mut staging.words, cap, flag),
                        _ => ll128_decode(slot, &mut staging.words, cap, flag),
                    }
                }?;
                let len = (meta[0] as usize).min(cap);
                staging.decoded = Some((head, len, tag_of(meta)));
                Some((staging.words.as_ptr().cast(), len, tag_of(meta)))
            }
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
        self.ring();
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

    /// For a proxy that moves Simple slots whole: the `k`-th published
    /// piece after the oldest (0: the oldest), as the start of its slot and
    /// the bytes in use ([`SLOT_HEADER`] and the piece). Slots are freed in
    /// order with [`Fifo::release`].
    pub fn peek_slot(&self, k: usize) -> Option<(*const u8, usize)> {
        debug_assert_eq!(self.proto, Protocol::Simple);
        let header = self.header();
        let head = header.head.0.load(Ordering::Relaxed);
        let published = header.tail.0.load(Ordering::Acquire).wrapping_sub(head);
        if published as usize <= k {
            return None;
        }
        let slot = self.slot_ptr(head.wrapping_add(k as u32));
        // SAFETY: the tail passed this slot, so its header is published and
        // stays put until `release`.
        let (len, _) = unsafe { read_slot_header(slot) };
        Some((slot, SLOT_HEADER + (len as usize).min(self.slot_bytes)))
    }

    /// For a proxy that moves Simple slots whole: the start of the `k`-th
    /// free slot after the next one to fill (0: the next), which holds
    /// [`SLOT_HEADER`] + [`Fifo::slot_bytes`] bytes. A slot filled whole,
    /// header included, is published in order with [`Fifo::publish`].
    pub fn reserve_slot(&self, k: usize) -> Option<*mut u8> {
        debug_assert_eq!(self.proto, Protocol::Simple);
        let header = self.header();
        let tail = header.tail.0.load(Ordering::Relaxed);
        let used = tail.wrapping_sub(header.head.0.load(Ordering::Acquire));
        if used as usize + k >= self.nslots as usize {
            return None;
        }
        Some(self.slot_ptr(tail.wrapping_add(k as u32)))
    }

    /// The FIFO's memory, for a producer or consumer outside this process's
    /// handles (device work over a network connection's FIFOs).
    pub fn memory(&self) -> &Arc<dyn FifoMemory> {
        &self.mem
    }

    /// How many pieces have been published since the FIFO was made,
    /// wrapping: a watcher of the consumer compares it with what it saw
    /// move.
    pub fn published(&self) -> u32 {
        self.header().tail.0.load(Ordering::Acquire)
    }

    /// Whether every published slot has been consumed.
    pub fn is_drained(&self) -> bool {
        let header = self.header();
        header.tail.0.load(Ordering::Acquire) == header.head.0.load(Ordering::Acquire)
    }
}

/// Writes an LL slot: the header words (length, seq, call, count), then
/// `len` payload bytes from `data`, four per word, every word paired with
/// `flag` and stored whole. The first header word goes last, with release
/// ordering, so a consumer that sees it sees a complete slot.
///
/// # Safety
/// `slot` is 8-byte aligned and holds `LL_HEADER_WORDS + len/4` words
/// owned by the producer; `data` holds at least `len` bytes.
unsafe fn ll_encode(slot: *mut u8, meta: &[u32; 4], data: &[u64], len: usize, flag: u32) {
    let words = slot.cast::<AtomicU64>();
    let pair = |value: u32| u64::from(value) | (u64::from(flag) << 32);
    let bytes: &[u8] = bytemuck::cast_slice::<u64, u8>(data);
    for (i, chunk) in bytes[..len].chunks(4).enumerate() {
        let mut value = [0u8; 4];
        value[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: word LL_HEADER_WORDS + i is inside the slot (caller).
        unsafe { &*words.add(LL_HEADER_WORDS + i) }
            .store(pair(u32::from_le_bytes(value)), Ordering::Relaxed);
    }
    for (i, &value) in meta.iter().enumerate().skip(1) {
        // SAFETY: header words are inside the slot.
        unsafe { &*words.add(i) }.store(pair(value), Ordering::Relaxed);
    }
    // SAFETY: as above.
    unsafe { &*words }.store(pair(meta[0]), Ordering::Release);
}

/// Reads an LL slot written with `flag` into `out`; `None` while any word
/// of it does not carry the flag yet.
///
/// # Safety
/// `slot` is 8-byte aligned and holds `LL_HEADER_WORDS + cap/4` words.
unsafe fn ll_decode(slot: *const u8, out: &mut [u64], cap: usize, flag: u32) -> Option<[u32; 4]> {
    let words = slot.cast::<AtomicU64>();
    let read = |i: usize| -> Option<u32> {
        // SAFETY: callers only pass indexes inside the slot.
        let word = unsafe { &*words.add(i) }.load(Ordering::Acquire);
        ((word >> 32) as u32 == flag).then_some(word as u32)
    };
    let mut meta = [0u32; 4];
    for (i, value) in meta.iter_mut().enumerate() {
        *value = read(i)?;
    }
    let len = (meta[0] as usize).min(cap);
    let bytes = bytemuck::cast_slice_mut::<u64, u8>(out);
    for i in 0..len.div_ceil(4) {
        let value = read(LL_HEADER_WORDS + i)?.to_le_bytes();
        let end = (i * 4 + 4).min(len);
        bytes[i * 4..end].copy_from_slice(&value[..end - i * 4]);
    }
    Some(meta)
}

/// Writes an LL128 slot: a header line (length, seq, call, count), then
/// `len` payload bytes, 120 per line; each line's flag word is stored
/// last, with release ordering.
///
/// # Safety
/// `slot` is 64-byte aligned and holds `1 + len/120` lines of 128 bytes
/// owned by the producer; `data` holds at least `len` bytes.
unsafe fn ll128_encode(slot: *mut u8, meta: &[u32; 4], data: &[u64], len: usize, flag: u32) {
    let flag_of = |line: usize| {
        // SAFETY: the flag word of a line inside the slot (caller).
        unsafe { &*(slot.add(line * LL128_LINE + LL128_DATA) as *const AtomicU64) }
    };
    let bytes = bytemuck::cast_slice::<u64, u8>(data);
    for (i, chunk) in bytes[..len].chunks(LL128_DATA).enumerate() {
        // SAFETY: line 1 + i is inside the slot; the producer owns it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                chunk.as_ptr(),
                slot.add((1 + i) * LL128_LINE),
                chunk.len(),
            )
        };
        flag_of(1 + i).store(u64::from(flag), Ordering::Release);
    }
    // SAFETY: the header line is inside the slot.
    unsafe { std::ptr::copy_nonoverlapping(meta.as_ptr(), slot.cast::<u32>(), 4) };
    flag_of(0).store(u64::from(flag), Ordering::Release);
}

/// Reads an LL128 slot written with `flag` into `out`; `None` while any
/// line of it does not carry the flag yet.
///
/// # Safety
/// `slot` is 64-byte aligned and holds `1 + cap/120` lines.
unsafe fn ll128_decode(
    slot: *const u8,
    out: &mut [u64],
    cap: usize,
    flag: u32,
) -> Option<[u32; 4]> {
    let ready = |line: usize| {
        // SAFETY: the flag word of a line inside the slot (caller).
        let word = unsafe { &*(slot.add(line * LL128_LINE + LL128_DATA) as *const AtomicU64) };
        word.load(Ordering::Acquire) == u64::from(flag)
    };
    if !ready(0) {
        return None;
    }
    let mut meta = [0u32; 4];
    // SAFETY: the header line's flag matched, so its bytes are published.
    unsafe { std::ptr::copy_nonoverlapping(slot.cast::<u32>(), meta.as_mut_ptr(), 4) };
    let len = (meta[0] as usize).min(cap);
    let bytes = bytemuck::cast_slice_mut::<u64, u8>(out);
    for (i, chunk) in bytes[..len].chunks_mut(LL128_DATA).enumerate() {
        if !ready(1 + i) {
            return None;
        }
        // SAFETY: this line's flag matched, so its data is published.
        unsafe {
            std::ptr::copy_nonoverlapping(
                slot.add((1 + i) * LL128_LINE),
                chunk.as_mut_ptr(),
                chunk.len(),
            )
        };
    }
    Some(meta)
}

/// Which kinds of memory a device sends from and receives into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtrSupport {
    /// Host memory (`NCCL_PTR_HOST`).
    pub host: bool,
    /// CUDA device memory (`NCCL_PTR_CUDA`).
    pub cuda: bool,
    /// Memory exported as a dma-buf file descriptor (`NCCL_PTR_DMABUF`).
    pub dmabuf: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use crate::wait::Backoff;

    fn tag(i: u32) -> Tag {
        Tag {
            seq: i,
            call: i ^ 0x55,
            count: i * 3,
        }
    }

    /// Pieces of every length from 0 to 300 bytes cross between two
    /// threads in order, with their tags, for every protocol.
    #[test]
    fn pieces_flow_in_order_between_threads_for_every_protocol() {
        for proto in Protocol::ALL {
            let fifo = Fifo::on_heap(proto, 4, 304);
            let consumer = fifo.clone();
            let abort = AtomicBool::new(false);
            let deadline = Instant::now() + Duration::from_secs(10);
            let piece = |i: u32| -> Vec<u8> { (0..i % 301).map(|b| (b * 7 + i) as u8).collect() };
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut backoff = Backoff::new();
                    for i in 0..2000u32 {
                        let slot = loop {
                            match fifo.try_reserve() {
                                Some(slot) => break slot,
                                None => backoff
                                    .snooze(Some(fifo.producer_park()), deadline, &abort)
                                    .unwrap(),
                            }
                        };
                        let bytes = piece(i);
                        // SAFETY: the slot holds 304 bytes.
                        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot, bytes.len()) };
                        fifo.publish(bytes.len(), tag(i));
                    }
                });
                let mut backoff = Backoff::new();
                for i in 0..2000u32 {
                    let (slot, len, got) = loop {
                        match consumer.try_peek() {
                            Some(found) => break found,
                            None => backoff
                                .snooze(Some(consumer.consumer_park()), deadline, &abort)
                                .unwrap(),
                        }
                    };
                    assert_eq!(got, tag(i), "{proto:?}");
                    // SAFETY: the piece was published with `len` bytes.
                    let bytes = unsafe { std::slice::from_raw_parts(slot, len) };
                    assert_eq!(bytes, piece(i).as_slice(), "{proto:?} piece {i}");
                    consumer.release();
                }
            });
            assert!(fifo.is_drained());
        }
    }

    #[test]
    fn full_fifo_refuses_reservation_until_release() {
        for proto in Protocol::ALL {
            let fifo = Fifo::on_heap(proto, 2, 8);
            for i in 0..2 {
                assert!(fifo.try_reserve().is_some());
                fifo.publish(8, tag(i));
            }
            assert!(fifo.try_reserve().is_none());
            assert!(fifo.try_peek().is_some());
            fifo.release();
            assert!(fifo.try_reserve().is_some());
        }
    }

    #[test]
    fn an_unpublished_ll_slot_is_not_seen() {
        for proto in [Protocol::Ll, Protocol::Ll128] {
            let fifo = Fifo::on_heap(proto, 2, 64);
            assert!(fifo.try_peek().is_none());
            fifo.try_reserve().unwrap();
            fifo.publish(64, tag(1));
            fifo.try_peek().unwrap();
            fifo.release();
            // The slot after it still holds zeros: flag 0 never matches.
            assert!(fifo.try_peek().is_none());
        }
    }

    /// A proxy moving whole slots sees the k-th published piece and the
    /// k-th free slot, headers included, and a slot filled whole (header
    /// and payload copied) reads back as the piece that was published.
    #[test]
    fn whole_slots_move_with_their_headers() {
        let sender = Fifo::on_heap(Protocol::Simple, 4, 64);
        let receiver = Fifo::on_heap(Protocol::Simple, 4, 64);
        for i in 0..3u32 {
            let slot = sender.try_reserve().unwrap();
            // SAFETY: the slot holds 64 bytes.
            unsafe { std::ptr::write_bytes(slot, i as u8 + 1, 10 + i as usize) };
            sender.publish(10 + i as usize, tag(i));
        }
        assert!(sender.peek_slot(3).is_none());
        for k in 0..3 {
            let (slot, len) = sender.peek_slot(k).unwrap();
            assert_eq!(len, SLOT_HEADER + 10 + k);
            let into = receiver.reserve_slot(k).unwrap();
            // SAFETY: both slots hold SLOT_HEADER + 64 bytes.
            unsafe { std::ptr::copy_nonoverlapping(slot, into, len) };
        }
        assert!(receiver.reserve_slot(4).is_none());
        for i in 0..3u32 {
            let slot = receiver.reserve_slot(0).unwrap();
            // SAFETY: the slot was filled whole above.
            let (len, got) = unsafe { read_slot_header(slot) };
            assert_eq!(got, tag(i));
            receiver.publish(len as usize, got);
            sender.release();
        }
        assert!(receiver.reserve_slot(0).is_some() && receiver.reserve_slot(1).is_none());
        for i in 0..3u32 {
            let (slot, len, got) = receiver.try_peek().unwrap();
            assert_eq!((len, got), (10 + i as usize, tag(i)));
            // SAFETY: published with `len` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(slot, len) };
            assert!(bytes.iter().all(|&b| b == i as u8 + 1));
            receiver.release();
        }
        assert!(sender.is_drained() && receiver.is_drained());
    }

    #[test]
    fn the_doorbell_rings_on_publish_release_and_failure_only_from_its_handle() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl Doorbell for Count {
            fn ring(&self) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(Default::default()));
        let fifo = Fifo::on_heap(Protocol::Simple, 2, 8);
        let quiet = fifo.clone();
        let fifo = fifo.with_doorbell(count.clone());
        let rings = || count.0.load(std::sync::atomic::Ordering::SeqCst);
        quiet.try_reserve().unwrap();
        quiet.publish(8, tag(0));
        quiet.release();
        assert_eq!(rings(), 0);
        fifo.try_reserve().unwrap();
        fifo.publish(8, tag(1));
        assert_eq!(rings(), 1);
        fifo.release();
        assert_eq!(rings(), 2);
        fifo.fail();
        assert_eq!(rings(), 3);
    }

    #[test]
    fn failure_is_seen_by_both_handles() {
        let fifo = Fifo::on_heap(Protocol::Simple, 2, 8);
        let other = fifo.clone();
        assert!(!other.failed());
        fifo.fail();
        assert!(other.failed());
    }
}
