//! Device work between processes of one host (`P2P/IPC`, CUDA IPC's
//! place in the transport table). As NCCL's P2P transport, the receiver
//! owns a FIFO: each rank of a pair allocates the FIFO it receives on as
//! shareable device memory, exports it and hands it to the peer, which
//! maps it and sends on it.
//!
//! The handle is a file descriptor (CUDA: a cuMem allocation exported as
//! a POSIX file descriptor; the emulated GPU: a memfd), so it crosses
//! between processes only over a Unix socket, with `SCM_RIGHTS`. Each
//! side listens on an abstract Unix socket (no file to leave behind) and
//! sends its name and a random token through the communicator's
//! authenticated bootstrap; the peer calls and sends the token, and only
//! a caller of this user that sends it gets the descriptor
//! ([`ExportListener`]). Both sides serve and call in each poll, never
//! blocking, so every link of a launch is handed over at once. A
//! descriptor is counted by the kernel: once both sides hold their
//! mapping, a process that dies takes only its own mapping with it.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

use crate::fd_pass::{self, recv_fd, send_fd, ExportListener, NAME_PREFIX, TOKEN};
use crate::fifo::{fifo_bytes, FifoMemory, Protocol};
use crate::transport::{Context, DeviceLink, Pending, Setup, Transport};

/// The `P2P/IPC` entry of the transport table.
pub struct P2pIpc;

impl Transport for P2pIpc {
    fn name(&self) -> &'static str {
        "P2P/IPC"
    }

    /// Ranks of one host in different processes, on a device that shares
    /// memory between processes, unless `NCCL_P2P_DISABLE`.
    fn carries_device_work(&self, cx: &Context<'_>, peer: usize) -> bool {
        !cx.p2p_disable
            && cx.same_host(peer)
            && !cx.same_process(peer)
            && cx
                .device_fifos
                .is_some_and(|placement| placement.shares_memory())
    }

    fn setup_device(
        &self,
        cx: &Context<'_>,
        _peer: usize,
        _channel: usize,
        protocol: Protocol,
    ) -> io::Result<Setup<DeviceLink>> {
        let placement = cx
            .device_fifos
            .ok_or_else(|| io::Error::other("P2P/IPC: no device memory to place FIFOs in"))?;
        let bytes = fifo_bytes(protocol, cx.fifo.nslots, cx.fifo.slot_bytes(protocol));
        let (inbound, handle) = placement.shareable_fifo(bytes)?;
        let export = fd_pass::listen()?;
        Ok(Setup {
            info: Some([&export.token[..], export.name.as_bytes()].concat()),
            pending: Box::new(HandOver {
                bytes,
                inbound,
                export: Some((export, handle)),
                call: None,
                outbound: None,
            }),
        })
    }
}

/// One side of a link being handed over.
struct HandOver {
    /// Bytes of each FIFO.
    bytes: usize,
    /// The FIFO this rank receives on, exported.
    inbound: Arc<dyn FifoMemory>,
    /// Its listener and handle, until the peer has taken the handle.
    export: Option<(ExportListener, OwnedFd)>,
    /// The call to the peer's socket, until its handle came.
    call: Option<UnixStream>,
    /// The peer's receiving FIFO, mapped: the one this rank sends on.
    outbound: Option<Arc<dyn FifoMemory>>,
}

impl HandOver {
    /// Whether the peer has been handed this rank's FIFO (`Ok(false)`: not
    /// yet). Callers without the token are dropped as they come.
    fn hand_over(&mut self) -> io::Result<bool> {
        let Some((export, handle)) = &mut self.export else {
            return Ok(true);
        };
        let Some((stream, _)) = export.next_caller(0)? else {
            return Ok(false);
        };
        send_fd(&stream, handle)?;
        self.export = None;
        Ok(true)
    }

    /// Whether the peer's FIFO is mapped (`Ok(false)`: its handle has not
    /// come yet): calls the socket `peer_info` names with its token.
    fn take_over(&mut self, cx: &Context<'_>, peer_info: &[u8]) -> io::Result<bool> {
        if self.outbound.is_some() {
            return Ok(true);
        }
        let call = match &self.call {
            Some(call) => call,
            None => {
                let malformed =
                    || io::Error::new(io::ErrorKind::InvalidData, "a malformed P2P/IPC setup");
                let (token, name) = peer_info.split_at_checked(TOKEN).ok_or_else(malformed)?;
                if !name.starts_with(NAME_PREFIX.as_bytes()) {
                    return Err(malformed());
                }
                let call = fd_pass::call(name, token).map_err(|e| {
                    if e.kind() == io::ErrorKind::ConnectionRefused {
                        io::Error::new(
                            e.kind(),
                            format!(
                                "it left this setup before this rank called its hand-over                                  socket ({e}): it destroyed or aborted its communicator, or                                  its process ended"
                            ),
                        )
                    } else {
                        io::Error::new(e.kind(), format!("calling its hand-over socket: {e}"))
                    }
                })?;
                call.set_nonblocking(true)?;
                self.call.insert(call)
            }
        };
        let Some(handle) = recv_fd(call)? else {
            return Ok(false);
        };
        let placement = cx
            .device_fifos
            .ok_or_else(|| io::Error::other("P2P/IPC: no device memory to map FIFOs in"))?;
        self.outbound = Some(placement.import_fifo(handle, self.bytes)?);
        self.call = None;
        Ok(true)
    }
}

impl Pending<DeviceLink> for HandOver {
    fn awaits_peer_info(&self) -> bool {
        true
    }

    /// Serves the peer's call and calls the peer, each as far as it goes
    /// without waiting; the link is made once both are done (the peer has
    /// then mapped this rank's FIFO, and this rank the peer's).
    fn connect(
        &mut self,
        cx: &Context<'_>,
        _peer: usize,
        peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<DeviceLink>> {
        let handed = self.hand_over()?;
        let taken = self.take_over(cx, peer_info)?;
        if !(handed && taken) {
            return Ok(None);
        }
        let send = self.outbound.take().expect("taken over above");
        Ok(Some(DeviceLink::Direct {
            send,
            recv: self.inbound.clone(),
        }))
    }
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
    use crate::fifo::HeapMemory;

    /// Set in a child: `name:token` (hex) of the export it calls.
    const CALL_AS_CHILD: &str = "RCCL_TEST_IPC_CALL";

    fn listening() -> (HandOver, [u8; TOKEN], Vec<u8>) {
        let export = fd_pass::listen().unwrap();
        let (token, name) = (export.token, export.name.clone().into_bytes());
        let handle = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let exports = HandOver {
            bytes: 0,
            inbound: Arc::new(HeapMemory::new(64)),
            export: Some((export, handle)),
            call: None,
            outbound: None,
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
    fn handed_over_within(exports: &mut HandOver, limit: Duration) -> bool {
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
        assert!(exports.export.is_some());
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
