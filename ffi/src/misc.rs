//! Version, error strings, memory, registration, windows, one-sided
//! operations and encryption.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::*;
use crate::check::{invalid, non_null, usage, write_out};
use crate::comms::comm_of;
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
    /// host memory.
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
                None => {
                    let mut out: *mut c_void = std::ptr::null_mut();
                    // SAFETY: `out` is a valid place for the pointer, and
                    // PAGE a power of two multiple of the pointer size.
                    let rc = unsafe { libc::posix_memalign(&mut out, PAGE, size.max(1)) };
                    if rc != 0 {
                        return Err(rccl::Error::System(format!(
                            "cannot allocate {size} bytes: {}",
                            std::io::Error::from_raw_os_error(rc)
                        )));
                    }
                    out
                }
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
                // SAFETY: the caller vouches that `ptr` came from
                // ncclMemAlloc and is freed once; the device says it is
                // its memory.
                Some(device) => unsafe { device.free(ptr.cast()) }
                    .map_err(|e| invalid(format!("ncclMemFree: {e}")))?,
                // SAFETY: as above: NULL, or host memory from
                // ncclMemAlloc's posix_memalign, freed once.
                None => unsafe { libc::free(ptr) },
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
            regions(&entry, false).insert(token, (buff as usize, size));
            // SAFETY: the caller vouches for `handle` as an out-argument.
            unsafe { write_out(handle, token as *mut c_void, "handle")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        guard("ncclCommDeregister", comm, || {
            let entry = registry::lookup(comm)?;
            if regions(&entry, false).remove(&(handle as usize)).is_none() {
                return Err(invalid(format!("{handle:p} is not a registration of this communicator")));
            }
            Ok(ncclSuccess)
        })
    }

    /// Records the buffer as a window of this rank; windows serve
    /// ncclWinGetUserPtr (the one-sided operations are not supported).
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut ncclWindow_t, winFlags: c_int
    ) -> ncclResult_t {
        guard("ncclCommWindowRegister", comm, || {
            non_null(win, "win")?;
            non_null(buff, "buff")?;
            let (entry, _) = comm_of(comm)?;
            if winFlags & !0x0f != 0 {
                return Err(invalid(format!("unknown winFlags {winFlags:#x}")));
            }
            let token = next_token();
            regions(&entry, true).insert(token, (buff as usize, size));
            // SAFETY: the caller vouches for `win` as an out-argument.
            unsafe { write_out(win, token as ncclWindow_t, "win")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        guard("ncclCommWindowDeregister", comm, || {
            let entry = registry::lookup(comm)?;
            if regions(&entry, true).remove(&(win as usize)).is_none() {
                return Err(invalid(format!("{win:p} is not a window of this communicator")));
            }
            Ok(ncclSuccess)
        })
    }

    fn ncclWinGetUserPtr / pncclWinGetUserPtr(
        comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void
    ) -> ncclResult_t {
        guard("ncclWinGetUserPtr", comm, || {
            non_null(outUserPtr, "outUserPtr")?;
            let entry = registry::lookup(comm)?;
            let Some(&(addr, _)) = regions(&entry, true).get(&(win as usize)) else {
                return Err(invalid(format!("{win:p} is not a window of this communicator")));
            };
            // SAFETY: the caller vouches for `outUserPtr` as an out-argument.
            unsafe { write_out(outUserPtr, addr as *mut c_void, "outUserPtr")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclPutSignal / pncclPutSignal(
        _localbuff: *const c_void, _count: usize, _datatype: ncclDataType_t, _peer: c_int,
        _peerWin: ncclWindow_t, _peerWinOffset: usize, _sigIdx: c_int, _ctx: c_int,
        _flags: c_uint, comm: ncclComm_t, _stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclPutSignal", comm, || {
            comm_of(comm)?;
            Err(one_sided())
        })
    }

    fn ncclSignal / pncclSignal(
        _peer: c_int, _sigIdx: c_int, _ctx: c_int, _flags: c_uint, comm: ncclComm_t,
        _stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclSignal", comm, || {
            comm_of(comm)?;
            Err(one_sided())
        })
    }

    fn ncclWaitSignal / pncclWaitSignal(
        _nDesc: c_int, _signalDescs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t,
        _stream: cudaStream_t,
    ) -> ncclResult_t {
        guard("ncclWaitSignal", comm, || {
            comm_of(comm)?;
            Err(one_sided())
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

fn one_sided() -> rccl::Error {
    usage(
        "not supported: one-sided operations (ncclPutSignal, ncclSignal, ncclWaitSignal) \
         need remote memory access, which the host transports of rccl-rs do not have",
    )
}

/// The buffers (`windows` false) or windows registered with a communicator.
fn regions(entry: &Entry, windows: bool) -> std::sync::MutexGuard<'_, Regions> {
    if windows {
        lock(&entry.windows)
    } else {
        lock(&entry.registrations)
    }
}
