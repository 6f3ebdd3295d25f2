//! Memory: allocation and free wait for running kernels; pointers and
//! address ranges answer as documented.

#[macro_use]
mod common;

use std::ffi::c_void;

use common::{
    alloc, context, cu, isolated, stream, Kernels, DEVICEMAP, INVALID_VALUE, LAUNCH_TIMEOUT,
    NON_BLOCKING, NOT_FOUND,
};

#[test]
fn allocation_and_free_wait_for_running_kernels() {
    let stderr = isolated(
        "allocation_and_free_wait_for_running_kernels",
        &[("RCCL_CUDA_MODEL_DEADLINE_MS", "300")],
        || {
            context(0);
            let spare = alloc(8);
            let k = Kernels::load();
            let waiting = k.waiting_kernel(stream(NON_BLOCKING));
            let mut p = 0;
            fails!(LAUNCH_TIMEOUT, (cu().cuMemAlloc_v2)(&mut p, 8));
            fails!(LAUNCH_TIMEOUT, (cu().cuMemFree_v2)(spare));
            let mut h = std::ptr::null_mut();
            fails!(LAUNCH_TIMEOUT, (cu().cuMemHostAlloc)(&mut h, 8, 0));
            waiting.release();
            ok!((cu().cuCtxSynchronize)());
            ok!((cu().cuMemAlloc_v2)(&mut p, 8));
            ok!((cu().cuMemFree_v2)(spare));
        },
    );
    assert!(
        stderr.contains("cuMemAlloc on device 0 waits for the kernels launched before it"),
        "{stderr}"
    );
}

#[test]
fn host_memory_pointers_and_address_ranges_answer_as_documented() {
    isolated(
        "host_memory_pointers_and_address_ranges_answer_as_documented",
        &[],
        || {
            context(1);
            let dptr = alloc(1000);
            let (mut kind, mut ordinal) = (0u32, -1i32);
            ok!((cu().cuPointerGetAttribute)(
                (&mut kind as *mut u32).cast(),
                2,
                dptr + 10
            ));
            ok!((cu().cuPointerGetAttribute)(
                (&mut ordinal as *mut i32).cast(),
                9,
                dptr
            ));
            assert_eq!((kind, ordinal), (2, 1));
            let (mut base, mut size) = (0u64, 0usize);
            ok!((cu().cuMemGetAddressRange_v2)(
                &mut base,
                &mut size,
                dptr + 999
            ));
            assert_eq!((base, size), (dptr, 1000));
            fails!(
                NOT_FOUND,
                (cu().cuMemGetAddressRange_v2)(&mut base, &mut size, dptr + 1000)
            );
            // Pinned memory not mapped has no device pointer.
            let (mut plain, mut mapped) = (std::ptr::null_mut(), std::ptr::null_mut());
            ok!((cu().cuMemHostAlloc)(&mut plain, 64, 0));
            ok!((cu().cuMemHostAlloc)(&mut mapped, 64, DEVICEMAP));
            let mut dev = 0u64;
            fails!(
                INVALID_VALUE,
                (cu().cuMemHostGetDevicePointer_v2)(&mut dev, plain, 0)
            );
            ok!((cu().cuMemHostGetDevicePointer_v2)(&mut dev, mapped, 0));
            assert_eq!(dev, mapped as u64);
            ok!((cu().cuPointerGetAttribute)(
                (&mut kind as *mut u32).cast(),
                2,
                mapped as u64
            ));
            assert_eq!(kind, 1);
            // Memory the driver does not know: an error from
            // cuPointerGetAttribute, null answers from cuPointerGetAttributes.
            let host = [0u8; 8];
            fails!(
                INVALID_VALUE,
                (cu().cuPointerGetAttribute)(
                    (&mut kind as *mut u32).cast(),
                    2,
                    host.as_ptr() as u64
                )
            );
            kind = 9;
            let attrs = [2u32];
            let mut slots = [(&mut kind as *mut u32).cast::<c_void>()];
            ok!((cu().cuPointerGetAttributes)(
                1,
                attrs.as_ptr(),
                slots.as_mut_ptr(),
                host.as_ptr() as u64
            ));
            assert_eq!(kind, 0);
        },
    );
}
