//! Passing file descriptors between processes of one host: a Unix
//! socket's `SCM_RIGHTS`, behind a random token that only the
//! communicator's authenticated bootstrap carries. The `P2P/IPC`
//! transport and the engine's device work between processes hand their
//! exported device memory over this way.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use crate::socket::fill_random;

/// Bytes of the token that opens an export.
pub const TOKEN: usize = 32;
/// How the abstract socket names of exports start.
pub const NAME_PREFIX: &str = "rccl-ipc-";

/// A listener for an export: bound to a fresh abstract socket name, with
/// the random token a caller must show.
pub struct ExportListener {
    pub listener: UnixListener,
    pub token: [u8; TOKEN],
    /// The socket's abstract name, for the peers.
    pub name: String,
}

/// Binds a new export listener (blocking; the caller may change that).
pub fn listen() -> io::Result<ExportListener> {
    let mut random = [0u8; TOKEN + 8];
    fill_random(&mut random)?;
    let (token, suffix) = random.split_at(TOKEN);
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{NAME_PREFIX}{}-{suffix}", std::process::id());
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name)?)?;
    Ok(ExportListener {
        listener,
        token: token.try_into().expect("TOKEN bytes"),
        name,
    })
}

/// Calls the export listening at `name` and shows it `hello` (its token
/// first, then what the export's protocol asks). A name that is not an
/// export's is refused before any connection.
pub fn call(name: &[u8], hello: &[u8]) -> io::Result<UnixStream> {
    if !name.starts_with(NAME_PREFIX.as_bytes()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not the socket name of an export",
        ));
    }
    let mut stream = UnixStream::connect_addr(&SocketAddr::from_abstract_name(name)?)?;
    stream.write_all(hello)?;
    Ok(stream)
}

/// Whether `got` is `token`, compared in constant time: the token is the
/// only key.
pub fn tokens_match(got: &[u8], token: &[u8; TOKEN]) -> bool {
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
