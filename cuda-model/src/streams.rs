//! Streams at work: each stream has a worker thread that runs its queue's
//! front operation once the operations it depends on completed.

use std::collections::VecDeque;

use parking_lot::MutexGuard;

use crate::exec;
use crate::occupancy::SmLoad;
use crate::state::{lock, notify, Config, DeviceState, State, StreamState, MODEL, STREAM_BASE};

/// The first `cuInit`: devices, each with its legacy stream.
pub(crate) fn init(st: &mut State) {
    if st.config.is_some() {
        return;
    }
    let config = Config::from_env();
    for dev in 0..config.devices {
        let legacy = create(st, dev, true, true);
        st.devices.push(DeviceState {
            legacy,
            sms: vec![SmLoad::default(); config.sms],
            ..DeviceState::default()
        });
    }
    st.config = Some(config);
}

/// A new stream of device `dev` and its worker; its handle.
pub(crate) fn create(st: &mut State, dev: usize, blocking: bool, legacy: bool) -> u64 {
    let id = st.handle(STREAM_BASE);
    st.streams.insert(
        id,
        StreamState {
            dev,
            blocking,
            legacy,
            queue: VecDeque::new(),
            enqueued: 0,
            done: 0,
            destroyed: false,
            capture: None,
        },
    );
    std::thread::Builder::new()
        .name(format!("cuda-model-stream-{id:x}"))
        .spawn(move || worker(id))
        .expect("a stream's worker thread starts");
    id
}

/// A stream's worker: runs the front operation once its dependencies
/// completed; after a fault of its device, completes the rest unrun (a
/// faulted context runs nothing more).
fn worker(id: u64) {
    let mut st = lock();
    loop {
        let Some(s) = st.streams.get(&id) else { return };
        let ready = match s.queue.front() {
            Some(op) => op.deps.iter().all(|&(d, seq)| st.reached(d, seq)),
            None if s.destroyed => {
                st.streams.remove(&id);
                notify();
                return;
            }
            None => false,
        };
        if !ready {
            MODEL.changed.wait(&mut st);
            continue;
        }
        let s = st.streams.get_mut(&id).expect("looked up above");
        let op = s.queue.pop_front().expect("a front operation");
        let dev = s.dev;
        if st.devices[dev].sticky.is_none() {
            let result = MutexGuard::unlocked(&mut st, || exec::run(&op.work, dev));
            if let Err(e) = result {
                let sticky = &mut st.devices[dev].sticky;
                sticky.get_or_insert(e);
            }
        }
        st.streams.get_mut(&id).expect("still there").done = op.seq;
        if let Some(k) = op.kernel {
            st.devices[dev].kernels.remove(&k);
        }
        notify();
    }
}
