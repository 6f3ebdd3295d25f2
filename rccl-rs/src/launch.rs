//! The seam between a call and its executor: a launch (a lone call, or a
//! closed group) on host memory runs on the host executor from the calling
//! thread, after the work its communicators queued on streams; one on
//! device memory goes to the device executor, which enqueues it on the
//! calls' streams. Nothing past here asks where a call's buffers are.

use crate::device_executor;
use crate::error::Result;
use crate::host_executor;
use crate::op::RawOp;

/// Runs or enqueues the calls of a closed group.
pub(crate) fn launch_group(ops: Vec<RawOp>) -> Result<()> {
    if ops.iter().any(|op| op.stream.is_some()) {
        return device_executor::enqueue(ops);
    }
    for op in &ops {
        after_queued(op)?;
    }
    host_executor::launch(ops)
}

/// Runs or enqueues a call made outside any group.
pub(crate) fn launch_alone(op: RawOp) -> Result<()> {
    if op.stream.is_some() {
        return device_executor::enqueue(vec![op]);
    }
    after_queued(&op)?;
    match host_executor::on_board_alone(&op) {
        Some(done) => done,
        None => host_executor::launch(std::iter::once(op)),
    }
}

/// A host call on a communicator runs after the launches queued on its
/// streams (one atomic load when none is).
fn after_queued(op: &RawOp) -> Result<()> {
    op.comm.queued.wait_idle(&*op.comm)
}
