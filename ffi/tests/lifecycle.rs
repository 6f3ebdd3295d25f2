//! Finalize and destroy as NCCL programs call them: every rank of
//! `ncclCommInitAll` finalized from one thread in turn, and a communicator
//! destroyed while another thread runs a collective on it; the network
//! chosen by `config.netName`.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use rcclrs::*;

const FLOAT: ncclDataType_t = 7;
const SUM: ncclRedOp_t = 0;

/// `n` communicators of this process, with a deadline far beyond what
/// the tests take, so a wait that reaches it fails them on time.
fn init_all(n: usize) -> Vec<ncclComm_t> {
    std::env::set_var("RCCL_TIMEOUT_MS", "20000");
    let mut comms = vec![null_mut(); n];
    // SAFETY: `comms` holds `n` handles.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as i32, std::ptr::null()) };
    assert_eq!(rc, ncclSuccess);
    comms
}

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string that stays
    // valid until this thread's next call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// An all-reduce of `buf` in place on `comm`.
fn all_reduce(comm: ncclComm_t, buf: &mut [f32]) -> ncclResult_t {
    let ptr = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: `buf` stays valid for the call, which completes before it
    // returns outside a group.
    unsafe { ncclAllReduce(ptr, ptr, buf.len(), FLOAT, SUM, comm, null_mut()) }
}

#[test]
fn one_thread_finalizes_then_destroys_every_rank_in_turn() {
    let comms = init_all(4);
    let mut bufs = vec![vec![1f32; 256]; comms.len()];
    // SAFETY: group calls on live handles; the buffers outlive the group.
    unsafe {
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (&comm, buf) in comms.iter().zip(&mut bufs) {
            assert_eq!(all_reduce(comm, buf), ncclSuccess);
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
    }
    assert!(bufs.iter().flatten().all(|&x| x == 4.0));
    let start = Instant::now();
    for &comm in &comms {
        // SAFETY: a live handle.
        assert_eq!(
            unsafe { ncclCommFinalize(comm) },
            ncclSuccess,
            "{}",
            last_error()
        );
    }
    for &comm in &comms {
        // SAFETY: a live handle, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn destroy_aborts_a_collective_another_thread_runs_on_the_communicator() {
    let comms = init_all(2);
    let comm = comms[0] as usize;
    let start = Instant::now();
    // Rank 1 never calls: the all-reduce waits until something stops it.
    let caller = std::thread::spawn(move || {
        let rc = all_reduce(comm as ncclComm_t, &mut [1f32; 64]);
        (rc, last_error(), start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: a live handle, destroyed once.
    assert_eq!(unsafe { ncclCommDestroy(comms[0]) }, ncclSuccess);
    let (rc, message, took) = caller.join().unwrap();
    assert_eq!(rc, ncclInvalidUsage, "{message}");
    assert!(message.contains("destroyed"), "{message}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // SAFETY: a live handle, destroyed once.
    assert_eq!(unsafe { ncclCommDestroy(comms[1]) }, ncclSuccess);
}

/// `config.netName` chooses the network as `NCCL_NET` does: a name that no
/// network has fails the init with `ncclInvalidUsage`, naming the networks
/// there are; `socket` (any case) is the built-in Socket network.
#[test]
fn config_net_name_chooses_the_network() {
    let init = |name: &std::ffi::CStr| {
        let mut id = ncclUniqueId { internal: [0; 128] };
        let mut config = ncclConfig_t::initializer();
        config.netName = name.as_ptr();
        let mut comm = null_mut();
        // SAFETY: valid out-pointers and an initialized config whose name
        // outlives the call.
        let rc = unsafe {
            assert_eq!(ncclGetUniqueId(&mut id), ncclSuccess);
            ncclCommInitRankConfig(&mut comm, 1, id, 0, &mut config)
        };
        (rc, comm)
    };
    let (rc, _) = init(c"Verbs");
    assert_eq!(rc, ncclInvalidUsage);
    let err = last_error();
    assert!(
        err.contains("NCCL_NET=Verbs: no network of that name") && err.contains("Socket"),
        "{err}"
    );
    let (rc, comm) = init(c"SOCKET");
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    // SAFETY: a communicator just made.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
}
