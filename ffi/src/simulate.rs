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
//! * **Sends and receives.** A rank knows only its own side of them, so
//!   its side is modeled with every peer posting the matching calls and
//!   nothing else: the batch the launch would run (one after the
//!   group's collectives; the Simple protocol, channels by the largest
//!   message, chunks of half a FIFO, as the engine's point-to-point path)
//!   replayed by `rccl_simulator::simulate_p2p` on the same links as the
//!   collectives. Each transfer crosses the link between this rank and its
//!   peer in the modeled cluster (a host link within a host, NICs across
//!   hosts, with their latency and the protocol's efficiency); the batch's
//!   transfers run at once, so sends to different peers share this rank's
//!   outgoing link, receives its incoming one, and a send and a receive
//!   overlap. A send to the rank itself paired with a receive from itself
//!   is a local copy. The time runs until the last transfer is copied out
//!   at its receiver. What the peers do besides (their own traffic to
//!   others) is not known, so not modeled.
//! * **On what.** By default, the simulator's preset for this kind of
//!   machine (ranks as CPU processes): `local-shm`, or `local-tcp` when
//!   `NCCL_SHM_DISABLE=1`. `RCCL_SIM_CLUSTER` points the estimate at
//!   another cluster: a preset name `rccl-sim --cluster` takes (`h100`,
//!   `local-shm`, `local-tcp`) or a cluster JSON file (`rccl-sim
//!   --dump-cluster` prints one); it is read at each simulated end, and
//!   a bad value fails that end naming the variable. Either way the
//!   cluster is shaped as the communicator: its hosts and ranks per host
//!   (ranks of a host on the host link, hosts joined by the NICs), with
//!   the communicator's FIFO slot sizes (`NCCL_BUFFSIZE`, ...), which the
//!   engine's plan is cut for. The figures are the cluster's, not the
//!   tuner's `LinkModel`: that one is a closed form for ranking
//!   candidates (a latency per step and a stream bandwidth), while the
//!   replay needs what it models separately (link bandwidth and latency,
//!   per-primitive overhead, reduction and copy throughput, protocol
//!   efficiency and slots). Taking the simulator's figures keeps one
//!   model: by default the answer is what `rccl-sim --cluster local-shm`
//!   prints for the same call, algorithm, protocol and channels.
//! * **How operations combine.** A communicator's channels run the group's
//!   operations one after another (its sends and receives as one batch
//!   after its collectives), so its estimate is their sum (an operation
//!   on fewer channels may overlap the next a little, which the sum does
//!   not credit). Communicators of one group progress together, so the
//!   group's estimate is the largest of theirs; each replay of a
//!   collective covers every rank of it, so a group that issues one
//!   collective on all the ranks of one process reports that collective's
//!   time, not N times it. (NCCL reports its cost model's time of the
//!   group's last collective; for a group of one collective the two agree
//!   in meaning.)

use rccl::{Error, Result};
use rccl::{PlannedCollective, PlannedComm, PlannedP2p};
use rccl_simulator::{cluster, simulate, simulate_p2p, ClusterSpec, Params, Protocol};

/// The variable that points the estimate at another cluster.
pub const CLUSTER_VAR: &str = "RCCL_SIM_CLUSTER";

/// The cluster `RCCL_SIM_CLUSTER` names, before it is shaped as a
/// communicator: `None` when it is unset or empty.
pub fn chosen_cluster() -> Result<Option<ClusterSpec>> {
    let Some(value) = rccl::env::var(CLUSTER_VAR).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    // A preset's host and rank counts do not matter: the communicator's
    // shape replaces them.
    if let Some(c) = cluster::preset(&value, 1, 1) {
        return Ok(Some(c));
    }
    let text = std::fs::read_to_string(&value).map_err(|e| {
        Error::InvalidArgument(format!(
            "{CLUSTER_VAR}={value}: not a preset (h100, local-shm, local-tcp) and not a \
             readable cluster file: {e}"
        ))
    })?;
    let c = ClusterSpec::from_json(&text)
        .map_err(|e| Error::InvalidArgument(format!("{CLUSTER_VAR}={value}: {e}")))?;
    c.validate().map_err(|e| {
        Error::InvalidArgument(format!("{CLUSTER_VAR}={value}: not a usable cluster: {e}"))
    })?;
    Ok(Some(c))
}

/// The modeled cluster of a communicator: the cluster `RCCL_SIM_CLUSTER`
/// names, else the `local-shm` preset (`local-tcp` without shared memory),
/// with the communicator's hosts, ranks per host, FIFO slot sizes and
/// streaming threshold.
pub fn cluster_of(comm: &PlannedComm) -> Result<ClusterSpec> {
    let base = match chosen_cluster()? {
        Some(c) => c,
        None => {
            // This machine's figures, with the communicator's rails.
            let mut local = cluster::local(1, comm.config.shm_disable);
            local.nic.per_host = Some(comm.rails.max(1));
            local
        }
    };
    let topology = &comm.topology;
    let host_of: Vec<usize> = (0..topology.nranks())
        .map(|r| topology.host_of(r))
        .collect();
    let mut cluster = base.with_placement(&host_of);
    // Slots are indexed in NCCL's protocol order: LL, LL128, Simple.
    let [ll, ll128, simple] = comm.config.fifo_shape().slot_bytes;
    cluster.protocols.ll.slot_bytes = ll;
    cluster.protocols.ll128.slot_bytes = ll128;
    cluster.protocols.simple.slot_bytes = simple;
    cluster.stream_from(comm.config.nt_store_bytes);
    cluster.validate().map_err(|e| {
        Error::InvalidUsage(format!(
            "{CLUSTER_VAR}: cluster {} cannot hold this communicator ({} ranks on {} host(s), \
             at most {} per host): {e}; the group was closed and nothing ran",
            cluster.name,
            host_of.len(),
            cluster.hosts,
            cluster.ranks_per_host
        ))
    })?;
    Ok(cluster)
}

fn protocol_of(name: &str) -> Result<Protocol> {
    Protocol::parse(name)
        .ok_or_else(|| Error::Internal(format!("the simulator has no protocol {name}")))
}

/// The simulated time of one planned collective on `cluster`, µs.
pub fn collective_us(cluster: &ClusterSpec, call: &PlannedCollective) -> Result<f64> {
    let choice = &call.choice;
    let protocol = protocol_of(choice.protocol.name())?;
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

/// The simulated time of `rank`'s batch of sends and receives on
/// `cluster`, its peers posting the matching calls, µs.
pub fn p2p_us(cluster: &ClusterSpec, rank: usize, batch: &PlannedP2p) -> Result<f64> {
    let protocol = protocol_of(batch.protocol.name())?;
    let params = Params {
        nchannels: batch.nchannels,
        chunk_elems: batch.chunk_bytes,
    };
    simulate_p2p(cluster, rank, &batch.calls, protocol, &params)
        .map(|r| r.time_us)
        .map_err(|e| {
            Error::InvalidUsage(format!(
                "the {} send(s)/receive(s) of rank {rank} cannot be simulated: {e}; the group \
                 was closed and nothing ran",
                batch.calls.len()
            ))
        })
}

/// The estimate of a simulated group, µs: per communicator the sum of its
/// collectives and its batch of sends and receives, the largest over
/// communicators.
pub fn group_us(comms: &[PlannedComm]) -> Result<f64> {
    let mut longest = 0.0f64;
    for comm in comms {
        let cluster = cluster_of(comm)?;
        let mut total = 0.0;
        for call in &comm.collectives {
            total += collective_us(&cluster, call)?;
        }
        if let Some(batch) = &comm.p2p {
            total += p2p_us(&cluster, comm.rank, batch)?;
        }
        longest = longest.max(total);
    }
    Ok(longest)
}
