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

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

use rccl_device::Device;

use crate::fd_pass::{self, recv_fd, send_fd, ExportListener, TOKEN};
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
        Ok(Setup {
            info: Some([&export.token[..], export.name.as_bytes()].concat()),
            pending: Box::new(Exports {
                export: Some(export),
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
    /// Closed once the export is handed over.
    export: Option<ExportListener>,
    handle: Option<OwnedFd>,
    memory: Option<DeviceMemory>,
    conn: Option<ShmConnection>,
}

impl Exports {
    /// Whether the peer has been handed the export (`Ok(false)`: not yet).
    fn hand_over(&mut self) -> io::Result<bool> {
        let Some(export) = &mut self.export else {
            return Ok(true);
        };
        let Some((stream, _)) = export.next_caller(0)? else {
            return Ok(false);
        };
        let handle = self.handle.take().expect("handed over once");
        send_fd(&stream, &handle)?;
        self.export = None;
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
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::SocketAddr;
    use std::os::unix::process::CommandExt;
    use std::time::Duration;

    use crate::auth_tcp::DEFAULT_HANDSHAKE_TIMEOUT;

    /// Set in a child: `name:token` (hex) of the export it calls.
    const CALL_AS_CHILD: &str = "RCCL_TEST_IPC_CALL";

    fn listening() -> (Exports, [u8; TOKEN], Vec<u8>) {
        let export = fd_pass::listen().unwrap();
        let (token, name) = (export.token, export.name.clone().into_bytes());
        let handle = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let exports = Exports {
            export: Some(export),
            handle: Some(handle),
            memory: None,
            conn: None,
        };
        (exports, token, name)
    }

    /// Connects to the export at `name` and says `said`, as any process
    /// of the host may.
    fn call(name: &[u8], said: &[u8]) -> UnixStream {
        let mut stream =
            UnixStream::connect_addr(&SocketAddr::from_abstract_name(name).unwrap()).unwrap();
        stream.write_all(said).unwrap();
        stream
    }

    /// Polls `exports` until it hands over or `limit` passes.
    fn handed_over_within(exports: &mut Exports, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if exports.hand_over().unwrap() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// The descriptor sent over `stream`, or why none came within 5 s.
    fn descriptor(stream: &UnixStream) -> io::Result<OwnedFd> {
        stream.set_nonblocking(true)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match recv_fd(stream)? {
                Some(fd) => return Ok(fd),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                None => return Err(io::ErrorKind::TimedOut.into()),
            }
        }
    }

    fn is_dev_null(fd: &OwnedFd) -> bool {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap()
            == std::path::Path::new("/dev/null")
    }

    #[test]
    fn only_a_caller_with_the_token_gets_the_descriptor() {
        let (mut exports, token, name) = listening();
        // A stranger: closed, no descriptor, the exporter keeps listening.
        let stranger = call(&name, &[8u8; TOKEN]);
        assert!(!handed_over_within(
            &mut exports,
            Duration::from_millis(200)
        ));
        let refused = descriptor(&stranger);
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.kind() == io::ErrorKind::UnexpectedEof),
            "a stranger got {refused:?}"
        );
        assert!(exports.export.is_some() && exports.handle.is_some());
        // The peer with the token gets it.
        let peer = call(&name, &token);
        assert!(handed_over_within(&mut exports, Duration::from_secs(5)));
        assert!(is_dev_null(&descriptor(&peer).unwrap()));
        assert!(
            exports.export.is_none(),
            "the socket closes once handed over"
        );
    }

    #[test]
    fn silent_and_half_token_callers_do_not_delay_the_peer() {
        let (mut exports, token, name) = listening();
        let silent = call(&name, &[]);
        let half = call(&name, &token[..TOKEN / 2]);
        assert!(!handed_over_within(
            &mut exports,
            Duration::from_millis(100)
        ));
        let peer = call(&name, &token);
        // Served while the two before it may still say their tokens.
        assert!(handed_over_within(
            &mut exports,
            DEFAULT_HANDSHAKE_TIMEOUT - Duration::from_millis(500)
        ));
        assert!(is_dev_null(&descriptor(&peer).unwrap()));
        drop((silent, half));
    }

    /// In a child started by the test below: calls the export with its
    /// token and exits 0 if it got the descriptor, 3 if it was closed.
    #[test]
    fn call_as_child() {
        let Ok(said) = std::env::var(CALL_AS_CHILD) else {
            return;
        };
        let (name, token) = said.split_once(':').unwrap();
        let token: Vec<u8> = (0..token.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&token[i..i + 2], 16).unwrap())
            .collect();
        let mut stream =
            UnixStream::connect_addr(&SocketAddr::from_abstract_name(name).unwrap()).unwrap();
        let got = stream.write_all(&token).and_then(|()| descriptor(&stream));
        match got {
            Ok(_) => std::process::exit(0),
            Err(e) if closed(&e) => std::process::exit(3),
            Err(e) => panic!("{e}"),
        }
    }

    /// Whether `e` says the other end closed the connection.
    fn closed(e: &io::Error) -> bool {
        matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
        )
    }

    #[test]
    fn a_caller_of_another_user_with_the_token_is_refused() {
        let (mut exports, token, name) = listening();
        let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ipc::tests::call_as_child",
                "--test-threads",
                "1",
            ])
            .env(
                CALL_AS_CHILD,
                format!("{}:{hex}", String::from_utf8_lossy(&name)),
            )
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("starting a child as uid 65534 (the test runs as root)");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            assert!(
                !exports.hand_over().unwrap(),
                "handed over to a caller of uid 65534"
            );
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the child did not finish");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(status.code(), Some(3), "the other user's call: {status}");
        let peer = call(&name, &token);
        assert!(handed_over_within(&mut exports, Duration::from_secs(5)));
        assert!(is_dev_null(&descriptor(&peer).unwrap()));
    }
}
