//! The emulated GPU (`RCCL_DEVICE=emu`): one device, index 0, for machines
//! without a GPU, so that the stream-ordered engine runs on every commit.
//!
//! Device memory is host memory from `mmap` that the backend tracks, so
//! the engine can tell it from host memory and keep the host path off it.
//! Streams are ordered queues, each run by a worker thread; events mark a
//! point of a stream's order; every wait has a deadline. Device work runs
//! through the kernels' interpreter compiled for the host (`launch.rs`).

mod launch;
mod stream;

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::{Device, Error, Event, Memory, Result, Stream, Work, WorkLaunch};

pub use launch::works_run;
pub use stream::{EmuEvent, EmuStream};

/// The backend's name in messages.
const BACKEND: &str = "emu";

/// How long a stream's worker waits for an event or for the other
/// streams of a joint task before it gives up with an error
/// (`RCCL_TIMEOUT_MS`, the engine's timeout, default 300 s).
pub fn wait_limit() -> Duration {
    rccl_env::var("RCCL_TIMEOUT_MS")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(Duration::from_secs(300), Duration::from_millis)
}

/// The emulated device.
pub struct Emu {
    /// Live allocations: start address -> length.
    allocations: RwLock<BTreeMap<usize, usize>>,
    /// How many there are: classification skips the lock while none is.
    live: AtomicUsize,
    /// The memfd behind each shareable allocation, by start address.
    shareable: Mutex<HashMap<usize, OwnedFd>>,
    /// Host allocations ([`Device::alloc_host`]): start address -> length.
    host: Mutex<HashMap<usize, usize>>,
    /// Streams by raw handle (the default stream, 0, included once made).
    streams: Mutex<HashMap<usize, Arc<EmuStream>>>,
    /// Numbers the streams created.
    next_stream: AtomicUsize,
    wait_limit: Duration,
    /// Held while a joint task is enqueued on its streams, so that two
    /// joint tasks reach every stream they share in the same order.
    joint_order: Mutex<()>,
}

static EMU: LazyLock<Emu> = LazyLock::new(|| Emu {
    allocations: RwLock::new(BTreeMap::new()),
    live: AtomicUsize::new(0),
    shareable: Mutex::new(HashMap::new()),
    host: Mutex::new(HashMap::new()),
    streams: Mutex::new(HashMap::new()),
    next_stream: AtomicUsize::new(0),
    wait_limit: wait_limit(),
    joint_order: Mutex::new(()),
});

static HOST_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// How many host buffers ([`Device::alloc_host`]) the emulated GPU has
/// handed out in this process.
pub fn host_allocations() -> u64 {
    HOST_ALLOCATIONS.load(Ordering::Relaxed)
}

/// The emulated device of this process.
pub fn device() -> &'static Emu {
    &EMU
}

impl Emu {
    /// Bytes of device memory allocated now (shareable and imported
    /// mappings included).
    pub fn bytes_in_use(&self) -> usize {
        self.allocations.read().values().sum()
    }

    fn memory(&self) -> Memory {
        Memory::Device {
            backend: BACKEND,
            index: 0,
        }
    }

    /// The allocation holding `[ptr, ptr + bytes)`, if one does.
    fn holds(&self, ptr: usize, bytes: usize) -> Option<(usize, usize)> {
        let allocations = self.allocations.read();
        let (&start, &len) = allocations.range(..=ptr).next_back()?;
        (ptr < start + len && ptr + bytes <= start + len).then_some((start, len))
    }

    /// Checks that a range is host memory or lies inside one allocation.
    fn check_range(&self, what: &str, ptr: usize, bytes: usize) -> Result<()> {
        if self.classify(ptr as *const u8)?.is_device() && self.holds(ptr, bytes).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{what} {ptr:#x} + {bytes} bytes runs past its emu device allocation"
            )));
        }
        Ok(())
    }

    /// Maps `len` bytes of `fd` (or fresh anonymous pages when `None`)
    /// and lists the mapping as device memory.
    fn map(&self, fd: Option<&OwnedFd>, len: usize, what: &str) -> Result<*mut u8> {
        let (flags, raw) = match fd {
            Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a new mapping at a kernel-chosen address, of fresh pages
        // or of a memory file this call holds open; no existing memory is
        // touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::System(format!(
                "emu device 0: cannot {what} {len} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        self.allocations.write().insert(ptr as usize, len);
        self.live.fetch_add(1, Ordering::Release);
        Ok(ptr.cast())
    }

    fn emu_stream(&self, raw: usize) -> Result<Arc<EmuStream>> {
        // CUDA's legacy (1) and per-thread (2) default streams are the
        // default stream here.
        let raw = if raw <= 2 { 0 } else { raw };
        let mut streams = self.streams.lock();
        if let Some(stream) = streams.get(&raw) {
            return Ok(stream.clone());
        }
        if raw != 0 {
            return Err(Error::InvalidArgument(format!(
                "{raw:#x} is not a stream of emu device 0 (create one with \
                 rcclrsEmuStreamCreate, or pass NULL for the default stream)"
            )));
        }
        let stream = EmuStream::start(0)?;
        streams.insert(0, stream.clone());
        Ok(stream)
    }
}

/// Downcasts a stream of this backend.
fn own_stream(stream: &dyn Stream) -> Result<&EmuStream> {
    stream
        .as_any()
        .downcast_ref::<EmuStream>()
        .ok_or_else(|| Error::InvalidArgument("not a stream of emu device 0".into()))
}

/// Downcasts an event of this backend.
fn own_event(event: &dyn Event) -> Result<&EmuEvent> {
    event
        .as_any()
        .downcast_ref::<EmuEvent>()
        .ok_or_else(|| Error::InvalidArgument("not an event of emu device 0".into()))
}

impl Device for Emu {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn label(&self) -> String {
        "[emu 0]".into()
    }

    fn classify(&self, ptr: *const u8) -> Result<Memory> {
        if self.live.load(Ordering::Acquire) == 0 {
            return Ok(Memory::Host);
        }
        Ok(match self.holds(ptr as usize, 0) {
            Some(_) => self.memory(),
            None => Memory::Host,
        })
    }

    fn allocation(&self, ptr: *const u8) -> Option<(usize, usize)> {
        self.holds(ptr as usize, 0)
    }

    fn alloc(&self, bytes: usize) -> Result<*mut u8> {
        self.map(None, bytes.max(1), "allocate")
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<*mut u8> {
        // Fresh anonymous pages read as zeros.
        self.alloc(bytes)
    }

    unsafe fn free(&self, ptr: *mut u8) -> Result<()> {
        let Some(len) = self.allocations.write().remove(&(ptr as usize)) else {
            return Err(Error::InvalidArgument(format!(
                "{ptr:p} is not an allocation of emu device 0"
            )));
        };
        self.live.fetch_sub(1, Ordering::Release);
        // A shareable allocation's memfd goes with it (a peer that
        // imported it keeps its own mapping).
        self.shareable.lock().remove(&(ptr as usize));
        // SAFETY: the range is a mapping this backend made and no longer
        // lists; the caller promises no work uses it.
        if unsafe { libc::munmap(ptr.cast(), len) } != 0 {
            return Err(Error::System(format!(
                "emu device 0: munmap of {ptr:p}: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }

    fn alloc_host(&self, bytes: usize) -> Result<*mut u8> {
        let len = bytes.max(1);
        let layout = std::alloc::Layout::from_size_align(len, 4096)
            .map_err(|e| Error::InvalidArgument(format!("{bytes} bytes of host memory: {e}")))?;
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::System(format!(
                "emu device 0: cannot allocate {bytes} bytes of host memory"
            )));
        }
        self.host.lock().insert(ptr as usize, len);
        HOST_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()> {
        let Some(len) = self.host.lock().remove(&(ptr as usize)) else {
            return Err(Error::InvalidArgument(format!(
                "{ptr:p} is not a host allocation of emu device 0"
            )));
        };
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("checked at allocation");
        // SAFETY: allocated by alloc_host with this layout, listed until
        // now; the caller promises no work uses it.
        unsafe { std::alloc::dealloc(ptr, layout) };
        Ok(())
    }

    unsafe fn copy(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.check_range("destination", dst as usize, bytes)?;
        self.check_range("source", src as usize, bytes)?;
        // SAFETY: the caller promises both ranges are valid and disjoint;
        // device ranges were checked to lie inside live mappings.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        Ok(())
    }

    fn stream(&self, raw: usize) -> Result<Arc<dyn Stream>> {
        Ok(self.emu_stream(raw)?)
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        // Handles are opaque to their users, as a cudaStream_t is: a
        // counter, clear of 0, 1 and 2 (CUDA's default, legacy and
        // per-thread streams).
        let raw = 0x5e00_0000 + 0x10 * self.next_stream.fetch_add(1, Ordering::Relaxed);
        let stream = EmuStream::start(raw)?;
        self.streams.lock().insert(raw, stream.clone());
        Ok(stream)
    }

    fn destroy_stream(&self, raw: usize) -> Result<()> {
        if raw == 0 {
            return Err(Error::InvalidArgument(
                "the default stream cannot be destroyed".into(),
            ));
        }
        let stream = self.streams.lock().remove(&raw).ok_or_else(|| {
            Error::InvalidArgument(format!("{raw:#x} is not a stream of emu device 0"))
        })?;
        stream.close();
        Ok(())
    }

    fn create_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(EmuEvent::new(self.wait_limit)))
    }

    fn enqueue_joint(&self, streams: &[Arc<dyn Stream>], work: Work) -> Result<()> {
        let mut own: Vec<&EmuStream> = Vec::with_capacity(streams.len());
        for stream in streams {
            let stream = own_stream(stream.as_ref())?;
            if !own.iter().any(|s| s.raw() == stream.raw()) {
                own.push(stream);
            }
        }
        match own.as_slice() {
            [] => Err(Error::InvalidArgument("a joint task needs a stream".into())),
            [one] => one.enqueue(work),
            many => {
                let _order = self.joint_order.lock();
                stream::enqueue_joint(many, work, self.wait_limit)
            }
        }
    }

    fn launch_work(&self, streams: &[Arc<dyn Stream>], launch: WorkLaunch) -> Result<()> {
        self.enqueue_joint(streams, Box::new(move || launch::run(launch)))
    }

    fn rdma_receives_ordered(&self) -> bool {
        // Its device memory is host memory: ordered like any other.
        true
    }

    fn shares_memory(&self) -> bool {
        true
    }

    fn alloc_shareable(&self, bytes: usize) -> Result<*mut u8> {
        let len = bytes.max(1);
        let name = CString::new(memfd_name(std::process::id())).expect("no NUL in the name");
        // SAFETY: name is a valid NUL-terminated string.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::System(format!(
                "emu device 0: memfd_create: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: raw is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("{bytes} bytes is too large")))?;
        // SAFETY: fd is an open memory file; fresh pages read as zeros.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(Error::System(format!(
                "emu device 0: cannot size shareable memory of {bytes} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = self.map(Some(&fd), len, "allocate shareable")?;
        self.shareable.lock().insert(ptr as usize, fd);
        Ok(ptr)
    }

    fn export(&self, ptr: *mut u8) -> Result<(OwnedFd, usize)> {
        let shareable = self.shareable.lock();
        let fd = shareable.get(&(ptr as usize)).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{ptr:p} is not a shareable allocation of emu device 0"
            ))
        })?;
        let len = self.holds(ptr as usize, 0).map_or(0, |(_, len)| len);
        let copy = fd
            .try_clone()
            .map_err(|e| Error::System(format!("emu device 0: exporting {ptr:p}: {e}")))?;
        Ok((copy, len))
    }

    fn export_dmabuf(&self, ptr: *mut u8) -> Result<(OwnedFd, u64)> {
        self.export(ptr).map(|(fd, _)| (fd, 0))
    }

    fn import(&self, handle: OwnedFd, bytes: usize) -> Result<*mut u8> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", handle.as_raw_fd()))
            .map(|path| path.to_string_lossy().into_owned())
            .unwrap_or_default();
        let exporter = link
            .strip_prefix("/memfd:")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|name| name.strip_prefix(MEMFD_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "emu device 0: the handle is not emu device memory ({link})"
                ))
            })?;
        if exporter == std::process::id() {
            return Err(Error::InvalidArgument(
                "emu device 0: a process cannot open a memory handle it exported itself \
                 (as CUDA's)"
                    .into(),
            ));
        }
        // SAFETY: an all-zero stat is a valid value for fstat to fill.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the handle is open; stat is a valid out-pointer.
        if unsafe { libc::fstat(handle.as_raw_fd(), &mut stat) } != 0
            || (stat.st_size as usize) < bytes
        {
            return Err(Error::InvalidArgument(format!(
                "emu device 0: the handle holds {} bytes, not the {bytes} asked for",
                stat.st_size
            )));
        }
        // The mapping keeps the memory; the descriptor closes here.
        self.map(Some(&handle), bytes.max(1), "map imported")
    }
}

/// How the memfds of shareable emu memory are named: the prefix, then the
/// exporting process's pid (`/proc/<pid>/fd` shows `/memfd:<name>`).
const MEMFD_PREFIX: &str = "rccl-emu-";

fn memfd_name(pid: u32) -> String {
    format!("{MEMFD_PREFIX}{pid}")
}

impl Stream for EmuStream {
    fn raw(&self) -> usize {
        EmuStream::raw(self)
    }

    fn enqueue(&self, work: Work) -> Result<()> {
        self.push(Box::new(move || {
            work();
            Ok(())
        }))
    }

    unsafe fn copy_async(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        EMU.check_range("destination", dst as usize, bytes)?;
        EMU.check_range("source", src as usize, bytes)?;
        let (dst, src) = (dst as usize, src as usize);
        self.push(Box::new(move || {
            // SAFETY: the caller promised both ranges stay valid until the
            // copy has run, which is now.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
            Ok(())
        }))
    }

    fn record(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        self.record_event(event)
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        self.wait_for(event)
    }

    fn synchronize(&self, deadline: std::time::Instant) -> Result<()> {
        EmuStream::synchronize(self, deadline)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Event for EmuEvent {
    fn query(&self) -> bool {
        EmuEvent::query(self)
    }

    fn synchronize(&self, deadline: std::time::Instant) -> Result<()> {
        EmuEvent::synchronize(self, deadline)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests;
