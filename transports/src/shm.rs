//! The shared-memory transport: both FIFOs of a connection live in one
//! POSIX shared-memory segment that the two ranks map, so each side writes
//! straight into memory the other reads. Works between threads of one
//! process and between processes of one host alike.
//!
//! The lower rank of a pair creates the segment (mode 0600) and sends its
//! name to the peer through the bootstrap; the peer maps it and unlinks the
//! name at once, so nothing is left in `/dev/shm` once both sides hold
//! their mapping, even if a process dies later.

use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::auth_tcp::fill_random;
use crate::fifo::{fifo_bytes, Fifo, FifoMemory, FifoShape, Protocol};
use crate::process::ProcessId;
use crate::transport::{Context, Pending, Setup, Transport};
use crate::{bounded_note, Connection, MAX_NOTE};

/// A mapped shared-memory segment.
pub struct ShmSegment {
    ptr: *mut u8,
    len: usize,
    name: String,
    /// Whether this side created the name and must remove it if the peer
    /// never did (it never joined).
    created: bool,
}

// SAFETY: the mapping is owned by this value and unmapped only on drop;
// concurrent access to its bytes is ordered by the FIFO protocol's atomics.
unsafe impl Send for ShmSegment {}
// SAFETY: as above; shared references only expose the base pointer.
unsafe impl Sync for ShmSegment {}

impl ShmSegment {
    /// Creates and maps a new zeroed segment of `len` bytes, readable and
    /// writable by this user only. Its memory is reserved at once: when
    /// `/dev/shm` lacks room, this fails with `OutOfMemory` and a message
    /// naming `/dev/shm`, the segment, its size and what is free (rather
    /// than the process dying of SIGBUS at its first touch of a page that
    /// has nothing behind it).
    pub fn create(len: usize) -> io::Result<ShmSegment> {
        let mut random = [0u8; 8];
        fill_random(&mut random)?;
        let name = format!(
            "/rccl-{}-{}",
            std::process::id(),
            random
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let c_name = CString::new(name.clone()).expect("no NUL in segment name");
        // SAFETY: c_name is a valid NUL-terminated string; O_EXCL refuses to
        // reuse an existing name.
        let fd = unsafe {
            libc::shm_open(
                c_name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(crate::explain_fd_limit(io::Error::last_os_error()));
        }
        let mapped = reserve(fd, &name, len).and_then(|()| map(fd, len));
        // SAFETY: fd is open and no longer needed once mapped (or failed).
        unsafe { libc::close(fd) };
        match mapped {
            Ok(ptr) => Ok(ShmSegment {
                ptr,
                len,
                name,
                created: true,
            }),
            Err(err) => {
                // SAFETY: c_name is valid; removes the name we just created.
                unsafe { libc::shm_unlink(c_name.as_ptr()) };
                Err(err)
            }
        }
    }

    /// Maps the existing segment `name`, which must be `len` bytes long.
    pub fn open(name: &str, len: usize) -> io::Result<ShmSegment> {
        if !name.starts_with("/rccl-") || name[1..].contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a segment name of ours",
            ));
        }
        let c_name = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in segment name"))?;
        // SAFETY: c_name is a valid NUL-terminated string.
        let fd = unsafe { libc::shm_open(c_name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            return Err(crate::explain_fd_limit(io::Error::last_os_error()));
        }
        let mapped = (|| {
            // SAFETY: an all-zero stat is a valid value for fstat to fill.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fd is open; stat is a valid out-pointer.
            if unsafe { libc::fstat(fd, &mut stat) } != 0 {
                return Err(io::Error::last_os_error());
            }
            if stat.st_size as usize != len {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("segment {name} is {} bytes, expected {len}", stat.st_size),
                ));
            }
            map(fd, len)
        })();
        // SAFETY: fd is open and no longer needed.
        unsafe { libc::close(fd) };
        Ok(ShmSegment {
            ptr: mapped?,
            len,
            name: name.to_string(),
            created: false,
        })
    }

    /// The first byte of the mapping (page-aligned, zeroed at creation,
    /// valid for the length it was created or opened with while the
    /// segment lives).
    pub fn base(&self) -> *mut u8 {
        self.ptr
    }

    /// The segment's name, for the peer to open.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes the segment's name; the mappings stay valid.
    pub fn unlink(&self) -> io::Result<()> {
        let c_name = CString::new(self.name.clone()).expect("no NUL in segment name");
        // SAFETY: c_name is a valid NUL-terminated string.
        if unsafe { libc::shm_unlink(c_name.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Gives the new segment behind `fd` its `len` bytes, reserving the
/// memory (tmpfs only allocates pages when they are first touched, and a
/// touch that finds no room raises SIGBUS).
pub(crate) fn reserve(fd: libc::c_int, name: &str, len: usize) -> io::Result<()> {
    let size = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
    loop {
        // SAFETY: fd is an open shared-memory object we own.
        match unsafe { libc::posix_fallocate(fd, 0, size) } {
            0 => return Ok(()),
            libc::EINTR => {}
            // A filesystem that cannot reserve: only set the size.
            libc::EOPNOTSUPP => {
                // SAFETY: as above.
                if unsafe { libc::ftruncate(fd, size) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                return Ok(());
            }
            libc::ENOSPC => {
                return Err(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!(
                        "/dev/shm has no room for shared-memory segment {name} of {} ({len} \
                         bytes): {} (No space left on device)",
                        mib(len as u64),
                        free_space(fd)
                    ),
                ))
            }
            err => return Err(io::Error::from_raw_os_error(err)),
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// What is free on the filesystem holding `fd`, for messages.
fn free_space(fd: libc::c_int) -> String {
    // SAFETY: an all-zero statvfs is a valid value for fstatvfs to fill.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; stat is a valid out-pointer.
    if unsafe { libc::fstatvfs(fd, &mut stat) } != 0 {
        return format!("free space unknown ({})", io::Error::last_os_error());
    }
    let block = stat.f_frsize as u64;
    format!(
        "{} free of {}",
        mib(stat.f_bavail as u64 * block),
        mib(stat.f_blocks as u64 * block)
    )
}

pub(crate) fn map(fd: libc::c_int, len: usize) -> io::Result<*mut u8> {
    // SAFETY: mapping a shared object we hold open, at a kernel-chosen
    // address; the result is checked against MAP_FAILED.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(ptr.cast())
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        if self.created {
            // The peer unlinks the name as soon as it maps the segment; if
            // it never came, nobody else will (ENOENT otherwise: ignored).
            let _ = self.unlink();
        }
        // SAFETY: ptr/len describe a mapping this value owns.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl FifoMemory for ShmSegment {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A page-aligned window of a segment holding one FIFO.
struct Window {
    segment: Arc<dyn FifoMemory>,
    offset: usize,
    len: usize,
}

impl FifoMemory for Window {
    fn base(&self) -> *mut u8 {
        self.segment.base().wrapping_add(self.offset)
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Bytes of one side's note area: a length word, then the note.
const NOTE_AREA: usize = 4096;
/// Where a note's bytes start in its area.
const NOTE_TEXT: usize = 64;
/// Where in its note area the side that maps the segment says it has.
const NOTE_MAPPED: usize = 8;
const _: () = assert!(NOTE_TEXT + MAX_NOTE <= NOTE_AREA);

fn fifos_bytes(shape: &FifoShape) -> usize {
    2 * Protocol::ALL
        .iter()
        .map(|&p| fifo_bytes(p, shape.nslots, shape.slot_bytes(p)))
        .sum::<usize>()
}

/// Bytes of a segment holding a connection's FIFOs (one per protocol and
/// direction), then each side's note area: why it closed the connection.
pub fn segment_bytes(shape: &FifoShape) -> usize {
    fifos_bytes(shape) + 2 * NOTE_AREA
}

/// `e`, a failure to make a segment, with what to change when `/dev/shm`
/// lacks room (`smaller`: the setting that sizes the segment).
pub fn explain_no_room(e: io::Error, smaller: &str) -> io::Error {
    if e.kind() != io::ErrorKind::OutOfMemory {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "{e}; give the job a larger /dev/shm (e.g. docker run --shm-size), {smaller}, or \
             set NCCL_SHM_DISABLE=1 (TCP between the ranks of a host)"
        ),
    )
}

/// A connection whose FIFOs live in memory both sides map: a shared
/// segment, or device memory one process exported and the other mapped.
pub struct ShmConnection {
    /// Per protocol (indexed like `Protocol::ALL`), the FIFO each way.
    send: Vec<Fifo>,
    recv: Vec<Fifo>,
    segment: Arc<dyn FifoMemory>,
    /// What carries it, for messages (`SHM`, `P2P`).
    transport: &'static str,
    /// Offsets of this side's note area and the peer's.
    my_note: usize,
    peer_note: usize,
    closed: AtomicBool,
    /// The peer's process, when it is another process visible here.
    peer: Option<ProcessId>,
}

impl ShmConnection {
    /// The connection over `segment`: per protocol, the creator sends
    /// through the first FIFO and receives through the second; the other
    /// side the reverse.
    pub fn new(segment: ShmSegment, creator: bool, shape: &FifoShape) -> ShmConnection {
        ShmConnection::over(Arc::new(segment), creator, shape, "SHM")
    }

    /// The connection over any memory both sides map, laid out as a
    /// segment of [`segment_bytes`]; `transport` names it in messages.
    pub fn over(
        segment: Arc<dyn FifoMemory>,
        creator: bool,
        shape: &FifoShape,
        transport: &'static str,
    ) -> ShmConnection {
        assert!(
            segment.len() >= segment_bytes(shape),
            "segment too small for its FIFOs"
        );
        let (mut send, mut recv) = (Vec::new(), Vec::new());
        let mut offset = 0;
        for proto in Protocol::ALL {
            let slot_bytes = shape.slot_bytes(proto);
            let one = fifo_bytes(proto, shape.nslots, slot_bytes);
            let mut fifo = || {
                let window = Window {
                    segment: segment.clone(),
                    offset,
                    len: one,
                };
                offset += one;
                Fifo::in_memory(Arc::new(window), proto, shape.nslots, slot_bytes)
            };
            let (first, second) = (fifo(), fifo());
            let (out, inbound) = if creator {
                (first, second)
            } else {
                (second, first)
            };
            send.push(out);
            recv.push(inbound);
        }
        let notes = fifos_bytes(shape);
        let (my_note, peer_note) = if creator {
            (notes, notes + NOTE_AREA)
        } else {
            (notes + NOTE_AREA, notes)
        };
        let conn = ShmConnection {
            send,
            recv,
            segment,
            transport,
            my_note,
            peer_note,
            closed: AtomicBool::new(false),
            peer: None,
        };
        if !creator {
            conn.note_word(conn.my_note + NOTE_MAPPED)
                .store(1, Ordering::Release);
        }
        conn
    }

    /// Whether the peer has mapped the segment this side created. Until
    /// it has, the segment's name is the only way in, and it goes when
    /// this side closes.
    pub fn peer_mapped(&self) -> bool {
        self.note_word(self.peer_note + NOTE_MAPPED)
            .load(Ordering::Acquire)
            != 0
    }

    /// Watches the peer's process: a wait blocked on this connection
    /// learns that the peer died (it cannot close the connection itself)
    /// from [`Connection::peer_gone`]. Ignored for this process and for a
    /// process not visible here (another pid namespace).
    pub fn watch_peer(&mut self, peer: ProcessId) {
        if peer.pid != std::process::id() && peer.visible() {
            self.peer = Some(peer);
        }
    }

    fn note_len(&self, note: usize) -> &AtomicU32 {
        self.note_word(note)
    }

    fn note_word(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= self.segment.len());
        // SAFETY: the word lies inside the mapping, 4-aligned (note areas
        // are 4096-aligned, their words at fixed aligned offsets), and is
        // only accessed atomically by either side.
        unsafe { &*self.segment.base().add(offset).cast::<AtomicU32>() }
    }
}

impl Connection for ShmConnection {
    fn send_fifo(&self, proto: Protocol) -> &Fifo {
        &self.send[proto.index()]
    }
    fn recv_fifo(&self, proto: Protocol) -> &Fifo {
        &self.recv[proto.index()]
    }
    fn failure(&self) -> Option<String> {
        None
    }
    /// The whole segment: both FIFOs and the notes, mapped at each side.
    fn held_bytes(&self) -> usize {
        self.segment.len()
    }
    fn transport(&self) -> &'static str {
        self.transport
    }
    fn close_with(&self, note: &str) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            let note = bounded_note(note).as_bytes();
            // SAFETY: this side's note area lies inside the mapping and only
            // this side writes it, once; the peer reads it after the length.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    note.as_ptr(),
                    self.segment.base().add(self.my_note + NOTE_TEXT),
                    note.len(),
                )
            };
            self.note_len(self.my_note)
                .store(note.len() as u32, Ordering::Release);
        }
        for fifo in self.send.iter().chain(&self.recv) {
            fifo.fail();
        }
    }
    fn peer_note(&self) -> Option<String> {
        let len = (self.note_len(self.peer_note).load(Ordering::Acquire) as usize).min(MAX_NOTE);
        if len == 0 {
            return None;
        }
        // SAFETY: the peer wrote `len` bytes before publishing the length;
        // the area holds MAX_NOTE bytes, and `len` is bounded by it.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.segment.base().add(self.peer_note + NOTE_TEXT), len)
        };
        Some(String::from_utf8_lossy(bytes).into_owned())
    }
    fn peer_gone(&self) -> Option<String> {
        self.peer.as_ref().and_then(ProcessId::gone)
    }
}

impl Drop for ShmConnection {
    fn drop(&mut self) {
        // Tell a peer still waiting on this connection that it is gone.
        for fifo in self.send.iter().chain(&self.recv) {
            fifo.fail();
        }
    }
}

/// Shared memory between processes (or threads) of one host: both FIFOs
/// of a pair in one segment that the leading rank creates and the other
/// maps and unlinks at once.
pub(crate) struct Shm;

impl Transport for Shm {
    fn name(&self) -> &'static str {
        "SHM/direct"
    }

    fn can_connect(&self, cx: &Context<'_>, peer: usize) -> bool {
        !cx.shm_disable && cx.same_host(peer)
    }

    fn setup(&self, cx: &Context<'_>, peer: usize, _channel: usize) -> io::Result<Setup> {
        let len = segment_bytes(&cx.fifo);
        if !cx.leads(peer) {
            return Ok(Setup {
                info: None,
                pending: Box::new(ShmPending::Maps),
            });
        }
        let segment = ShmSegment::create(len)
            .map_err(|e| explain_no_room(e, "a smaller NCCL_BUFFSIZE or NCCL_MAX_NCHANNELS"))?;
        Ok(Setup {
            info: Some(segment.name().as_bytes().to_vec()),
            pending: Box::new(ShmPending::Created(Some(segment), None)),
        })
    }
}

enum ShmPending {
    /// This side leads: the segment it created, then the connection over
    /// it, held back until the peer has mapped the segment. Handed out
    /// earlier, a send could complete into it and this side close (and
    /// remove the name) before the peer ever reached the bytes.
    Created(Option<ShmSegment>, Option<ShmConnection>),
    /// This side maps the segment whose name the peer sends.
    Maps,
}

impl Pending for ShmPending {
    fn awaits_peer_info(&self) -> bool {
        matches!(self, ShmPending::Maps)
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        peer: usize,
        peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        let made = match self {
            ShmPending::Created(segment, made) => {
                if let Some(segment) = segment.take() {
                    *made = Some(connection(cx, peer, segment, true));
                }
                return Ok(made
                    .take_if(|conn| conn.peer_mapped())
                    .map(|conn| Box::new(conn) as Box<dyn Connection>));
            }
            ShmPending::Maps => {
                let name = std::str::from_utf8(peer_info).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "a malformed segment name")
                })?;
                let segment = ShmSegment::open(name, segment_bytes(&cx.fifo))?;
                segment.unlink()?;
                connection(cx, peer, segment, false)
            }
        };
        Ok(Some(Box::new(made)))
    }
}

/// The connection over `segment`, watching the peer's process.
fn connection(cx: &Context<'_>, peer: usize, segment: ShmSegment, creator: bool) -> ShmConnection {
    let mut conn = ShmConnection::new(segment, creator, &cx.fifo);
    let process = cx.endpoints[peer].process;
    if process.start != 0 {
        conn.watch_peer(process);
    }
    conn
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: FifoShape = FifoShape {
        nslots: 4,
        slot_bytes: [256, 256, 256],
    };

    #[test]
    fn both_sides_see_each_others_slots_and_the_name_goes_away() {
        let len = segment_bytes(&SHAPE);
        let created = ShmSegment::create(len).unwrap();
        let name = created.name().to_string();
        let mode = std::fs::metadata(format!("/dev/shm{name}")).map(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & 0o777
        });
        assert_eq!(mode.unwrap(), 0o600);
        let a = ShmConnection::new(created, true, &SHAPE);
        let opened = ShmSegment::open(&name, len).unwrap();
        opened.unlink().unwrap();
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
        let b = ShmConnection::new(opened, false, &SHAPE);
        for proto in Protocol::ALL {
            let slot = a.send_fifo(proto).try_reserve().unwrap();
            // SAFETY: the slot holds 256 bytes.
            unsafe { slot.write(42) };
            a.send_fifo(proto).publish(1, Default::default());
            let (got, len, _) = b.recv_fifo(proto).try_peek().unwrap();
            // SAFETY: published with one byte.
            assert_eq!((unsafe { got.read() }, len), (42, 1));
            b.recv_fifo(proto).release();
            assert!(b.send_fifo(proto).try_reserve().is_some());
        }
    }

    #[test]
    fn open_refuses_foreign_names_and_wrong_sizes() {
        assert!(ShmSegment::open("/etc-passwd", 4096).is_err());
        assert!(ShmSegment::open("/rccl-../x", 4096).is_err());
        let created = ShmSegment::create(8192).unwrap();
        let err = ShmSegment::open(created.name(), 4096).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        created.unlink().unwrap();
    }

    #[test]
    fn a_closing_note_reaches_the_peer_and_a_dead_peer_is_seen() {
        let len = segment_bytes(&SHAPE);
        let created = ShmSegment::create(len).unwrap();
        let name = created.name().to_string();
        let a = ShmConnection::new(created, true, &SHAPE);
        let opened = ShmSegment::open(&name, len).unwrap();
        opened.unlink().unwrap();
        let mut b = ShmConnection::new(opened, false, &SHAPE);
        assert_eq!(b.peer_note(), None);
        a.close_with("rank 0 (host h, pid 1) failed: it was tested");
        assert!(b.recv_fifo(Protocol::Simple).failed());
        assert_eq!(
            b.peer_note().as_deref(),
            Some("rank 0 (host h, pid 1) failed: it was tested")
        );
        assert_eq!(a.peer_note(), None);
        // A process that exited.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|t| crate::process::parse_stat(&t))
            .map_or(0, |s| s.1);
        b.watch_peer(ProcessId { pid, start });
        child.wait().unwrap();
        if b.peer.is_some() {
            assert!(b.peer_gone().is_some());
        }
        // This process is never watched.
        let mut c = b;
        c.peer = None;
        c.watch_peer(ProcessId::current().unwrap());
        assert!(c.peer.is_none() && c.peer_gone().is_none());
    }

    #[test]
    fn a_creator_whose_peer_never_came_removes_the_name() {
        let created = ShmSegment::create(8192).unwrap();
        let path = format!("/dev/shm{}", created.name());
        assert!(std::path::Path::new(&path).exists());
        drop(created);
        assert!(!std::path::Path::new(&path).exists());
    }
}
