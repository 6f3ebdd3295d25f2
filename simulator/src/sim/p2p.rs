//! A group of sends and receives: one rank's calls replayed with the
//! matching calls its peers are taken to post.

use rccl_algorithms::{p2p_schedule, unpaired_self_calls, P2pOp, Params};

use crate::cluster::{ClusterSpec, ProtoSpec, Protocol, SimError};

use super::net::{Geo, Net};
use super::replay::{replay, Threads};
use super::{algbw_gbs, completion, Footprint, SimResult, FIFO_SLOTS};

/// The parameters the engine would use for a group of sends and receives
/// (`calls`, lengths in bytes) on `cluster`: the protocol is always
/// Simple (the engine's point-to-point path uses no other), channels by
/// the largest message as for a call that leaves the host, and a chunk
/// (in bytes) of half a Simple FIFO.
pub fn default_p2p_params(cluster: &ClusterSpec, calls: &[P2pOp]) -> Params {
    let t = &cluster.tuning;
    let slot = cluster.protocols.simple.slot_bytes;
    Params {
        nchannels: (largest_p2p(calls) / t.bytes_per_channel.max(1))
            .clamp(t.min_channels, t.max_channels),
        chunk_elems: (slot * FIFO_SLOTS / 2).max(1),
    }
}

fn largest_p2p(calls: &[P2pOp]) -> usize {
    calls.iter().map(P2pOp::length).max().unwrap_or(0)
}

/// Simulates `rank`'s side of a group of sends and receives on `cluster`:
/// `calls` in call order, offsets and lengths in bytes, run with
/// `protocol` and `params` (`chunk_elems` in bytes; see
/// [`default_p2p_params`]).
///
/// A rank knows only its own calls, so every peer is taken to post the
/// matching ones and nothing else: a receive for each send to it and a
/// send for each receive from it, in the same order, split across the
/// same channels. Those schedules and `rank`'s (the engine's
/// `p2p_schedule`) are replayed together as any collective is, so the
/// group's transfers run concurrently: sends to different peers share
/// `rank`'s outgoing links, receives its incoming ones, and a send and a
/// receive, going opposite ways, overlap. A send to `rank` itself paired
/// with a receive from itself is a local copy. `time_us` is when the last
/// transfer is complete at both ends (its last piece copied out at the
/// receiver); `size_bytes` sums the calls' lengths and `busbw` equals
/// `algbw`.
pub fn simulate_p2p(
    cluster: &ClusterSpec,
    rank: usize,
    calls: &[P2pOp],
    protocol: Protocol,
    params: &Params,
) -> Result<SimResult, SimError> {
    cluster.validate()?;
    let n = cluster.nranks();
    if rank >= n {
        return Err(SimError(format!(
            "rank {rank} is not below the cluster's {n} ranks"
        )));
    }
    if let Some(call) = calls.iter().find(|c| c.peer() >= n) {
        return Err(SimError(format!(
            "peer {} is not below the cluster's {n} ranks",
            call.peer()
        )));
    }
    // As the engine: self sends and self receives pair up into copies.
    if let Some(why) = unpaired_self_calls(rank, calls) {
        return Err(SimError(format!("rank {rank}: {why} (lengths in bytes)")));
    }
    let chunk = params.chunk_elems.max(1);
    if chunk.min(largest_p2p(calls)) > u32::MAX as usize {
        return Err(SimError(
            "messages above 4 GiB are not modeled: choose a smaller chunk".into(),
        ));
    }

    // Every peer's mirror calls, laid end to end in its buffers.
    let mut mirror: Vec<Vec<P2pOp>> = vec![Vec::new(); n];
    let mut ends = vec![(0usize, 0usize); n];
    for call in calls {
        match *call {
            P2pOp::Send { peer, len, .. } if peer != rank => {
                let offset = ends[peer].1;
                ends[peer].1 += len;
                mirror[peer].push(P2pOp::Recv {
                    peer: rank,
                    offset,
                    len,
                });
            }
            P2pOp::Recv { peer, len, .. } if peer != rank => {
                let offset = ends[peer].0;
                ends[peer].0 += len;
                mirror[peer].push(P2pOp::Send {
                    peer: rank,
                    offset,
                    len,
                });
            }
            _ => {}
        }
    }
    mirror[rank] = calls.to_vec();

    let nch = params.nchannels.max(1);
    let proto: ProtoSpec = *cluster.protocols.get(protocol);
    // A rank's footprint: the bytes it sends and receives.
    let moved: Vec<Footprint> = mirror
        .iter()
        .map(|calls| {
            let bytes = |sends: bool| {
                calls
                    .iter()
                    .filter(|c| matches!(c, P2pOp::Send { .. }) == sends)
                    .map(P2pOp::length)
                    .sum()
            };
            Footprint {
                read: bytes(true),
                written: bytes(false),
            }
        })
        .collect();
    let net = Net::new(cluster, |r| moved[r]);
    let geo = Geo::new(cluster, &proto);
    let mut threads = Threads::default();
    for (r, calls) in mirror.iter().enumerate() {
        threads.push(p2p_schedule(r, calls, nch, chunk), nch, 1, n)?;
    }
    let (done_at, prims) = replay(&net, &geo, &proto, &threads, nch, n)?;
    let involved: Vec<usize> = (0..n)
        .filter(|&r| r == rank || !mirror[r].is_empty())
        .collect();
    let (last_rank, time_us, first_done_us) =
        completion(involved.iter().map(|&r| (r, done_at[r])), rank);
    let size: usize = calls.iter().map(P2pOp::length).sum();
    let algbw = algbw_gbs(size, time_us);
    Ok(SimResult {
        time_us,
        first_done_us,
        size_bytes: size,
        algbw,
        busbw: algbw,
        algorithm: "p2p".into(),
        protocol,
        nchannels: nch,
        chunk_elems: chunk,
        ranks_replayed: involved.len(),
        prims,
        last_rank,
    })
}
