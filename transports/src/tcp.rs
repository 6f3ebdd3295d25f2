//! The TCP socket transport's progress half: one connected socket per
//! connection and two proxy threads that move slots between the local FIFOs
//! and the wire.
//!
//! The executor sees only FIFOs. It fills `send` slots; the send proxy writes
//! each published slot as one frame (a 16-byte header of length and tag,
//! little-endian, then the bytes) and frees it. The receive proxy reads frames straight into free
//! `recv` slots and publishes them. Any socket error, end of stream or
//! malformed frame fails both FIFOs, so a waiting executor returns an error
//! instead of hanging, and the reason is kept for its message.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::fifo::{Fifo, Protocol, Tag};
use crate::wait::Backoff;
use crate::{bounded_note, MAX_NOTE};

/// How long an idle proxy parks before re-checking its stop flag; it is
/// also woken explicitly, so this bounds only a lost wake-up.
const PROXY_PARK_MAX: Duration = Duration::from_millis(100);

/// Longest a closing side waits for the send proxy to put pieces already
/// published on the wire before its closing note.
const DRAIN_MAX: Duration = Duration::from_secs(1);

/// One TCP connection to a peer: a FIFO each way, moved by proxy threads.
pub struct TcpConnection {
    send: Fifo,
    recv: Fifo,
    stream: TcpStream,
    stop: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<String>>>,
    /// Why this side closed the connection, once it has.
    note_out: Mutex<Option<String>>,
    /// Held while a whole frame is written, so a closing note lands
    /// between frames.
    writing: Arc<Mutex<()>>,
    /// Why the peer closed it, as its last frame said.
    note_in: Arc<Mutex<Option<String>>>,
    proxies: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnection")
            .field("peer", &self.stream.peer_addr().ok())
            .finish()
    }
}

impl TcpConnection {
    /// Starts the proxies on an established, authenticated stream, with
    /// FIFOs of `nslots` slots of `slot_bytes` each way. Every protocol
    /// travels as Simple pieces: on a socket the frame header already says
    /// how long a piece is and when it is complete.
    pub fn start(stream: TcpStream, nslots: usize, slot_bytes: usize) -> io::Result<TcpConnection> {
        stream.set_nodelay(true)?;
        let send = Fifo::on_heap(Protocol::Simple, nslots, slot_bytes);
        let recv = Fifo::on_heap(Protocol::Simple, nslots, slot_bytes);
        let stop = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let note_out: Mutex<Option<String>> = Mutex::new(None);
        let writing = Arc::new(Mutex::new(()));
        let note_in: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let peer = stream.peer_addr()?;
        let mut proxies = Vec::with_capacity(2);
        {
            let (fifo, other, stream) = (send.clone(), recv.clone(), stream.try_clone()?);
            let (stop, failure, writing) = (stop.clone(), failure.clone(), writing.clone());
            proxies.push(
                std::thread::Builder::new()
                    .name("rccl-tcp-send".into())
                    .spawn(move || {
                        let result = send_proxy(&fifo, stream, &stop, &writing);
                        finish(result, &fifo, &other, &stop, &failure, peer, "sending to");
                    })?,
            );
        }
        {
            let (fifo, other, stream) = (recv.clone(), send.clone(), stream.try_clone()?);
            let (stop, failure, note) = (stop.clone(), failure.clone(), note_in.clone());
            proxies.push(
                std::thread::Builder::new()
                    .name("rccl-tcp-recv".into())
                    .spawn(move || {
                        let result = recv_proxy(&fifo, stream, &stop, &note);
                        finish(
                            result,
                            &fifo,
                            &other,
                            &stop,
                            &failure,
                            peer,
                            "receiving from",
                        );
                    })?,
            );
        }
        Ok(TcpConnection {
            send,
            recv,
            stream,
            stop,
            failure,
            note_out,
            writing,
            note_in,
            proxies,
        })
    }

    /// Gives up on the connection: sends `note` (why) as a closing frame
    /// right after the last whole frame, if the socket takes it without
    /// waiting, and stops both proxies' work.
    pub fn close_with(&self, note: &str) {
        {
            let mut sent = self.note_out.lock();
            if sent.is_none() {
                // Pieces already published go first: a peer may still be
                // receiving the last pieces of an operation this rank has
                // finished (the proxy is quick unless the peer stopped
                // reading, hence the bound).
                let until = Instant::now() + DRAIN_MAX;
                while !self.send.is_drained()
                    && !self.send.failed()
                    && self.failure.lock().is_none()
                    && Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let note = bounded_note(note).to_string();
                // The send proxy writes whole frames under this lock; a
                // proxy stuck in a write (the peer stopped reading) holds
                // it, and then the peer is not listening anyway.
                if let Some(_writing) = self.writing.try_lock_for(Duration::from_millis(100)) {
                    let header = encode_frame_header(
                        NOTE_FRAME,
                        Tag {
                            seq: note.len() as u32,
                            ..Tag::default()
                        },
                    );
                    send_now(&self.stream, &header, note.as_bytes());
                    let _ = self.stream.shutdown(Shutdown::Write);
                }
                *sent = Some(note);
            }
        }
        self.send.fail();
        self.recv.fail();
    }

    /// Why the peer closed the connection, if its last frame said.
    pub fn peer_note(&self) -> Option<String> {
        self.note_in.lock().clone()
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
        self.failure.lock().clone()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.stream.peer_addr().ok()
    }
}

/// How long closing a connection waits for the send proxy to put pieces
/// already published on the wire: a rank that returns from its last
/// operation and exits at once must not take its last sends with it.
const DRAIN_ON_CLOSE: Duration = Duration::from_secs(5);

impl Drop for TcpConnection {
    fn drop(&mut self) {
        let deadline = Instant::now() + DRAIN_ON_CLOSE;
        let mut backoff = Backoff::new();
        let never_aborted = AtomicBool::new(false);
        while !self.send.is_drained() && !self.send.failed() {
            let park = self.send.producer_park();
            if self.send.is_drained()
                || backoff
                    .snooze(Some(park), deadline, &never_aborted)
                    .is_err()
            {
                break;
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.send.fail();
        self.recv.fail();
        for proxy in self.proxies.drain(..) {
            let _ = proxy.join();
        }
    }
}

/// Records why a proxy stopped and fails both FIFOs so nobody waits on a
/// connection that cannot move any more.
fn finish(
    result: io::Result<()>,
    fifo: &Fifo,
    other: &Fifo,
    stop: &AtomicBool,
    failure: &Mutex<Option<String>>,
    peer: SocketAddr,
    doing: &str,
) {
    if stop.load(Ordering::SeqCst) {
        return;
    }
    let reason = match result {
        Ok(()) => format!("connection closed while {doing} {peer}"),
        Err(err) => format!("socket error while {doing} {peer}: {err}"),
    };
    failure.lock().get_or_insert(reason);
    fifo.fail();
    other.fail();
}

/// Waits, parked on the FIFO, until `ready` yields or the proxy must stop.
fn wait_fifo<T>(
    fifo: &Fifo,
    stop: &AtomicBool,
    producer: bool,
    mut ready: impl FnMut() -> Option<T>,
) -> io::Result<T> {
    let mut backoff = Backoff::with_max_park(PROXY_PARK_MAX);
    let never = Instant::now() + Duration::from_secs(86_400 * 365);
    loop {
        let park = if producer {
            fifo.producer_park()
        } else {
            fifo.consumer_park()
        };
        if let Some(value) = ready() {
            return Ok(value);
        }
        if fifo.failed() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection closed locally",
            ));
        }
        backoff
            .snooze(Some(park), never, stop)
            .map_err(|_| io::Error::new(io::ErrorKind::Interrupted, "proxy stopped"))?;
    }
}

fn send_proxy(
    fifo: &Fifo,
    mut stream: TcpStream,
    stop: &AtomicBool,
    writing: &Mutex<()>,
) -> io::Result<()> {
    loop {
        let (slot, len, tag) = wait_fifo(fifo, stop, false, || fifo.try_peek())?;
        let header = encode_frame_header(len, tag);
        // SAFETY: the slot was published with `len` bytes and stays ours
        // until `release`.
        let body = unsafe { std::slice::from_raw_parts(slot, len) };
        {
            let _writing = writing.lock();
            if fifo.failed() {
                // Closed: a closing note may already be on the wire.
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "connection closed locally",
                ));
            }
            write_all_vectored(&mut stream, &header, body)?;
        }
        fifo.release();
    }
}

/// Writes `header` and `body` without blocking, as far as the socket
/// takes them (for a closing note: best effort).
fn send_now(stream: &TcpStream, header: &[u8], body: &[u8]) {
    use std::os::fd::AsRawFd;
    let mut bytes = Vec::with_capacity(header.len() + body.len());
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(body);
    let mut at = 0;
    while at < bytes.len() {
        // SAFETY: sending from a valid buffer on a socket we own.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes[at..].as_ptr().cast(),
                bytes.len() - at,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n <= 0 {
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        at += n as usize;
    }
}

fn write_all_vectored(stream: &mut TcpStream, header: &[u8], body: &[u8]) -> io::Result<()> {
    let mut bufs = [IoSlice::new(header), IoSlice::new(body)];
    let mut bufs: &mut [IoSlice<'_>] = &mut bufs;
    while !bufs.is_empty() {
        match stream.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Bytes of a frame header: length, then the tag's seq, call and count.
const FRAME_HEADER: usize = 16;
/// The length of a closing frame: the sender gave up on the connection;
/// the tag's seq is the length of the note (why) that follows.
const NOTE_FRAME: usize = u32::MAX as usize;

fn encode_frame_header(len: usize, tag: Tag) -> [u8; FRAME_HEADER] {
    let mut header = [0u8; FRAME_HEADER];
    for (i, word) in [len as u32, tag.seq, tag.call, tag.count]
        .iter()
        .enumerate()
    {
        header[i * 4..i * 4 + 4].copy_from_slice(&word.to_le_bytes());
    }
    header
}

fn decode_frame_header(header: &[u8; FRAME_HEADER]) -> (usize, Tag) {
    let word = |i: usize| u32::from_le_bytes(header[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    (
        word(0) as usize,
        Tag {
            seq: word(1),
            call: word(2),
            count: word(3),
        },
    )
}

fn recv_proxy(
    fifo: &Fifo,
    mut stream: TcpStream,
    stop: &AtomicBool,
    note: &Mutex<Option<String>>,
) -> io::Result<()> {
    loop {
        let mut header = [0u8; FRAME_HEADER];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(err) => return Err(err),
        }
        let (len, tag) = decode_frame_header(&header);
        if len == NOTE_FRAME {
            let text = read_note(&mut stream, tag.seq as usize)?;
            note.lock().get_or_insert(text.clone());
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("the peer closed the connection: {text}"),
            ));
        }
        if len > fifo.slot_bytes() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "frame of {len} bytes exceeds the {}-byte slot",
                    fifo.slot_bytes()
                ),
            ));
        }
        let slot = wait_fifo(fifo, stop, true, || fifo.try_reserve())?;
        // SAFETY: the reserved slot holds `slot_bytes` >= len bytes and is
        // ours until `publish`.
        let body = unsafe { std::slice::from_raw_parts_mut(slot, len) };
        stream.read_exact(body)?;
        fifo.publish(len, tag);
    }
}

/// Reads the `len`-byte note of a closing frame.
fn read_note(stream: &mut impl Read, len: usize) -> io::Result<String> {
    if len > MAX_NOTE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("closing note of {len} bytes exceeds {MAX_NOTE}"),
        ));
    }
    let mut bytes = vec![0u8; len];
    stream.read_exact(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::sync::atomic::AtomicBool;

    use crate::wait::wait_until;

    fn pair() -> (TcpConnection, TcpConnection) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (
            TcpConnection::start(a, 4, 1024).unwrap(),
            TcpConnection::start(b, 4, 1024).unwrap(),
        )
    }

    #[test]
    fn slots_cross_the_socket_in_order() {
        let (a, b) = pair();
        let abort = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(10);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..200u32 {
                    let fifo = a.send_fifo();
                    let slot = wait_until(|| fifo.try_reserve(), None, deadline, &abort).unwrap();
                    let len = (i as usize % 1000) + 4;
                    // SAFETY: the slot holds 1024 bytes.
                    unsafe {
                        std::ptr::write_bytes(slot, i as u8, len);
                        slot.cast::<u32>().write_unaligned(i);
                    }
                    fifo.publish(
                        len,
                        Tag {
                            seq: i,
                            call: 0,
                            count: 0,
                        },
                    );
                }
            });
            for i in 0..200u32 {
                let fifo = b.recv_fifo();
                let (slot, len, tag) =
                    wait_until(|| fifo.try_peek(), None, deadline, &abort).unwrap();
                assert_eq!(tag.seq, i);
                assert_eq!(len, (i as usize % 1000) + 4);
                // SAFETY: the slot was published with `len` >= 4 bytes.
                assert_eq!(unsafe { slot.cast::<u32>().read_unaligned() }, i);
                fifo.release();
            }
        });
    }

    #[test]
    fn pieces_published_before_close_still_arrive() {
        let (a, b) = pair();
        for i in 0..4u32 {
            let slot = a.send_fifo().try_reserve().unwrap();
            // SAFETY: the slot holds 1024 bytes.
            unsafe { slot.cast::<u32>().write_unaligned(i) };
            a.send_fifo().publish(4, Tag::default());
        }
        drop(a);
        let abort = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in 0..4u32 {
            let fifo = b.recv_fifo();
            let (slot, _, _) = wait_until(|| fifo.try_peek(), None, deadline, &abort).unwrap();
            // SAFETY: published with 4 bytes.
            assert_eq!(unsafe { slot.cast::<u32>().read_unaligned() }, i);
            fifo.release();
        }
    }

    #[test]
    fn peer_going_away_fails_the_fifos_with_a_reason() {
        let (a, b) = pair();
        drop(a);
        let abort = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(10);
        wait_until(
            || b.recv_fifo().failed().then_some(()),
            None,
            deadline,
            &abort,
        )
        .unwrap();
        assert!(b.failure().unwrap().contains("closed"), "{:?}", b.failure());
    }

    #[test]
    fn a_closing_note_reaches_the_peer() {
        let (a, b) = pair();
        a.close_with("rank 0 (host h, pid 1) aborted its communicator");
        let abort = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(10);
        wait_until(
            || b.recv_fifo().failed().then_some(()),
            None,
            deadline,
            &abort,
        )
        .unwrap();
        assert_eq!(
            b.peer_note().as_deref(),
            Some("rank 0 (host h, pid 1) aborted its communicator")
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn frame_headers_round_trip(len in 0usize..1 << 31, seq in proptest::prelude::any::<u32>(), call in proptest::prelude::any::<u32>()) {
            let tag = Tag { seq, call, count: seq ^ call };
            proptest::prop_assert_eq!(decode_frame_header(&encode_frame_header(len, tag)), (len, tag));
        }

        #[test]
        fn closing_notes_are_bounded(len in 0usize..10_000, bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            match read_note(&mut &bytes[..], len) {
                Ok(_) => proptest::prop_assert!(len <= bytes.len() && len <= MAX_NOTE),
                Err(_) => proptest::prop_assert!(len > MAX_NOTE || len > bytes.len()),
            }
        }
    }

    /// Arbitrary bytes from an unauthenticated-looking peer straight into
    /// the receive proxy: frames are taken or the connection fails with a
    /// reason; nothing panics or hangs.
    #[test]
    fn arbitrary_wire_bytes_fail_the_connection_or_deliver_frames() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let mut runner = TestRunner::new(Config::with_cases(32));
        runner
            .run(&proptest::collection::vec(any::<u8>(), 0..300), |bytes| {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
                let (b, _) = listener.accept().unwrap();
                let conn = TcpConnection::start(b, 4, 64).unwrap();
                raw.write_all(&bytes).unwrap();
                drop(raw);
                let abort = AtomicBool::new(false);
                let deadline = Instant::now() + Duration::from_secs(10);
                // Drain whatever frames came; the stream then ends.
                let fifo = conn.recv_fifo();
                let ended = wait_until(
                    || {
                        while let Some((_, len, _)) = fifo.try_peek() {
                            assert!(len <= 64);
                            fifo.release();
                        }
                        fifo.failed().then_some(())
                    },
                    None,
                    deadline,
                    &abort,
                );
                prop_assert!(ended.is_ok());
                prop_assert!(conn.failure().is_some());
                Ok(())
            })
            .unwrap();
    }
}
