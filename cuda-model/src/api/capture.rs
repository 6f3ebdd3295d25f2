//! Stream capture: captured work becomes the nodes of a graph.

use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use cudarc::driver::sys::{CUgraph, CUresult, CUstream};

use super::out;
use crate::state::{lock, Capture, Graph, GRAPH_BASE};
use crate::work::Node;
use crate::{call, report, user};

use CUresult::*;

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        if mode > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if st.streams[&s].legacy {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if st.capturing(s).is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        let id = st.handle(0);
        let graph = st.handle(GRAPH_BASE);
        st.captures.insert(
            id,
            Capture {
                origin: s,
                mode,
                thread: std::thread::current().id(),
                nodes: Vec::new(),
                tails: [(s, Vec::new())].into(),
                invalid: false,
                allocs: Vec::new(),
                graph,
                refs: Default::default(),
            },
        );
        st.streams.get_mut(&s).expect("checked").capture = Some(id);
        Ok(())
    })
}

/// Every node that `tails` depend on, themselves included.
fn ancestors(nodes: &[Node], tails: &[usize]) -> Vec<bool> {
    let mut seen = vec![false; nodes.len()];
    let mut todo: Vec<usize> = tails.to_vec();
    while let Some(n) = todo.pop() {
        if !std::mem::replace(&mut seen[n], true) {
            todo.extend(&nodes[n].deps);
        }
    }
    seen
}

#[no_mangle]
pub extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        let c = st.capturing(s).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        if st.captures[&c].origin != s {
            st.invalidate(Some(c));
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        if st.captures[&c].thread != std::thread::current().id() && st.captures[&c].mode != 2 {
            return Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        }
        let capture = st.captures.remove(&c).expect("live");
        for stream in st.streams.values_mut() {
            if stream.capture == Some(c) {
                stream.capture = None;
            }
        }
        let dev = st.streams[&s].dev;
        let joined = ancestors(&capture.nodes, &capture.tails[&s]);
        let unjoined = capture.tails.values().flatten().any(|&n| !joined[n]);
        if capture.invalid || unjoined {
            // The graph goes, and what it owned with it.
            for p in capture.allocs {
                st.release(p);
            }
            user::release(&mut user::objects(), &capture.refs);
            return Err(if capture.invalid {
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            } else {
                CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            });
        }
        let id = capture.graph;
        st.graphs.insert(
            id,
            Graph {
                dev,
                nodes: Arc::new(capture.nodes),
                allocs: capture.allocs,
                refs: capture.refs,
            },
        );
        out(graph, id as usize as CUgraph)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint) -> CUresult {
    call(|| {
        let st = lock();
        let s = st.stream(stream as u64)?;
        // CU_STREAM_CAPTURE_STATUS_NONE, _ACTIVE, _INVALIDATED
        let v = match st.capturing(s) {
            None => 0,
            Some(c) if st.captures[&c].invalid => 2,
            Some(_) => 1,
        };
        out(status, v)
    })
}
#[no_mangle]
pub extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut CUgraph,
    dependencies: *mut *const c_void,
    edge_data: *mut *const c_void,
    count: *mut usize,
) -> CUresult {
    call(|| {
        let st = lock();
        let s = st.stream(stream as u64)?;
        if status.is_null() || (!edge_data.is_null() && dependencies.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !dependencies.is_null() {
            report(format_args!(
                "cuStreamGetCaptureInfo: the capture's nodes are not modeled"
            ));
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let dev = st.streams[&s].dev;
        let implicit = st.streams[&s].legacy
            && st
                .streams
                .values()
                .any(|o| o.dev == dev && o.blocking && !o.legacy && o.capture.is_some());
        if implicit {
            return Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        }
        let Some(c) = st.capturing(s) else {
            return out(status, 0);
        };
        let capture = &st.captures[&c];
        if capture.invalid {
            return out(status, 2);
        }
        out(status, 1)?;
        if !id.is_null() {
            out(id, c)?;
        }
        if !graph.is_null() {
            out(graph, capture.graph as usize as CUgraph)?;
        }
        if !count.is_null() {
            out(count, capture.tails.get(&s).map_or(0, Vec::len))?;
        }
        Ok(())
    })
}
