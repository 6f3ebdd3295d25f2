//! How a primitive writes what it produces: ordinary stores, or
//! non-temporal ones that skip the read of a line that is not cached.

use std::ptr;

/// How a primitive writes what it produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// Ordinary stores: the data stays cached for its next reader (FIFO
    /// slots, calls that fit the caches).
    Cached,
    /// Non-temporal stores ([`copy_streaming`]): for outputs larger than
    /// the last-level cache, which the call does not read again soon.
    Streaming,
}

impl Store {
    /// Copies `bytes` from `src` to `dst` with these stores.
    ///
    /// # Safety
    ///
    /// As [`copy_streaming`].
    pub unsafe fn copy(self, src: *const u8, dst: *mut u8, bytes: usize) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Store::Cached => ptr::copy_nonoverlapping(src, dst, bytes),
                Store::Streaming => copy_streaming(src, dst, bytes),
            }
        }
    }
}

/// Copies below this many bytes use ordinary stores: there is no whole
/// cache line to gain.
const STREAMING_MIN_BYTES: usize = 256;

/// Copies `bytes` from `src` to `dst` with non-temporal stores and fences
/// them, so that a later release store publishes them like ordinary ones.
///
/// An ordinary store to a line that is not cached first reads the line
/// from memory; a non-temporal store writes it without the read and
/// without evicting cached data. For an output far larger than the last
/// level cache, written once and not read again soon, that saves a third
/// of the memory traffic of a copy. On other architectures it is an
/// ordinary copy.
///
/// # Safety
///
/// `src` valid for reads and `dst` for writes of `bytes` bytes, the
/// ranges disjoint; any alignment.
pub unsafe fn copy_streaming(src: *const u8, dst: *mut u8, bytes: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { copy_streaming_unfenced(src, dst, bytes) };
    store_fence();
}

/// Orders every earlier non-temporal store before later stores.
#[inline]
pub(super) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86_64 CPU; sfence has no operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// [`copy_streaming`] without the closing fence (the caller fences).
///
/// # Safety
///
/// As [`copy_streaming`].
#[inline]
pub(super) unsafe fn copy_streaming_unfenced(src: *const u8, dst: *mut u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    if bytes >= STREAMING_MIN_BYTES {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        // Ordinary stores up to the first 16-byte boundary of `dst`, then
        // 16-byte streaming stores, then ordinary stores for the rest.
        let head = (16 - (dst as usize & 15)) & 15;
        let body = (bytes - head) & !15;
        // SAFETY: every offset stays below `bytes`, inside both ranges
        // (caller's contract); the streamed addresses `dst + head + i` are
        // 16-byte aligned as `_mm_stream_si128` requires; SSE2 is part of
        // every x86_64 CPU.
        unsafe {
            ptr::copy_nonoverlapping(src, dst, head);
            let (s, d) = (src.add(head), dst.add(head));
            for i in (0..body).step_by(16) {
                let v = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                _mm_stream_si128(d.add(i).cast::<__m128i>(), v);
            }
            ptr::copy_nonoverlapping(s.add(body), d.add(body), bytes - head - body);
        }
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { ptr::copy_nonoverlapping(src, dst, bytes) };
}
