//! Entry-point plumbing: panics caught, errors turned into `ncclResult_t`
//! codes, and the messages kept for `ncclGetLastError`.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rccl::Error;

use crate::abi::*;
use crate::registry;

/// What an entry point's body returns: the success code (`ncclSuccess`, or
/// `ncclInProgress` for non-blocking work still running) or the failure.
pub type Outcome = Result<ncclResult_t, Error>;

thread_local! {
    /// The last error message recorded on this thread.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// The copy handed out by `ncclGetLastError`, valid until the next call
    /// on this thread.
    static HANDED_OUT: RefCell<CString> = RefCell::new(CString::default());
}

/// Makes a C string of `text`, dropping interior NULs.
pub fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', " ")).unwrap_or_default()
}

/// Records `message` as the last error of this thread and, when `comm` is
/// a live communicator, of that communicator.
pub fn record(comm: ncclComm_t, message: &str) {
    let text = c_string(message);
    if let Some(entry) = registry::peek(comm) {
        entry.set_last_error(text.clone());
    }
    LAST.with(|l| *l.borrow_mut() = text);
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".into()
    }
}

fn run(
    name: &str,
    comm: ncclComm_t,
    in_group_op: bool,
    body: impl FnOnce() -> Outcome,
) -> ncclResult_t {
    let outcome = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(outcome) => outcome,
        Err(payload) => Err(Error::Internal(format!(
            "panic inside rccl-rs: {}",
            panic_message(payload.as_ref())
        ))),
    };
    match outcome {
        Ok(code) => code,
        Err(err) => {
            if in_group_op {
                // Inside a group, the group's end must report the failure
                // too, and launch nothing.
                rccl::group_fail(&err);
            }
            record(comm, &named(name, &err.to_string()));
            err.code()
        }
    }
}

/// The message of a failed call: the entry point's name, then the error,
/// whose text may name the call itself where the engine says which call
/// it was (that inner name is dropped, so the name stands once).
fn named(name: &str, text: &str) -> String {
    format!("{name}: {}", text.replacen(&format!("{name}: "), "", 1))
}

/// Runs the body of entry point `name`: catches panics
/// (`ncclInternalError`), records any failure's message, returns the code.
pub fn guard(name: &str, comm: ncclComm_t, body: impl FnOnce() -> Outcome) -> ncclResult_t {
    run(name, comm, false, body)
}

/// As [`guard`], for operations (collectives, send, receive) whose failure
/// inside a group also fails the group.
pub fn guard_op(name: &str, comm: ncclComm_t, body: impl FnOnce() -> Outcome) -> ncclResult_t {
    run(name, comm, true, body)
}

/// `ncclGetLastError`: the communicator's last error if it has one, else
/// this thread's; the pointer stays valid until the next call on this
/// thread.
pub fn last_error(comm: ncclComm_t) -> *const c_char {
    let from_comm = registry::peek(comm)
        .map(|e| e.last_error())
        .filter(|m| !m.as_bytes().is_empty());
    let text = from_comm.unwrap_or_else(|| LAST.with(|l| l.borrow().clone()));
    HANDED_OUT.with(|h| {
        *h.borrow_mut() = text;
        h.borrow().as_ptr()
    })
}

/// `ncclGetErrorString`.
pub fn error_string(code: ncclResult_t) -> &'static std::ffi::CStr {
    match code {
        ncclSuccess => c"no error",
        ncclUnhandledCudaError => c"unhandled cuda error (see ncclGetLastError for details)",
        ncclSystemError => c"unhandled system error (see ncclGetLastError for details)",
        ncclInternalError => c"internal error - please report this issue to the rccl-rs developers",
        ncclInvalidArgument => c"invalid argument (see ncclGetLastError for details)",
        ncclInvalidUsage => c"invalid usage (see ncclGetLastError for details)",
        ncclRemoteError => c"remote process exited or there was a network error",
        ncclInProgress => c"NCCL operation in progress",
        ncclTimeout => c"operation timed out",
        _ => c"unknown result code",
    }
}
