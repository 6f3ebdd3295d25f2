//! User objects (`cuUserObjectCreate`): a destructor and its argument,
//! reference counted by the program and by graphs. A graph's references
//! are shared by the executable graphs instantiated from it, which keep
//! them until they are destroyed and their launches completed. A
//! destructor runs on one shared thread of the driver, never on the
//! caller's, and may not call CUDA (as a host function).
//!
//! The objects have a table and lock of their own, taken after the
//! model's lock where both are held and never before it: a hold dropped
//! under the model's lock releases its references at once.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, LazyLock};

use parking_lot::{Mutex, MutexGuard};

use crate::as_host_function;

pub(crate) struct UserObject {
    pub destroy: unsafe extern "C" fn(*mut c_void),
    pub ptr: usize,
    /// Every reference: the program's, graphs' and executables'.
    pub refs: u64,
    /// The program's own references.
    pub caller: u64,
}

/// The live user objects, by handle.
pub(crate) type Objects = HashMap<u64, UserObject>;

/// References to user objects: object handle to count.
pub(crate) type Refs = HashMap<u64, u32>;

/// Destructors to run, with their arguments.
type Destructors = Vec<(unsafe extern "C" fn(*mut c_void), usize)>;

static OBJECTS: LazyLock<Mutex<Objects>> = LazyLock::new(Default::default);

/// The table of user objects, locked.
pub(crate) fn objects() -> MutexGuard<'static, Objects> {
    OBJECTS.lock()
}

/// Adds `count` references of `object` to `refs`.
pub(crate) fn add(refs: &mut Refs, object: u64, count: u32) {
    *refs.entry(object).or_insert(0) += count;
}

/// The shared thread that runs destructors.
static DESTRUCTORS: LazyLock<Mutex<Sender<Destructors>>> = LazyLock::new(|| {
    let (send, receive) = channel::<Destructors>();
    std::thread::Builder::new()
        .name("cuda-model-destructors".into())
        .spawn(move || {
            for list in receive {
                for (f, ptr) in list {
                    as_host_function(|| {
                        // SAFETY: the program's destructor with the
                        // argument it gave, called once, after its last
                        // reference.
                        unsafe { f(ptr as *mut c_void) }
                    });
                }
            }
        })
        .expect("the destructor thread starts");
    Mutex::new(send)
});

/// Drops `refs` from `objects`; the destructors of objects left without a
/// reference, removed from the table, run on the shared thread.
pub(crate) fn release(objects: &mut Objects, refs: &Refs) {
    let mut destroy = Vec::new();
    for (&object, &count) in refs {
        if let Some(o) = objects.get_mut(&object) {
            o.refs = o.refs.saturating_sub(u64::from(count));
            if o.refs == 0 {
                let o = objects.remove(&object).expect("looked up");
                destroy.push((o.destroy, o.ptr));
            }
        }
    }
    if !destroy.is_empty() {
        let _ = DESTRUCTORS.lock().send(destroy);
    }
}

/// An executable graph's references, released when the executable is
/// destroyed and every launch of it completed (each launch holds a
/// clone).
pub(crate) struct Hold(Refs);

impl Drop for Hold {
    fn drop(&mut self) {
        release(&mut objects(), &self.0);
    }
}

/// A new hold of `refs`, whose objects gain those references.
pub(crate) fn hold(refs: &Refs) -> Arc<Hold> {
    let mut objects = objects();
    for (object, &count) in refs {
        if let Some(o) = objects.get_mut(object) {
            o.refs += u64::from(count);
        }
    }
    Arc::new(Hold(refs.clone()))
}
