//! Stream order: the legacy stream's rules, late synchronous memsets and
//! copies, events, waits on a mapped word, and host functions (one at a
//! time, never calling the driver).

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::{
    alloc, close_gate, context, count_call, cu, isolated, read, stream, wait_gate, Gate, DEVICEMAP,
    GARBAGE, INVALID_VALUE, NON_BLOCKING, NOT_PERMITTED, NOT_READY, P,
};

#[test]
fn a_synchronous_memset_of_device_memory_lands_after_it_returns() {
    isolated(
        "a_synchronous_memset_of_device_memory_lands_after_it_returns",
        &[],
        || {
            context(0);
            let buf = alloc(16);
            let gate = close_gate(std::ptr::null_mut());
            ok!((cu().cuMemsetD8_v2)(buf, 0, 16));
            // Returned, but not run: fresh memory still holds garbage.
            // SAFETY: model memory is host memory; read behind its back.
            assert_eq!(unsafe { *(buf as *const u8) }, GARBAGE);
            gate.0.store(true, Ordering::Release);
            assert_eq!(read(buf, 16), vec![0; 16]);
        },
    );
}

#[test]
fn the_legacy_stream_orders_blocking_streams_and_not_non_blocking_ones() {
    isolated(
        "the_legacy_stream_orders_blocking_streams_and_not_non_blocking_ones",
        &[],
        || {
            context(0);
            let (x, y, z) = (alloc(4), alloc(4), alloc(4));
            let blocking = stream(0);
            let non_blocking = stream(NON_BLOCKING);
            let gate = close_gate(blocking);
            // The legacy stream waits for the held blocking stream...
            ok!((cu().cuMemsetD8Async)(x, 1, 4, std::ptr::null_mut()));
            // ...and a non-blocking stream does not wait for the legacy one.
            ok!((cu().cuMemsetD8Async)(y, 2, 4, non_blocking));
            ok!((cu().cuStreamSynchronize)(non_blocking));
            // A blocking stream waits for the legacy stream's memset.
            let other = stream(0);
            ok!((cu().cuMemsetD8Async)(z, 3, 4, other));
            std::thread::sleep(Duration::from_millis(50));
            fails!(NOT_READY, (cu().cuStreamQuery)(other));
            fails!(NOT_READY, (cu().cuStreamQuery)(std::ptr::null_mut()));
            // SAFETY: model memory is host memory.
            unsafe {
                assert_eq!(*(y as *const u8), 2);
                assert_eq!(*(x as *const u8), GARBAGE);
            }
            gate.0.store(true, Ordering::Release);
            ok!((cu().cuStreamSynchronize)(other));
            assert_eq!(read(x, 4), vec![1; 4]);
            assert_eq!(read(z, 4), vec![3; 4]);
        },
    );
}

#[test]
fn a_copy_from_pageable_memory_is_staged_and_lands_late() {
    isolated(
        "a_copy_from_pageable_memory_is_staged_and_lands_late",
        &[],
        || {
            context(0);
            let buf = alloc(8);
            let gate = close_gate(std::ptr::null_mut());
            let mut src = vec![7u8; 8];
            ok!((cu().cuMemcpyHtoD_v2)(buf, src.as_ptr().cast(), 8));
            src.fill(9);
            // SAFETY: model memory is host memory.
            assert_eq!(unsafe { *(buf as *const u8) }, GARBAGE);
            drop(src);
            gate.0.store(true, Ordering::Release);
            assert_eq!(read(buf, 8), vec![7; 8]);
        },
    );
}

#[test]
fn events_order_streams_and_answer_queries() {
    isolated("events_order_streams_and_answer_queries", &[], || {
        context(0);
        let (a, b) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
        let buf = alloc(4);
        let mut e = std::ptr::null_mut();
        ok!((cu().cuEventCreate)(&mut e, 0));
        // Never recorded: complete.
        ok!((cu().cuEventQuery)(e));
        let gate = close_gate(a);
        ok!((cu().cuEventRecord)(e, a));
        fails!(NOT_READY, (cu().cuEventQuery)(e));
        ok!((cu().cuStreamWaitEvent)(b, e, 0));
        ok!((cu().cuMemsetD8Async)(buf, 5, 4, b));
        std::thread::sleep(Duration::from_millis(50));
        fails!(NOT_READY, (cu().cuStreamQuery)(b));
        gate.0.store(true, Ordering::Release);
        ok!((cu().cuEventSynchronize)(e));
        ok!((cu().cuStreamSynchronize)(b));
        assert_eq!(read(buf, 4), vec![5; 4]);
    });
}

unsafe extern "C" fn call_the_driver(arg: P) {
    let mut p = 0u64;
    // SAFETY: the model's entry point; the answer goes to the test's word.
    let r = unsafe { (cu().cuMemAlloc_v2)(&mut p, 8) };
    // SAFETY: the word the test leaked.
    unsafe { (*(arg as *const AtomicU32)).store(r as u32, Ordering::Relaxed) };
}

#[test]
fn host_functions_may_not_call_the_driver() {
    isolated("host_functions_may_not_call_the_driver", &[], || {
        context(0);
        let s = stream(0);
        let answer: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
        ok!((cu().cuLaunchHostFunc)(
            s,
            call_the_driver,
            answer as *const AtomicU32 as P
        ));
        ok!((cu().cuStreamSynchronize)(s));
        assert_eq!(answer.load(Ordering::Relaxed), NOT_PERMITTED as u32);
    });
}

#[test]
fn a_stream_waits_for_a_mapped_word() {
    isolated("a_stream_waits_for_a_mapped_word", &[], || {
        context(0);
        let s = stream(NON_BLOCKING);
        let mut word = std::ptr::null_mut();
        ok!((cu().cuMemHostAlloc)(&mut word, 4, DEVICEMAP));
        // SAFETY: a pinned word.
        let flag = unsafe { AtomicU32::from_ptr(word.cast()) };
        flag.store(0, Ordering::Release);
        let page = [0u32; 2];
        // Pageable memory and an unaligned address are refused.
        fails!(
            INVALID_VALUE,
            (cu().cuStreamWaitValue32_v2)(s, page.as_ptr() as u64, 1, 1)
        );
        fails!(
            INVALID_VALUE,
            (cu().cuStreamWaitValue32_v2)(s, word as u64 + 1, 1, 1)
        );
        let buf = alloc(4);
        ok!((cu().cuStreamWaitValue32_v2)(s, word as u64, 1, 1)); // CU_STREAM_WAIT_VALUE_EQ
        ok!((cu().cuMemsetD8Async)(buf, 3, 4, s));
        std::thread::sleep(Duration::from_millis(100));
        fails!(NOT_READY, (cu().cuStreamQuery)(s));
        flag.store(1, Ordering::Release);
        ok!((cu().cuStreamSynchronize)(s));
        assert_eq!(read(buf, 4), vec![3; 4]);
        // Captured: each launch waits.
        flag.store(0, Ordering::Release);
        ok!((cu().cuStreamBeginCapture_v2)(s, 0));
        ok!((cu().cuStreamWaitValue32_v2)(s, word as u64, 1, 0)); // CU_STREAM_WAIT_VALUE_GEQ
        let mut graph = std::ptr::null_mut();
        ok!((cu().cuStreamEndCapture)(s, &mut graph));
        let mut exec = std::ptr::null_mut();
        ok!((cu().cuGraphInstantiateWithFlags)(&mut exec, graph, 0));
        ok!((cu().cuGraphLaunch)(exec, s));
        std::thread::sleep(Duration::from_millis(100));
        fails!(NOT_READY, (cu().cuStreamQuery)(s));
        flag.store(2, Ordering::Release);
        ok!((cu().cuStreamSynchronize)(s));
    });
}

#[test]
fn host_functions_of_a_context_run_one_at_a_time() {
    isolated("host_functions_of_a_context_run_one_at_a_time", &[], || {
        context(0);
        let (a, b) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
        let gate: &'static Gate = Box::leak(Box::new(Gate(AtomicBool::new(false))));
        let calls: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
        ok!((cu().cuLaunchHostFunc)(
            a,
            wait_gate,
            gate as *const Gate as P
        ));
        std::thread::sleep(Duration::from_millis(50));
        ok!((cu().cuLaunchHostFunc)(
            b,
            count_call,
            calls as *const AtomicU32 as P
        ));
        // Another stream's host function waits while one runs.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(calls.load(Ordering::Acquire), 0);
        gate.0.store(true, Ordering::Release);
        ok!((cu().cuStreamSynchronize)(b));
        assert_eq!(calls.load(Ordering::Acquire), 1);
    });
}
