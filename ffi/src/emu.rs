//! The emulated GPU's control calls (`ffi/include/rcclrs_emu.h`): what a
//! C program on `RCCL_DEVICE=emu` uses where it would call the CUDA
//! runtime: device memory, copies, streams and events. Each selects the
//! emulated GPU if no backend is active yet, and fails if another is.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use rccl::device::{self, Device, Event, Kind};
use rccl::Result;

use crate::abi::*;
use crate::check::{invalid, non_null};
use crate::error::guard;
use crate::registry::lock;

/// An event handle as C sees it: a token, never a pointer.
#[allow(non_camel_case_types)]
pub type rcclrsEmuEvent_t = *mut c_void;

/// Events are `EVENT_BASE + n * 16`, never reused.
const EVENT_BASE: usize = 0x5e7e_0000;
static NEXT_EVENT: AtomicUsize = AtomicUsize::new(0);
static EVENTS: LazyLock<Mutex<HashMap<usize, Arc<dyn Event>>>> = LazyLock::new(Default::default);

fn emu() -> Result<&'static dyn Device> {
    Ok(device::select(Kind::Emu)?)
}

fn event(handle: rcclrsEmuEvent_t) -> Result<Arc<dyn Event>> {
    lock(&EVENTS)
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(|| invalid(format!("{handle:p} is not a live event of emu device 0")))
}

/// How long a synchronize waits past the engine's timeout before it
/// reports the work still running: work that ends at its own deadline
/// (which names the peer it waited for) ends first, and its error is the
/// one reported.
const PAST_THE_TIMEOUT: Duration = Duration::from_secs(1);

/// When a synchronize reports the work still running.
fn deadline() -> Instant {
    Instant::now() + device::emu::wait_limit() + PAST_THE_TIMEOUT
}

/// Runs `body` as an entry point (panics caught, messages recorded).
fn entry(name: &str, body: impl FnOnce() -> Result<()>) -> ncclResult_t {
    guard(name, std::ptr::null_mut(), || body().map(|()| ncclSuccess))
}

/// Allocates `size` bytes of emu device memory.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuMalloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    entry("rcclrsEmuMalloc", || {
        non_null(ptr, "ptr")?;
        let out = emu()?.alloc(size)?;
        // SAFETY: checked non-NULL; the caller passes a writable pointer.
        unsafe { *ptr = out.cast() };
        Ok(())
    })
}

/// Frees what rcclrsEmuMalloc (or ncclMemAlloc on emu) returned.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuFree(ptr: *mut c_void) -> ncclResult_t {
    // SAFETY: the caller promises no queued work still uses the memory.
    entry("rcclrsEmuFree", || Ok(unsafe { emu()?.free(ptr.cast()) }?))
}

/// Copies `bytes` between host and emu device memory in any direction;
/// returns when done (not ordered with any stream).
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> ncclResult_t {
    entry("rcclrsEmuMemcpy", || {
        if bytes > 0 {
            non_null(dst, "dst")?;
            non_null(src, "src")?;
        }
        // SAFETY: the caller promises both ranges are valid and disjoint.
        Ok(unsafe { emu()?.copy(dst.cast(), src.cast(), bytes) }?)
    })
}

/// Enqueues a copy on `stream` (NULL: the default stream).
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: cudaStream_t,
) -> ncclResult_t {
    entry("rcclrsEmuMemcpyAsync", || {
        if bytes > 0 {
            non_null(dst, "dst")?;
            non_null(src, "src")?;
        }
        let stream = emu()?.stream(stream as usize)?;
        // SAFETY: the caller promises both ranges stay valid until the
        // stream has run the copy.
        Ok(unsafe { stream.copy_async(dst.cast(), src.cast(), bytes) }?)
    })
}

/// Creates a stream with its own worker.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuStreamCreate(stream: *mut cudaStream_t) -> ncclResult_t {
    entry("rcclrsEmuStreamCreate", || {
        non_null(stream, "stream")?;
        let created = emu()?.create_stream()?;
        // SAFETY: checked non-NULL.
        unsafe { *stream = created.raw() as cudaStream_t };
        Ok(())
    })
}

/// Destroys a stream; what it holds still runs.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuStreamDestroy(stream: cudaStream_t) -> ncclResult_t {
    entry("rcclrsEmuStreamDestroy", || {
        Ok(emu()?.destroy_stream(stream as usize)?)
    })
}

/// Waits until everything enqueued on `stream` so far has run (at most
/// `RCCL_TIMEOUT_MS`), and reports the stream's first failure.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuStreamSynchronize(stream: cudaStream_t) -> ncclResult_t {
    entry("rcclrsEmuStreamSynchronize", || {
        Ok(emu()?.stream(stream as usize)?.synchronize(deadline())?)
    })
}

/// Creates an event.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuEventCreate(event: *mut rcclrsEmuEvent_t) -> ncclResult_t {
    entry("rcclrsEmuEventCreate", || {
        non_null(event, "event")?;
        let created = emu()?.create_event()?;
        let handle = EVENT_BASE + 16 * NEXT_EVENT.fetch_add(1, Ordering::Relaxed);
        lock(&EVENTS).insert(handle, created);
        // SAFETY: checked non-NULL.
        unsafe { *event = handle as rcclrsEmuEvent_t };
        Ok(())
    })
}

/// Destroys an event (a stream still waiting on it keeps it alive).
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuEventDestroy(event: rcclrsEmuEvent_t) -> ncclResult_t {
    entry("rcclrsEmuEventDestroy", || {
        lock(&EVENTS)
            .remove(&(event as usize))
            .map(drop)
            .ok_or_else(|| invalid(format!("{event:p} is not a live event of emu device 0")))
    })
}

/// Records `event` on `stream`.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuEventRecord(
    event: rcclrsEmuEvent_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    entry("rcclrsEmuEventRecord", || {
        let event = self::event(event)?;
        Ok(emu()?.stream(stream as usize)?.record(event.as_ref())?)
    })
}

/// Sets `*done` to 1 when the event's latest record has completed, else 0.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuEventQuery(
    event: rcclrsEmuEvent_t,
    done: *mut c_int,
) -> ncclResult_t {
    entry("rcclrsEmuEventQuery", || {
        non_null(done, "done")?;
        let finished = self::event(event)?.query();
        // SAFETY: checked non-NULL.
        unsafe { *done = c_int::from(finished) };
        Ok(())
    })
}

/// Waits for the event's latest record to complete (at most
/// `RCCL_TIMEOUT_MS`).
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuEventSynchronize(event: rcclrsEmuEvent_t) -> ncclResult_t {
    entry("rcclrsEmuEventSynchronize", || {
        Ok(self::event(event)?.synchronize(deadline())?)
    })
}

/// Makes work enqueued on `stream` after this wait for the event's latest
/// record.
#[no_mangle]
pub unsafe extern "C" fn rcclrsEmuStreamWaitEvent(
    stream: cudaStream_t,
    event: rcclrsEmuEvent_t,
) -> ncclResult_t {
    entry("rcclrsEmuStreamWaitEvent", || {
        let event = self::event(event)?;
        Ok(emu()?.stream(stream as usize)?.wait_event(event.as_ref())?)
    })
}
