//! Windows of device memory between processes of one host: the owner
//! offers its allocation through the device's export, a file descriptor
//! that only travels as itself (a CUDA driver's export is no file a peer
//! could reopen): it serves the descriptor on an abstract Unix socket
//! with `SCM_RIGHTS` while the window lives ([`ServedFd`]), its name and
//! token published over the authenticated bootstrap; a peer calls,
//! receives the descriptor and maps it with the device's import, so
//! that the window is device memory of the peer's device too, which its
//! streams copy into.

use std::time::Instant;

use rccl_device::Device;
use rccl_transports::{ServedFd, FD_TOKEN};

/// The active device, when `base` is its device memory.
pub(super) fn device_of(base: *const u8) -> Option<&'static dyn Device> {
    rccl_device::active().filter(|d| d.classify(base).is_ok_and(|m| m.is_device()))
}

/// How a process of this host maps a window of device memory: where the
/// allocation's descriptor is served, the allocation's length and the
/// window's offset in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DeviceExport {
    /// The abstract socket name of the [`ServedFd`].
    pub name: String,
    pub token: [u8; FD_TOKEN],
    pub file_len: usize,
    pub offset: usize,
}

/// How peers in other processes find the `size` bytes at `base`, with
/// the server of the exported descriptor (kept by the caller while the
/// window lives); `Ok(None)` when the memory is not a shareable
/// allocation holding all of them (not from `ncclMemAlloc`).
pub(super) fn offer(
    device: &dyn Device,
    base: *mut u8,
    size: usize,
) -> Result<Option<(DeviceExport, ServedFd)>, String> {
    if !device.shares_memory() {
        return Ok(None);
    }
    let Some((start, len)) = device.allocation(base) else {
        return Ok(None);
    };
    let end = (base as usize).checked_add(size);
    if end.is_none_or(|end| Some(end) > start.checked_add(len)) {
        return Ok(None);
    }
    let Ok((handle, file_len)) = device.export(start as *mut u8) else {
        return Ok(None);
    };
    let served = rccl_transports::serve_fd(handle)
        .map_err(|e| format!("cannot serve its exported device memory to peers: {e}"))?;
    let export = DeviceExport {
        name: served.name.clone(),
        token: served.token,
        file_len,
        offset: base as usize - start,
    };
    Ok(Some((export, served)))
}

/// A peer's device memory mapped into this process; unmapped on drop.
pub(super) struct Imported {
    device: &'static dyn Device,
    base: *mut u8,
}

// SAFETY: the mapping belongs to this value alone; its bytes are written
// by stream work that the one-sided calls order.
unsafe impl Send for Imported {}
// SAFETY: as above.
unsafe impl Sync for Imported {}

impl Imported {
    /// Maps the allocation `export` names (a peer's, in another process
    /// of this host) with this process's device, its descriptor fetched
    /// before `deadline`; `size` bytes of it at the export's offset make
    /// the window.
    pub(super) fn map(
        export: &DeviceExport,
        size: usize,
        deadline: Instant,
    ) -> Result<Imported, String> {
        if export
            .offset
            .checked_add(size)
            .is_none_or(|end| end > export.file_len)
        {
            return Err(format!(
                "a window of {size} bytes at offset {} does not fit its allocation of {} bytes",
                export.offset, export.file_len
            ));
        }
        let device = rccl_device::active()
            .filter(|d| d.shares_memory())
            .ok_or_else(|| {
                "this process has no device that maps device memory of another process \
                 (RCCL_DEVICE)"
                    .to_string()
            })?;
        let handle = rccl_transports::fetch_fd(export.name.as_bytes(), &export.token, deadline)
            .map_err(|e| e.to_string())?;
        let base = device
            .import(handle, export.file_len)
            .map_err(|e| e.to_string())?;
        Ok(Imported { device, base })
    }

    /// The window's first byte in this process.
    pub(super) fn window(&self, export: &DeviceExport) -> *mut u8 {
        self.base.wrapping_add(export.offset)
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: `base` is this value's import; the window using it is
        // deregistered, and its users keep it registered until their
        // stream work ran.
        if let Err(e) = unsafe { self.device.free(self.base) } {
            tracing::warn!("unmapping a peer's device window at {:p}: {e}", self.base);
        }
    }
}
