//! The C types and constants of `nccl.h` (NCCL 2.32), as `ffi/include/nccl.h`
//! declares them.

#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;
pub const ncclTimeout: ncclResult_t = 8;

/// `ncclDataType_t` and `ncclRedOp_t` are C enums of `int` width.
pub type ncclDataType_t = c_int;
pub type ncclRedOp_t = c_int;
pub type ncclScalarResidence_t = c_int;
pub type ncclCommMemStat_t = c_int;
pub const ncclNumOps: c_int = 5;
pub const ncclScalarDevice: c_int = 0;
pub const ncclScalarHostImmediate: c_int = 1;

/// `NCCL_VERSION_CODE` of the API level implemented.
pub const NCCL_VERSION_CODE: c_int = 23206;
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
pub const NCCL_SHRINK_ABORT: c_int = 1;

/// The opaque communicator (`struct ncclComm`); handles are never
/// dereferenced, only looked up.
pub enum ncclComm {}
pub type ncclComm_t = *mut ncclComm;
/// The opaque window (`struct ncclWindow_vidmem`).
pub enum ncclWindow {}
pub type ncclWindow_t = *mut ncclWindow;
/// The opaque parameter handle (`struct ncclParamHandle`).
pub enum ncclParamHandle {}
pub type ncclParamHandle_t = *mut ncclParamHandle;
/// `cudaStream_t`: the stream a call on device memory is ordered on
/// (calls on host memory complete before they return and ignore it).
pub type cudaStream_t = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; 128],
}

/// `ncclConfig_t` (`struct ncclConfig_v23100`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}

impl ncclConfig_t {
    /// What `NCCL_CONFIG_INITIALIZER` produces.
    pub fn initializer() -> ncclConfig_t {
        const U: c_int = NCCL_CONFIG_UNDEF_INT;
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            blocking: U,
            cgaClusterSize: U,
            minCTAs: U,
            maxCTAs: U,
            netName: std::ptr::null(),
            splitShare: U,
            trafficClass: U,
            commName: std::ptr::null(),
            collnetEnable: U,
            CTAPolicy: U,
            shrinkShare: U,
            nvlsCTAs: U,
            nChannelsPerNetPeer: U,
            nvlinkCentricSched: U,
            graphUsageMode: U,
            numRmaCtx: U,
            maxP2pPeers: U,
            graphStreamOrdering: U,
            launchOrderImplicit: U,
            numRmaSig: U,
            rmaEagerInit: U,
            hostCftMode: U,
            nvlsHostMode: U,
        }
    }
}

/// `ncclConfigExt_t`.
#[repr(C)]
pub struct ncclConfigExt_t {
    pub next: *mut ncclConfigExt_t,
    pub vendor_id: c_int,
    pub option_id: c_int,
    pub val: *mut c_void,
}

/// `ncclCollConfig_t` (`struct ncclCollConfig_v23200`).
#[repr(C)]
pub struct ncclCollConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub ext: *mut ncclConfigExt_t,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub nvlsCTAs: c_int,
    pub cgaClusterSize: c_int,
    pub algSelection: *const c_char,
    pub forceAlgSelection: c_int,
    pub CTAPolicy: c_int,
    pub userProfilerTag: u64,
    pub launchCompletionEvent: *mut c_void,
}

/// `ncclSimInfo_t`.
#[repr(C)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}

/// `ncclEncryptionConfig_t`.
#[repr(C)]
pub struct ncclEncryptionConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub mode: c_int,
    pub psk: *const c_char,
}

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}
