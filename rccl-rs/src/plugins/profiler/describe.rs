//! The event translation: a collective or point-to-point call as every
//! version of the interface describes it, NCCL's names and codes of its
//! parts, and each version's layout of its descriptor.

use std::ffi::{c_int, c_void, CStr, CString};

use parking_lot::Mutex;
use rccl_algorithms::CollKind;
use rccl_transports::Protocol;

use super::abi::{CollV1, CollV2, CollV3, CollV4, Handle, P2pV1, P2pV2, P2pV4, COLL, P2P};
use super::Session;
use crate::types::DataType;

/// `ncclFuncToString` of a collective kind, and its `ncclFunc_t`.
pub(super) fn func(kind: CollKind) -> (&'static CStr, u8) {
    match kind {
        CollKind::Broadcast => (c"Broadcast", 0),
        CollKind::Reduce => (c"Reduce", 1),
        CollKind::AllGather => (c"AllGather", 2),
        CollKind::ReduceScatter => (c"ReduceScatter", 3),
        CollKind::AllReduce => (c"AllReduce", 4),
        CollKind::AllToAll => (c"AlltoAll", 8),
        CollKind::Scatter => (c"Scatter", 9),
        CollKind::Gather => (c"Gather", 10),
    }
}

/// `ncclFuncToString` of a send or a receive, and its `ncclFunc_t`.
pub(super) fn p2p_func(send: bool) -> (&'static CStr, u8) {
    if send {
        (c"Send", 6)
    } else {
        (c"Recv", 7)
    }
}

/// `ncclDatatypeToString` of a datatype; its code is its discriminant.
pub(super) fn datatype(dtype: DataType) -> &'static CStr {
    match dtype {
        DataType::Int8 => c"ncclInt8",
        DataType::Uint8 => c"ncclUint8",
        DataType::Int32 => c"ncclInt32",
        DataType::Uint32 => c"ncclUint32",
        DataType::Int64 => c"ncclInt64",
        DataType::Uint64 => c"ncclUint64",
        DataType::Float16 => c"ncclFloat16",
        DataType::Float32 => c"ncclFloat32",
        DataType::Float64 => c"ncclFloat64",
        DataType::Bfloat16 => c"ncclBfloat16",
        DataType::Float8e4m3 => c"ncclFloat8e4m3",
        DataType::Float8e5m2 => c"ncclFloat8e5m2",
    }
}

/// The name of an algorithm as the plug-in sees it (NCCL's for ring and
/// tree, ours upper-cased for the others), and NCCL's code (`NCCL_ALGO_*`;
/// 255, NCCL's undefined, for the algorithms NCCL does not have).
fn algorithm(name: &'static str) -> (&'static CStr, u8) {
    match name {
        "tree" => (c"TREE", 0),
        "ring" => (c"RING", 1),
        other => {
            // Each of the few algorithms' names is made once.
            static NAMES: Mutex<Vec<(&'static str, &'static CStr)>> = Mutex::new(Vec::new());
            let mut names = NAMES.lock();
            let made = match names.iter().find(|(n, _)| *n == other) {
                Some(&(_, made)) => made,
                None => {
                    let upper = CString::new(other.to_ascii_uppercase()).unwrap_or_default();
                    let made: &'static CStr = Box::leak(upper.into_boxed_c_str());
                    names.push((other, made));
                    made
                }
            };
            (made, 255)
        }
    }
}

/// `ncclProtoToString` of a protocol and its code (`NCCL_PROTO_*`).
fn protocol(protocol: Protocol) -> (&'static CStr, u8) {
    match protocol {
        Protocol::Ll => (c"LL", 0),
        Protocol::Ll128 => (c"LL128", 1),
        Protocol::Simple => (c"SIMPLE", 2),
    }
}

/// A collective call as every version describes it.
pub(super) struct Coll {
    pub seq_number: u64,
    pub kind: CollKind,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub dtype: DataType,
    pub nchannels: u8,
    pub algorithm: &'static str,
    pub protocol: Protocol,
}

/// A send or receive as every version describes it.
pub(super) struct P2p {
    pub send: bool,
    pub buff: *mut c_void,
    pub dtype: DataType,
    pub count: usize,
    pub peer: c_int,
    pub nchannels: u8,
}

/// A call whose event starts: its description, and the parents NCCL
/// gives it (the group event; from v5 on, its API event).
pub(super) struct Task {
    pub call: Call,
    pub group: Handle,
    pub api: Handle,
}

/// The call an event describes.
pub(super) enum Call {
    Coll(Coll),
    P2p(P2p),
}

impl Session {
    /// Starts the event of `task` in its version's layout; its handle, or
    /// null.
    pub(super) fn start_task(&self, task: &Task, comm_hash: u64) -> Handle {
        let version = self.profiler.library.version;
        // Before v5 the group event is the parent; from v5 on the call's
        // API event is, and the group event its `parentGroup`.
        let parent = if version >= 5 { task.api } else { task.group };
        let no_name = std::ptr::null();
        match &task.call {
            Call::Coll(c) => {
                let (func_name, func_code) = func(c.kind);
                let (algo_name, algo_code) = algorithm(c.algorithm);
                let (proto_name, proto_code) = protocol(c.protocol);
                let dt = datatype(c.dtype).as_ptr();
                match version {
                    1 => self.start_reported(
                        COLL,
                        parent,
                        CollV1 {
                            name: no_name,
                            comm_hash,
                            seq_number: c.seq_number,
                            func: func_code,
                            send_buff: c.send,
                            recv_buff: c.recv,
                            count: c.count,
                            root: c.root,
                            datatype: c.dtype as u8,
                            op: 0,
                            traffic_bytes: 0,
                            n_max_channels: c.nchannels,
                            n_warps: 0,
                            algo: algo_code,
                            proto: proto_code,
                            is_collnet: 0,
                            is_nvls: 0,
                        },
                    ),
                    2 => self.start_reported(
                        COLL,
                        parent,
                        CollV2 {
                            name: no_name,
                            comm_hash,
                            seq_number: c.seq_number,
                            func: func_name.as_ptr(),
                            send_buff: c.send,
                            recv_buff: c.recv,
                            count: c.count,
                            root: c.root,
                            datatype: dt,
                            traffic_bytes: 0,
                            n_max_channels: c.nchannels,
                            n_warps: 0,
                            algo: algo_name.as_ptr(),
                            proto: proto_name.as_ptr(),
                        },
                    ),
                    3 => self.start_reported(
                        COLL,
                        parent,
                        CollV3 {
                            name: no_name,
                            comm_hash,
                            seq_number: c.seq_number,
                            func: func_name.as_ptr(),
                            send_buff: c.send,
                            recv_buff: c.recv,
                            count: c.count,
                            root: c.root,
                            datatype: dt,
                            n_max_channels: c.nchannels,
                            n_warps: 0,
                            algo: algo_name.as_ptr(),
                            proto: proto_name.as_ptr(),
                        },
                    ),
                    _ => self.start_reported(
                        COLL,
                        parent,
                        CollV4 {
                            seq_number: c.seq_number,
                            func: func_name.as_ptr(),
                            send_buff: c.send,
                            recv_buff: c.recv,
                            count: c.count,
                            root: c.root,
                            datatype: dt,
                            n_channels: c.nchannels,
                            n_warps: 0,
                            algo: algo_name.as_ptr(),
                            proto: proto_name.as_ptr(),
                            parent_group: task.group,
                        },
                    ),
                }
            }
            Call::P2p(p) => {
                let (func_name, func_code) = p2p_func(p.send);
                let dt = datatype(p.dtype).as_ptr();
                match version {
                    1 => self.start_reported(
                        P2P,
                        parent,
                        P2pV1 {
                            name: no_name,
                            comm_hash,
                            func: func_code,
                            buff: p.buff,
                            datatype: p.dtype as u8,
                            count: p.count,
                            peer: p.peer,
                        },
                    ),
                    2 | 3 => self.start_reported(
                        P2P,
                        parent,
                        P2pV2 {
                            name: no_name,
                            comm_hash,
                            func: func_name.as_ptr(),
                            buff: p.buff,
                            datatype: dt,
                            count: p.count,
                            peer: p.peer,
                        },
                    ),
                    _ => self.start_reported(
                        P2P,
                        parent,
                        P2pV4 {
                            func: func_name.as_ptr(),
                            buff: p.buff,
                            datatype: dt,
                            count: p.count,
                            peer: p.peer,
                            n_channels: p.nchannels,
                            parent_group: task.group,
                        },
                    ),
                }
            }
        }
    }
}
