//! One user call as the engine receives it: the communicator, what it
//! does, and its raw buffers, already validated.

use std::ffi::c_void;
use std::sync::Arc;

use rccl_algorithms::CollKind;

use crate::comm::CommInner;
use crate::types::{DataType, RedOp};

/// What an operation does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKind {
    /// A collective with its root (0 when rootless) and reduction op.
    Coll {
        kind: CollKind,
        root: usize,
        op: RedOp,
    },
    /// A point-to-point send to `peer`.
    Send { peer: usize },
    /// A point-to-point receive from `peer`.
    Recv { peer: usize },
}

/// One user call, with raw buffers already validated by the caller.
pub(crate) struct RawOp {
    pub comm: Arc<CommInner>,
    pub kind: OpKind,
    pub send: *const u8,
    pub recv: *mut u8,
    pub count: usize,
    pub dtype: DataType,
    /// The stream a call on device memory is ordered on; `None` for host
    /// memory, which the call's thread runs before it returns.
    pub stream: Option<crate::queue::StreamRef>,
    /// Its API event of a profiler plug-in, the parent of its collective
    /// or point-to-point event.
    pub api_event: ApiEvent,
}

/// A call's API event of a profiler plug-in (v5 on), already stopped as
/// NCCL stops it once the call is queued: its handle is the `parentObj`
/// of the call's collective or point-to-point event, null without one.
#[derive(Clone, Copy)]
pub(crate) struct ApiEvent(*mut c_void);

impl ApiEvent {
    pub fn new(handle: *mut c_void) -> Self {
        ApiEvent(handle)
    }

    pub fn handle(self) -> *mut c_void {
        self.0
    }
}

impl Default for ApiEvent {
    fn default() -> Self {
        ApiEvent(std::ptr::null_mut())
    }
}

// SAFETY: the handle is only passed back to the plug-in as a parent.
unsafe impl Send for ApiEvent {}

impl RawOp {
    /// The bytes of its send and receive buffers on this rank.
    pub fn buffer_bytes(&self) -> (usize, usize) {
        let (comm, size) = (&self.comm, self.dtype.size());
        match self.kind {
            OpKind::Coll { kind, root, .. } => (
                kind.send_len(self.count, comm.nranks, comm.rank, root) * size,
                kind.recv_len(self.count, comm.nranks, comm.rank, root) * size,
            ),
            OpKind::Send { .. } => (self.count * size, 0),
            OpKind::Recv { .. } => (0, self.count * size),
        }
    }
}
