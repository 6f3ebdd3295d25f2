//! Each operation's device work as planned: its schedule and the call as
//! the device sees it (`rccl_device::work`). The kernels' interpreter runs
//! each rank's schedule, one block per channel, over FIFOs the device
//! reaches: on CUDA the fatbin's kernel, on the emulated GPU the same
//! interpreter compiled for the host. The host never touches the device
//! memory.

use std::ptr::null;

use rccl_algorithms::{Buf, Schedule};
use rccl_device::abi;
use rccl_device::work::WorkCall;
use rccl_transports::{Protocol, Tag};

use crate::comm::CommInner;
use crate::plan::{DeviceCall, Segment};
use crate::queue::StreamRef;
use crate::types::RedOp;
use crate::types::{OpArgs, OpKind};

/// `call` encoded for the device, on `comm`.
pub(crate) fn encode_call(comm: &CommInner, call: DeviceCall) -> DeviceOp {
    match call {
        DeviceCall::Collective {
            args,
            stream,
            schedule,
            protocol: chosen,
            tag,
            staged,
        } => {
            let protocol = protocol(comm, chosen);
            collective(args, stream, comm.nranks, schedule, protocol, tag, staged)
        }
        DeviceCall::P2p {
            schedule,
            protocol: chosen,
            stream,
            sends,
            recvs,
        } => p2p(
            schedule,
            protocol(comm, chosen),
            stream,
            comm.nranks,
            &sends,
            &recvs,
        ),
    }
}

/// The protocol of a communicator's device work, given the tuner's: Simple
/// when it crosses hosts, since a network connection's FIFOs carry Simple
/// pieces (as NCCL's Simple protocol carries large calls between hosts).
fn protocol(comm: &CommInner, chosen: Protocol) -> Protocol {
    if comm.topology.nhosts() > 1 {
        Protocol::Simple
    } else {
        chosen
    }
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

/// The interpreter's op code, its scalar, and where it reads the scalar
/// when the collective runs instead (a device scalar; else null).
fn red_code(op: RedOp) -> (i32, u64, *const std::ffi::c_void) {
    match op {
        RedOp::Sum => (abi::op::SUM, 0, null()),
        RedOp::Prod => (abi::op::PROD, 0, null()),
        RedOp::Max => (abi::op::MAX, 0, null()),
        RedOp::Min => (abi::op::MIN, 0, null()),
        RedOp::Avg => (abi::op::AVG, 0, null()),
        RedOp::PreMulSum { scalar } => (abi::op::PRE_MUL_SUM, u64::from_le_bytes(scalar), null()),
        RedOp::PreMulSumDevice { scalar } => (abi::op::PRE_MUL_SUM, 0, scalar as *const _),
    }
}

fn tag_words(tag: Tag) -> [u32; 3] {
    [tag.seq, tag.call, tag.count]
}

/// The device work of a collective; `staged`: its input is copied aside
/// first.
fn collective(
    op: OpArgs,
    stream: StreamRef,
    nranks: usize,
    schedule: Schedule,
    protocol: Protocol,
    tag: Tag,
    staged: bool,
) -> DeviceOp {
    let OpKind::Coll { kind, op: red, .. } = op.kind else {
        unreachable!("collective() takes collectives");
    };
    let (code, scalar, scalar_ptr) = if kind.reduces() {
        red_code(red)
    } else {
        (-1, 0, null())
    };
    DeviceOp {
        schedule,
        protocol,
        stream,
        staged: staged.then(|| op.count * op.dtype.size()),
        call: WorkCall {
            sendbuf: op.send,
            recvbuf: op.recv,
            dtype: op.dtype as i32,
            op: code,
            nranks: nranks as u64,
            scalar,
            scalar_ptr,
            elem_size: op.dtype.size() as u32,
            tag: tag_words(tag),
            abort: null(),
        },
    }
}

/// The device work of a batch of sends and receives. The schedule sees
/// the calls' buffers laid end to end; device work has one send and one
/// receive base, so every slice is rebased onto the lowest buffer of its
/// kind (each slice lies within one call's buffer, as the host executor
/// also assumes).
fn p2p(
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
        let (src, dst) = prim.slices_mut();
        for slice in src.into_iter().chain(dst) {
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
            scalar_ptr: null(),
            elem_size: 1,
            tag: [0, crate::agreement::call::P2P_CALL, 0],
            abort: null(),
        },
    }
}
