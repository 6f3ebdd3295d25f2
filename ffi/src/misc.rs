//! Version, error strings, memory, registration, windows, one-sided
//! operations and encryption.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::*;
use crate::check::{invalid, non_null, write_out};
use crate::comms::{comm_of, now_or_at_group_end};
use crate::error::{self, guard};
use crate::registry::{self, lock, next_token, Entry, Regions};

const PAGE: usize = 4096;

nccl_api! {
    /// The API level implemented (NCCL_VERSION_CODE of ffi/include/nccl.h).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        guard("ncclGetVersion", std::ptr::null_mut(), || {
            non_null(version, "version")?;
            // SAFETY: the caller vouches for `version` as an out-argument.
            unsafe { write_out(version, NCCL_VERSION_CODE, "version")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclGetErrorString / pncclGetErrorString(result: ncclResult_t) -> *const c_char {
        error::error_string(result).as_ptr()
    }

    /// The communicator's last error message (NULL or a communicator
    /// without one: this thread's). Never NULL; "" when nothing failed.
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        std::panic::catch_unwind(|| error::last_error(comm)).unwrap_or(c"".as_ptr())
    }

    /// Deprecated upstream; nothing to reset here.
    fn ncclResetDebugInit / pncclResetDebugInit() {}
}

/// Exported beside `ncclResetDebugInit`, without a profiling alias, as
/// NCCL's library does; nothing to reset here either.
#[no_mangle]
pub extern "C" fn ncclResetDebugInitInternal() {}

nccl_api! {
    /// Device memory of the active device (`RCCL_DEVICE`), shareable
    /// with other processes where the device shares memory (as NCCL's,
    /// a cuMem allocation with an exportable handle), else page-aligned
    /// host memory that other processes of this host can map (windows).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        guard("ncclMemAlloc", std::ptr::null_mut(), || {
            non_null(ptr, "ptr")?;
            let out = match rccl::device::active() {
                Some(device) => if device.shares_memory() {
                        device.alloc_shareable(size)
                    } else {
                        device.alloc(size)
                    }
                    .map_err(|e| rccl::Error::System(format!("cannot allocate {size} bytes: {e}")))?
                    .cast(),
                // Shareable so that peers in other processes can map
                // windows of it; plain memory where that cannot be had.
                None => match rccl::alloc_shareable_host(size) {
                    Ok(out) => out.cast(),
                    Err(_) => aligned_host(size)?,
                },
            };
            // SAFETY: the caller vouches for `ptr` as an out-argument.
            unsafe { write_out(ptr, out, "ptr")? };
            Ok(ncclSuccess)
        })
    }

    /// Frees what ncclMemAlloc returned (NULL: nothing to do).
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        guard("ncclMemFree", std::ptr::null_mut(), || {
            let device = match rccl::device::active() {
                Some(d) => d
                    .classify(ptr as *const u8)
                    .map_err(|e| invalid(format!("ncclMemFree: {e}")))?
                    .is_device()
                    .then_some(d),
                None => None,
            };
            match device {
                Some(device) => {
                    let (start, len) = device.allocation(ptr as *const u8).unwrap_or((ptr as usize, 1));
                    rccl::check_device_free(start as *mut u8, len)?;
                    // SAFETY: the caller vouches that `ptr` came from
                    // ncclMemAlloc and is freed once; the device says it
                    // is its memory.
                    unsafe { device.free(ptr.cast()) }
                        .map_err(|e| invalid(format!("ncclMemFree: {e}")))?
                }
                None => {
                    if !rccl::free_shareable_host(ptr.cast())? {
                        // SAFETY: as above: NULL, or host memory from
                        // ncclMemAlloc's posix_memalign, freed once.
                        unsafe { libc::free(ptr) }
                    }
                }
            }
            Ok(ncclSuccess)
        })
    }

    /// Host memory needs no registration: returns a handle to deregister.
    fn ncclCommRegister / pncclCommRegister(
        comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void
    ) -> ncclResult_t {
        guard("ncclCommRegister", comm, || {
            non_null(handle, "handle")?;
            non_null(buff, "buff")?;
            let entry = registry::lookup(comm)?;
            let token = next_token();
            regions(&entry).insert(token, (buff as usize, size));
            // SAFETY: the caller vouches for `handle` as an out-argument.
            unsafe { write_out(handle, token as *mut c_void, "handle")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        guard("ncclCommDeregister", comm, || {
            let entry = registry::lookup(comm)?;
            if regions(&entry).remove(&(handle as usize)).is_none() {
                return Err(invalid(format!("{handle:p} is not a registration of this communicator")));
            }
            Ok(ncclSuccess)
        })
    }

    /// Registers a window of every rank, collectively (see
    /// `rccl::Communicator::register_window`); inside a group, at its end
    /// (`*win` is set then), so that one thread may register the windows
    /// of several ranks.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut ncclWindow_t, winFlags: c_int
    ) -> ncclResult_t {
        guard("ncclCommWindowRegister", comm, || {
            non_null(win, "win")?;
            let (_, c) = comm_of(comm)?;
            // Unknown flags are a rank's problem every rank hears of.
            let flags = c_uint::try_from(winFlags).unwrap_or(c_uint::MAX);
            let (buff, win) = (buff as usize, win as usize);
            now_or_at_group_end(move || {
                // SAFETY: the caller lends `buff` for `size` bytes until
                // ncclCommWindowDeregister, as nccl.h asks of a window.
                let window = unsafe { c.register_window(buff as *mut u8, size, flags)? };
                // SAFETY: the caller vouches for `win` as an out-argument,
                // valid until the call (or its group) returns.
                unsafe { write_out(win as *mut ncclWindow_t, window.handle() as ncclWindow_t, "win") }
            })?;
            Ok(ncclSuccess)
        })
    }

    /// Collective as registration; inside a group, at its end.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        guard("ncclCommWindowDeregister", comm, || {
            let (_, c) = comm_of(comm)?;
            let window = window_of(win);
            now_or_at_group_end(move || c.deregister_window(window))?;
            Ok(ncclSuccess)
        })
    }

    fn ncclWinGetUserPtr / pncclWinGetUserPtr(
        comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void
    ) -> ncclResult_t {
        guard("ncclWinGetUserPtr", comm, || {
            non_null(outUserPtr, "outUserPtr")?;
            let (_, c) = comm_of(comm)?;
            let (base, _) = c.window_buffer(window_of(win))?;
            // SAFETY: the caller vouches for `outUserPtr` as an out-argument.
            unsafe { write_out(outUserPtr, base.cast(), "outUserPtr")? };
            Ok(ncclSuccess)
        })
    }

    /// Host memory: done before it returns, whatever the stream (inside a
    /// group too). A window of device memory: enqueued on the stream.
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int,
        peerWin: ncclWindow_t, peerWinOffset: usize, sigIdx: c_int, ctx: c_int,
        flags: c_uint, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclPutSignal", comm, || {
            let (_, c) = comm_of(comm)?;
            let bytes = rccl::DataType::from_raw(datatype)?
                .size()
                .checked_mul(count)
                .ok_or_else(|| invalid(format!("count {count} overflows")))?;
            if bytes > 0 {
                non_null(localbuff, "localbuff")?;
            }
            no_flags(flags)?;
            let (peer, sig, ctx) = (index(peer, "peer")?, index(sigIdx, "sigIdx")?, index(ctx, "ctx")?);
            let window = window_of(peerWin);
            // Asked only once a device window exists, so that a put before
            // any window fails as a signal does (signals come with the
            // first window), not as an unknown window.
            if c.has_device_window()? && c.window_on_device(window)? {
                // SAFETY: the caller vouches that `localbuff` holds `count`
                // elements of `datatype` until the stream ran the put.
                unsafe { c.put_signal_on_stream(localbuff.cast(), bytes, peer, window,
                    peerWinOffset, sig, ctx, stream as usize)? };
                return Ok(ncclSuccess);
            }
            let data: &[u8] = if bytes == 0 {
                &[]
            } else {
                // SAFETY: the caller vouches that `localbuff` (checked
                // non-NULL) holds `count` elements of `datatype`.
                unsafe { std::slice::from_raw_parts(localbuff.cast::<u8>(), bytes) }
            };
            c.put_signal(data, peer, window, peerWinOffset, sig, ctx)?;
            Ok(ncclSuccess)
        })
    }

    fn ncclSignal / pncclSignal(
        peer: c_int, sigIdx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclSignal", comm, || {
            let (_, c) = comm_of(comm)?;
            no_flags(flags)?;
            let (peer, sig, ctx) = (index(peer, "peer")?, index(sigIdx, "sigIdx")?, index(ctx, "ctx")?);
            if c.has_device_window()? {
                c.signal_on_stream(peer, sig, ctx, stream as usize)?;
            } else {
                c.signal(peer, sig, ctx)?;
            }
            Ok(ncclSuccess)
        })
    }

    fn ncclWaitSignal / pncclWaitSignal(
        nDesc: c_int, signalDescs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclWaitSignal", comm, || {
            let (_, c) = comm_of(comm)?;
            let n = usize::try_from(nDesc)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| invalid(format!("nDesc {nDesc} is not positive")))?;
            non_null(signalDescs, "signalDescs")?;
            // SAFETY: the caller vouches that `signalDescs` (checked
            // non-NULL) holds `nDesc` descriptors.
            let raw = unsafe { std::slice::from_raw_parts(signalDescs, n) };
            let descs = raw
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    Ok(rccl::WaitDesc {
                        peer: index(d.peer, "peer")?,
                        sig: index(d.sigIdx, "sigIdx")?,
                        ctx: index(d.ctx, "ctx")?,
                        count: usize::try_from(d.opCnt).ok().filter(|&n| n > 0).ok_or_else(|| {
                            invalid(format!("signalDescs[{i}].opCnt {} is not positive", d.opCnt))
                        })?,
                    })
                })
                .collect::<rccl::Result<Vec<_>>>()?;
            // Inside a group the wait runs (or, with a device window, is
            // enqueued on the stream) at its end, after the group's puts
            // and signals (which never wait) went out.
            if c.has_device_window()? {
                let stream = stream as usize;
                now_or_at_group_end(move || c.wait_signal_on_stream(&descs, stream))?;
            } else {
                now_or_at_group_end(move || c.wait_signal(&descs))?;
            }
            Ok(ncclSuccess)
        })
    }

    /// Sets the process's encryption of its TCP connections (bootstrap and
    /// the Socket network): `NCCL_ENCRYPTION_MODE_PSK` with a key of at
    /// least 32 bytes, or `NCCL_ENCRYPTION_MODE_NONE` (as a NULL config)
    /// for plaintext. Connections made from then on use it.
    fn ncclSetEncryption / pncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t {
        guard("ncclSetEncryption", std::ptr::null_mut(), || {
            if config.is_null() {
                rccl::set_encryption(None)?;
                return Ok(ncclSuccess);
            }
            // SAFETY: the caller vouches that `config` (non-NULL) is an
            // initialized ncclEncryptionConfig_t.
            let config = unsafe { &*config };
            if config.magic != NCCL_API_MAGIC {
                return Err(invalid(format!(
                    "config->magic is {:#x}: initialize it with NCCL_ENCRYPTION_CONFIG_INITIALIZER",
                    config.magic
                )));
            }
            match config.mode {
                0 => rccl::set_encryption(None)?,
                1 => {
                    if config.psk.is_null() {
                        return Err(invalid(
                            "NCCL_ENCRYPTION_MODE_PSK needs config->psk, a NUL-terminated key",
                        ));
                    }
                    // SAFETY: the caller vouches that a non-NULL psk is a
                    // NUL-terminated string.
                    let psk = unsafe { std::ffi::CStr::from_ptr(config.psk) }.to_bytes();
                    if psk.len() < rccl::MIN_PSK_BYTES {
                        return Err(invalid(format!(
                            "config->psk has {} bytes: a PSK needs at least {}",
                            psk.len(),
                            rccl::MIN_PSK_BYTES
                        )));
                    }
                    rccl::set_encryption(Some(psk))?;
                }
                other => {
                    return Err(invalid(format!(
                        "config->mode is {other}: use NCCL_ENCRYPTION_MODE_NONE (0) or \
                         NCCL_ENCRYPTION_MODE_PSK (1)"
                    )))
                }
            }
            Ok(ncclSuccess)
        })
    }
}

/// `size` bytes of page-aligned host memory.
fn aligned_host(size: usize) -> rccl::Result<*mut c_void> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `out` is a valid place for the pointer, and PAGE a power of
    // two multiple of the pointer size.
    let rc = unsafe { libc::posix_memalign(&mut out, PAGE, size.max(1)) };
    if rc != 0 {
        return Err(rccl::Error::System(format!(
            "cannot allocate {size} bytes: {}",
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    Ok(out)
}

fn window_of(win: ncclWindow_t) -> rccl::Window {
    rccl::Window::from_handle(win as u64)
}

/// A non-negative `value` of argument `what`.
fn index(value: c_int, what: &str) -> rccl::Result<usize> {
    usize::try_from(value).map_err(|_| invalid(format!("{what} {value} is negative")))
}

/// The `flags` of one-sided calls: reserved, 0.
fn no_flags(flags: c_uint) -> rccl::Result<()> {
    if flags != 0 {
        return Err(invalid(format!("flags {flags:#x}: must be 0 (reserved)")));
    }
    Ok(())
}

/// The buffers registered with a communicator.
fn regions(entry: &Entry) -> std::sync::MutexGuard<'_, Regions> {
    lock(&entry.registrations)
}
