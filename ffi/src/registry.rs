//! Live communicator handles.
//!
//! An `ncclComm_t` handed to C is a token, never a pointer to Rust memory:
//! every call looks it up here, so a destroyed, aborted or made-up handle is
//! reported instead of dereferenced. Tokens are never reused.

use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::thread::JoinHandle;

use rccl::{Communicator, DataType, Error, Result};

use crate::abi::ncclComm_t;
use crate::check::{invalid, usage};

/// Tokens are `TOKEN_BASE + n * TOKEN_STEP`, so they look like aligned
/// addresses and a destroyed one can be told from a made-up one.
const TOKEN_BASE: usize = 0x5cc1_0000;
const TOKEN_STEP: usize = 64;

static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(0);
static LIVE: LazyLock<Mutex<HashMap<usize, Arc<Entry>>>> = LazyLock::new(Default::default);

/// Locks a mutex, ignoring poisoning (every entry point catches panics, and
/// the data kept under these locks stays consistent).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh, never reused token (non-zero, 64-byte aligned).
pub fn next_token() -> usize {
    TOKEN_BASE + NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) * TOKEN_STEP
}

/// The communicator behind a handle: still being created (in a group, or
/// non-blocking), ready, or failed to create.
pub enum Slot {
    Pending(JoinHandle<Result<Communicator>>),
    Ready(Communicator),
    Failed(Error),
}

/// A scalar of a PreMulSum operator.
#[derive(Clone, Copy)]
pub enum Scalar {
    /// `ncclScalarHostImmediate`: the value, read at creation.
    Immediate([u8; 8]),
    /// `ncclScalarDevice`: a pointer to the value (host or device memory),
    /// read for each call.
    Pointer(usize),
}

/// A custom reduction operator of one communicator.
#[derive(Clone, Copy)]
pub struct PreMul {
    pub dtype: DataType,
    pub scalar: Scalar,
}

/// Registered buffers: handle -> (address, bytes).
pub type Regions = HashMap<usize, (usize, usize)>;

/// What the C ABI keeps per communicator handle.
pub struct Entry {
    pub token: usize,
    slot: Mutex<Slot>,
    /// From `ncclConfig_t.blocking` (default 1).
    pub blocking: bool,
    /// What `ncclCommCuDevice` reports.
    pub device: c_int,
    /// `ncclConfig_t.commName`, for messages.
    pub name: Option<String>,
    last_error: Mutex<CString>,
    /// PreMulSum operators by `ncclRedOp_t` value, and the next value.
    pub ops: Mutex<(c_int, HashMap<c_int, PreMul>)>,
    pub registrations: Mutex<Regions>,
}

impl Entry {
    pub fn new(slot: Slot, blocking: bool, device: c_int, name: Option<String>) -> Arc<Entry> {
        Arc::new(Entry {
            token: next_token(),
            slot: Mutex::new(slot),
            blocking,
            device,
            name,
            last_error: Mutex::new(CString::default()),
            ops: Mutex::new((crate::abi::ncclNumOps, HashMap::new())),
            registrations: Mutex::default(),
        })
    }

    /// The handle C sees.
    pub fn handle(&self) -> ncclComm_t {
        self.token as ncclComm_t
    }

    pub fn set_last_error(&self, text: CString) {
        *lock(&self.last_error) = text;
    }

    pub fn last_error(&self) -> CString {
        lock(&self.last_error).clone()
    }

    /// The communicator, waiting for its creation if that is still running.
    pub fn comm(&self) -> Result<Communicator> {
        let mut slot = lock(&self.slot);
        if let Slot::Pending(_) = &*slot {
            let Slot::Pending(handle) = std::mem::replace(&mut *slot, Slot::Failed(usage("")))
            else {
                unreachable!()
            };
            *slot = match handle.join() {
                Ok(Ok(comm)) => Slot::Ready(comm),
                Ok(Err(err)) => Slot::Failed(err),
                Err(_) => Slot::Failed(Error::Internal(
                    "the thread creating the communicator panicked".into(),
                )),
            };
        }
        match &*slot {
            Slot::Ready(comm) => Ok(comm.clone()),
            Slot::Failed(err) => Err(err.clone()),
            Slot::Pending(_) => unreachable!(),
        }
    }

    /// Whether creation is still running (without waiting for it).
    pub fn in_progress(&self) -> bool {
        match self.slot.try_lock() {
            Ok(slot) => matches!(&*slot, Slot::Pending(h) if !h.is_finished()),
            // Someone is waiting for the creation: it is still running.
            Err(std::sync::TryLockError::WouldBlock) => true,
            Err(std::sync::TryLockError::Poisoned(_)) => false,
        }
    }

    /// Drops the communicator without waiting for a pending creation.
    pub fn detach(&self) -> Option<Communicator> {
        match std::mem::replace(&mut *lock(&self.slot), Slot::Failed(usage("destroyed"))) {
            Slot::Ready(comm) => Some(comm),
            _ => None,
        }
    }
}

/// Makes `entry` live.
pub fn insert(entry: Arc<Entry>) {
    lock(&LIVE).insert(entry.token, entry);
}

/// Removes a live handle, returning its entry.
pub fn remove(comm: ncclComm_t) -> Result<Arc<Entry>> {
    let entry = lookup(comm)?;
    lock(&LIVE).remove(&entry.token);
    Ok(entry)
}

/// The entry of a live handle, or `None` (for recording messages).
pub fn peek(comm: ncclComm_t) -> Option<Arc<Entry>> {
    if comm.is_null() {
        return None;
    }
    lock(&LIVE).get(&(comm as usize)).cloned()
}

/// The entry of a live handle, or why the handle is not one.
pub fn lookup(comm: ncclComm_t) -> Result<Arc<Entry>> {
    if comm.is_null() {
        return Err(invalid("comm is NULL"));
    }
    if let Some(entry) = peek(comm) {
        return Ok(entry);
    }
    let token = comm as usize;
    let issued = TOKEN_BASE + NEXT_TOKEN.load(Ordering::Relaxed) * TOKEN_STEP;
    if (TOKEN_BASE..issued).contains(&token) && (token - TOKEN_BASE).is_multiple_of(TOKEN_STEP) {
        Err(usage(format!(
            "communicator {comm:p} was destroyed or aborted; it cannot be used any more"
        )))
    } else {
        Err(invalid(format!(
            "{comm:p} is not a communicator created by this library"
        )))
    }
}
