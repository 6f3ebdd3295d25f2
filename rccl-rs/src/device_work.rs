//! The device executor: a launch on device memory whose ranks all live in
//! this process runs as device work (`rccl_device::work`), the kernels'
//! interpreter running each rank's schedule, one block per channel, over
//! FIFOs in device memory: on CUDA the fatbin's kernel, on the emulated
//! GPU the same interpreter compiled for the host. The host never touches
//! the device memory.
//!
//! Each communicator allocates the FIFOs of a (channel, peer, protocol)
//! once, through the device, and keeps them for later calls (as the host
//! path keeps its connections); the two ends of a FIFO find the same
//! memory in a process-wide table keyed by the communicator's secret. A
//! communicator's launches run one after another whatever streams they
//! were given: each waits for an event its previous launch recorded.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rccl_algorithms::{Buf, Prim, Schedule, Slice};
use rccl_device::abi::{self, FifoView};
use rccl_device::work::{encode, Work, WorkCall, WorkLinks};
use rccl_device::{Device, Event, WorkLaunch};
use rccl_transports::{Protocol, Tag};

use crate::comm::CommInner;
use crate::error::{Error, Result};
use crate::executor::Segment;
use crate::launch::Planned;
use crate::op::{OpKind, RawOp};
use crate::queue::StreamRef;
use crate::types::RedOp;

/// Whether a communicator's calls on device memory run as device work:
/// every rank is in this process (ranks as threads sharing the device), so
/// FIFOs in device memory are reachable by every rank's work.
pub(crate) fn interprets(comm: &CommInner) -> bool {
    let me = &comm.peers[comm.rank];
    comm.peers
        .iter()
        .all(|p| p.pid == me.pid && p.start == me.start && p.host_id == me.host_id)
}

/// One operation's device work, planned: its schedule and the call as the
/// device sees it (the abort word is filled in at launch).
pub(crate) struct DeviceOp {
    pub schedule: Schedule,
    pub protocol: Protocol,
    pub call: WorkCall,
    /// The call's stream.
    pub stream: StreamRef,
    /// Bytes of input to copy to a staging buffer first, the work reading
    /// it there (an in-place one-shot all-reduce, as the board stages).
    pub staged: Option<usize>,
}

fn red_code(op: RedOp) -> (i32, u64) {
    match op {
        RedOp::Sum => (abi::op::SUM, 0),
        RedOp::Prod => (abi::op::PROD, 0),
        RedOp::Max => (abi::op::MAX, 0),
        RedOp::Min => (abi::op::MIN, 0),
        RedOp::Avg => (abi::op::AVG, 0),
        RedOp::PreMulSum { scalar } => (abi::op::PRE_MUL_SUM, u64::from_le_bytes(scalar)),
    }
}

fn tag_words(tag: Tag) -> [u32; 3] {
    [tag.seq, tag.call, tag.count]
}

/// The device work of a collective; `staged`: its input is copied aside
/// first.
pub(crate) fn collective(
    op: &RawOp,
    schedule: Schedule,
    protocol: Protocol,
    tag: Tag,
    staged: bool,
) -> DeviceOp {
    let OpKind::Coll { kind, op: red, .. } = op.kind else {
        unreachable!("collective() takes collectives");
    };
    let (code, scalar) = if kind.reduces() {
        red_code(red)
    } else {
        (-1, 0)
    };
    DeviceOp {
        schedule,
        protocol,
        stream: op
            .stream
            .clone()
            .expect("a call on device memory has a stream"),
        staged: staged.then(|| op.count * op.dtype.size()),
        call: WorkCall {
            sendbuf: op.send,
            recvbuf: op.recv,
            dtype: op.dtype as i32,
            op: code,
            nranks: op.comm.nranks as u64,
            scalar,
            scalar_ptr: std::ptr::null(),
            elem_size: op.dtype.size() as u32,
            tag: tag_words(tag),
            abort: std::ptr::null(),
        },
    }
}

/// The slices of a primitive, to rebase.
fn slices_mut(p: &mut Prim) -> Vec<&mut Slice> {
    match p {
        Prim::Send { src, .. } | Prim::RecvReduceSend { src, .. } => vec![src],
        Prim::Recv { dst, .. } | Prim::RecvCopySend { dst, .. } => vec![dst],
        Prim::Copy { src, dst }
        | Prim::CopySend { src, dst, .. }
        | Prim::RecvReduceCopy { src, dst, .. }
        | Prim::RecvReduceCopySend { src, dst, .. }
        | Prim::RecvReduceCopyPartial { src, dst, .. }
        | Prim::ReduceCopy { src, dst }
        | Prim::ReduceCopyPartial { src, dst } => vec![src, dst],
    }
}

/// The device work of a batch of sends and receives. The schedule sees
/// the calls' buffers laid end to end; device work has one send and one
/// receive base, so every slice is rebased onto the lowest buffer of its
/// kind (each slice lies within one call's buffer, as the host executor
/// also assumes).
pub(crate) fn p2p(
    mut schedule: Schedule,
    protocol: Protocol,
    stream: StreamRef,
    nranks: usize,
    sends: &[Segment],
    recvs: &[Segment],
) -> DeviceOp {
    let base = |segments: &[Segment]| segments.iter().map(|s| s.base as usize).min();
    let (send_base, recv_base) = (base(sends).unwrap_or(0), base(recvs).unwrap_or(0));
    for prim in schedule
        .channels
        .iter_mut()
        .flatten()
        .flat_map(|s| s.prims.iter_mut())
    {
        for slice in slices_mut(prim) {
            let (segments, base) = match slice.buf {
                Buf::Send => (sends, send_base),
                Buf::Recv => (recvs, recv_base),
            };
            let at = segments.partition_point(|s| s.start <= slice.offset) - 1;
            let segment = segments[at];
            slice.offset = segment.base as usize + (slice.offset - segment.start) - base;
        }
    }
    DeviceOp {
        schedule,
        protocol,
        stream,
        staged: None,
        call: WorkCall {
            sendbuf: send_base as *const u8,
            recvbuf: recv_base as *mut u8,
            dtype: crate::types::DataType::Uint8 as i32,
            op: -1,
            nranks: nranks as u64,
            scalar: 0,
            scalar_ptr: std::ptr::null(),
            elem_size: 1,
            tag: [0, crate::call::P2P_CALL, 0],
            abort: std::ptr::null(),
        },
    }
}

/// Device memory, freed when the last holder lets go.
struct DeviceMem {
    device: &'static dyn Device,
    ptr: *mut u8,
}

// SAFETY: the pointer names device memory, which any thread may hand to
// the device; it is freed once, by the last holder's drop.
unsafe impl Send for DeviceMem {}
// SAFETY: as above; nothing is read or written through `&DeviceMem`.
unsafe impl Sync for DeviceMem {}

impl DeviceMem {
    fn zeroed(device: &'static dyn Device, bytes: usize) -> Result<Arc<DeviceMem>> {
        let ptr = device.alloc_zeroed(bytes).map_err(Error::from)?;
        Ok(Arc::new(DeviceMem { device, ptr }))
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: the memory came from this device; every launch that used
        // it held a reference until it finished, so none uses it now.
        // Nothing is left to do about a failure here.
        let _ = unsafe { self.device.free(self.ptr) };
    }
}

/// Which FIFO: the communicator (its secret and size), the channel, the
/// sending and receiving ranks, the protocol and the slot size.
type FifoKey = ([u8; 32], usize, usize, usize, usize, usize, usize);

/// Every FIFO of a communicator of this process, by key: the first of its
/// two ranks to need it allocates it, the other finds it here.
static FIFOS: Mutex<Option<HashMap<FifoKey, Weak<DeviceMem>>>> = Mutex::new(None);

/// The FIFO to a peer and the one from it.
type FifoPair = (Arc<DeviceMem>, Arc<DeviceMem>);

/// A communicator's device work state, kept between launches.
pub(crate) struct DeviceLinks {
    /// `(channel, peer, protocol index)` -> (FIFO to the peer, FIFO from it).
    fifos: HashMap<(usize, usize, usize), FifoPair>,
    /// Per channel, the staging buffer of one piece of any protocol.
    scratch: Vec<Option<Arc<DeviceMem>>>,
    /// Staging buffers of inputs (board-sized), the `k`-th for the `k`-th
    /// staged operation of a launch.
    staging: Vec<Arc<DeviceMem>>,
    /// The word the communicator's device work polls; set, it stops.
    abort: Arc<DeviceMem>,
    /// Recorded after the last launch: the next one waits for it.
    last: Option<Arc<dyn Event>>,
}

impl DeviceLinks {
    fn new(comm: &CommInner, device: &'static dyn Device) -> Result<DeviceLinks> {
        Ok(DeviceLinks {
            fifos: HashMap::new(),
            scratch: (0..comm.config.max_channels).map(|_| None).collect(),
            staging: Vec::new(),
            abort: DeviceMem::zeroed(device, 8)?,
            last: None,
        })
    }

    /// Makes sure the FIFOs and staging buffers `op` uses exist.
    fn connect(
        &mut self,
        comm: &CommInner,
        device: &'static dyn Device,
        op: &DeviceOp,
    ) -> Result<()> {
        let shape = comm.config.fifo_shape();
        let proto = op.protocol.index();
        let slot_bytes = shape.slot_bytes(op.protocol);
        let bytes = abi::fifo_bytes(proto as u32, shape.nslots as u32, slot_bytes as u32);
        let secret = comm.bootstrap.secret().0;
        for (channel, steps) in op.schedule.channels.iter().enumerate() {
            if steps.is_empty() {
                continue;
            }
            if self.scratch[channel].is_none() {
                let largest = shape.slot_bytes.iter().copied().max().unwrap_or(0);
                self.scratch[channel] = Some(DeviceMem::zeroed(device, largest)?);
            }
            let peers = steps
                .iter()
                .flat_map(|s| s.prims.iter())
                .flat_map(|p| [p.recv_peer(), p.send_peer()])
                .flatten();
            for peer in peers {
                if self.fifos.contains_key(&(channel, peer, proto)) {
                    continue;
                }
                let mut table = FIFOS.lock();
                let table = table.get_or_insert_with(HashMap::new);
                table.retain(|_, fifo| fifo.strong_count() > 0);
                let mut fifo = |from: usize, to: usize| -> Result<Arc<DeviceMem>> {
                    let key = (secret, comm.nranks, channel, from, to, proto, slot_bytes);
                    if let Some(fifo) = table.get(&key).and_then(Weak::upgrade) {
                        return Ok(fifo);
                    }
                    let fifo = DeviceMem::zeroed(device, bytes)?;
                    table.insert(key, Arc::downgrade(&fifo));
                    Ok(fifo)
                };
                let pair = (fifo(comm.rank, peer)?, fifo(peer, comm.rank)?);
                self.fifos.insert((channel, peer, proto), pair);
            }
        }
        Ok(())
    }

    /// Every piece of device memory the communicator's work may use.
    fn memory(&self) -> impl Iterator<Item = Arc<DeviceMem>> + '_ {
        self.fifos
            .values()
            .flat_map(|(send, recv)| [send.clone(), recv.clone()])
            .chain(self.scratch.iter().flatten().cloned())
            .chain(self.staging.iter().cloned())
            .chain([self.abort.clone()])
    }
}

/// One operation's view of its communicator's links, for the encoder.
struct OpLinks<'a> {
    links: &'a DeviceLinks,
    proto: usize,
    nslots: u32,
    slot_bytes: u32,
}

impl WorkLinks for OpLinks<'_> {
    fn fifos(&self, channel: usize, peer: usize) -> (FifoView, FifoView) {
        let (send, recv) = &self.links.fifos[&(channel, peer, self.proto)];
        let view = |mem: &DeviceMem| FifoView {
            base: mem.ptr,
            proto: self.proto as u32,
            nslots: self.nslots,
            slot_bytes: self.slot_bytes,
            pad: 0,
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

/// Reports a launch's end to its communicators: a failure poisons them;
/// dropped without a report (the launch never ran: its stream was
/// destroyed), it poisons them too. Either way their queue moves on.
struct Finish {
    comms: Vec<Arc<CommInner>>,
    reported: bool,
}

impl Finish {
    fn report(mut self, result: rccl_device::Result<()>) {
        self.reported = true;
        if let Err(err) = result {
            for comm in &self.comms {
                let err = if comm.abort.load(Ordering::Relaxed) {
                    comm.ended_error()
                } else {
                    Error::System(format!("rank {}: {err}", comm.rank))
                };
                comm.poison(&err);
            }
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
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
    let first = &streams[0];
    let mut rounds: Vec<Vec<Arc<Work>>> = Vec::new();
    let mut memory: Vec<Arc<DeviceMem>> = Vec::new();
    for (launch, guard) in launches.iter().zip(guards.iter_mut()) {
        let comm = &launch.comm;
        if guard.device_work.is_none() {
            guard.device_work = Some(DeviceLinks::new(comm, device)?);
        }
        let links = guard.device_work.as_mut().expect("made above");
        let shape = comm.config.fifo_shape();
        let mut staged = 0;
        for (round, op) in launch.device_ops.iter().enumerate() {
            // After the communicator's previous launch, whatever stream
            // that one was on.
            if let Some(last) = &links.last {
                op.stream.wait_event(last.as_ref()).map_err(Error::from)?;
            }
            links.connect(comm, device, op)?;
            let mut call = WorkCall {
                abort: links.abort.ptr.cast::<u32>(),
                ..op.call
            };
            if let Some(bytes) = op.staged {
                if links.staging.len() == staged {
                    let board = comm.board_bytes();
                    links.staging.push(DeviceMem::zeroed(device, board)?);
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
            }
            rounds[round].push(Arc::new(work));
        }
        memory.extend(links.memory());
    }
    for comm in &comms {
        comm.queued.issue();
    }
    let finish = Finish {
        comms: comms.clone(),
        reported: false,
    };
    let watched = comms.clone();
    let timeout = comms
        .iter()
        .map(|c| c.config.timeout)
        .min()
        .expect("a launch has a communicator");
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
                }),
                done: Box::new(move |result| {
                    finish.report(result);
                    drop(memory);
                }),
            },
        )
        .map_err(Error::from)?;
    let done = device.create_event().map_err(Error::from)?;
    first.record(done.as_ref()).map_err(Error::from)?;
    for guard in &mut guards {
        guard.device_work.as_mut().expect("made above").last = Some(done.clone());
    }
    Ok(())
}
