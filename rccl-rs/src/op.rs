//! One user call as the engine receives it: the communicator, what it
//! does, and its raw buffers, already validated.

use std::sync::Arc;

use crate::comm::CommInner;
use crate::plugins::profiler::ApiEvent;
use crate::types::{DataType, OpArgs, OpKind};

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

impl RawOp {
    /// What it does and on which buffers, without its communicator.
    pub fn args(&self) -> OpArgs {
        OpArgs {
            kind: self.kind,
            send: self.send,
            recv: self.recv,
            count: self.count,
            dtype: self.dtype,
        }
    }

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
