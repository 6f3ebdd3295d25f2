//! Events: records in stream order, queries, synchronization and timing.

use std::ffi::c_uint;

use cudarc::driver::sys::{CUevent, CUresult, CUstream};

use super::out;
use crate::state::{lock, wait_until, EventState, State, EVENT_BASE};
use crate::work::Work;
use crate::{call, Res};

use CUresult::*;

#[no_mangle]
pub extern "C" fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        if flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let id = st.handle(EVENT_BASE);
        st.events.insert(
            id,
            EventState {
                dev,
                flags,
                target: None,
                time: None,
                captured: None,
            },
        );
        out(event, id as usize as CUevent)
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(ev: CUevent, stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = st.event(ev as u64)?;
        let s = st.stream(stream as u64)?;
        if st.events[&e].dev != st.streams[&s].dev {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if let Some(c) = st.capturing(s) {
            if st.captures[&c].invalid {
                return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            let tails = st.captures[&c].tails.get(&s).cloned().unwrap_or_default();
            let ev = st.events.get_mut(&e).expect("checked");
            ev.captured = Some((c, tails));
            ev.target = None;
            return Ok(());
        }
        let seq = st.enqueue(s, Work::Record(e), None)?;
        let ev = st.events.get_mut(&e).expect("checked");
        ev.target = Some((s, seq));
        ev.captured = None;
        Ok(())
    })
}

/// An event last recorded in a capture is the graph's, not the host's:
/// querying it is refused, and during the capture invalidates it.
fn captured_event(st: &mut State, e: u64) -> Res<()> {
    if let Some((c, _)) = st.events[&e].captured {
        st.invalidate(Some(c));
        return Err(CUDA_ERROR_CAPTURED_EVENT);
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = st.event(ev as u64)?;
        captured_event(&mut st, e)?;
        if let Some(err) = st.devices[st.events[&e].dev].sticky {
            return Err(err);
        }
        match st.events[&e].target {
            Some((s, seq)) if !st.reached(s, seq) => Err(CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = st.event(ev as u64)?;
        captured_event(&mut st, e)?;
        let dev = st.events[&e].dev;
        if let Some((s, seq)) = st.events[&e].target {
            wait_until(
                &mut st,
                || format!("cuEventSynchronize of an event of device {dev}"),
                |x| x.reached(s, seq) || x.devices[dev].sticky.is_some(),
            )?;
        }
        st.devices[dev].sticky.map_or(Ok(()), Err)
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = st.event(ev as u64)?;
        st.events.remove(&e);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    call(|| {
        let st = lock();
        let (a, b) = (st.event(start as u64)?, st.event(end as u64)?);
        let (ea, eb) = (&st.events[&a], &st.events[&b]);
        // CU_EVENT_DISABLE_TIMING
        if ea.flags & 2 != 0 || eb.flags & 2 != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        match (ea.time, eb.time) {
            (Some(x), Some(y)) => {
                let d = if y >= x {
                    (y - x).as_secs_f32()
                } else {
                    -(x - y).as_secs_f32()
                };
                out(ms, d * 1000.0)
            }
            _ => Err(CUDA_ERROR_NOT_READY),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    cuEventElapsedTime(ms, start, end)
}
