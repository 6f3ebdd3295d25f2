//! Windows of device memory between processes of one host: the owner
//! offers its allocation through the device's export (a file descriptor
//! it keeps open while the window lives), a peer opens that descriptor
//! through the owner's process and maps it with the device's import, so
//! that the window is device memory of the peer's device too, which its
//! streams copy into.

use std::os::fd::OwnedFd;

use rccl_device::Device;
use rccl_transports::{Export, FileId};

/// The active device, when `base` is its device memory.
pub(super) fn device_of(base: *const u8) -> Option<&'static dyn Device> {
    rccl_device::active().filter(|d| d.classify(base).is_ok_and(|m| m.is_device()))
}

/// How peers in other processes find the `size` bytes at `base`, with
/// the exported descriptor they open it through (kept open by the
/// caller while the window lives); `None` when the memory is not a
/// shareable allocation holding all of them (not from `ncclMemAlloc`).
pub(super) fn offer(device: &dyn Device, base: *mut u8, size: usize) -> Option<(Export, OwnedFd)> {
    if !device.shares_memory() {
        return None;
    }
    let (start, len) = device.allocation(base)?;
    if (base as usize).checked_add(size)? > start.checked_add(len)? {
        return None;
    }
    let (handle, file_len) = device.export(start as *mut u8).ok()?;
    let export = Export {
        file: FileId::offer(&handle),
        file_len,
        offset: base as usize - start,
    };
    Some((export, handle))
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
    /// of this host) with this process's device; `size` bytes of it at
    /// the export's offset make the window.
    pub(super) fn map(export: &Export, size: usize) -> Result<Imported, String> {
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
        let handle = rccl_transports::open_file(&export.file).map_err(|e| e.to_string())?;
        let base = device
            .import(handle, export.file_len)
            .map_err(|e| e.to_string())?;
        Ok(Imported { device, base })
    }

    /// The window's first byte in this process.
    pub(super) fn window(&self, export: &Export) -> *mut u8 {
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
