//! NCCL profiler plug-ins (`NCCL_PROFILER_PLUGIN`): a `.so` written for
//! NCCL's `ncclProfiler_v1` .. `_v6` interface sees this process's group,
//! collective and point-to-point events.
//!
//! Loading follows NCCL's rules (`rccl_env::load`): `NCCL_PROFILER_PLUGIN`
//! names the library, unset `libnccl-profiler.so`; `none`, nothing. When
//! none of those opens, the net plug-in's library (`NCCL_NET_PLUGIN`'s
//! rules) is asked for a profiler.
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
//! enqueued (as NCCL stops them after the kernel launch; with proxy
//! events, once the proxy is done, as below). A plug-in's
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
//! it is handed to the executor. A piece that arrives before this rank
//! starts its call is reported when the call starts. The operations stop,
//! their open steps first, and then the launch's collective and group
//! events, once the proxy has completed every send the launch published
//! (at the latest when the communicator goes), so that sends posted after
//! the call ended here are reported inside it. Only the first pieces a
//! connection receives before its observer is attached (as the connection
//! is made) go unreported. An operation's `nSteps` is 0 (unknown when its
//! first piece moves) and its `chunkSize` that piece's size.
//!
//! Not emitted: proxy events of sends and receives, proxy control, kernel
//! channels and kernel launches, network plug-in events and v6's
//! copy-engine events; `nWarps` is 0 and API events' `stream` is null.
//!
//! Without a plug-in a communicator holds `None`, and the only cost on a
//! call's path is the test of that field.
//!
//! Here: loading and each communicator's context; `abi` the interface's
//! layouts, `describe` the translation of a call into each version's
//! descriptor, `hooks` what the engine calls as calls are made and
//! launched, `proxy` the network proxy's events.

use std::ffi::c_int;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use rccl_algorithms::CollKind;
use rccl_env::load::{Kind, Library, Subsystem};
use rccl_env::logger;
use rccl_transports::network::net_library_names;

use abi::{
    Descr, Handle, NoData, Payload, PluginContext, ProfilerInitV1, ProfilerInitV4, ProfilerInitV5,
    ProfilerTable, StartFn, GROUP,
};
use proxy::{ProxyEvents, ProxyState};

mod abi;
mod describe;
mod hooks;
mod proxy;

pub(crate) use hooks::{ApiEvent, GroupApiEnd, LaunchEvents};

/// The profiler plug-in's kind.
const PROFILER_PLUGIN: Kind = Kind {
    file: "profiler",
    symbol: "ncclProfiler_v",
    interface: "ncclProfiler",
    versions: &[6, 5, 4, 3, 2, 1],
    subsystem: Subsystem::Init,
    without: "continuing without profiler",
};

/// The loaded profiler library and its table.
struct Profiler {
    library: Library,
    table: &'static ProfilerTable,
}

// SAFETY: the table is static data of a library that stays loaded; NCCL
// calls a profiler's functions from any thread.
unsafe impl Send for Profiler {}
// SAFETY: as above; nothing in `Profiler` changes after loading.
unsafe impl Sync for Profiler {}

/// The profiler of this process, loaded once by NCCL's rules.
fn profiler() -> Option<&'static Profiler> {
    static PROFILER: OnceLock<Option<Profiler>> = OnceLock::new();
    PROFILER
        .get_or_init(|| {
            let var = rccl_env::var("NCCL_PROFILER_PLUGIN");
            let library = PROFILER_PLUGIN.load(var.as_deref(), &net_library_names())?;
            // SAFETY: every version's table has the shape `ProfilerTable` declares.
            let table = unsafe { library.table::<ProfilerTable>() };
            Some(Profiler { library, table })
        })
        .as_ref()
}

impl Profiler {
    /// Records `state` of the open event `handle`, with its arguments.
    fn record(&self, handle: Handle, state: c_int, args: *mut std::ffi::c_void) {
        if let (false, Some(record)) = (handle.is_null(), self.table.record_event_state) {
            // SAFETY: an open handle of this plug-in, a state of its
            // interface and arguments (null or of that state) that live
            // for the call.
            unsafe { record(handle, state, args) };
        }
    }

    /// Stops the open event `handle`.
    fn stop(&self, handle: Handle) {
        if let (false, Some(stop)) = (handle.is_null(), self.table.stop_event) {
            // SAFETY: an open handle of this plug-in, stopped once, while
            // its context is alive.
            unsafe { stop(handle) };
        }
    }
}

/// Where a communicator's events start: its context of the plug-in and
/// its rank.
#[derive(Clone, Copy)]
struct Session {
    profiler: &'static Profiler,
    context: PluginContext,
    rank: c_int,
}

impl Session {
    /// Starts an event of type `kind` under `parent` with the union member
    /// `member`, in the descriptor of the plug-in's version; its handle,
    /// or the code the plug-in failed with.
    fn try_start<T: Copy>(&self, kind: u64, parent: Handle, member: T) -> Result<Handle, c_int> {
        let Some(start) = self.profiler.table.start_event else {
            return Ok(std::ptr::null_mut());
        };
        let data = Payload::new(member);
        let rank = self.rank;
        // The event type is 64 bits wide from v5 on, a byte before.
        if self.profiler.library.version >= 5 {
            self.start_descr(
                start,
                &mut Descr {
                    kind,
                    parent_obj: parent,
                    rank,
                    data,
                },
            )
        } else {
            self.start_descr(
                start,
                &mut Descr {
                    kind: kind as u8,
                    parent_obj: parent,
                    rank,
                    data,
                },
            )
        }
    }

    /// Calls the plug-in's `startEvent` with `descr`, of its version's
    /// layout; the handle, or the code the plug-in failed with.
    fn start_descr<K, T: Copy>(
        &self,
        start: StartFn,
        descr: &mut Descr<K, T>,
    ) -> Result<Handle, c_int> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: the plug-in's own entry point with its context, a valid
        // out-pointer and a descriptor of its version's layout that lives
        // for the call.
        let result = unsafe { start(self.context, &mut handle, std::ptr::from_mut(descr).cast()) };
        if result == 0 {
            Ok(handle)
        } else {
            Err(result)
        }
    }

    /// As [`Session::try_start`]; null when the plug-in failed.
    fn start<T: Copy>(&self, kind: u64, parent: Handle, member: T) -> Handle {
        self.try_start(kind, parent, member)
            .unwrap_or(std::ptr::null_mut())
    }

    /// As [`Session::start`], logging a failure.
    fn start_reported<T: Copy>(&self, kind: u64, parent: Handle, member: T) -> Handle {
        self.try_start(kind, parent, member).unwrap_or_else(|rc| {
            tracing::warn!(
                target: crate::debug::INIT,
                "[{}] PROFILER/Plugin {}: startEvent returned {rc}",
                self.rank,
                self.profiler.library.name
            );
            std::ptr::null_mut()
        })
    }

    /// Starts a group event.
    fn start_group(&self) -> Handle {
        self.start_reported(GROUP, std::ptr::null_mut(), NoData)
    }

    /// Releases the context, once.
    fn finalize(&self) {
        // SAFETY: the context this library's init gave, released once.
        let result = self
            .profiler
            .table
            .finalize
            .map(|f| unsafe { f(self.context) });
        if let Some(rc) = result.filter(|&rc| rc != 0) {
            tracing::warn!(
                target: crate::debug::INIT,
                "PROFILER/Plugin {}: finalize returned {rc}",
                self.profiler.library.name
            );
        }
    }
}

/// One communicator's context of the loaded profiler plug-in.
pub(crate) struct CProfiler {
    session: Session,
    /// The activation mask the plug-in set at init.
    mask: u64,
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
    let profiler = profiler()?;
    let table = profiler.table;
    let mut context: PluginContext = std::ptr::null_mut();
    let mut mask: c_int = 0;
    let (nnodes, nranks, rank) = (nnodes as c_int, nranks as c_int, rank as c_int);
    let name = std::ptr::null();
    let log = logger();
    // SAFETY: `init` is the plug-in's own, of the signature its version
    // declares, called with valid out-pointers.
    let result = table.init.map(|init| unsafe {
        match profiler.library.version {
            1..=3 => std::mem::transmute::<unsafe extern "C" fn(), ProfilerInitV1>(init)(
                &mut context,
                &mut mask,
            ),
            4 => std::mem::transmute::<unsafe extern "C" fn(), ProfilerInitV4>(init)(
                &mut context,
                &mut mask,
                name,
                comm_hash,
                nnodes,
                nranks,
                rank,
                log,
            ),
            _ => std::mem::transmute::<unsafe extern "C" fn(), ProfilerInitV5>(init)(
                &mut context,
                comm_hash,
                &mut mask,
                name,
                nnodes,
                nranks,
                rank,
                log,
            ),
        }
    });
    let session = Session {
        profiler,
        context,
        rank,
    };
    let usable = table.start_event.is_some() && table.stop_event.is_some();
    let why = match result {
        Some(0) if usable => {
            tracing::info!(
                target: crate::debug::INIT,
                "[{rank}] PROFILER/Plugin {}: event mask {mask:#x}",
                profiler.library.name
            );
            let mask = mask as u32 as u64;
            return Some(CProfiler {
                session,
                mask,
                comm_hash,
                seq_numbers: std::array::from_fn(|_| AtomicU64::new(0)),
                proxy: Arc::new(ProxyEvents {
                    session,
                    mask,
                    state: Mutex::new(ProxyState::default()),
                }),
            });
        }
        None => "has no init".to_string(),
        Some(0) => {
            session.finalize();
            "has no startEvent or stopEvent".to_string()
        }
        Some(rc) => format!("init returned {rc}"),
    };
    tracing::warn!(
        target: crate::debug::INIT,
        "[{rank}] PROFILER/Plugin {}: {why}; continuing without profiler",
        profiler.library.name
    );
    None
}

impl Drop for CProfiler {
    fn drop(&mut self) {
        // Observers that outlive the communicator report nothing more.
        self.proxy.close();
        self.session.finalize();
    }
}
