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
pub mod socket;
pub mod tcp;
pub mod wait;

pub use fifo::Fifo;
pub use wait::{Backoff, ParkOn, WaitError};
