//! Connections between two ranks.
//!
//! A connection gives the executor memory: a [`fifo::Fifo`] of slots to
//! fill towards the peer and one to drain from it. Transports differ only in
//! where that memory lives and who moves it: the TCP transport stages slots
//! in local memory and a proxy thread per direction moves them over a
//! socket.

pub mod fifo;
pub mod futex;
pub mod net;
pub mod shm;
pub mod socket;
pub mod tcp;
pub mod wait;

pub use fifo::{Fifo, FifoShape, Protocol, Tag};
pub use wait::{Backoff, ParkOn, WaitError};

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
}

impl Connection for tcp::TcpConnection {
    fn send_fifo(&self, _proto: Protocol) -> &Fifo {
        tcp::TcpConnection::send_fifo(self)
    }
    fn recv_fifo(&self, _proto: Protocol) -> &Fifo {
        tcp::TcpConnection::recv_fifo(self)
    }
    fn failure(&self) -> Option<String> {
        tcp::TcpConnection::failure(self)
    }
    fn transport(&self) -> &'static str {
        "NET/Socket"
    }
}
