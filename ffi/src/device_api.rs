//! NCCL's device-side API (`nccl_device/host.h`): device communicators
//! that kernels of the user's own call into, the resources they ask for
//! (barriers, GIN in- and outboxes, LL all-to-all buffers), and pointers
//! into peers' symmetric windows. rccl-rs runs collectives on the host and
//! offers no device-side API, so each entry point exists (PyTorch's NCCL
//! process group and framework builds import them) and refuses with
//! `ncclInvalidUsage` and a message saying what is missing. The parts that
//! need no device code (properties, teams) are in `teams.rs`.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::check::usage;
use crate::comms::comm_of;
use crate::error::guard;

fn no_device_api(what: &str) -> rccl::Error {
    usage(format!(
        "not supported: {what} belongs to NCCL's device-side API (nccl_device), which \
         rccl-rs does not offer"
    ))
}

nccl_api! {
    fn ncclDevCommCreate / pncclDevCommCreate(
        comm: ncclComm_t, _reqs: *const c_void, _outDevComm: *mut c_void,
    ) -> ncclResult_t {
        guard("ncclDevCommCreate", comm, || {
            comm_of(comm)?;
            Err(no_device_api("ncclDevCommCreate"))
        })
    }

    fn ncclDevCommDestroy / pncclDevCommDestroy(
        comm: ncclComm_t, _devComm: *const c_void,
    ) -> ncclResult_t {
        guard("ncclDevCommDestroy", comm, || {
            comm_of(comm)?;
            Err(no_device_api("ncclDevCommDestroy"))
        })
    }

    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(
        _window: ncclWindow_t, _offset: usize, _outPtr: *mut *mut c_void,
    ) -> ncclResult_t {
        guard("ncclGetLsaMultimemDevicePointer", std::ptr::null_mut(), || {
            Err(no_device_api("ncclGetLsaMultimemDevicePointer"))
        })
    }

    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(
        _window: ncclWindow_t, _offset: usize, _peer: c_int, _outPtr: *mut *mut c_void,
    ) -> ncclResult_t {
        guard("ncclGetPeerDevicePointer", std::ptr::null_mut(), || {
            Err(no_device_api("ncclGetPeerDevicePointer"))
        })
    }
}

fn no_window_pointers(what: &str, needs: &str) -> rccl::Error {
    usage(format!(
        "not supported: {what} needs {needs}; rccl-rs windows are host memory reached \
         through its transports, with no device-side mappings of peers' windows"
    ))
}

fn no_device_resources(what: &str, resource: &str) -> rccl::Error {
    usage(format!(
        "not supported: {what} describes {resource} for ncclDevCommCreate, and rccl-rs \
         offers no device communicators (NCCL's device-side API)"
    ))
}

nccl_api! {
    fn ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(
        _window: ncclWindow_t, _offset: usize, _multimem: *const c_void, _outPtr: *mut *mut c_void,
    ) -> ncclResult_t {
        guard("ncclGetMultimemDevicePointer", std::ptr::null_mut(), || {
            Err(no_window_pointers("ncclGetMultimemDevicePointer", "multimem (NVLink multicast)"))
        })
    }

    fn ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(
        _window: ncclWindow_t, _offset: usize, _lsaRank: c_int, _outPtr: *mut *mut c_void,
    ) -> ncclResult_t {
        guard("ncclGetLsaDevicePointer", std::ptr::null_mut(), || {
            Err(no_window_pointers(
                "ncclGetLsaDevicePointer",
                "device pointers into the LSA (load/store accessible) peers' windows",
            ))
        })
    }

    fn ncclGetMultimemDeviceLeInfo / pncclGetMultimemDeviceLeInfo(
        _window: ncclWindow_t, _offset: usize, _leId: *mut u32, _leOffset: *mut usize,
    ) -> ncclResult_t {
        guard("ncclGetMultimemDeviceLeInfo", std::ptr::null_mut(), || {
            Err(no_window_pointers("ncclGetMultimemDeviceLeInfo", "CFT multicast endpoints"))
        })
    }

    fn ncclGetCftDeviceLeInfo / pncclGetCftDeviceLeInfo(
        _window: ncclWindow_t, _offset: usize, _peerCft: c_int, _cftTeam: crate::teams::ncclTeam_t,
        _leId: *mut u32, _leOffset: *mut usize,
    ) -> ncclResult_t {
        guard("ncclGetCftDeviceLeInfo", std::ptr::null_mut(), || {
            Err(no_window_pointers("ncclGetCftDeviceLeInfo", "CFT (collective fabric) endpoints"))
        })
    }

    fn ncclGetPeerDeviceLeInfo / pncclGetPeerDeviceLeInfo(
        _window: ncclWindow_t, _offset: usize, _peerWorld: c_int, _leId: *mut u32,
        _leOffset: *mut usize,
    ) -> ncclResult_t {
        guard("ncclGetPeerDeviceLeInfo", std::ptr::null_mut(), || {
            Err(no_window_pointers("ncclGetPeerDeviceLeInfo", "CFT (collective fabric) endpoints"))
        })
    }

    fn ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(
        _team: crate::teams::ncclTeam_t, _nBarriers: c_int, _outHandle: *mut c_void,
        _outReq: *mut c_void,
    ) -> ncclResult_t {
        guard("ncclLsaBarrierCreateRequirement", std::ptr::null_mut(), || {
            Err(no_device_resources("ncclLsaBarrierCreateRequirement", "LSA barriers"))
        })
    }

    fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(
        comm: ncclComm_t, _team: crate::teams::ncclTeam_t, _nBarriers: c_int,
        _outHandle: *mut c_void, _outReq: *mut c_void,
    ) -> ncclResult_t {
        guard("ncclGinBarrierCreateRequirement", comm, || {
            comm_of(comm)?;
            Err(no_device_resources(
                "ncclGinBarrierCreateRequirement",
                "GIN (GPU-initiated networking) barriers",
            ))
        })
    }

    fn ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement(
        _nBlocks: c_int, _size_log2: c_int, _outHandle: *mut c_void, _outReq: *mut c_void,
    ) -> ncclResult_t {
        guard("ncclGinOutboxCreateRequirement", std::ptr::null_mut(), || {
            Err(no_device_resources("ncclGinOutboxCreateRequirement", "GIN outboxes"))
        })
    }

    fn ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement(
        _peers: crate::teams::ncclTeam_t, _nBlocks: c_int, _size_log2: c_int,
        _outHandle: *mut c_void, _outReq: *mut c_void,
    ) -> ncclResult_t {
        guard("ncclGinInboxA2ACreateRequirement", std::ptr::null_mut(), || {
            Err(no_device_resources("ncclGinInboxA2ACreateRequirement", "GIN all-to-all inboxes"))
        })
    }

    fn ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(
        _nBlocks: c_int, _nSlots: c_int, _outHandle: *mut c_void, _outReq: *mut c_void,
    ) -> ncclResult_t {
        guard("ncclLLA2ACreateRequirement", std::ptr::null_mut(), || {
            Err(no_device_resources("ncclLLA2ACreateRequirement", "LL all-to-all buffers"))
        })
    }

    /// The slots an LL all-to-all needs for `maxElts` elements of up to
    /// `maxEltSize` bytes: one 8-byte payload per slot, so
    /// `maxElts * ceil(maxEltSize / 8)`. -1 (with the reason in
    /// `ncclGetLastError`) for a negative or overflowing count.
    fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
        let mut slots = -1;
        guard("ncclLLA2ACalcSlots", std::ptr::null_mut(), || {
            let per_elt = (maxEltSize >= 0).then(|| (maxEltSize as u32).div_ceil(8) as c_int);
            slots = per_elt
                .filter(|_| maxElts >= 0)
                .and_then(|per_elt| maxElts.checked_mul(per_elt))
                .ok_or_else(|| {
                    crate::check::invalid(format!(
                        "{maxElts} elements of {maxEltSize} bytes: counts must be \
                         non-negative and their slots fit in an int"
                    ))
                })?;
            Ok(ncclSuccess)
        });
        slots
    }
}
