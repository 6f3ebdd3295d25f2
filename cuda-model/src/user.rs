//! User objects (`cuUserObjectCreate`): a destructor and its argument,
//! reference counted by the program and by graphs. A graph's references
//! are shared by the executable graphs instantiated from it, which keep
//! them until they are destroyed and their launches completed. A
//! destructor runs on one shared thread of the driver, never on the
//! caller's, and may not call CUDA (as a host function).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use crate::exec::IN_HOST_FUNCTION;
use crate::state::lock;

pub(crate) struct UserObject {
    pub destroy: unsafe extern "C" fn(*mut c_void),
    pub ptr: usize,
    /// Every reference: the program's, graphs' and executables'.
    pub refs: u64,
    /// The program's own references.
    pub caller: u64,
}

/// References to user objects: object handle to count.
pub(crate) type Refs = HashMap<u64, u32>;

/// Adds `count` references of `object` to `refs`.
pub(crate) fn add(refs: &mut Refs, object: u64, count: u32) {
    *refs.entry(object).or_insert(0) += count;
}

/// What the shared destructor thread is asked to do.
enum Job {
    /// Release references (an executable graph's, once unused).
    Release(Refs),
    /// Run destructors whose objects lost their last reference.
    Destroy(Vec<(unsafe extern "C" fn(*mut c_void), usize)>),
}

static THREAD: LazyLock<Mutex<Sender<Job>>> = LazyLock::new(|| {
    let (send, receive) = channel::<Job>();
    std::thread::Builder::new()
        .name("cuda-model-destructors".into())
        .spawn(move || {
            for job in receive {
                let destroy = match job {
                    Job::Release(refs) => release_now(&mut lock().user_objects, &refs),
                    Job::Destroy(list) => list,
                };
                for (f, ptr) in destroy {
                    IN_HOST_FUNCTION.with(|h| h.set(true));
                    // SAFETY: the program's destructor with the argument
                    // it gave, called once, after its last reference.
                    unsafe { f(ptr as *mut c_void) };
                    IN_HOST_FUNCTION.with(|h| h.set(false));
                }
            }
        })
        .expect("the destructor thread starts");
    Mutex::new(send)
});

/// Drops `refs` from `objects`: the destructors of objects left without
/// a reference, removed from the table.
fn release_now(
    objects: &mut HashMap<u64, UserObject>,
    refs: &Refs,
) -> Vec<(unsafe extern "C" fn(*mut c_void), usize)> {
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
    destroy
}

/// Releases `refs` now; their destructors run on the shared thread.
pub(crate) fn release(objects: &mut HashMap<u64, UserObject>, refs: &Refs) {
    let destroy = release_now(objects, refs);
    if !destroy.is_empty() {
        let _ = THREAD.lock().send(Job::Destroy(destroy));
    }
}

/// An executable graph's references, released when the executable is
/// destroyed and every launch of it completed (each launch holds a
/// clone).
pub(crate) struct Hold(pub Refs);

impl Drop for Hold {
    fn drop(&mut self) {
        // Dropped where the model's lock may be held: the shared thread
        // releases them.
        if !self.0.is_empty() {
            let _ = THREAD
                .lock()
                .send(Job::Release(std::mem::take(&mut self.0)));
        }
    }
}

/// A new hold of `refs`, whose objects gain those references.
pub(crate) fn hold(objects: &mut HashMap<u64, UserObject>, refs: &Refs) -> Arc<Hold> {
    for (object, &count) in refs {
        if let Some(o) = objects.get_mut(object) {
            o.refs += u64::from(count);
        }
    }
    Arc::new(Hold(refs.clone()))
}
