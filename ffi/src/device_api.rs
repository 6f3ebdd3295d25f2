//! NCCL's device-side API (`nccl_device/core.h`): device communicators
//! that kernels of the user's own call into, and pointers into peers'
//! symmetric windows. rccl-rs runs collectives on the host and offers no
//! device-side API, so each entry point exists (PyTorch's NCCL process
//! group imports them) and refuses with `ncclInvalidUsage` and a message.

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
