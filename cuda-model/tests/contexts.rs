//! Contexts and devices: `cuInit` first, a context stack per thread,
//! released contexts gone, each device's memory its own.

#[macro_use]
mod common;

use common::{
    alloc, context, cu, isolated, Kernels, ILLEGAL_ADDRESS, INVALID_CONTEXT, INVALID_VALUE,
    NOT_INITIALIZED, P,
};

#[test]
fn every_call_before_cuinit_fails() {
    isolated("every_call_before_cuinit_fails", &[], || {
        let mut n = 0;
        fails!(NOT_INITIALIZED, (cu().cuDeviceGetCount)(&mut n));
        let mut p = 0;
        fails!(NOT_INITIALIZED, (cu().cuMemAlloc_v2)(&mut p, 8));
        ok!((cu().cuInit)(0));
        ok!((cu().cuDeviceGetCount)(&mut n));
        assert_eq!(n, 2);
    });
}

#[test]
fn a_thread_without_a_context_gets_invalid_context() {
    isolated(
        "a_thread_without_a_context_gets_invalid_context",
        &[],
        || {
            context(0);
            let dptr = alloc(64);
            std::thread::spawn(move || {
                let mut p = 0;
                fails!(INVALID_CONTEXT, (cu().cuMemAlloc_v2)(&mut p, 8));
                let mut kind = 0u32;
                // CU_POINTER_ATTRIBUTE_MEMORY_TYPE of a device pointer.
                fails!(
                    INVALID_CONTEXT,
                    (cu().cuPointerGetAttribute)((&mut kind as *mut u32).cast(), 2, dptr)
                );
                fails!(INVALID_CONTEXT, (cu().cuMemsetD8_v2)(dptr, 0, 64));
            })
            .join()
            .unwrap();
        },
    );
}

#[test]
fn contexts_stack_per_thread_and_released_ones_are_gone() {
    isolated(
        "contexts_stack_per_thread_and_released_ones_are_gone",
        &[],
        || {
            let ctx0 = context(0);
            let mut ctx1 = std::ptr::null_mut();
            ok!((cu().cuDevicePrimaryCtxRetain)(&mut ctx1, 1));
            ok!((cu().cuCtxPushCurrent_v2)(ctx1));
            let mut dev = -1;
            ok!((cu().cuCtxGetDevice)(&mut dev));
            assert_eq!(dev, 1);
            let mut popped = std::ptr::null_mut();
            ok!((cu().cuCtxPopCurrent_v2)(&mut popped));
            assert_eq!(popped, ctx1);
            let mut now = std::ptr::null_mut();
            ok!((cu().cuCtxGetCurrent)(&mut now));
            assert_eq!(now, ctx0);
            // Another thread starts with no context.
            std::thread::spawn(|| {
                let mut now = 1 as P;
                ok!((cu().cuCtxGetCurrent)(&mut now));
                assert!(now.is_null());
            })
            .join()
            .unwrap();
            // Released to zero, device 1's context and its memory are gone.
            ok!((cu().cuDevicePrimaryCtxRelease_v2)(1));
            fails!(709, (cu().cuCtxPushCurrent_v2)(ctx1));
        },
    );
}

#[test]
fn memory_of_one_device_fails_from_the_others_context() {
    isolated(
        "memory_of_one_device_fails_from_the_others_context",
        &[],
        || {
            context(0);
            let on0 = alloc(64);
            context(1);
            fails!(INVALID_VALUE, (cu().cuMemsetD8_v2)(on0, 0, 64));
            // A kernel of device 1 reading device 0's memory faults.
            let k = Kernels::load();
            let on1 = alloc(64);
            k.copy(on1, on0, 64, std::ptr::null_mut());
            fails!(ILLEGAL_ADDRESS, (cu().cuCtxSynchronize)());
        },
    );
}
