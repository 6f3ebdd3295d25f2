//! The event translation: a collective or point-to-point call as every
//! version of the interface describes it, NCCL's names and codes of its
//! parts, and each version's layout of its descriptor.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use parking_lot::Mutex;
use rccl_algorithms::CollKind;
use rccl_transports::Protocol;

use super::abi::{
    CollBeforeV4, CollV1, CollV2, CollV3, CollV4, Handle, Named, P2pBeforeV4, P2pV4, COLL, P2P,
};
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

impl Coll {
    /// The call as v1 to v3 describe it, in codes or names (`N`).
    fn before_v4<N: Named>(&self, comm_hash: u64) -> CollBeforeV4<N> {
        let (func_name, func_code) = func(self.kind);
        let (algo_name, algo_code) = algorithm(self.algorithm);
        let (proto_name, proto_code) = protocol(self.protocol);
        CollBeforeV4 {
            comm_hash,
            seq_number: self.seq_number,
            func: N::of(func_name, func_code),
            send_buff: self.send,
            recv_buff: self.recv,
            count: self.count,
            root: self.root,
            datatype: N::of(datatype(self.dtype), self.dtype as u8),
            n_max_channels: self.nchannels,
            algo: N::of(algo_name, algo_code),
            proto: N::of(proto_name, proto_code),
        }
    }

    /// The call as v4 to v6 describe it, inside group event `group`.
    fn since_v4(&self, group: Handle) -> CollV4 {
        CollV4 {
            seq_number: self.seq_number,
            func: func(self.kind).0.as_ptr(),
            send_buff: self.send,
            recv_buff: self.recv,
            count: self.count,
            root: self.root,
            datatype: datatype(self.dtype).as_ptr(),
            n_channels: self.nchannels,
            n_warps: 0,
            algo: algorithm(self.algorithm).0.as_ptr(),
            proto: protocol(self.protocol).0.as_ptr(),
            parent_group: group,
        }
    }
}

impl P2p {
    /// The call as v1 to v3 describe it, in codes or names (`N`).
    fn before_v4<N: Named>(&self, comm_hash: u64) -> P2pBeforeV4<N> {
        let (func_name, func_code) = p2p_func(self.send);
        P2pBeforeV4 {
            name: std::ptr::null(),
            comm_hash,
            func: N::of(func_name, func_code),
            buff: self.buff,
            datatype: N::of(datatype(self.dtype), self.dtype as u8),
            count: self.count,
            peer: self.peer,
        }
    }

    /// The call as v4 to v6 describe it, inside group event `group`.
    fn since_v4(&self, group: Handle) -> P2pV4 {
        P2pV4 {
            func: p2p_func(self.send).0.as_ptr(),
            buff: self.buff,
            datatype: datatype(self.dtype).as_ptr(),
            count: self.count,
            peer: self.peer,
            n_channels: self.nchannels,
            parent_group: group,
        }
    }
}

impl Session {
    /// Starts the event of `task` in its version's layout; its handle, or
    /// null.
    pub(super) fn start_task(&self, task: &Task, comm_hash: u64) -> Handle {
        let version = self.profiler.library.version;
        // Before v5 the group event is the parent; from v5 on the call's
        // API event is, and the group event its `parentGroup`.
        let parent = if version >= 5 { task.api } else { task.group };
        match (&task.call, version) {
            (Call::Coll(c), 1) => {
                self.start_reported(COLL, parent, CollV1::from(c.before_v4(comm_hash)))
            }
            (Call::Coll(c), 2) => {
                self.start_reported(COLL, parent, CollV2::from(c.before_v4(comm_hash)))
            }
            (Call::Coll(c), 3) => {
                self.start_reported(COLL, parent, CollV3::from(c.before_v4(comm_hash)))
            }
            (Call::Coll(c), _) => self.start_reported(COLL, parent, c.since_v4(task.group)),
            (Call::P2p(p), 1) => self.start_reported(P2P, parent, p.before_v4::<u8>(comm_hash)),
            (Call::P2p(p), 2 | 3) => {
                let names = p.before_v4::<*const c_char>(comm_hash);
                self.start_reported(P2P, parent, names)
            }
            (Call::P2p(p), _) => self.start_reported(P2P, parent, p.since_v4(task.group)),
        }
    }
}
