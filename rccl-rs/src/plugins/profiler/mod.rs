//! NCCL profiler plug-ins (`NCCL_PROFILER_PLUGIN`): a `.so` written for
//! NCCL's `ncclProfiler_v1` .. `_v6` interface sees this process's group,
//! collective and point-to-point events.
//!
//! Loading follows NCCL's rules: `NCCL_PROFILER_PLUGIN` unset, the library
//! `libnccl-profiler.so`; set, `libnccl-profiler-X.so` then `X` (a file
//! name or a path); `none`, nothing. When none of those opens, the net
//! plug-in's library (`NCCL_NET_PLUGIN`'s rules) is asked for a profiler.
//! Of a library, the newest of the symbols `ncclProfiler_v6` .. `_v1` is
//! taken. Each communicator initializes its own context at init (a failed
//! `init` is logged and the communicator runs without profiler) and
//! finalizes it when it is dropped.
//!
//! Events, as NCCL nests them: each communicator's share of a launch is a
//! group event (`ncclProfileGroup`), the parent of one collective event
//! per collective call (sequence number per collective kind, buffers,
//! count, root, datatype, algorithm, protocol, channels) and one
//! point-to-point event per send or receive (peer, count, datatype,
//! channels). They start when the launch is planned and stop, children
//! first, when its host work has completed or its device work has been
//! enqueued (as NCCL stops them after the kernel launch). A plug-in's
//! activation mask is honoured as NCCL does: a group event starts when the
//! mask asks for it or for anything below it, a collective or
//! point-to-point event when the mask asks for it or for the proxy, kernel
//! or network events below it.
//!
//! From v5 on, the API events too: a call made outside any group, or the
//! first call of the outermost group, starts the thread's group API event
//! (on that call's communicator's context), which stops when that group
//! ends; each call's collective or point-to-point API event is its child,
//! started and stopped as the call is queued, and its handle is the
//! `parentObj` of the call's collective or point-to-point event (whose
//! `parentGroup` is the group event), as in NCCL.
//!
//! Proxy events of collectives over the network, as the mask asks: the
//! network proxy reports each piece it moves of a collective in progress
//! on this rank (`transports::StepObserver`); the first piece of a call
//! on a connection (channel and peer) and direction starts a proxy
//! operation event, child of the collective event, and each piece a proxy
//! step event inside it: a send's from its post (state `SendWait`) to its
//! completion, a receive's when its data has arrived (state
//! `RecvGPUWait`: the call it belongs to is known only then), stopped as
//! it is handed to the executor. The operations stop, their open steps
//! first, when the collective ends on this rank; a piece that arrives
//! before this rank starts the call, or whose send is posted after it
//! ended, is not reported. An operation's `nSteps` is 0 (unknown when
//! its first piece moves) and its `chunkSize` that piece's size.
//!
//! Not emitted: proxy events of sends and receives, proxy control, kernel
//! channels and kernel launches, network plug-in events and v6's
//! copy-engine events; `nWarps` is 0 and API events' `stream` is null.
//!
//! Without a plug-in a communicator holds `None`, and the only cost on a
//! call's path is the test of that field.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use rccl_algorithms::CollKind;
use rccl_env::{library_names, logger};
use rccl_transports::network::plugin::net_library_names;
use rccl_transports::{Protocol, StepObserver, Tag};

use crate::op::{OpKind, RawOp};
use crate::tuning::Choice;
use crate::types::DataType;

type NcclResult = c_int;
type Context = *mut c_void;
type Handle = *mut c_void;

/// `ncclProfileGroup` .. `ncclProfileNetPlugin`: the event type bits.
const GROUP: u64 = 1 << 0;
const COLL: u64 = 1 << 1;
const P2P: u64 = 1 << 2;
const PROXY_OP: u64 = 1 << 3;
const PROXY_STEP: u64 = 1 << 4;
const KERNEL_CH: u64 = 1 << 6;
const NET_PLUGIN: u64 = 1 << 7;
/// `ncclProfileGroupApi` .. `ncclProfileKernelLaunch` (v5 on).
const GROUP_API: u64 = 1 << 8;
const COLL_API: u64 = 1 << 9;
const P2P_API: u64 = 1 << 10;
const KERNEL_LAUNCH: u64 = 1 << 11;
/// `ncclProfileCeColl` .. `ncclProfileCeBatch` (v6).
const CE: u64 = 0b111 << 12;
/// The events below a collective or point-to-point call.
const BELOW_TASK: u64 = PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN;
/// What starts a collective API event: it or anything below it.
const COLL_API_MASK: u64 = COLL_API | COLL | BELOW_TASK | CE;
/// What starts a point-to-point API event.
const P2P_API_MASK: u64 = P2P_API | P2P | BELOW_TASK;
/// What starts a group API event: any event of a call.
const GROUP_API_MASK: u64 = GROUP_API | COLL_API_MASK | P2P_API_MASK | KERNEL_LAUNCH | GROUP;
/// The events the network proxy reports.
const PROXY_EVENTS: u64 = PROXY_OP | PROXY_STEP | NET_PLUGIN;
/// `ncclProfilerProxyOpSendPosted`, `..RecvPosted`, `..SendDone` and
/// `..RecvDone`: a proxy operation's states before v4.
const PROXY_OP_SEND_POSTED: c_int = 0;
const PROXY_OP_RECV_POSTED: c_int = 4;
const PROXY_OP_SEND_DONE: c_int = 3;
const PROXY_OP_RECV_DONE: c_int = 7;
/// `ncclProfilerProxyOpInProgress_v4`: a proxy operation's state from v4 on.
const PROXY_OP_IN_PROGRESS: c_int = 19;
/// `ncclProfilerProxyStepSendWait` and `..RecvGPUWait`.
const PROXY_STEP_SEND_WAIT: c_int = 9;
const PROXY_STEP_RECV_GPU_WAIT: c_int = 12;
/// `ncclProfilerGroupStartApiStop` and `ncclProfilerGroupEndApiStart`: the
/// group API event's states when the group's calls are in and when its
/// end begins.
const GROUP_START_API_STOP: c_int = 23;
const GROUP_END_API_START: c_int = 24;

type StartFn = unsafe extern "C" fn(Context, *mut Handle, *mut c_void) -> NcclResult;
type StopFn = unsafe extern "C" fn(Handle) -> NcclResult;
type FinalizeFn = unsafe extern "C" fn(Context) -> NcclResult;
type RecordFn = unsafe extern "C" fn(Handle, c_int, *mut c_void) -> NcclResult;
/// `init` of v1 to v3.
type InitV1 = unsafe extern "C" fn(*mut Context, *mut c_int) -> NcclResult;
/// `init` of v4: the mask, then the communicator's name and hash.
type InitV4 = unsafe extern "C" fn(
    *mut Context,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    rccl_env::Logger,
) -> NcclResult;
/// `init` of v5 and v6: the hash, then the mask and the name.
type InitV5 = unsafe extern "C" fn(
    *mut Context,
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
struct Table {
    name: *const c_char,
    init: Option<unsafe extern "C" fn()>,
    start_event: Option<StartFn>,
    stop_event: Option<StopFn>,
    record_event_state: Option<RecordFn>,
    finalize: Option<FinalizeFn>,
}

/// `coll` of `ncclProfilerEventDescr_v1_t`: codes instead of names.
#[repr(C)]
#[derive(Clone, Copy)]
struct CollV1 {
    name: *const c_char,
    comm_hash: u64,
    seq_number: u64,
    func: u8,
    send_buff: *const c_void,
    recv_buff: *mut c_void,
    count: usize,
    root: c_int,
    datatype: u8,
    op: u32,
    traffic_bytes: usize,
    n_max_channels: u8,
    n_warps: u8,
    algo: u8,
    proto: u8,
    is_collnet: c_int,
    is_nvls: c_int,
}

/// `p2p` of `ncclProfilerEventDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct P2pV1 {
    name: *const c_char,
    comm_hash: u64,
    func: u8,
    buff: *mut c_void,
    datatype: u8,
    count: usize,
    peer: c_int,
}

/// `coll` of v2: names instead of codes.
#[repr(C)]
#[derive(Clone, Copy)]
struct CollV2 {
    name: *const c_char,
    comm_hash: u64,
    seq_number: u64,
    func: *const c_char,
    send_buff: *const c_void,
    recv_buff: *mut c_void,
    count: usize,
    root: c_int,
    datatype: *const c_char,
    traffic_bytes: usize,
    n_max_channels: u8,
    n_warps: u8,
    algo: *const c_char,
    proto: *const c_char,
}

/// `coll` of v3: v2's without the traffic.
#[repr(C)]
#[derive(Clone, Copy)]
struct CollV3 {
    name: *const c_char,
    comm_hash: u64,
    seq_number: u64,
    func: *const c_char,
    send_buff: *const c_void,
    recv_buff: *mut c_void,
    count: usize,
    root: c_int,
    datatype: *const c_char,
    n_max_channels: u8,
    n_warps: u8,
    algo: *const c_char,
    proto: *const c_char,
}

/// `p2p` of v2 and v3.
#[repr(C)]
#[derive(Clone, Copy)]
struct P2pV2 {
    name: *const c_char,
    comm_hash: u64,
    func: *const c_char,
    buff: *mut c_void,
    datatype: *const c_char,
    count: usize,
    peer: c_int,
}

/// `coll` of v4 to v6 (`parent_group` from v5 on).
#[repr(C)]
#[derive(Clone, Copy)]
struct CollV4 {
    seq_number: u64,
    func: *const c_char,
    send_buff: *const c_void,
    recv_buff: *mut c_void,
    count: usize,
    root: c_int,
    datatype: *const c_char,
    n_channels: u8,
    n_warps: u8,
    algo: *const c_char,
    proto: *const c_char,
    parent_group: Handle,
}

/// `p2p` of v4 to v6 (`parent_group` from v5 on).
#[repr(C)]
#[derive(Clone, Copy)]
struct P2pV4 {
    func: *const c_char,
    buff: *mut c_void,
    datatype: *const c_char,
    count: usize,
    peer: c_int,
    n_channels: u8,
    parent_group: Handle,
}

/// `groupApi` of v5 and v6.
#[repr(C)]
#[derive(Clone, Copy)]
struct GroupApiV5 {
    graph_captured: bool,
    group_depth: c_int,
}

/// `collApi` of v5 and v6.
#[repr(C)]
#[derive(Clone, Copy)]
struct CollApiV5 {
    func: *const c_char,
    count: usize,
    datatype: *const c_char,
    root: c_int,
    stream: *mut c_void,
    graph_captured: bool,
}

/// `p2pApi` of v5 and v6.
#[repr(C)]
#[derive(Clone, Copy)]
struct P2pApiV5 {
    func: *const c_char,
    count: usize,
    datatype: *const c_char,
    stream: *mut c_void,
    graph_captured: bool,
}

/// The union of a descriptor: only the members this engine fills, and
/// room for the largest member of the version's own union (88 bytes in
/// v5 and v6), so a plug-in that copies the whole descriptor reads memory
/// of ours.
#[repr(C)]
union Data<C: Copy, P: Copy> {
    coll: C,
    p2p: P,
    room: [u64; 11],
}

/// `ncclProfilerEventDescr_v1_t` .. `_v4_t` (`type` is a byte).
#[repr(C)]
struct DescrByteType<C: Copy, P: Copy> {
    kind: u8,
    parent_obj: Handle,
    rank: c_int,
    data: Data<C, P>,
}

/// An API event's descriptor of v5 and v6: `DescrV5` with the union
/// holding `T`.
#[repr(C)]
struct ApiDescrV5<T: Copy> {
    kind: u64,
    parent_obj: Handle,
    rank: c_int,
    data: ApiData<T>,
}

#[repr(C)]
union ApiData<T: Copy> {
    api: T,
    room: [u64; 11],
}

/// `ncclProfilerEventDescr_v5_t` and `_v6_t` (`type` is 64 bits).
#[repr(C)]
struct DescrV5 {
    kind: u64,
    parent_obj: Handle,
    rank: c_int,
    data: Data<CollV4, P2pV4>,
}

/// `proxyOp` of every version's descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProxyOpDescr {
    pid: libc::pid_t,
    channel_id: u8,
    peer: c_int,
    n_steps: c_int,
    chunk_size: c_int,
    is_send: c_int,
}

/// `proxyStep` of every version's descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProxyStepDescr {
    step: c_int,
}

/// A proxy event's descriptor: `K` is the type's width (a byte before
/// v5, 64 bits from v5 on).
#[repr(C)]
struct ProxyDescr<K> {
    kind: K,
    parent_obj: Handle,
    rank: c_int,
    data: ProxyData,
}

/// The union of a proxy event's descriptor, as large as [`Data`].
#[repr(C)]
#[derive(Clone, Copy)]
union ProxyData {
    op: ProxyOpDescr,
    step: ProxyStepDescr,
    room: [u64; 11],
}

/// The state arguments of a proxy event: `proxyOp` of v1 (bytes, steps)
/// and `proxyStep` of v4 on (bytes) begin alike; room for the largest
/// member of every version's union.
#[repr(C)]
struct ProxyStateArgs {
    trans_size: usize,
    steps: c_int,
    room: [u64; 3],
}

/// A loaded profiler library.
struct Library {
    table: &'static Table,
    name: String,
    version: u32,
    path: String,
}

// SAFETY: the table is static data of a library that stays loaded; NCCL
// calls a profiler's functions from any thread.
unsafe impl Send for Library {}
// SAFETY: as above; nothing in `Library` is mutated after loading.
unsafe impl Sync for Library {}

/// The newest profiler table `library` exports.
fn table_of(library: &'static libloading::Library) -> Option<(&'static Table, u32)> {
    const SYMBOLS: [(&[u8], u32); 6] = [
        (b"ncclProfiler_v6\0", 6),
        (b"ncclProfiler_v5\0", 5),
        (b"ncclProfiler_v4\0", 4),
        (b"ncclProfiler_v3\0", 3),
        (b"ncclProfiler_v2\0", 2),
        (b"ncclProfiler_v1\0", 1),
    ];
    SYMBOLS.iter().find_map(|&(symbol, version)| {
        // SAFETY: an `ncclProfiler_vN` symbol is the plug-in's table, whose
        // shape `Table` declares for every version; the library is never
        // unloaded.
        let table = unsafe { library.get::<*const Table>(symbol).ok().map(|s| &**s) };
        table.map(|t| (t, version))
    })
}

/// Opens the first of `names` that loads and exports a profiler; `tried`
/// collects why each other one was passed over.
fn open_first(names: &[String], tried: &mut Vec<String>) -> Option<Library> {
    for name in names {
        // SAFETY: loading a library runs its initializers; a profiler
        // plug-in is made to be loaded into the process this way.
        let library = match unsafe { libloading::Library::new(name) } {
            Ok(library) => library,
            Err(e) => {
                tried.push(format!("{name}: {e}"));
                continue;
            }
        };
        let library: &'static libloading::Library = Box::leak(Box::new(library));
        let Some((table, version)) = table_of(library) else {
            tried.push(format!(
                "{name} exports none of ncclProfiler_v6 .. ncclProfiler_v1"
            ));
            continue;
        };
        let plugin_name = if table.name.is_null() {
            "profiler".to_string()
        } else {
            // SAFETY: the table's name is a NUL-terminated string.
            unsafe { CStr::from_ptr(table.name) }
                .to_string_lossy()
                .into_owned()
        };
        return Some(Library {
            table,
            name: plugin_name,
            version,
            path: name.clone(),
        });
    }
    None
}

/// The profiler library of this process, loaded once by NCCL's rules.
fn library() -> Option<&'static Library> {
    static LIBRARY: OnceLock<Option<Library>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            let var = rccl_env::var("NCCL_PROFILER_PLUGIN");
            if var
                .as_deref()
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
            {
                return None;
            }
            let mut tried = Vec::new();
            let found = open_first(&library_names("profiler", var.as_deref()), &mut tried)
                .or_else(|| open_first(&net_library_names(), &mut tried));
            match &found {
                Some(lib) => tracing::info!(
                    target: crate::debug::INIT,
                    "PROFILER/Plugin: loaded {} (ncclProfiler v{}) from {}",
                    lib.name,
                    lib.version,
                    lib.path
                ),
                // Named but not loaded is worth a warning; the default
                // absent is the common case.
                None if var.is_some() => tracing::warn!(
                    target: crate::debug::INIT,
                    "PROFILER/Plugin: not loaded ({}); continuing without profiler",
                    tried.join("; ")
                ),
                None => tracing::info!(
                    target: crate::debug::INIT,
                    "PROFILER/Plugin: no profiler plug-in ({})",
                    tried.join("; ")
                ),
            }
            found
        })
        .as_ref()
}

/// One communicator's context of the loaded profiler plug-in.
pub(crate) struct CProfiler {
    library: &'static Library,
    context: Context,
    /// The activation mask the plug-in set at init.
    mask: u64,
    rank: c_int,
    comm_hash: u64,
    /// Per collective kind (in `CollKind::ALL`'s order), the sequence
    /// number of its next call, as NCCL counts them per function.
    seq_numbers: [AtomicU64; CollKind::ALL.len()],
    /// The proxy events, shared with the network connections' observers.
    proxy: Arc<ProxyEvents>,
}

// SAFETY: the context is only passed back to the plug-in, which NCCL calls
// from whichever thread enqueues or progresses work.
unsafe impl Send for CProfiler {}
// SAFETY: as above.
unsafe impl Sync for CProfiler {}

/// The profiler plug-in's context for `rank` of a communicator of `nranks`
/// ranks on `nnodes` hosts with hash `comm_hash`; `None` without a plug-in
/// or when its `init` fails (logged: the communicator runs without).
pub(crate) fn open(comm_hash: u64, nnodes: usize, nranks: usize, rank: usize) -> Option<CProfiler> {
    let library = library()?;
    let table = library.table;
    let mut context: Context = std::ptr::null_mut();
    let mut mask: c_int = 0;
    let (nnodes, nranks, rank) = (nnodes as c_int, nranks as c_int, rank as c_int);
    let name = std::ptr::null();
    let log = logger();
    // SAFETY: `init` is the plug-in's own, of the signature its version
    // declares, called with valid out-pointers.
    let result = unsafe {
        table.init.map(|init| match library.version {
            1..=3 => {
                std::mem::transmute::<unsafe extern "C" fn(), InitV1>(init)(&mut context, &mut mask)
            }
            4 => std::mem::transmute::<unsafe extern "C" fn(), InitV4>(init)(
                &mut context,
                &mut mask,
                name,
                comm_hash,
                nnodes,
                nranks,
                rank,
                log,
            ),
            _ => std::mem::transmute::<unsafe extern "C" fn(), InitV5>(init)(
                &mut context,
                comm_hash,
                &mut mask,
                name,
                nnodes,
                nranks,
                rank,
                log,
            ),
        })
    };
    let usable = table.start_event.is_some() && table.stop_event.is_some();
    match result {
        Some(0) if usable => {
            tracing::info!(
                target: crate::debug::INIT,
                "[{rank}] PROFILER/Plugin {}: event mask {mask:#x}",
                library.name
            );
            Some(CProfiler {
                library,
                context,
                mask: mask as u32 as u64,
                rank,
                comm_hash,
                seq_numbers: std::array::from_fn(|_| AtomicU64::new(0)),
                proxy: Arc::new(ProxyEvents {
                    library,
                    context,
                    rank,
                    mask: mask as u32 as u64,
                    state: Mutex::new(ProxyState::default()),
                }),
            })
        }
        other => {
            let why = match other {
                None => "has no init".to_string(),
                Some(0) => "has no startEvent or stopEvent".to_string(),
                Some(rc) => format!("init returned {rc}"),
            };
            tracing::warn!(
                target: crate::debug::INIT,
                "[{rank}] PROFILER/Plugin {}: {why}; continuing without profiler",
                library.name
            );
            if other == Some(0) {
                finalize(library, context);
            }
            None
        }
    }
}

fn finalize(library: &Library, context: Context) {
    // SAFETY: the context this library's init gave, released once.
    let result = library.table.finalize.map(|f| unsafe { f(context) });
    if let Some(rc) = result.filter(|&rc| rc != 0) {
        tracing::warn!(
            target: crate::debug::INIT,
            "PROFILER/Plugin {}: finalize returned {rc}",
            library.name
        );
    }
}

impl Drop for CProfiler {
    fn drop(&mut self) {
        // Observers that outlive the communicator report nothing more.
        self.proxy.state.lock().closed = true;
        finalize(self.library, self.context);
    }
}

/// `ncclFuncToString` of a collective kind, and its `ncclFunc_t`.
fn func(kind: CollKind) -> (&'static CStr, u8) {
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

/// `ncclDatatypeToString` of a datatype; its code is its discriminant.
fn datatype(dtype: DataType) -> &'static CStr {
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

/// A collective or point-to-point call as every version describes it.
enum Task {
    Coll {
        seq_number: u64,
        kind: CollKind,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        root: c_int,
        dtype: DataType,
        nchannels: u8,
        algorithm: &'static str,
        protocol: Protocol,
        api: Handle,
    },
    P2p {
        send: bool,
        buff: *mut c_void,
        dtype: DataType,
        count: usize,
        peer: c_int,
        nchannels: u8,
        api: Handle,
    },
}

impl CProfiler {
    /// Starts an event: `task`'s, or the group's when `None`; null when the
    /// plug-in gave no handle or failed.
    fn start(&self, task: Option<&Task>, group: Handle) -> Handle {
        let Some(start) = self.library.table.start_event else {
            return std::ptr::null_mut();
        };
        let mut handle: Handle = std::ptr::null_mut();
        let rank = self.rank;
        let no_name = std::ptr::null();
        let hash = self.comm_hash;
        macro_rules! call {
            ($descr:expr) => {{
                let mut descr = $descr;
                // SAFETY: the plug-in's own entry point with its context, a
                // valid out-pointer and a descriptor of its version that
                // lives for the call.
                unsafe {
                    start(
                        self.context,
                        &mut handle,
                        std::ptr::addr_of_mut!(descr).cast(),
                    )
                }
            }};
        }
        fn byte_type<C: Copy, P: Copy>(
            task: Option<&Task>,
            parent: Handle,
            rank: c_int,
            data: Data<C, P>,
        ) -> DescrByteType<C, P> {
            DescrByteType {
                kind: match task {
                    None => GROUP as u8,
                    Some(Task::Coll { .. }) => COLL as u8,
                    Some(Task::P2p { .. }) => P2P as u8,
                },
                parent_obj: if task.is_some() {
                    parent
                } else {
                    std::ptr::null_mut()
                },
                rank,
                data,
            }
        }
        let empty = [0u64; 11];
        let result = match (self.library.version, task) {
            (version, None) if version >= 5 => call!(DescrV5 {
                kind: GROUP,
                parent_obj: std::ptr::null_mut(),
                rank,
                data: Data { room: empty },
            }),
            (_, None) => call!(byte_type::<CollV4, P2pV4>(
                None,
                group,
                rank,
                Data { room: empty }
            )),
            (
                version,
                Some(&Task::Coll {
                    seq_number,
                    kind,
                    send,
                    recv,
                    count,
                    root,
                    dtype,
                    nchannels,
                    algorithm: algo,
                    protocol: proto,
                    api,
                }),
            ) => {
                let (func_name, func_code) = func(kind);
                let (algo_name, algo_code) = algorithm(algo);
                let (proto_name, proto_code) = protocol(proto);
                let dt = datatype(dtype).as_ptr();
                match version {
                    1 => call!(byte_type::<CollV1, P2pV1>(
                        task,
                        group,
                        rank,
                        Data {
                            coll: CollV1 {
                                name: no_name,
                                comm_hash: hash,
                                seq_number,
                                func: func_code,
                                send_buff: send,
                                recv_buff: recv,
                                count,
                                root,
                                datatype: dtype as u8,
                                op: 0,
                                traffic_bytes: 0,
                                n_max_channels: nchannels,
                                n_warps: 0,
                                algo: algo_code,
                                proto: proto_code,
                                is_collnet: 0,
                                is_nvls: 0,
                            }
                        }
                    )),
                    2 => call!(byte_type::<CollV2, P2pV2>(
                        task,
                        group,
                        rank,
                        Data {
                            coll: CollV2 {
                                name: no_name,
                                comm_hash: hash,
                                seq_number,
                                func: func_name.as_ptr(),
                                send_buff: send,
                                recv_buff: recv,
                                count,
                                root,
                                datatype: dt,
                                traffic_bytes: 0,
                                n_max_channels: nchannels,
                                n_warps: 0,
                                algo: algo_name.as_ptr(),
                                proto: proto_name.as_ptr(),
                            }
                        }
                    )),
                    3 => call!(byte_type::<CollV3, P2pV2>(
                        task,
                        group,
                        rank,
                        Data {
                            coll: CollV3 {
                                name: no_name,
                                comm_hash: hash,
                                seq_number,
                                func: func_name.as_ptr(),
                                send_buff: send,
                                recv_buff: recv,
                                count,
                                root,
                                datatype: dt,
                                n_max_channels: nchannels,
                                n_warps: 0,
                                algo: algo_name.as_ptr(),
                                proto: proto_name.as_ptr(),
                            }
                        }
                    )),
                    _ => {
                        let coll = CollV4 {
                            seq_number,
                            func: func_name.as_ptr(),
                            send_buff: send,
                            recv_buff: recv,
                            count,
                            root,
                            datatype: dt,
                            n_channels: nchannels,
                            n_warps: 0,
                            algo: algo_name.as_ptr(),
                            proto: proto_name.as_ptr(),
                            parent_group: group,
                        };
                        if version == 4 {
                            call!(byte_type::<CollV4, P2pV4>(task, group, rank, Data { coll }))
                        } else {
                            call!(DescrV5 {
                                kind: COLL,
                                parent_obj: api,
                                rank,
                                data: Data { coll },
                            })
                        }
                    }
                }
            }
            (
                version,
                Some(&Task::P2p {
                    send,
                    buff,
                    dtype,
                    count,
                    peer,
                    nchannels,
                    api,
                }),
            ) => {
                let (func_name, func_code) = if send { (c"Send", 6) } else { (c"Recv", 7) };
                let dt = datatype(dtype).as_ptr();
                match version {
                    1 => call!(byte_type::<CollV1, P2pV1>(
                        task,
                        group,
                        rank,
                        Data {
                            p2p: P2pV1 {
                                name: no_name,
                                comm_hash: hash,
                                func: func_code,
                                buff,
                                datatype: dtype as u8,
                                count,
                                peer,
                            }
                        }
                    )),
                    2 | 3 => call!(byte_type::<CollV3, P2pV2>(
                        task,
                        group,
                        rank,
                        Data {
                            p2p: P2pV2 {
                                name: no_name,
                                comm_hash: hash,
                                func: func_name.as_ptr(),
                                buff,
                                datatype: dt,
                                count,
                                peer,
                            }
                        }
                    )),
                    _ => {
                        let p2p = P2pV4 {
                            func: func_name.as_ptr(),
                            buff,
                            datatype: dt,
                            count,
                            peer,
                            n_channels: nchannels,
                            parent_group: group,
                        };
                        if version == 4 {
                            call!(byte_type::<CollV4, P2pV4>(task, group, rank, Data { p2p }))
                        } else {
                            call!(DescrV5 {
                                kind: P2P,
                                parent_obj: api,
                                rank,
                                data: Data { p2p },
                            })
                        }
                    }
                }
            }
        };
        if result != 0 {
            tracing::warn!(
                target: crate::debug::INIT,
                "[{rank}] PROFILER/Plugin {}: startEvent returned {result}",
                self.library.name
            );
            return std::ptr::null_mut();
        }
        handle
    }
}

/// A call's API event (v5 on), already stopped as NCCL stops it once the
/// call is queued; its handle is the `parentObj` of the call's collective
/// or point-to-point event, as in NCCL.
#[derive(Clone, Copy)]
pub(crate) struct ApiEvent(Handle);

impl Default for ApiEvent {
    fn default() -> Self {
        ApiEvent(std::ptr::null_mut())
    }
}

// SAFETY: the handle is only passed back to the plug-in as a parent.
unsafe impl Send for ApiEvent {}

thread_local! {
    /// This thread's open group API event (v5 on) and its plug-in: from
    /// the first call of the outermost group (or of a call outside any)
    /// to the end of that group.
    static GROUP_API_EVENT: Cell<Option<(Handle, &'static Library)>> = const { Cell::new(None) };
}

fn record(library: &Library, handle: Handle, state: c_int) {
    if let Some(record) = library.table.record_event_state {
        // SAFETY: an open handle of this plug-in; a state of its interface
        // that takes no arguments.
        unsafe { record(handle, state, std::ptr::null_mut()) };
    }
}

/// The end of this thread's outermost group (or of a call outside any):
/// the group API event's end state is recorded when it begins, and the
/// event stops when it is dropped, after the group's launch.
pub(crate) struct GroupApiEnd(Option<(Handle, &'static Library)>);

impl GroupApiEnd {
    pub(crate) fn begin() -> GroupApiEnd {
        let open = GROUP_API_EVENT.with(Cell::take);
        if let Some((handle, library)) = open {
            record(library, handle, GROUP_END_API_START);
        }
        GroupApiEnd(open)
    }
}

impl Drop for GroupApiEnd {
    fn drop(&mut self) {
        if let Some((handle, library)) = self.0 {
            if let Some(stop) = library.table.stop_event {
                // SAFETY: the open group API event, stopped once.
                unsafe { stop(handle) };
            }
        }
    }
}

impl CProfiler {
    /// Starts an API event of `kind` with the union member `api`.
    fn start_api<T: Copy>(&self, kind: u64, parent: Handle, api: T) -> Handle {
        let Some(start) = self.library.table.start_event else {
            return std::ptr::null_mut();
        };
        let mut descr = ApiDescrV5 {
            kind,
            parent_obj: parent,
            rank: self.rank,
            data: ApiData { api },
        };
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: the plug-in's own entry point with its context, a valid
        // out-pointer and a v5 descriptor that lives for the call.
        let result = unsafe {
            start(
                self.context,
                &mut handle,
                std::ptr::addr_of_mut!(descr).cast(),
            )
        };
        if result == 0 {
            handle
        } else {
            std::ptr::null_mut()
        }
    }

    /// The API events of `op`, a call made at group depth `depth` (v5 on,
    /// as the mask asks): the thread's group API event, started by the
    /// first call of a group, and the call's own, started and stopped here.
    pub(crate) fn api_call(&self, op: &RawOp, depth: usize) -> ApiEvent {
        if self.library.version < 5 || self.mask & GROUP_API_MASK == 0 {
            return ApiEvent::default();
        }
        let group = GROUP_API_EVENT.with(|open| match open.get() {
            Some((handle, _)) => handle,
            None => {
                // NCCL counts the group every call opens inside its own.
                let api = GroupApiV5 {
                    graph_captured: false,
                    group_depth: depth as c_int + 1,
                };
                let handle = self.start_api(GROUP_API, std::ptr::null_mut(), api);
                if !handle.is_null() {
                    open.set(Some((handle, self.library)));
                    record(self.library, handle, GROUP_START_API_STOP);
                }
                handle
            }
        });
        let dt = datatype(op.dtype).as_ptr();
        let handle = match op.kind {
            OpKind::Coll { kind, root, .. } if self.mask & COLL_API_MASK != 0 => {
                let api = CollApiV5 {
                    func: func(kind).0.as_ptr(),
                    count: op.count,
                    datatype: dt,
                    root: root as c_int,
                    stream: std::ptr::null_mut(),
                    graph_captured: false,
                };
                self.start_api(COLL_API, group, api)
            }
            OpKind::Send { .. } | OpKind::Recv { .. } if self.mask & P2P_API_MASK != 0 => {
                let send = matches!(op.kind, OpKind::Send { .. });
                let api = P2pApiV5 {
                    func: if send { c"Send" } else { c"Recv" }.as_ptr(),
                    count: op.count,
                    datatype: dt,
                    stream: std::ptr::null_mut(),
                    graph_captured: false,
                };
                self.start_api(P2P_API, group, api)
            }
            _ => std::ptr::null_mut(),
        };
        if let (false, Some(stop)) = (handle.is_null(), self.library.table.stop_event) {
            // SAFETY: the event just started, stopped once.
            unsafe { stop(handle) };
        }
        ApiEvent(handle)
    }
}

/// The events of one communicator's share of a launch: its group event and
/// the events of its calls, stopped (calls first) when dropped.
#[derive(Default)]
pub(crate) struct LaunchEvents {
    stop: Option<StopFn>,
    group: Handle,
    tasks: Vec<Handle>,
    /// The proxy events of its collectives, by their sequence numbers.
    proxy: Option<(Arc<ProxyEvents>, Vec<u32>)>,
}

// SAFETY: the handles are only passed back to the plug-in's `stopEvent`,
// which NCCL calls from whichever thread completes the work.
unsafe impl Send for LaunchEvents {}

impl LaunchEvents {
    /// Starts the group event of the launch, once, if the mask asks for it
    /// or for anything below it.
    fn group(&mut self, profiler: &CProfiler) -> Handle {
        if self.stop.is_none() {
            self.stop = profiler.library.table.stop_event;
            if profiler.mask & (GROUP | COLL | P2P | BELOW_TASK) != 0 {
                self.group = profiler.start(None, std::ptr::null_mut());
            }
        }
        self.group
    }

    /// Starts the event of `task`; its handle, or null.
    fn task(&mut self, profiler: &CProfiler, task: Task, bit: u64) -> Handle {
        let group = self.group(profiler);
        if profiler.mask & (bit | BELOW_TASK) == 0 {
            return std::ptr::null_mut();
        }
        let handle = profiler.start(Some(&task), group);
        if !handle.is_null() {
            self.tasks.push(handle);
        }
        handle
    }

    /// Starts the event of collective `op` (with the tuner's `choice`),
    /// whose pieces carry `seq`, and, the first time, the group's.
    pub(crate) fn collective(
        &mut self,
        profiler: &CProfiler,
        op: &RawOp,
        choice: &Choice,
        seq: u64,
    ) {
        let OpKind::Coll { kind, root, .. } = op.kind else {
            return;
        };
        let index = CollKind::ALL.iter().position(|&k| k == kind).unwrap_or(0);
        let seq_number = profiler.seq_numbers[index].fetch_add(1, Ordering::Relaxed);
        let task = Task::Coll {
            seq_number,
            kind,
            send: op.send.cast(),
            recv: op.recv.cast(),
            count: op.count,
            root: root as c_int,
            dtype: op.dtype,
            nchannels: choice.params.nchannels.min(u8::MAX as usize) as u8,
            algorithm: choice.algorithm.name(),
            protocol: choice.protocol,
            api: op.api_event.0,
        };
        let handle = self.task(profiler, task, COLL);
        if profiler.mask & PROXY_EVENTS != 0 && !handle.is_null() {
            let (events, calls) = self
                .proxy
                .get_or_insert_with(|| (profiler.proxy.clone(), Vec::new()));
            events.begin_call(seq as u32, handle);
            calls.push(seq as u32);
        }
    }

    /// Starts the events of a batch of sends and receives over `nchannels`
    /// channels and, the first time, the group's.
    pub(crate) fn p2p(&mut self, profiler: &CProfiler, ops: &[RawOp], nchannels: usize) {
        for op in ops {
            let (send, buff, peer) = match op.kind {
                OpKind::Send { peer } => (true, op.send as *mut c_void, peer),
                OpKind::Recv { peer } => (false, op.recv.cast(), peer),
                OpKind::Coll { .. } => continue,
            };
            let task = Task::P2p {
                send,
                buff,
                dtype: op.dtype,
                count: op.count,
                peer: peer as c_int,
                nchannels: nchannels.min(u8::MAX as usize) as u8,
                api: op.api_event.0,
            };
            self.task(profiler, task, P2P);
        }
    }
}

impl Drop for LaunchEvents {
    fn drop(&mut self) {
        let Some(stop) = self.stop else {
            return;
        };
        if let Some((events, calls)) = self.proxy.take() {
            for seq in calls {
                events.end_call(seq);
            }
        }
        for handle in self.tasks.drain(..).chain(Some(self.group)) {
            if !handle.is_null() {
                // SAFETY: a handle this plug-in's startEvent gave, stopped
                // once, while its communicator's context is alive (the
                // launch holds the communicator).
                unsafe { stop(handle) };
            }
        }
    }
}

/// A communicator's proxy events: the collectives in progress whose
/// pieces the network proxy reports, and their open proxy operations.
pub(crate) struct ProxyEvents {
    library: &'static Library,
    context: Context,
    rank: c_int,
    mask: u64,
    /// Held across every call into the plug-in for these events, so that
    /// the proxy thread and the thread that ends a call take turns.
    state: Mutex<ProxyState>,
}

// SAFETY: the context is only passed back to the plug-in, under `state`'s
// lock; NCCL calls a profiler from its proxy thread too.
unsafe impl Send for ProxyEvents {}
// SAFETY: as above.
unsafe impl Sync for ProxyEvents {}

#[derive(Default)]
struct ProxyState {
    /// The communicator (and its plug-in context) is gone.
    closed: bool,
    /// By the sequence number its pieces' tags carry, each collective in
    /// progress with a collective event.
    calls: HashMap<u32, ProxyCall>,
    /// The number of the last step started, to name the next.
    last_step: usize,
}

/// A collective in progress: its event and its open proxy operations.
struct ProxyCall {
    parent: Handle,
    ops: Vec<ProxyOp>,
}

/// One proxy operation: the pieces of a call one connection moves one way.
struct ProxyOp {
    channel: u8,
    peer: c_int,
    send: bool,
    handle: Handle,
    /// Its steps so far, to number the next.
    steps: c_int,
    /// Its sends in flight: the step's number for `sent`, and its event.
    open_steps: Vec<(usize, Handle)>,
}

impl ProxyEvents {
    fn start(&self, kind: u64, parent: Handle, data: ProxyData) -> Handle {
        let Some(start) = self.library.table.start_event else {
            return std::ptr::null_mut();
        };
        let mut handle: Handle = std::ptr::null_mut();
        let result = if self.library.version >= 5 {
            let mut descr = ProxyDescr {
                kind,
                parent_obj: parent,
                rank: self.rank,
                data,
            };
            // SAFETY: the plug-in's own entry point with its context, a
            // valid out-pointer and a descriptor of its version that lives
            // for the call.
            unsafe {
                start(
                    self.context,
                    &mut handle,
                    std::ptr::addr_of_mut!(descr).cast(),
                )
            }
        } else {
            let mut descr = ProxyDescr {
                kind: kind as u8,
                parent_obj: parent,
                rank: self.rank,
                data,
            };
            // SAFETY: as above, with the byte-typed descriptor of v1 to v4.
            unsafe {
                start(
                    self.context,
                    &mut handle,
                    std::ptr::addr_of_mut!(descr).cast(),
                )
            }
        };
        if result == 0 {
            handle
        } else {
            std::ptr::null_mut()
        }
    }

    fn record(&self, handle: Handle, state: c_int, bytes: usize) {
        if let (false, Some(record)) = (handle.is_null(), self.library.table.record_event_state) {
            let mut args = ProxyStateArgs {
                trans_size: bytes,
                steps: 1,
                room: [0; 3],
            };
            // SAFETY: an open handle of this plug-in, a state of its
            // interface and arguments that live for the call.
            unsafe { record(handle, state, std::ptr::addr_of_mut!(args).cast()) };
        }
    }

    fn stop(&self, handle: Handle) {
        if let (false, Some(stop)) = (handle.is_null(), self.library.table.stop_event) {
            // SAFETY: an open handle of this plug-in, stopped once.
            unsafe { stop(handle) };
        }
    }

    /// Starts the proxy events of collective `seq` (whose event is
    /// `parent`) from now until [`ProxyEvents::end_call`].
    fn begin_call(&self, seq: u32, parent: Handle) {
        let mut state = self.state.lock();
        let call = ProxyCall {
            parent,
            ops: Vec::new(),
        };
        state.calls.insert(seq, call);
    }

    /// Stops the proxy operations of collective `seq`, their open steps
    /// first.
    fn end_call(&self, seq: u32) {
        let mut state = self.state.lock();
        let Some(call) = state.calls.remove(&seq) else {
            return;
        };
        if state.closed {
            return;
        }
        for op in call.ops {
            for (_, step) in op.open_steps {
                self.stop(step);
            }
            if self.library.version < 4 {
                let done = if op.send {
                    PROXY_OP_SEND_DONE
                } else {
                    PROXY_OP_RECV_DONE
                };
                self.record(op.handle, done, 0);
            }
            self.stop(op.handle);
        }
    }

    /// Starts a step of `bytes` of call `tag` on `channel` to or from
    /// `peer`, in its proxy operation (started with its first step): a
    /// send's step stays open and its number comes back, a receive's is
    /// stopped at once; `None` when the call is not in progress here.
    fn start_step(
        &self,
        tag: Tag,
        channel: u8,
        peer: c_int,
        send: bool,
        bytes: usize,
    ) -> Option<usize> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        if state.closed {
            return None;
        }
        let call = state.calls.get_mut(&tag.seq)?;
        let index = match call
            .ops
            .iter()
            .position(|op| op.channel == channel && op.peer == peer && op.send == send)
        {
            Some(index) => index,
            None => {
                let descr = ProxyOpDescr {
                    // SAFETY: getpid has no preconditions.
                    pid: unsafe { libc::getpid() },
                    channel_id: channel,
                    peer,
                    n_steps: 0,
                    chunk_size: bytes as c_int,
                    is_send: send as c_int,
                };
                let handle = self.start(PROXY_OP, call.parent, ProxyData { op: descr });
                let state = match (self.library.version, send) {
                    (4.., _) => PROXY_OP_IN_PROGRESS,
                    (_, true) => PROXY_OP_SEND_POSTED,
                    (_, false) => PROXY_OP_RECV_POSTED,
                };
                self.record(handle, state, bytes);
                call.ops.push(ProxyOp {
                    channel,
                    peer,
                    send,
                    handle,
                    steps: 0,
                    open_steps: Vec::new(),
                });
                call.ops.len() - 1
            }
        };
        let op = &mut call.ops[index];
        op.steps += 1;
        if self.mask & (PROXY_STEP | NET_PLUGIN) == 0 || op.handle.is_null() {
            return None;
        }
        let step = ProxyStepDescr { step: op.steps - 1 };
        let handle = self.start(PROXY_STEP, op.handle, ProxyData { step });
        if handle.is_null() {
            return None;
        }
        state.last_step += 1;
        let id = state.last_step;
        if send {
            self.record(handle, PROXY_STEP_SEND_WAIT, bytes);
            op.open_steps.push((id, handle));
        } else {
            self.record(handle, PROXY_STEP_RECV_GPU_WAIT, bytes);
            self.stop(handle);
        }
        Some(id)
    }

    /// Stops send step `id` if its operation is still open.
    fn stop_send_step(&self, id: usize) {
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        for op in state
            .calls
            .values_mut()
            .flat_map(|call| call.ops.iter_mut())
        {
            if let Some(at) = op.open_steps.iter().position(|&(step, _)| step == id) {
                let (_, handle) = op.open_steps.swap_remove(at);
                self.stop(handle);
                return;
            }
        }
    }
}

/// What the network proxy reports of one connection: the channel and
/// peer of its proxy operations.
struct ConnectionSteps {
    events: Arc<ProxyEvents>,
    channel: u8,
    peer: c_int,
}

impl StepObserver for ConnectionSteps {
    fn send_posted(&self, tag: Tag, bytes: usize) -> usize {
        self.events
            .start_step(tag, self.channel, self.peer, true, bytes)
            .unwrap_or(0)
    }

    fn sent(&self, step: usize) {
        if step != 0 {
            self.events.stop_send_step(step);
        }
    }

    fn received(&self, tag: Tag, bytes: usize) {
        self.events
            .start_step(tag, self.channel, self.peer, false, bytes);
    }
}

impl CProfiler {
    /// The observer of a network connection on `channel` to `peer`, when
    /// the mask asks for proxy events.
    pub(crate) fn step_observer(
        &self,
        channel: usize,
        peer: usize,
    ) -> Option<Arc<dyn StepObserver>> {
        (self.mask & PROXY_EVENTS != 0).then(|| {
            Arc::new(ConnectionSteps {
                events: self.proxy.clone(),
                channel: channel.min(u8::MAX as usize) as u8,
                peer: peer as c_int,
            }) as Arc<dyn StepObserver>
        })
    }
}
