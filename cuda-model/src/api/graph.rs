//! Graphs: instantiation, launches and destruction.

use cudarc::driver::sys::{CUgraph, CUgraphExec, CUresult, CUstream};

use super::out;
use crate::state::{lock, Exec, EXEC_BASE};
use crate::work::Work;
use crate::{call, user};

use CUresult::*;

#[no_mangle]
pub extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = st
            .graphs
            .get(&(graph as u64))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let (dev, nodes, refs) = (g.dev, g.nodes.clone(), g.refs.clone());
        // The executable shares the graph's user object references.
        let hold = user::hold(&refs);
        let id = st.handle(EXEC_BASE);
        st.execs.insert(id, Exec { dev, nodes, hold });
        out(exec, id as usize as CUgraphExec)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    call(|| {
        let mut st = lock();
        let s = st.stream(stream as u64)?;
        let (dev, nodes, hold) = st
            .execs
            .get(&(exec as u64))
            .map(|e| (e.dev, e.nodes.clone(), e.hold.clone()))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if dev != st.streams[&s].dev {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if st.capturing(s).is_some() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        st.enqueue(s, Work::Graph { nodes, _hold: hold }, None)
            .map(drop)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    call(|| {
        let mut st = lock();
        st.execs
            .remove(&(exec as u64))
            .map(drop)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    call(|| {
        let mut st = lock();
        let g = st
            .graphs
            .remove(&(graph as u64))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        for p in g.allocs {
            st.release(p);
        }
        user::release(&mut user::objects(), &g.refs);
        Ok(())
    })
}
