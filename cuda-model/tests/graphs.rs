//! Stream capture and graphs: replays, the calls capture forbids, user
//! objects, capture info and external event waits.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::{
    alloc, context, count_call, cu, isolated, read, stream, wait_gate, Gate, CAPTURED_EVENT,
    CAPTURE_IMPLICIT, CAPTURE_INVALIDATED, CAPTURE_ISOLATION, CAPTURE_UNSUPPORTED, INVALID_VALUE,
    NON_BLOCKING, NOT_PERMITTED, NOT_READY, P, SUCCESS,
};

#[test]
fn a_graph_replays_its_nodes_and_host_node_arguments() {
    isolated(
        "a_graph_replays_its_nodes_and_host_node_arguments",
        &[],
        || {
            context(0);
            let s = stream(NON_BLOCKING);
            let buf = alloc(4);
            let calls: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
            ok!((cu().cuStreamBeginCapture_v2)(s, 0));
            ok!((cu().cuMemsetD8Async)(buf, 4, 4, s));
            ok!((cu().cuLaunchHostFunc)(
                s,
                count_call,
                calls as *const AtomicU32 as P
            ));
            let mut graph = std::ptr::null_mut();
            ok!((cu().cuStreamEndCapture)(s, &mut graph));
            // Captured, not run.
            assert_eq!(calls.load(Ordering::Relaxed), 0);
            let mut exec = std::ptr::null_mut();
            ok!((cu().cuGraphInstantiateWithFlags)(&mut exec, graph, 0));
            for _ in 0..100 {
                ok!((cu().cuGraphLaunch)(exec, s));
            }
            ok!((cu().cuStreamSynchronize)(s));
            assert_eq!(calls.load(Ordering::Relaxed), 100);
            assert_eq!(read(buf, 4), vec![4; 4]);
        },
    );
}

/// Begins a capture on a fresh stream, runs `violation`, and checks that
/// the capture ends invalidated.
fn capture_refuses(violation: impl FnOnce(P)) {
    let s = stream(NON_BLOCKING);
    ok!((cu().cuStreamBeginCapture_v2)(s, 0));
    violation(s);
    let mut graph = std::ptr::null_mut();
    fails!(
        CAPTURE_INVALIDATED,
        (cu().cuStreamEndCapture)(s, &mut graph)
    );
}

#[test]
fn calls_forbidden_during_capture_fail_and_invalidate_it() {
    isolated(
        "calls_forbidden_during_capture_fail_and_invalidate_it",
        &[],
        || {
            context(0);
            let buf = alloc(64);
            capture_refuses(|_| fails!(CAPTURE_UNSUPPORTED, (cu().cuMemsetD8_v2)(buf, 0, 64)));
            capture_refuses(|s| fails!(CAPTURE_UNSUPPORTED, (cu().cuStreamSynchronize)(s)));
            capture_refuses(|s| fails!(CAPTURE_UNSUPPORTED, (cu().cuStreamQuery)(s)));
            let page = [0u8; 64];
            capture_refuses(|s| {
                fails!(
                    CAPTURE_UNSUPPORTED,
                    (cu().cuMemcpyHtoDAsync_v2)(buf, page.as_ptr().cast(), 64, s)
                )
            });
            let mut p = 0;
            capture_refuses(|_| fails!(CAPTURE_UNSUPPORTED, (cu().cuMemAlloc_v2)(&mut p, 8)));
            // An event recorded outside: only with CU_EVENT_WAIT_EXTERNAL.
            let mut outside = std::ptr::null_mut();
            ok!((cu().cuEventCreate)(&mut outside, 0));
            ok!((cu().cuEventRecord)(outside, stream(NON_BLOCKING)));
            capture_refuses(|s| fails!(CAPTURE_ISOLATION, (cu().cuStreamWaitEvent)(s, outside, 0)));
            let s = stream(NON_BLOCKING);
            ok!((cu().cuStreamBeginCapture_v2)(s, 0));
            ok!((cu().cuStreamWaitEvent)(s, outside, 1));
            // An event recorded inside is the graph's: not for use outside.
            let mut inside = std::ptr::null_mut();
            ok!((cu().cuEventCreate)(&mut inside, 0));
            ok!((cu().cuEventRecord)(inside, s));
            let mut graph = std::ptr::null_mut();
            ok!((cu().cuStreamEndCapture)(s, &mut graph));
            fails!(
                CAPTURED_EVENT,
                (cu().cuStreamWaitEvent)(stream(NON_BLOCKING), inside, 0)
            );
            fails!(CAPTURED_EVENT, (cu().cuEventQuery)(inside));
            fails!(CAPTURED_EVENT, (cu().cuEventSynchronize)(inside));
        },
    );
}

unsafe extern "C" fn destroyed(arg: P) {
    // SAFETY: a leaked counter.
    let count = unsafe { &*(arg as *const AtomicU32) };
    // A destructor may not call the driver either.
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the model's entry point with a valid out-pointer.
    let answer = unsafe { (cu().cuCtxGetCurrent)(&mut ctx) };
    count.fetch_add(
        if answer == NOT_PERMITTED { 1 } else { 100 },
        Ordering::Release,
    );
}

/// Waits (boundedly) until `count` reads `want`.
fn reaches(count: &AtomicU32, want: u32) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while count.load(Ordering::Acquire) != want && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    count.load(Ordering::Acquire) == want
}

#[test]
fn a_user_object_lives_until_its_graph_and_executables_are_gone() {
    isolated(
        "a_user_object_lives_until_its_graph_and_executables_are_gone",
        &[],
        || {
            context(0);
            let count: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
            let arg = count as *const AtomicU32 as P;
            let mut object = std::ptr::null_mut();
            // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC is required; a count too.
            fails!(
                INVALID_VALUE,
                (cu().cuUserObjectCreate)(&mut object, arg, destroyed, 1, 0)
            );
            fails!(
                INVALID_VALUE,
                (cu().cuUserObjectCreate)(&mut object, arg, destroyed, 0, 1)
            );
            ok!((cu().cuUserObjectCreate)(&mut object, arg, destroyed, 1, 1));
            let s = stream(NON_BLOCKING);
            ok!((cu().cuStreamBeginCapture_v2)(s, 2));
            let (mut status, mut capturing) = (0u32, std::ptr::null_mut());
            let none: P = std::ptr::null_mut();
            ok!((cu().cuStreamGetCaptureInfo_v3)(
                s,
                &mut status,
                none.cast(),
                &mut capturing,
                none.cast(),
                none.cast(),
                none.cast()
            ));
            assert_eq!(status, 1, "CU_STREAM_CAPTURE_STATUS_ACTIVE");
            // Moving more references than the caller owns is refused.
            fails!(
                INVALID_VALUE,
                (cu().cuGraphRetainUserObject)(capturing, object, 2, 1)
            );
            ok!((cu().cuGraphRetainUserObject)(capturing, object, 1, 1));
            fails!(INVALID_VALUE, (cu().cuUserObjectRelease)(object, 1));
            ok!((cu().cuLaunchHostFunc)(s, count_call, arg));
            let mut graph = std::ptr::null_mut();
            ok!((cu().cuStreamEndCapture)(s, &mut graph));
            assert_eq!(graph, capturing, "the graph the capture info named");
            let mut exec = std::ptr::null_mut();
            ok!((cu().cuGraphInstantiateWithFlags)(&mut exec, graph, 0));
            ok!((cu().cuGraphDestroy)(graph));
            // The executable keeps the object.
            ok!((cu().cuGraphLaunch)(exec, s));
            ok!((cu().cuStreamSynchronize)(s));
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(
                count.load(Ordering::Acquire),
                1,
                "the host node ran once, no destructor"
            );
            ok!((cu().cuGraphExecDestroy)(exec));
            // The destructor runs once, on the driver's thread, where it
            // may not call the driver.
            assert!(
                reaches(count, 2),
                "destructor: {}",
                count.load(Ordering::Acquire)
            );
        },
    );
}

#[test]
fn capture_info_answers_and_refuses_as_documented() {
    isolated(
        "capture_info_answers_and_refuses_as_documented",
        &[],
        || {
            context(0);
            let none: P = std::ptr::null_mut();
            let info = |s: P, status: &mut u32, id: &mut u64| {
                // SAFETY: the model's entry point with valid out-pointers.
                unsafe {
                    (cu().cuStreamGetCaptureInfo_v3)(
                        s,
                        status,
                        id,
                        none.cast(),
                        none.cast(),
                        none.cast(),
                        none.cast(),
                    )
                }
            };
            let (mut status, mut id) = (9u32, 0u64);
            let s = stream(0);
            assert_eq!(info(s, &mut status, &mut id), SUCCESS);
            assert_eq!(status, 0, "CU_STREAM_CAPTURE_STATUS_NONE");
            ok!((cu().cuStreamBeginCapture_v2)(s, 2));
            assert_eq!(info(s, &mut status, &mut id), SUCCESS);
            assert_eq!(status, 1);
            // The legacy stream while a blocking stream captures.
            assert_eq!(info(none, &mut status, &mut id), CAPTURE_IMPLICIT);
            // The status is required.
            // SAFETY: the model's entry point; the status pointer is null.
            let answer = unsafe {
                (cu().cuStreamGetCaptureInfo_v3)(
                    s,
                    none.cast(),
                    none.cast(),
                    none.cast(),
                    none.cast(),
                    none.cast(),
                    none.cast(),
                )
            };
            assert_eq!(answer, INVALID_VALUE);
            let mut graph = std::ptr::null_mut();
            ok!((cu().cuStreamEndCapture)(s, &mut graph));
        },
    );
}

#[test]
fn an_external_event_wait_node_waits_for_the_events_record_on_each_launch() {
    isolated(
        "an_external_event_wait_node_waits_for_the_events_record_on_each_launch",
        &[],
        || {
            context(0);
            let (s, other) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
            let mut outside = std::ptr::null_mut();
            ok!((cu().cuEventCreate)(&mut outside, 0));
            let buf = alloc(4);
            ok!((cu().cuStreamBeginCapture_v2)(s, 0));
            ok!((cu().cuStreamWaitEvent)(s, outside, 1));
            ok!((cu().cuMemsetD8Async)(buf, 7, 4, s));
            let mut graph = std::ptr::null_mut();
            ok!((cu().cuStreamEndCapture)(s, &mut graph));
            let mut exec = std::ptr::null_mut();
            ok!((cu().cuGraphInstantiateWithFlags)(&mut exec, graph, 0));
            let gate: &'static Gate = Box::leak(Box::new(Gate(AtomicBool::new(false))));
            ok!((cu().cuLaunchHostFunc)(
                other,
                wait_gate,
                gate as *const Gate as P
            ));
            ok!((cu().cuEventRecord)(outside, other));
            ok!((cu().cuGraphLaunch)(exec, s));
            std::thread::sleep(Duration::from_millis(100));
            fails!(NOT_READY, (cu().cuStreamQuery)(s));
            gate.0.store(true, Ordering::Release);
            ok!((cu().cuStreamSynchronize)(s));
            assert_eq!(read(buf, 4), vec![7; 4]);
        },
    );
}
