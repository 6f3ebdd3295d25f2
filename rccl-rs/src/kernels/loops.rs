//! The loops over [`Native`] types: combine or transform every element,
//! on slices when the pointers are aligned, through stack buffers when they
//! are not, and line by line with non-temporal stores when asked to stream.

use std::mem::{align_of, size_of};
use std::ptr;
use std::slice;

use super::native::Native;
use super::store::Store;
use super::CHUNK;

/// Runs `out = f2(acc, input)` or `out = f1(input)` over `count > 0`
/// elements, on slices when every pointer is aligned for `T`, else through
/// aligned stack buffers; with `Store::Streaming` and aligned pointers,
/// `out`'s whole lines take non-temporal stores.
///
/// # Safety
/// As [`ReduceKernel::run`](super::ReduceKernel::run), with `count > 0` and `T` the datatype's type;
/// with `Store::Streaming`, `out` disjoint from the inputs.
#[inline(always)]
pub(super) unsafe fn drive<T: Native, F2: Fn(T, T) -> T, F1: Fn(T) -> T>(
    f2: F2,
    f1: F1,
    acc: Option<*const u8>,
    input: *const u8,
    out: *mut u8,
    count: usize,
    store: Store,
) {
    let aligned = |p: *const u8| (p as usize) & (align_of::<T>() - 1) == 0;
    let all_aligned =
        aligned(input) && aligned(out.cast_const()) && acc.map(aligned).unwrap_or(true);
    // SAFETY: (for every arm) the pointers are valid for count elements of
    // T, identical or disjoint (caller's contract); the aligned variants
    // are only chosen when every pointer is aligned for T.
    // the streaming variants only when `out` is disjoint from the inputs.
    unsafe {
        match (acc, all_aligned, store) {
            (Some(a), true, Store::Streaming) => {
                zip_streaming(&f2, a.cast(), input.cast(), out.cast(), count)
            }
            (Some(a), true, Store::Cached) => {
                zip_aligned(&f2, a.cast(), input.cast(), out.cast(), count)
            }
            (Some(a), false, _) => zip_unaligned(&f2, a, input, out, count),
            (None, true, Store::Streaming) => map_streaming(&f1, input.cast(), out.cast(), count),
            (None, true, Store::Cached) => map_aligned(&f1, input.cast(), out.cast(), count),
            (None, false, _) => map_unaligned(&f1, input, out, count),
        }
    }
}

/// One cache line of results on its way to a non-temporal store.
#[repr(C, align(64))]
struct Line([u8; LINE_BYTES]);

/// Bytes of a cache line.
const LINE_BYTES: usize = 64;

/// `(head, lines)`: the elements of `T` before `o` reaches a line
/// boundary (at most `n`), then the whole lines after them.
#[inline(always)]
fn line_split<T>(o: *mut T, n: usize) -> (usize, usize) {
    let head = ((LINE_BYTES - (o as usize) % LINE_BYTES) % LINE_BYTES / size_of::<T>()).min(n);
    (head, (n - head) * size_of::<T>() / LINE_BYTES)
}

/// Writes the `n` elements of `o`: each whole line computed by `value`
/// (the element's index to its result) into a [`Line`] and written with
/// non-temporal stores (unfenced); the elements before the first line
/// boundary and after the last whole line by `cached(from, len)`, with
/// ordinary stores.
///
/// # Safety
/// `o` aligned, non-null and valid for `n` elements; `value` and `cached`
/// sound for every index below `n`.
#[inline(always)]
unsafe fn stream_lines<T: Copy>(
    o: *mut T,
    n: usize,
    cached: impl Fn(usize, usize),
    value: impl Fn(usize) -> T,
) {
    let per_line = LINE_BYTES / size_of::<T>();
    let (head, lines) = line_split(o, n);
    let tail = head + lines * per_line;
    let mut line = Line([0; LINE_BYTES]);
    let slot = line.0.as_mut_ptr().cast::<T>();
    cached(0, head);
    for l in 0..lines {
        let at = head + l * per_line;
        for i in 0..per_line {
            // SAFETY: `line` holds `per_line` elements of `T` (64 bytes,
            // aligned for every element type).
            unsafe { slot.add(i).write(value(at + i)) };
        }
        // SAFETY: `o + at` is 64-byte aligned (`line_split`) and its line
        // lies below `n` elements.
        unsafe { stream_line(&line, o.add(at).cast()) };
    }
    cached(tail, n - tail);
}

/// `o[i] = f(a[i], b[i])` for aligned pointers and an `o` disjoint from
/// both inputs, its whole lines written with non-temporal stores
/// ([`stream_lines`]).
///
/// # Safety
/// `a`, `b`, `o` aligned, non-null and valid for `n` elements; `o`
/// disjoint from `a` and `b`.
#[inline(always)]
unsafe fn zip_streaming<T: Copy, F: Fn(T, T) -> T>(
    f: &F,
    a: *const T,
    b: *const T,
    o: *mut T,
    n: usize,
) {
    // SAFETY: every index `stream_lines` passes to the closures stays
    // below `n`, where the pointers are valid.
    unsafe {
        stream_lines(
            o,
            n,
            |from, len| zip_aligned(f, a.add(from), b.add(from), o.add(from), len),
            |i| f(a.add(i).read(), b.add(i).read()),
        )
    }
}

/// `o[i] = f(b[i])` as [`zip_streaming`] writes it.
///
/// # Safety
/// `b`, `o` aligned, non-null and valid for `n` elements, disjoint.
#[inline(always)]
unsafe fn map_streaming<T: Copy, F: Fn(T) -> T>(f: &F, b: *const T, o: *mut T, n: usize) {
    // SAFETY: as in `zip_streaming`.
    unsafe {
        stream_lines(
            o,
            n,
            |from, len| map_aligned(f, b.add(from), o.add(from), len),
            |i| f(b.add(i).read()),
        )
    }
}

/// Writes `line` to the 64-byte aligned `o` with non-temporal stores
/// (ordinary ones off x86_64).
///
/// # Safety
/// `o` valid for 64 bytes of writes, 64-byte aligned, disjoint from `line`.
#[inline(always)]
unsafe fn stream_line(line: &Line, o: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: both addresses are 16-byte aligned at every step (`Line` and
    // `o` are 64-byte aligned) and valid for the 64 bytes; SSE2 is part of
    // every x86_64 CPU.
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        for i in (0..LINE_BYTES).step_by(16) {
            let v = _mm_load_si128(line.0.as_ptr().add(i).cast::<__m128i>());
            _mm_stream_si128(o.add(i).cast::<__m128i>(), v);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        ptr::copy_nonoverlapping(line.0.as_ptr(), o, LINE_BYTES)
    };
}

/// `o[i] = f(a[i], b[i])` for aligned pointers, shaping the slices by how
/// `o` aliases the inputs so that no `&mut` slice overlaps a `&` slice.
///
/// # Safety
/// `a`, `b`, `o` aligned, non-null and valid for `n` elements; each pair is
/// identical or disjoint.
#[inline(always)]
unsafe fn zip_aligned<T: Copy, F: Fn(T, T) -> T>(
    f: &F,
    a: *const T,
    b: *const T,
    o: *mut T,
    n: usize,
) {
    if o.cast_const() == a {
        // SAFETY: `o` is valid for n aligned elements and no other
        // reference to that range exists while `o` is live (b is either the
        // same range, read only through `o`, or disjoint).
        let o = unsafe { slice::from_raw_parts_mut(o, n) };
        if b == a {
            for x in o.iter_mut() {
                *x = f(*x, *x);
            }
        } else {
            // SAFETY: `b` is valid, aligned and disjoint from `o`.
            let b = unsafe { slice::from_raw_parts(b, n) };
            for (x, &y) in o.iter_mut().zip(b) {
                *x = f(*x, y);
            }
        }
    } else if o.cast_const() == b {
        // SAFETY: `a` and `o` are valid, aligned and disjoint (o != a).
        let (a, o) = unsafe { (slice::from_raw_parts(a, n), slice::from_raw_parts_mut(o, n)) };
        for (x, &y) in o.iter_mut().zip(a) {
            *x = f(y, *x);
        }
    } else {
        // SAFETY: `o` is disjoint from both inputs; the inputs are only
        // read, so they may be identical.
        let (a, b, o) = unsafe {
            (
                slice::from_raw_parts(a, n),
                slice::from_raw_parts(b, n),
                slice::from_raw_parts_mut(o, n),
            )
        };
        for ((x, &p), &q) in o.iter_mut().zip(a).zip(b) {
            *x = f(p, q);
        }
    }
}

/// `o[i] = f(b[i])` for aligned pointers.
///
/// # Safety
/// `b`, `o` aligned, non-null and valid for `n` elements; identical or
/// disjoint.
#[inline(always)]
unsafe fn map_aligned<T: Copy, F: Fn(T) -> T>(f: &F, b: *const T, o: *mut T, n: usize) {
    if o.cast_const() == b {
        // SAFETY: valid aligned range, only reference to it.
        let o = unsafe { slice::from_raw_parts_mut(o, n) };
        for x in o.iter_mut() {
            *x = f(*x);
        }
    } else {
        // SAFETY: valid aligned disjoint ranges.
        let (b, o) = unsafe { (slice::from_raw_parts(b, n), slice::from_raw_parts_mut(o, n)) };
        for (x, &y) in o.iter_mut().zip(b) {
            *x = f(y);
        }
    }
}

/// `zip_aligned` for pointers of any alignment: each chunk is copied into
/// aligned stack buffers, combined there and copied out.
///
/// # Safety
/// Byte pointers valid for `n * size_of::<T>()` bytes, identical or
/// disjoint; every bit pattern must be a valid `T` (true of all element
/// types here).
#[inline(always)]
unsafe fn zip_unaligned<T: Native, F: Fn(T, T) -> T>(
    f: &F,
    a: *const u8,
    b: *const u8,
    o: *mut u8,
    n: usize,
) {
    let mut ba = [T::default(); CHUNK];
    let mut bb = [T::default(); CHUNK];
    let mut done = 0;
    while done < n {
        let m = (n - done).min(CHUNK);
        let off = done * size_of::<T>();
        let bytes = m * size_of::<T>();
        // SAFETY: the sources are valid for `off + bytes` bytes; the stack
        // buffers hold CHUNK >= m elements and are distinct from caller
        // memory. Reading this chunk of both inputs completes before it is
        // written, and chunks are disjoint, so an aliased output is fine.
        unsafe {
            ptr::copy_nonoverlapping(a.add(off), ba.as_mut_ptr().cast::<u8>(), bytes);
            ptr::copy_nonoverlapping(b.add(off), bb.as_mut_ptr().cast::<u8>(), bytes);
        }
        for (x, &y) in ba[..m].iter_mut().zip(&bb[..m]) {
            *x = f(*x, y);
        }
        // SAFETY: `o` is valid for `off + bytes` bytes; the buffer is ours.
        unsafe { ptr::copy_nonoverlapping(ba.as_ptr().cast::<u8>(), o.add(off), bytes) };
        done += m;
    }
}

/// `map_aligned` for pointers of any alignment.
///
/// # Safety
/// As [`zip_unaligned`].
#[inline(always)]
unsafe fn map_unaligned<T: Native, F: Fn(T) -> T>(f: &F, b: *const u8, o: *mut u8, n: usize) {
    let mut bb = [T::default(); CHUNK];
    let mut done = 0;
    while done < n {
        let m = (n - done).min(CHUNK);
        let off = done * size_of::<T>();
        let bytes = m * size_of::<T>();
        // SAFETY: as in `zip_unaligned`.
        unsafe { ptr::copy_nonoverlapping(b.add(off), bb.as_mut_ptr().cast::<u8>(), bytes) };
        for x in bb[..m].iter_mut() {
            *x = f(*x);
        }
        // SAFETY: as in `zip_unaligned`.
        unsafe { ptr::copy_nonoverlapping(bb.as_ptr().cast::<u8>(), o.add(off), bytes) };
        done += m;
    }
}
