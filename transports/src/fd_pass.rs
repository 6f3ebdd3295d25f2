//! Passing file descriptors between processes of one host: a Unix
//! socket's `SCM_RIGHTS`, behind a random token that only the
//! communicator's authenticated bootstrap carries. The `P2P/IPC`
//! transport hands its exported device memory over this way.
//!
//! An export's abstract name is visible to every user of the host (in
//! `/proc/net/unix`), so its listener admits callers as the bootstrap's
//! listeners do: only a caller of this user (`SO_PEERCRED`), each with a
//! deadline to show the token, many at once, a bounded number per
//! process; nothing is sent to a caller before its token matched.
//! [`ServedFd`] keeps handing one descriptor over (a window's exported
//! device memory, to every peer) until it is dropped.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::Instant;

use crate::auth_tcp::{
    fill_random, DEFAULT_HANDSHAKE_TIMEOUT, MAX_PENDING, MAX_PENDING_PER_SOURCE,
};
use crate::process::effective_uid;

/// Bytes of the token that opens an export.
pub const TOKEN: usize = 32;
/// How the abstract socket names of exports start.
pub const NAME_PREFIX: &str = "rccl-ipc-";

/// A listener for an export: bound to a fresh abstract socket name, with
/// the random token a caller must show.
pub struct ExportListener {
    listener: UnixListener,
    pub token: [u8; TOKEN],
    /// The socket's abstract name, for the peers.
    pub name: String,
    /// Callers accepted that have not shown all of their hello yet,
    /// oldest first.
    callers: Vec<Caller>,
}

/// A caller of this user, accepted, still saying its hello.
struct Caller {
    stream: UnixStream,
    pid: i32,
    deadline: Instant,
    said: Vec<u8>,
}

/// Binds a new export listener (never blocks).
pub fn listen() -> io::Result<ExportListener> {
    let mut random = [0u8; TOKEN + 8];
    fill_random(&mut random)?;
    let (token, suffix) = random.split_at(TOKEN);
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{NAME_PREFIX}{}-{suffix}", std::process::id());
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name)?)?;
    listener.set_nonblocking(true)?;
    Ok(ExportListener {
        listener,
        token: token.try_into().expect("TOKEN bytes"),
        name,
        callers: Vec::new(),
    })
}

impl ExportListener {
    /// The next caller that showed the token, with the `extra` bytes its
    /// hello holds after it (its stream non-blocking). Never blocks:
    /// reads what the callers under way have said, drops those that
    /// closed, said a wrong token or passed their deadline, then accepts
    /// new callers, refusing those of another user.
    pub fn next_caller(&mut self, extra: usize) -> io::Result<Option<(UnixStream, Vec<u8>)>> {
        let hello = TOKEN + extra;
        let now = Instant::now();
        let mut i = 0;
        while i < self.callers.len() {
            match self.hears(i, hello, now) {
                Heard::Waiting => i += 1,
                Heard::Done(said) => return Ok(Some((self.callers.remove(i).stream, said))),
                Heard::Refused => drop(self.callers.remove(i)),
            }
        }
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let Some(pid) = self.admit(&stream) else {
                continue;
            };
            self.make_room(pid);
            stream.set_nonblocking(true)?;
            self.callers.push(Caller {
                stream,
                pid,
                deadline: now + DEFAULT_HANDSHAKE_TIMEOUT,
                said: Vec::with_capacity(hello),
            });
            let last = self.callers.len() - 1;
            match self.hears(last, hello, now) {
                Heard::Waiting => {}
                Heard::Done(said) => return Ok(Some((self.callers.remove(last).stream, said))),
                Heard::Refused => drop(self.callers.remove(last)),
            }
        }
    }

    /// The caller's pid, if it runs as this user; otherwise it is refused
    /// (logged) and closed on return.
    fn admit(&self, stream: &UnixStream) -> Option<i32> {
        match peer_credentials(stream) {
            Ok(cred) if cred.uid == effective_uid() => Some(cred.pid),
            Ok(cred) => {
                tracing::warn!(
                    "export socket @{}: refused a caller of uid {} (pid {}): only uid {} may call",
                    self.name,
                    cred.uid,
                    cred.pid,
                    effective_uid()
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    "export socket @{}: refused a caller whose credentials are unknown: {e}",
                    self.name
                );
                None
            }
        }
    }

    /// Reads what caller `i` has said: its hello once all of it came with
    /// the token, a refusal once it cannot.
    fn hears(&mut self, i: usize, hello: usize, now: Instant) -> Heard {
        let caller = &mut self.callers[i];
        let mut buf = [0u8; 64];
        while caller.said.len() < hello {
            let want = (hello - caller.said.len()).min(buf.len());
            match caller.stream.read(&mut buf[..want]) {
                Ok(0) => return Heard::Refused,
                Ok(n) => caller.said.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return if now < caller.deadline {
                        Heard::Waiting
                    } else {
                        Heard::Refused
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Heard::Refused,
            }
        }
        if !tokens_match(&caller.said[..TOKEN], &self.token) {
            return Heard::Refused;
        }
        Heard::Done(caller.said.split_off(TOKEN))
    }

    /// Drops the oldest caller of process `pid` if it holds
    /// [`MAX_PENDING_PER_SOURCE`] already, and the oldest of all at
    /// [`MAX_PENDING`].
    fn make_room(&mut self, pid: i32) {
        let same = |c: &Caller| c.pid == pid;
        if self.callers.iter().filter(|c| same(c)).count() >= MAX_PENDING_PER_SOURCE {
            if let Some(i) = self.callers.iter().position(same) {
                self.callers.remove(i);
            }
        }
        if self.callers.len() >= MAX_PENDING {
            self.callers.remove(0);
        }
    }
}

/// What a caller has said so far.
enum Heard {
    Waiting,
    /// The token and then these bytes.
    Done(Vec<u8>),
    Refused,
}

/// The credentials of the process at the other end of `stream`, as the
/// kernel recorded them when it connected.
pub fn peer_credentials(stream: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its size, as
    // SO_PEERCRED expects.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// Calls the export listening at `name` and shows it `hello` (its token
/// first, then what the export's protocol asks). A name that is not an
/// export's is refused before any connection, a listener of another user
/// before the token is sent.
pub fn call(name: &[u8], hello: &[u8]) -> io::Result<UnixStream> {
    if !name.starts_with(NAME_PREFIX.as_bytes()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not the socket name of an export",
        ));
    }
    let mut stream = UnixStream::connect_addr(&SocketAddr::from_abstract_name(name)?)?;
    let owner = peer_credentials(&stream)?.uid;
    if owner != effective_uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the export socket @{} belongs to uid {owner}, not to this user (uid {})",
                String::from_utf8_lossy(name),
                effective_uid()
            ),
        ));
    }
    stream.write_all(hello)?;
    Ok(stream)
}

/// Whether `got` is `token`, compared in constant time: the token is the
/// only key.
fn tokens_match(got: &[u8], token: &[u8; TOKEN]) -> bool {
    got.len() == TOKEN && got.iter().zip(token).fold(0, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Room for one descriptor's control message.
fn control_bytes() -> usize {
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize }
}

/// Sends `fd` over `stream` with one byte of data.
pub fn send_fd(stream: &UnixStream, fd: &OwnedFd) -> io::Result<()> {
    let byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // u64 words: aligned for a cmsghdr.
    let mut control = vec![0u64; control_bytes().div_ceil(8)];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below to
    // live buffers sized as stated.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control_bytes() as _;
    // SAFETY: the control buffer holds one header and one descriptor
    // (CMSG_SPACE), so the first header and its data lie inside it.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd.as_raw_fd());
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The descriptor sent over `stream`, `None` while none has come.
pub fn recv_fd(stream: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = vec![0u64; control_bytes().div_ceil(8)];
    // SAFETY: as in send_fd.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control_bytes() as _;
    // SAFETY: msg points at live buffers of the sizes it states.
    let got = unsafe {
        libc::recvmsg(
            stream.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if got < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ => Err(err),
        };
    }
    let closed = || {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the IPC socket without sending its memory handle",
        )
    };
    if got == 0 {
        return Err(closed());
    }
    // SAFETY: recvmsg filled the control buffer up to msg_controllen; the
    // CMSG macros stay inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(closed());
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
        Ok(Some(OwnedFd::from_raw_fd(fd)))
    }
}

/// How long a served descriptor's thread sleeps between looks at callers
/// still saying their hello.
const SERVE_POLL_MS: libc::c_int = 50;

/// A descriptor handed to every caller that shows the token (over a
/// fresh [`ExportListener`]), by a thread of its own, for as long as this
/// value lives; dropping it ends the thread and closes the listener and
/// the descriptor.
pub struct ServedFd {
    /// The listener's abstract name, for the peers.
    pub name: String,
    /// The token a caller shows.
    pub token: [u8; TOKEN],
    /// Closed on drop, which wakes and ends the thread.
    stop: Option<UnixStream>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Serves `fd` to callers of this user that show the token.
pub fn serve_fd(fd: OwnedFd) -> io::Result<ServedFd> {
    let mut listener = listen()?;
    let (stop, stopped) = UnixStream::pair()?;
    let (name, token) = (listener.name.clone(), listener.token);
    let thread = std::thread::Builder::new()
        .name("rccl-fd-serve".into())
        .spawn(move || loop {
            let mut fds =
                [listener.listener.as_raw_fd(), stopped.as_raw_fd()].map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            // Only callers still saying their hello need a look unasked.
            let timeout = if listener.callers.is_empty() {
                -1
            } else {
                SERVE_POLL_MS
            };
            // SAFETY: two valid pollfds, a count of 2.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if fds[1].revents != 0 {
                return;
            }
            loop {
                match listener.next_caller(0) {
                    Ok(Some((stream, _))) => {
                        if let Err(e) = send_fd(&stream, &fd) {
                            tracing::warn!("export socket @{}: sending: {e}", listener.name);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!("export socket @{}: accepting: {e}", listener.name);
                        break;
                    }
                }
            }
        })?;
    Ok(ServedFd {
        name,
        token,
        stop: Some(stop),
        thread: Some(thread),
    })
}

impl Drop for ServedFd {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The descriptor the [`ServedFd`] at `name` hands to `token`, if it
/// comes before `deadline`.
pub fn fetch_fd(name: &[u8], token: &[u8], deadline: Instant) -> io::Result<OwnedFd> {
    let stream = call(name, token).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "calling its export socket @{}: {e}",
                String::from_utf8_lossy(name)
            ),
        )
    })?;
    loop {
        if let Some(fd) = recv_fd(&stream)? {
            return Ok(fd);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "its export socket @{} sent no descriptor before the deadline",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        let mut pfd = libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: one valid pollfd, a count of 1.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    use super::{fetch_fd, serve_fd};

    /// A fresh memfd with its file offset at `offset`.
    fn memfd_at(offset: i64) -> OwnedFd {
        // SAFETY: a NUL-terminated name and no flags.
        let fd = unsafe { libc::memfd_create(c"fd-pass-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: the descriptor just made, owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: lseek on a live descriptor.
        let at = unsafe { libc::lseek(fd.as_raw_fd(), offset, libc::SEEK_SET) };
        assert_eq!(at, offset);
        fd
    }

    fn offset(fd: &OwnedFd) -> i64 {
        // SAFETY: lseek reads the offset of a live descriptor.
        unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_CUR) }
    }

    #[test]
    fn a_served_descriptor_is_the_open_file_itself_for_every_caller_until_dropped() {
        let served = serve_fd(memfd_at(4242)).unwrap();
        let deadline = || Instant::now() + Duration::from_secs(10);
        for _ in 0..2 {
            let fd = fetch_fd(served.name.as_bytes(), &served.token, deadline()).unwrap();
            // The same open file: its offset, not a reopen's 0.
            assert_eq!(offset(&fd), 4242);
        }
        // A wrong token is hung up on, with nothing sent.
        let err = fetch_fd(served.name.as_bytes(), &[0; super::TOKEN], deadline()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
        // A listener that never answers: the wait ends at its deadline.
        let silent = super::listen().unwrap();
        let start = Instant::now();
        let soon = start + Duration::from_millis(200);
        let err = fetch_fd(silent.name.as_bytes(), &silent.token, soon).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(start.elapsed() >= Duration::from_millis(200));
        let name = served.name.clone();
        drop(served);
        let err = fetch_fd(name.as_bytes(), &[0; super::TOKEN], deadline()).unwrap_err();
        assert!(err.to_string().contains(&name), "{err}");
    }
}
