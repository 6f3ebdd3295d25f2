//! NCCL tuner plug-ins (`NCCL_TUNER_PLUGIN`): a `.so` written for NCCL's
//! `ncclTuner_v2` .. `_v6` interface as a per-communicator [`TunerPlugin`].
//!
//! Loading follows NCCL's rules (`rccl_env::load`): `NCCL_TUNER_PLUGIN`
//! names the library, unset `libnccl-tuner.so`, else the net plug-in's
//! library (`NCCL_NET_PLUGIN`'s rules) if it exports a tuner; `none`,
//! nothing. Of a library, the newest of the symbols
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

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

use parking_lot::Mutex;
use rccl_algorithms::CollKind;
use rccl_env::load::{Kind, Library, Subsystem};
use rccl_env::logger;
use rccl_transports::network::net_library_names;
use rccl_transports::Protocol;

use super::{FinalizeFn, NcclResult, PluginContext};
use crate::tuning::{TunerCall, TunerHint, TunerPlugin};

type Logger = rccl_env::Logger;

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

type TunerInitV2 = unsafe extern "C" fn(usize, usize, Logger, *mut PluginContext) -> NcclResult;
/// `getCollInfo` of a version: the context, collective and size, the
/// version's own arguments, then where the channel count goes.
macro_rules! get_coll_info {
    ($($own:ty),*) => {
        unsafe extern "C" fn(PluginContext, c_int, usize, $($own,)* *mut c_int) -> NcclResult
    };
}
/// v2: CollNet and NVLS support and the pipelined operations; out, the
/// algorithm and protocol by name.
type CollInfoV2 = get_coll_info!(c_int, c_int, c_int, *mut c_int, *mut c_int);
/// v3: the pipelined operations and the cost table, algorithms by
/// protocols.
type CollInfoV3 = get_coll_info!(c_int, *mut *mut f32, c_int, c_int);
/// v4 to v6: v3's with `regBuff`.
type CollInfoV4 = get_coll_info!(c_int, *mut *mut f32, c_int, c_int, c_int);
type ChunkSizeFn = unsafe extern "C" fn(
    PluginContext,
    c_int,
    usize,
    c_int,
    c_int,
    c_int,
    *mut usize,
) -> NcclResult;

/// `ncclTuner_v2_t` .. `_v5_t`: `I` and `C` are the version's `init` and
/// `getCollInfo` (`destroy` is v5's `finalize`).
#[repr(C)]
struct TunerTable<I, C> {
    name: *const c_char,
    init: Option<I>,
    get_coll_info: Option<C>,
    finalize: Option<FinalizeFn>,
}

/// `ncclTuner_v6_t`: v5's with `getChunkSize`.
#[repr(C)]
struct TableV6 {
    v5: TunerTable<TunerInitV5, CollInfoV4>,
    get_chunk_size: Option<ChunkSizeFn>,
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

type TunerInitV5 = unsafe extern "C" fn(
    *mut PluginContext,
    u64,
    usize,
    usize,
    Logger,
    *mut NvlDomainInfo,
    *mut Constants,
) -> NcclResult;

/// `init` of each version.
#[derive(Clone, Copy)]
enum Init {
    V2(TunerInitV2),
    V5(TunerInitV5),
}

/// `getCollInfo` of each version.
#[derive(Clone, Copy)]
enum CollInfo {
    V2(CollInfoV2),
    V3(CollInfoV3),
    V4(CollInfoV4),
}

/// The entry points of a loaded tuner, whatever its version.
struct Tuner {
    library: Library,
    init: Option<Init>,
    get_coll_info: Option<CollInfo>,
    finalize: Option<FinalizeFn>,
    get_chunk_size: Option<ChunkSizeFn>,
}

/// The tuner plug-in's kind.
const TUNER_PLUGIN: Kind = Kind {
    file: "tuner",
    symbol: "ncclTunerPlugin_v",
    interface: "ncclTuner",
    versions: &[6, 5, 4, 3, 2],
    subsystem: Subsystem::InitTuning,
    without: "using the internal tuner",
};

impl Tuner {
    /// The entry points of `library`'s table, by its version.
    fn of(library: Library) -> Tuner {
        /// The entry points of a table of v2 to v5.
        fn entries<I: Copy, C: Copy>(
            table: &TunerTable<I, C>,
            init: fn(I) -> Init,
            coll_info: fn(C) -> CollInfo,
        ) -> (Option<Init>, Option<CollInfo>, Option<FinalizeFn>) {
            (
                table.init.map(init),
                table.get_coll_info.map(coll_info),
                table.finalize,
            )
        }
        let mut get_chunk_size = None;
        // SAFETY: each version's table has the layout declared for it.
        let (init, get_coll_info, finalize) = unsafe {
            match library.version {
                2 => entries(
                    library.table::<TunerTable<TunerInitV2, CollInfoV2>>(),
                    Init::V2,
                    CollInfo::V2,
                ),
                3 => entries(
                    library.table::<TunerTable<TunerInitV2, CollInfoV3>>(),
                    Init::V2,
                    CollInfo::V3,
                ),
                4 => entries(
                    library.table::<TunerTable<TunerInitV2, CollInfoV4>>(),
                    Init::V2,
                    CollInfo::V4,
                ),
                5 => entries(
                    library.table::<TunerTable<TunerInitV5, CollInfoV4>>(),
                    Init::V5,
                    CollInfo::V4,
                ),
                _ => {
                    let table = library.table::<TableV6>();
                    get_chunk_size = table.get_chunk_size;
                    entries(&table.v5, Init::V5, CollInfo::V4)
                }
            }
        };
        Tuner {
            library,
            init,
            get_coll_info,
            finalize,
            get_chunk_size,
        }
    }
}

/// The tuner of this process, loaded once by NCCL's rules: unset, the
/// net plug-in's library is tried after `libnccl-tuner.so`.
fn tuner() -> Option<&'static Tuner> {
    static TUNER: OnceLock<Option<Tuner>> = OnceLock::new();
    TUNER
        .get_or_init(|| {
            let var = rccl_env::var("NCCL_TUNER_PLUGIN");
            let fallback = if var.is_none() {
                net_library_names()
            } else {
                Vec::new()
            };
            let library = TUNER_PLUGIN.load(var.as_deref(), &fallback)?;
            crate::tuning::note_tuner_library_loaded();
            Some(Tuner::of(library))
        })
        .as_ref()
}

/// One communicator's context of the loaded tuner plug-in.
pub(crate) struct CTuner {
    tuner: &'static Tuner,
    /// The plug-in's context; calls on it are serialized.
    context: Mutex<PluginContext>,
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
    let tuner = tuner()?;
    let mut context: PluginContext = std::ptr::null_mut();
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
    let result = tuner.init.map(|init| unsafe {
        match init {
            Init::V2(f) => f(nranks, nnodes, log, &mut context),
            Init::V5(f) => f(
                &mut context,
                comm_hash,
                nranks,
                nnodes,
                log,
                &mut domains,
                &mut constants,
            ),
        }
    });
    match result {
        Some(0) => Some(CTuner {
            tuner,
            context: Mutex::new(context),
        }),
        other => {
            tracing::warn!(
                target: crate::debug::TUNING,
                "TUNER/Plugin {}: init {}; using the internal tuner",
                tuner.library.name,
                other.map_or("is missing".to_string(), |rc| format!("returned {rc}"))
            );
            None
        }
    }
}

impl CTuner {
    /// Asks `getCollInfo` for a collective of `func` on `bytes`: v3 to v6
    /// with the cost table, which the plug-in may change, v2 for the
    /// algorithm and protocol it names (NCCL's indices, -1 unnamed).
    /// Returns the channel count it set; `None` when the call failed.
    fn ask(
        &self,
        context: PluginContext,
        func: c_int,
        bytes: usize,
        table: &mut [[f32; NUM_PROTOCOLS]; NUM_ALGORITHMS],
        named: &mut (c_int, c_int),
    ) -> Option<c_int> {
        // NCCL hands the table as `float**` that plug-ins cast back to
        // `float (*)[NCCL_NUM_PROTOCOLS]`: the address of its first row.
        let table_arg = table.as_mut_ptr().cast::<*mut f32>();
        let mut nchannels: c_int = 0;
        let (algos, protos) = (NUM_ALGORITHMS as c_int, NUM_PROTOCOLS as c_int);
        // SAFETY: the plug-in's own entry points with its context, a table
        // of `algos` x `protos` floats and valid out-pointers (one rank
        // per host's share, no CollNet, no NVLS, no registered buffer).
        let result = self.tuner.get_coll_info.map(|get| unsafe {
            match get {
                CollInfo::V2(f) => f(
                    context,
                    func,
                    bytes,
                    0,
                    0,
                    1,
                    &mut named.0,
                    &mut named.1,
                    &mut nchannels,
                ),
                CollInfo::V3(f) => f(
                    context,
                    func,
                    bytes,
                    1,
                    table_arg,
                    algos,
                    protos,
                    &mut nchannels,
                ),
                CollInfo::V4(f) => f(
                    context,
                    func,
                    bytes,
                    1,
                    table_arg,
                    algos,
                    protos,
                    0,
                    &mut nchannels,
                ),
            }
        });
        (result == Some(0)).then_some(nchannels)
    }
}

/// The algorithm and protocol of a table's cheapest entry, of those the
/// plug-in left allowed.
fn cheapest(table: &[[f32; NUM_PROTOCOLS]; NUM_ALGORITHMS]) -> Option<(&'static str, Protocol)> {
    ALGORITHMS
        .iter()
        .flat_map(|&(name, row)| {
            Protocol::ALL
                .into_iter()
                .map(move |p| (name, p, table[row][protocol_index(p)]))
        })
        .filter(|&(_, _, cost)| cost >= 0.0)
        .min_by(|a, b| a.2.total_cmp(&b.2))
        .map(|(name, protocol, _)| (name, protocol))
}

impl TunerPlugin for CTuner {
    fn name(&self) -> &str {
        &self.tuner.library.name
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
        let mut table = [[IGNORE; NUM_PROTOCOLS]; NUM_ALGORITHMS];
        for cost in call.costs {
            let row = ALGORITHMS.iter().find(|(n, _)| *n == cost.algorithm);
            if let (Some((_, row)), Some(us)) = (row, cost.us) {
                table[*row][protocol_index(cost.protocol)] = us as f32;
            }
        }
        let offered = table;
        let mut named = (-1, -1);
        let nchannels = self.ask(
            *self.context.lock(),
            func,
            call.bytes,
            &mut table,
            &mut named,
        )?;
        let choice = if let Some(CollInfo::V2(_)) = self.tuner.get_coll_info {
            let algorithm = ALGORITHMS.iter().find(|(_, i)| *i as c_int == named.0);
            let protocol = Protocol::ALL
                .into_iter()
                .find(|p| protocol_index(*p) as c_int == named.1);
            // NCCL takes the algorithm and the protocol together.
            algorithm.zip(protocol).map(|((name, _), p)| (*name, p))
        } else if table != offered {
            cheapest(&table)
        } else {
            None
        };
        let mut hint = TunerHint::default();
        if let Some((algorithm, protocol)) = choice {
            hint.algorithm = Some(algorithm.to_string());
            hint.protocol = Some(protocol);
        }
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
        let get = self.tuner.get_chunk_size?;
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
        let result = self.tuner.finalize.map(|f| unsafe { f(context) });
        if let Some(rc) = result.filter(|&rc| rc != 0) {
            tracing::warn!(
                target: crate::debug::TUNING,
                "TUNER/Plugin {}: finalize returned {rc}",
                self.tuner.library.name
            );
        }
    }
}
