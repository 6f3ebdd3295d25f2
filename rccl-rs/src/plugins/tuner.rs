//! NCCL tuner plug-ins (`NCCL_TUNER_PLUGIN`): a `.so` written for NCCL's
//! `ncclTuner_v2` .. `_v6` interface as a per-communicator [`TunerPlugin`].
//!
//! Loading follows NCCL's rules: `NCCL_TUNER_PLUGIN` unset, the library
//! `libnccl-tuner.so`, else the net plug-in's library (`NCCL_NET_PLUGIN`'s
//! rules) if it exports a tuner; set, `libnccl-tuner-X.so` then `X` (a file
//! name or a path); `none`, nothing. Of a library, the newest of the symbols
//! `ncclTunerPlugin_v6` .. `_v2` is taken. Each communicator initializes
//! its own context (`init` with its rank count, host count and hash) and
//! finalizes it when it is dropped.
//!
//! For each collective, v3 to v6 get the cost table: NCCL's 7 algorithms
//! by 3 protocols, in microseconds, where the model's estimate for each
//! allowed pair of ours that NCCL also has (ring and tree; LL, LL128,
//! Simple) stands at NCCL's index, and every other entry is
//! `NCCL_ALGO_PROTO_IGNORE` (-1). Our other algorithms (one-shot, direct,
//! halving-doubling, hierarchical, registered ones) have no index in
//! NCCL's table and are left out by design: a plug-in cannot pick them,
//! and when it leaves the table unchanged the built-in choice (which may
//! be one of them) stands. When it changes the table, the cheapest entry
//! wins (a plug-in marks its pick with cost 0). v2 names the algorithm and
//! protocol instead. A positive channel count it sets is used; v6's
//! `getChunkSize` may resize the chunks. Each choice is logged under
//! `NCCL_DEBUG_SUBSYS=TUNING`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use parking_lot::Mutex;
use rccl_algorithms::CollKind;
use rccl_env::{library_names, logger};
use rccl_transports::network::plugin::net_library_names;
use rccl_transports::Protocol;

use crate::tuning::{TunerCall, TunerHint, TunerPlugin};

type NcclResult = c_int;
type Logger = rccl_env::Logger;
type Context = *mut c_void;

/// `NCCL_ALGO_PROTO_IGNORE`.
const IGNORE: f32 = -1.0;
/// Rows of the cost table: NCCL's algorithms (tree, ring, CollNet direct,
/// CollNet chain, NVLS, NVLS tree, PAT).
const NUM_ALGORITHMS: usize = 7;
/// Columns: NCCL's protocols (LL, LL128, Simple).
const NUM_PROTOCOLS: usize = 3;

/// Our algorithms that NCCL's table has, at NCCL's index.
const ALGORITHMS: [(&str, usize); 2] = [("tree", 0), ("ring", 1)];

/// NCCL's index of a protocol.
fn protocol_index(protocol: Protocol) -> usize {
    match protocol {
        Protocol::Ll => 0,
        Protocol::Ll128 => 1,
        Protocol::Simple => 2,
    }
}

/// `ncclFunc_t` of a collective; `None` for kinds NCCL's tuner interface
/// does not cover.
fn func(kind: CollKind) -> Option<c_int> {
    match kind {
        CollKind::Broadcast => Some(0),
        CollKind::Reduce => Some(1),
        CollKind::AllGather => Some(2),
        CollKind::ReduceScatter => Some(3),
        CollKind::AllReduce => Some(4),
        _ => None,
    }
}

type InitV2 = unsafe extern "C" fn(usize, usize, Logger, *mut Context) -> NcclResult;
type DestroyFn = unsafe extern "C" fn(Context) -> NcclResult;

/// `ncclTuner_v2_t`.
#[repr(C)]
struct TunerV2 {
    name: *const c_char,
    init: Option<InitV2>,
    get_coll_info: Option<
        unsafe extern "C" fn(
            Context,
            c_int,
            usize,
            c_int,
            c_int,
            c_int,
            *mut c_int,
            *mut c_int,
            *mut c_int,
        ) -> NcclResult,
    >,
    destroy: Option<DestroyFn>,
}

/// `ncclTuner_v3_t`.
#[repr(C)]
struct TunerV3 {
    name: *const c_char,
    init: Option<InitV2>,
    get_coll_info: Option<
        unsafe extern "C" fn(
            Context,
            c_int,
            usize,
            c_int,
            *mut *mut f32,
            c_int,
            c_int,
            *mut c_int,
        ) -> NcclResult,
    >,
    destroy: Option<DestroyFn>,
}

/// `getCollInfo` of v4 to v6 (with `regBuff`).
type CollInfoV4 = unsafe extern "C" fn(
    Context,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    c_int,
    *mut c_int,
) -> NcclResult;

/// `ncclTuner_v4_t`.
#[repr(C)]
struct TunerV4 {
    name: *const c_char,
    init: Option<InitV2>,
    get_coll_info: Option<CollInfoV4>,
    destroy: Option<DestroyFn>,
}

/// `ncclNvlDomainInfo_v5_t`: here, a host's ranks share memory as an NVLink
/// domain's GPUs do.
#[repr(C)]
struct NvlDomainInfo {
    domains: c_int,
    min_ranks: c_int,
    max_ranks: c_int,
}

/// `ncclTunerConstants_v5_t`: NCCL's own latency and bandwidth constants.
/// The model here has other figures, so the plug-in sees zeros and what
/// it writes is not read.
#[repr(C)]
struct Constants {
    base_latencies: [[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS],
    hw_latencies: [[[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS]; 3],
    bandwidths: [[[f64; 3]; 4]; 5],
}

type InitV5 = unsafe extern "C" fn(
    *mut Context,
    u64,
    usize,
    usize,
    Logger,
    *mut NvlDomainInfo,
    *mut Constants,
) -> NcclResult;

/// `ncclTuner_v5_t`.
#[repr(C)]
struct TunerV5 {
    name: *const c_char,
    init: Option<InitV5>,
    get_coll_info: Option<CollInfoV4>,
    finalize: Option<DestroyFn>,
}

/// `ncclTuner_v6_t`.
#[repr(C)]
struct TunerV6 {
    name: *const c_char,
    init: Option<InitV5>,
    get_coll_info: Option<CollInfoV4>,
    finalize: Option<DestroyFn>,
    get_chunk_size: Option<
        unsafe extern "C" fn(Context, c_int, usize, c_int, c_int, c_int, *mut usize) -> NcclResult,
    >,
}

#[derive(Clone, Copy)]
enum Table {
    V2(&'static TunerV2),
    V3(&'static TunerV3),
    V4(&'static TunerV4),
    V5(&'static TunerV5),
    V6(&'static TunerV6),
}

/// A loaded tuner library.
struct Library {
    table: Table,
    name: String,
    version: u32,
    path: String,
}

// SAFETY: the tables are static data of a library that stays loaded; the
// plug-in's functions are called as NCCL calls them, from any thread.
unsafe impl Send for Library {}
// SAFETY: as above; nothing in `Library` is mutated after loading.
unsafe impl Sync for Library {}

/// The newest tuner table `library` exports.
fn table_of(library: &'static libloading::Library) -> Option<(Table, u32)> {
    fn symbol<T>(library: &'static libloading::Library, name: &[u8]) -> Option<&'static T> {
        // SAFETY: an `ncclTunerPlugin_vN` symbol is the plug-in's table of
        // version N, whose layout `T` declares; the library is never
        // unloaded.
        unsafe { library.get::<*const T>(name).ok().map(|s| &**s) }
    }
    None.or_else(|| symbol(library, b"ncclTunerPlugin_v6\0").map(|t| (Table::V6(t), 6)))
        .or_else(|| symbol(library, b"ncclTunerPlugin_v5\0").map(|t| (Table::V5(t), 5)))
        .or_else(|| symbol(library, b"ncclTunerPlugin_v4\0").map(|t| (Table::V4(t), 4)))
        .or_else(|| symbol(library, b"ncclTunerPlugin_v3\0").map(|t| (Table::V3(t), 3)))
        .or_else(|| symbol(library, b"ncclTunerPlugin_v2\0").map(|t| (Table::V2(t), 2)))
}

/// Opens the first of `names` that loads and exports a tuner; `tried`
/// collects why each other one was passed over.
fn open_first(names: &[String], tried: &mut Vec<String>) -> Option<Library> {
    for name in names {
        // SAFETY: loading a library runs its initializers; a tuner plug-in
        // is made to be loaded into the process this way.
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
                "{name} exports none of ncclTunerPlugin_v6 .. ncclTunerPlugin_v2"
            ));
            continue;
        };
        let name_ptr = match table {
            Table::V2(t) => t.name,
            Table::V3(t) => t.name,
            Table::V4(t) => t.name,
            Table::V5(t) => t.name,
            Table::V6(t) => t.name,
        };
        let plugin_name = if name_ptr.is_null() {
            "tuner".to_string()
        } else {
            // SAFETY: the table's name is a NUL-terminated string.
            unsafe { CStr::from_ptr(name_ptr) }
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

/// The tuner library of this process, loaded once by NCCL's rules.
fn library() -> Option<&'static Library> {
    static LIBRARY: OnceLock<Option<Library>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            let var = rccl_env::var("NCCL_TUNER_PLUGIN");
            if var
                .as_deref()
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
            {
                return None;
            }
            let mut tried = Vec::new();
            let mut found = open_first(&library_names("tuner", var.as_deref()), &mut tried);
            if found.is_none() && var.is_none() {
                found = open_first(&net_library_names(), &mut tried);
            }
            match &found {
                Some(lib) => {
                    crate::tuning::note_tuner_library_loaded();
                    tracing::info!(
                        target: crate::debug::TUNING,
                        "TUNER/Plugin: loaded {} (ncclTuner v{}) from {}",
                        lib.name,
                        lib.version,
                        lib.path
                    );
                }
                None => tracing::info!(
                    target: crate::debug::TUNING,
                    "TUNER/Plugin: no tuner plug-in ({}); using the internal tuner",
                    tried.join("; ")
                ),
            }
            found
        })
        .as_ref()
}

/// One communicator's context of the loaded tuner plug-in.
pub(crate) struct CTuner {
    library: &'static Library,
    /// The plug-in's context; calls on it are serialized.
    context: Mutex<Context>,
}

// SAFETY: the context is only passed back to the plug-in, one call at a
// time (under the mutex), as NCCL does from whichever thread enqueues.
unsafe impl Send for CTuner {}
// SAFETY: as above.
unsafe impl Sync for CTuner {}

/// The tuner plug-in's context for a communicator of `nranks` ranks on
/// `hosts` (the ranks of each host) with hash `comm_hash`; `None` without
/// a plug-in or when its `init` fails (logged: the internal tuner is used).
pub(crate) fn open(nranks: usize, hosts: &[Vec<usize>], comm_hash: u64) -> Option<CTuner> {
    let library = library()?;
    let mut context: Context = std::ptr::null_mut();
    let nnodes = hosts.len();
    let mut domains = NvlDomainInfo {
        domains: nnodes as c_int,
        min_ranks: hosts.iter().map(Vec::len).min().unwrap_or(0) as c_int,
        max_ranks: hosts.iter().map(Vec::len).max().unwrap_or(0) as c_int,
    };
    // SAFETY: all-zero bytes are valid for a struct of f64 arrays.
    let mut constants: Constants = unsafe { std::mem::zeroed() };
    let log = logger();
    // SAFETY: the entry points are the plug-in's own, called with valid
    // out-pointers and inputs that live for the call, as its interface says.
    let result = unsafe {
        match library.table {
            Table::V2(t) => t.init.map(|f| f(nranks, nnodes, log, &mut context)),
            Table::V3(t) => t.init.map(|f| f(nranks, nnodes, log, &mut context)),
            Table::V4(t) => t.init.map(|f| f(nranks, nnodes, log, &mut context)),
            Table::V5(t) => t.init.map(|f| {
                f(
                    &mut context,
                    comm_hash,
                    nranks,
                    nnodes,
                    log,
                    &mut domains,
                    &mut constants,
                )
            }),
            Table::V6(t) => t.init.map(|f| {
                f(
                    &mut context,
                    comm_hash,
                    nranks,
                    nnodes,
                    log,
                    &mut domains,
                    &mut constants,
                )
            }),
        }
    };
    match result {
        Some(0) => Some(CTuner {
            library,
            context: Mutex::new(context),
        }),
        other => {
            tracing::warn!(
                target: crate::debug::TUNING,
                "TUNER/Plugin {}: init {}; using the internal tuner",
                library.name,
                other.map_or("is missing".to_string(), |rc| format!("returned {rc}"))
            );
            None
        }
    }
}

impl CTuner {
    /// Calls `getCollInfo` of v3 to v6 with the cost table, which the
    /// plug-in may change; returns the channel count it set, `None` when
    /// the call failed.
    fn ask_with_table(
        &self,
        context: Context,
        func: c_int,
        bytes: usize,
        table: &mut [[f32; NUM_PROTOCOLS]; NUM_ALGORITHMS],
    ) -> Option<c_int> {
        // NCCL hands the table as `float**` that plug-ins cast back to
        // `float (*)[NCCL_NUM_PROTOCOLS]`: the address of its first row.
        let table_arg = table.as_mut_ptr().cast::<*mut f32>();
        let mut nchannels: c_int = 0;
        let (algos, protos) = (NUM_ALGORITHMS as c_int, NUM_PROTOCOLS as c_int);
        // SAFETY: the plug-in's own entry points with its context, a table
        // of `algos` x `protos` floats and a valid out-pointer.
        let result = unsafe {
            match self.library.table {
                Table::V3(t) => t.get_coll_info.map(|f| {
                    f(
                        context,
                        func,
                        bytes,
                        1,
                        table_arg,
                        algos,
                        protos,
                        &mut nchannels,
                    )
                }),
                Table::V4(t) => t.get_coll_info.map(|f| {
                    f(
                        context,
                        func,
                        bytes,
                        1,
                        table_arg,
                        algos,
                        protos,
                        0,
                        &mut nchannels,
                    )
                }),
                Table::V5(t) => t.get_coll_info.map(|f| {
                    f(
                        context,
                        func,
                        bytes,
                        1,
                        table_arg,
                        algos,
                        protos,
                        0,
                        &mut nchannels,
                    )
                }),
                Table::V6(t) => t.get_coll_info.map(|f| {
                    f(
                        context,
                        func,
                        bytes,
                        1,
                        table_arg,
                        algos,
                        protos,
                        0,
                        &mut nchannels,
                    )
                }),
                Table::V2(_) => None,
            }
        };
        (result == Some(0)).then_some(nchannels)
    }
}

impl TunerPlugin for CTuner {
    fn name(&self) -> &str {
        &self.library.name
    }

    /// Without the model's costs a C tuner is not asked.
    fn choose(
        &self,
        _kind: CollKind,
        _bytes: usize,
        _topology: &rccl_algorithms::Topology,
    ) -> Option<TunerHint> {
        None
    }

    fn choose_from(&self, call: &TunerCall<'_>) -> Option<TunerHint> {
        let func = func(call.kind)?;
        let context = self.context.lock();
        let mut hint = TunerHint::default();
        let nchannels = if let Table::V2(t) = self.library.table {
            let (mut algorithm, mut protocol, mut nchannels) = (-1, -1, 0);
            // SAFETY: the plug-in's own entry point with its context and
            // valid out-pointers (no CollNet, no NVLS here).
            let result = unsafe {
                t.get_coll_info.map(|f| {
                    f(
                        *context,
                        func,
                        call.bytes,
                        0,
                        0,
                        1,
                        &mut algorithm,
                        &mut protocol,
                        &mut nchannels,
                    )
                })
            };
            if result != Some(0) {
                return None;
            }
            let named = ALGORITHMS.iter().find(|(_, i)| *i as c_int == algorithm);
            let proto = Protocol::ALL
                .into_iter()
                .find(|p| protocol_index(*p) as c_int == protocol);
            // NCCL takes the algorithm and the protocol together.
            if let (Some((name, _)), Some(proto)) = (named, proto) {
                hint.algorithm = Some(name.to_string());
                hint.protocol = Some(proto);
            }
            nchannels
        } else {
            let mut table = [[IGNORE; NUM_PROTOCOLS]; NUM_ALGORITHMS];
            for cost in call.costs {
                let row = ALGORITHMS.iter().find(|(n, _)| *n == cost.algorithm);
                if let (Some((_, row)), Some(us)) = (row, cost.us) {
                    table[*row][protocol_index(cost.protocol)] = us as f32;
                }
            }
            let offered = table;
            let nchannels = self.ask_with_table(*context, func, call.bytes, &mut table)?;
            if table != offered {
                let cheapest = ALGORITHMS
                    .iter()
                    .flat_map(|&(name, row)| {
                        Protocol::ALL
                            .into_iter()
                            .map(move |p| (name, p, table[row][protocol_index(p)]))
                    })
                    .filter(|&(_, _, cost)| cost >= 0.0)
                    .min_by(|a, b| a.2.total_cmp(&b.2));
                if let Some((name, protocol, _)) = cheapest {
                    hint.algorithm = Some(name.to_string());
                    hint.protocol = Some(protocol);
                }
            }
            nchannels
        };
        if nchannels > 0 {
            hint.nchannels = Some(nchannels as usize);
        }
        Some(hint)
    }

    fn chunk_bytes(
        &self,
        kind: CollKind,
        bytes: usize,
        algorithm: &str,
        protocol: Protocol,
        nchannels: usize,
        chunk_bytes: usize,
    ) -> Option<usize> {
        let Table::V6(t) = self.library.table else {
            return None;
        };
        let get = t.get_chunk_size?;
        let func = func(kind)?;
        let (_, algo) = ALGORITHMS.iter().find(|(n, _)| *n == algorithm)?;
        let context = self.context.lock();
        let mut size = chunk_bytes;
        // SAFETY: the plug-in's own entry point with its context and a
        // valid in/out pointer.
        let result = unsafe {
            get(
                *context,
                func,
                bytes,
                *algo as c_int,
                protocol_index(protocol) as c_int,
                nchannels as c_int,
                &mut size,
            )
        };
        (result == 0 && size > 0 && size != chunk_bytes).then_some(size)
    }
}

impl Drop for CTuner {
    fn drop(&mut self) {
        let context = *self.context.get_mut();
        // SAFETY: the context this library's init gave, released once.
        let result = unsafe {
            match self.library.table {
                Table::V2(t) => t.destroy.map(|f| f(context)),
                Table::V3(t) => t.destroy.map(|f| f(context)),
                Table::V4(t) => t.destroy.map(|f| f(context)),
                Table::V5(t) => t.finalize.map(|f| f(context)),
                Table::V6(t) => t.finalize.map(|f| f(context)),
            }
        };
        if result.is_some_and(|rc| rc != 0) {
            tracing::warn!(
                target: crate::debug::TUNING,
                "TUNER/Plugin {}: finalize returned {}",
                self.library.name,
                result.unwrap_or(0)
            );
        }
    }
}
