//! Parking on a 32-bit word, across threads and across processes.
//!
//! Linux futexes work on any mapping, private or shared, so a FIFO that
//! lives in a shared-memory segment can park its reader and wake it from
//! another process. The wait is always bounded by a timeout: a lost wake-up
//! costs latency, never a hang.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, for at most `timeout`.
///
/// Returns early when woken, when the value differs, or on a signal.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic for the duration of the
    // call and `ts` outlives it. FUTEX_WAIT (not the private variant) also
    // works on shared mappings. The kernel only reads the word, and the call
    // returns on timeout, so no memory is retained past the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every thread parked on `word`.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAKE only uses
    // its address as a key and never dereferences other memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}
