//! One-sided access within a host: memory that peers write into without
//! the owner taking part, and the signal counters they raise.
//!
//! - **Shareable host memory**: what `ncclMemAlloc` hands out for host
//!   buffers, one anonymous memory file (`memfd_create`) per allocation.
//!   A process of this user and host maps it through the owner's
//!   `/proc/<pid>/fd/<fd>` (the kernel lets only processes that may
//!   inspect the owner open it); having no name, nothing of it outlives
//!   its last mapping, even when a process dies.
//! - **A peer's window** ([`PeerWindow`]): its memory as this rank
//!   addresses it: the peer's own pointer when it runs in this process,
//!   a mapping of its memory file otherwise; writes are bounds-checked.
//! - **A signal block** ([`SignalBlock`]): one per rank, a memory file of
//!   32-bit counters, one per (context, signal index, source rank), that
//!   peers raise with release ordering after their data (so a reader that
//!   acquires the count sees the data), and a bell word a waiter parks on.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::futex;
use crate::shm::{map, reserve};

/// A mapping of a memory file: this process's own (with its descriptor,
/// for peers to open) or a peer's.
struct MemFile {
    ptr: *mut u8,
    len: usize,
    /// The file, open while this process offers it to peers.
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is owned by this value and unmapped only on drop;
// its bytes are plain memory whose users order their accesses.
unsafe impl Send for MemFile {}
// SAFETY: as above.
unsafe impl Sync for MemFile {}

impl MemFile {
    /// A new zeroed file of `len` bytes (at least one), its memory
    /// reserved at once, mapped.
    fn create(len: usize) -> io::Result<MemFile> {
        let len = len.max(1);
        // SAFETY: a valid NUL-terminated name; the flags ask for a
        // close-on-exec descriptor, checked below.
        let raw = unsafe { libc::memfd_create(c"rccl-window".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(crate::explain_fd_limit(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor this call just opened.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        reserve(fd.as_raw_fd(), "a window's memory file", len)?;
        let ptr = map(fd.as_raw_fd(), len)?;
        Ok(MemFile {
            ptr,
            len,
            fd: Some(fd),
        })
    }

    /// Maps the memory file `fd` of process `pid`, which must be `len`
    /// bytes long.
    fn open(owner: &FileId, len: usize) -> io::Result<MemFile> {
        let file = std::fs::File::from(open_file(owner)?);
        let size = file.metadata()?.len();
        if size != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is {size} bytes, expected {len}", owner.path()),
            ));
        }
        Ok(MemFile {
            ptr: map(file.as_raw_fd(), len)?,
            len,
            fd: None,
        })
    }

    /// How a peer process finds the file.
    fn id(&self) -> FileId {
        FileId {
            pid: std::process::id(),
            fd: self.fd.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
        }
    }
}

impl Drop for MemFile {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping this value owns.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A memory file as a peer process opens it: its owner and descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileId {
    pub pid: u32,
    pub fd: i32,
}

impl FileId {
    /// How a process of this host finds `fd` of this process, for as long
    /// as this process keeps it open.
    pub fn offer(fd: &impl AsRawFd) -> FileId {
        FileId {
            pid: std::process::id(),
            fd: fd.as_raw_fd(),
        }
    }

    fn path(&self) -> String {
        format!("/proc/{}/fd/{}", self.pid, self.fd)
    }
}

/// Opens, read and write, the file another process of this host offers
/// as `id` (the kernel lets only a process that may inspect the owner).
pub fn open_file(id: &FileId) -> io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(id.path())
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", id.path())))?;
    Ok(file.into())
}

/// Shareable allocations of this process by base address, with how many
/// registered windows use each.
static SHAREABLE: Mutex<BTreeMap<usize, Shareable>> = Mutex::new(BTreeMap::new());

struct Shareable {
    file: MemFile,
    len: usize,
    windows: usize,
}

fn shareable() -> std::sync::MutexGuard<'static, BTreeMap<usize, Shareable>> {
    SHAREABLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates `len` bytes (at least one page, page-aligned, zeroed) of host
/// memory that processes of this host can map.
pub fn alloc_shareable(len: usize) -> io::Result<*mut u8> {
    let file = MemFile::create(len)?;
    let base = file.ptr;
    shareable().insert(
        base as usize,
        Shareable {
            file,
            len,
            windows: 0,
        },
    );
    Ok(base)
}

/// Frees an allocation of [`alloc_shareable`]: `Ok(false)` when `ptr` is
/// not one, an error naming it when a registered window still uses it.
pub fn free_shareable(ptr: *mut u8) -> Result<bool, String> {
    let mut all = shareable();
    let Some(entry) = all.get(&(ptr as usize)) else {
        return Ok(false);
    };
    if entry.windows > 0 {
        return Err(format!(
            "{ptr:p} ({} bytes) is still in {} registered window(s): deregister them first",
            entry.len, entry.windows
        ));
    }
    all.remove(&(ptr as usize));
    Ok(true)
}

/// How a peer process finds a window of shareable memory: its memory
/// file and that file's length, and the window's offset in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    pub file: FileId,
    pub file_len: usize,
    pub offset: usize,
}

/// The shareable allocation holding all of `[ptr, ptr + len)`, counted as
/// used by one more window until [`release`]; `None` when no allocation of
/// [`alloc_shareable`] holds it.
pub fn export(ptr: *const u8, len: usize) -> Option<Export> {
    let addr = ptr as usize;
    let mut all = shareable();
    let (&base, entry) = all.range_mut(..=addr).next_back()?;
    let file_len = entry.file.len;
    if addr.checked_add(len)? > base + file_len {
        return None;
    }
    entry.windows += 1;
    Some(Export {
        file: entry.file.id(),
        file_len,
        offset: addr - base,
    })
}

/// Ends the use [`export`] counted for the window at `ptr`.
pub fn release(ptr: *const u8) {
    let addr = ptr as usize;
    if let Some((_, entry)) = shareable().range_mut(..=addr).next_back() {
        entry.windows = entry.windows.saturating_sub(1);
    }
}

/// A peer's window as this rank writes into it.
pub struct PeerWindow {
    base: *mut u8,
    len: usize,
    /// The mapping of a peer in another process (kept alive).
    mapping: Option<MemFile>,
}

// SAFETY: the window is plain memory the peer lent for remote writes;
// the pointer is only written through `write`, ordered by signals.
unsafe impl Send for PeerWindow {}
// SAFETY: as above.
unsafe impl Sync for PeerWindow {}

impl PeerWindow {
    /// A window of a peer in this process, at its own address.
    pub fn in_process(base: *mut u8, len: usize) -> PeerWindow {
        PeerWindow {
            base,
            len,
            mapping: None,
        }
    }

    /// Maps the window `export` describes, `len` bytes, of a peer in
    /// another process of this host.
    pub fn map(export: &Export, len: usize) -> io::Result<PeerWindow> {
        if export
            .offset
            .checked_add(len)
            .is_none_or(|end| end > export.file_len)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a window of {len} bytes at offset {} does not fit its memory file of {} bytes",
                    export.offset, export.file_len
                ),
            ));
        }
        let mapping = MemFile::open(&export.file, export.file_len)?;
        Ok(PeerWindow {
            base: mapping.ptr.wrapping_add(export.offset),
            len,
            mapping: Some(mapping),
        })
    }

    /// Bytes this rank mapped to reach the window (the peer's whole
    /// memory file), 0 for a peer in this process.
    pub fn mapped_bytes(&self) -> usize {
        self.mapping.as_ref().map_or(0, |m| m.len)
    }

    /// The window's first byte as this process addresses it (for readers
    /// that order their accesses with the owner, such as collectives on
    /// symmetric windows).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of `len` bytes at `offset` in the window; `Err` with
    /// the window's length when they do not fit.
    pub fn address(&self, offset: usize, len: usize) -> Result<*mut u8, usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.base.wrapping_add(offset)),
            _ => Err(self.len),
        }
    }

    /// Copies `src` into the window at `offset`; `Err` with the window's
    /// length when it does not fit.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), usize> {
        let dst = self.address(offset, src.len())?;
        // SAFETY: `[dst, dst + src.len())` lies in the window (checked
        // above), which the peer keeps mapped while it is registered;
        // `src` is a distinct local buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
        }
        Ok(())
    }
}

/// Bytes before the counters: the bell and the sleepers, on their own
/// cache line.
const HEADER: usize = 64;

/// A rank's signal counters in a memory file.
pub struct SignalBlock {
    file: MemFile,
    slots: usize,
}

impl SignalBlock {
    /// The bytes a block of `slots` counters takes.
    pub fn bytes(slots: usize) -> usize {
        HEADER + slots * 4
    }

    /// Creates a zeroed block of `slots` counters.
    pub fn create(slots: usize) -> io::Result<SignalBlock> {
        Ok(SignalBlock {
            file: MemFile::create(Self::bytes(slots))?,
            slots,
        })
    }

    /// Maps a peer's block `id` of `slots` counters.
    pub fn open(id: &FileId, slots: usize) -> io::Result<SignalBlock> {
        Ok(SignalBlock {
            file: MemFile::open(id, Self::bytes(slots))?,
            slots,
        })
    }

    /// How peers open the block.
    pub fn id(&self) -> FileId {
        self.file.id()
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is 4-aligned and inside the mapping (callers pass
        // the header words or `HEADER + 4 * slot` with `slot < slots`);
        // the mapping is page-aligned and lives as long as `self`.
        unsafe { &*self.file.ptr.add(at).cast::<AtomicU32>() }
    }

    fn counter(&self, slot: usize) -> &AtomicU32 {
        assert!(slot < self.slots, "signal slot {slot} of {}", self.slots);
        self.word(HEADER + 4 * slot)
    }

    /// The word a waiter parks on: it changes with every signal.
    pub fn bell(&self) -> &AtomicU32 {
        self.word(0)
    }

    /// How many waiters are parked on the bell.
    pub fn sleepers(&self) -> &AtomicU32 {
        self.word(4)
    }

    /// Raises counter `slot` by one, after every write this thread made
    /// before (release), and wakes parked waiters.
    pub fn raise(&self, slot: usize) {
        self.counter(slot).fetch_add(1, Ordering::Release);
        self.bell().fetch_add(1, Ordering::Release);
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            futex::wake_all(self.bell());
        }
    }

    /// Counter `slot` (wrapping), with every write made before the raises
    /// it counts visible (acquire).
    pub fn count(&self, slot: usize) -> u32 {
        self.counter(slot).load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_window_sees_the_writes_and_refuses_bytes_past_its_end() {
        let base = alloc_shareable(8192).unwrap();
        let ex = export(base.wrapping_add(4096), 4096).unwrap();
        assert_eq!(ex.offset, 4096);
        let peer = PeerWindow::map(&ex, 4096).unwrap();
        peer.write(8, &[1, 2, 3]).unwrap();
        // SAFETY: the allocation holds 8192 bytes.
        let seen = unsafe { std::slice::from_raw_parts(base.add(4096 + 8), 3) };
        assert_eq!(seen, [1, 2, 3]);
        assert_eq!(peer.write(4095, &[0, 0]), Err(4096));
        assert!(free_shareable(base)
            .unwrap_err()
            .contains("1 registered window"));
        release(base.wrapping_add(4096));
        assert_eq!(free_shareable(base), Ok(true));
        assert_eq!(free_shareable(base), Ok(false));
    }

    #[test]
    fn ranges_outside_a_shareable_allocation_are_not_exported() {
        let base = alloc_shareable(4096).unwrap();
        assert!(export(base, 4097).is_none());
        let mut local = [0u8; 16];
        assert!(export(local.as_mut_ptr(), 16).is_none());
        assert_eq!(free_shareable(base), Ok(true));
    }

    #[test]
    fn a_raised_signal_counts_in_everymapping() {
        let mine = SignalBlock::create(4).unwrap();
        let theirs = SignalBlock::open(&mine.id(), 4).unwrap();
        theirs.raise(2);
        theirs.raise(2);
        assert_eq!(mine.count(2), 2);
        assert_eq!(mine.count(1), 0);
        assert_eq!(mine.bell().load(Ordering::Relaxed), 2);
    }
}
