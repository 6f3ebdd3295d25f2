//! Whether a communicator's calls on device memory run as device work:
//! the one place that asks, answered once per communicator.

use rccl_transports::table;
use rccl_transports::FifoPlacement;

use super::fifo_placement::DeviceFifoPlacement;
use crate::comm::CommInner;
use crate::connect::{context, endpoints};

/// Whether a communicator's calls on device memory run as device work:
/// an entry of the transport table links this rank's device work with
/// every peer's (see `rccl_transports::table`: ranks of this process,
/// ranks of other processes of this host where the device shares memory
/// between processes, ranks on other hosts through the network), with
/// FIFOs where `fifo_placement.rs` puts them.
pub(crate) fn runs_device_work(comm: &CommInner) -> bool {
    let Some(device) = rccl_device::active() else {
        return false;
    };
    *comm
        .device_work_reaches_all
        .get_or_init(|| device_work_reaches_all(comm, &DeviceFifoPlacement::for_comm(comm, device)))
}

/// Whether an entry of the transport table links this rank's device work
/// with every peer's.
fn device_work_reaches_all(comm: &CommInner, placement: &dyn FifoPlacement) -> bool {
    let endpoints = endpoints(comm);
    let cx = context(comm, &endpoints, Some(placement));
    (0..comm.nranks)
        .filter(|&peer| peer != comm.rank)
        .all(|peer| table::choose_for_device(&cx, peer).is_some())
}
