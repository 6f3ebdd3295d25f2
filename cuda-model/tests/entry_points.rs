//! The model exports every driver entry point the CUDA backend resolves:
//! the backend's own list (`rccl_device::cuda::ENTRY_POINTS`), looked up
//! in the built model library as the backend looks them up in the driver.

mod common;

use common::model_library;

#[test]
fn every_entry_point_the_backend_calls_is_exported() {
    let path = std::ffi::CString::new(model_library().to_str().unwrap()).unwrap();
    // SAFETY: dlopen of a NUL-terminated path; the handle stays open for
    // the process.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "the model loads");
    let missing: Vec<&str> = rccl_device::cuda::ENTRY_POINTS
        .iter()
        .copied()
        .filter(|name| {
            let name = std::ffi::CString::new(*name).unwrap();
            // SAFETY: a live handle and a NUL-terminated name.
            unsafe { libc::dlsym(lib, name.as_ptr()) }.is_null()
        })
        .collect();
    assert!(
        !rccl_device::cuda::ENTRY_POINTS.is_empty(),
        "the backend names its entry points"
    );
    assert!(
        missing.is_empty(),
        "entry points the backend calls that the model does not export: {missing:?}"
    );
}
