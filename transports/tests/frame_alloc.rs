//! `read_frame` must refuse an oversized length without allocating it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Cursor, ErrorKind};
use std::sync::atomic::{AtomicUsize, Ordering};

use rccl_transports::auth_tcp::read_frame;

/// Records the largest single allocation.
struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator; only
// records sizes on the side.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: the caller upholds `realloc`'s contract, passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

#[test]
fn oversized_frame_refused_without_allocating() {
    // Announce 3 GiB, allow 1 KiB.
    let mut r = Cursor::new((3u32 << 30).to_le_bytes().to_vec());
    LARGEST.store(0, Ordering::Relaxed);
    let e = read_frame(&mut r, 1024).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidData);
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest < 1 << 20, "allocated {largest} bytes");

    // Announce 64 MiB within a 64 MiB limit but send only 10 bytes: the
    // buffer grows with the data, not with the announced length.
    let mut bytes = (64u32 << 20).to_le_bytes().to_vec();
    bytes.extend_from_slice(&[1; 10]);
    LARGEST.store(0, Ordering::Relaxed);
    let e = read_frame(&mut Cursor::new(bytes), 64 << 20).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest <= 2 << 20, "allocated {largest} bytes");
}
