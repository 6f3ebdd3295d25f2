//! `libnccl-net-rcclrs.so`: rccl-rs's Socket network as an NCCL net
//! plug-in, exported as `ncclNetPlugin_v8` .. `ncclNetPlugin_v12`, so that
//! NVIDIA's NCCL (`NCCL_NET_PLUGIN=rcclrs`) or rccl-rs's own plug-in host
//! can load it. Its name is `rcclrs` (what `NCCL_NET` matches).
//!
//! - **Device**: one, the interface `NCCL_SOCKET_IFNAME` /
//!   `NCCL_SOCKET_FAMILY` select (as rccl-rs's bootstrap chooses it).
//! - **Authentication**: connections run the Socket network's HMAC
//!   handshake. From v11 on, its key is derived from the `commId` NCCL
//!   gives `init` (a hash of the communicator's unique id), so only members
//!   of the communicator connect; v8 to v10 give no such id, and the key is
//!   one constant: the random listener id in each handle (which travels by
//!   NCCL's bootstrap) is then what a connecting side must know.
//! - **Errors**: every entry returns an `ncclResult_t` and logs the reason
//!   as a warning through the logger `init` was given; no panic crosses
//!   the C boundary (each entry runs under `catch_unwind`).
//! - **Handles**: a listen handle holds the Socket handle's length and
//!   bytes, then a pointer to the state of a `connect` in progress (NCCL
//!   passes the same handle to every `connect` call of one connection, as
//!   its own plug-ins expect).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rccl_transports::network::plugin::abi::{self, NcclResult};
use rccl_transports::network::socket::{
    Socket, SocketConnect, SocketDevice, SocketListen, SocketMr, SocketRecv, SocketRequest,
    SocketSend,
};
use rccl_transports::network::{
    CommRef, ListenHandle, MemoryType, Net, NetError, RecvBuffer, MAX_RECVS, NET_HANDLE_MAXSIZE,
};
use rccl_transports::socket::Secret;

/// The plug-in's name.
const NAME: &CStr = c"rcclrs";
/// The largest transfer (NCCL's `NCCL_MAX_NET_SIZE_BYTES`).
const MAX_BYTES: usize = 1 << 40;

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
            abi::SUBSYS_NET,
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
        NetError::Unsupported { .. } => abi::INVALID_ARGUMENT,
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
            let ip = rccl::host_address().map_err(|e| e.to_string())?;
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

fn open(comm_id: Option<u64>) -> Result<Arc<Socket>, NetError> {
    Ok(Arc::new(Socket::new(
        vec![device()?.clone()],
        secret(comm_id),
    )?))
}

/// The network of v8 to v10 (one per process, made by `init`).
static PROCESS_NET: Mutex<Option<Arc<Socket>>> = Mutex::new(None);

fn process_net() -> Result<Arc<Socket>, NetError> {
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
unsafe fn ctx_net(ctx: *mut c_void) -> Result<Arc<Socket>, NetError> {
    if ctx.is_null() {
        return Err(invalid("a null context"));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { &*(ctx as *const Arc<Socket>) }.clone())
}

/// A sending or receiving communicator, as NCCL holds it.
struct Comm {
    net: Arc<Socket>,
    side: Side,
}

enum Side {
    Send(SocketSend),
    Recv(SocketRecv),
}

struct Listen {
    net: Arc<Socket>,
    listen: SocketListen,
}

struct Request {
    net: Arc<Socket>,
    request: SocketRequest,
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

/// A boxed value as NCCL's opaque pointer.
fn raw<T>(value: T) -> *mut c_void {
    Box::into_raw(Box::new(value)).cast()
}

/// # Safety
/// `p` is a non-null pointer `raw::<T>` made and not yet freed.
unsafe fn get<'a, T>(p: *mut c_void) -> Result<&'a mut T, NetError> {
    if p.is_null() {
        return Err(invalid("a null communicator or handle"));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { &mut *p.cast::<T>() })
}

/// Bytes of the handle before the connect state's pointer.
const HANDLE_BODY: usize = NET_HANDLE_MAXSIZE - std::mem::size_of::<usize>();

fn listen_on(
    net: Arc<Socket>,
    dev: c_int,
    handle: *mut c_void,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    if dev != 0 || handle.is_null() {
        return Err(invalid("listen: no such device, or a null handle"));
    }
    let (ours, listen) = net.listen(0)?;
    let bytes = ours.as_bytes();
    if bytes.len() + 1 > HANDLE_BODY {
        return Err(invalid("the Socket handle does not fit"));
    }
    let mut buf = [0u8; NET_HANDLE_MAXSIZE];
    buf[0] = bytes.len() as u8;
    buf[1..1 + bytes.len()].copy_from_slice(bytes);
    // SAFETY: NCCL's handle buffers hold NCCL_NET_HANDLE_MAXSIZE bytes.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), handle.cast::<u8>(), buf.len()) };
    put(out, raw(Listen { net, listen }))
}

fn connect_to(
    net: Arc<Socket>,
    dev: c_int,
    handle: *mut c_void,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    if dev != 0 || handle.is_null() {
        return Err(invalid("connect: no such device, or a null handle"));
    }
    put(out, null_mut())?;
    let bytes = handle.cast::<u8>();
    // SAFETY: NCCL's handle buffers hold NCCL_NET_HANDLE_MAXSIZE bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(bytes, NET_HANDLE_MAXSIZE) };
    let len = buf[0] as usize;
    if len + 1 > HANDLE_BODY {
        return Err(invalid("a malformed listen handle"));
    }
    let ours = ListenHandle::from_bytes(&buf[1..1 + len])?;
    let (body, slot) = buf.split_at_mut(HANDLE_BODY);
    let _ = body;
    let mut stage_ptr = usize::from_ne_bytes(slot.try_into().expect("a word"));
    if stage_ptr == 0 {
        stage_ptr = Box::into_raw(Box::<SocketConnect>::default()) as usize;
        slot.copy_from_slice(&stage_ptr.to_ne_bytes());
    }
    // SAFETY: the pointer was stored by an earlier call on this handle and
    // is freed (and cleared) below once the connect ends.
    let stage = unsafe { &mut *(stage_ptr as *mut SocketConnect) };
    let outcome = net.connect(0, &ours, stage);
    if !matches!(outcome, Ok(None)) {
        // SAFETY: made by Box::into_raw above; cleared so it is freed once.
        drop(unsafe { Box::from_raw(stage_ptr as *mut SocketConnect) });
        slot.fill(0);
    }
    if let Some(send) = outcome? {
        put(
            out,
            raw(Comm {
                net,
                side: Side::Send(send),
            }),
        )?;
    }
    Ok(())
}

/// Fills NCCL's properties from the Socket network's.
fn properties() -> Result<rccl_transports::network::Properties, NetError> {
    Socket::new(vec![device()?.clone()], secret(None))?.properties(0)
}

/// The interface's name, as a C string kept for the process.
fn device_name(name: &str) -> *mut c_char {
    static NAME: OnceLock<CString> = OnceLock::new();
    NAME.get_or_init(|| CString::new(name).unwrap_or_default())
        .as_ptr()
        .cast_mut()
}

macro_rules! fill_common {
    ($p:expr, $props:expr) => {{
        $p.name = device_name(&$props.name);
        $p.pci_path = null_mut();
        $p.guid = 0;
        $p.ptr_support = abi::PTR_HOST;
        $p.reg_is_global = 0;
        $p.speed = $props.speed_mbps.min(i32::MAX as u32) as c_int;
        $p.port = 0;
        $p.latency = 0.0;
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

fn regmr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    // SAFETY: NCCL passes a communicator this plug-in made.
    let comm = unsafe { get::<Comm>(comm)? };
    let memory = match kind {
        abi::PTR_HOST => MemoryType::Host,
        _ => MemoryType::Cuda,
    };
    let cref = match &comm.side {
        Side::Send(s) => CommRef::Send(s),
        Side::Recv(r) => CommRef::Recv(r),
    };
    // SAFETY: NCCL keeps registered memory valid until deregMr.
    let mr = unsafe { comm.net.reg_mr(cref, data.cast(), size, memory)? };
    put(out, raw(mr))
}

fn isend_any(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    out: *mut *mut c_void,
) -> Result<(), NetError> {
    put(out, null_mut())?;
    // SAFETY: NCCL passes a communicator and registration this plug-in made.
    let (comm, mr) = unsafe { (get::<Comm>(comm)?, get::<SocketMr>(mhandle)?) };
    let Side::Send(send) = &mut comm.side else {
        return Err(invalid("isend on a receiving communicator"));
    };
    if let Some(request) = comm.net.isend(send, data.cast(), size, tag, mr)? {
        put(
            out,
            raw(Request {
                net: comm.net.clone(),
                request,
            }),
        )?;
    }
    Ok(())
}

fn irecv_any(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    size_of: impl Fn(usize) -> usize,
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
    let comm = unsafe { get::<Comm>(comm)? };
    let mut buffers = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: arrays of `n` entries; handles this plug-in made.
        let (d, tag, mr) = unsafe {
            (
                *data.add(i),
                *tags.add(i),
                get::<SocketMr>(*mhandles.add(i))?,
            )
        };
        buffers.push(RecvBuffer::<Socket> {
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
            raw(Request {
                net: comm.net.clone(),
                request,
            }),
        )?;
    }
    Ok(())
}

mod entries {
    //! The C entries, shared by every version's table where they agree.
    use super::*;

    pub unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
        guard(|| put(ndev, 1))
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
            // SAFETY: NCCL passes a listening communicator this plug-in made.
            let listen = unsafe { get::<Listen>(listen)? };
            if let Some(recv) = listen.net.accept(&mut listen.listen)? {
                put(
                    out,
                    raw(Comm {
                        net: listen.net.clone(),
                        side: Side::Recv(recv),
                    }),
                )?;
            }
            Ok(())
        })
    }

    pub unsafe extern "C" fn reg_mr(
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        kind: c_int,
        out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| regmr(comm, data, size, kind, out))
    }

    pub unsafe extern "C" fn reg_mr_dma_buf(
        _comm: *mut c_void,
        _data: *mut c_void,
        _size: usize,
        _kind: c_int,
        _offset: u64,
        _fd: c_int,
        _out: *mut *mut c_void,
    ) -> NcclResult {
        guard(|| {
            Err(NetError::Unsupported {
                net: "Socket",
                memory: MemoryType::DmaBuf {
                    fd: _fd,
                    offset: _offset,
                },
            })
        })
    }

    pub unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
        guard(|| {
            // SAFETY: NCCL passes a communicator and a registration this
            // plug-in made; the registration is freed once, here.
            let comm = unsafe { get::<Comm>(comm)? };
            if mhandle.is_null() {
                return Err(invalid("a null registration"));
            }
            // SAFETY: as above.
            let mr = unsafe { Box::from_raw(mhandle.cast::<SocketMr>()) };
            let cref = match &comm.side {
                Side::Send(s) => CommRef::Send(s),
                Side::Recv(r) => CommRef::Recv(r),
            };
            comm.net.dereg_mr(cref, *mr)
        })
    }

    pub unsafe extern "C" fn iflush(
        comm: *mut c_void,
        _n: c_int,
        _data: *mut *mut c_void,
        _sizes: *mut c_int,
        _mhandles: *mut *mut c_void,
        out: *mut *mut c_void,
    ) -> NcclResult {
        // Host memory only: nothing to flush.
        guard(|| {
            // SAFETY: NCCL passes a communicator this plug-in made.
            unsafe { get::<Comm>(comm)? };
            put(out, null_mut())
        })
    }

    pub unsafe extern "C" fn test(
        request: *mut c_void,
        done: *mut c_int,
        sizes: *mut c_int,
    ) -> NcclResult {
        guard(|| {
            put(done, 0)?;
            // SAFETY: NCCL passes a request this plug-in made, not yet done.
            let req = unsafe { get::<Request>(request)? };
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
            drop(unsafe { Box::from_raw(request.cast::<Request>()) });
            put(done, 1)
        })
    }

    unsafe fn close_comm(comm: *mut c_void) -> Result<(), NetError> {
        if comm.is_null() {
            return Err(invalid("a null communicator"));
        }
        // SAFETY: NCCL passes a communicator this plug-in made, closed once.
        let comm = unsafe { Box::from_raw(comm.cast::<Comm>()) };
        match comm.side {
            Side::Send(s) => comm.net.close_send(s),
            Side::Recv(r) => comm.net.close_recv(r),
        }
    }

    pub unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
        // SAFETY: as close_comm requires.
        guard(|| unsafe { close_comm(comm) })
    }

    pub unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
        // SAFETY: as close_comm requires.
        guard(|| unsafe { close_comm(comm) })
    }

    pub unsafe extern "C" fn close_listen(listen: *mut c_void) -> NcclResult {
        guard(|| {
            if listen.is_null() {
                return Err(invalid("a null listening communicator"));
            }
            // SAFETY: NCCL passes a listening communicator this plug-in
            // made, closed once.
            let listen = unsafe { Box::from_raw(listen.cast::<Listen>()) };
            listen.net.close_listen(listen.listen)
        })
    }

    // v8 to v10: one network per process.

    pub unsafe extern "C" fn init_v8(logger: abi::Logger) -> NcclResult {
        LOGGER.store(logger as usize, Ordering::Release);
        guard(|| {
            let mut net = PROCESS_NET.lock().unwrap_or_else(|e| e.into_inner());
            if net.is_none() {
                *net = Some(open(None)?);
            }
            Ok(())
        })
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
        guard(|| listen_on(process_net()?, dev, handle, out))
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
            connect_to(process_net()?, dev, handle, out)
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

    // v11 on: a network per communicator (the context).

    pub unsafe extern "C" fn init_v11(
        ctx: *mut *mut c_void,
        comm_id: u64,
        _config: *mut abi::CommConfig,
        logger: abi::Logger,
        _prof: abi::ProfilerCallback,
    ) -> NcclResult {
        LOGGER.store(logger as usize, Ordering::Release);
        guard(|| {
            let net = open(Some(comm_id))?;
            put(ctx, Box::into_raw(Box::new(net)).cast())
        })
    }

    pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
        guard(|| {
            if ctx.is_null() {
                return Err(invalid("a null context"));
            }
            // SAFETY: a context init_v11 made, ended once.
            drop(unsafe { Box::from_raw(ctx.cast::<Arc<Socket>>()) });
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
        guard(|| listen_on(unsafe { ctx_net(ctx)? }, dev, handle, out))
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
            connect_to(unsafe { ctx_net(ctx)? }, dev, handle, out)
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
            isend_any(comm, data, size, tag, mh, out)
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
        guard(|| isend_any(comm, data, size, tag, mh, out))
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
        guard(|| isend_any(comm, data, size, tag, mh, out))
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
            irecv_any(comm, n, data, size_of, tags, mhandles, out)
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
            irecv_any(comm, n, data, size_of, tags, mhandles, out)
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

    pub unsafe extern "C" fn props_v8(dev: c_int, out: *mut abi::PropertiesV8) -> NcclResult {
        guard(|| {
            if dev != 0 || out.is_null() {
                return Err(invalid("getProperties: no such device"));
            }
            let props = properties()?;
            // SAFETY: a valid out-pointer (checked non-null).
            let p = unsafe { &mut *out };
            fill_common!(p, props);
            Ok(())
        })
    }

    pub unsafe extern "C" fn props_v9(dev: c_int, out: *mut abi::PropertiesV10) -> NcclResult {
        guard(|| {
            if dev != 0 || out.is_null() {
                return Err(invalid("getProperties: no such device"));
            }
            let props = properties()?;
            // SAFETY: a valid out-pointer (checked non-null).
            let p = unsafe { &mut *out };
            fill_v9!(p, props);
            Ok(())
        })
    }

    pub unsafe extern "C" fn props_v11(dev: c_int, out: *mut abi::PropertiesV11) -> NcclResult {
        guard(|| {
            if dev != 0 || out.is_null() {
                return Err(invalid("getProperties: no such device"));
            }
            let props = properties()?;
            // SAFETY: a valid out-pointer (checked non-null).
            let p = unsafe { &mut *out };
            fill_v9!(p, props);
            p.tail.max_multi_request_size = 1;
            Ok(())
        })
    }

    pub unsafe extern "C" fn props_v12(dev: c_int, out: *mut abi::PropertiesV12) -> NcclResult {
        guard(|| {
            if dev != 0 || out.is_null() {
                return Err(invalid("getProperties: no such device"));
            }
            let props = properties()?;
            // SAFETY: a valid out-pointer (checked non-null).
            let p = unsafe { &mut *out };
            fill_v9!(p, props);
            p.tail.max_multi_request_size = 1;
            p.tail.rail_id = -1;
            p.tail.plane_id = -1;
            Ok(())
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
