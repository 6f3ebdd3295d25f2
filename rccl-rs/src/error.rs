//! The engine's error type, one variant per `ncclResult_t` failure code.

use thiserror::Error;

/// What went wrong, with a message precise enough to act on.
///
/// Each variant maps onto one `ncclResult_t` code ([`Error::code`]), so the C
/// ABI can return NCCL's code and keep the message for `ncclGetLastError`.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum Error {
    /// An argument is wrong: a null or short buffer, an unknown datatype or
    /// op, a root or peer out of range (`ncclInvalidArgument`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The call is not valid in this state or sequence: a destroyed or
    /// aborted communicator, mismatched calls across ranks
    /// (`ncclInvalidUsage`).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// The operating system refused something: a socket, a mapping, a
    /// thread, or a deadline passed while waiting (`ncclSystemError`).
    #[error("system error: {0}")]
    System(String),
    /// A peer failed or went away: a closed connection, a peer that
    /// reported an error, a malformed message (`ncclRemoteError`).
    #[error("remote error: {0}")]
    Remote(String),
    /// A bug in rccl-rs itself (`ncclInternalError`).
    #[error("internal error: {0}")]
    Internal(String),
}

/// The engine's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The `ncclResult_t` value NCCL returns for this kind of failure.
    pub fn code(&self) -> i32 {
        match self {
            Error::System(_) => 2,
            Error::Internal(_) => 3,
            Error::InvalidArgument(_) => 4,
            Error::InvalidUsage(_) => 5,
            Error::Remote(_) => 6,
        }
    }

    /// A system error from an I/O failure, with what was being done.
    pub fn io(context: impl std::fmt::Display, err: std::io::Error) -> Error {
        let err = rccl_transports::explain_fd_limit(err);
        Error::System(format!("{context}: {err}"))
    }
}

impl From<rccl_transports::host::HostError> for Error {
    fn from(err: rccl_transports::host::HostError) -> Error {
        use rccl_transports::host::HostError;
        match err {
            HostError::InvalidArgument(m) => Error::InvalidArgument(m),
            HostError::System(m) => Error::System(m),
        }
    }
}

impl From<rccl_device::Error> for Error {
    fn from(err: rccl_device::Error) -> Error {
        match err {
            rccl_device::Error::InvalidArgument(m) => Error::InvalidArgument(m),
            rccl_device::Error::InvalidUsage(m) => Error::InvalidUsage(m),
            rccl_device::Error::System(m) => Error::System(m),
        }
    }
}
