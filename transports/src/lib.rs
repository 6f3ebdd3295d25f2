//! Connections between two ranks.
//!
//! A connection gives the executor memory: a [`Fifo`] of slots to
//! fill towards the peer and one to drain from it. Transports differ only in
//! where that memory lives and who moves it: shared memory is the peer's
//! memory too; the network stages slots in local memory and the process's
//! network proxy moves them through a [`network::Net`] provider. A
//! [`Transport`] makes connections; the [`table`] says which
//! one connects two ranks.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod board;
mod direct;
mod fd_pass;
mod fifo;
mod futex;
mod ipc;
mod process;
mod shm;
mod tcp_connect;
mod transport;
mod wait;
mod window;

// Namespaces whose items read best with their module's name
// (`auth_tcp::connect`, `host::interfaces`, `network::Net`,
// `table::choose`, `verbs::Model`).
pub mod auth_tcp;
pub mod host;
pub mod network;
pub mod table;
pub mod verbs;

// FIFOs: the memory a connection gives the executor, and what a slot holds.
pub use fifo::{
    control_bytes, fifo_bytes, write_slot_header, Doorbell, Fifo, FifoMemory, FifoShape,
    HeapMemory, Protocol, PtrSupport, Tag, SLOT_HEADER,
};

// Making connections: the transport interface and the transports within a
// host (the network's are in [`network`]).
pub use direct::P2pDirect;
pub use shm::{explain_no_room, segment_bytes, ShmConnection, ShmSegment};
pub use transport::{Context, DeviceLink, Endpoint, FifoPlacement, Pending, Setup, Transport};

// The shared board the ranks of a host post small all-reduces on.
pub use board::Board;

// Waiting on a peer.
pub use wait::{spin_before_yielding, spinning, wait_until, Backoff, ParkOn, WaitError};

// One-sided access: shareable host memory, peers' windows, signals.
pub use window::{
    alloc_shareable, export as export_window, free_shareable, open_file, release as release_window,
    Export, FileId, PeerWindow, SignalBlock,
};

// Handing a descriptor to processes of this host.
pub use fd_pass::{fetch_fd, serve_fd, ServedFd, TOKEN as FD_TOKEN};

// Processes: who a peer is and whether it still runs.
pub use process::{effective_uid, parse_stat, ProcessId};

/// A connection to one peer as the executor sees it: a FIFO each way for
/// each protocol (a transport may carry every protocol in one FIFO).
pub trait Connection: Send + Sync {
    /// The FIFO this rank fills towards the peer with `proto`.
    fn send_fifo(&self, proto: Protocol) -> &Fifo;
    /// The FIFO this rank drains from the peer with `proto`.
    fn recv_fifo(&self, proto: Protocol) -> &Fifo;
    /// Why the connection failed, once it has.
    fn failure(&self) -> Option<String>;
    /// The transport's name for logs (`NET/Socket`, `SHM`).
    fn transport(&self) -> &'static str;
    /// Gives up on the connection and tells the peer why, so that its
    /// waits end at once with the original cause (at most [`MAX_NOTE`]
    /// bytes of `note` travel). Only the first call's note is sent.
    fn close_with(&self, note: &str);
    /// What the peer said when it gave up on the connection, if it did.
    fn peer_note(&self) -> Option<String>;
    /// Whether [`Connection::close_with`] may wait on the peer (for its
    /// last pieces and the note to be taken), so that a rank closing many
    /// connections closes these side by side and pays one such wait.
    fn close_may_wait(&self) -> bool {
        false
    }
    /// Whether the peer is known to be gone, with the reason: a check for
    /// waits that have been blocked a while (it may make a system call),
    /// never for the fast path.
    fn peer_gone(&self) -> Option<String> {
        None
    }
    /// Has the transport's proxy report each network step it moves to
    /// `observer` (a profiler's proxy events); transports without a proxy
    /// have nothing to report.
    fn observe_steps(&self, _observer: std::sync::Arc<dyn StepObserver>) {}
    /// Bytes of memory this side maps for the connection: its FIFOs each
    /// way, each counted once however many protocols share it. A
    /// transport whose FIFOs lie in a larger mapping says so.
    fn held_bytes(&self) -> usize {
        let mut seen: Vec<*const u8> = Vec::new();
        let mut bytes = 0;
        for proto in Protocol::ALL {
            for fifo in [self.send_fifo(proto), self.recv_fifo(proto)] {
                let memory = fifo.memory();
                let at = memory.base().cast_const();
                if !seen.contains(&at) {
                    seen.push(at);
                    bytes += memory.len();
                }
            }
        }
        bytes
    }
}

/// Sees the network steps a connection's proxy moves, each a piece of the
/// call its tag names.
pub trait StepObserver: Send + Sync {
    /// The send of a piece of `bytes` of call `tag` was posted; what comes
    /// back is handed to [`StepObserver::sent`] when it completes.
    fn send_posted(&self, tag: Tag, bytes: usize) -> usize;
    /// The send [`StepObserver::send_posted`] answered with `step` completed.
    fn sent(&self, step: usize);
    /// A piece of `bytes` of call `tag` arrived and was handed to the
    /// executor.
    fn received(&self, tag: Tag, bytes: usize);
}

/// `err` with what it means and what to do when it is the lack of a file
/// descriptor (EMFILE: this process's limit, ENFILE: the system's); other
/// errors come back as they are. Every socket, listener and shared-memory
/// object a rank opens counts, so the limit is met at connection setup.
pub fn explain_fd_limit(err: std::io::Error) -> std::io::Error {
    let text = match err.raw_os_error() {
        Some(libc::EMFILE) => {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `limit` is a valid out-pointer for the call.
            let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
            let limit = if known {
                format!("its limit of {} open files", limit.rlim_cur)
            } else {
                "its limit of open files".to_string()
            };
            format!(
                "too many open files (EMFILE): process {} has reached {limit} (RLIMIT_NOFILE); \
                 raise it with `ulimit -n`",
                std::process::id()
            )
        }
        Some(libc::ENFILE) => "too many open files in the system (ENFILE): the host's limit \
                               (fs.file-max) is reached"
            .to_string(),
        _ => return err,
    };
    std::io::Error::new(err.kind(), text)
}

/// Most bytes of a note a closing side leaves for its peer.
pub const MAX_NOTE: usize = 2048;

/// `note` cut to at most [`MAX_NOTE`] bytes at a character boundary.
pub fn bounded_note(note: &str) -> &str {
    if note.len() <= MAX_NOTE {
        return note;
    }
    let mut end = MAX_NOTE;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}
