//! Kernels: the committed fatbin runs as its host twin, a block per
//! modeled SM, and a fault is sticky.

#[macro_use]
mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rccl_device::abi::ReduceArgs;

use common::{
    alloc, close_gate, context, count_call, cu, isolated, launches, read, stream, Kernels,
    ILLEGAL_ADDRESS, INVALID_IMAGE, INVALID_VALUE, LAUNCH_TIMEOUT, NON_BLOCKING, NOT_FOUND, P,
};

#[test]
fn blocks_beyond_the_modeled_sms_wait_and_the_model_says_so() {
    let stderr = isolated(
        "blocks_beyond_the_modeled_sms_wait_and_the_model_says_so",
        &[
            ("RCCL_CUDA_MODEL_SMS", "1"),
            ("RCCL_CUDA_MODEL_DEADLINE_MS", "300"),
        ],
        || {
            context(0);
            let k = Kernels::load();
            // Allocated first: allocation waits for running kernels.
            let (a, b) = (alloc(8), alloc(8));
            let waiting = k.waiting_kernel(stream(NON_BLOCKING));
            // A second kernel on another stream finds no free SM.
            let other = stream(NON_BLOCKING);
            k.copy(a, b, 8, other);
            // Past the model's deadline, the block that found no SM fails.
            std::thread::sleep(Duration::from_millis(600));
            fails!(LAUNCH_TIMEOUT, (cu().cuStreamSynchronize)(other));
            waiting.release();
        },
    );
    assert!(
        stderr.contains("block 0 of rccl_copy on device 0 waits for a free SM: all 1 modeled SMs"),
        "{stderr}"
    );
}

#[test]
fn two_sms_hold_two_kernels_at_once() {
    isolated(
        "two_sms_hold_two_kernels_at_once",
        &[
            ("RCCL_CUDA_MODEL_SMS", "2"),
            ("RCCL_CUDA_MODEL_DEADLINE_MS", "300"),
        ],
        || {
            context(0);
            let k = Kernels::load();
            let (a, b) = (alloc(8), alloc(8));
            let waiting = k.waiting_kernel(stream(NON_BLOCKING));
            let other = stream(NON_BLOCKING);
            k.copy(a, b, 8, other);
            ok!((cu().cuStreamSynchronize)(other));
            waiting.release();
            ok!((cu().cuCtxSynchronize)());
        },
    );
}

#[test]
fn a_faulting_kernel_makes_the_context_error_sticky() {
    isolated(
        "a_faulting_kernel_makes_the_context_error_sticky",
        &[("RCCL_CUDA_MODEL_FAULT", "rccl_copy")],
        || {
            context(0);
            let k = Kernels::load();
            let s = stream(NON_BLOCKING);
            let (a, b) = (alloc(8), alloc(8));
            let calls: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
            let gate = close_gate(s);
            k.copy(a, b, 8, s);
            ok!((cu().cuLaunchHostFunc)(
                s,
                count_call,
                calls as *const AtomicU32 as P
            ));
            gate.0.store(true, Ordering::Release);
            fails!(ILLEGAL_ADDRESS, (cu().cuStreamSynchronize)(s));
            let mut p = 0;
            fails!(ILLEGAL_ADDRESS, (cu().cuMemAlloc_v2)(&mut p, 8));
            fails!(ILLEGAL_ADDRESS, (cu().cuCtxSynchronize)());
            // Work behind the fault never runs.
            assert_eq!(calls.load(Ordering::Relaxed), 0);
        },
    );
}

#[test]
fn kernels_of_the_fatbin_run_as_the_host_twin() {
    isolated("kernels_of_the_fatbin_run_as_the_host_twin", &[], || {
        context(0);
        let mut module = std::ptr::null_mut();
        let wrong = vec![0u64; 64];
        fails!(
            INVALID_IMAGE,
            (cu().cuModuleLoadData)(&mut module, wrong.as_ptr().cast())
        );
        let k = Kernels::load();
        let mut f = std::ptr::null_mut();
        fails!(
            NOT_FOUND,
            (cu().cuModuleGetFunction)(&mut f, k.module, c"no_such_kernel".as_ptr())
        );
        ok!((cu().cuModuleGetFunction)(
            &mut f,
            k.module,
            c"rccl_reduce_float32".as_ptr()
        ));
        let (a, b, out) = (alloc(16), alloc(16), alloc(16));
        let one: Vec<u8> = [1.5f32; 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        let two: Vec<u8> = [2.25f32; 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        ok!((cu().cuMemcpyHtoD_v2)(a, one.as_ptr().cast(), 16));
        ok!((cu().cuMemcpyHtoD_v2)(b, two.as_ptr().cast(), 16));
        // float32 (7) sum (0)
        let mut args = ReduceArgs::new(7, 0, 2, [0; 8], a as P, b as P, out as P, 4, false);
        let mut params = [(&mut args as *mut ReduceArgs).cast::<c_void>()];
        let null: P = std::ptr::null_mut();
        ok!((cu().cuLaunchKernel)(
            f,
            1,
            1,
            1,
            512,
            1,
            1,
            0,
            null,
            params.as_mut_ptr(),
            null.cast()
        ));
        // Past the kernel's launch bound.
        fails!(
            INVALID_VALUE,
            (cu().cuLaunchKernel)(
                f,
                1,
                1,
                1,
                1024,
                1,
                1,
                0,
                null,
                params.as_mut_ptr(),
                null.cast()
            )
        );
        let sums: Vec<f32> = read(out, 16)
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(sums, vec![3.75; 4]);
    });
}

#[test]
fn kernel_launches_are_counted_per_name_with_each_graph_launch() {
    isolated(
        "kernel_launches_are_counted_per_name_with_each_graph_launch",
        &[],
        || {
            context(0);
            let k = Kernels::load();
            let s = stream(NON_BLOCKING);
            let (a, b) = (alloc(8), alloc(8));
            assert_eq!(launches(c"rccl_copy"), 0);
            k.copy(a, b, 8, s);
            k.copy(a, b, 8, s);
            ok!((cu().cuStreamSynchronize)(s));
            assert_eq!(launches(c"rccl_copy"), 2);
            // Captured, a launch is a node: it runs with each graph launch.
            ok!((cu().cuStreamBeginCapture_v2)(s, 0));
            k.copy(a, b, 8, s);
            let mut graph = std::ptr::null_mut();
            ok!((cu().cuStreamEndCapture)(s, &mut graph));
            let mut exec = std::ptr::null_mut();
            ok!((cu().cuGraphInstantiateWithFlags)(&mut exec, graph, 0));
            assert_eq!(launches(c"rccl_copy"), 2);
            for _ in 0..3 {
                ok!((cu().cuGraphLaunch)(exec, s));
            }
            ok!((cu().cuStreamSynchronize)(s));
            assert_eq!(launches(c"rccl_copy"), 5);
            assert_eq!(launches(c"rccl_run_work"), 0);
            let mut count = 0;
            fails!(
                INVALID_VALUE,
                (cu().rccl_cuda_model_launches)(std::ptr::null(), &mut count)
            );
        },
    );
}
