//! The plug-in host: a third-party NCCL net plug-in (`libnccl-net*.so`)
//! as a [`Net`] provider.
//!
//! Loading follows NCCL's rules. `NCCL_NET_PLUGIN` unset: `libnccl-net.so`
//! is tried. Set to a comma-separated list, each entry `X` is tried as
//! `X` itself (a file name or a path), then as `libnccl-net-X.so` (unless
//! it is a path or already a `lib*.so` name); `none` loads nothing. Of a
//! library, the newest of the symbols `ncclNetPlugin_v12` ..
//! `ncclNetPlugin_v8` is taken, and each version's table is adapted to
//! [`Net`]. A plug-in whose `init` fails, or that has no device, is passed
//! over with the reason (`NCCL_DEBUG=INFO`).
//!
//! The host keeps the contract of [`Net`] where the plug-in's C interface
//! cannot say it: it counts the requests in flight (32 receives, 32 times
//! `maxRecvs` sends), bounds every buffer by its registration, refuses a
//! request tested after it was done, and never hands the plug-in a request
//! of a communicator already closed (that request fails with
//! [`NetError::Aborted`]). A failed call becomes [`NetError::Plugin`] with
//! the code and the last warning the plug-in logged on this thread.
//! Plug-ins are called from several threads, as NCCL calls them (connection
//! setup on the caller's thread, transfers on the network proxy's).

pub mod abi;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::checks::{check_recv, check_unspent, nothing_to_flush, Registration};
use super::{
    CommRef, Endpoint, ListenHandle, MemoryType, Net, NetError, Properties, PtrSupport, RecvBuffer,
    Sizes, MAX_RECVS, NET_HANDLE_MAXSIZE, NET_MAX_REQUESTS,
};
use abi::{CommConfig, NcclResult, NetV10, NetV11, NetV12, NetV8, NetV9};
use rccl_env::logger;

/// The profiler callback plug-ins are given: no events are recorded.
unsafe extern "C" fn no_profiler(
    event: *mut *mut c_void,
    _kind: c_int,
    _parent: *mut c_void,
    _plugin_id: i64,
    _data: *mut c_void,
) -> NcclResult {
    if !event.is_null() {
        // SAFETY: the plug-in passes a valid out-pointer or null.
        unsafe { *event = null_mut() };
    }
    abi::SUCCESS
}

/// One version's table.
#[derive(Clone, Copy)]
enum Table {
    V8(&'static NetV8),
    V9(&'static NetV9),
    V10(&'static NetV10),
    V11(&'static NetV11),
    V12(&'static NetV12),
}

/// Runs `$body` with `$t` bound to the table, whatever its version (for
/// entries whose types every version shares).
macro_rules! each {
    ($table:expr, |$t:ident| $body:expr) => {
        match $table {
            Table::V8($t) => $body,
            Table::V9($t) => $body,
            Table::V10($t) => $body,
            Table::V11($t) => $body,
            Table::V12($t) => $body,
        }
    };
}

/// An entry of a table, or the error saying the plug-in lacks it.
macro_rules! entry {
    ($t:expr, $field:ident) => {
        $t.$field.ok_or_else(|| {
            NetError::InvalidArgument(format!("the net plug-in lacks {}", stringify!($field)))
        })?
    };
}

/// A loaded plug-in: its library (kept for the life of the process) and
/// its table.
pub struct Plugin {
    table: Table,
    name: &'static str,
    version: u32,
    /// Where it was loaded from.
    path: String,
    /// v8 to v10 are initialized once per process.
    process_init: OnceLock<Result<(), NetError>>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Plugin({} v{} from {})",
            self.name, self.version, self.path
        )
    }
}

/// The result of a plug-in call: `Ok` on success, else the error, with the
/// last warning the plug-in logged during the call.
fn check(
    code: NcclResult,
    plugin: &'static str,
    call: &'static str,
    peer: &str,
) -> Result<(), NetError> {
    let warning = rccl_env::take_warning();
    if code == abi::SUCCESS {
        return Ok(());
    }
    Err(NetError::Plugin {
        plugin,
        call,
        peer: peer.to_string(),
        code,
        message: warning.unwrap_or_else(|| "(the plug-in logged no warning)".into()),
    })
}

/// Forgets any warning left from an earlier call.
fn clear_warning() {
    rccl_env::take_warning();
}

/// The library names NCCL tries for one entry of `NCCL_NET_PLUGIN`
/// (`None`: the variable is unset).
pub fn library_names(entry: Option<&str>) -> Vec<String> {
    rccl_env::library_names("net", entry)
}

/// Every library name `NCCL_NET_PLUGIN` leads to, in the order they are
/// tried (other kinds of plug-in fall back to a net plug-in's library).
pub fn net_library_names() -> Vec<String> {
    let var = rccl_env::var("NCCL_NET_PLUGIN");
    entries(var.as_deref())
        .iter()
        .flat_map(|entry| library_names(entry.as_deref()))
        .collect()
}

/// The entries of `NCCL_NET_PLUGIN` (`None`: unset), in order; `none`
/// (any case) gives no entry.
fn entries(var: Option<&str>) -> Vec<Option<String>> {
    match var {
        None => vec![None],
        Some(v) if v.trim().eq_ignore_ascii_case("none") => Vec::new(),
        Some(v) => v
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| Some(e.to_string()))
            .collect(),
    }
}

impl Plugin {
    /// Loads the plug-in one entry of `NCCL_NET_PLUGIN` names (`None`: the
    /// default, `libnccl-net.so`), by NCCL's rules; the error says what
    /// was tried and why each failed.
    pub fn load(entry: Option<&str>) -> Result<Arc<Plugin>, String> {
        Plugin::load_version(entry, 12)
    }

    /// As [`Plugin::load`], taking the newest interface version up to
    /// `newest` (8 to 12): to check a plug-in at each version it exports.
    pub fn load_version(entry: Option<&str>, newest: u32) -> Result<Arc<Plugin>, String> {
        let mut tried = Vec::new();
        for name in library_names(entry) {
            // SAFETY: loading a library runs its initializers; a net
            // plug-in is made to be loaded into the process this way.
            match unsafe { libloading::Library::new(&name) } {
                Ok(library) => return Plugin::from_library(library, name, newest),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(format!("could not load {}", tried.join("; ")))
    }

    fn from_library(
        library: libloading::Library,
        path: String,
        newest: u32,
    ) -> Result<Arc<Plugin>, String> {
        // The library stays loaded for the life of the process: its
        // tables and comms are used until then.
        let library: &'static libloading::Library = Box::leak(Box::new(library));
        /// The symbol `name` as a table, if the library exports it.
        fn symbol<T>(library: &'static libloading::Library, name: &[u8]) -> Option<&'static T> {
            // SAFETY: an `ncclNetPlugin_vN` symbol is the plug-in's table
            // of version N, whose layout `T` declares; the library is never
            // unloaded.
            unsafe { library.get::<*const T>(name).ok().map(|s| &**s) }
        }
        let up_to = |v: u32| newest >= v;
        let table = None
            .or_else(|| {
                up_to(12)
                    .then(|| symbol::<NetV12>(library, b"ncclNetPlugin_v12\0").map(Table::V12))
                    .flatten()
            })
            .or_else(|| {
                up_to(11)
                    .then(|| symbol::<NetV11>(library, b"ncclNetPlugin_v11\0").map(Table::V11))
                    .flatten()
            })
            .or_else(|| {
                up_to(10)
                    .then(|| symbol::<NetV10>(library, b"ncclNetPlugin_v10\0").map(Table::V10))
                    .flatten()
            })
            .or_else(|| {
                up_to(9)
                    .then(|| symbol::<NetV9>(library, b"ncclNetPlugin_v9\0").map(Table::V9))
                    .flatten()
            })
            .or_else(|| symbol::<NetV8>(library, b"ncclNetPlugin_v8\0").map(Table::V8))
            .ok_or_else(|| {
                format!("{path} exports none of ncclNetPlugin_v12 .. ncclNetPlugin_v8")
            })?;
        let version = match table {
            Table::V8(_) => 8,
            Table::V9(_) => 9,
            Table::V10(_) => 10,
            Table::V11(_) => 11,
            Table::V12(_) => 12,
        };
        let name_ptr = each!(table, |t| t.name);
        let name = if name_ptr.is_null() {
            "plugin".to_string()
        } else {
            // SAFETY: the table's name is a NUL-terminated string.
            unsafe { CStr::from_ptr(name_ptr) }
                .to_string_lossy()
                .into_owned()
        };
        Ok(Arc::new(Plugin {
            table,
            name: Box::leak(name.into_boxed_str()),
            version,
            path,
            process_init: OnceLock::new(),
        }))
    }

    /// Its name (what `NCCL_NET` matches).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The interface version it was loaded at (8 to 12).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Initializes the plug-in for one communicator (v11 on: a context
    /// per communicator, `comm_id` its hash; earlier versions once per
    /// process) and checks that it has a device it can serve.
    pub fn open(self: &Arc<Plugin>, comm_id: u64) -> Result<PluginNet, NetError> {
        let plugin = self.name;
        let mut config = CommConfig {
            traffic_class: abi::TRAFFIC_CLASS_UNDEF,
        };
        let mut ctx: *mut c_void = null_mut();
        clear_warning();
        match self.table {
            Table::V11(t) => {
                // SAFETY: valid out-pointers; the logger and profiler
                // callback live for the whole process.
                let code = unsafe {
                    entry!(t, init)(&mut ctx, comm_id, &mut config, logger(), no_profiler)
                };
                check(code, plugin, "init", "")?;
            }
            Table::V12(t) => {
                // SAFETY: as above.
                let code = unsafe {
                    entry!(t, init)(&mut ctx, comm_id, &mut config, logger(), no_profiler)
                };
                check(code, plugin, "init", "")?;
            }
            table => self
                .process_init
                .get_or_init(|| {
                    // SAFETY: the logger and profiler callback live for the
                    // whole process.
                    let code = unsafe {
                        match table {
                            Table::V8(t) => entry!(t, init)(logger()),
                            Table::V9(t) => entry!(t, init)(logger()),
                            Table::V10(t) => entry!(t, init)(logger(), no_profiler),
                            _ => unreachable!("v11 on are initialized per communicator"),
                        }
                    };
                    check(code, plugin, "init", "")
                })
                .clone()?,
        }
        // Made before the checks below, so that failing them finalizes
        // the context (its Drop).
        let mut net = PluginNet {
            plugin: self.clone(),
            ctx,
            devices: 0,
            props: Vec::new(),
            next_comm: AtomicU64::new(0),
        };
        let mut ndev: c_int = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { each!(self.table, |t| entry!(t, devices)(&mut ndev)) };
        check(code, plugin, "devices", "")?;
        if ndev <= 0 {
            return Err(NetError::InvalidArgument(format!(
                "the net plug-in {plugin} has no device"
            )));
        }
        net.devices = ndev as usize;
        net.props = (0..net.devices)
            .map(|dev| net.read_properties(dev))
            .collect::<Result<_, _>>()?;
        Ok(net)
    }
}

/// The plug-ins `NCCL_NET_PLUGIN` names, loaded once per process; each
/// that failed to load is logged with the reason.
pub(crate) fn loaded() -> &'static [Arc<Plugin>] {
    static LOADED: OnceLock<Vec<Arc<Plugin>>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let var = rccl_env::var("NCCL_NET_PLUGIN");
        if let Some(var) = &var {
            tracing::info!(target: "INIT", "NCCL_NET_PLUGIN set by environment to {var}");
        }
        entries(var.as_deref())
            .into_iter()
            .filter_map(|entry| match Plugin::load(entry.as_deref()) {
                Ok(plugin) => {
                    tracing::info!(
                        target: "INIT",
                        "NET/Plugin: loaded {} (ncclNet v{}) from {}",
                        plugin.name, plugin.version, plugin.path
                    );
                    Some(plugin)
                }
                Err(why) => {
                    tracing::info!(target: "INIT", "NET/Plugin: no plug-in: {why}");
                    None
                }
            })
            .collect()
    })
}

/// A plug-in opened for one communicator.
pub struct PluginNet {
    plugin: Arc<Plugin>,
    /// The plug-in's context (v11 on; null before).
    ctx: *mut c_void,
    devices: usize,
    props: Vec<Properties>,
    /// Numbers the communicators, for messages.
    next_comm: AtomicU64,
}

// SAFETY: the context is the plug-in's; NCCL calls a plug-in from several
// threads (setup on the caller's, transfers on the proxy's), which its
// contract requires it to allow. The rest is owned data.
unsafe impl Send for PluginNet {}
// SAFETY: as above.
unsafe impl Sync for PluginNet {}

impl Drop for PluginNet {
    fn drop(&mut self) {
        let finalize = match self.plugin.table {
            Table::V11(t) => t.finalize,
            Table::V12(t) => t.finalize,
            _ => None,
        };
        if let Some(finalize) = finalize {
            // SAFETY: the context `init` made, finalized once; every
            // communicator holds the net, so none is left open.
            let _ = unsafe { finalize(self.ctx) };
        }
    }
}

/// What a communicator and its requests share.
struct CommState {
    raw: *mut c_void,
    peer: String,
    closed: AtomicBool,
    /// Requests posted and not yet done.
    in_flight: AtomicUsize,
    /// Why the communicator failed: later calls fail so too.
    failed: Mutex<Option<NetError>>,
    /// Requests dropped before they were done: tested until they are, so
    /// that later transfers still match.
    abandoned: Mutex<Vec<*mut c_void>>,
}

// SAFETY: `raw` and the abandoned requests are the plug-in's, usable from
// any thread (see PluginNet); the rest is atomics and mutexes.
unsafe impl Send for CommState {}
// SAFETY: as above.
unsafe impl Sync for CommState {}

impl CommState {
    fn new(raw: *mut c_void, peer: String) -> Arc<CommState> {
        Arc::new(CommState {
            raw,
            peer,
            closed: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            failed: Mutex::new(None),
            abandoned: Mutex::new(Vec::new()),
        })
    }

    /// Fails if the communicator is closed or failed.
    fn usable(&self) -> Result<(), NetError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(NetError::Aborted {
                peer: self.peer.clone(),
            });
        }
        match &*self.failed.lock() {
            Some(failed) => Err(failed.clone()),
            None => Ok(()),
        }
    }

    /// Records `err` as the communicator's failure and returns it.
    fn fail(&self, err: NetError) -> NetError {
        self.failed.lock().get_or_insert(err).clone()
    }
}

/// A listening communicator.
pub struct PluginListen {
    raw: *mut c_void,
    net: Option<(Table, &'static str)>,
}

// SAFETY: the plug-in's listening communicator, usable from any thread.
unsafe impl Send for PluginListen {}

impl Drop for PluginListen {
    fn drop(&mut self) {
        if let Some((table, _)) = self.net.take() {
            // SAFETY: the communicator `listen` made, closed once.
            let _ = unsafe { each!(table, |t| t.close_listen.map(|f| f(self.raw))) };
        }
    }
}

/// A sending or receiving communicator: closed when dropped, if
/// [`Net::close_send`] / [`Net::close_recv`] did not close it.
pub struct PluginComm {
    state: Arc<CommState>,
    table: Table,
    send: bool,
    max_recvs: usize,
}

impl Endpoint for PluginComm {
    fn peer(&self) -> String {
        self.state.peer.clone()
    }
}

impl PluginComm {
    fn close(&self) -> NcclResult {
        if self.state.closed.swap(true, Ordering::AcqRel) {
            return abi::SUCCESS;
        }
        let raw = self.state.raw;
        // Requests dropped pending belong to the communicator now ending.
        self.state.abandoned.lock().clear();
        // SAFETY: the communicator `connect` or `accept` made, closed once;
        // no request of it is handed to the plug-in after this.
        let code = unsafe {
            if self.send {
                each!(self.table, |t| t.close_send.map(|f| f(raw)))
            } else {
                each!(self.table, |t| t.close_recv.map(|f| f(raw)))
            }
        };
        code.unwrap_or(abi::SUCCESS)
    }

    /// Tests the requests dropped before they were done.
    fn reap(&self) {
        let mut abandoned = self.state.abandoned.lock();
        abandoned.retain(|&request| {
            let (mut done, mut sizes) = (0, [0 as c_int; MAX_RECVS]);
            // SAFETY: a request of this open communicator, not yet done.
            let code = unsafe {
                each!(self.table, |t| t.test.map(|f| f(
                    request,
                    &mut done,
                    sizes.as_mut_ptr()
                )))
            };
            code == Some(abi::SUCCESS) && done == 0
        });
    }
}

impl Drop for PluginComm {
    fn drop(&mut self) {
        self.close();
    }
}

/// A sending or receiving communicator (both are [`PluginComm`]).
pub type PluginSend = PluginComm;
/// A receiving communicator.
pub type PluginRecv = PluginComm;

/// A registration: the plug-in's handle and the bytes it covers.
pub struct PluginMr {
    raw: *mut c_void,
    start: usize,
    len: usize,
}

// SAFETY: the plug-in's handle, usable from any thread.
unsafe impl Send for PluginMr {}

impl Registration for PluginMr {
    fn bounds(&self) -> (usize, usize) {
        (self.start, self.len)
    }
}

/// A `connect` in progress: NCCL's plug-ins keep their stage in the handle,
/// so the same copy of it is passed to every call.
#[derive(Default)]
pub struct PluginConnect {
    handle: Option<Box<[u8; NET_HANDLE_MAXSIZE]>>,
}

/// A request in flight.
pub struct PluginRequest {
    raw: *mut c_void,
    comm: Arc<CommState>,
    table: Table,
    /// Buffers of a receive (sizes reported), 1 for a send, 0 for a flush.
    nbufs: usize,
    /// Counted in the communicator's requests in flight.
    counted: bool,
    spent: bool,
}

// SAFETY: the plug-in's request, usable from any thread.
unsafe impl Send for PluginRequest {}

impl Drop for PluginRequest {
    fn drop(&mut self) {
        if !self.spent && !self.raw.is_null() && !self.comm.closed.load(Ordering::Acquire) {
            self.comm.abandoned.lock().push(self.raw);
        }
        if self.counted && !self.spent {
            self.comm.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl PluginNet {
    fn read_properties(&self, dev: usize) -> Result<Properties, NetError> {
        let plugin = self.plugin.name;
        let dev_c = dev as c_int;
        /// Fields every version has.
        struct Common {
            name: *mut c_char,
            pci_path: *mut c_char,
            guid: u64,
            ptr_support: c_int,
            reg_is_global: c_int,
            force_flush: c_int,
            speed: c_int,
            port: c_int,
            latency: f32,
            max_comms: c_int,
            max_recvs: c_int,
            net_device_type: c_int,
            max_p2p_bytes: usize,
        }
        macro_rules! read {
            ($t:expr, $props:ty, |$p:ident| $max_p2p:expr, $force_flush:expr) => {{
                // SAFETY: plain C data; all-zero is a valid value.
                let mut $p: $props = unsafe { std::mem::zeroed() };
                // SAFETY: a valid out-pointer to the version's layout.
                let code = unsafe { entry!($t, get_properties)(dev_c, &mut $p) };
                check(code, plugin, "getProperties", "")?;
                Common {
                    name: $p.name,
                    pci_path: $p.pci_path,
                    guid: $p.guid,
                    ptr_support: $p.ptr_support,
                    reg_is_global: $p.reg_is_global,
                    force_flush: $force_flush,
                    speed: $p.speed,
                    port: $p.port,
                    latency: $p.latency,
                    max_comms: $p.max_comms,
                    max_recvs: $p.max_recvs,
                    net_device_type: $p.net_device_type,
                    max_p2p_bytes: $max_p2p,
                }
            }};
        }
        clear_warning();
        let p = match self.plugin.table {
            Table::V8(t) => read!(t, abi::PropertiesV8, |p| abi::MAX_NET_SIZE, 0),
            Table::V9(t) => read!(t, abi::PropertiesV10, |p| p.max_p2p_bytes, p.force_flush),
            Table::V10(t) => read!(t, abi::PropertiesV10, |p| p.max_p2p_bytes, p.force_flush),
            Table::V11(t) => read!(t, abi::PropertiesV11, |p| p.max_p2p_bytes, p.force_flush),
            Table::V12(t) => read!(t, abi::PropertiesV12, |p| p.max_p2p_bytes, p.force_flush),
        };
        if p.net_device_type != abi::NET_DEVICE_HOST {
            return Err(NetError::InvalidArgument(format!(
                "the net plug-in {plugin} offloads to the device (netDeviceType {}), which is not served",
                p.net_device_type
            )));
        }
        let text = |s: *mut c_char| {
            // SAFETY: the plug-in's strings are NUL-terminated or null.
            (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
        };
        Ok(Properties {
            name: text(p.name).unwrap_or_default(),
            pci_path: text(p.pci_path).map(PathBuf::from),
            guid: p.guid,
            ptr_support: PtrSupport {
                host: p.ptr_support & abi::PTR_HOST != 0,
                cuda: p.ptr_support & abi::PTR_CUDA != 0,
                dmabuf: p.ptr_support & abi::PTR_DMABUF != 0,
            },
            reg_is_global: p.reg_is_global != 0,
            force_flush: p.force_flush != 0,
            speed_mbps: p.speed.max(0) as u32,
            port: p.port.max(0) as u32,
            latency_us: p.latency,
            max_comms: p.max_comms.max(0) as usize,
            max_recvs: (p.max_recvs.max(1) as usize).min(MAX_RECVS),
            max_p2p_bytes: p.max_p2p_bytes as u64,
        })
    }

    fn device(&self, dev: usize) -> Result<&Properties, NetError> {
        self.props.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!(
                "no device {dev} in the net plug-in {} (there are {})",
                self.plugin.name, self.devices
            ))
        })
    }

    fn comm(&self, raw: *mut c_void, send: bool, max_recvs: usize) -> PluginComm {
        let n = self.next_comm.fetch_add(1, Ordering::Relaxed);
        let side = if send { "send" } else { "receive" };
        PluginComm {
            state: CommState::new(
                raw,
                format!("the peer of {} {side} comm {n}", self.plugin.name),
            ),
            table: self.plugin.table,
            send,
            max_recvs,
        }
    }

    fn request(
        &self,
        raw: *mut c_void,
        comm: &PluginComm,
        nbufs: usize,
        counted: bool,
    ) -> PluginRequest {
        if counted {
            comm.state.in_flight.fetch_add(1, Ordering::AcqRel);
        }
        PluginRequest {
            raw,
            comm: comm.state.clone(),
            table: comm.table,
            nbufs,
            counted,
            spent: false,
        }
    }
}

impl Net for PluginNet {
    type ListenComm = PluginListen;
    type ConnectStage = PluginConnect;
    type SendComm = PluginSend;
    type RecvComm = PluginRecv;
    type MemHandle = PluginMr;
    type Request = PluginRequest;

    fn name(&self) -> &'static str {
        self.plugin.name
    }

    fn devices(&self) -> usize {
        self.devices
    }

    fn properties(&self, dev: usize) -> Result<Properties, NetError> {
        self.device(dev).cloned()
    }

    fn listen(&self, dev: usize) -> Result<(ListenHandle, PluginListen), NetError> {
        self.device(dev)?;
        let mut handle = [0u8; NET_HANDLE_MAXSIZE];
        let (mut raw, dev_c, h) = (null_mut(), dev as c_int, handle.as_mut_ptr().cast());
        clear_warning();
        // SAFETY: a handle buffer of NCCL_NET_HANDLE_MAXSIZE bytes and a
        // valid out-pointer.
        let code = unsafe {
            match self.plugin.table {
                Table::V11(t) => entry!(t, listen)(self.ctx, dev_c, h, &mut raw),
                Table::V12(t) => entry!(t, listen)(self.ctx, dev_c, h, &mut raw),
                Table::V8(t) => entry!(t, listen)(dev_c, h, &mut raw),
                Table::V9(t) => entry!(t, listen)(dev_c, h, &mut raw),
                Table::V10(t) => entry!(t, listen)(dev_c, h, &mut raw),
            }
        };
        check(code, self.plugin.name, "listen", "")?;
        Ok((
            ListenHandle::from_bytes(&handle)?,
            PluginListen {
                raw,
                net: Some((self.plugin.table, self.plugin.name)),
            },
        ))
    }

    fn connect(
        &self,
        dev: usize,
        handle: &ListenHandle,
        stage: &mut PluginConnect,
    ) -> Result<Option<PluginSend>, NetError> {
        let max_recvs = self.device(dev)?.max_recvs;
        let copy = stage.handle.get_or_insert_with(|| {
            let mut copy = Box::new([0u8; NET_HANDLE_MAXSIZE]);
            copy[..handle.as_bytes().len()].copy_from_slice(handle.as_bytes());
            copy
        });
        let (mut raw, mut dev_comm) = (null_mut(), null_mut());
        let (dev_c, h) = (dev as c_int, copy.as_mut_ptr().cast());
        let mut config = CommConfig {
            traffic_class: abi::TRAFFIC_CLASS_UNDEF,
        };
        clear_warning();
        // SAFETY: the handle copy is NCCL_NET_HANDLE_MAXSIZE bytes kept
        // across calls, as the plug-in expects; valid out-pointers.
        let code = unsafe {
            match self.plugin.table {
                Table::V8(t) => entry!(t, connect)(dev_c, h, &mut raw, &mut dev_comm),
                Table::V9(t) => entry!(t, connect)(dev_c, h, &mut raw, &mut dev_comm),
                Table::V10(t) => entry!(t, connect)(dev_c, &mut config, h, &mut raw, &mut dev_comm),
                Table::V11(t) => entry!(t, connect)(self.ctx, dev_c, h, &mut raw, &mut dev_comm),
                Table::V12(t) => entry!(t, connect)(self.ctx, dev_c, h, &mut raw, &mut dev_comm),
            }
        };
        if let Err(e) = check(code, self.plugin.name, "connect", "the listener") {
            stage.handle = None;
            return Err(e);
        }
        if raw.is_null() {
            return Ok(None);
        }
        stage.handle = None;
        Ok(Some(self.comm(raw, true, max_recvs)))
    }

    fn accept(&self, listen: &mut PluginListen) -> Result<Option<PluginRecv>, NetError> {
        let max_recvs = self.device(0)?.max_recvs;
        let (mut raw, mut dev_comm) = (null_mut(), null_mut());
        clear_warning();
        // SAFETY: the listening communicator `listen` made; valid
        // out-pointers.
        let code = unsafe {
            each!(self.plugin.table, |t| entry!(t, accept)(
                listen.raw,
                &mut raw,
                &mut dev_comm
            ))
        };
        check(code, self.plugin.name, "accept", "")?;
        Ok((!raw.is_null()).then(|| self.comm(raw, false, max_recvs)))
    }

    unsafe fn reg_mr(
        &self,
        comm: CommRef<'_, Self>,
        data: *mut u8,
        size: usize,
        memory: MemoryType,
    ) -> Result<PluginMr, NetError> {
        let comm = match comm {
            CommRef::Send(c) | CommRef::Recv(c) => c,
        };
        comm.state.usable()?;
        let support = self.device(0)?.ptr_support;
        let supported = match memory {
            MemoryType::Host => support.host,
            MemoryType::Cuda => support.cuda,
            MemoryType::DmaBuf { .. } => support.dmabuf,
        };
        if !supported {
            return Err(NetError::Unsupported {
                net: self.plugin.name,
                memory,
            });
        }
        let mut raw = null_mut();
        clear_warning();
        // SAFETY: the caller keeps the bytes valid for the registration
        // (this function's contract); valid out-pointer.
        let code = unsafe {
            match memory {
                MemoryType::DmaBuf { fd, offset } => {
                    each!(self.plugin.table, |t| entry!(t, reg_mr_dma_buf)(
                        comm.state.raw,
                        data.cast(),
                        size,
                        abi::PTR_CUDA,
                        offset,
                        fd,
                        &mut raw
                    ))
                }
                _ => {
                    let kind = if memory == MemoryType::Host {
                        abi::PTR_HOST
                    } else {
                        abi::PTR_CUDA
                    };
                    each!(self.plugin.table, |t| entry!(t, reg_mr)(
                        comm.state.raw,
                        data.cast(),
                        size,
                        kind,
                        &mut raw
                    ))
                }
            }
        };
        check(code, self.plugin.name, "regMr", &comm.state.peer)?;
        Ok(PluginMr {
            raw,
            start: data as usize,
            len: size,
        })
    }

    fn dereg_mr(&self, comm: CommRef<'_, Self>, mhandle: PluginMr) -> Result<(), NetError> {
        let comm = match comm {
            CommRef::Send(c) | CommRef::Recv(c) => c,
        };
        if comm.state.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        clear_warning();
        // SAFETY: a registration `reg_mr` made on this open communicator.
        let code = unsafe {
            each!(self.plugin.table, |t| entry!(t, dereg_mr)(
                comm.state.raw,
                mhandle.raw
            ))
        };
        check(code, self.plugin.name, "deregMr", &comm.state.peer)
    }

    fn isend(
        &self,
        comm: &mut PluginSend,
        data: *const u8,
        size: usize,
        tag: i32,
        mhandle: &PluginMr,
    ) -> Result<Option<PluginRequest>, NetError> {
        mhandle.check(data as usize, size)?;
        comm.state.usable()?;
        comm.reap();
        let limit = NET_MAX_REQUESTS * comm.max_recvs;
        if comm.state.in_flight.load(Ordering::Acquire) >= limit {
            return Err(NetError::TooManyRequests { limit });
        }
        let (raw, d, mh) = (comm.state.raw, data as *mut c_void, mhandle.raw);
        let mut request = null_mut();
        clear_warning();
        // SAFETY: the bytes lie in the registration (checked), which the
        // caller keeps valid while the send is pending; valid out-pointer.
        let code = unsafe {
            match self.plugin.table {
                Table::V8(t) => {
                    let size = c_int::try_from(size).map_err(|_| {
                        NetError::InvalidArgument(format!(
                            "a send of {size} bytes exceeds a v8 plug-in's int sizes"
                        ))
                    })?;
                    entry!(t, isend)(raw, d, size, tag, mh, &mut request)
                }
                Table::V9(t) => entry!(t, isend)(raw, d, size, tag, mh, &mut request),
                Table::V10(t) => entry!(t, isend)(raw, d, size, tag, mh, null_mut(), &mut request),
                Table::V11(t) => entry!(t, isend)(raw, d, size, tag, mh, null_mut(), &mut request),
                Table::V12(t) => entry!(t, isend)(raw, d, size, tag, mh, null_mut(), &mut request),
            }
        };
        check(code, self.plugin.name, "isend", &comm.state.peer).map_err(|e| comm.state.fail(e))?;
        Ok((!request.is_null()).then(|| self.request(request, comm, 1, true)))
    }

    fn irecv(
        &self,
        comm: &mut PluginRecv,
        buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<PluginRequest>, NetError> {
        check_recv(buffers, comm.max_recvs)?;
        comm.state.usable()?;
        comm.reap();
        if comm.state.in_flight.load(Ordering::Acquire) >= NET_MAX_REQUESTS {
            return Err(NetError::TooManyRequests {
                limit: NET_MAX_REQUESTS,
            });
        }
        let n = buffers.len();
        let mut data = [null_mut::<c_void>(); MAX_RECVS];
        let mut sizes = [0usize; MAX_RECVS];
        let mut int_sizes = [0 as c_int; MAX_RECVS];
        let mut tags = [0 as c_int; MAX_RECVS];
        let mut mhandles = [null_mut::<c_void>(); MAX_RECVS];
        let mut phandles = [null_mut::<c_void>(); MAX_RECVS];
        for (i, b) in buffers.iter().enumerate() {
            data[i] = b.data.cast();
            sizes[i] = b.size;
            int_sizes[i] = c_int::try_from(b.size).unwrap_or(c_int::MAX);
            tags[i] = b.tag;
            mhandles[i] = b.mhandle.raw;
        }
        let (raw, n_c) = (comm.state.raw, n as c_int);
        let (d, t, m) = (data.as_mut_ptr(), tags.as_mut_ptr(), mhandles.as_mut_ptr());
        let (s, p) = (sizes.as_mut_ptr(), phandles.as_mut_ptr());
        let mut request = null_mut();
        clear_warning();
        // SAFETY: every buffer lies in its registration (checked), which
        // the caller leaves to the receive while it is pending; the arrays
        // hold `n` entries; valid out-pointer.
        let code = unsafe {
            match self.plugin.table {
                Table::V8(tb) => {
                    entry!(tb, irecv)(raw, n_c, d, int_sizes.as_mut_ptr(), t, m, &mut request)
                }
                Table::V9(tb) => entry!(tb, irecv)(raw, n_c, d, s, t, m, &mut request),
                Table::V10(tb) => entry!(tb, irecv)(raw, n_c, d, s, t, m, p, &mut request),
                Table::V11(tb) => entry!(tb, irecv)(raw, n_c, d, s, t, m, p, &mut request),
                Table::V12(tb) => entry!(tb, irecv)(raw, n_c, d, s, t, m, p, &mut request),
            }
        };
        check(code, self.plugin.name, "irecv", &comm.state.peer).map_err(|e| comm.state.fail(e))?;
        Ok((!request.is_null()).then(|| self.request(request, comm, n, true)))
    }

    fn iflush(
        &self,
        comm: &mut PluginRecv,
        buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<PluginRequest>, NetError> {
        comm.state.usable()?;
        let n = buffers.len().min(MAX_RECVS);
        let mut data = [null_mut::<c_void>(); MAX_RECVS];
        let mut sizes = [0 as c_int; MAX_RECVS];
        let mut mhandles = [null_mut::<c_void>(); MAX_RECVS];
        for (i, b) in buffers.iter().take(n).enumerate() {
            data[i] = b.data.cast();
            sizes[i] = c_int::try_from(b.size).unwrap_or(c_int::MAX);
            mhandles[i] = b.mhandle.raw;
        }
        let Some(iflush) = each!(self.plugin.table, |t| t.iflush) else {
            // No flush entry: the plug-in moves host memory only.
            return nothing_to_flush(self.request(null_mut(), comm, 0, false));
        };
        let mut request = null_mut();
        clear_warning();
        // SAFETY: arrays of `n` entries; valid out-pointer.
        let code = unsafe {
            iflush(
                comm.state.raw,
                n as c_int,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhandles.as_mut_ptr(),
                &mut request,
            )
        };
        check(code, self.plugin.name, "iflush", &comm.state.peer)?;
        // A null request from a successful flush means nothing to wait for.
        Ok(Some(self.request(request, comm, 0, false)))
    }

    fn test(&self, request: &mut PluginRequest) -> Result<Option<Sizes>, NetError> {
        check_unspent(request.spent)?;
        request.comm.usable()?;
        let done_now = |request: &mut PluginRequest, sizes: &[usize]| {
            request.spent = true;
            if request.counted {
                request.comm.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            Ok(Some(Sizes::new(sizes)))
        };
        if request.raw.is_null() {
            return done_now(request, &[]);
        }
        let (mut done, mut sizes) = (0 as c_int, [0 as c_int; MAX_RECVS]);
        clear_warning();
        // SAFETY: a request of an open communicator, not yet done; `sizes`
        // has room for every buffer of a receive.
        let code = unsafe {
            each!(request.table, |t| entry!(t, test)(
                request.raw,
                &mut done,
                sizes.as_mut_ptr()
            ))
        };
        check(code, self.plugin.name, "test", &request.comm.peer)
            .map_err(|e| request.comm.fail(e))?;
        if done == 0 {
            return Ok(None);
        }
        let mut real = [0usize; MAX_RECVS];
        for (r, s) in real.iter_mut().zip(sizes).take(request.nbufs) {
            *r = s.max(0) as usize;
        }
        let nbufs = request.nbufs;
        done_now(request, &real[..nbufs])
    }

    fn close_send(&self, comm: PluginSend) -> Result<(), NetError> {
        clear_warning();
        let code = comm.close();
        check(code, self.plugin.name, "closeSend", &comm.state.peer)
    }

    fn close_recv(&self, comm: PluginRecv) -> Result<(), NetError> {
        clear_warning();
        let code = comm.close();
        check(code, self.plugin.name, "closeRecv", &comm.state.peer)
    }

    fn close_listen(&self, mut comm: PluginListen) -> Result<(), NetError> {
        let Some((table, name)) = comm.net.take() else {
            return Ok(());
        };
        clear_warning();
        // SAFETY: the communicator `listen` made, closed once.
        let code = unsafe { each!(table, |t| entry!(t, close_listen)(comm.raw)) };
        check(code, name, "closeListen", "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_follow_nccls_rules() {
        assert_eq!(library_names(None), ["libnccl-net.so"]);
        assert_eq!(
            library_names(Some("aws-ofi")),
            ["aws-ofi", "libnccl-net-aws-ofi.so"]
        );
        assert_eq!(
            library_names(Some("/opt/x/libfoo.so")),
            ["/opt/x/libfoo.so"]
        );
        assert_eq!(library_names(Some("libfoo.so")), ["libfoo.so"]);
        assert_eq!(entries(None), [None]);
        assert!(entries(Some("NONE")).is_empty());
        assert_eq!(
            entries(Some("a, b")),
            [Some("a".to_string()), Some("b".to_string())]
        );
    }

    #[test]
    fn a_missing_plugin_says_what_was_tried() {
        let err = Plugin::load(Some("surely-absent")).unwrap_err();
        assert!(
            err.contains("libnccl-net-surely-absent.so") && err.contains("surely-absent:"),
            "{err}"
        );
    }
}
