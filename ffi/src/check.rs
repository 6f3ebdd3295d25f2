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
