//! One test per rule of the driver model: a short sequence that breaks the
//! rule (or depends on it), which the model must refuse or expose. Each
//! runs in a process of its own (the driver's state is per process: a
//! sticky fault, `cuInit`), calling the model's exported entry points as
//! a program calls the driver's.

use std::ffi::{c_char, c_void};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use rccl_algorithms::protocol::{fifo_bytes, Protocol};
use rccl_device::abi::{FifoView, ReduceArgs};
use rccl_device::work::{
    WorkBlock, WorkChannel, WorkHeader, WorkPeer, WorkPrim, WorkStep, PEER_ENDS_BYTES,
};

type P = *mut c_void;
type HostFn = unsafe extern "C" fn(P);

macro_rules! api {
    ($($name:ident : fn($($t:ty),*);)*) => {
        #[allow(non_snake_case)]
        struct Api { $($name: unsafe extern "C" fn($($t),*) -> i32,)* }
        impl Api {
            fn load() -> Api {
                let path = model_library();
                let path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                // SAFETY: dlopen of a NUL-terminated path; the handle stays
                // open for the process.
                let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                assert!(!lib.is_null(), "the model loads");
                Api {$(
                    $name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: a NUL-terminated name; the symbol is the
                        // model's entry point of this signature.
                        let f = unsafe { libc::dlsym(lib, name.as_ptr().cast()) };
                        assert!(!f.is_null(), "{name} exported");
                        // SAFETY: as above.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> i32>(f) }
                    },
                )*}
            }
        }
    };
}

api! {
    cuInit: fn(u32);
    cuDeviceGetCount: fn(*mut i32);
    cuDevicePrimaryCtxRetain: fn(*mut P, i32);
    cuDevicePrimaryCtxRelease_v2: fn(i32);
    cuCtxSetCurrent: fn(P);
    cuCtxGetCurrent: fn(*mut P);
    cuCtxPushCurrent_v2: fn(P);
    cuCtxPopCurrent_v2: fn(*mut P);
    cuCtxGetDevice: fn(*mut i32);
    cuCtxSynchronize: fn();
    cuMemAlloc_v2: fn(*mut u64, usize);
    cuMemFree_v2: fn(u64);
    cuMemHostAlloc: fn(*mut P, usize, u32);
    cuMemHostGetDevicePointer_v2: fn(*mut u64, P, u32);
    cuPointerGetAttribute: fn(P, u32, u64);
    cuPointerGetAttributes: fn(u32, *const u32, *mut P, u64);
    cuMemGetAddressRange_v2: fn(*mut u64, *mut usize, u64);
    cuMemcpyHtoD_v2: fn(u64, *const c_void, usize);
    cuMemcpyDtoH_v2: fn(P, u64, usize);
    cuMemcpyHtoDAsync_v2: fn(u64, *const c_void, usize, P);
    cuMemsetD8_v2: fn(u64, u8, usize);
    cuMemsetD8Async: fn(u64, u8, usize, P);
    cuStreamCreate: fn(*mut P, u32);
    cuStreamSynchronize: fn(P);
    cuStreamQuery: fn(P);
    cuStreamWaitEvent: fn(P, P, u32);
    cuLaunchHostFunc: fn(P, HostFn, P);
    cuEventCreate: fn(*mut P, u32);
    cuEventRecord: fn(P, P);
    cuEventQuery: fn(P);
    cuEventSynchronize: fn(P);
    cuStreamBeginCapture_v2: fn(P, u32);
    cuStreamEndCapture: fn(P, *mut P);
    cuGraphInstantiateWithFlags: fn(*mut P, P, u64);
    cuGraphLaunch: fn(P, P);
    cuGraphExecDestroy: fn(P);
    cuGraphDestroy: fn(P);
    cuUserObjectCreate: fn(*mut P, P, HostFn, u32, u32);
    cuUserObjectRelease: fn(P, u32);
    cuGraphRetainUserObject: fn(P, P, u32, u32);
    cuStreamGetCaptureInfo_v3: fn(P, *mut u32, *mut u64, *mut P, *mut P, *mut P, *mut usize);
    cuStreamWaitValue32_v2: fn(P, u64, u32, u32);
    cuModuleLoadData: fn(*mut P, *const c_void);
    cuModuleGetFunction: fn(*mut P, P, *const c_char);
    cuLaunchKernel: fn(P, u32, u32, u32, u32, u32, u32, u32, P, *mut P, *mut P);
    cuMemGetAllocationGranularity: fn(*mut usize, *const AllocationProp, u32);
    cuMemCreate: fn(*mut u64, usize, *const AllocationProp, u64);
    cuMemRelease: fn(u64);
    cuMemAddressReserve: fn(*mut u64, usize, usize, u64, u64);
    cuMemAddressFree: fn(u64, usize);
    cuMemMap: fn(u64, usize, usize, u64, u64);
    cuMemUnmap: fn(u64, usize);
    cuMemSetAccess: fn(u64, usize, *const AccessDesc, usize);
    cuMemExportToShareableHandle: fn(P, u64, u32, u64);
    cuMemImportFromShareableHandle: fn(*mut u64, P, u32);
    cuMemGetHandleForAddressRange: fn(P, u64, usize, u32, u64);
}

// CUresult values (cuda.h).
const SUCCESS: i32 = 0;
const INVALID_VALUE: i32 = 1;
const NOT_INITIALIZED: i32 = 3;
const INVALID_IMAGE: i32 = 200;
const INVALID_CONTEXT: i32 = 201;
const NOT_FOUND: i32 = 500;
const NOT_READY: i32 = 600;
const ILLEGAL_ADDRESS: i32 = 700;
const LAUNCH_TIMEOUT: i32 = 702;
const NOT_PERMITTED: i32 = 800;
const CAPTURE_UNSUPPORTED: i32 = 900;
const CAPTURE_INVALIDATED: i32 = 901;
const CAPTURE_ISOLATION: i32 = 905;
const CAPTURE_IMPLICIT: i32 = 906;
const CAPTURED_EVENT: i32 = 907;
const NOT_SUPPORTED: i32 = 801;

const NON_BLOCKING: u32 = 1;
const DEVICEMAP: u32 = 2;
/// The garbage fresh memory holds.
const GARBAGE: u8 = 0xa5;

/// The model's library, built beside the test binaries.
fn model_library() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("librccl_cuda_model.so"))
        .find(|p| p.exists())
        .expect("librccl_cuda_model.so is built with the tests")
}

fn cu() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(Api::load)
}

macro_rules! ok {
    ($e:expr) => {
        // SAFETY: the model's entry points with valid arguments.
        assert_eq!(unsafe { $e }, SUCCESS, "{}", stringify!($e))
    };
}

macro_rules! fails {
    ($code:expr, $e:expr) => {
        // SAFETY: as above; the call is refused.
        assert_eq!(unsafe { $e }, $code, "{}", stringify!($e))
    };
}

/// Runs `body` in a child process with `env`; returns its stderr (the
/// model's reports). The child is this test binary running this test.
fn isolated(test: &str, env: &[(&str, &str)], body: fn()) -> String {
    if std::env::var("CUDA_MODEL_RULE").as_deref() == Ok(test) {
        body();
        // The child's part ends here, before the parent's checks.
        std::process::exit(0);
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("CUDA_MODEL_RULE", test)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{test} failed in its process:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// cuInit, then device `dev`'s primary context current.
fn context(dev: i32) -> P {
    ok!((cu().cuInit)(0));
    let mut ctx = std::ptr::null_mut();
    ok!((cu().cuDevicePrimaryCtxRetain)(&mut ctx, dev));
    ok!((cu().cuCtxSetCurrent)(ctx));
    ctx
}

fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    ok!((cu().cuMemAlloc_v2)(&mut p, bytes));
    p
}

fn stream(flags: u32) -> P {
    let mut s = std::ptr::null_mut();
    ok!((cu().cuStreamCreate)(&mut s, flags));
    s
}

fn read(ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    ok!((cu().cuMemcpyDtoH_v2)(out.as_mut_ptr().cast(), ptr, len));
    out
}

/// A gate: a host function that holds its stream until opened.
struct Gate(AtomicBool);

unsafe extern "C" fn wait_gate(arg: P) {
    // SAFETY: the gate outlives the stream's work (tests open it and
    // synchronize before it goes).
    let gate = unsafe { &*(arg as *const Gate) };
    while !gate.0.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn close_gate(s: P) -> &'static Gate {
    let gate: &'static Gate = Box::leak(Box::new(Gate(AtomicBool::new(false))));
    ok!((cu().cuLaunchHostFunc)(
        s,
        wait_gate,
        gate as *const Gate as P
    ));
    gate
}

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

unsafe extern "C" fn count_call(arg: P) {
    // SAFETY: the counter the test leaked for the graph.
    unsafe { (*(arg as *const AtomicU32)).fetch_add(1, Ordering::Relaxed) };
}

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

/// The committed fatbin loaded in the current context.
struct Kernels {
    module: P,
    copy: P,
    run_work: P,
}

/// A kernel that waits until its abort word is set.
struct Waiting {
    abort: *mut u32,
}

impl Waiting {
    fn release(&self) {
        // SAFETY: the pinned word the kernel polls.
        unsafe { AtomicU32::from_ptr(self.abort).store(1, Ordering::Release) };
    }
}

impl Kernels {
    fn load() -> Kernels {
        let fatbin = rccl_device::KERNELS_FATBIN;
        let mut image = vec![0u64; fatbin.len().div_ceil(8)];
        // SAFETY: `image` holds the fatbin's bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(fatbin.as_ptr(), image.as_mut_ptr().cast(), fatbin.len())
        };
        let mut module = std::ptr::null_mut();
        ok!((cu().cuModuleLoadData)(&mut module, image.as_ptr().cast()));
        let function = |name: &std::ffi::CStr| {
            let mut f = std::ptr::null_mut();
            ok!((cu().cuModuleGetFunction)(&mut f, module, name.as_ptr()));
            f
        };
        Kernels {
            module,
            copy: function(c"rccl_copy"),
            run_work: function(c"rccl_run_work"),
        }
    }

    fn copy(&self, dst: u64, src: u64, bytes: u64, stream: P) {
        let (mut d, mut s, mut n) = (dst, src, bytes);
        let mut params: [P; 3] = [
            (&mut d as *mut u64).cast(),
            (&mut s as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
        ];
        let null: P = std::ptr::null_mut();
        ok!((cu().cuLaunchKernel)(
            self.copy,
            1,
            1,
            1,
            512,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            null.cast()
        ));
    }

    /// Launches on `stream` one block of device work whose only channel
    /// receives from a FIFO nobody sends to: it runs until its abort word
    /// (mapped pinned memory) is set.
    fn waiting_kernel(&self, stream: P) -> Waiting {
        let fifo_bytes = fifo_bytes(Protocol::Simple, 2, 64);
        let fifo = alloc(fifo_bytes);
        ok!((cu().cuMemsetD8Async)(fifo, 0, fifo_bytes, stream));
        let recvbuf = alloc(64);
        let mut abort = std::ptr::null_mut();
        ok!((cu().cuMemHostAlloc)(&mut abort, 8, DEVICEMAP));
        let abort = abort.cast::<u32>();
        let mut status = std::ptr::null_mut();
        ok!((cu().cuMemHostAlloc)(&mut status, 8, DEVICEMAP));
        // SAFETY: fresh pinned words.
        unsafe { abort.write(0) };
        let view = FifoView::whole(fifo as *mut u8, Protocol::Simple.abi(), 2, 64);
        let mut block = Vec::<u8>::new();
        let push = |block: &mut Vec<u8>, bytes: &[u8]| {
            block.resize(block.len().next_multiple_of(8), 0);
            let at = block.len() as u64;
            block.extend_from_slice(bytes);
            at
        };
        fn bytes_of<T>(v: &T) -> &[u8] {
            // SAFETY: a repr(C) value read as its bytes.
            unsafe { std::slice::from_raw_parts((v as *const T).cast(), std::mem::size_of::<T>()) }
        }
        let header_len = std::mem::size_of::<WorkHeader>();
        block.resize(header_len, 0);
        let channel = WorkChannel {
            first_step: 0,
            nsteps: 1,
            first_peer: 0,
            npeers: 1,
            scratch: std::ptr::null_mut(),
            scratch_bytes: 0,
        };
        let channels_at = push(&mut block, bytes_of(&channel));
        let peer = WorkPeer {
            rank: 1,
            pad: 0,
            send: view,
            recv: view,
        };
        let peers_at = push(&mut block, bytes_of(&peer));
        let steps_at = push(
            &mut block,
            bytes_of(&WorkStep {
                first_prim: 0,
                nprims: 1,
            }),
        );
        // Recv (1) of 64 bytes from peer 0 into the receive buffer (1).
        let prim = WorkPrim {
            kind: 1,
            recv_peer: 0,
            send_peer: -1,
            src_buf: 0,
            dst_buf: 1,
            pad: 0,
            src_off: 0,
            dst_off: 0,
            len: 64,
        };
        let prims_at = push(&mut block, bytes_of(&prim));
        let header = WorkHeader {
            sendbuf: std::ptr::null(),
            recvbuf: recvbuf as *mut u8,
            nranks: 2,
            scalar: 0,
            scalar_ptr: std::ptr::null(),
            dtype: 0,
            op: -1,
            elem_size: 1,
            nchannels: 1,
            tag_seq: 0,
            tag_call: 0,
            tag_count: 0,
            pad: 0,
            abort,
            channels_at,
            peers_at,
            steps_at,
            prims_at,
        };
        block[..header_len].copy_from_slice(bytes_of(&header));
        let work = alloc(block.len());
        ok!((cu().cuMemcpyHtoDAsync_v2)(
            work,
            block.as_ptr().cast(),
            block.len(),
            stream
        ));
        // The grid's one block runs channel 0 of the work.
        let mut table = std::ptr::null_mut();
        ok!((cu().cuMemHostAlloc)(
            &mut table,
            std::mem::size_of::<WorkBlock>(),
            DEVICEMAP
        ));
        let entry = WorkBlock {
            work: work as *const WorkHeader,
            status: status.cast(),
            channel: 0,
            pad: 0,
        };
        // SAFETY: fresh pinned memory the size of an entry.
        unsafe { table.cast::<WorkBlock>().write(entry) };
        let (mut t, mut timeout) = (table as u64, u64::MAX);
        let mut params: [P; 2] = [
            (&mut t as *mut u64).cast(),
            (&mut timeout as *mut u64).cast(),
        ];
        let null: P = std::ptr::null_mut();
        ok!((cu().cuLaunchKernel)(
            self.run_work,
            1,
            1,
            1,
            32,
            1,
            1,
            PEER_ENDS_BYTES as u32,
            stream,
            params.as_mut_ptr(),
            null.cast()
        ));
        // The kernel is resident once its stream reached it.
        std::thread::sleep(Duration::from_millis(50));
        Waiting { abort }
    }
}

/// Where CUDA's `cuda.h` is: `RCCL_CUDA_INCLUDE`, else where `.ci/run`
/// downloads it (the `nvidia-cuda-runtime` wheel).
fn cuda_include() -> Option<std::path::PathBuf> {
    let downloaded = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/nvidia-nccl/x/nvidia/cu13/include");
    std::env::var_os("RCCL_CUDA_INCLUDE")
        .map(Into::into)
        .into_iter()
        .chain([downloaded])
        .find(|d| d.join("cuda.h").exists())
}

#[test]
fn a_c_program_built_against_cuda_h_runs_on_the_model() {
    let Some(include) = cuda_include() else {
        eprintln!("skipped: no cuda.h (set RCCL_CUDA_INCLUDE, or run .ci/run, which downloads it)");
        return;
    };
    let folder = model_library()
        .parent()
        .unwrap()
        .join(format!("cuda-h-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        let _ = std::fs::remove_file(folder.join(name));
        std::os::unix::fs::symlink(model_library(), folder.join(name)).unwrap();
    }
    let program = folder.join("driver_api");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/driver_api.c");
    let built = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&source)
        .arg("-L")
        .arg(&folder)
        .args(["-lcuda", "-o"])
        .arg(&program)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&program)
        .env("LD_LIBRARY_PATH", &folder)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&folder);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// `CUmemAllocationProp` (cuda.h's layout).
#[repr(C)]
struct AllocationProp {
    kind: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
    win32_metadata: P,
    alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location_type: u32,
    location_id: i32,
    flags: u32,
}

const POSIX_FD: u32 = 1;

/// Pinned memory of device 0, exportable as a file descriptor.
fn shareable_prop() -> AllocationProp {
    AllocationProp {
        kind: 1,
        handle_types: POSIX_FD,
        location_type: 1,
        location_id: 0,
        win32_metadata: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

fn read_write_on_device_0() -> AccessDesc {
    AccessDesc {
        location_type: 1,
        location_id: 0,
        flags: 3,
    }
}

fn granularity() -> usize {
    let mut g = 0;
    ok!((cu().cuMemGetAllocationGranularity)(
        &mut g,
        &shareable_prop(),
        0
    ));
    g
}

/// A physical allocation of `size` bytes mapped at a fresh reservation,
/// access not set yet: (handle, address).
fn mapped(size: usize) -> (u64, u64) {
    let mut handle = 0;
    ok!((cu().cuMemCreate)(&mut handle, size, &shareable_prop(), 0));
    let mut ptr = 0;
    ok!((cu().cuMemAddressReserve)(&mut ptr, size, 0, 0, 0));
    ok!((cu().cuMemMap)(ptr, size, 0, handle, 0));
    (handle, ptr)
}

fn set_access(ptr: u64, size: usize) {
    ok!((cu().cuMemSetAccess)(
        ptr,
        size,
        &read_write_on_device_0(),
        1
    ));
}

fn write(ptr: u64, bytes: &[u8]) {
    ok!((cu().cuMemcpyHtoD_v2)(
        ptr,
        bytes.as_ptr().cast(),
        bytes.len()
    ));
}

#[test]
fn vmm_sizes_and_addresses_off_the_granularity_are_refused() {
    isolated(
        "vmm_sizes_and_addresses_off_the_granularity_are_refused",
        &[],
        || {
            context(0);
            let g = granularity();
            assert!(g > 4096, "a GPU's granularity, not the page size");
            let mut recommended = 0;
            ok!((cu().cuMemGetAllocationGranularity)(
                &mut recommended,
                &shareable_prop(),
                1
            ));
            assert_eq!(recommended % g, 0);
            let mut handle = 0;
            fails!(
                INVALID_VALUE,
                (cu().cuMemCreate)(&mut handle, g / 2, &shareable_prop(), 0)
            );
            fails!(
                INVALID_VALUE,
                (cu().cuMemCreate)(&mut handle, g + 4096, &shareable_prop(), 0)
            );
            ok!((cu().cuMemCreate)(&mut handle, g, &shareable_prop(), 0));
            // Reservations are in host pages, mappings in the granularity.
            let mut ptr = 0;
            fails!(
                INVALID_VALUE,
                (cu().cuMemAddressReserve)(&mut ptr, 100, 0, 0, 0)
            );
            ok!((cu().cuMemAddressReserve)(&mut ptr, 4096, 0, 0, 0));
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, 4096, 0, handle, 0));
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, g, 0, handle, 0));
            ok!((cu().cuMemAddressFree)(ptr, 4096));
            ok!((cu().cuMemAddressReserve)(&mut ptr, 2 * g, 0, 0, 0));
            assert_eq!(ptr % g as u64, 0);
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr + 4096, g, 0, handle, 0));
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, 4096, 0, handle, 0));
            // Larger than the allocation.
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, 2 * g, 0, handle, 0));
            ok!((cu().cuMemMap)(ptr + g as u64, g, 0, handle, 0));
            // A mapped reservation is not freed.
            fails!(INVALID_VALUE, (cu().cuMemAddressFree)(ptr, 2 * g));
            ok!((cu().cuMemUnmap)(ptr + g as u64, g));
            ok!((cu().cuMemAddressFree)(ptr, 2 * g));
            ok!((cu().cuMemRelease)(handle));
        },
    );
}

#[test]
fn vmm_memory_is_inaccessible_until_access_is_set() {
    isolated(
        "vmm_memory_is_inaccessible_until_access_is_set",
        &[],
        || {
            context(0);
            let g = granularity();
            let (_, ptr) = mapped(g);
            let bytes = [7u8; 64];
            fails!(
                INVALID_VALUE,
                (cu().cuMemcpyHtoD_v2)(ptr, bytes.as_ptr().cast(), 64)
            );
            let (mut base, mut size) = (0, 0);
            fails!(
                NOT_FOUND,
                (cu().cuMemGetAddressRange_v2)(&mut base, &mut size, ptr)
            );
            let k = Kernels::load();
            let s = stream(NON_BLOCKING);
            let other = alloc(64);
            k.copy(ptr, other, 64, s);
            fails!(ILLEGAL_ADDRESS, (cu().cuStreamSynchronize)(s));
        },
    );
}

#[test]
fn vmm_memory_with_access_set_is_device_memory() {
    isolated("vmm_memory_with_access_set_is_device_memory", &[], || {
        context(0);
        let g = granularity();
        let (_, ptr) = mapped(g);
        set_access(ptr, g);
        write(ptr + 100, &[7u8; 64]);
        assert_eq!(read(ptr + 100, 64), vec![7u8; 64]);
        let (mut base, mut size) = (0, 0);
        ok!((cu().cuMemGetAddressRange_v2)(
            &mut base,
            &mut size,
            ptr + 100
        ));
        assert_eq!((base, size), (ptr, g));
        let mut kind = 0u32;
        ok!((cu().cuPointerGetAttribute)(
            (&mut kind as *mut u32).cast(),
            2, // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
            ptr
        ));
        assert_eq!(kind, 2, "device memory");
        // Not cuMemAlloc memory.
        fails!(INVALID_VALUE, (cu().cuMemFree_v2)(ptr));
        let k = Kernels::load();
        let s = stream(NON_BLOCKING);
        let other = alloc(64);
        k.copy(other, ptr + 100, 64, s);
        ok!((cu().cuStreamSynchronize)(s));
        assert_eq!(read(other, 64), vec![7u8; 64]);
    });
}

#[test]
fn vmm_memory_released_while_mapped_lives_until_unmapped() {
    isolated(
        "vmm_memory_released_while_mapped_lives_until_unmapped",
        &[],
        || {
            context(0);
            let g = granularity();
            let (handle, ptr) = mapped(g);
            set_access(ptr, g);
            write(ptr, b"still here");
            ok!((cu().cuMemRelease)(handle));
            assert_eq!(read(ptr, 10), b"still here");
            // The handle itself is gone.
            fails!(INVALID_VALUE, (cu().cuMemRelease)(handle));
            let mut fd = -1i32;
            fails!(
                INVALID_VALUE,
                (cu().cuMemExportToShareableHandle)(
                    (&mut fd as *mut i32).cast(),
                    handle,
                    POSIX_FD,
                    0
                )
            );
            ok!((cu().cuMemUnmap)(ptr, g));
            // Back to a bare reservation.
            let mut out = [0u8; 10];
            fails!(
                INVALID_VALUE,
                (cu().cuMemcpyDtoH_v2)(out.as_mut_ptr().cast(), ptr, 10)
            );
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, g, 0, handle, 0));
            ok!((cu().cuMemAddressFree)(ptr, g));
        },
    );
}

const IMPORT_TEST: &str = "vmm_memory_exported_to_another_process_shares_its_bytes";

/// The importing process: maps descriptor `fd`, checks what the exporter
/// wrote and answers.
fn import_and_answer(fd: i32) {
    context(0);
    let g = granularity();
    let mut handle = 0;
    ok!((cu().cuMemImportFromShareableHandle)(
        &mut handle,
        fd as isize as P,
        POSIX_FD
    ));
    // SAFETY: the inherited descriptor; the driver holds its own.
    unsafe { libc::close(fd) };
    let mut ptr = 0;
    ok!((cu().cuMemAddressReserve)(&mut ptr, g, 0, 0, 0));
    ok!((cu().cuMemMap)(ptr, g, 0, handle, 0));
    set_access(ptr, g);
    assert_eq!(read(ptr, 8), b"exporter");
    write(ptr, b"importer");
    ok!((cu().cuMemUnmap)(ptr, g));
    ok!((cu().cuMemAddressFree)(ptr, g));
    ok!((cu().cuMemRelease)(handle));
}

#[test]
fn vmm_memory_exported_to_another_process_shares_its_bytes() {
    if let Ok(fd) = std::env::var("CUDA_MODEL_IMPORT_FD") {
        if std::env::var("CUDA_MODEL_RULE").as_deref() == Ok(IMPORT_TEST) {
            import_and_answer(fd.parse().unwrap());
            std::process::exit(0);
        }
    }
    isolated(IMPORT_TEST, &[], || {
        context(0);
        let g = granularity();
        let (handle, ptr) = mapped(g);
        set_access(ptr, g);
        write(ptr, b"exporter");
        ok!((cu().cuCtxSynchronize)());
        let mut fd = -1i32;
        fails!(
            INVALID_VALUE,
            (cu().cuMemExportToShareableHandle)((&mut fd as *mut i32).cast(), handle, 2, 0)
        );
        ok!((cu().cuMemExportToShareableHandle)(
            (&mut fd as *mut i32).cast(),
            handle,
            POSIX_FD,
            0
        ));
        // The child inherits the descriptor.
        // SAFETY: clears close-on-exec of the descriptor just exported.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
        let out = Command::new(std::env::current_exe().unwrap())
            .args([IMPORT_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env("CUDA_MODEL_RULE", IMPORT_TEST)
            .env("CUDA_MODEL_IMPORT_FD", fd.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the importer failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(read(ptr, 8), b"importer");
        // A descriptor that is no exported allocation is refused.
        let mut other = 0;
        fails!(
            INVALID_VALUE,
            (cu().cuMemImportFromShareableHandle)(&mut other, 2 as P, POSIX_FD)
        );
    });
}

#[test]
fn a_dma_buf_of_vmm_memory_starts_at_the_range() {
    isolated("a_dma_buf_of_vmm_memory_starts_at_the_range", &[], || {
        context(0);
        let g = granularity();
        let (_, ptr) = mapped(g);
        set_access(ptr, g);
        write(ptr, b"dma-buf");
        // The copy lands before the NIC reads.
        ok!((cu().cuCtxSynchronize)());
        let mut fd = -1i32;
        let handle = (&mut fd as *mut i32).cast();
        // Off the page.
        fails!(
            INVALID_VALUE,
            (cu().cuMemGetHandleForAddressRange)(handle, ptr + 8, 4096, 1, 0)
        );
        // Inside the mapping: the model exports whole mappings only.
        fails!(
            NOT_SUPPORTED,
            (cu().cuMemGetHandleForAddressRange)(handle, ptr + 4096, 4096, 1, 0)
        );
        ok!((cu().cuMemGetHandleForAddressRange)(handle, ptr, g, 1, 0));
        // SAFETY: a shared mapping of the dma-buf, read and unmapped here.
        let bytes = unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(at, libc::MAP_FAILED);
            let bytes = std::slice::from_raw_parts(at.cast::<u8>(), 7).to_vec();
            libc::munmap(at, 4096);
            bytes
        };
        assert_eq!(bytes, b"dma-buf");
    });
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
