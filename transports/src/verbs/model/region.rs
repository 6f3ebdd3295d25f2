//! The model's memory registration: regions as peers address them and as
//! the model reaches them, and their keys' lifetime.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::super::{MemoryRegion, VerbsError};
use super::Nic;

/// A registered region: peers address it from `addr` (its iova), the
/// model reaches its bytes at `at` (the same address, except for a dma-buf
/// the model mapped itself).
#[derive(Clone, Copy)]
pub(super) struct Region {
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) access: u32,
    pub(super) at: usize,
}

impl Region {
    /// Where the model reaches the byte peers address as `addr` (inside
    /// the region).
    pub(super) fn reach(&self, addr: u64) -> usize {
        self.at + (addr as usize - self.addr)
    }

    pub(super) fn covers(&self, addr: u64, len: u64, access: u32) -> bool {
        self.access & access == access
            && addr >= self.addr as u64
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= (self.addr + self.len) as u64)
    }
}

/// Registers `region` with `nic` under a fresh key; the region (and the
/// model's own mapping of a dma-buf, if any) lives until the returned
/// handle drops.
pub(super) fn register(
    nic: &Arc<Nic>,
    region: Region,
    mapping: Option<Mapping>,
) -> Box<dyn MemoryRegion> {
    let mut state = nic.state.lock();
    let key = state.next_key;
    state.next_key = state.next_key.wrapping_add(0x101);
    state.regions.insert(key, region);
    Box::new(ModelMr {
        nic: nic.clone(),
        key,
        mapping,
    })
}

/// The model's own mapping of a dma-buf's bytes.
pub(super) struct Mapping {
    at: usize,
    len: usize,
    /// Where the registered bytes start in it.
    skip: usize,
}

impl Mapping {
    /// The address of the first registered byte.
    pub(super) fn bytes(&self) -> usize {
        self.at + self.skip
    }
}

/// Maps the `len` bytes at `offset` of the dma-buf `fd`, as a NIC reaches
/// them: through the file.
pub(super) fn map_dmabuf(fd: RawFd, offset: u64, len: usize) -> Result<Mapping, VerbsError> {
    let skip = (offset % 4096) as usize;
    let map_len = skip + len;
    // SAFETY: a fresh shared mapping of the caller's descriptor; the kernel
    // checks the range against the file.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            (offset - skip as u64) as libc::off_t,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(VerbsError::new(
            "ibv_reg_dmabuf_mr",
            io::Error::last_os_error().to_string(),
        ));
    }
    Ok(Mapping {
        at: at as usize,
        len: map_len,
        skip,
    })
}

struct ModelMr {
    nic: Arc<Nic>,
    key: u32,
    mapping: Option<Mapping>,
}

impl MemoryRegion for ModelMr {
    fn lkey(&self) -> u32 {
        self.key
    }

    fn rkey(&self) -> u32 {
        self.key
    }
}

impl Drop for ModelMr {
    fn drop(&mut self) {
        self.nic.state.lock().regions.remove(&self.key);
        if let Some(mapping) = &self.mapping {
            // SAFETY: the model's own mapping, which nothing reaches once
            // the region is gone (the NIC's thread looks regions up under
            // the lock just taken).
            unsafe { libc::munmap(mapping.at as *mut libc::c_void, mapping.len) };
        }
    }
}
