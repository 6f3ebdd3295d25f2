//! The profiler plug-in interface's data, as NCCL's `ncclProfiler_v1_t`
//! .. `_v6_t` lay it out: event bits, states, the table and each
//! version's event descriptors.

use std::ffi::{c_char, c_int, c_void, CStr};

pub(super) use crate::plugins::{FinalizeFn, NcclResult, PluginContext};
pub(super) type Handle = *mut c_void;

/// `ncclProfileGroup` .. `ncclProfileNetPlugin`: the event type bits.
pub(super) const GROUP: u64 = 1 << 0;
pub(super) const COLL: u64 = 1 << 1;
pub(super) const P2P: u64 = 1 << 2;
pub(super) const PROXY_OP: u64 = 1 << 3;
pub(super) const PROXY_STEP: u64 = 1 << 4;
const KERNEL_CH: u64 = 1 << 6;
pub(super) const NET_PLUGIN: u64 = 1 << 7;
/// `ncclProfileGroupApi` .. `ncclProfileKernelLaunch` (v5 on).
pub(super) const GROUP_API: u64 = 1 << 8;
pub(super) const COLL_API: u64 = 1 << 9;
pub(super) const P2P_API: u64 = 1 << 10;
const KERNEL_LAUNCH: u64 = 1 << 11;
/// `ncclProfileCeColl` .. `ncclProfileCeBatch` (v6).
const CE: u64 = 0b111 << 12;
/// The events below a collective or point-to-point call.
pub(super) const BELOW_TASK: u64 = PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN;
/// What starts a collective API event: it or anything below it.
pub(super) const COLL_API_MASK: u64 = COLL_API | COLL | BELOW_TASK | CE;
/// What starts a point-to-point API event.
pub(super) const P2P_API_MASK: u64 = P2P_API | P2P | BELOW_TASK;
/// What starts a group API event: any event of a call.
pub(super) const GROUP_API_MASK: u64 =
    GROUP_API | COLL_API_MASK | P2P_API_MASK | KERNEL_LAUNCH | GROUP;
/// The events the network proxy reports.
pub(super) const PROXY_EVENTS: u64 = PROXY_OP | PROXY_STEP | NET_PLUGIN;

/// `ncclProfilerProxyOpSendPosted`, `..RecvPosted`, `..SendDone` and
/// `..RecvDone`: a proxy operation's states before v4.
pub(super) const PROXY_OP_SEND_POSTED: c_int = 0;
pub(super) const PROXY_OP_RECV_POSTED: c_int = 4;
pub(super) const PROXY_OP_SEND_DONE: c_int = 3;
pub(super) const PROXY_OP_RECV_DONE: c_int = 7;
/// `ncclProfilerProxyOpInProgress_v4`: a proxy operation's state from v4 on.
pub(super) const PROXY_OP_IN_PROGRESS: c_int = 19;
/// `ncclProfilerProxyStepSendWait` and `..RecvGPUWait`.
pub(super) const PROXY_STEP_SEND_WAIT: c_int = 9;
pub(super) const PROXY_STEP_RECV_GPU_WAIT: c_int = 12;
/// `ncclProfilerGroupStartApiStop` and `ncclProfilerGroupEndApiStart`: the
/// group API event's states when the group's calls are in and when its
/// end begins.
pub(super) const GROUP_START_API_STOP: c_int = 23;
pub(super) const GROUP_END_API_START: c_int = 24;

pub(super) type StartFn =
    unsafe extern "C" fn(PluginContext, *mut Handle, *mut c_void) -> NcclResult;
pub(super) type StopFn = unsafe extern "C" fn(Handle) -> NcclResult;
pub(super) type RecordFn = unsafe extern "C" fn(Handle, c_int, *mut c_void) -> NcclResult;
/// `init` of v1 to v3.
pub(super) type ProfilerInitV1 = unsafe extern "C" fn(*mut PluginContext, *mut c_int) -> NcclResult;
/// `init` of v4: the mask, then the communicator's name and hash.
pub(super) type ProfilerInitV4 = unsafe extern "C" fn(
    *mut PluginContext,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    rccl_env::Logger,
) -> NcclResult;
/// `init` of v5 and v6: the hash, then the mask and the name.
pub(super) type ProfilerInitV5 = unsafe extern "C" fn(
    *mut PluginContext,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    rccl_env::Logger,
) -> NcclResult;

/// `ncclProfiler_v1_t` .. `_v6_t`: every version has this shape; `init`
/// and the descriptor `startEvent` takes differ by version.
#[repr(C)]
pub(super) struct ProfilerTable {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn()>,
    pub start_event: Option<StartFn>,
    pub stop_event: Option<StopFn>,
    pub record_event_state: Option<RecordFn>,
    pub finalize: Option<FinalizeFn>,
}

/// An event descriptor, `ncclProfilerEventDescr_vN_t`: `K` is the type's
/// width (a byte before v5, 64 bits from v5 on) and `T` the member of the
/// union this event fills.
#[repr(C)]
pub(super) struct Descr<K, T: Copy> {
    pub kind: K,
    pub parent_obj: Handle,
    pub rank: c_int,
    pub data: Payload<T>,
}

/// The union of a descriptor: the member an event fills, and room for the
/// largest member of any version's union, so a plug-in that copies the
/// whole descriptor reads memory of ours.
#[repr(C)]
pub(super) union Payload<T: Copy> {
    pub member: T,
    room: [u64; ROOM_WORDS],
}

/// The size of the largest member of any version's union (v2's `coll`),
/// in 64-bit words.
const ROOM_WORDS: usize = std::mem::size_of::<CollV2>().div_ceil(8);

// The room holds every member this engine fills.
const _: () = {
    let room = ROOM_WORDS * 8;
    assert!(std::mem::size_of::<CollV1>() <= room);
    assert!(std::mem::size_of::<CollV3>() <= room);
    assert!(std::mem::size_of::<CollV4>() <= room);
    assert!(std::mem::size_of::<CollApiV5>() <= room);
    assert!(std::mem::size_of::<ProxyOpDescr>() <= room);
};

impl<T: Copy> Payload<T> {
    pub fn new(member: T) -> Self {
        let mut payload = Payload {
            room: [0; ROOM_WORDS],
        };
        payload.member = member;
        payload
    }
}

/// The group event's member: none.
#[derive(Clone, Copy)]
pub(super) struct NoData;

/// A part of a call that v1 gives as NCCL's code and v2 and v3 by name.
pub(super) trait Named: Copy {
    fn of(name: &'static CStr, code: u8) -> Self;
}

impl Named for u8 {
    fn of(_: &'static CStr, code: u8) -> u8 {
        code
    }
}

impl Named for *const c_char {
    fn of(name: &'static CStr, _: u8) -> *const c_char {
        name.as_ptr()
    }
}

/// What v1 to v3 tell of a collective, its function, datatype, algorithm
/// and protocol as `N` ([`Named`]); each version's `coll` is made from it.
pub(super) struct CollBeforeV4<N> {
    pub comm_hash: u64,
    pub seq_number: u64,
    pub func: N,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: N,
    pub n_max_channels: u8,
    pub algo: N,
    pub proto: N,
}

/// Declares `coll` of a version before v4: the fields all of them share,
/// `N` for the function, datatype, algorithm and protocol, and the
/// version's own fields after the datatype and at the end (zero here).
macro_rules! coll_before_v4 {
    ($(#[$doc:meta])* $coll:ident<$n:ty> {
        $($middle:ident: $middle_ty:ty,)*
    } {
        $($tail:ident: $tail_ty:ty,)*
    }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub(super) struct $coll {
            pub name: *const c_char,
            pub comm_hash: u64,
            pub seq_number: u64,
            pub func: $n,
            pub send_buff: *const c_void,
            pub recv_buff: *mut c_void,
            pub count: usize,
            pub root: c_int,
            pub datatype: $n,
            $(pub $middle: $middle_ty,)*
            pub n_max_channels: u8,
            pub n_warps: u8,
            pub algo: $n,
            pub proto: $n,
            $(pub $tail: $tail_ty,)*
        }

        impl From<CollBeforeV4<$n>> for $coll {
            fn from(c: CollBeforeV4<$n>) -> $coll {
                $coll {
                    name: std::ptr::null(),
                    comm_hash: c.comm_hash,
                    seq_number: c.seq_number,
                    func: c.func,
                    send_buff: c.send_buff,
                    recv_buff: c.recv_buff,
                    count: c.count,
                    root: c.root,
                    datatype: c.datatype,
                    $($middle: 0,)*
                    n_max_channels: c.n_max_channels,
                    n_warps: 0,
                    algo: c.algo,
                    proto: c.proto,
                    $($tail: 0,)*
                }
            }
        }
    };
}

coll_before_v4!(
    /// `coll` of `ncclProfilerEventDescr_v1_t`: codes, with the reduction
    /// and traffic, and whether CollNet or NVLS runs it.
    CollV1<u8> {
        op: u32,
        traffic_bytes: usize,
    } {
        is_collnet: c_int,
        is_nvls: c_int,
    }
);
coll_before_v4!(
    /// `coll` of v2: names, with the traffic.
    CollV2<*const c_char> {
        traffic_bytes: usize,
    } {}
);
coll_before_v4!(
    /// `coll` of v3: names.
    CollV3<*const c_char> {} {}
);

/// `p2p` of v1 (`N` codes) and of v2 and v3 (names).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pBeforeV4<N> {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub func: N,
    pub buff: *mut c_void,
    pub datatype: N,
    pub count: usize,
    pub peer: c_int,
}

/// `coll` of v4 to v6 (`parent_group` from v5 on).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollV4 {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: Handle,
}

/// `p2p` of v4 to v6 (`parent_group` from v5 on).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pV4 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub parent_group: Handle,
}

/// `groupApi` of v5 and v6.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct GroupApiV5 {
    pub graph_captured: bool,
    pub group_depth: c_int,
}

/// `collApi` of v5 and v6.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollApiV5 {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

/// `p2pApi` of v5 and v6.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pApiV5 {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

/// `proxyOp` of every version's descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ProxyOpDescr {
    pub pid: libc::pid_t,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

/// `proxyStep` of every version's descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ProxyStepDescr {
    pub step: c_int,
}

/// The state arguments of a proxy event: `proxyOp` of v1 (bytes, steps)
/// and `proxyStep` of v4 on (bytes) begin alike; room for the largest
/// member of every version's union.
#[repr(C)]
pub(super) struct ProxyStateArgs {
    pub trans_size: usize,
    pub steps: c_int,
    pub room: [u64; 3],
}
