//! A connection to one peer over any [`Net`]: a FIFO each way, moved by the
//! process's network proxy thread.
//!
//! The executor fills `send` slots and drains `recv` slots, as with every
//! transport. The proxy posts an `isend` for each published `send` slot,
//! whole (its header carries the piece's length and tag, so the tag travels
//! with the bytes and no copy is made), and frees the slot when the send
//! completes. It keeps an `irecv` posted on every free `recv` slot and
//! publishes a slot when its receive completes, after checking that the
//! header agrees with the size received. Sends and receives complete in
//! order, so slots move in order.
//!
//! Two communicators make one connection: this rank's sending communicator
//! to the peer's listener and the receiving one the peer's sending
//! communicator reached.
//!
//! Closing with a note ([`NetConnection::close_with`]) lets the slots
//! already published go first (for at most [`DRAIN_MAX`]), then sends the
//! note as one more message, whose header has the length [`NOTE_LEN`]: the
//! peer's proxy records it and fails the peer's FIFOs, so its waits end at
//! once with the original cause. Dropping a connection waits (at most
//! [`DRAIN_ON_CLOSE`]) for the slots already published to be sent, so a
//! rank that returns from its last operation and exits at once does not
//! take its last sends with it; then the proxy closes the communicators
//! and drops its handles on the FIFOs, and the drop waits for that (at
//! most [`RELEASE_MAX`]), so the FIFOs' memory is freed on the dropping
//! thread before the drop returns (a suspend gives it back at once).
//! Any error fails both FIFOs with a reason that names the peer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::proxy::{self, Bell, Progress, Work};
use super::{CommRef, Endpoint, MemoryType, Net, NetError, RecvBuffer};
use crate::fifo::{
    control_bytes, fifo_bytes, read_slot_header, write_slot_header, Fifo, FifoMemory, HeapMemory,
    Protocol, Tag, MAX_SLOTS, SLOT_HEADER,
};
use crate::wait::Backoff;
use crate::{bounded_note, Connection, StepObserver, MAX_NOTE};

/// Longest a closing side waits for the slots already published to be
/// sent before its closing note.
const DRAIN_MAX: Duration = Duration::from_secs(1);
/// Longest a closing side waits for its note to be sent. The note needs a
/// receive the peer posts on a free slot: a peer whose slots are all full
/// takes it only once it has read one, which a loaded machine may delay
/// well past a scheduling slice. A note given up on leaves the peer a
/// connection closed with no word, which its device work must take for a
/// crash.
const NOTE_MAX: Duration = Duration::from_secs(1);
/// How long dropping a connection waits for the slots already published
/// to be sent.
const DRAIN_ON_CLOSE: Duration = Duration::from_secs(5);
/// Longest dropping a connection waits for the proxy to close its
/// communicators.
const RELEASE_MAX: Duration = Duration::from_secs(1);

/// The length a closing note's header carries (no piece is that long);
/// its tag's `seq` is the length of the note that follows.
const NOTE_LEN: u32 = u32::MAX;

/// The tag of every message: a connection posts one buffer per receive.
const DATA_TAG: i32 = 0;

/// The connection's life, as both the executor's side and the proxy see
/// it.
const OPEN: u8 = 0;
/// `close_with` left a note for the proxy to send.
const NOTE_ASKED: u8 = 1;
/// The note is sent (or cannot be).
const NOTE_SENT: u8 = 2;
/// The connection was dropped: the proxy closes the communicators.
const DROPPED: u8 = 3;

/// What the executor's side and the proxy share.
struct Shared {
    peer: String,
    phase: AtomicU8,
    /// Whether `close_with` was called (only the first call's note goes).
    closing: AtomicBool,
    note_out: Mutex<Option<String>>,
    note_in: Mutex<Option<String>>,
    failure: Mutex<Option<String>>,
    /// The proxy let go of the connection: its communicators are closed
    /// and its handles on the FIFOs dropped ([`Released`]).
    released: Mutex<bool>,
    /// Signalled when the note is sent and when the proxy lets go.
    changed: Condvar,
    /// Who sees the steps the proxy moves, once set.
    observer: OnceLock<Arc<dyn StepObserver>>,
}

impl Shared {
    fn set_phase(&self, phase: u8) {
        let _released = self.released.lock();
        self.phase.store(phase, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// Waits until `done` or `deadline`.
    fn wait_for(&self, deadline: Instant, done: impl Fn(&Shared, bool) -> bool) {
        let mut released = self.released.lock();
        while !done(self, *released) {
            if self.changed.wait_until(&mut released, deadline).timed_out() {
                return;
            }
        }
    }
}

/// One connection to a peer over a network: a FIFO each way, moved by the
/// process's network proxy thread.
pub struct NetConnection {
    send: Fifo,
    recv: Fifo,
    shared: Arc<Shared>,
    bell: Arc<Bell>,
    transport: &'static str,
}

impl std::fmt::Debug for NetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetConnection")
            .field("transport", &self.transport)
            .field("peer", &self.shared.peer)
            .finish()
    }
}

fn check_shape(nslots: usize, slot_bytes: usize) -> Result<(), NetError> {
    if !(1..=MAX_SLOTS).contains(&nslots) || slot_bytes == 0 || !slot_bytes.is_multiple_of(8) {
        return Err(NetError::InvalidArgument(format!(
            "FIFOs of {nslots} slots of {slot_bytes} bytes (1 to {MAX_SLOTS} slots of a positive multiple of 8 bytes)"
        )));
    }
    Ok(())
}

/// `NET/<name>`, made once per network name (`NET/IB/GDRDMA` for a
/// connection whose slots are device memory the NIC reads and writes).
pub(crate) fn transport_name(net: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock();
    if let Some(name) = names.iter().find(|name| name[4..] == *net) {
        return name;
    }
    let name: &'static str = Box::leak(format!("NET/{net}").into_boxed_str());
    names.push(name);
    name
}

impl NetConnection {
    /// Hands `send_comm` (to the peer) and `recv_comm` (from it) to the
    /// process's network proxy, with FIFOs of `nslots` slots of
    /// `slot_bytes` each way in private memory (every protocol travels as
    /// Simple pieces: a message already says how long a piece is and when
    /// it is complete).
    pub fn start<N: Net>(
        net: Arc<N>,
        send_comm: N::SendComm,
        recv_comm: N::RecvComm,
        nslots: usize,
        slot_bytes: usize,
    ) -> Result<NetConnection, NetError> {
        check_shape(nslots, slot_bytes)?;
        let heap = || -> Arc<dyn FifoMemory> {
            Arc::new(HeapMemory::new(fifo_bytes(
                Protocol::Simple,
                nslots,
                slot_bytes,
            )))
        };
        let memory = [heap(), heap()];
        NetConnection::start_in(net, send_comm, recv_comm, nslots, slot_bytes, memory, false)
    }

    /// As [`NetConnection::start`], for device work: the device's work
    /// fills the FIFO to the peer and drains the one from it, laid out
    /// (Simple) in `memory` (to the peer, from it), which must be zeroed
    /// and [`fifo_bytes`] long. Their slots are registered as device memory
    /// where [`FifoMemory::slots_on_device`] says so (through the dma-buf of
    /// [`FifoMemory::slots_dmabuf`] where there is one). Device work rings no
    /// doorbell, so the proxy polls the connection while the device works
    /// (`keep_polling`).
    pub fn start_for_device<N: Net>(
        net: Arc<N>,
        send_comm: N::SendComm,
        recv_comm: N::RecvComm,
        nslots: usize,
        slot_bytes: usize,
        memory: [Arc<dyn FifoMemory>; 2],
    ) -> Result<NetConnection, NetError> {
        check_shape(nslots, slot_bytes)?;
        let bytes = fifo_bytes(Protocol::Simple, nslots, slot_bytes);
        if memory.iter().any(|mem| mem.len() < bytes) {
            return Err(NetError::InvalidArgument(format!(
                "FIFO memory of less than the {bytes} bytes {nslots} slots of {slot_bytes} need"
            )));
        }
        NetConnection::start_in(net, send_comm, recv_comm, nslots, slot_bytes, memory, true)
    }

    fn start_in<N: Net>(
        net: Arc<N>,
        send_comm: N::SendComm,
        recv_comm: N::RecvComm,
        nslots: usize,
        slot_bytes: usize,
        [send_mem, recv_mem]: [Arc<dyn FifoMemory>; 2],
        device_driven: bool,
    ) -> Result<NetConnection, NetError> {
        let peer = send_comm.peer();
        let proxy_error = |peer: &str, e: std::io::Error| {
            NetError::io("proxy", "starting the network proxy for", peer, &e)
        };
        let bell = proxy::bell().map_err(|e| proxy_error(&peer, e))?;
        let mut note_buf = vec![0u64; (SLOT_HEADER + MAX_NOTE).div_ceil(8)].into_boxed_slice();
        // Only the slots travel: the proxy sends from and receives into
        // them, and keeps the counters itself.
        let slots = |mem: &Arc<dyn FifoMemory>| {
            let memory = match (mem.slots_on_device(), mem.slots_dmabuf()) {
                (false, _) => MemoryType::Host,
                (true, None) => MemoryType::Cuda,
                (true, Some((fd, offset))) => MemoryType::DmaBuf { fd, offset },
            };
            (mem.slots(), mem.len() - control_bytes(), memory)
        };
        let ((send_at, send_len, send_type), (recv_at, recv_len, recv_type)) =
            (slots(&send_mem), slots(&recv_mem));
        // SAFETY: the FIFO memory and the note buffer live in the link
        // (the FIFOs hold the memory), which deregisters them and closes
        // the communicators before it drops them. The FIFO protocol keeps
        // the producers and consumers off slots with requests pending: a
        // published send slot is not written until released, a free
        // receive slot is not read until published.
        let (send_mr, recv_mr, note_mr) = unsafe {
            let send_mr = net.reg_mr(CommRef::Send(&send_comm), send_at, send_len, send_type)?;
            let recv_mr = net.reg_mr(CommRef::Recv(&recv_comm), recv_at, recv_len, recv_type)?;
            let note_mr = net.reg_mr(
                CommRef::Send(&send_comm),
                note_buf.as_mut_ptr().cast(),
                note_buf.len() * 8,
                MemoryType::Host,
            )?;
            (send_mr, recv_mr, note_mr)
        };
        let gpu_direct = send_type != MemoryType::Host || recv_type != MemoryType::Host;
        let send = Fifo::in_memory(send_mem, Protocol::Simple, nslots, slot_bytes);
        let recv = Fifo::in_memory(recv_mem, Protocol::Simple, nslots, slot_bytes);
        let shared = Arc::new(Shared {
            peer,
            phase: AtomicU8::new(OPEN),
            closing: AtomicBool::new(false),
            note_out: Mutex::new(None),
            note_in: Mutex::new(None),
            failure: Mutex::new(None),
            released: Mutex::new(false),
            changed: Condvar::new(),
            observer: OnceLock::new(),
        });
        let link = Link {
            sends: VecDeque::with_capacity(nslots),
            recvs: VecDeque::with_capacity(nslots),
            note: None,
            comms: Some(Comms {
                send: send_comm,
                recv: recv_comm,
                send_mr,
                recv_mr,
                note_mr,
            }),
            net: net.clone(),
            send: send.clone(),
            recv: recv.clone(),
            shared: shared.clone(),
            broken: false,
            device_driven,
            note_buf,
            _released: Released(shared.clone()),
        };
        proxy::adopt(Box::new(link)).map_err(|e| proxy_error(&shared.peer, e))?;
        let name = if gpu_direct {
            format!("{}/GDRDMA", net.name())
        } else {
            net.name().to_string()
        };
        Ok(NetConnection {
            send: send.with_doorbell(bell.clone()),
            recv: recv.with_doorbell(bell.clone()),
            shared,
            bell,
            transport: transport_name(&name),
        })
    }

    /// The FIFO the executor fills towards the peer.
    pub fn send_fifo(&self) -> &Fifo {
        &self.send
    }

    /// The FIFO the executor drains from the peer.
    pub fn recv_fifo(&self) -> &Fifo {
        &self.recv
    }

    /// Why the connection failed, once it has.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().clone()
    }

    /// What the peer said when it closed the connection, if it did.
    pub fn peer_note(&self) -> Option<String> {
        self.shared.note_in.lock().clone()
    }

    /// The peer, as the network names it (its address for sockets).
    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    /// Gives up on the connection: sends `note` (why, cut to fit one of the
    /// peer's slots) after the slots already published (waiting at most a
    /// second for them), if the network takes it within [`NOTE_MAX`], and fails
    /// both FIFOs. Only the first call's note is sent.
    pub fn close_with(&self, note: &str) {
        if !self.shared.closing.swap(true, Ordering::SeqCst) {
            // Pieces already published go first: a peer may still be
            // receiving the last pieces of an operation this rank has
            // finished (the proxy is quick unless the peer stopped
            // reading, hence the bound).
            self.wait_drained(Instant::now() + DRAIN_MAX);
            // The note travels in one of the peer's slots.
            let note = bounded_note(note);
            let mut end = note.len().min(self.recv.slot_bytes());
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            *self.shared.note_out.lock() = Some(note[..end].to_string());
            self.shared.set_phase(NOTE_ASKED);
            crate::fifo::Doorbell::ring(&*self.bell);
            self.shared
                .wait_for(Instant::now() + NOTE_MAX, |shared, released| {
                    released || shared.phase.load(Ordering::SeqCst) != NOTE_ASKED
                });
        }
        self.send.fail();
        self.recv.fail();
    }

    /// Waits until the proxy has sent every published slot, the
    /// connection failed, or `deadline`.
    fn wait_drained(&self, deadline: Instant) {
        let mut backoff = Backoff::new();
        let never_aborted = AtomicBool::new(false);
        while !self.send.is_drained() && !self.send.failed() && self.shared.failure.lock().is_none()
        {
            let park = self.send.producer_park();
            if self.send.is_drained()
                || backoff
                    .snooze(Some(park), deadline, &never_aborted)
                    .is_err()
            {
                return;
            }
        }
    }
}

impl Drop for NetConnection {
    fn drop(&mut self) {
        self.wait_drained(Instant::now() + DRAIN_ON_CLOSE);
        self.shared.set_phase(DROPPED);
        self.send.fail();
        self.recv.fail();
        self.shared
            .wait_for(Instant::now() + RELEASE_MAX, |_, released| released);
        if !*self.shared.released.lock() {
            tracing::warn!(
                remote = %self.shared.peer,
                "the network proxy still holds the connection to {} after {RELEASE_MAX:?}: its \
                 FIFOs ({} bytes) are freed when it lets go",
                self.shared.peer,
                Connection::held_bytes(self)
            );
        }
    }
}

impl Connection for NetConnection {
    fn send_fifo(&self, _proto: Protocol) -> &Fifo {
        NetConnection::send_fifo(self)
    }
    fn recv_fifo(&self, _proto: Protocol) -> &Fifo {
        NetConnection::recv_fifo(self)
    }
    fn failure(&self) -> Option<String> {
        NetConnection::failure(self)
    }
    fn transport(&self) -> &'static str {
        self.transport
    }
    fn close_may_wait(&self) -> bool {
        true
    }
    fn close_with(&self, note: &str) {
        NetConnection::close_with(self, note)
    }
    fn peer_note(&self) -> Option<String> {
        NetConnection::peer_note(self)
    }
    fn observe_steps(&self, observer: Arc<dyn StepObserver>) {
        let _ = self.shared.observer.set(observer);
    }
}

/// The communicators of a link and their registrations.
struct Comms<N: Net> {
    send: N::SendComm,
    recv: N::RecvComm,
    send_mr: N::MemHandle,
    recv_mr: N::MemHandle,
    note_mr: N::MemHandle,
}

/// A connection as the proxy drives it.
struct Link<N: Net> {
    /// Sends in flight, for the published slots from the oldest on, each
    /// with what the observer (if any) said when it was posted.
    sends: VecDeque<(N::Request, usize)>,
    /// Receives in flight, for the free slots from the next to fill on.
    recvs: VecDeque<N::Request>,
    /// The closing note's send, once posted (`Some(None)` once done).
    note: Option<Option<N::Request>>,
    /// `None` once closed.
    comms: Option<Comms<N>>,
    net: Arc<N>,
    /// The proxy's handles: consumer of `send`, producer of `recv`.
    send: Fifo,
    recv: Fifo,
    shared: Arc<Shared>,
    /// Failed: nothing moves until the connection is dropped.
    broken: bool,
    /// Device work fills and drains the FIFOs, ringing no doorbell.
    device_driven: bool,
    /// Where the closing note is built; after `comms` so requests that
    /// read it are gone first.
    note_buf: Box<[u64]>,
    /// Last, so it tells the executor's side only once the fields above,
    /// the proxy's handles on the FIFOs among them, are dropped.
    _released: Released,
}

/// Tells the executor's side, when dropped, that the proxy has let go of
/// the connection: the FIFOs' memory is then the executor's side's alone,
/// freed on its thread when it drops its handles, so a suspend gives it
/// back before it returns.
struct Released(Arc<Shared>);

impl Drop for Released {
    fn drop(&mut self) {
        let mut released = self.0.released.lock();
        *released = true;
        self.0.changed.notify_all();
    }
}

impl<N: Net> Link<N> {
    /// Moves what can move; `Err` with the reason the connection failed.
    fn step(&mut self, moved: &mut bool) -> Result<(), String> {
        let Some(comms) = self.comms.as_mut() else {
            return Ok(());
        };
        let net = &*self.net;
        let peer = &self.shared.peer;
        let open = !self.send.failed();
        if open {
            while self.sends.len() < self.send.nslots() {
                let Some((slot, len)) = self.send.peek_slot(self.sends.len()) else {
                    break;
                };
                match net.isend(&mut comms.send, slot, len, DATA_TAG, &comms.send_mr) {
                    Ok(Some(request)) => {
                        let step = self.shared.observer.get().map_or(0, |observer| {
                            // SAFETY: a published slot starts with the
                            // header its producer wrote; it is not
                            // written again until released.
                            let (piece, tag) = unsafe { read_slot_header(slot) };
                            observer.send_posted(tag, piece as usize)
                        });
                        self.sends.push_back((request, step));
                        *moved = true;
                    }
                    Ok(None) => break,
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        if self.note.is_none() && self.shared.phase.load(Ordering::SeqCst) == NOTE_ASKED {
            let note = self.shared.note_out.lock().clone().unwrap_or_default();
            let buf = self.note_buf.as_mut_ptr().cast::<u8>();
            // SAFETY: the note buffer holds SLOT_HEADER + MAX_NOTE bytes,
            // 8-byte aligned, and the note is at most MAX_NOTE bytes; no
            // request reads it yet.
            unsafe {
                write_slot_header(
                    buf,
                    NOTE_LEN,
                    Tag {
                        seq: note.len() as u32,
                        ..Tag::default()
                    },
                );
                std::ptr::copy_nonoverlapping(note.as_ptr(), buf.add(SLOT_HEADER), note.len());
            }
            match net.isend(
                &mut comms.send,
                buf,
                SLOT_HEADER + note.len(),
                DATA_TAG,
                &comms.note_mr,
            ) {
                Ok(Some(request)) => {
                    self.note = Some(Some(request));
                    *moved = true;
                }
                Ok(None) => {}
                Err(_) => {
                    self.note = Some(None);
                    self.shared.set_phase(NOTE_SENT);
                }
            }
        }
        while let Some((front, step)) = self.sends.front_mut() {
            match net.test(front) {
                Ok(Some(_)) => {
                    if let Some(observer) = self.shared.observer.get() {
                        observer.sent(*step);
                    }
                    self.sends.pop_front();
                    self.send.release();
                    *moved = true;
                }
                Ok(None) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        if let Some(Some(request)) = &mut self.note {
            let sent = net.test(request);
            if !matches!(sent, Ok(None)) {
                self.note = Some(None);
                self.shared.set_phase(NOTE_SENT);
                *moved = true;
            }
        }
        if !open {
            return Ok(());
        }
        let slot_size = SLOT_HEADER + self.recv.slot_bytes();
        while self.recvs.len() < self.recv.nslots() {
            let Some(slot) = self.recv.reserve_slot(self.recvs.len()) else {
                break;
            };
            let buffer = RecvBuffer {
                data: slot,
                size: slot_size,
                tag: DATA_TAG,
                mhandle: &comms.recv_mr,
            };
            match net.irecv(&mut comms.recv, &[buffer]) {
                Ok(Some(request)) => {
                    self.recvs.push_back(request);
                    *moved = true;
                }
                Ok(None) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        while let Some(front) = self.recvs.front_mut() {
            match net.test(front) {
                Ok(Some(sizes)) => {
                    self.recvs.pop_front();
                    let size = sizes.as_slice().first().copied().unwrap_or(0);
                    deliver(&self.recv, size, peer, &self.shared)?;
                    *moved = true;
                }
                Ok(None) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }

    /// Records why the connection failed (unless this side closed it) and
    /// fails both FIFOs.
    fn fail(&mut self, why: String) {
        if !self.send.failed() {
            self.shared.failure.lock().get_or_insert(why);
        }
        self.broken = true;
        self.send.fail();
        self.recv.fail();
        if self.shared.phase.load(Ordering::SeqCst) == NOTE_ASKED {
            self.shared.set_phase(NOTE_SENT);
        }
    }

    /// Closes the communicators; dropping the link then lets the executor's
    /// side go ([`Released`]).
    fn release(&mut self) {
        self.sends.clear();
        self.recvs.clear();
        self.note = None;
        if let Some(comms) = self.comms.take() {
            let net = &*self.net;
            let _ = net.dereg_mr(CommRef::Send(&comms.send), comms.send_mr);
            let _ = net.dereg_mr(CommRef::Send(&comms.send), comms.note_mr);
            let _ = net.dereg_mr(CommRef::Recv(&comms.recv), comms.recv_mr);
            let _ = net.close_send(comms.send);
            let _ = net.close_recv(comms.recv);
        }
    }
}

/// Publishes the received slot (the next to fill) of `size` bytes, or
/// takes the peer's closing note from it.
fn deliver(recv: &Fifo, size: usize, peer: &str, shared: &Shared) -> Result<(), String> {
    let slot = recv
        .reserve_slot(0)
        .expect("a receive was posted on the slot");
    if size < SLOT_HEADER {
        return Err(format!("malformed message of {size} bytes from {peer}"));
    }
    // SAFETY: the receive filled the slot's first `size` >= SLOT_HEADER
    // bytes; the slot is 64-byte aligned.
    let (len, tag) = unsafe { read_slot_header(slot) };
    let body = size - SLOT_HEADER;
    if len == NOTE_LEN {
        let len = (tag.seq as usize).min(body).min(MAX_NOTE);
        // SAFETY: the receive wrote `body` >= len bytes after the header.
        let text = unsafe { std::slice::from_raw_parts(slot.add(SLOT_HEADER), len) };
        let text = String::from_utf8_lossy(text).into_owned();
        shared.note_in.lock().get_or_insert(text.clone());
        return Err(format!("{peer} closed the connection: {text}"));
    }
    if len as usize != body || body > recv.slot_bytes() {
        return Err(format!(
            "malformed message from {peer}: a piece of {len} bytes in a message of {body}"
        ));
    }
    // Seen before it is published, so the call it belongs to is still in
    // progress.
    if let Some(observer) = shared.observer.get() {
        observer.received(tag, body);
    }
    recv.publish(body, tag);
    Ok(())
}

impl<N: Net> Work for Link<N> {
    fn progress(&mut self) -> Progress {
        if self.shared.phase.load(Ordering::SeqCst) == DROPPED {
            self.release();
            return Progress::Finished;
        }
        if self.broken {
            return Progress::Idle;
        }
        let mut moved = false;
        if let Err(why) = self.step(&mut moved) {
            self.fail(why);
            moved = true;
        }
        if moved {
            Progress::Moved
        } else {
            Progress::Idle
        }
    }

    fn wait_on(&self, fds: &mut Vec<libc::pollfd>) -> bool {
        if self.broken || self.comms.is_none() {
            return true;
        }
        if self.device_driven {
            // Device work may publish or release a slot at any time.
            return false;
        }
        let mut pending: Vec<&N::Request> = Vec::with_capacity(2);
        if let Some(front) = self
            .sends
            .front()
            .map(|(request, _)| request)
            .or(self.note.as_ref().and_then(Option::as_ref))
        {
            pending.push(front);
        }
        if !self.send.failed() {
            pending.extend(self.recvs.front());
        }
        let mut exact = true;
        for request in pending {
            match self.net.readiness(request) {
                Some(ready) => fds.push(libc::pollfd {
                    fd: ready.fd,
                    events: if ready.readable {
                        libc::POLLIN
                    } else {
                        libc::POLLOUT
                    },
                    revents: 0,
                }),
                None => exact = false,
            }
        }
        exact
    }
}
