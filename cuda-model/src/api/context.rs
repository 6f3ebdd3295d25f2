//! Primary contexts and the calling thread's context stack.

use cudarc::driver::sys::{CUcontext, CUdevice, CUresult};

use super::{context_handle, out};
use crate::call;
use crate::state::{current_dev, lock, wait_until, with_stack};

use CUresult::*;

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.device(dev)?;
        if ctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = &mut st.devices[dev];
        if device.retains == 0 {
            // A new context: a fault of the one before is gone with it.
            device.sticky = None;
        }
        device.retains += 1;
        out(ctx, context_handle(dev))
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.device(dev)?;
        if st.devices[dev].retains == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        st.devices[dev].retains -= 1;
        if st.devices[dev].retains == 0 {
            // The context goes, and its memory with it.
            let gone: Vec<u64> = st
                .allocs
                .iter()
                .filter(|(_, a)| a.dev == dev)
                .map(|(&p, _)| p)
                .collect();
            for p in gone {
                st.release(p);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    call(|| {
        let st = lock();
        st.initialized()?;
        if ctx.is_null() {
            with_stack(|s| s.pop());
            return Ok(());
        }
        let dev = st.context(ctx as u64)?;
        with_stack(|s| match s.last_mut() {
            Some(top) => *top = dev,
            None => s.push(dev),
        });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult {
    call(|| {
        lock().initialized()?;
        out(
            ctx,
            current_dev().map_or(std::ptr::null_mut(), context_handle),
        )
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    call(|| {
        let dev = lock().context(ctx as u64)?;
        with_stack(|s| s.push(dev));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CUresult {
    call(|| {
        lock().initialized()?;
        let dev = with_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !ctx.is_null() {
            out(ctx, context_handle(dev))?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    call(|| out(device, lock().current()? as CUdevice))
}

#[no_mangle]
pub extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    if ctx.is_null() {
        return cuCtxGetDevice(device);
    }
    call(|| out(device, lock().context(ctx as u64)? as CUdevice))
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        st.unsafe_call()?;
        let streams: Vec<(u64, u64)> = st
            .streams
            .iter()
            .filter(|(_, s)| s.dev == dev)
            .map(|(&id, s)| (id, s.enqueued))
            .collect();
        wait_until(
            &mut st,
            || format!("cuCtxSynchronize of device {dev}"),
            |s| {
                s.devices[dev].sticky.is_some()
                    || streams.iter().all(|&(id, seq)| s.reached(id, seq))
            },
        )?;
        st.devices[dev].sticky.map_or(Ok(()), Err)
    })
}
