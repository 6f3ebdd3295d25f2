//! NCCL's net plug-in interface as C sees it: the structures of function
//! pointers a plug-in exports as `ncclNetPlugin_v8` .. `ncclNetPlugin_v12`,
//! their device properties, and the result codes, log levels and flags.
//! Written from the layouts of NCCL's public headers (`nccl_net.h` and
//! `net/net_v8.h` .. `net_v12.h`); every function pointer is an `Option`,
//! since a plug-in may leave an entry it does not implement null.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclSystemError`: a system call or the peer failed.
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`: the caller broke the contract, or a bug.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`: the peer went away.
pub const REMOTE_ERROR: NcclResult = 6;

/// NCCL's name of a result code.
pub fn result_name(code: NcclResult) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "an unknown ncclResult_t",
    }
}

pub use rccl_env::{Logger, LOG_INFO, LOG_WARN};
/// `NCCL_LOG_TRACE`.
pub const LOG_TRACE: c_int = 5;
/// `ncclDebugLogSubSys`: `NCCL_INIT`.
pub const SUBSYS_INIT: c_ulong = 0x1;
/// `NCCL_NET`.
pub const SUBSYS_NET: c_ulong = 0x10;

/// `NCCL_PTR_HOST`.
pub const PTR_HOST: c_int = 0x1;
/// `NCCL_PTR_CUDA`.
pub const PTR_CUDA: c_int = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const PTR_DMABUF: c_int = 0x4;
/// `NCCL_NET_DEVICE_HOST`: no network offload (the only type served).
pub const NET_DEVICE_HOST: c_int = 0;
/// `MAX_NET_SIZE`: a v8 plug-in's largest transfer (it cannot say).
pub const MAX_NET_SIZE: usize = 1 << 30;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
pub const TRAFFIC_CLASS_UNDEF: c_int = -1;

/// `ncclProfilerCallback_t`.
pub type ProfilerCallback = unsafe extern "C" fn(
    event: *mut *mut c_void,
    kind: c_int,
    parent: *mut c_void,
    plugin_id: i64,
    data: *mut c_void,
) -> NcclResult;

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetVDeviceProps_v9_t` .. `_v11_t` (4 devices), `_v12_t` (8).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VDeviceProperties<const N: usize> {
    pub ndevs: c_int,
    pub devs: [c_int; N],
}

/// `ncclNetProperties_v9_t` and `_v10_t` (the same layout); with `T` the
/// fields a later version appends.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV9<const NDEVS: usize, T> {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub vprops: VDeviceProperties<NDEVS>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub tail: T,
}

/// What v11 appends to the properties.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TailV11 {
    pub max_multi_request_size: c_int,
}

/// What v12 appends to the properties.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TailV12 {
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

/// `ncclNetProperties_v9_t` / `_v10_t`.
pub type PropertiesV10 = PropertiesV9<4, ()>;
/// `ncclNetProperties_v11_t`.
pub type PropertiesV11 = PropertiesV9<4, TailV11>;
/// `ncclNetProperties_v12_t`.
pub type PropertiesV12 = PropertiesV9<8, TailV12>;

/// `ncclNetCommConfig_v10_t` .. `_v12_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommConfig {
    pub traffic_class: c_int,
}

type Ptr = *mut c_void;
type Out = *mut *mut c_void;

/// The entries every version from v8 to v12 shares, with the same types.
macro_rules! net_table {
    (
        $(#[$meta:meta])* $table:ident, $props:ty,
        init: ($($init:ty),*),
        listen: ($($listen:ty),*),
        connect: ($($connect:ty),*),
        size: $size:ty,
        send_extra: ($($send_extra:ty),*),
        recv_extra: ($($recv_extra:ty),*),
        tail: { $($field:ident : $fty:ty),* $(,)? }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct $table {
            pub name: *const c_char,
            pub init: Option<unsafe extern "C" fn($($init),*) -> NcclResult>,
            pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
            pub get_properties: Option<unsafe extern "C" fn(c_int, *mut $props) -> NcclResult>,
            pub listen: Option<unsafe extern "C" fn($($listen,)* c_int, Ptr, Out) -> NcclResult>,
            pub connect: Option<unsafe extern "C" fn($($connect,)* Ptr, Out, Out) -> NcclResult>,
            pub accept: Option<unsafe extern "C" fn(Ptr, Out, Out) -> NcclResult>,
            pub reg_mr: Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Out) -> NcclResult>,
            pub reg_mr_dma_buf:
                Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, c_int, Out) -> NcclResult>,
            pub dereg_mr: Option<unsafe extern "C" fn(Ptr, Ptr) -> NcclResult>,
            pub isend: Option<
                unsafe extern "C" fn(Ptr, Ptr, $size, c_int, Ptr, $($send_extra,)* Out) -> NcclResult,
            >,
            pub irecv: Option<
                unsafe extern "C" fn(
                    Ptr, c_int, *mut Ptr, *mut $size, *mut c_int, *mut Ptr, $($recv_extra,)* Out,
                ) -> NcclResult,
            >,
            pub iflush: Option<
                unsafe extern "C" fn(Ptr, c_int, *mut Ptr, *mut c_int, *mut Ptr, Out) -> NcclResult,
            >,
            pub test: Option<unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int) -> NcclResult>,
            pub close_send: Option<unsafe extern "C" fn(Ptr) -> NcclResult>,
            pub close_recv: Option<unsafe extern "C" fn(Ptr) -> NcclResult>,
            pub close_listen: Option<unsafe extern "C" fn(Ptr) -> NcclResult>,
            pub get_device_mr: Option<unsafe extern "C" fn(Ptr, Ptr, Out) -> NcclResult>,
            pub irecv_consumed: Option<unsafe extern "C" fn(Ptr, c_int, Ptr) -> NcclResult>,
            $(pub $field: $fty,)*
        }

        // SAFETY: the table is constant data (a name and function
        // pointers) that the plug-in never changes after it is loaded.
        unsafe impl Sync for $table {}
        // SAFETY: as above.
        unsafe impl Send for $table {}
    };
}

/// `makeVDevice` (v9 on).
pub type MakeVDevice<const N: usize> =
    Option<unsafe extern "C" fn(*mut c_int, *mut VDeviceProperties<N>) -> NcclResult>;
/// `finalize` (v11 on).
pub type Finalize = Option<unsafe extern "C" fn(Ptr) -> NcclResult>;
/// `setNetAttr` (v11 on); the attributes are never set here.
pub type SetNetAttr = Option<unsafe extern "C" fn(Ptr, Ptr) -> NcclResult>;

net_table!(
    /// `ncclNet_v8_t`: sizes are `int`.
    NetV8, PropertiesV8,
    init: (Logger),
    listen: (),
    connect: (c_int),
    size: c_int,
    send_extra: (),
    recv_extra: (),
    tail: {}
);

net_table!(
    /// `ncclNet_v9_t`: sizes are `size_t`; virtual devices.
    NetV9, PropertiesV10,
    init: (Logger),
    listen: (),
    connect: (c_int),
    size: usize,
    send_extra: (),
    recv_extra: (),
    tail: { make_vdevice: MakeVDevice<4> }
);

net_table!(
    /// `ncclNet_v10_t`: a profiler callback, a per-connection
    /// configuration, profiler handles on sends and receives.
    NetV10, PropertiesV10,
    init: (Logger, ProfilerCallback),
    listen: (),
    connect: (c_int, *mut CommConfig),
    size: usize,
    send_extra: (Ptr),
    recv_extra: (*mut Ptr),
    tail: { make_vdevice: MakeVDevice<4> }
);

net_table!(
    /// `ncclNet_v11_t`: a context per communicator (`init` makes it,
    /// `listen` and `connect` take it, `finalize` ends it).
    NetV11, PropertiesV11,
    init: (Out, u64, *mut CommConfig, Logger, ProfilerCallback),
    listen: (Ptr),
    connect: (Ptr, c_int),
    size: usize,
    send_extra: (Ptr),
    recv_extra: (*mut Ptr),
    tail: { make_vdevice: MakeVDevice<4>, finalize: Finalize, set_net_attr: SetNetAttr }
);

net_table!(
    /// `ncclNet_v12_t`: as v11, with rail and plane ids and 8 devices per
    /// virtual NIC in the properties.
    NetV12, PropertiesV12,
    init: (Out, u64, *mut CommConfig, Logger, ProfilerCallback),
    listen: (Ptr),
    connect: (Ptr, c_int),
    size: usize,
    send_extra: (Ptr),
    recv_extra: (*mut Ptr),
    tail: { make_vdevice: MakeVDevice<8>, finalize: Finalize, set_net_attr: SetNetAttr }
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets as NCCL's headers give them on 64-bit Linux.
    #[test]
    fn layouts_match_nccls_headers() {
        assert_eq!(size_of::<PropertiesV8>(), 64);
        assert_eq!(offset_of!(PropertiesV10, vprops), 64);
        assert_eq!(offset_of!(PropertiesV10, max_p2p_bytes), 88);
        assert_eq!(size_of::<PropertiesV10>(), 104);
        assert_eq!(size_of::<PropertiesV11>(), 112);
        assert_eq!(offset_of!(PropertiesV12, max_p2p_bytes), 104);
        assert_eq!(offset_of!(PropertiesV12, tail), 120);
        assert_eq!(size_of::<PropertiesV12>(), 128);
        let word = size_of::<usize>();
        assert_eq!(size_of::<NetV8>(), 19 * word);
        assert_eq!(size_of::<NetV9>(), 20 * word);
        assert_eq!(size_of::<NetV10>(), 20 * word);
        assert_eq!(size_of::<NetV11>(), 22 * word);
        assert_eq!(size_of::<NetV12>(), 22 * word);
        assert_eq!(offset_of!(NetV8, test), 13 * word);
        assert_eq!(offset_of!(NetV12, finalize), 20 * word);
    }
}
