//! The transport table's view of a communicator: what it sees of every
//! rank, its context for device work, and whether the table links this
//! rank's device work with every peer's (which decides whether calls on
//! device memory run as device work).

use rccl_transports::table;
use rccl_transports::ProcessId;
use rccl_transports::{Context, Endpoint, FifoPlacement};

use crate::comm::CommInner;
use crate::device_work::placement::Placement;

/// What the transports see of every rank of `comm`.
pub(crate) fn endpoints(comm: &CommInner) -> Vec<Endpoint> {
    comm.peers
        .iter()
        .map(|p| Endpoint {
            host_id: p.host_id.clone(),
            process: ProcessId {
                pid: p.pid,
                start: p.start,
            },
            data_addr: p.data_addr,
        })
        .collect()
}

/// The transports' view of `comm` for device work, whose FIFOs
/// `placement` puts where the device's work reaches them.
pub(crate) fn device_context<'a>(
    comm: &'a CommInner,
    endpoints: &'a [Endpoint],
    placement: &'a dyn FifoPlacement,
) -> Context<'a> {
    Context {
        rank: comm.rank,
        secret: comm.bootstrap.secret().0,
        endpoints,
        fifo: comm.config.fifo_shape(),
        shm_disable: comm.config.shm_disable,
        p2p_disable: comm.config.p2p_disable,
        device_fifos: Some(placement),
        net: &comm.net,
        abort: &comm.abort,
    }
}

/// Whether a communicator's calls on device memory run as device work:
/// an entry of the transport table links this rank's device work with
/// every peer's (see `rccl_transports::table`: ranks of this process,
/// ranks of other processes of this host where the device shares memory
/// between processes, ranks on other hosts through the network), with
/// FIFOs where `placement.rs` puts them.
pub(crate) fn runs_device_work(comm: &CommInner) -> bool {
    let Some(device) = rccl_device::active() else {
        return false;
    };
    *comm
        .device_work_reaches_all
        .get_or_init(|| device_work_reaches_all(comm, &Placement::for_comm(comm, device)))
}

/// Whether an entry of the transport table links this rank's device work
/// with every peer's.
fn device_work_reaches_all(comm: &CommInner, placement: &dyn FifoPlacement) -> bool {
    let endpoints = endpoints(comm);
    let cx = device_context(comm, &endpoints, placement);
    (0..comm.nranks)
        .filter(|&peer| peer != comm.rank)
        .all(|peer| table::choose_for_device(&cx, peer).is_some())
}
