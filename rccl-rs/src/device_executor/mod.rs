//! The device executor: everything a call on device memory needs past the
//! seam. `stream.rs` classifies a call's buffers and enqueues its launch
//! on the calls' streams, deciding once whether it runs as device work:
//! it does where an entry of the transport table links this rank's device
//! work with every peer's (`reach.rs`). Else the host executor runs it
//! over host copies of its buffers (`host_staging.rs`).
//!
//! Device work: each operation's work as planned (`work.rs`), the links a
//! communicator keeps between launches (`links.rs`) over FIFOs placed
//! where the device reaches them (`fifo_placement.rs`), made through the
//! shared connect loop (`connect.rs`), the launch that
//! encodes a planned launch over them and hands it to the device
//! (`launch.rs`), and the watch that stops it when a peer's process on
//! this host dies (`process_watch.rs`).

mod connect;
mod fifo_placement;
mod host_staging;
mod launch;
mod links;
mod process_watch;
mod reach;
mod stream;
mod work;

pub(crate) use stream::{enqueue, stream_for, Buffer, CallName};
