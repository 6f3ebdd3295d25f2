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

use super::{
    CompletionQueue, Device, DeviceInfo, GidEntry, LinkLayer, MemoryRegion, PathSettings, PortInfo,
    QpCaps, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, Verbs, VerbsError, Wc, WcOpcode, WcStatus,
};

mod abi;
mod device;
mod queues;
#[cfg(test)]
mod tests;

use abi::*;
use device::{Events, RealDevice};
use queues::{RealCq, RealQp};

/// The library's name.
pub const LIBRARY: &str = "libibverbs.so.1";

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
    // SAFETY: the caller's contract: the bytes at `base + offset` are a `T`
    // inside the structure, read without assuming alignment.
    unsafe { std::ptr::read_unaligned(base.cast::<u8>().add(offset).cast::<T>()) }
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
