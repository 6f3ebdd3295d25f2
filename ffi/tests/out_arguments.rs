//! Out-arguments through the C ABI: a NULL or misaligned pointer is
//! refused with `ncclInvalidArgument` and a message naming it, and
//! nothing is written through it.

use std::ffi::{c_int, CStr};
use std::ptr::null_mut;

use rcclrs::*;

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string that stays
    // valid until this thread's next call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// A pointer to an int one byte into `bytes`, which no int can be at.
fn misaligned(bytes: &mut [u8; 8]) -> *mut c_int {
    let at = bytes.as_mut_ptr().wrapping_add(1);
    let ptr = if at.cast::<c_int>().is_aligned() {
        at.wrapping_add(1)
    } else {
        at
    };
    ptr.cast()
}

#[test]
fn a_misaligned_out_argument_is_refused_and_not_written() {
    let mut bytes = [0u8; 8];
    // SAFETY: a pointer into `bytes`, which has room for an int past it.
    let rc = unsafe { ncclGetVersion(misaligned(&mut bytes)) };
    assert_eq!(rc, ncclInvalidArgument);
    let err = last_error();
    assert!(
        err.contains("version") && err.contains("not aligned"),
        "{err}"
    );
    assert_eq!(bytes, [0; 8]);

    let mut comm = null_mut();
    // SAFETY: room for one handle.
    assert_eq!(
        unsafe { ncclCommInitAll(&mut comm, 1, std::ptr::null()) },
        ncclSuccess
    );
    // SAFETY: as above.
    let rc = unsafe { ncclCommCount(comm, misaligned(&mut bytes)) };
    assert_eq!(rc, ncclInvalidArgument);
    assert!(last_error().contains("count"), "{}", last_error());
    assert_eq!(bytes, [0; 8]);
    let mut count: c_int = 0;
    // SAFETY: a valid out-pointer and a live communicator.
    unsafe {
        assert_eq!(ncclCommCount(comm, &mut count), ncclSuccess);
        assert_eq!(ncclCommDestroy(comm), ncclSuccess);
    }
    assert_eq!(count, 1);
}

#[test]
fn a_null_out_argument_is_refused() {
    // SAFETY: NULL is what is being checked.
    let rc = unsafe { ncclGetVersion(null_mut()) };
    assert_eq!(rc, ncclInvalidArgument);
    assert!(last_error().contains("version is NULL"), "{}", last_error());
    let mut version = 0;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetVersion(&mut version) }, ncclSuccess);
    assert!(version > 0);
}
