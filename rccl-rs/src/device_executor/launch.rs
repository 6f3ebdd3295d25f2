//! Launching device work: a planned launch whose communicators' ranks
//! all reach each other's device memory is encoded, operation by
//! operation, over each communicator's device links (`links.rs`) and
//! handed to the device as one launch on the calls' streams.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use rccl_algorithms::Schedule;
use rccl_device::abi::FifoView;
use rccl_device::work::{encode, Work, WorkCall, WorkLinks};
use rccl_device::{Device, WorkFailure, WorkLaunch};
use rccl_transports::network::keep_polling;
use rccl_transports::{Connection, DeviceLink, Fifo, FifoMemory, Protocol};

use super::connect::{connect_for_device, DeviceConnection};
use super::fifo_placement::{slots_in, DeviceFifoPlacement};
use super::links::{DeviceLinks, DeviceMem};
use super::process_watch::Watch;
use super::work::{self, DeviceOp};
use crate::agreement::stuck::Notices;
use crate::comm::{failure_note, CommInner, PeerWatch, LEFT_IN_ORDER};
use crate::error::{Error, Result};
use crate::memory::Purpose;
use crate::plan::Planned;
use crate::queue::StreamRef;

/// One operation's view of its communicator's links, for the encoder.
struct OpLinks<'a> {
    links: &'a DeviceLinks,
    proto: usize,
    nslots: u32,
    slot_bytes: u32,
}

impl WorkLinks for OpLinks<'_> {
    fn fifos(&self, channel: usize, peer: usize) -> (FifoView, FifoView) {
        if let Some(conn) = self.links.net.get(&(channel, peer)) {
            let view = |fifo: &Fifo| {
                let mem = fifo.memory();
                FifoView {
                    base: mem.base(),
                    slots: mem.slots(),
                    proto: Protocol::Simple.abi(),
                    nslots: fifo.nslots() as u32,
                    slot_bytes: fifo.slot_bytes() as u32,
                    pad: 0,
                }
            };
            let simple = Protocol::Simple;
            return (view(conn.send_fifo(simple)), view(conn.recv_fifo(simple)));
        }
        let (send, recv) = &self.links.fifos[&(channel, peer, self.proto)];
        let view = |mem: &Arc<dyn FifoMemory>| {
            FifoView::whole(mem.base(), self.proto as u32, self.nslots, self.slot_bytes)
        };
        (view(send), view(recv))
    }

    fn scratch(&self, channel: usize) -> (*mut u8, u64) {
        // A channel without steps has none: it never stages a piece.
        match &self.links.scratch[channel] {
            Some(mem) => (mem.ptr, self.slot_bytes as u64),
            None => (std::ptr::null_mut(), 0),
        }
    }
}

/// Who one block's channels exchange with, so that a launch that runs out
/// of time names the peers its unfinished channels waited for.
struct BlockPeers {
    comm: Arc<CommInner>,
    /// The operation's sequence number.
    seq: u32,
    /// Per channel: the ranks it receives from, then those it sends to.
    channels: Vec<(Vec<Source>, Vec<usize>)>,
}

/// A rank a channel receives from, with its network connection when it is
/// on another host.
type Source = (usize, Option<Arc<dyn Connection>>);

impl BlockPeers {
    fn new(comm: &Arc<CommInner>, seq: u32, schedule: &Schedule, links: &DeviceLinks) -> Self {
        let channels = schedule
            .channels
            .iter()
            .enumerate()
            .map(|(channel, steps)| {
                let prims = || steps.iter().flat_map(|step| step.prims.iter());
                let mut from: Vec<usize> = prims().filter_map(|p| p.recv_peer()).collect();
                let mut to: Vec<usize> = prims().filter_map(|p| p.send_peer()).collect();
                for ranks in [&mut from, &mut to] {
                    ranks.sort_unstable();
                    ranks.dedup();
                }
                let from = from
                    .into_iter()
                    .map(|peer| (peer, links.net.get(&(channel, peer)).cloned()))
                    .collect();
                (from, to)
            })
            .collect();
        BlockPeers {
            comm: comm.clone(),
            seq,
            channels,
        }
    }

    /// What `channel`, which did not finish, waited for: data from a rank
    /// on another host whose connection brought nothing more, else from
    /// the ranks of this host it receives from (whose FIFOs the device
    /// holds), else room at the ranks it sends to.
    fn waited_for(&self, channel: usize) -> String {
        let comm = &self.comm;
        let (from, to) = &self.channels[channel];
        let silent: Vec<String> = from
            .iter()
            .filter_map(|(peer, conn)| {
                let conn = conn.as_ref()?;
                conn.recv_fifo(Protocol::Simple).is_drained().then(|| {
                    format!(
                        "{} via {} (nothing more arrived)",
                        comm.describe(*peer),
                        conn.transport()
                    )
                })
            })
            .collect();
        let here: Vec<String> = from
            .iter()
            .filter(|(_, conn)| conn.is_none())
            .map(|(peer, _)| comm.describe(*peer))
            .collect();
        if !silent.is_empty() {
            format!("waiting for data from {}", silent.join(", "))
        } else if !here.is_empty() {
            format!("waiting for data from {}", here.join(", "))
        } else {
            let to: Vec<String> = to.iter().map(|&peer| comm.describe(peer)).collect();
            format!("waiting to send to {}", to.join(", "))
        }
    }
}

/// Reports a launch's end to its communicators: a failure poisons them
/// and closes their network connections with a note saying why, so that
/// peers on other hosts stop at once; dropped without a report (the launch
/// never ran: its stream was destroyed), it poisons them too. Either way
/// their queue moves on.
struct Finish {
    comms: Vec<Arc<CommInner>>,
    net: Vec<NetLink>,
    /// `blocks[round][block]`, as the launch's rounds.
    blocks: Vec<Vec<BlockPeers>>,
    timeout: std::time::Duration,
    reported: bool,
    /// Captured in a CUDA graph: each replay reports; the host's queue
    /// does not wait for replays, and a graph never launched is no
    /// failure.
    captured: bool,
}

/// A network connection of device work, with its communicator and the
/// rank at its other end.
type NetLink = (Arc<CommInner>, usize, Arc<dyn Connection>);

impl Finish {
    /// Why the launch timed out on `comm`: the operation and, for each of
    /// its channels that did not finish, the peers it waited for (as a
    /// host wait names them); `None` when all of `comm`'s channels
    /// finished.
    fn timed_out(&self, comm: &CommInner, failure: &WorkFailure) -> Option<String> {
        let waits: Vec<String> = failure
            .unfinished
            .iter()
            .filter_map(|&(round, block, channel)| {
                let peers = self.blocks.get(round)?.get(block)?;
                std::ptr::eq(&*peers.comm, comm).then(|| {
                    format!(
                        "operation #{} on channel {channel}, {}",
                        peers.seq,
                        peers.waited_for(channel)
                    )
                })
            })
            .collect();
        (!waits.is_empty()).then(|| {
            format!(
                "rank {} of {}: device work timed out after {:?} in {}",
                comm.rank,
                comm.nranks,
                self.timeout,
                waits.join("; ")
            )
        })
    }

    fn report(&mut self, result: std::result::Result<(), WorkFailure>) {
        self.reported = true;
        let Err(failure) = result else {
            return;
        };
        for comm in &self.comms {
            let err = if comm.abort.load(Ordering::Relaxed) {
                comm.ended_error()
            } else if let Some(why) = failure
                .timed_out
                .then(|| self.timed_out(comm, &failure))
                .flatten()
            {
                Error::System(why)
            } else {
                Error::System(format!("rank {}: {}", comm.rank, failure.error))
            };
            comm.poison(&err);
        }
        // The notes say why now, whatever the user does next.
        let notes: Vec<(Arc<dyn Connection>, String)> = std::mem::take(&mut self.net)
            .into_iter()
            .filter_map(|(comm, _, conn)| {
                let why = comm.poisoned.get()?;
                Some((conn, failure_note(&comm, why)))
            })
            .collect();
        // A failure that came from a peer (its death, its failure, its
        // connection) goes in words to the peers of other processes the
        // launch exchanges with: one waiting on this rank through device
        // memory has no connection to be closed, and this process may live
        // on long after (that peer's process watch waits for its end). A
        // deadline or an abort of this rank is its own: the peers see
        // theirs.
        let words: Vec<(Arc<CommInner>, Vec<usize>, String)> = self
            .comms
            .iter()
            .filter_map(|comm| {
                let why = comm.poisoned.get()?;
                if !matches!(why, Error::Remote(_)) {
                    return None;
                }
                let peers = self.peers_elsewhere(comm);
                (!peers.is_empty()).then(|| (comm.clone(), peers, failure_note(comm, why)))
            })
            .collect();
        if notes.is_empty() && words.is_empty() {
            return;
        }
        // Telling and closing wait (boundedly) for peers and slots in
        // flight: not on the device's callback.
        let _ = std::thread::Builder::new()
            .name("rccl-close".into())
            .spawn(move || {
                for (comm, peers, note) in words {
                    let mut notices = Notices::new(&*comm);
                    peers.iter().for_each(|&peer| notices.tell_at_end(peer));
                    // Dropped: each peer gets the failure.
                    notices.fail(&note);
                }
                for (conn, note) in notes {
                    conn.close_with(&note);
                }
            });
    }

    /// The ranks of other processes that `comm`'s blocks of this launch
    /// receive from or send to.
    fn peers_elsewhere(&self, comm: &Arc<CommInner>) -> Vec<usize> {
        let mut peers: Vec<usize> = self
            .blocks
            .iter()
            .flatten()
            .filter(|block| Arc::ptr_eq(&block.comm, comm))
            .flat_map(|block| &block.channels)
            .flat_map(|(from, to)| from.iter().map(|(peer, _)| *peer).chain(to.iter().copied()))
            .filter(|&peer| comm.in_other_process(peer))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if self.captured {
            return;
        }
        for comm in &self.comms {
            if !self.reported {
                comm.poison(&Error::System(
                    "device work queued on a stream never ran: its stream was destroyed".into(),
                ));
            }
            comm.queued.finish();
        }
    }
}

/// Makes sure the FIFOs and staging buffers of each `(schedule,
/// protocol)` of `ops`, in order, exist, the links made through the
/// transport table.
/// A failure poisons the communicator and tells every peer the schedules
/// link this rank with, as host work's setup does: a peer waiting on this
/// rank's side, or running work with it, stops at once with the cause.
/// The failure reported is the abort or destroy that ended the setup, or
/// else a peer's own failure if it told this rank of one (its socket or
/// process went with it), or else what failed here.
fn connect_all(
    comm: &CommInner,
    links: &mut DeviceLinks,
    device: &'static dyn Device,
    ops: &[(&Schedule, Protocol)],
) -> Result<()> {
    ops.iter()
        .try_for_each(|&(schedule, protocol)| connect(comm, links, device, schedule, protocol))
        .map_err(|error| {
            let error = if comm.abort.load(Ordering::Relaxed) {
                comm.ended_error()
            } else {
                crate::agreement::stuck::peer_failure(comm).unwrap_or(error)
            };
            comm.poison(&error);
            let mut notices = Notices::new(comm);
            ops.iter()
                .flat_map(|(schedule, _)| schedule.channels.iter().flatten())
                .flat_map(|step| step.prims.iter())
                .flat_map(|prim| [prim.recv_peer(), prim.send_peer()])
                .flatten()
                .for_each(|peer| notices.tell_at_end(peer));
            notices.fail(&failure_note(comm, &error));
            error
        })
}

fn connect(
    comm: &CommInner,
    links: &mut DeviceLinks,
    device: &'static dyn Device,
    schedule: &Schedule,
    protocol: Protocol,
) -> Result<()> {
    let shape = comm.config.fifo_shape();
    let missing = links.missing(device, &shape, schedule, protocol)?;
    if missing.is_empty() {
        return Ok(());
    }
    let placement = DeviceFifoPlacement::for_comm(comm, device);
    for made in connect_for_device(comm, &missing, protocol, &placement)? {
        log_device_link(comm, &made);
        links.insert(made.channel, made.peer, protocol, made.link)?;
    }
    Ok(())
}

/// Logs a link of device work: device memory under `P2P`, a network
/// connection under `NET`, naming what carries it and where its slots lie.
fn log_device_link(comm: &CommInner, made: &DeviceConnection) {
    let (rank, channel, peer) = (comm.rank, made.channel, made.peer);
    match &made.link {
        DeviceLink::Direct { .. } => tracing::info!(
            target: crate::debug::INIT_P2P,
            "[{rank}] Channel {channel:02} : {rank} -> {peer} via {} (device work)",
            made.transport
        ),
        DeviceLink::Proxied(conn) => tracing::info!(
            target: crate::debug::INIT_NET,
            "[{rank}] Channel {channel:02} : {rank} -> {peer} via {} ({}) (device work, slots \
             in {})",
            conn.transport(),
            comm.peers[peer].data_addr.ip(),
            slots_in(&**conn)
        ),
    }
}

/// Whether the network connection to `peer` failed; if so, poisons `comm`
/// with the reason, which names the peer.
fn broken(comm: &CommInner, peer: usize, conn: &dyn Connection) -> bool {
    let Some(why) = conn.failure() else {
        return false;
    };
    // A peer that destroyed its communicator in order finished its work
    // first: what it sent has all arrived and stays readable, so this
    // rank's work (which may be past needing it) goes on; work that still
    // waits for more from it ends at the deadline, whose report names it.
    if conn
        .peer_note()
        .is_some_and(|note| note.ends_with(LEFT_IN_ORDER))
    {
        return false;
    }
    comm.poison(&Error::Remote(format!(
        "rank {}: device work with {} via {}: {why}",
        comm.rank,
        comm.describe(peer),
        conn.transport()
    )));
    true
}

/// Encodes every operation of `planned` as device work and launches it on
/// `streams` as one launch: round `r` runs the `r`-th operation of every
/// communicator of the group at once. Returns once enqueued.
pub(crate) fn launch(
    planned: Planned,
    streams: &[StreamRef],
    device: &'static dyn Device,
) -> Result<()> {
    let mut launches = planned.into_launches();
    // Lock communicators in address order, as host launches do.
    launches.sort_by_key(|l| Arc::as_ptr(&l.comm) as usize);
    let comms: Vec<Arc<CommInner>> = launches.iter().map(|l| l.comm.clone()).collect();
    let mut guards: Vec<_> = comms.iter().map(|comm| comm.exec.lock()).collect();
    for (launch, guard) in launches.iter().zip(guards.iter_mut()) {
        let max_channels = launch.comm.config.max_channels;
        DeviceLinks::kept(guard, max_channels, device, &launch.comm.memory)?;
    }
    // Each operation encoded for the device, in call order.
    let device_ops: Vec<Vec<DeviceOp>> = launches
        .iter_mut()
        .map(|launch| {
            let comm = launch.comm.clone();
            std::mem::take(&mut launch.device_calls)
                .into_iter()
                .map(|call| work::encode_call(&comm, call))
                .collect()
        })
        .collect();
    // Every communicator's links are made before any operation is encoded.
    // A link waits for the peer's side: with several communicators (or
    // ranks of one communicator driven by this thread) in the launch, each
    // connects on a thread of its own while any has links to make, so no
    // rank waits on a peer that waits on another of this launch's ranks.
    let jobs: Vec<_> = launches
        .iter()
        .zip(guards.iter_mut())
        .zip(&device_ops)
        .map(|((launch, guard), device_ops)| {
            let ops: Vec<_> = device_ops
                .iter()
                .map(|op| (&op.schedule, op.protocol))
                .collect();
            let links = DeviceLinks::made(guard);
            (&*launch.comm, links, ops)
        })
        .collect();
    let unlinked = |(_, links, ops): &(&CommInner, &mut DeviceLinks, Vec<_>)| {
        ops.iter()
            .any(|&(schedule, protocol)| links.lacks(schedule, protocol))
    };
    if jobs.len() > 1 && jobs.iter().any(unlinked) {
        std::thread::scope(|scope| {
            let running: Vec<_> = jobs
                .into_iter()
                .map(|(comm, links, ops)| {
                    scope.spawn(move || connect_all(comm, links, device, &ops))
                })
                .collect();
            running.into_iter().try_for_each(|job| {
                job.join().unwrap_or_else(|_| {
                    Err(Error::Internal("connecting device links panicked".into()))
                })
            })
        })?;
    } else {
        for (comm, links, ops) in jobs {
            connect_all(comm, links, device, &ops)?;
        }
    }
    let first = &streams[0];
    let mut rounds: Vec<Vec<Arc<Work>>> = Vec::new();
    let mut blocks: Vec<Vec<BlockPeers>> = Vec::new();
    let mut memory: Vec<Arc<DeviceMem>> = Vec::new();
    let mut fifo_memory: Vec<Arc<dyn FifoMemory>> = Vec::new();
    // Each network connection with the rank at its other end.
    let mut net: Vec<NetLink> = Vec::new();
    // The processes of peers on this host, watched until the launch ends.
    let mut watches: Vec<Watch> = Vec::new();
    for ((launch, guard), device_ops) in launches.iter().zip(guards.iter_mut()).zip(&device_ops) {
        let comm = &launch.comm;
        let links = DeviceLinks::made(guard);
        watches.extend(Watch::new(comm, &links.abort));
        let shape = comm.config.fifo_shape();
        let mut staged = 0;
        for (round, op) in device_ops.iter().enumerate() {
            // After the communicator's previous launch, whatever stream
            // that one was on.
            if let Some(last) = &links.last {
                op.stream.wait_event(last.as_ref()).map_err(Error::from)?;
            }
            let mut call = WorkCall {
                abort: links.abort.ptr.cast::<u32>(),
                ..op.call
            };
            if let Some(bytes) = op.staged {
                if links.staging.len() == staged {
                    let board = comm.board_bytes();
                    let buffer = links.zeroed(device, Purpose::Staging, board)?;
                    links.staging.push(buffer);
                }
                let staging = links.staging[staged].ptr;
                staged += 1;
                // SAFETY: the input is the caller's device memory of `bytes`
                // (at most the board's size), valid until its stream work
                // completes; the staging buffer is the communicator's,
                // unused by its earlier launches once the wait above is
                // passed.
                unsafe { op.stream.copy_async(staging, call.sendbuf, bytes) }
                    .map_err(Error::from)?;
                call.sendbuf = staging;
            }
            let view = OpLinks {
                links,
                proto: op.protocol.index(),
                nslots: shape.nslots as u32,
                slot_bytes: shape.slot_bytes(op.protocol) as u32,
            };
            let work = encode(&op.schedule, &call, &view).map_err(|why| {
                Error::InvalidUsage(format!("rank {}: device work: {why}", comm.rank))
            })?;
            if rounds.len() <= round {
                rounds.push(Vec::new());
                blocks.push(Vec::new());
            }
            rounds[round].push(Arc::new(work));
            blocks[round].push(BlockPeers::new(comm, call.tag[0], &op.schedule, links));
        }
        memory.extend(links.memory());
        fifo_memory.extend(links.fifo_memory());
        net.extend(
            links
                .net
                .iter()
                .map(|(&(_, peer), conn)| (comm.clone(), peer, conn.clone())),
        );
    }
    // Device work publishes and releases slots without waking the proxy.
    let polling = (!net.is_empty()).then(keep_polling);
    // A launch captured in a CUDA graph runs with the graph's launches:
    // nothing the host waits for, and no later launch is ordered after it
    // (the user's streams order the replays).
    let captured = first.capturing().map_err(Error::from)?;
    if !captured {
        for comm in &comms {
            comm.queued.issue();
        }
    }
    let timeout = comms
        .iter()
        .map(|c| c.config.timeout)
        .min()
        .expect("a launch has a communicator");
    let mut finish = Finish {
        comms: comms.clone(),
        net: net.clone(),
        blocks,
        timeout,
        reported: false,
        captured,
    };
    let watched = comms.clone();
    // A peer whose part failed says so through the bootstrap.
    let words = Mutex::new(vec![PeerWatch::default(); comms.len()]);
    tracing::debug!(
        target: crate::debug::COLL,
        "device work: {} blocks in {} rounds on {}",
        rounds.iter().map(Vec::len).sum::<usize>(),
        rounds.len(),
        device.label()
    );
    device
        .launch_work(
            streams,
            WorkLaunch {
                rounds,
                timeout,
                stop: Box::new(move || {
                    watched
                        .iter()
                        .any(|c| c.abort.load(Ordering::Relaxed) || c.poisoned.get().is_some())
                        || watched
                            .iter()
                            .zip(words.lock().iter_mut())
                            .any(|(comm, words)| {
                                words
                                    .check(comm, &[])
                                    .inspect_err(|e| comm.poison(e))
                                    .is_err()
                            })
                        || net
                            .iter()
                            .any(|(comm, peer, conn)| broken(comm, *peer, &**conn))
                }),
                // What the launch reaches lives, and its peers are watched,
                // as long as it can run.
                done: Box::new(move |result| {
                    let _reached = (&memory, &fifo_memory, &polling, &watches);
                    finish.report(result);
                }),
            },
        )
        .map_err(|e| match Error::from(e) {
            // Work the device cannot run as configured: which ranks made it.
            Error::InvalidUsage(why) => {
                let mut ranks: Vec<usize> = comms.iter().map(|c| c.rank).collect();
                ranks.sort_unstable();
                Error::InvalidUsage(format!(
                    "ranks {ranks:?} on {}: {why}",
                    crate::net::hostname()
                ))
            }
            other => other,
        })?;
    if captured {
        return Ok(());
    }
    let done = device.create_event().map_err(Error::from)?;
    first.record(done.as_ref()).map_err(Error::from)?;
    for guard in &mut guards {
        DeviceLinks::made(guard).last = Some(done.clone());
    }
    Ok(())
}
