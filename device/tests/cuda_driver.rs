//! The CUDA backend on whatever machine runs the tests: without a driver,
//! a typed error naming the missing library;
//! and in every case, binaries that link this crate name no CUDA library,
//! so they load where there is no driver.

use std::process::Command;

use rccl_device::cuda::{CudaError, Driver};

/// Whether the dynamic loader finds the driver library here.
fn driver_library_present() -> bool {
    // SAFETY: dlopen of a NUL-terminated name; the handle is left open (the
    // backend opens the same library).
    !unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null()
}

#[test]
fn without_a_driver_every_call_is_a_typed_error() {
    let present = driver_library_present();
    for _ in 0..2 {
        match Driver::get() {
            Ok(driver) => {
                assert!(present, "a driver without libcuda.so.1");
                // Where a driver exists, it answers for host memory too.
                let host = [0u8; 8];
                if driver.device_count().map(|n| n > 0).unwrap_or(false) {
                    assert_eq!(
                        driver.classify(host.as_ptr().cast()),
                        Ok(rccl_device::cuda::Memory::Host)
                    );
                }
            }
            Err(e) => {
                if present {
                    // A driver library without a usable device: cuInit's error.
                    assert!(matches!(e, CudaError::Driver { call: "cuInit", .. }), "{e}");
                    continue;
                }
                assert!(matches!(e, CudaError::NoDriver(_)), "{e:?}");
                let text = e.to_string();
                assert!(
                    text.starts_with("no CUDA driver: libcuda.so.1 could not be loaded"),
                    "{text}"
                );
            }
        }
    }
}

/// The NEEDED entries of an ELF file's dynamic section.
fn needed(path: &str) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["-d", path])
        .output()
        .expect("readelf runs");
    assert!(out.status.success(), "readelf -d {path}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(str::to_string)
        .collect()
}

#[test]
fn binaries_linking_the_crate_need_no_cuda_library() {
    let bin = env!("CARGO_BIN_EXE_rccl-kernel-check");
    let libs = needed(bin);
    assert!(libs.iter().any(|l| l.contains("libc.so")), "{libs:?}");
    for lib in &libs {
        for cuda in ["libcuda", "libcudart", "libnvrtc", "libnvidia"] {
            assert!(!lib.contains(cuda), "{bin} needs {lib}");
        }
    }
}

/// Selecting the CUDA backend opens it where a driver sees a device (the
/// label names it), and elsewhere fails with the driver's reason, never a
/// panic; the emulated GPU can still be selected after a failed attempt.
#[test]
fn selecting_cuda_opens_the_device_or_says_why_not() {
    let usable = Driver::get()
        .and_then(|d| d.device_count())
        .map(|n| n > 0)
        .unwrap_or(false);
    match rccl_device::select(rccl_device::Kind::Cuda) {
        Ok(device) => {
            assert!(usable, "a CUDA device without a driver");
            assert_eq!(device.backend(), "cuda");
            assert!(device.label().starts_with("[cuda "), "{}", device.label());
        }
        Err(e) => {
            assert!(!usable, "a usable driver, yet: {e}");
            let text = e.to_string();
            assert!(text.starts_with("RCCL_DEVICE=cuda: "), "{text}");
            if !driver_library_present() {
                assert!(text.contains("no CUDA driver: libcuda.so.1"), "{text}");
            }
            assert_eq!(
                rccl_device::select(rccl_device::Kind::Emu).map(|d| d.backend()),
                Ok("emu")
            );
        }
    }
}
