//! The estimate `ncclGroupSimulateEnd` reports: the engine's plan of the
//! group, replayed by the simulator (`rccl-simulator`, the model behind
//! `rccl-sim`; `docs/SIMULATOR.md`, "From the C ABI").
//!
//! * **What is replayed.** Every collective of the group, with the schedule
//!   the engine would run for it on its communicator: the tuner's
//!   algorithm, protocol, channels and chunk, so `NCCL_ALGO`,
//!   `NCCL_PROTO`, `NCCL_MIN/MAX_NCHANNELS`, the `RCCL_*` link figures the
//!   tuner ranks candidates with and a tuner plug-in all shape the estimate
//!   as they would shape the call.
//! * **On what.** The simulator's preset for this kind of machine (ranks as
//!   CPU processes): `local-shm`, or `local-tcp` when `NCCL_SHM_DISABLE=1`,
//!   shaped as the communicator: its hosts and ranks per host (ranks of a
//!   host on shared memory, hosts joined by TCP), with the communicator's
//!   FIFO slot sizes (`NCCL_BUFFSIZE`, ...). The figures are the preset's,
//!   not the tuner's `LinkModel`: that one is a closed form for ranking
//!   candidates (a latency per step and a stream bandwidth), while the
//!   replay needs what it models separately (link bandwidth and latency,
//!   per-primitive overhead, reduction and copy throughput, protocol
//!   efficiency and slots). Taking the preset keeps one model: the answer
//!   is what `rccl-sim --cluster local-shm` prints for the same call,
//!   algorithm, protocol and channels.
//! * **How operations combine.** A communicator's channels run the group's
//!   operations one after another, so its estimate is their sum (an
//!   operation on fewer channels may overlap the next a little, which the
//!   sum does not credit). Communicators of one group progress together,
//!   so the group's estimate is the largest of theirs; each replay covers
//!   every rank of its collective, so a group that issues one collective on
//!   all the ranks of one process reports that collective's time, not N
//!   times it. (NCCL reports its cost model's time of the group's last
//!   collective; for a group of one collective the two agree in meaning.)
//! * **Not modeled.** Sends and receives: a rank only knows its own side of
//!   them, and the replay needs every rank's schedule, so a group holding
//!   any is refused with `ncclInvalidUsage` (and runs nothing).

use rccl::enqueue::{PlannedCollective, PlannedComm};
use rccl::{Error, Result};
use rccl_simulator::{cluster, simulate, ClusterSpec, Protocol};

/// The modeled cluster of a communicator: the `local-shm` preset
/// (`local-tcp` without shared memory) with the communicator's hosts,
/// ranks per host and FIFO slot sizes.
pub fn cluster_of(comm: &PlannedComm) -> ClusterSpec {
    let topology = &comm.topology;
    let host_of: Vec<usize> = (0..topology.nranks())
        .map(|r| topology.host_of(r))
        .collect();
    let mut cluster = cluster::local(1, comm.config.shm_disable).with_placement(&host_of);
    // Slots are indexed in NCCL's protocol order: LL, LL128, Simple.
    let [ll, ll128, simple] = comm.config.fifo_shape().slot_bytes;
    cluster.protocols.ll.slot_bytes = ll;
    cluster.protocols.ll128.slot_bytes = ll128;
    cluster.protocols.simple.slot_bytes = simple;
    cluster
}

/// The simulated time of one planned collective on `cluster`, µs.
pub fn collective_us(cluster: &ClusterSpec, call: &PlannedCollective) -> Result<f64> {
    let choice = &call.choice;
    let protocol = Protocol::parse(choice.protocol.name()).ok_or_else(|| {
        Error::Internal(format!(
            "the simulator has no protocol {}",
            choice.protocol.name()
        ))
    })?;
    simulate(
        cluster,
        &call.spec,
        call.elem_size,
        choice.algorithm,
        protocol,
        &choice.params,
    )
    .map(|r| r.time_us)
    .map_err(|e| {
        Error::InvalidUsage(format!(
            "{} of {} elements of {} bytes with {} / {} cannot be simulated: {e}; the group \
             was closed and nothing ran",
            call.spec.kind.name(),
            call.spec.count,
            call.elem_size,
            choice.algorithm.name(),
            protocol.name()
        ))
    })
}

/// The estimate of a simulated group, µs: per communicator the sum of its
/// collectives, the largest over communicators. Sends and receives are
/// refused.
pub fn group_us(comms: &[PlannedComm]) -> Result<f64> {
    let mut longest = 0.0f64;
    for comm in comms {
        if comm.sends_and_receives > 0 {
            return Err(Error::InvalidUsage(format!(
                "the group holds {} send(s)/receive(s) on rank {}: ncclGroupSimulateEnd \
                 models collectives only (the replay needs every rank's side of a transfer); \
                 the group was closed and nothing ran",
                comm.sends_and_receives, comm.rank
            )));
        }
        let cluster = cluster_of(comm);
        let mut total = 0.0;
        for call in &comm.collectives {
            total += collective_us(&cluster, call)?;
        }
        longest = longest.max(total);
    }
    Ok(longest)
}
