//! What every rule test shares: the model's entry points resolved from
//! its library, the results and flags of `cuda.h` they use, a child
//! process per test, and small helpers (contexts, memory, streams, gates,
//! the committed kernels).

// Each test binary uses part of this.
#![allow(dead_code, unused_macros)]

use std::ffi::{c_char, c_void};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use rccl_algorithms::protocol::{fifo_bytes, Protocol};
use rccl_device::abi::FifoView;
use rccl_device::work::{
    WorkBlock, WorkChannel, WorkHeader, WorkPeer, WorkPrim, WorkStep, PEER_ENDS_BYTES,
};

pub type P = *mut c_void;
pub type HostFn = unsafe extern "C" fn(P);

macro_rules! api {
    ($($name:ident : fn($($t:ty),*);)*) => {
        #[allow(non_snake_case)]
        pub struct Api { $(pub $name: unsafe extern "C" fn($($t),*) -> i32,)* }
        impl Api {
            pub fn load() -> Api {
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
    cuOccupancyMaxActiveBlocksPerMultiprocessor: fn(*mut i32, P, i32, usize);
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags: fn(*mut i32, P, i32, usize, u32);
    cuDeviceGetAttribute: fn(*mut i32, u32, i32);
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
    rccl_cuda_model_launches: fn(*const c_char, *mut u64);
}

// CUresult values (cuda.h).
pub const SUCCESS: i32 = 0;
pub const INVALID_VALUE: i32 = 1;
pub const NOT_INITIALIZED: i32 = 3;
pub const INVALID_IMAGE: i32 = 200;
pub const INVALID_CONTEXT: i32 = 201;
pub const NOT_FOUND: i32 = 500;
pub const NOT_READY: i32 = 600;
pub const ILLEGAL_ADDRESS: i32 = 700;
pub const LAUNCH_TIMEOUT: i32 = 702;
pub const NOT_PERMITTED: i32 = 800;
pub const CAPTURE_UNSUPPORTED: i32 = 900;
pub const CAPTURE_INVALIDATED: i32 = 901;
pub const CAPTURE_ISOLATION: i32 = 905;
pub const CAPTURE_IMPLICIT: i32 = 906;
pub const CAPTURED_EVENT: i32 = 907;
pub const NOT_SUPPORTED: i32 = 801;

pub const NON_BLOCKING: u32 = 1;
pub const DEVICEMAP: u32 = 2;
/// The garbage fresh memory holds.
pub const GARBAGE: u8 = 0xa5;

/// The model's library, built beside the test binaries.
pub fn model_library() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("librccl_cuda_model.so"))
        .find(|p| p.exists())
        .expect("librccl_cuda_model.so is built with the tests")
}

pub fn cu() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(Api::load)
}

macro_rules! ok {
    ($e:expr) => {
        // SAFETY: the model's entry points with valid arguments.
        assert_eq!(unsafe { $e }, $crate::common::SUCCESS, "{}", stringify!($e))
    };
}

macro_rules! fails {
    ($code:expr, $e:expr) => {
        // SAFETY: as above; the call is refused.
        assert_eq!(unsafe { $e }, $code, "{}", stringify!($e))
    };
}

/// How many kernels named `name` started running in this process so far
/// (the model's launch counter).
pub fn launches(name: &std::ffi::CStr) -> u64 {
    let mut count = u64::MAX;
    ok!((cu().rccl_cuda_model_launches)(name.as_ptr(), &mut count));
    count
}

/// Runs `body` in a child process with `env`; returns its stderr (the
/// model's reports). The child is this test binary running this test.
pub fn isolated(test: &str, env: &[(&str, &str)], body: fn()) -> String {
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
pub fn context(dev: i32) -> P {
    ok!((cu().cuInit)(0));
    let mut ctx = std::ptr::null_mut();
    ok!((cu().cuDevicePrimaryCtxRetain)(&mut ctx, dev));
    ok!((cu().cuCtxSetCurrent)(ctx));
    ctx
}

pub fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    ok!((cu().cuMemAlloc_v2)(&mut p, bytes));
    p
}

pub fn stream(flags: u32) -> P {
    let mut s = std::ptr::null_mut();
    ok!((cu().cuStreamCreate)(&mut s, flags));
    s
}

pub fn read(ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    ok!((cu().cuMemcpyDtoH_v2)(out.as_mut_ptr().cast(), ptr, len));
    out
}

/// A gate: a host function that holds its stream until opened.
pub struct Gate(pub AtomicBool);

pub unsafe extern "C" fn wait_gate(arg: P) {
    // SAFETY: the gate outlives the stream's work (tests open it and
    // synchronize before it goes).
    let gate = unsafe { &*(arg as *const Gate) };
    while !gate.0.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn close_gate(s: P) -> &'static Gate {
    let gate: &'static Gate = Box::leak(Box::new(Gate(AtomicBool::new(false))));
    ok!((cu().cuLaunchHostFunc)(
        s,
        wait_gate,
        gate as *const Gate as P
    ));
    gate
}

pub unsafe extern "C" fn count_call(arg: P) {
    // SAFETY: the counter the test leaked for the graph.
    unsafe { (*(arg as *const AtomicU32)).fetch_add(1, Ordering::Relaxed) };
}

/// The committed fatbin loaded in the current context.
pub struct Kernels {
    pub module: P,
    pub copy: P,
    pub run_work: P,
}

/// A kernel that waits until its abort word is set.
pub struct Waiting {
    pub abort: *mut u32,
}

impl Waiting {
    pub fn release(&self) {
        // SAFETY: the pinned word the kernel polls.
        unsafe { AtomicU32::from_ptr(self.abort).store(1, Ordering::Release) };
    }
}

impl Kernels {
    pub fn load() -> Kernels {
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

    pub fn copy(&self, dst: u64, src: u64, bytes: u64, stream: P) {
        self.copy_in_blocks_of(512, dst, src, bytes, stream)
    }

    /// As [`Kernels::copy`], with blocks of `threads` threads.
    pub fn copy_in_blocks_of(&self, threads: u32, dst: u64, src: u64, bytes: u64, stream: P) {
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
            threads,
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
    pub fn waiting_kernel(&self, stream: P) -> Waiting {
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

/// `CUmemAllocationProp` (cuda.h's layout).
#[repr(C)]
pub struct AllocationProp {
    pub kind: u32,
    pub handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
    pub win32_metadata: P,
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct AccessDesc {
    pub location_type: u32,
    pub location_id: i32,
    pub flags: u32,
}
