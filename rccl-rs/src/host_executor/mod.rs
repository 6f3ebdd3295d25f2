//! The host executor: runs a planned launch from the calling thread. It
//! opens the connections the launch's work needs (`crate::connect`),
//! walks each channel's schedule against them, or posts on the board
//! (`executor.rs`), and drives every run of every communicator of the
//! launch until all complete (`drive.rs`), telling hangs and calls that
//! differ between ranks apart from slow peers (`diagnose.rs`). Collectives
//! on symmetric windows read peers' windows in place, the board carrying
//! their barriers (`symmetric.rs`).
//!
//! Its launches are calls on host memory, and calls on device memory that
//! device work does not reach, run over host copies of their buffers
//! (`crate::device_executor` stages them).

mod diagnose;
mod drive;
mod executor;
mod symmetric;

pub(crate) use drive::{launch, on_board_alone, run};
