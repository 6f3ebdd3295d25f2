//! TCP connections started without waiting: the socket provider, the IB
//! provider's exchange and the verbs model all connect this way, then poll
//! [`connected`] beside their other work.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

/// Starts a TCP connection to `addr` without waiting for it: a
/// non-blocking socket whose connection may still be in progress. With
/// `from`, the socket is bound to that local address first, so the
/// connection leaves through the interface that holds it (a channel's
/// NIC); an address of the other family than `addr` is ignored.
pub(crate) fn start_connect(from: Option<IpAddr>, addr: SocketAddr) -> io::Result<TcpStream> {
    // SAFETY: plain socket(2) call; the descriptor is owned by the
    // TcpStream built from it below (or closed on error by that stream's
    // drop).
    let fd = unsafe {
        libc::socket(
            match addr {
                SocketAddr::V4(_) => libc::AF_INET,
                SocketAddr::V6(_) => libc::AF_INET6,
            },
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    if let Some(from) = from.filter(|f| f.is_ipv4() == addr.is_ipv4() && !f.is_unspecified()) {
        let (storage, len) = raw_address(SocketAddr::new(from, 0));
        // SAFETY: `storage` holds a valid address of `len` bytes for the
        // socket's family; bind only reads it.
        let rc = unsafe {
            libc::bind(
                stream.as_raw_fd(),
                (&storage as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let (storage, len) = raw_address(addr);
    // SAFETY: `storage` holds a valid address of `len` bytes for the
    // socket's family; connect only reads it.
    let rc = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(err);
        }
    }
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// `addr` as the C library takes it, and its length.
fn raw_address(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Whether a connection started by [`start_connect`] is established
/// (its socket is writable and reports no error).
pub(crate) fn connected(stream: &TcpStream) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a count of 1, no waiting.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return if err.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(err)
        };
    }
    if rc == 0 {
        return Ok(false);
    }
    match stream.take_error()? {
        Some(err) => Err(err),
        None => Ok(true),
    }
}
