//! Execution control and occupancy: kernel launches and host functions
//! in stream order.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUfunction, CUhostFn, CUoccupancy_flags, CUresult, CUstream};

use super::out;
use crate::exec::kernel_spec;
use crate::occupancy::{block_needs, blocks_per_sm};
use crate::state::lock;
use crate::work::{Kernel, Work};
use crate::{call, Res};

use CUresult::*;

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(stream: CUstream, f: CUhostFn, arg: *mut c_void) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let work = Work::Host {
            f,
            arg: arg as usize,
        };
        match st.capturing(s) {
            // A host node: the same argument on every replay.
            Some(c) => st.capture_node(c, s, work),
            None => st.enqueue(s, work, None).map(drop),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    dynamic_shared: usize,
) -> CUresult {
    call(|| occupancy(blocks, f, block_size, dynamic_shared))
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    dynamic_shared: usize,
    flags: c_uint,
) -> CUresult {
    call(|| {
        // The caching override concerns platforms where global caching
        // takes shared memory; the model's SMs have none: both flags
        // give the same figure.
        if flags & !(CUoccupancy_flags::CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE as c_uint) != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        occupancy(blocks, f, block_size, dynamic_shared)
    })
}

/// Writes how many blocks of `f`, each of `block_size` threads and
/// `dynamic_shared` bytes of dynamic shared memory, one SM holds at once:
/// none when such a block cannot run.
fn occupancy(
    blocks: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    dynamic_shared: usize,
) -> Res<()> {
    let st = lock();
    st.current()?;
    let func = st
        .functions
        .get(&(f as u64))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let threads = u32::try_from(block_size)
        .ok()
        .filter(|&t| t > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let spec = kernel_spec(func.name).expect("a known kernel");
    let per_sm = block_needs(spec.bound, spec.static_shared, threads, dynamic_shared)
        .map_or(0, blocks_per_sm);
    out(blocks, per_sm as c_int)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        let s = st.stream(stream as u64)?;
        let func = st
            .functions
            .get(&(f as u64))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if st.modules[&func.module].dev != dev {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let spec = kernel_spec(func.name).expect("a known kernel");
        let threads = u64::from(block_x) * u64::from(block_y) * u64::from(block_z);
        let blocks = u64::from(grid_x) * u64::from(grid_y) * u64::from(grid_z);
        if blocks == 0 || blocks > u64::from(u32::MAX) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // A block beyond the launch bound, or beyond the shared memory a
        // block may take, cannot run.
        let needs = u32::try_from(threads)
            .ok()
            .and_then(|t| block_needs(spec.bound, spec.static_shared, t, shared_mem as usize))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if params.is_null() || !extra.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let copied = spec
            .params
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let mut words = vec![0u64; size.div_ceil(8)];
                // SAFETY: kernelParams holds one pointer per parameter,
                // each to a value of the parameter's size.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (*params.add(i)).cast::<u8>(),
                        words.as_mut_ptr().cast(),
                        size,
                    )
                };
                words
            })
            .collect();
        let work = Work::Kernel(Kernel {
            name: spec.name,
            dev,
            blocks: blocks as u32,
            needs,
            params: copied,
        });
        match st.capturing(s) {
            Some(c) => st.capture_node(c, s, work),
            None => st.enqueue(s, work, None).map(drop),
        }
    })
}
