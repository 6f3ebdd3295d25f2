//! Stream management: streams, their waits on events, and stream memory
//! operations (`cuStreamWaitValue32`).

use std::ffi::c_uint;

use cudarc::driver::sys::{CUdeviceptr, CUevent, CUresult, CUstream};

use super::out;
use crate::call;
use crate::exec::{WAIT_CONDITIONS, WAIT_FLUSH};
use crate::state::{lock, notify, Kind, State};
use crate::streams;
use crate::work::Work;

use CUresult::*;

#[no_mangle]
pub extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        if flags & !1 != 0 || stream.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let id = streams::create(&mut st, dev, flags & 1 == 0, false);
        out(stream, id as usize as CUstream)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if st.streams[&s].legacy {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // Work in flight completes; the worker ends after it.
        st.streams.get_mut(&s).expect("checked").destroyed = true;
        notify();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if let Some(c) = st.capturing(s) {
            st.invalidate(Some(c));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        State::drain(&mut st, s)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if let Some(c) = st.capturing(s) {
            st.invalidate(Some(c));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let done = st.reached(s, st.streams[&s].enqueued);
        if done {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    })
}

/// `CU_EVENT_WAIT_EXTERNAL`: an event recorded outside a capture may be
/// waited on inside it.
const WAIT_EXTERNAL: c_uint = 1;

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, ev: CUevent, flags: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let e = st.event(ev as u64)?;
        let s = st.stream(stream as u64)?;
        if flags & !WAIT_EXTERNAL != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mine = st.capturing(s);
        match (st.events[&e].captured.clone(), mine) {
            // Inside one capture: an edge; a stream not capturing yet
            // joins the capture (a fork).
            (Some((c, nodes)), None | Some(_))
                if st.captures.contains_key(&c) && mine.is_none_or(|m| m == c) =>
            {
                let capture = st.captures.get_mut(&c).expect("checked");
                let tails = capture.tails.entry(s).or_default();
                for n in nodes {
                    if !tails.contains(&n) {
                        tails.push(n);
                    }
                }
                st.streams.get_mut(&s).expect("checked").capture = Some(c);
                Ok(())
            }
            // Recorded in a capture that ended: the graph's event.
            (Some((c, _)), None) if !st.captures.contains_key(&c) => Err(CUDA_ERROR_CAPTURED_EVENT),
            // Recorded in another capture.
            (Some(_), _) => {
                st.invalidate(mine);
                Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            }
            (None, Some(c)) if flags & WAIT_EXTERNAL == 0 => {
                st.invalidate(Some(c));
                Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            }
            (None, Some(c)) => st.capture_node(c, s, Work::WaitEvent(e)),
            (None, None) => {
                let after = st.events[&e].target;
                st.enqueue(s, Work::Empty, after).map(drop)
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitValue32_v2(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        let s = st.stream(stream as u64)?;
        if flags & !(WAIT_CONDITIONS | WAIT_FLUSH) != 0 || !addr.is_multiple_of(4) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if flags & WAIT_FLUSH != 0 {
            // CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES is 0 here.
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        // Memory the device reaches: its own, or mapped pinned memory.
        let reached = match st.find(addr, 4) {
            Some((_, a)) => match a.kind {
                Kind::Device => a.dev == dev || st.config().peer_access,
                Kind::PinnedHost { flags } => flags & 0x2 != 0,
                Kind::Mapped { access } => access & (1 << dev) != 0,
            },
            None => false,
        };
        if !reached {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let work = Work::WaitValue { addr, value, flags };
        match st.capturing(s) {
            Some(c) => st.capture_node(c, s, work),
            None => st.enqueue(s, work, None).map(drop),
        }
    })
}
