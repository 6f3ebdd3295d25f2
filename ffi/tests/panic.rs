//! An engine panic surfaces as ncclInternalError with a message, and the
//! process and its communicators survive. Uses the engine's test-only
//! `fault-injection` feature (enabled for this crate's tests).

use std::ffi::CStr;
use std::ptr::null_mut;

use rcclrs::*;

fn last_error() -> String {
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn engine_panic_becomes_internal_error() {
    unsafe {
        let mut comms = [null_mut(); 2];
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()),
            ncclSuccess
        );
        let send = [[1.0f32; 4], [2.0f32; 4]];
        let mut recv = [[0.0f32; 4]; 2];
        let all_reduce = |recv: &mut [[f32; 4]; 2]| {
            assert_eq!(ncclGroupStart(), ncclSuccess);
            for r in 0..2 {
                ncclAllReduce(
                    send[r].as_ptr().cast(),
                    recv[r].as_mut_ptr().cast(),
                    4,
                    7, // ncclFloat32
                    0, // ncclSum
                    comms[r],
                    null_mut(),
                );
            }
            ncclGroupEnd()
        };

        std::env::set_var("RCCL_FAULT_INJECT", "launch");
        assert_eq!(all_reduce(&mut recv), ncclInternalError);
        let message = last_error();
        assert!(
            message.contains("panic") && message.contains("fault injected"),
            "{message}"
        );
        std::env::remove_var("RCCL_FAULT_INJECT");

        // Nothing ran, and the communicators still work.
        assert_eq!(recv, [[0.0; 4]; 2]);
        assert_eq!(all_reduce(&mut recv), ncclSuccess);
        assert_eq!(recv, [[3.0; 4]; 2]);
        for c in comms {
            assert_eq!(ncclCommDestroy(c), ncclSuccess);
        }
    }
}
