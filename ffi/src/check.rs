//! The failures an entry point reports for bad arguments or a call it
//! does not allow, as `rccl::Error`s that map to `ncclInvalidArgument` and
//! `ncclInvalidUsage`.

use rccl::Error;

/// An `ncclInvalidArgument` failure.
pub fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// An `ncclInvalidUsage` failure.
pub fn usage(message: impl Into<String>) -> Error {
    Error::InvalidUsage(message.into())
}

/// Fails with "`what` is NULL" when `ptr` is null.
pub fn non_null<T>(ptr: *const T, what: &str) -> Result<(), Error> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    Ok(())
}

/// Stores `value` through `ptr`, the out-argument `what` of an entry
/// point, after checking that it is not NULL and is aligned for `T`.
///
/// # Safety
///
/// A non-NULL `ptr` aligned for `T` must be valid for a write of a `T`:
/// the entry point's caller vouches for that by nccl.h's contract (the
/// crate's "Pointers from C").
pub unsafe fn write_out<T>(ptr: *mut T, value: T, what: &str) -> Result<(), Error> {
    non_null(ptr, what)?;
    if !ptr.is_aligned() {
        return Err(invalid(format!(
            "{what} ({ptr:p}) is not aligned for {}",
            std::any::type_name::<T>()
        )));
    }
    // SAFETY: non-NULL and aligned (checked above), and valid for a write
    // by this function's contract.
    unsafe { ptr.write(value) };
    Ok(())
}
