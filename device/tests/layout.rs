//! The block memory the launch sizes from Rust is what the kernels lay
//! out: a mismatch would give a block too little shared memory for its
//! channel's peers, or count them wrong.

use rccl_device::twin;
use rccl_device::work::{PEER_ENDS_BYTES, WORK_LOCAL_BYTES};

#[test]
fn block_memory_matches_the_kernels() {
    let (peer_ends, work_local) = twin::block_memory();
    assert_eq!(PEER_ENDS_BYTES, peer_ends, "rccl::PeerEnds");
    assert_eq!(WORK_LOCAL_BYTES, work_local, "rccl::WorkLocal");
}
