//! libibverbs, opened at run time (`dlopen("libibverbs.so.1")`), so that
//! the library loads and the other networks work on a machine without
//! rdma-core.
//!
//! The few entry points the provider needs are written here by hand: the
//! exported functions through `libloading`, and the data path
//! (`ibv_poll_cq`, `ibv_post_send`, `ibv_post_recv`, inline functions in
//! `verbs.h`) through the context's operation table, as the header's
//! inline functions call it. The `repr(C)` layouts follow rdma-core's
//! `<infiniband/verbs.h>`; a test compiles a C program against the header
//! where it is installed and compares every size and offset used.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::RawFd;
use std::sync::Arc;

use parking_lot::Mutex;

use super::verbs::{
    CompletionQueue, Device, DeviceInfo, GidEntry, LinkLayer, MemoryRegion, PathSettings, PortInfo,
    QpCaps, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, Verbs, VerbsError, Wc, WcOpcode, WcStatus,
};

/// The library's name.
pub const LIBRARY: &str = "libibverbs.so.1";

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ibv_qp_cap {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

#[repr(C)]
struct ibv_qp_init_attr {
    qp_context: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    cap: ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: c_int,
}

/// `union ibv_gid` holds two `u64`s, so the route is 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
struct ibv_global_route {
    dgid: [u8; 16],
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ibv_ah_attr {
    grh: ibv_global_route,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ibv_qp_attr {
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: u32,
    cap: ibv_qp_cap,
    ah_attr: ibv_ah_attr,
    alt_ah_attr: ibv_ah_attr,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ibv_sge {
    addr: u64,
    length: u32,
    lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ibv_send_wr {
    wr_id: u64,
    next: *mut ibv_send_wr,
    sg_list: *mut ibv_sge,
    num_sge: c_int,
    opcode: u32,
    send_flags: u32,
    /// Network byte order.
    imm_data: u32,
    /// `wr.rdma`: remote address, then key (the union is 32 bytes).
    remote_addr: u64,
    rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: u32,
    _bind_mw_or_tso: [u64; 6],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ibv_recv_wr {
    wr_id: u64,
    next: *mut ibv_recv_wr,
    sg_list: *mut ibv_sge,
    num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ibv_wc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ibv_async_event {
    element: *mut c_void,
    event_type: u32,
}

/// Offsets into structures the provider only reads a field of.
const PORT_ATTR_BYTES: usize = 52;
const PORT_ATTR_GID_TBL_LEN: usize = 12;
const PORT_ATTR_LID: usize = 34;
const PORT_ATTR_ACTIVE_WIDTH: usize = 43;
const PORT_ATTR_ACTIVE_SPEED: usize = 44;
const PORT_ATTR_LINK_LAYER: usize = 46;
const PORT_ATTR_ACTIVE_MTU: usize = 8;
const MR_LKEY: usize = 36;
const MR_RKEY: usize = 40;
const QP_NUM: usize = 52;
const CONTEXT_ASYNC_FD: usize = 268;
const OPS_POLL_CQ: usize = 96;
const OPS_REQ_NOTIFY_CQ: usize = 104;
const COMP_CHANNEL_FD: usize = 8;
const OPS_POST_SEND: usize = 208;
const OPS_POST_RECV: usize = 216;

const IBV_QPT_RC: u32 = 2;
const IBV_QPS_INIT: u32 = 1;
const IBV_QPS_RTR: u32 = 2;
const IBV_QPS_RTS: u32 = 3;
const IBV_QP_STATE: c_int = 1;
const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
const IBV_QP_PORT: c_int = 1 << 5;
const IBV_QP_AV: c_int = 1 << 7;
const IBV_QP_PATH_MTU: c_int = 1 << 8;
const IBV_QP_TIMEOUT: c_int = 1 << 9;
const IBV_QP_RETRY_CNT: c_int = 1 << 10;
const IBV_QP_RNR_RETRY: c_int = 1 << 11;
const IBV_QP_RQ_PSN: c_int = 1 << 12;
const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
const IBV_QP_SQ_PSN: c_int = 1 << 16;
const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const IBV_QP_DEST_QPN: c_int = 1 << 20;
const IBV_WR_RDMA_WRITE: u32 = 0;
const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
const IBV_WR_SEND: u32 = 2;
const IBV_WR_SEND_WITH_IMM: u32 = 3;
const IBV_SEND_SIGNALED: u32 = 2;
const IBV_SEND_INLINE: u32 = 8;
const IBV_WC_WITH_IMM: u32 = 2;
const IBV_WC_SEND: u32 = 0;
const IBV_WC_RDMA_WRITE: u32 = 1;
const IBV_WC_RECV: u32 = 128;
const IBV_WC_RECV_RDMA_WITH_IMM: u32 = 129;
const IBV_LINK_LAYER_ETHERNET: u8 = 2;
const IBV_PORT_ACTIVE: u32 = 4;

type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut ibv_wc) -> c_int;
type ReqNotifyCq = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type PostSend = unsafe extern "C" fn(*mut c_void, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The exported entry points.
struct Lib {
    get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    get_device_guid: unsafe extern "C" fn(*mut c_void) -> u64,
    open_device: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    close_device: unsafe extern "C" fn(*mut c_void) -> c_int,
    query_port: unsafe extern "C" fn(*mut c_void, u8, *mut u8) -> c_int,
    query_gid: unsafe extern "C" fn(*mut c_void, u8, c_int, *mut [u8; 16]) -> c_int,
    alloc_pd: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void,
    dereg_mr: unsafe extern "C" fn(*mut c_void) -> c_int,
    /// `ibv_reg_dmabuf_mr` (pd, offset, length, iova, fd, access): rdma-core
    /// 34 and later.
    reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut c_void>,
    create_comp_channel: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    destroy_comp_channel: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_cq_event: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int,
    ack_cq_events: unsafe extern "C" fn(*mut c_void, u32),
    create_cq:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    create_qp: unsafe extern "C" fn(*mut c_void, *mut ibv_qp_init_attr) -> *mut c_void,
    modify_qp: unsafe extern "C" fn(*mut c_void, *mut ibv_qp_attr, c_int) -> c_int,
    destroy_qp: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_async_event: unsafe extern "C" fn(*mut c_void, *mut ibv_async_event) -> c_int,
    ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    event_type_str: unsafe extern "C" fn(u32) -> *const c_char,
    /// Keeps the library mapped while the pointers above live.
    _library: libloading::Library,
}

impl Lib {
    fn load() -> Result<Lib, String> {
        // SAFETY: loading libibverbs runs its constructors, which only
        // register its providers.
        let library = unsafe { libloading::Library::new(LIBRARY) }
            .map_err(|e| format!("{LIBRARY} is not installed or cannot load ({e})"))?;
        macro_rules! symbol {
            ($name:literal) => {
                // SAFETY: the symbol is libibverbs' exported function of
                // that name, whose C signature the field's type repeats
                // (verbs.h); the library stays mapped in `_library`.
                *unsafe { library.get($name) }.map_err(|e| {
                    format!("{LIBRARY} lacks {}: {e}", String::from_utf8_lossy($name))
                })?
            };
        }
        Ok(Lib {
            get_device_list: symbol!(b"ibv_get_device_list"),
            free_device_list: symbol!(b"ibv_free_device_list"),
            get_device_name: symbol!(b"ibv_get_device_name"),
            get_device_guid: symbol!(b"ibv_get_device_guid"),
            open_device: symbol!(b"ibv_open_device"),
            close_device: symbol!(b"ibv_close_device"),
            query_port: symbol!(b"ibv_query_port"),
            query_gid: symbol!(b"ibv_query_gid"),
            alloc_pd: symbol!(b"ibv_alloc_pd"),
            dealloc_pd: symbol!(b"ibv_dealloc_pd"),
            reg_mr: symbol!(b"ibv_reg_mr"),
            dereg_mr: symbol!(b"ibv_dereg_mr"),
            // SAFETY: as `symbol!`, for an entry older libraries lack.
            reg_dmabuf_mr: unsafe { library.get(b"ibv_reg_dmabuf_mr") }
                .ok()
                .map(|f| *f),
            create_comp_channel: symbol!(b"ibv_create_comp_channel"),
            destroy_comp_channel: symbol!(b"ibv_destroy_comp_channel"),
            get_cq_event: symbol!(b"ibv_get_cq_event"),
            ack_cq_events: symbol!(b"ibv_ack_cq_events"),
            create_cq: symbol!(b"ibv_create_cq"),
            destroy_cq: symbol!(b"ibv_destroy_cq"),
            create_qp: symbol!(b"ibv_create_qp"),
            modify_qp: symbol!(b"ibv_modify_qp"),
            destroy_qp: symbol!(b"ibv_destroy_qp"),
            get_async_event: symbol!(b"ibv_get_async_event"),
            ack_async_event: symbol!(b"ibv_ack_async_event"),
            event_type_str: symbol!(b"ibv_event_type_str"),
            _library: library,
        })
    }
}

fn errno_error(call: &'static str) -> VerbsError {
    VerbsError::new(call, std::io::Error::last_os_error().to_string())
}

fn rc_error(call: &'static str, rc: c_int) -> VerbsError {
    VerbsError::new(
        call,
        std::io::Error::from_raw_os_error(rc.abs()).to_string(),
    )
}

/// Reads a `T` at `offset` bytes into the structure at `base`.
///
/// # Safety
/// `base + offset` holds a `T` (per verbs.h's layout).
unsafe fn field<T: Copy>(base: *const c_void, offset: usize) -> T {
    std::ptr::read_unaligned(base.cast::<u8>().add(offset).cast::<T>())
}

/// Port speed in Mbps from the port's width and speed codes (NCCL's
/// tables).
fn speed_mbps(width: u8, speed: u8) -> u32 {
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    let per_lane = match speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        _ => 10_000,
    };
    lanes * per_lane
}

/// The RoCE version of GID `index` of a port, from sysfs.
fn roce_version(device: &str, port: u8, index: usize) -> Option<u8> {
    let text = std::fs::read_to_string(format!(
        "/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}"
    ))
    .ok()?;
    if text.contains("v2") {
        Some(2)
    } else if text.contains("RoCE") {
        Some(1)
    } else {
        None
    }
}

/// libibverbs and the devices it found.
pub struct Libibverbs {
    lib: Arc<Lib>,
    /// The device list, kept for `ibv_open_device`.
    list: DeviceList,
    devices: Vec<DeviceInfo>,
}

struct DeviceList {
    lib: Arc<Lib>,
    list: *mut *mut c_void,
    /// The `ibv_device` pointer of each device of [`Libibverbs::devices`].
    raw: Vec<*mut c_void>,
}

// SAFETY: the device list is read-only after ibv_get_device_list and
// libibverbs' calls are thread-safe.
unsafe impl Send for DeviceList {}
// SAFETY: as above.
unsafe impl Sync for DeviceList {}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { (self.lib.free_device_list)(self.list) };
    }
}

impl Libibverbs {
    /// Loads libibverbs and lists its devices and their ports. `Err` says
    /// why not (no library, no device).
    pub fn open() -> Result<Libibverbs, String> {
        let lib = Arc::new(Lib::load()?);
        let mut count: c_int = 0;
        // SAFETY: plain call; `count` receives the number of devices.
        let list = unsafe { (lib.get_device_list)(&mut count) };
        if list.is_null() {
            return Err(format!(
                "ibv_get_device_list failed: {} (no RDMA support in the kernel?)",
                std::io::Error::last_os_error()
            ));
        }
        let mut list = DeviceList {
            lib: lib.clone(),
            list,
            raw: Vec::new(),
        };
        if count == 0 {
            return Err("libibverbs found no RDMA device".into());
        }
        let mut devices = Vec::new();
        for i in 0..count as usize {
            // SAFETY: the list holds `count` device pointers.
            let raw = unsafe { *list.list.add(i) };
            if let Some(info) = Self::describe(&lib, raw) {
                devices.push(info);
                list.raw.push(raw);
            }
        }
        if devices.is_empty() {
            return Err("no RDMA device could be opened".into());
        }
        Ok(Libibverbs { lib, list, devices })
    }

    /// A device's name, GUID, PCI path, ports and GID tables.
    fn describe(lib: &Lib, raw: *mut c_void) -> Option<DeviceInfo> {
        // SAFETY: `raw` is a device of the list; its name is a C string
        // owned by the device.
        let name = unsafe { CStr::from_ptr((lib.get_device_name)(raw)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as above; the GUID is returned in network byte order.
        let guid = u64::from_be(unsafe { (lib.get_device_guid)(raw) });
        // SAFETY: opens the device; closed below.
        let ctx = unsafe { (lib.open_device)(raw) };
        if ctx.is_null() {
            tracing::info!(target: "NET", "NET/IB: cannot open {name}: {}", std::io::Error::last_os_error());
            return None;
        }
        let mut ports = Vec::new();
        for port in 1..=8u8 {
            let mut attr = [0u8; 4 * PORT_ATTR_BYTES];
            // SAFETY: `attr` is larger than struct ibv_port_attr (of any
            // rdma-core version) and zeroed.
            if unsafe { (lib.query_port)(ctx, port, attr.as_mut_ptr()) } != 0 {
                break;
            }
            let base = attr.as_ptr().cast::<c_void>();
            // SAFETY: offsets of struct ibv_port_attr (checked against
            // verbs.h by the layout test).
            let (state, mtu, gid_len, lid, width, speed, link) = unsafe {
                (
                    field::<u32>(base, 0),
                    field::<u32>(base, PORT_ATTR_ACTIVE_MTU),
                    field::<c_int>(base, PORT_ATTR_GID_TBL_LEN),
                    field::<u16>(base, PORT_ATTR_LID),
                    field::<u8>(base, PORT_ATTR_ACTIVE_WIDTH),
                    field::<u8>(base, PORT_ATTR_ACTIVE_SPEED),
                    field::<u8>(base, PORT_ATTR_LINK_LAYER),
                )
            };
            let mut gids = Vec::new();
            for index in 0..gid_len.clamp(0, 32) {
                let mut gid = [0u8; 16];
                // SAFETY: `gid` is a 16-byte union ibv_gid.
                if unsafe { (lib.query_gid)(ctx, port, index, &mut gid) } != 0 {
                    continue;
                }
                gids.push(GidEntry {
                    index: index as u8,
                    gid,
                    roce_version: roce_version(&name, port, index as usize),
                });
            }
            ports.push(PortInfo {
                port,
                active: state == IBV_PORT_ACTIVE,
                link_layer: if link == IBV_LINK_LAYER_ETHERNET {
                    LinkLayer::Ethernet
                } else {
                    LinkLayer::InfiniBand
                },
                lid,
                mtu: mtu as u8,
                speed_mbps: speed_mbps(width, speed),
                gids,
            });
        }
        // SAFETY: closes the context opened above.
        unsafe { (lib.close_device)(ctx) };
        let pci_path = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device")).ok();
        Some(DeviceInfo {
            name,
            guid,
            pci_path,
            ports,
        })
    }
}

impl Verbs for Libibverbs {
    fn name(&self) -> &'static str {
        "libibverbs"
    }

    fn registers_device_memory(&self) -> bool {
        // The peer-memory client of NVIDIA's driver lets `ibv_reg_mr` pin
        // device memory; it shows itself in sysfs once loaded.
        [
            "/sys/kernel/mm/memory_peers/nv_mem/version",
            "/sys/module/nvidia_peermem",
        ]
        .iter()
        .any(|path| std::path::Path::new(path).exists())
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn open(&self, dev: usize) -> Result<Arc<dyn Device>, VerbsError> {
        let raw = *self
            .list
            .raw
            .get(dev)
            .ok_or_else(|| VerbsError::new("ibv_open_device", format!("no device {dev}")))?;
        // SAFETY: `raw` is a device of the list, which lives in `self`.
        let ctx = unsafe { (self.lib.open_device)(raw) };
        if ctx.is_null() {
            return Err(errno_error("ibv_open_device"));
        }
        // SAFETY: `ctx` is an open context.
        let pd = unsafe { (self.lib.alloc_pd)(ctx) };
        if pd.is_null() {
            let err = errno_error("ibv_alloc_pd");
            // SAFETY: closes the context opened above.
            unsafe { (self.lib.close_device)(ctx) };
            return Err(err);
        }
        // The asynchronous events are read without waiting.
        // SAFETY: offset of async_fd in struct ibv_context; fcntl on it.
        unsafe {
            let fd: c_int = field(ctx, CONTEXT_ASYNC_FD);
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Ok(Arc::new(RealDevice {
            lib: self.lib.clone(),
            ctx,
            pd,
            events: Arc::new(Mutex::new(Events::default())),
            dmabuf: std::sync::OnceLock::new(),
        }))
    }
}

#[derive(Default)]
struct Events {
    device: Option<String>,
    qps: Vec<(usize, String)>,
}

struct RealDevice {
    lib: Arc<Lib>,
    ctx: *mut c_void,
    pd: *mut c_void,
    /// Fatal events read so far (shared with the queue pairs).
    events: Arc<Mutex<Events>>,
    /// Whether the kernel takes dma-bufs, once probed.
    dmabuf: std::sync::OnceLock<bool>,
}

// SAFETY: libibverbs' contexts, protection domains and their objects may
// be used from any thread.
unsafe impl Send for RealDevice {}
// SAFETY: as above.
unsafe impl Sync for RealDevice {}

impl Drop for RealDevice {
    fn drop(&mut self) {
        // SAFETY: every region, queue pair and queue holds an Arc of the
        // device, so none is left; the PD and context are freed once.
        unsafe {
            (self.lib.dealloc_pd)(self.pd);
            (self.lib.close_device)(self.ctx);
        }
    }
}

impl RealDevice {
    fn probe_dmabuf(&self) -> bool {
        let Some(reg) = self.lib.reg_dmabuf_mr else {
            return false;
        };
        // As NCCL probes it: a registration of no file fails with
        // EOPNOTSUPP or EPROTONOSUPPORT where the kernel takes no dma-buf,
        // with another error (EBADF) where it does.
        // SAFETY: `pd` is open; a descriptor of -1 registers nothing.
        let mr = unsafe { reg(self.pd, 0, 0, 0, -1, 0) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if !mr.is_null() {
            // SAFETY: a region this call just made.
            unsafe { (self.lib.dereg_mr)(mr) };
            return true;
        }
        !matches!(errno, Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT))
    }

    /// Reads the pending asynchronous events, keeping the fatal ones.
    fn read_events(&self) {
        let mut events = self.events.lock();
        loop {
            let mut event = ibv_async_event {
                element: std::ptr::null_mut(),
                event_type: 0,
            };
            // SAFETY: the async fd is non-blocking, so this returns at
            // once; the event is acknowledged below.
            if unsafe { (self.lib.get_async_event)(self.ctx, &mut event) } != 0 {
                return;
            }
            // SAFETY: a static string for any event type.
            let what = unsafe { CStr::from_ptr((self.lib.event_type_str)(event.event_type)) }
                .to_string_lossy()
                .into_owned();
            match event.event_type {
                // QP fatal, request and access errors.
                1..=3 => events.qps.push((event.element as usize, what)),
                // CQ error, device fatal, port error.
                0 | 8 | 10 => events.device = Some(what),
                _ => tracing::info!(target: "NET", "NET/IB: asynchronous event: {what}"),
            }
            // SAFETY: the event was returned by ibv_get_async_event.
            unsafe { (self.lib.ack_async_event)(&mut event) };
        }
    }
}

impl Device for RealDevice {
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        // SAFETY: the caller keeps the bytes valid while registered.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr.cast(), len, access as c_int) };
        if mr.is_null() {
            return Err(errno_error("ibv_reg_mr"));
        }
        Ok(Box::new(RealMr {
            lib: self.lib.clone(),
            mr,
        }))
    }

    unsafe fn reg_dmabuf_mr(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        let Some(reg) = self.lib.reg_dmabuf_mr else {
            return Err(VerbsError::new(
                "ibv_reg_dmabuf_mr",
                "this libibverbs is older than rdma-core 34",
            ));
        };
        // SAFETY: the caller keeps the dma-buf's bytes valid while
        // registered; `pd` is open.
        let mr = unsafe { reg(self.pd, offset, len, iova, fd, access as c_int) };
        if mr.is_null() {
            return Err(errno_error("ibv_reg_dmabuf_mr"));
        }
        Ok(Box::new(RealMr {
            lib: self.lib.clone(),
            mr,
        }))
    }

    fn registers_dmabuf(&self) -> bool {
        *self.dmabuf.get_or_init(|| self.probe_dmabuf())
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>, VerbsError> {
        // SAFETY: an open context.
        let channel = unsafe { (self.lib.create_comp_channel)(self.ctx) };
        if channel.is_null() {
            return Err(errno_error("ibv_create_comp_channel"));
        }
        // SAFETY: offset of fd in struct ibv_comp_channel; its events are
        // read without waiting.
        let event_fd: c_int = unsafe {
            let fd = field(channel, COMP_CHANNEL_FD);
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            fd
        };
        // SAFETY: an open context and its channel; no vector.
        let cq = unsafe {
            (self.lib.create_cq)(self.ctx, depth as c_int, std::ptr::null_mut(), channel, 0)
        };
        if cq.is_null() {
            let err = errno_error("ibv_create_cq");
            // SAFETY: the channel made above, used by nothing.
            unsafe { (self.lib.destroy_comp_channel)(channel) };
            return Err(err);
        }
        // SAFETY: cq->context is the first field; its ops table holds
        // poll_cq and req_notify_cq at these offsets (checked by the
        // layout test).
        let (poll, notify) = unsafe {
            let ctx = field::<*mut c_void>(cq, 0);
            (
                field::<PollCq>(ctx, OPS_POLL_CQ),
                field::<ReqNotifyCq>(ctx, OPS_REQ_NOTIFY_CQ),
            )
        };
        Ok(Arc::new(RealCq {
            lib: self.lib.clone(),
            cq,
            channel,
            event_fd,
            poll,
            notify,
        }))
    }

    fn create_qp(
        &self,
        cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Box<dyn QueuePair>, VerbsError> {
        let raw_cq = cq
            .as_any()
            .downcast_ref::<RealCq>()
            .ok_or_else(|| VerbsError::new("ibv_create_qp", "not a libibverbs completion queue"))?
            .cq;
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: raw_cq,
            recv_cq: raw_cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: caps.max_inline,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a valid PD and init attributes.
        let qp = unsafe { (self.lib.create_qp)(self.pd, &mut attr) };
        if qp.is_null() {
            return Err(errno_error("ibv_create_qp"));
        }
        // SAFETY: offsets of struct ibv_qp and the ops table (checked by
        // the layout test).
        let (qpn, post_send, post_recv) = unsafe {
            let ctx: *mut c_void = field(qp, 0);
            (
                field::<u32>(qp, QP_NUM),
                field::<PostSend>(ctx, OPS_POST_SEND),
                field::<PostRecv>(ctx, OPS_POST_RECV),
            )
        };
        Ok(Box::new(RealQp {
            lib: self.lib.clone(),
            qp,
            qpn,
            post_send_fn: post_send,
            post_recv_fn: post_recv,
            _cq: cq.clone(),
            events: self.events.clone(),
        }))
    }

    fn async_error(&self) -> Option<String> {
        self.read_events();
        self.events.lock().device.clone()
    }
}

struct RealMr {
    lib: Arc<Lib>,
    mr: *mut c_void,
}

// SAFETY: a registration is plain data once made.
unsafe impl Send for RealMr {}
// SAFETY: as above.
unsafe impl Sync for RealMr {}

impl MemoryRegion for RealMr {
    fn lkey(&self) -> u32 {
        // SAFETY: offset of lkey in struct ibv_mr.
        unsafe { field(self.mr, MR_LKEY) }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: offset of rkey in struct ibv_mr.
        unsafe { field(self.mr, MR_RKEY) }
    }
}

impl Drop for RealMr {
    fn drop(&mut self) {
        // SAFETY: deregisters once.
        unsafe { (self.lib.dereg_mr)(self.mr) };
    }
}

struct RealCq {
    lib: Arc<Lib>,
    cq: *mut c_void,
    channel: *mut c_void,
    event_fd: c_int,
    poll: PollCq,
    notify: ReqNotifyCq,
}

// SAFETY: libibverbs' completion queues may be polled from any thread.
unsafe impl Send for RealCq {}
// SAFETY: as above.
unsafe impl Sync for RealCq {}

impl Drop for RealCq {
    fn drop(&mut self) {
        // SAFETY: queue pairs hold an Arc of the queue, so none is left;
        // every event was acknowledged when read (`arm`), so the queue can
        // go, then its channel.
        unsafe {
            (self.lib.destroy_cq)(self.cq);
            (self.lib.destroy_comp_channel)(self.channel);
        }
    }
}

impl CompletionQueue for RealCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn poll(&self, wcs: &mut [Wc]) -> Result<usize, VerbsError> {
        let mut raw = [ibv_wc::default(); 64];
        let max = wcs.len().min(raw.len());
        // SAFETY: `raw` holds `max` entries for the provider to fill.
        let n = unsafe { (self.poll)(self.cq, max as c_int, raw.as_mut_ptr()) };
        if n < 0 {
            return Err(rc_error("ibv_poll_cq", n));
        }
        for (out, wc) in wcs.iter_mut().zip(&raw[..n as usize]) {
            *out = Wc {
                wr_id: wc.wr_id,
                status: WcStatus::from_raw(wc.status),
                opcode: match wc.opcode {
                    IBV_WC_SEND => WcOpcode::Send,
                    IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                    IBV_WC_RECV => WcOpcode::Recv,
                    IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
                    _ => WcOpcode::Send,
                },
                byte_len: wc.byte_len,
                imm: (wc.wc_flags & IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
                qp_num: wc.qp_num,
            };
        }
        Ok(n as usize)
    }

    fn event_fd(&self) -> RawFd {
        self.event_fd
    }

    fn arm(&self) -> Result<(), VerbsError> {
        let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the channel's fd is non-blocking, so this returns at
        // once when no event is pending; each event read is acknowledged.
        while unsafe { (self.lib.get_cq_event)(self.channel, &mut cq, &mut ctx) } == 0 {
            // SAFETY: `cq` is the queue the event was for (this one).
            unsafe { (self.lib.ack_cq_events)(cq, 1) };
        }
        // SAFETY: a live queue; 0: every completion, not only solicited.
        let rc = unsafe { (self.notify)(self.cq, 0) };
        if rc != 0 {
            return Err(rc_error("ibv_req_notify_cq", rc));
        }
        Ok(())
    }
}

struct RealQp {
    lib: Arc<Lib>,
    qp: *mut c_void,
    qpn: u32,
    post_send_fn: PostSend,
    post_recv_fn: PostRecv,
    _cq: Arc<dyn CompletionQueue>,
    events: Arc<Mutex<Events>>,
}

// SAFETY: libibverbs' queue pairs may be posted to from any thread.
unsafe impl Send for RealQp {}
// SAFETY: as above.
unsafe impl Sync for RealQp {}

impl Drop for RealQp {
    fn drop(&mut self) {
        // SAFETY: destroys once; the queue it used outlives it (`_cq`).
        unsafe { (self.lib.destroy_qp)(self.qp) };
    }
}

impl RealQp {
    fn modify(&self, attr: &mut ibv_qp_attr, mask: c_int) -> Result<(), VerbsError> {
        // SAFETY: a live queue pair and attributes valid for `mask`.
        let rc = unsafe { (self.lib.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(rc_error("ibv_modify_qp", rc));
        }
        Ok(())
    }
}

impl QueuePair for RealQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn init(&self, path: &PathSettings) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: path.port,
            qp_access_flags: path.access,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )
    }

    fn ready_to_receive(&self, remote: &RemoteQp, path: &PathSettings) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: u32::from(remote.mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: remote.gid,
                    flow_label: 0,
                    sgid_index: path.sgid_index,
                    hop_limit: 255,
                    traffic_class: path.traffic_class,
                },
                dlid: remote.lid,
                sl: path.sl,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(path.is_global),
                port_num: path.port,
            },
            ..Default::default()
        };
        self.modify(
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
        )
    }

    fn ready_to_send(&self, psn: u32, path: &PathSettings) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: path.timeout,
            retry_cnt: path.retry_cnt,
            rnr_retry: path.rnr_retry,
            sq_psn: psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<(), VerbsError> {
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|wr| {
                wr.sge.map_or(ibv_sge::default(), |sge| ibv_sge {
                    addr: sge.addr,
                    length: sge.len,
                    lkey: sge.lkey,
                })
            })
            .collect();
        let mut raw: Vec<ibv_send_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(wr, sge)| {
                let (opcode, remote_addr, rkey, imm) = match wr.op {
                    SendOp::Write {
                        remote_addr,
                        rkey,
                        imm: None,
                    } => (IBV_WR_RDMA_WRITE, remote_addr, rkey, 0),
                    SendOp::Write {
                        remote_addr,
                        rkey,
                        imm: Some(imm),
                    } => (IBV_WR_RDMA_WRITE_WITH_IMM, remote_addr, rkey, imm),
                    SendOp::Send => (IBV_WR_SEND, 0, 0, 0),
                };
                ibv_send_wr {
                    wr_id: wr.wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: sge,
                    num_sge: c_int::from(wr.sge.is_some()),
                    opcode: if opcode == IBV_WR_SEND && imm != 0 {
                        IBV_WR_SEND_WITH_IMM
                    } else {
                        opcode
                    },
                    send_flags: if wr.signaled { IBV_SEND_SIGNALED } else { 0 }
                        | if wr.inline { IBV_SEND_INLINE } else { 0 },
                    imm_data: imm.to_be(),
                    remote_addr,
                    rkey,
                    _wr_rest: [0; 5],
                    _qp_type: 0,
                    _bind_mw_or_tso: [0; 6],
                }
            })
            .collect();
        for i in 1..raw.len() {
            let next: *mut ibv_send_wr = &mut raw[i];
            raw[i - 1].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: a chain of valid work requests whose sges live in
        // `sges`; the provider reads them during the call (inline data is
        // copied then, other data later from registered memory).
        let rc = unsafe { (self.post_send_fn)(self.qp, raw.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(rc_error("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), VerbsError> {
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|wr| {
                wr.sge.map_or(ibv_sge::default(), |sge| ibv_sge {
                    addr: sge.addr,
                    length: sge.len,
                    lkey: sge.lkey,
                })
            })
            .collect();
        let mut raw: Vec<ibv_recv_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(wr, sge)| ibv_recv_wr {
                wr_id: wr.wr_id,
                next: std::ptr::null_mut(),
                sg_list: sge,
                num_sge: c_int::from(wr.sge.is_some()),
            })
            .collect();
        for i in 1..raw.len() {
            let next: *mut ibv_recv_wr = &mut raw[i];
            raw[i - 1].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: a chain of valid receive requests whose sges live in
        // `sges` for the call.
        let rc = unsafe { (self.post_recv_fn)(self.qp, raw.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(rc_error("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn async_error(&self) -> Option<String> {
        self.events
            .lock()
            .qps
            .iter()
            .find(|(qp, _)| *qp == self.qp as usize)
            .map(|(_, what)| format!("{what} on QP {:#x}", self.qpn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// A row of the table below: the C expression and our value.
    macro_rules! size {
        ($ty:ident) => {
            (
                concat!("sizeof(struct ", stringify!($ty), ")"),
                size_of::<$ty>(),
            )
        };
    }
    macro_rules! offset {
        ($ty:ident, $field:ident) => {
            (
                concat!(
                    "offsetof(struct ",
                    stringify!($ty),
                    ", ",
                    stringify!($field),
                    ")"
                ),
                offset_of!($ty, $field),
            )
        };
    }
    macro_rules! constant {
        ($name:ident) => {
            (stringify!($name), $name as usize)
        };
    }

    /// Every size, offset and constant used above, as the C compiler sees
    /// them in rdma-core's header (skipped where the header or a C
    /// compiler is missing; CI installs libibverbs-dev).
    #[test]
    fn layouts_match_rdma_core_headers() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        if !header.exists() {
            eprintln!("skipped: {} is not installed", header.display());
            return;
        }
        let ours: Vec<(&str, usize)> = vec![
            size!(ibv_qp_cap),
            size!(ibv_qp_init_attr),
            offset!(ibv_qp_init_attr, cap),
            offset!(ibv_qp_init_attr, qp_type),
            size!(ibv_global_route),
            size!(ibv_ah_attr),
            offset!(ibv_ah_attr, dlid),
            offset!(ibv_ah_attr, port_num),
            size!(ibv_qp_attr),
            offset!(ibv_qp_attr, dest_qp_num),
            offset!(ibv_qp_attr, ah_attr),
            offset!(ibv_qp_attr, pkey_index),
            offset!(ibv_qp_attr, min_rnr_timer),
            offset!(ibv_qp_attr, timeout),
            offset!(ibv_qp_attr, rnr_retry),
            offset!(ibv_qp_attr, rate_limit),
            size!(ibv_sge),
            size!(ibv_send_wr),
            offset!(ibv_send_wr, imm_data),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
                offset_of!(ibv_send_wr, remote_addr),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
                offset_of!(ibv_send_wr, rkey),
            ),
            size!(ibv_recv_wr),
            size!(ibv_wc),
            offset!(ibv_wc, imm_data),
            offset!(ibv_wc, wc_flags),
            size!(ibv_async_event),
            ("sizeof(struct ibv_port_attr)", PORT_ATTR_BYTES),
            (
                "offsetof(struct ibv_port_attr, active_mtu)",
                PORT_ATTR_ACTIVE_MTU,
            ),
            (
                "offsetof(struct ibv_port_attr, gid_tbl_len)",
                PORT_ATTR_GID_TBL_LEN,
            ),
            ("offsetof(struct ibv_port_attr, lid)", PORT_ATTR_LID),
            (
                "offsetof(struct ibv_port_attr, active_width)",
                PORT_ATTR_ACTIVE_WIDTH,
            ),
            (
                "offsetof(struct ibv_port_attr, active_speed)",
                PORT_ATTR_ACTIVE_SPEED,
            ),
            (
                "offsetof(struct ibv_port_attr, link_layer)",
                PORT_ATTR_LINK_LAYER,
            ),
            ("offsetof(struct ibv_mr, lkey)", MR_LKEY),
            ("offsetof(struct ibv_mr, rkey)", MR_RKEY),
            ("offsetof(struct ibv_qp, qp_num)", QP_NUM),
            ("offsetof(struct ibv_context, async_fd)", CONTEXT_ASYNC_FD),
            ("offsetof(struct ibv_context, ops.poll_cq)", OPS_POLL_CQ),
            (
                "offsetof(struct ibv_context, ops.req_notify_cq)",
                OPS_REQ_NOTIFY_CQ,
            ),
            ("offsetof(struct ibv_comp_channel, fd)", COMP_CHANNEL_FD),
            ("offsetof(struct ibv_context, ops.post_send)", OPS_POST_SEND),
            ("offsetof(struct ibv_context, ops.post_recv)", OPS_POST_RECV),
            constant!(IBV_QPT_RC),
            constant!(IBV_QPS_INIT),
            constant!(IBV_QPS_RTR),
            constant!(IBV_QPS_RTS),
            constant!(IBV_QP_STATE),
            constant!(IBV_QP_ACCESS_FLAGS),
            constant!(IBV_QP_PKEY_INDEX),
            constant!(IBV_QP_PORT),
            constant!(IBV_QP_AV),
            constant!(IBV_QP_PATH_MTU),
            constant!(IBV_QP_TIMEOUT),
            constant!(IBV_QP_RETRY_CNT),
            constant!(IBV_QP_RNR_RETRY),
            constant!(IBV_QP_RQ_PSN),
            constant!(IBV_QP_MAX_QP_RD_ATOMIC),
            constant!(IBV_QP_MIN_RNR_TIMER),
            constant!(IBV_QP_SQ_PSN),
            constant!(IBV_QP_MAX_DEST_RD_ATOMIC),
            constant!(IBV_QP_DEST_QPN),
            constant!(IBV_WR_RDMA_WRITE),
            constant!(IBV_WR_RDMA_WRITE_WITH_IMM),
            constant!(IBV_WR_SEND),
            constant!(IBV_WR_SEND_WITH_IMM),
            constant!(IBV_SEND_SIGNALED),
            constant!(IBV_SEND_INLINE),
            constant!(IBV_WC_WITH_IMM),
            constant!(IBV_WC_SEND),
            constant!(IBV_WC_RDMA_WRITE),
            constant!(IBV_WC_RECV),
            constant!(IBV_WC_RECV_RDMA_WITH_IMM),
            constant!(IBV_LINK_LAYER_ETHERNET),
            constant!(IBV_PORT_ACTIVE),
            ("IBV_WC_WR_FLUSH_ERR", WcStatus::Flush.raw() as usize),
            (
                "IBV_WC_REM_ACCESS_ERR",
                WcStatus::RemoteAccess.raw() as usize,
            ),
            (
                "IBV_WC_RETRY_EXC_ERR",
                WcStatus::RetryExceeded.raw() as usize,
            ),
            (
                "IBV_WC_RNR_RETRY_EXC_ERR",
                WcStatus::RnrRetryExceeded.raw() as usize,
            ),
            (
                "IBV_WC_LOC_PROT_ERR",
                WcStatus::LocalProtection.raw() as usize,
            ),
            ("IBV_WC_LOC_LEN_ERR", WcStatus::LocalLength.raw() as usize),
            ("IBV_EVENT_QP_FATAL", 1),
            ("IBV_EVENT_QP_ACCESS_ERR", 3),
            ("IBV_EVENT_DEVICE_FATAL", 8),
            ("IBV_EVENT_PORT_ERR", 10),
            (
                "IBV_ACCESS_LOCAL_WRITE",
                super::super::verbs::ACCESS_LOCAL_WRITE as usize,
            ),
            (
                "IBV_ACCESS_REMOTE_WRITE",
                super::super::verbs::ACCESS_REMOTE_WRITE as usize,
            ),
            (
                "IBV_ACCESS_REMOTE_READ",
                super::super::verbs::ACCESS_REMOTE_READ as usize,
            ),
            // The signature `Lib::reg_dmabuf_mr` repeats (1: the same).
            (
                "__builtin_types_compatible_p(__typeof__(&ibv_reg_dmabuf_mr), \
                 struct ibv_mr *(*)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int))",
                1,
            ),
        ];
        let dir = std::env::temp_dir().join(format!("rccl-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut program = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (expr, _) in &ours {
            program.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        program.push_str("  return 0;\n}\n");
        let source = dir.join("layout.c");
        let binary = dir.join("layout");
        std::fs::write(&source, program).unwrap();
        let built = std::process::Command::new("cc")
            .arg(&source)
            .arg("-o")
            .arg(&binary)
            .status();
        match built {
            Ok(status) if status.success() => {}
            other => {
                eprintln!("skipped: no C compiler could build the layout probe ({other:?})");
                let _ = std::fs::remove_dir_all(&dir);
                return;
            }
        }
        let output = std::process::Command::new(&binary).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let theirs: Vec<usize> = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| line.parse().unwrap())
            .collect();
        assert_eq!(theirs.len(), ours.len());
        let wrong: Vec<String> = ours
            .iter()
            .zip(&theirs)
            .filter(|((_, ours), theirs)| ours != *theirs)
            .map(|((expr, ours), theirs)| format!("{expr}: ours {ours}, verbs.h {theirs}"))
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn port_speeds_follow_nccl_tables() {
        // 4x EDR, 4x HDR, 4x NDR, 1x HDR.
        assert_eq!(speed_mbps(2, 32), 100_000);
        assert_eq!(speed_mbps(2, 64), 200_000);
        assert_eq!(speed_mbps(2, 128), 400_000);
        assert_eq!(speed_mbps(1, 64), 50_000);
    }

    /// On a machine without an RDMA device (or without the library), the
    /// binding says why instead of failing in another way.
    #[test]
    fn no_device_says_why() {
        match Libibverbs::open() {
            Ok(verbs) => assert!(!verbs.devices().is_empty()),
            Err(why) => assert!(
                why.contains(LIBRARY)
                    || why.contains("no RDMA device")
                    || why.contains("ibv_get_device_list"),
                "{why}"
            ),
        }
    }
}
