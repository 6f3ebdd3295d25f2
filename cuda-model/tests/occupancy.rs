//! Occupancy: how many blocks of a kernel an SM holds, from the limits of
//! compute capability 9.0 (2048 threads, 32 blocks, 64 Ki registers and
//! 228 KiB of shared memory per SM; 1 KiB of it reserved per block, 48 KiB
//! per block without opting in), each kernel taken to use the 128
//! registers per thread its launch bound of 512 threads allows; and
//! residency counted the same way.

#[macro_use]
mod common;

use std::time::Duration;

use rccl_device::work::PEER_ENDS_BYTES;

use common::{alloc, context, cu, isolated, stream, Kernels, INVALID_VALUE, NON_BLOCKING, P};

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
const MULTIPROCESSOR_COUNT: u32 = 16;
/// `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`.
const DISABLE_CACHING_OVERRIDE: u32 = 1;

fn per_sm(f: P, threads: i32, dynamic_shared: usize) -> i32 {
    let mut blocks = -1;
    ok!((cu().cuOccupancyMaxActiveBlocksPerMultiprocessor)(
        &mut blocks,
        f,
        threads,
        dynamic_shared
    ));
    let mut with_flags = -1;
    ok!((cu().cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)(
        &mut with_flags,
        f,
        threads,
        dynamic_shared,
        DISABLE_CACHING_OVERRIDE
    ));
    assert_eq!(with_flags, blocks, "{threads} threads, {dynamic_shared} B");
    blocks
}

#[test]
fn blocks_per_sm_follow_the_sms_limits() {
    isolated("blocks_per_sm_follow_the_sms_limits", &[], || {
        context(0);
        let k = Kernels::load();
        // Registers: 16 warps of 32 x 128 registers take all 64 Ki.
        assert_eq!(per_sm(k.run_work, 512, 4 * PEER_ENDS_BYTES), 1);
        // Registers: 8 warps take half.
        assert_eq!(per_sm(k.run_work, 256, 0), 2);
        // Registers: 2 warps take 8 Ki (33 threads are 2 warps).
        assert_eq!(per_sm(k.copy, 64, 0), 8);
        assert_eq!(per_sm(k.copy, 33, 0), 8);
        // Shared memory: 256 static + 40 KiB dynamic + 1 KiB reserved is
        // 42240 bytes, 5 of them in 228 KiB (8 by registers).
        assert_eq!(per_sm(k.run_work, 64, 40 << 10), 5);
        // Registers: one warp takes 4 Ki; 32 warps by threads.
        assert_eq!(per_sm(k.copy, 32, 0), 16);
        // Blocks that cannot run: beyond the launch bound, beyond 48 KiB
        // of shared memory (256 static bytes and 48 KiB dynamic).
        assert_eq!(per_sm(k.copy, 1024, 0), 0);
        assert_eq!(per_sm(k.run_work, 64, 48 << 10), 0);
        let mut blocks = 0;
        fails!(
            INVALID_VALUE,
            (cu().cuOccupancyMaxActiveBlocksPerMultiprocessor)(&mut blocks, k.copy, 0, 0)
        );
        fails!(
            INVALID_VALUE,
            (cu().cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)(
                &mut blocks,
                k.copy,
                512,
                0,
                2
            )
        );
    });
}

#[test]
fn the_sm_count_is_the_models_setting() {
    isolated(
        "the_sm_count_is_the_models_setting",
        &[("RCCL_CUDA_MODEL_SMS", "3")],
        || {
            context(0);
            let mut sms = 0;
            ok!((cu().cuDeviceGetAttribute)(
                &mut sms,
                MULTIPROCESSOR_COUNT,
                0
            ));
            assert_eq!(sms, 3);
        },
    );
}

/// A launch whose blocks take more shared memory than a block may is
/// refused, as the occupancy figure of 0 says.
#[test]
fn a_block_beyond_48_kib_of_shared_memory_is_refused() {
    isolated(
        "a_block_beyond_48_kib_of_shared_memory_is_refused",
        &[],
        || {
            context(0);
            let k = Kernels::load();
            let (mut table, mut timeout) = (0u64, 0u64);
            let mut params: [P; 2] = [
                (&mut table as *mut u64).cast(),
                (&mut timeout as *mut u64).cast(),
            ];
            let null: P = std::ptr::null_mut();
            fails!(
                INVALID_VALUE,
                (cu().cuLaunchKernel)(
                    k.run_work,
                    1,
                    1,
                    1,
                    64,
                    1,
                    1,
                    48 << 10,
                    stream(NON_BLOCKING),
                    params.as_mut_ptr(),
                    null.cast()
                )
            );
        },
    );
}

/// One SM holds a waiting block of one warp and a copy of 8 warps beside
/// it (4 Ki and 32 Ki registers); blocks that leave no room wait
/// (`kernels.rs`).
#[test]
fn an_sm_holds_blocks_as_long_as_they_fit() {
    isolated(
        "an_sm_holds_blocks_as_long_as_they_fit",
        &[
            ("RCCL_CUDA_MODEL_SMS", "1"),
            ("RCCL_CUDA_MODEL_DEADLINE_MS", "300"),
        ],
        || {
            context(0);
            let k = Kernels::load();
            let (a, b) = (alloc(8), alloc(8));
            let waiting = k.waiting_kernel(stream(NON_BLOCKING));
            let other = stream(NON_BLOCKING);
            k.copy_in_blocks_of(256, a, b, 8, other);
            std::thread::sleep(Duration::from_millis(50));
            ok!((cu().cuStreamSynchronize)(other));
            waiting.release();
            ok!((cu().cuCtxSynchronize)());
        },
    );
}
