//! What a stream's queue or a graph's node holds: kernel launches,
//! memsets, copies, host functions, event records, frees and waits.

use std::ffi::c_void;
use std::sync::Arc;

use crate::occupancy::BlockNeeds;
use crate::user::Hold;

/// A kernel launch: its parameters copied at the launch, as the driver
/// copies them.
#[derive(Clone)]
pub(crate) struct Kernel {
    pub name: &'static str,
    pub dev: usize,
    pub blocks: u32,
    /// What each block holds of an SM while it runs.
    pub needs: BlockNeeds,
    /// The parameters, each at an 8-byte aligned offset.
    pub params: Vec<Vec<u64>>,
}

/// One operation of a stream or node of a graph.
#[derive(Clone)]
pub(crate) enum Work {
    Kernel(Kernel),
    Memset {
        dst: u64,
        value: u32,
        elem: usize,
        count: usize,
    },
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    /// A copy from pageable memory, staged at the call.
    Staged {
        dst: u64,
        data: Arc<Vec<u8>>,
    },
    Host {
        f: unsafe extern "C" fn(*mut c_void),
        arg: usize,
    },
    Record(u64),
    Free(u64),
    /// A launch of an executable graph, holding its user objects.
    Graph {
        nodes: Arc<Vec<Node>>,
        _hold: Arc<Hold>,
    },
    /// An external event wait node (`CU_EVENT_WAIT_EXTERNAL` in a
    /// capture): waits for the event's last record when the node runs.
    WaitEvent(u64),
    /// `cuStreamWaitValue32`: waits until the 32-bit word at `addr`
    /// meets the condition of `flags` against `value`.
    WaitValue {
        addr: u64,
        value: u32,
        flags: u32,
    },
    /// Ordering only (an event wait).
    Empty,
    /// A pause of the stream (`RCCL_CUDA_MODEL_LATE_MS`).
    Pause(std::time::Duration),
}

/// A node of a graph, after the nodes it depends on.
#[derive(Clone)]
pub(crate) struct Node {
    pub deps: Vec<usize>,
    pub work: Work,
}
