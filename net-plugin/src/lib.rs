//! `libnccl-net-rcclrs.so`: rccl-rs's IB and Socket networks as an NCCL
//! net plug-in, exported as `ncclNetPlugin_v8` .. `ncclNetPlugin_v12`, so
//! that NVIDIA's NCCL (`NCCL_NET_PLUGIN=rcclrs`) or rccl-rs's own plug-in
//! host can load it. Its name is `rcclrs` (what `NCCL_NET` matches),
//! whichever network it runs.
//!
//! - **Network**: one per process, chosen by the first `init`, as NVIDIA's
//!   RDMA plug-in chooses: `NCCL_PLUGIN_P2P=ib` or `socket`; unset, IB
//!   where it opens (a device, `NCCL_IB_HCA` and the other `NCCL_IB_*`
//!   settings as rccl-rs reads them; the verbs model under
//!   `RCCL_IB_MODEL=1`), else Socket, saying at `NCCL_DEBUG=INFO` why IB
//!   was passed over. Any other value fails `init`, which makes NCCL fall
//!   back to its own networks.
//! - **Devices**: IB's ports (`mlx5_0:1`, with their PCI paths and GUIDs),
//!   or for Socket one, the interface `NCCL_SOCKET_IFNAME` /
//!   `NCCL_SOCKET_FAMILY` select (as rccl-rs's bootstrap chooses it).
//! - **Authentication**: connections run the network's HMAC handshake.
//!   From v11 on, its key is derived from the `commId` NCCL gives `init` (a
//!   hash of the communicator's unique id), so only members of the
//!   communicator connect; v8 to v10 give no such id, and the key is one
//!   constant: the random listener id in each handle (which travels by
//!   NCCL's bootstrap) is then what a connecting side must know.
//! - **Errors**: every entry returns an `ncclResult_t` and logs the reason
//!   as a warning through the logger `init` was given; no panic crosses
//!   the C boundary (each entry runs under `catch_unwind`).
//! - **Handles**: a listen handle holds the network's handle length and
//!   bytes, then a pointer to the state of a `connect` in progress (NCCL
//!   passes the same handle to every `connect` call of one connection, as
//!   its own plug-ins expect).

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rccl_transports::auth_tcp::Secret;
use rccl_transports::network::abi::{self, NcclResult};
use rccl_transports::network::Ib;
use rccl_transports::network::{
    CommRef, ListenHandle, MemoryType, Net, NetError, RecvBuffer, MAX_RECVS, NET_HANDLE_MAXSIZE,
};
use rccl_transports::network::{Socket, SocketDevice};

/// The plug-in's name.
const NAME: &CStr = c"rcclrs";
/// The largest transfer (NCCL's `NCCL_MAX_NET_SIZE_BYTES`).
const MAX_BYTES: usize = 1 << 40;
/// Which network the plug-in runs: `ib` or `socket` (the variable NVIDIA's
/// RDMA plug-in reads for the same choice).
const P2P_VAR: &str = "NCCL_PLUGIN_P2P";

/// The logger NCCL gave `init` (its address; 0 before).
static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// Logs `message` through NCCL's logger at `level`.
fn log(level: c_int, message: &str) {
    let logger = LOGGER.load(Ordering::Acquire);
    if logger == 0 {
        return;
    }
    // SAFETY: LOGGER only ever holds a `Logger` that `init` was given.
    let logger: abi::Logger = unsafe { std::mem::transmute::<usize, abi::Logger>(logger) };
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: NCCL's logger takes a printf format; "%s" with one string.
    unsafe {
        logger(
            level,
            abi::SUBSYS_INIT | abi::SUBSYS_NET,
            c"net-plugin".as_ptr(),
            0,
            c"NET/rcclrs: %s".as_ptr(),
            text.as_ptr(),
        )
    };
}

/// What an error becomes: NCCL's code, with the reason logged.
fn code_of(err: &NetError) -> NcclResult {
    log(abi::LOG_WARN, &err.to_string());
    match err {
        NetError::Closed { .. } => abi::REMOTE_ERROR,
        NetError::Io { .. } | NetError::Aborted { .. } | NetError::Refused { .. } => {
            abi::SYSTEM_ERROR
        }
        NetError::Unsupported { .. } | NetError::InvalidArgument(_) => abi::INVALID_ARGUMENT,
        _ => abi::INTERNAL_ERROR,
    }
}

/// Runs an entry's body: its error or panic becomes an `ncclResult_t`.
fn guard(body: impl FnOnce() -> Result<(), NetError>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => abi::SUCCESS,
        Ok(Err(e)) => code_of(&e),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            log(abi::LOG_WARN, &format!("internal error: {why}"));
            abi::INTERNAL_ERROR
        }
    }
}

fn invalid(what: &str) -> NetError {
    NetError::InvalidArgument(what.to_string())
}

/// This host's interface, chosen once.
fn device() -> Result<&'static SocketDevice, NetError> {
    static DEVICE: OnceLock<Result<SocketDevice, String>> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let ip = rccl_transports::host::host_address().map_err(|e| e.to_string())?;
            Ok(SocketDevice {
                name: ip.to_string(),
                ip,
            })
        })
        .as_ref()
        .map_err(|e| invalid(e))
}

/// The handshake key: from the communicator's id where NCCL gives one.
fn secret(comm_id: Option<u64>) -> Secret {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new().chain_update(b"rccl-rs net plug-in secret");
    if let Some(id) = comm_id {
        hash.update(id.to_le_bytes());
    }
    Secret(hash.finalize().into())
}

/// The networks the plug-in can run; every object it hands NCCL starts
/// with one, so that an entry knows which network's object it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Socket = 1,
    Ib = 2,
}

/// A network of either kind: the process's, or a v11+ context.
#[derive(Clone)]
enum AnyNet {
    Socket(Arc<Socket>),
    Ib(Arc<Ib>),
}

/// Calls the generic `$f::<N>(net, args..)` with the network `$net` holds.
macro_rules! with_net {
    ($net:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $net {
            AnyNet::Socket(net) => $f(net, $($arg),*),
            AnyNet::Ib(net) => $f(net, $($arg),*),
        }
    };
}

/// Calls the generic `$f::<N>(args..)` for the network of the object at
/// `$object` (a pointer this plug-in handed out).
macro_rules! by_kind {
    ($object:expr, $f:ident($($arg:expr),* $(,)?)) => {
        // SAFETY: NCCL passes objects this plug-in made (or null).
        match unsafe { kind_of($object)? } {
            Kind::Socket => $f::<Socket>($($arg),*),
            Kind::Ib => $f::<Ib>($($arg),*),
        }
    };
}

/// What the plug-in needs of a network beyond [`Net`].
trait Exported: Net + Sized {
    const KIND: Kind;
    /// Opens the network on this host's interface.
    fn open(comm_id: Option<u64>) -> Result<Arc<Self>, NetError>;
    fn any(net: Arc<Self>) -> AnyNet;
}

impl Exported for Socket {
    const KIND: Kind = Kind::Socket;
    fn open(comm_id: Option<u64>) -> Result<Arc<Socket>, NetError> {
        Ok(Arc::new(Socket::new(
            vec![device()?.clone()],
            secret(comm_id),
        )?))
    }
    fn any(net: Arc<Socket>) -> AnyNet {
        AnyNet::Socket(net)
    }
}

impl Exported for Ib {
    const KIND: Kind = Kind::Ib;
    /// IB as rccl-rs opens it (`NCCL_IB_HCA` and the other `NCCL_IB_*`
    /// settings; the verbs model under `RCCL_IB_MODEL=1`).
    fn open(comm_id: Option<u64>) -> Result<Arc<Ib>, NetError> {
        Ib::from_env(device()?.ip, secret(comm_id))
            .map(Arc::new)
            .map_err(|why| NetError::InvalidArgument(format!("IB unavailable: {why}")))
    }
    fn any(net: Arc<Ib>) -> AnyNet {
        AnyNet::Ib(net)
    }
}

impl AnyNet {
    /// A new network of the same kind (a v11+ context's).
    fn open_like(&self, comm_id: Option<u64>) -> Result<AnyNet, NetError> {
        fn again<N: Exported>(_: &Arc<N>, comm_id: Option<u64>) -> Result<AnyNet, NetError> {
            N::open(comm_id).map(N::any)
        }
        with_net!(self, again(comm_id))
    }
}

/// The network `NCCL_PLUGIN_P2P` names, or else IB where it opens and
/// Socket otherwise (NCCL's own order), saying why IB was passed over.
fn choose() -> Result<AnyNet, NetError> {
    let wanted = std::env::var(P2P_VAR).ok().filter(|v| !v.is_empty());
    let net = match wanted.as_deref() {
        Some(w) if w.eq_ignore_ascii_case("ib") => AnyNet::Ib(Ib::open(None)?),
        Some(w) if w.eq_ignore_ascii_case("socket") => AnyNet::Socket(Socket::open(None)?),
        Some(w) => {
            return Err(invalid(&format!(
                "{P2P_VAR}={w}: the networks of this plug-in are ib and socket"
            )))
        }
        None => match Ib::open(None) {
            Ok(ib) => AnyNet::Ib(ib),
            Err(why) => {
                log(abi::LOG_INFO, &format!("NET/IB not used: {why}"));
                AnyNet::Socket(Socket::open(None)?)
            }
        },
    };
    fn describe<N: Net>(net: &Arc<N>) -> String {
        let devices: Vec<String> = (0..net.devices())
            .map(|dev| {
                net.properties(dev)
                    .map_or_else(|e| e.to_string(), |p| p.name)
            })
            .collect();
        format!("using {} ({})", net.name(), devices.join(", "))
    }
    log(abi::LOG_INFO, &with_net!(&net, describe()));
    Ok(net)
}

/// The process's network, chosen by the first `init`: the network of v8
/// to v10, and what `devices` and `getProperties` (which have no context)
/// describe from v11 on, where it also fixes each context's kind.
static PROCESS_NET: Mutex<Option<AnyNet>> = Mutex::new(None);

/// The process's network, chosen and opened by the first call.
fn init_process_net() -> Result<AnyNet, NetError> {
    let mut net = PROCESS_NET.lock().unwrap_or_else(|e| e.into_inner());
    if net.is_none() {
        *net = Some(choose()?);
    }
    Ok(net.clone().expect("set above"))
}

fn process_net() -> Result<AnyNet, NetError> {
    PROCESS_NET
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| invalid("the plug-in was used before init"))
}

/// A v11+ context: the communicator's network.
///
/// # Safety
/// `ctx` is a context `init` made and `finalize` has not ended.
unsafe fn ctx_net(ctx: *mut c_void) -> Result<AnyNet, NetError> {
    if ctx.is_null() {
        return Err(invalid("a null context"));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { &*(ctx as *const AnyNet) }.clone())
}

/// An object handed to NCCL: its network's kind first.
#[repr(C)]
struct Object<T> {
    kind: Kind,
    value: T,
}

/// The kind of the object at `p`.
///
/// # Safety
/// `p` is null or an object [`raw`] made and not yet freed.
unsafe fn kind_of(p: *mut c_void) -> Result<Kind, NetError> {
    if p.is_null() {
        return Err(invalid("a null communicator, request or registration"));
    }
    // SAFETY: the caller's contract; `kind` is the first field of the
    // `repr(C)` Object, read as its byte.
    match unsafe { *p.cast::<u8>() } {
        1 => Ok(Kind::Socket),
        2 => Ok(Kind::Ib),
        _ => Err(invalid("not an object of this plug-in")),
    }
}

/// A boxed value of network `N` as NCCL's opaque pointer.
fn raw<N: Exported, T>(value: T) -> *mut c_void {
    Box::into_raw(Box::new(Object {
        kind: N::KIND,
        value,
    }))
    .cast()
}

/// # Safety
/// `p` is a non-null pointer `raw::<_, T>` made and not yet freed.
unsafe fn get<'a, T>(p: *mut c_void) -> Result<&'a mut T, NetError> {
    if p.is_null() {
        return Err(invalid("a null communicator or handle"));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { &mut (*p.cast::<Object<T>>()).value })
}

/// Frees what `raw::<_, T>` made.
///
/// # Safety
/// As [`get`]; `p` is not used again.
unsafe fn take<T>(p: *mut c_void) -> Result<T, NetError> {
    if p.is_null() {
        return Err(invalid("a null communicator, request or registration"));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { Box::from_raw(p.cast::<Object<T>>()) }.value)
}

/// A sending or receiving communicator, as NCCL holds it.
struct Comm<N: Net> {
    net: Arc<N>,
    side: Side<N>,
}

enum Side<N: Net> {
    Send(N::SendComm),
    Recv(N::RecvComm),
}

impl<N: Net> Comm<N> {
    fn as_ref(&self) -> CommRef<'_, N> {
        match &self.side {
            Side::Send(s) => CommRef::Send(s),
            Side::Recv(r) => CommRef::Recv(r),
        }
    }
}

struct Listen<N: Net> {
    net: Arc<N>,
    listen: N::ListenComm,
}

struct Request<N: Net> {
    net: Arc<N>,
    request: N::Request,
}

/// Writes `value` through an out-pointer.
fn put<T>(out: *mut T, value: T) -> Result<(), NetError> {
    if out.is_null() {
        return Err(invalid("a null out-pointer"));
    }
    // SAFETY: non-null out-pointers from NCCL are valid for a write.
    unsafe { out.write(value) };
    Ok(())
}

/// A device number from NCCL.
fn dev_index(dev: c_int) -> Result<usize, NetError> {
    usize::try_from(dev).map_err(|_| invalid("a negative device"))
}

/// Bytes of the handle before the connect state's pointer.
const HANDLE_BODY: usize = NET_HANDLE_MAXSIZE - std::mem::size_of::<usize>();

fn listen_on<N: Exported>(
    net: &Arc<N>,
    dev: c_int,
    handle: *mut c_void,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    if handle.is_null() {
        return Err(invalid("listen: a null handle"));
    }
    let (ours, listen) = net.listen(dev_index(dev)?)?;
    let bytes = ours.as_bytes();
    if bytes.len() + 1 > HANDLE_BODY {
        return Err(invalid("the network's handle does not fit"));
    }
    let mut buf = [0u8; NET_HANDLE_MAXSIZE];
    buf[0] = bytes.len() as u8;
    buf[1..1 + bytes.len()].copy_from_slice(bytes);
    // SAFETY: NCCL's handle buffers hold NCCL_NET_HANDLE_MAXSIZE bytes.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), handle.cast::<u8>(), buf.len()) };
    put(
        out,
        raw::<N, _>(Listen {
            net: net.clone(),
            listen,
        }),
    )
}

fn connect_to<N: Exported>(
    net: &Arc<N>,
    dev: c_int,
    handle: *mut c_void,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    if handle.is_null() {
        return Err(invalid("connect: a null handle"));
    }
    put(out, null_mut())?;
    let dev = dev_index(dev)?;
    let bytes = handle.cast::<u8>();
    // SAFETY: NCCL's handle buffers hold NCCL_NET_HANDLE_MAXSIZE bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(bytes, NET_HANDLE_MAXSIZE) };
    let len = buf[0] as usize;
    if len + 1 > HANDLE_BODY {
        return Err(invalid("a malformed listen handle"));
    }
    let ours = ListenHandle::from_bytes(&buf[1..1 + len])?;
    let slot = &mut buf[HANDLE_BODY..];
    let mut stage_ptr = usize::from_ne_bytes(slot.try_into().expect("a word"));
    if stage_ptr == 0 {
        stage_ptr = Box::into_raw(Box::<N::ConnectStage>::default()) as usize;
        slot.copy_from_slice(&stage_ptr.to_ne_bytes());
    }
    // SAFETY: the pointer was stored by an earlier call on this handle (of
    // this context, so of this network) and is freed (and cleared) below
    // once the connect ends.
    let stage = unsafe { &mut *(stage_ptr as *mut N::ConnectStage) };
    let outcome = net.connect(dev, &ours, stage);
    if !matches!(outcome, Ok(None)) {
        // SAFETY: made by Box::into_raw above; cleared so it is freed once.
        drop(unsafe { Box::from_raw(stage_ptr as *mut N::ConnectStage) });
        slot.fill(0);
    }
    if let Some(send) = outcome? {
        put(
            out,
            raw::<N, _>(Comm {
                net: net.clone(),
                side: Side::Send(send),
            }),
        )?;
    }
    Ok(())
}

/// How many devices the process's network has.
fn device_count() -> Result<c_int, NetError> {
    fn count<N: Net>(net: &Arc<N>) -> usize {
        net.devices()
    }
    Ok(with_net!(&process_net()?, count()).min(c_int::MAX as usize) as c_int)
}

/// Device `dev`'s properties on the process's network.
fn properties(dev: c_int) -> Result<rccl_transports::network::Properties, NetError> {
    fn of<N: Net>(
        net: &Arc<N>,
        dev: usize,
    ) -> Result<rccl_transports::network::Properties, NetError> {
        net.properties(dev)
    }
    with_net!(&process_net()?, of(dev_index(dev)?))
}

/// `text` as a C string kept for the process (device names and paths,
/// which NCCL keeps pointers to).
fn c_string(text: &str) -> *mut c_char {
    static KEPT: Mutex<Vec<CString>> = Mutex::new(Vec::new());
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let wanted = CString::new(text.replace('\0', " ")).unwrap_or_default();
    let at = match kept.iter().position(|s| *s == wanted) {
        Some(at) => at,
        None => {
            kept.push(wanted);
            kept.len() - 1
        }
    };
    // A CString's bytes stay where they are while the Vec grows.
    kept[at].as_ptr().cast_mut()
}

macro_rules! fill_common {
    ($p:expr, $props:expr) => {{
        $p.name = c_string(&$props.name);
        $p.pci_path = $props
            .pci_path
            .as_ref()
            .map_or(null_mut(), |path| c_string(&path.to_string_lossy()));
        $p.guid = $props.guid;
        $p.ptr_support = abi::PTR_HOST;
        $p.reg_is_global = 0;
        $p.speed = $props.speed_mbps.min(i32::MAX as u32) as c_int;
        $p.port = $props.port.min(i32::MAX as u32) as c_int;
        $p.latency = $props.latency_us;
        $p.max_comms = $props.max_comms.min(i32::MAX as usize) as c_int;
        $p.max_recvs = $props.max_recvs as c_int;
        $p.net_device_type = abi::NET_DEVICE_HOST;
        $p.net_device_version = 0;
    }};
}

macro_rules! fill_v9 {
    ($p:expr, $props:expr) => {{
        fill_common!($p, $props);
        $p.force_flush = 0;
        $p.vprops.ndevs = 1;
        $p.vprops.devs = Default::default();
        $p.max_p2p_bytes = MAX_BYTES;
        $p.max_coll_bytes = MAX_BYTES;
    }};
}

fn accept_on<N: Exported>(listen: *mut c_void, out: *mut *mut c_void) -> Result<(), NetError> {
    // SAFETY: NCCL passes a listening communicator this plug-in made.
    let listen = unsafe { get::<Listen<N>>(listen)? };
    if let Some(recv) = listen.net.accept(&mut listen.listen)? {
        put(
            out,
            raw::<N, _>(Comm {
                net: listen.net.clone(),
                side: Side::Recv(recv),
            }),
        )?;
    }
    Ok(())
}

fn regmr<N: Exported>(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    // SAFETY: NCCL passes a communicator this plug-in made.
    let comm = unsafe { get::<Comm<N>>(comm)? };
    let memory = match kind {
        abi::PTR_HOST => MemoryType::Host,
        _ => MemoryType::Cuda,
    };
    // SAFETY: NCCL keeps registered memory valid until deregMr.
    let mr = unsafe { comm.net.reg_mr(comm.as_ref(), data.cast(), size, memory)? };
    put(out, raw::<N, _>(mr))
}

fn regmr_dma_buf<N: Exported>(comm: *mut c_void, offset: u64, fd: c_int) -> Result<(), NetError> {
    // SAFETY: NCCL passes a communicator this plug-in made.
    let comm = unsafe { get::<Comm<N>>(comm)? };
    Err(NetError::Unsupported {
        net: comm.net.name(),
        memory: MemoryType::DmaBuf { fd, offset },
    })
}

fn deregmr<N: Exported>(comm: *mut c_void, mhandle: *mut c_void) -> Result<(), NetError> {
    // SAFETY: NCCL passes a communicator and a registration this plug-in
    // made; the registration is freed once, here.
    let (comm, mr) = unsafe { (get::<Comm<N>>(comm)?, take::<N::MemHandle>(mhandle)?) };
    comm.net.dereg_mr(comm.as_ref(), mr)
}

fn isend_any<N: Exported>(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    put(out, null_mut())?;
    // SAFETY: NCCL passes a communicator and registration this plug-in made.
    let (comm, mr) = unsafe { (get::<Comm<N>>(comm)?, get::<N::MemHandle>(mhandle)?) };
    let Side::Send(send) = &mut comm.side else {
        return Err(invalid("isend on a receiving communicator"));
    };
    if let Some(request) = comm.net.isend(send, data.cast(), size, tag, mr)? {
        put(
            out,
            raw::<N, _>(Request {
                net: comm.net.clone(),
                request,
            }),
        )?;
    }
    Ok(())
}

fn irecv_any<N: Exported>(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    size_of: &dyn Fn(usize) -> usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    put(out, null_mut())?;
    let n = usize::try_from(n).map_err(|_| invalid("a negative count"))?;
    if n == 0 || n > MAX_RECVS || data.is_null() || tags.is_null() || mhandles.is_null() {
        return Err(invalid("irecv: 1 to 8 buffers with their tags and handles"));
    }
    // SAFETY: NCCL passes a communicator this plug-in made and arrays of
    // `n` entries.
    let comm = unsafe { get::<Comm<N>>(comm)? };
    let mut buffers = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: arrays of `n` entries; handles this plug-in made.
        let (d, tag, mr) = unsafe {
            (
                *data.add(i),
                *tags.add(i),
                get::<N::MemHandle>(*mhandles.add(i))?,
            )
        };
        buffers.push(RecvBuffer::<N> {
            data: d.cast(),
            size: size_of(i),
            tag,
            mhandle: mr,
        });
    }
    let Side::Recv(recv) = &mut comm.side else {
        return Err(invalid("irecv on a sending communicator"));
    };
    if let Some(request) = comm.net.irecv(recv, &buffers)? {
        put(
            out,
            raw::<N, _>(Request {
                net: comm.net.clone(),
                request,
            }),
        )?;
    }
    Ok(())
}

fn flush_on<N: Exported>(comm: *mut c_void, out: *mut *mut c_void) -> Result<(), NetError> {
    // Host memory only: nothing to flush.
    // SAFETY: NCCL passes a communicator this plug-in made.
    unsafe { get::<Comm<N>>(comm)? };
    put(out, null_mut())
}

fn test_request<N: Exported>(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Result<(), NetError> {
    // SAFETY: NCCL passes a request this plug-in made, not yet done.
    let req = unsafe { get::<Request<N>>(request)? };
    let Some(moved) = req.net.test(&mut req.request)? else {
        return Ok(());
    };
    if !sizes.is_null() {
        for (i, &size) in moved.as_slice().iter().enumerate() {
            // SAFETY: NCCL's sizes array has an entry per buffer.
            unsafe { *sizes.add(i) = size.min(c_int::MAX as usize) as c_int };
        }
    }
    // SAFETY: done: the request is freed once, here.
    drop(unsafe { take::<Request<N>>(request)? });
    put(done, 1)
}

fn close_comm<N: Exported>(comm: *mut c_void) -> Result<(), NetError> {
    // SAFETY: NCCL passes a communicator this plug-in made, closed once.
    let comm = unsafe { take::<Comm<N>>(comm)? };
    match comm.side {
        Side::Send(s) => comm.net.close_send(s),
        Side::Recv(r) => comm.net.close_recv(r),
    }
}

fn close_listen_comm<N: Exported>(listen: *mut c_void) -> Result<(), NetError> {
    // SAFETY: NCCL passes a listening communicator this plug-in made,
    // closed once.
    let listen = unsafe { take::<Listen<N>>(listen)? };
    listen.net.close_listen(listen.listen)
}

mod entries {
    //! The C entries, shared by every version's table where they agree.
    use super::*;

    pub unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
        guard(|| put(ndev, device_count()?))
    }

    pub unsafe extern "C" fn accept(
        listen: *mut c_void,
        out: *mut *mut c_void,
        dev: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| {
            put(out, null_mut())?;
            if !dev.is_null() {
                put(dev, null_mut())?;
            }
            by_kind!(listen, accept_on(listen, out))
        })
    }

    pub unsafe extern "C" fn reg_mr(
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        kind: c_int,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| by_kind!(comm, regmr(comm, data, size, kind, out)))
    }

    pub unsafe extern "C" fn reg_mr_dma_buf(
        comm: *mut c_void,
        _data: *mut c_void,
        _size: usize,
        _kind: c_int,
        offset: u64,
        fd: c_int,
        _out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| by_kind!(comm, regmr_dma_buf(comm, offset, fd)))
    }

    pub unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
        guard(|| by_kind!(comm, deregmr(comm, mhandle)))
    }

    pub unsafe extern "C" fn iflush(
        comm: *mut c_void,
        _n: c_int,
        _data: *mut *mut c_void,
        _sizes: *mut c_int,
        _mhandles: *mut *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| by_kind!(comm, flush_on(comm, out)))
    }

    pub unsafe extern "C" fn test(
        request: *mut c_void,
        done: *mut c_int,
        sizes: *mut c_int,
    ) -> NcclResult {
        guard(|| {
            put(done, 0)?;
            by_kind!(request, test_request(request, done, sizes))
        })
    }

    pub unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
        guard(|| by_kind!(comm, close_comm(comm)))
    }

    pub unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
        guard(|| by_kind!(comm, close_comm(comm)))
    }

    pub unsafe extern "C" fn close_listen(listen: *mut c_void) -> NcclResult {
        guard(|| by_kind!(listen, close_listen_comm(listen)))
    }

    // v8 to v10: one network per process.

    pub unsafe extern "C" fn init_v8(logger: abi::Logger) -> NcclResult {
        LOGGER.store(logger as usize, Ordering::Release);
        guard(|| init_process_net().map(drop))
    }

    pub unsafe extern "C" fn init_v10(
        logger: abi::Logger,
        _prof: abi::ProfilerCallback,
    ) -> NcclResult {
        // SAFETY: the same contract.
        unsafe { init_v8(logger) }
    }

    pub unsafe extern "C" fn listen_v8(
        dev: c_int,
        handle: *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| with_net!(&process_net()?, listen_on(dev, handle, out)))
    }

    pub unsafe extern "C" fn connect_v8(
        dev: c_int,
        handle: *mut c_void,
        out: *mut *mut c_void,
        dev_comm: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| {
            if !dev_comm.is_null() {
                put(dev_comm, null_mut())?;
            }
            with_net!(&process_net()?, connect_to(dev, handle, out))
        })
    }

    pub unsafe extern "C" fn connect_v10(
        dev: c_int,
        _config: *mut abi::CommConfig,
        handle: *mut c_void,
        out: *mut *mut c_void,
        dev_comm: *mut *mut c_void,
    ) -> NcclResult {
        // SAFETY: the same contract.
        unsafe { connect_v8(dev, handle, out, dev_comm) }
    }

    // v11 on: a network per communicator (the context), of the kind the
    // process's network has.

    pub unsafe extern "C" fn init_v11(
        ctx: *mut *mut c_void,
        comm_id: u64,
        _config: *mut abi::CommConfig,
        logger: abi::Logger,
        _prof: abi::ProfilerCallback,
    ) -> NcclResult {
        LOGGER.store(logger as usize, Ordering::Release);
        guard(|| {
            let net = init_process_net()?.open_like(Some(comm_id))?;
            put(ctx, Box::into_raw(Box::new(net)).cast())
        })
    }

    pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
        guard(|| {
            if ctx.is_null() {
                return Err(invalid("a null context"));
            }
            // SAFETY: a context init_v11 made, ended once.
            drop(unsafe { Box::from_raw(ctx.cast::<AnyNet>()) });
            Ok(())
        })
    }

    pub unsafe extern "C" fn set_net_attr(_ctx: *mut c_void, _attr: *mut c_void) -> NcclResult {
        abi::SUCCESS
    }

    pub unsafe extern "C" fn listen_v11(
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        // SAFETY: NCCL passes a context init_v11 made.
        guard(|| with_net!(&unsafe { ctx_net(ctx)? }, listen_on(dev, handle, out)))
    }

    pub unsafe extern "C" fn connect_v11(
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        out: *mut *mut c_void,
        dev_comm: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| {
            if !dev_comm.is_null() {
                put(dev_comm, null_mut())?;
            }
            // SAFETY: NCCL passes a context init_v11 made.
            with_net!(&unsafe { ctx_net(ctx)? }, connect_to(dev, handle, out))
        })
    }

    // Sizes: int in v8, size_t after; profiler handles from v10.

    pub unsafe extern "C" fn isend_v8(
        comm: *mut c_void,
        data: *mut c_void,
        size: c_int,
        tag: c_int,
        mh: *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| {
            let size = usize::try_from(size).map_err(|_| invalid("a negative size"))?;
            by_kind!(comm, isend_any(comm, data, size, tag, mh, out))
        })
    }

    pub unsafe extern "C" fn isend_v9(
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        tag: c_int,
        mh: *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| by_kind!(comm, isend_any(comm, data, size, tag, mh, out)))
    }

    pub unsafe extern "C" fn isend_v10(
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        tag: c_int,
        mh: *mut c_void,
        _phandle: *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        // SAFETY: the same contract.
        unsafe { isend_v9(comm, data, size, tag, mh, out) }
    }

    pub unsafe extern "C" fn irecv_v8(
        comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut c_int,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| {
            if sizes.is_null() {
                return Err(invalid("null sizes"));
            }
            // SAFETY: NCCL's sizes array has `n` entries.
            let size_of = |i: usize| unsafe { *sizes.add(i) }.max(0) as usize;
            by_kind!(
                comm,
                irecv_any(comm, n, data, &size_of, tags, mhandles, out)
            )
        })
    }

    pub unsafe extern "C" fn irecv_v9(
        comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| {
            if sizes.is_null() {
                return Err(invalid("null sizes"));
            }
            // SAFETY: NCCL's sizes array has `n` entries.
            let size_of = |i: usize| unsafe { *sizes.add(i) };
            by_kind!(
                comm,
                irecv_any(comm, n, data, &size_of, tags, mhandles, out)
            )
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn irecv_v10(
        comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        _phandles: *mut *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        // SAFETY: the same contract.
        unsafe { irecv_v9(comm, n, data, sizes, tags, mhandles, out) }
    }

    /// Device `dev`'s properties written through `out` by `fill`.
    fn props_into<P>(
        dev: c_int,
        out: *mut P,
        fill: impl FnOnce(&mut P, &rccl_transports::network::Properties),
    ) -> NcclResult {
        guard(|| {
            if out.is_null() {
                return Err(invalid("getProperties: a null out-pointer"));
            }
            let props = properties(dev)?;
            // SAFETY: a valid out-pointer (checked non-null).
            fill(unsafe { &mut *out }, &props);
            Ok(())
        })
    }

    pub unsafe extern "C" fn props_v8(dev: c_int, out: *mut abi::PropertiesV8) -> NcclResult {
        props_into(dev, out, |p, props| fill_common!(p, props))
    }

    pub unsafe extern "C" fn props_v9(dev: c_int, out: *mut abi::PropertiesV10) -> NcclResult {
        props_into(dev, out, |p, props| fill_v9!(p, props))
    }

    pub unsafe extern "C" fn props_v11(dev: c_int, out: *mut abi::PropertiesV11) -> NcclResult {
        props_into(dev, out, |p, props| {
            fill_v9!(p, props);
            p.tail.max_multi_request_size = 1;
        })
    }

    pub unsafe extern "C" fn props_v12(dev: c_int, out: *mut abi::PropertiesV12) -> NcclResult {
        props_into(dev, out, |p, props| {
            fill_v9!(p, props);
            p.tail.max_multi_request_size = 1;
            p.tail.rail_id = -1;
            p.tail.plane_id = -1;
        })
    }
}

use entries as e;

/// The fields every version's table fills alike.
macro_rules! table {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {
        abi::$ty {
            name: NAME.as_ptr(),
            devices: Some(e::devices),
            accept: Some(e::accept),
            reg_mr: Some(e::reg_mr),
            reg_mr_dma_buf: Some(e::reg_mr_dma_buf),
            dereg_mr: Some(e::dereg_mr),
            iflush: Some(e::iflush),
            test: Some(e::test),
            close_send: Some(e::close_send),
            close_recv: Some(e::close_recv),
            close_listen: Some(e::close_listen),
            get_device_mr: None,
            irecv_consumed: None,
            $($field: $value,)*
        }
    };
}

/// NCCL's net plug-in interface v8.
#[no_mangle]
pub static ncclNetPlugin_v8: abi::NetV8 = table!(NetV8 {
    init: Some(e::init_v8),
    get_properties: Some(e::props_v8),
    listen: Some(e::listen_v8),
    connect: Some(e::connect_v8),
    isend: Some(e::isend_v8),
    irecv: Some(e::irecv_v8),
});

/// NCCL's net plug-in interface v9.
#[no_mangle]
pub static ncclNetPlugin_v9: abi::NetV9 = table!(NetV9 {
    init: Some(e::init_v8),
    get_properties: Some(e::props_v9),
    listen: Some(e::listen_v8),
    connect: Some(e::connect_v8),
    isend: Some(e::isend_v9),
    irecv: Some(e::irecv_v9),
    make_vdevice: None,
});

/// NCCL's net plug-in interface v10.
#[no_mangle]
pub static ncclNetPlugin_v10: abi::NetV10 = table!(NetV10 {
    init: Some(e::init_v10),
    get_properties: Some(e::props_v9),
    listen: Some(e::listen_v8),
    connect: Some(e::connect_v10),
    isend: Some(e::isend_v10),
    irecv: Some(e::irecv_v10),
    make_vdevice: None,
});

/// NCCL's net plug-in interface v11.
#[no_mangle]
pub static ncclNetPlugin_v11: abi::NetV11 = table!(NetV11 {
    init: Some(e::init_v11),
    get_properties: Some(e::props_v11),
    listen: Some(e::listen_v11),
    connect: Some(e::connect_v11),
    isend: Some(e::isend_v10),
    irecv: Some(e::irecv_v10),
    make_vdevice: None,
    finalize: Some(e::finalize),
    set_net_attr: Some(e::set_net_attr),
});

/// NCCL's net plug-in interface v12.
#[no_mangle]
pub static ncclNetPlugin_v12: abi::NetV12 = table!(NetV12 {
    init: Some(e::init_v11),
    get_properties: Some(e::props_v12),
    listen: Some(e::listen_v11),
    connect: Some(e::connect_v11),
    isend: Some(e::isend_v10),
    irecv: Some(e::irecv_v10),
    make_vdevice: None,
    finalize: Some(e::finalize),
    set_net_attr: Some(e::set_net_attr),
});
