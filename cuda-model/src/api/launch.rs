//! Execution control and occupancy: kernel launches and host functions
//! in stream order.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::{CUfunction, CUhostFn, CUresult, CUstream};

use super::out;
use crate::call;
use crate::exec::KERNELS;
use crate::state::lock;
use crate::work::{Kernel, Work};

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
    _dynamic_smem: usize,
) -> CUresult {
    call(|| {
        let st = lock();
        st.current()?;
        let func = st
            .functions
            .get(&(f as u64))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let bound = KERNELS
            .iter()
            .find(|k| k.0 == func.name)
            .map_or(1024, |k| k.2);
        // One block per modeled SM, whatever its size.
        out(
            blocks,
            c_int::from(block_size > 0 && block_size as u32 <= bound),
        )
    })
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
    _shared_mem: c_uint,
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
        let (name, sizes, bound) = *KERNELS
            .iter()
            .find(|k| k.0 == func.name)
            .expect("a known kernel");
        let threads = u64::from(block_x) * u64::from(block_y) * u64::from(block_z);
        let blocks = u64::from(grid_x) * u64::from(grid_y) * u64::from(grid_z);
        if threads == 0 || blocks == 0 || threads > u64::from(bound) || blocks > u64::from(u32::MAX)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if params.is_null() || !extra.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let copied = sizes
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
            name,
            dev,
            blocks: blocks as u32,
            params: copied,
        });
        match st.capturing(s) {
            Some(c) => st.capture_node(c, s, work),
            None => st.enqueue(s, work, None).map(drop),
        }
    })
}
