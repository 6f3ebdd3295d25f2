//! User objects: created and released by the program, retained and
//! released by graphs (`user.rs` keeps their references).

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::{CUgraph, CUhostFn, CUresult, CUuserObject};

use super::out;
use crate::state::{lock, State, USER_OBJECT_BASE};
use crate::user::{self, Objects, UserObject};
use crate::{call, report, Res};

use CUresult::*;

/// A reference count argument: nonzero and at most `INT_MAX`.
fn ref_count(count: c_uint) -> Res<u32> {
    if count == 0 || count > i32::MAX as c_uint {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(count)
}

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, the flag `cuUserObjectCreate`
/// requires.
const NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const USER_OBJECT_MOVE: c_uint = 1;

#[no_mangle]
pub extern "C" fn cuUserObjectCreate(
    object: *mut CUuserObject,
    ptr: *mut c_void,
    destroy: CUhostFn,
    initial: c_uint,
    flags: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = ref_count(initial)?;
        let destroy = destroy.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != NO_DESTRUCTOR_SYNC || object.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let id = st.handle(USER_OBJECT_BASE);
        user::objects().insert(
            id,
            UserObject {
                destroy,
                ptr: ptr as usize,
                refs: count.into(),
                caller: count.into(),
            },
        );
        out(object, id as usize as CUuserObject)
    })
}

/// The user object `object`, whose caller must own `count` references
/// (using more is undefined behaviour: the model refuses it).
fn owned_by_caller(
    objects: &mut Objects,
    object: CUuserObject,
    count: u32,
) -> Res<&mut UserObject> {
    let o = objects
        .get_mut(&(object as u64))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if o.caller < u64::from(count) {
        report(format_args!(
            "{count} references of user object {:#x} given up, of which the caller owns {} \
             (undefined behaviour)",
            object as u64, o.caller
        ));
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(o)
}

#[no_mangle]
pub extern "C" fn cuUserObjectRetain(object: CUuserObject, count: c_uint) -> CUresult {
    call(|| {
        lock().initialized()?;
        let count = u64::from(ref_count(count)?);
        let mut objects = user::objects();
        let o = owned_by_caller(&mut objects, object, 0)?;
        o.refs += count;
        o.caller += count;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuUserObjectRelease(object: CUuserObject, count: c_uint) -> CUresult {
    call(|| {
        lock().initialized()?;
        let count = ref_count(count)?;
        let mut objects = user::objects();
        owned_by_caller(&mut objects, object, count)?.caller -= u64::from(count);
        user::release(&mut objects, &[(object as u64, count)].into());
        Ok(())
    })
}

/// The user object references of graph `graph`: a graph's, or those of
/// the graph a capture builds.
fn graph_refs(st: &mut State, graph: CUgraph) -> Res<&mut user::Refs> {
    let id = graph as u64;
    if let Some(g) = st.graphs.get_mut(&id) {
        return Ok(&mut g.refs);
    }
    st.captures
        .values_mut()
        .find(|c| c.graph == id)
        .map(|c| &mut c.refs)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

#[no_mangle]
pub extern "C" fn cuGraphRetainUserObject(
    graph: CUgraph,
    object: CUuserObject,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = ref_count(count)?;
        if flags & !USER_OBJECT_MOVE != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        graph_refs(&mut st, graph)?;
        let moved = if flags & USER_OBJECT_MOVE != 0 {
            count
        } else {
            0
        };
        let mut objects = user::objects();
        let o = owned_by_caller(&mut objects, object, moved)?;
        o.caller -= u64::from(moved);
        o.refs += u64::from(count - moved);
        user::add(graph_refs(&mut st, graph)?, object as u64, count);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuGraphReleaseUserObject(
    graph: CUgraph,
    object: CUuserObject,
    count: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let count = ref_count(count)?;
        let refs = graph_refs(&mut st, graph)?;
        match refs.get_mut(&(object as u64)) {
            Some(held) if *held >= count => *held -= count,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        refs.retain(|_, held| *held > 0);
        user::release(&mut user::objects(), &[(object as u64, count)].into());
        Ok(())
    })
}
