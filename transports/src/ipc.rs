//! Device memory between processes of one host (`P2P/IPC`, CUDA IPC's
//! place in the transport table): both FIFOs of a connection live in
//! device memory that the leading rank allocates shareable and exports,
//! and the other rank maps.
//!
//! The handle is a file descriptor (CUDA: a cuMem allocation exported as
//! a POSIX file descriptor; the emulated GPU: a memfd), so it crosses
//! between processes only over a Unix socket, with `SCM_RIGHTS`. The
//! leading rank listens on an abstract Unix socket (no file to leave
//! behind) and sends its name and a random token through the
//! communicator's authenticated bootstrap; the peer connects and sends the
//! token, and only a peer that sends it gets the descriptor. A descriptor
//! is counted by the kernel: once both sides hold their mapping, a process
//! that dies takes only its own mapping with it.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Instant;

use rccl_device::Device;

use crate::fd_pass::{self, recv_fd, send_fd, tokens_match, TOKEN};
use crate::fifo::FifoMemory;
use crate::shm::{self, ShmConnection};
use crate::transport::{Context, Pending, Setup, Transport};
use crate::Connection;

/// The `P2P/IPC` entry of the transport table.
pub(crate) struct P2pIpc;

impl Transport for P2pIpc {
    fn name(&self) -> &'static str {
        "P2P/IPC"
    }

    /// Ranks of one host in different processes, connected for calls on
    /// device memory, on a device that shares memory between processes,
    /// unless `NCCL_P2P_DISABLE`. (Ranks that are threads of one process
    /// reach each other's memory without a handle.)
    fn can_connect(&self, cx: &Context<'_>, peer: usize) -> bool {
        !cx.p2p_disable
            && cx.device_memory
            && cx.same_host(peer)
            && cx.endpoints[peer].process.pid != cx.endpoints[cx.rank].process.pid
            && rccl_device::active().is_some_and(|device| device.shares_memory())
    }

    fn setup(&self, cx: &Context<'_>, peer: usize, _channel: usize) -> io::Result<Setup> {
        let device =
            rccl_device::active().ok_or_else(|| io::Error::other("no device is active"))?;
        if !cx.leads(peer) {
            return Ok(Setup {
                info: None,
                pending: Box::new(Imports {
                    device,
                    stream: None,
                }),
            });
        }
        let memory = DeviceMemory {
            device,
            ptr: device
                .alloc_shareable(shm::segment_bytes(&cx.fifo))
                .map_err(io::Error::other)?,
            len: shm::segment_bytes(&cx.fifo),
        };
        let (handle, _) = device.export(memory.ptr).map_err(io::Error::other)?;
        let export = fd_pass::listen()?;
        export.listener.set_nonblocking(true)?;
        Ok(Setup {
            info: Some([&export.token[..], export.name.as_bytes()].concat()),
            pending: Box::new(Exports {
                token: export.token,
                listener: Some(export.listener),
                accepted: None,
                handle: Some(handle),
                memory: Some(memory),
                conn: None,
            }),
        })
    }
}

/// Device memory of this process (allocated or mapped from a peer's
/// export), freed with the connection.
struct DeviceMemory {
    device: &'static dyn Device,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is owned by this value and freed only on drop;
// concurrent access to its bytes is ordered by the FIFO protocol's atomics.
unsafe impl Send for DeviceMemory {}
// SAFETY: as above; shared references only expose the base pointer.
unsafe impl Sync for DeviceMemory {}

impl FifoMemory for DeviceMemory {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the connection owning this memory is gone, and with it
        // every FIFO over it.
        let _ = unsafe { self.device.free(self.ptr) };
    }
}

/// The leading side: hands its export to the peer that sends the token,
/// then connects once the peer has mapped the memory.
struct Exports {
    token: [u8; TOKEN],
    listener: Option<UnixListener>,
    /// A caller accepted, with the token bytes read from it so far.
    accepted: Option<(UnixStream, Vec<u8>)>,
    handle: Option<OwnedFd>,
    memory: Option<DeviceMemory>,
    conn: Option<ShmConnection>,
}

impl Exports {
    /// Whether the peer has been handed the export (`Ok(false)`: not yet).
    fn hand_over(&mut self) -> io::Result<bool> {
        let Some(listener) = &self.listener else {
            return Ok(true);
        };
        if self.accepted.is_none() {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(true)?;
                    self.accepted = Some((stream, Vec::with_capacity(TOKEN)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        let Some((stream, got)) = &mut self.accepted else {
            return Ok(false);
        };
        let mut buf = [0u8; TOKEN];
        match stream.read(&mut buf[..TOKEN - got.len()]) {
            Ok(0) => {
                // Gone before it said the token: wait for another caller.
                self.accepted = None;
                return Ok(false);
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
        if got.len() < TOKEN {
            return Ok(false);
        }
        if !tokens_match(got, &self.token) {
            // A caller without the token gets nothing.
            self.accepted = None;
            return Ok(false);
        }
        let handle = self.handle.take().expect("handed over once");
        send_fd(stream, &handle)?;
        self.accepted = None;
        self.listener = None;
        Ok(true)
    }
}

impl Pending for Exports {
    fn awaits_peer_info(&self) -> bool {
        false
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        peer: usize,
        _peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        if !self.hand_over()? {
            return Ok(None);
        }
        if let Some(memory) = self.memory.take() {
            self.conn = Some(connection(cx, peer, memory, true));
        }
        // Handed out only once the peer has mapped the memory, as the
        // shared-memory transport's.
        Ok(self
            .conn
            .take_if(|conn| conn.peer_mapped())
            .map(|conn| Box::new(conn) as Box<dyn Connection>))
    }
}

/// The other side: asks for the export with the token, maps it.
struct Imports {
    device: &'static dyn Device,
    stream: Option<UnixStream>,
}

impl Pending for Imports {
    fn awaits_peer_info(&self) -> bool {
        true
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        peer: usize,
        peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        let malformed = || io::Error::new(io::ErrorKind::InvalidData, "a malformed IPC setup");
        if peer_info.len() <= TOKEN {
            return Err(malformed());
        }
        let (token, name) = peer_info.split_at(TOKEN);
        if self.stream.is_none() {
            let stream = fd_pass::call(name, token)?;
            stream.set_nonblocking(true)?;
            self.stream = Some(stream);
        }
        let Some(stream) = &self.stream else {
            return Ok(None);
        };
        let Some(handle) = recv_fd(stream)? else {
            return Ok(None);
        };
        let len = shm::segment_bytes(&cx.fifo);
        let memory = DeviceMemory {
            device: self.device,
            ptr: self.device.import(handle, len).map_err(io::Error::other)?,
            len,
        };
        self.stream = None;
        Ok(Some(Box::new(connection(cx, peer, memory, false))))
    }
}

/// The connection over `memory`, watching the peer's process.
fn connection(cx: &Context<'_>, peer: usize, memory: DeviceMemory, creator: bool) -> ShmConnection {
    let mut conn = ShmConnection::over(Arc::new(memory), creator, &cx.fifo, "P2P");
    let process = cx.endpoints[peer].process;
    if process.start != 0 {
        conn.watch_peer(process);
    }
    conn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fd_pass::NAME_PREFIX;
    use std::io::Write;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::SocketAddr;

    fn listening(token: [u8; TOKEN]) -> (Exports, Vec<u8>) {
        let name = format!("{NAME_PREFIX}test-{}", std::process::id());
        let listener =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        listener.set_nonblocking(true).unwrap();
        let handle = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let exports = Exports {
            token,
            listener: Some(listener),
            accepted: None,
            handle: Some(handle),
            memory: None,
            conn: None,
        };
        (exports, name.into_bytes())
    }

    /// Calls the exporter with `token`; the stream, once it has sent it.
    fn call(name: &[u8], token: &[u8]) -> UnixStream {
        let mut stream =
            UnixStream::connect_addr(&SocketAddr::from_abstract_name(name).unwrap()).unwrap();
        stream.write_all(token).unwrap();
        stream
    }

    /// Polls `exports` until it hands over or 5 s pass.
    fn poll(exports: &mut Exports, until_handed: bool) -> bool {
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while Instant::now() < deadline {
            if exports.hand_over().unwrap() {
                return true;
            }
            if !until_handed && exports.accepted.is_none() {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }

    use std::os::fd::AsRawFd;

    #[test]
    fn only_a_caller_with_the_token_gets_the_descriptor() {
        let token = [7u8; TOKEN];
        let (mut exports, name) = listening(token);
        // A stranger: dropped, no descriptor, the exporter keeps listening.
        let stranger = call(&name, &[8u8; TOKEN]);
        assert!(!poll(&mut exports, false));
        stranger.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let refused = loop {
            match recv_fd(&stranger) {
                Ok(None) if Instant::now() < deadline => std::thread::yield_now(),
                other => break other,
            }
        };
        assert!(refused.is_err(), "a stranger got {refused:?}");
        assert!(exports.listener.is_some() && exports.handle.is_some());
        // The peer with the token gets it.
        let peer = call(&name, &token);
        peer.set_nonblocking(true).unwrap();
        assert!(poll(&mut exports, true));
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let got = loop {
            match recv_fd(&peer).unwrap() {
                Some(fd) => break fd,
                None if Instant::now() < deadline => std::thread::yield_now(),
                None => panic!("no descriptor came"),
            }
        };
        let link = std::fs::read_link(format!("/proc/self/fd/{}", got.as_raw_fd())).unwrap();
        assert_eq!(link, std::path::Path::new("/dev/null"));
        assert!(
            exports.listener.is_none(),
            "the socket closes once handed over"
        );
    }
}
