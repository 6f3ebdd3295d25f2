//! Collectives, point-to-point, groups and reduction operators.

use std::ffi::{c_int, c_uint, c_void};

use rccl::{CollCall, CollKind, DataType, Error, RedOp, Result};

use crate::abi::*;
use crate::check::{invalid, non_null, usage};
use crate::comms::{comm_of, finish_group_creations};
use crate::error::{guard, guard_op, Outcome};
use crate::registry::{self, lock, Entry, PreMul, Scalar};

fn datatype(raw: ncclDataType_t) -> Result<DataType> {
    DataType::from_raw(raw)
        .map_err(|_| invalid(format!("unknown datatype {raw} (ncclDataType_t is 0..=11)")))
}

/// The operator `raw` for `dtype` on `entry`'s communicator: a built-in one,
/// or one of its PreMulSum operators.
unsafe fn red_op(entry: &Entry, raw: ncclRedOp_t, dtype: DataType) -> Result<RedOp> {
    if (0..ncclNumOps).contains(&raw) {
        return RedOp::from_raw(raw);
    }
    let op = lock(&entry.ops).1.get(&raw).copied();
    let Some(PreMul {
        dtype: op_dtype,
        scalar,
    }) = op
    else {
        return Err(invalid(format!(
            "unknown reduction op {raw}: not a built-in op (0..=4) nor a live \
             ncclRedOpCreatePreMulSum op of this communicator"
        )));
    };
    if op_dtype != dtype {
        return Err(invalid(format!(
            "reduction op {raw} was created for {} and cannot reduce {}",
            op_dtype.name(),
            dtype.name()
        )));
    }
    let scalar = match scalar {
        Scalar::Immediate(bytes) => bytes,
        Scalar::Pointer(addr) => {
            let on_device = match rccl::device::active() {
                Some(d) => d
                    .classify(addr as *const u8)
                    .map_err(|e| invalid(format!("the PreMulSum scalar: {e}")))?
                    .is_device(),
                None => false,
            };
            if on_device {
                // Read by the device when the collective runs.
                return Ok(RedOp::PreMulSumDevice { scalar: addr });
            }
            let mut bytes = [0u8; 8];
            // SAFETY: ncclScalarDevice promises the scalar stays readable
            // while the op lives; `bytes` holds any element. Host memory:
            // the host path runs the call now.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, bytes.as_mut_ptr(), dtype.size())
            };
            bytes
        }
    };
    Ok(RedOp::PreMulSum { scalar })
}

/// A collective's shared path: handle, datatype, op, root and count checks,
/// then the engine.
#[allow(clippy::too_many_arguments)]
unsafe fn collective(
    comm: ncclComm_t,
    kind: CollKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
    root: c_int,
    stream: cudaStream_t,
) -> Outcome {
    let (entry, c) = comm_of(comm)?;
    let dtype = datatype(dtype)?;
    let op = match op {
        // SAFETY: a PreMulSum scalar's pointer was vouched for by the
        // caller of ncclRedOpCreatePreMulSum.
        Some(raw) => unsafe { red_op(&entry, raw, dtype)? },
        None => RedOp::Sum,
    };
    let n = c.count();
    let root = if kind.has_root() {
        usize::try_from(root)
            .ok()
            .filter(|&r| r < n)
            .ok_or_else(|| invalid(format!("root {root} is out of range for {n} ranks")))?
    } else {
        0
    };
    if count
        .checked_mul(n)
        .and_then(|e| e.checked_mul(dtype.size()))
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(invalid(format!(
            "count {count} of {} over {n} ranks overflows the address space",
            dtype.name()
        )));
    }
    let call = CollCall {
        kind,
        count,
        dtype,
        op,
        root,
    };
    // SAFETY: nccl.h's contract: the buffers are valid for the call's
    // lengths until it completes (device memory: until its stream ran it).
    unsafe { c.collective_raw_on_stream(call, send.cast(), recv.cast(), stream as usize)? };
    Ok(ncclSuccess)
}

unsafe fn p2p(
    comm: ncclComm_t,
    sending: bool,
    buf: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    peer: c_int,
    stream: cudaStream_t,
) -> Outcome {
    let (_, c) = comm_of(comm)?;
    let dtype = datatype(dtype)?;
    let n = c.count();
    let peer = usize::try_from(peer)
        .ok()
        .filter(|&p| p < n)
        .ok_or_else(|| invalid(format!("peer {peer} is out of range for {n} ranks")))?;
    // SAFETY: as for collectives.
    unsafe {
        if sending {
            c.send_raw_on_stream(buf.cast(), count, dtype, peer, stream as usize)?;
        } else {
            c.recv_raw_on_stream(buf.cast(), count, dtype, peer, stream as usize)?;
        }
    }
    Ok(ncclSuccess)
}

/// Checks an optional `ncclCollConfig_t` (its hints do not apply on host
/// memory).
unsafe fn coll_config(config: *const ncclCollConfig_t) -> Result<()> {
    if config.is_null() {
        return Ok(());
    }
    // SAFETY: a non-NULL config is an initialized ncclCollConfig_t.
    let magic = unsafe { (*config).magic };
    if magic != NCCL_API_MAGIC {
        return Err(invalid(format!(
            "config->magic is {magic:#x}, not NCCL_API_MAGIC: initialize it with NCCL_COLLCONFIG_INITIALIZER"
        )));
    }
    Ok(())
}

/// The magic of `NCCL_SIM_INFO_INITIALIZER`.
const SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// The API level that introduced `ncclSimInfo_t` (NCCL 2.22.0).
const SIM_INFO_FIRST_VERSION: c_uint = 22200;

/// Checks a `ncclSimInfo_t` before it is used: not NULL, large enough to
/// hold `estimatedTime`, with the initializer's magic (the check NCCL
/// makes) and an API level that has the struct (`NCCL_VERSION_CODE` of
/// 2.22 or later). Only `size` is read before it is known to fit.
unsafe fn check_sim_info(info: *const ncclSimInfo_t) -> Result<()> {
    non_null(info, "simInfo")?;
    let init = "initialize it with NCCL_SIM_INFO_INITIALIZER";
    // SAFETY: a non-NULL simInfo points at an ncclSimInfo_t of some
    // version, and `size` leads every version.
    let size = unsafe { (*info).size };
    let needed = std::mem::offset_of!(ncclSimInfo_t, estimatedTime) + std::mem::size_of::<f32>();
    if size < needed {
        return Err(invalid(format!(
            "simInfo->size is {size}, too small to hold estimatedTime ({needed} bytes): {init}"
        )));
    }
    // SAFETY: `size` says the struct extends past estimatedTime.
    let (magic, version) = unsafe { ((*info).magic, (*info).version) };
    if magic != SIM_INFO_MAGIC {
        return Err(invalid(format!(
            "simInfo->magic is {magic:#x}, not {SIM_INFO_MAGIC:#x}: {init}"
        )));
    }
    if version < SIM_INFO_FIRST_VERSION {
        return Err(invalid(format!(
            "simInfo->version is {version}, older than ncclSimInfo_t (NCCL 2.22.0, \
             {SIM_INFO_FIRST_VERSION}): {init}"
        )));
    }
    Ok(())
}

nccl_api! {
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclAllReduce", comm, || unsafe {
            collective(comm, CollKind::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, stream)
        })
    }

    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclBroadcast", comm, || unsafe {
            collective(comm, CollKind::Broadcast, sendbuff, recvbuff, count, datatype, None, root, stream)
        })
    }

    /// In-place broadcast.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that `buff` holds `count` elements until
        // the call completes.
        guard_op("ncclBcast", comm, || unsafe {
            collective(comm, CollKind::Broadcast, buff, buff, count, datatype, None, root, stream)
        })
    }

    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclReduce", comm, || unsafe {
            collective(comm, CollKind::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, stream)
        })
    }

    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize,
        datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclAllGather", comm, || unsafe {
            collective(comm, CollKind::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, stream)
        })
    }

    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize,
        datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclReduceScatter", comm, || unsafe {
            collective(comm, CollKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, stream)
        })
    }

    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclAlltoAll", comm, || unsafe {
            collective(comm, CollKind::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, stream)
        })
    }

    fn ncclGather / pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclGather", comm, || unsafe {
            collective(comm, CollKind::Gather, sendbuff, recvbuff, count, datatype, None, root, stream)
        })
    }

    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes.
        guard_op("ncclScatter", comm, || unsafe {
            collective(comm, CollKind::Scatter, sendbuff, recvbuff, count, datatype, None, root, stream)
        })
    }

    fn ncclAllReduceConfig / pncclAllReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclAllReduceConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, stream)
        })
    }

    fn ncclBroadcastConfig / pncclBroadcastConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclBroadcastConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::Broadcast, sendbuff, recvbuff, count, datatype, None, root, stream)
        })
    }

    fn ncclReduceConfig / pncclReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclReduceConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, stream)
        })
    }

    fn ncclAllGatherConfig / pncclAllGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize,
        datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclAllGatherConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, stream)
        })
    }

    fn ncclReduceScatterConfig / pncclReduceScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize,
        datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclReduceScatterConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, stream)
        })
    }

    fn ncclAlltoAllConfig / pncclAlltoAllConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclAlltoAllConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, stream)
        })
    }

    fn ncclGatherConfig / pncclGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclGatherConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::Gather, sendbuff, recvbuff, count, datatype, None, root, stream)
        })
    }

    fn ncclScatterConfig / pncclScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that the buffers hold their call's
        // elements until it completes, and for `config` as NULL or an
        // initialized ncclCollConfig_t.
        guard_op("ncclScatterConfig", comm, || unsafe {
            coll_config(config)?;
            collective(comm, CollKind::Scatter, sendbuff, recvbuff, count, datatype, None, root, stream)
        })
    }

    fn ncclSend / pncclSend(
        sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that `sendbuff` holds `count` elements
        // until the call completes.
        guard_op("ncclSend", comm, || unsafe {
            p2p(comm, true, sendbuff as *mut c_void, count, datatype, peer, stream)
        })
    }

    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int,
        comm: ncclComm_t, stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches that `recvbuff` holds `count` elements
        // until the call completes.
        guard_op("ncclRecv", comm, || unsafe { p2p(comm, false, recvbuff, count, datatype, peer, stream) })
    }

    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        guard("ncclGroupStart", std::ptr::null_mut(), || {
            rccl::group_start();
            Ok(ncclSuccess)
        })
    }

    /// Launches everything queued since the outermost ncclGroupStart and
    /// returns when it has completed (calls on device memory: once
    /// enqueued on their streams); waits for communicators created in the
    /// group.
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        guard("ncclGroupEnd", std::ptr::null_mut(), || {
            let outermost = rccl::group_depth() == 1;
            let launched = rccl::group_end();
            let created = if outermost { finish_group_creations() } else { Ok(ncclSuccess) };
            launched?;
            created
        })
    }

    /// Closes the group as ncclGroupEnd does but runs none of what it
    /// queued, and sets `simInfo->estimatedTime` to the simulator's
    /// estimate of the group in microseconds: the engine's plan of every
    /// collective, and of this rank's side of its sends and receives
    /// (peers taken to post the matching calls), replayed on the
    /// communicator's modeled cluster (`RCCL_SIM_CLUSTER`, else the local
    /// preset), summed per communicator, the largest over communicators
    /// (`crate::simulate` describes the model). An inner level of nested
    /// groups only closes that level and leaves `estimatedTime` as it was.
    /// A NULL or uninitialized `simInfo`, or a bad `RCCL_SIM_CLUSTER`,
    /// fails, with the group closed and nothing run.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        guard("ncclGroupSimulateEnd", std::ptr::null_mut(), || {
            let depth = rccl::group_depth();
            if depth == 0 {
                return Err(usage("ncclGroupSimulateEnd without ncclGroupStart"));
            }
            // A bad simInfo fails the group, which still closes.
            // SAFETY: the caller vouches for `simInfo` as NULL or an
            // initialized ncclSimInfo_t.
            let checked = unsafe { check_sim_info(simInfo) };
            if let Err(err) = &checked {
                rccl::group_fail(err);
            }
            let planned = rccl::group_simulate_end();
            let created = if depth == 1 { finish_group_creations() } else { Ok(ncclSuccess) };
            checked?;
            let planned = planned?;
            let code = created?;
            if let Some(comms) = planned {
                let us = crate::simulate::group_us(&comms)?;
                // SAFETY: check_sim_info found simInfo non-NULL and at
                // least large enough to hold estimatedTime.
                unsafe { (*simInfo).estimatedTime = us as f32 };
            }
            Ok(code)
        })
    }

    /// A PreMulSum operator of `comm` for `datatype`. `ncclScalarDevice`
    /// takes a pointer: device memory is read by the device when each
    /// collective using the op runs, host memory at each call;
    /// `ncclScalarHostImmediate` reads the value now.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut ncclRedOp_t, scalar: *mut c_void, datatype_: ncclDataType_t,
        residence: ncclScalarResidence_t, comm: ncclComm_t,
    ) -> ncclResult_t {
        guard("ncclRedOpCreatePreMulSum", comm, || {
            non_null(op, "op")?;
            non_null(scalar, "scalar")?;
            let entry = registry::lookup(comm)?;
            let dtype = datatype(datatype_)?;
            let scalar = match residence {
                ncclScalarHostImmediate => {
                    let mut bytes = [0u8; 8];
                    // SAFETY: the caller vouches that `scalar` (checked
                    // non-NULL) holds one element of `datatype`, at most 8
                    // bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(scalar as *const u8, bytes.as_mut_ptr(), dtype.size())
                    };
                    Scalar::Immediate(bytes)
                }
                ncclScalarDevice => Scalar::Pointer(scalar as usize),
                other => return Err(invalid(format!("unknown ncclScalarResidence_t {other}"))),
            };
            let mut ops = lock(&entry.ops);
            let id = ops.0;
            if id == c_int::MAX {
                return Err(Error::Internal("reduction op ids are exhausted".into()));
            }
            ops.0 += 1;
            ops.1.insert(id, PreMul { dtype, scalar });
            // SAFETY: the caller vouches that `op` (checked non-NULL) is
            // writable.
            unsafe { *op = id };
            Ok(ncclSuccess)
        })
    }

    fn ncclRedOpDestroy / pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
        guard("ncclRedOpDestroy", comm, || {
            let entry = registry::lookup(comm)?;
            if (0..ncclNumOps).contains(&op) {
                return Err(invalid(format!("op {op} is a built-in operator and cannot be destroyed")));
            }
            if lock(&entry.ops).1.remove(&op).is_none() {
                return Err(invalid(format!("op {op} is not a live PreMulSum operator of this communicator")));
            }
            Ok(ncclSuccess)
        })
    }
}
