//! Streams of the emulated GPU: ordered queues run by a worker thread
//! each; events; tasks joint to several streams.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{Error, Result, Work};

/// One entry of a stream's queue; an error becomes the stream's error.
pub(super) type Item = Box<dyn FnOnce() -> std::result::Result<(), String> + Send>;

struct Queue {
    items: VecDeque<Item>,
    submitted: u64,
    completed: u64,
    /// The first failure of an entry (a wait past its deadline).
    error: Option<String>,
    /// Destroyed: accepts nothing more; the worker ends once empty.
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Rung when an entry arrives or the stream closes.
    arrived: Condvar,
    /// Rung when an entry completes.
    completed: Condvar,
}

/// A stream of the emulated device.
pub struct EmuStream {
    raw: usize,
    shared: Arc<Shared>,
}

fn describe_panic(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

fn worker(raw: usize, shared: Arc<Shared>) {
    loop {
        let item = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(item) = queue.items.pop_front() {
                    break item;
                }
                if queue.closed {
                    return;
                }
                shared.arrived.wait(&mut queue);
            }
        };
        let outcome = match catch_unwind(AssertUnwindSafe(item)) {
            Ok(outcome) => outcome,
            Err(payload) => Err(format!(
                "work on emu stream {raw:#x} panicked: {}",
                describe_panic(payload.as_ref())
            )),
        };
        let mut queue = shared.queue.lock();
        queue.completed += 1;
        if let Err(why) = outcome {
            queue.error.get_or_insert(why);
        }
        shared.completed.notify_all();
    }
}

impl EmuStream {
    /// A stream named `raw` and its worker.
    pub(super) fn start(raw: usize) -> Result<Arc<EmuStream>> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                submitted: 0,
                completed: 0,
                error: None,
                closed: false,
            }),
            arrived: Condvar::new(),
            completed: Condvar::new(),
        });
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name(format!("emu-stream-{raw:x}"))
            .spawn(move || worker(raw, theirs))
            .map_err(|e| Error::System(format!("emu device 0: cannot start a stream: {e}")))?;
        Ok(Arc::new(EmuStream { raw, shared }))
    }

    pub(super) fn raw(&self) -> usize {
        self.raw
    }

    pub(super) fn push(&self, item: Item) -> Result<()> {
        let mut queue = self.shared.queue.lock();
        if queue.closed {
            return Err(Error::InvalidArgument(format!(
                "emu stream {:#x} was destroyed",
                self.raw
            )));
        }
        queue.items.push_back(item);
        queue.submitted += 1;
        self.shared.arrived.notify_one();
        Ok(())
    }

    /// Accepts nothing more; what is queued still runs.
    pub(super) fn close(&self) {
        self.shared.queue.lock().closed = true;
        self.shared.arrived.notify_all();
    }

    pub(super) fn synchronize(&self, deadline: Instant) -> Result<()> {
        let mut queue = self.shared.queue.lock();
        let target = queue.submitted;
        while queue.completed < target {
            if self
                .shared
                .completed
                .wait_until(&mut queue, deadline)
                .timed_out()
                && queue.completed < target
            {
                return Err(Error::System(format!(
                    "emu stream {:#x}: {} of its work still runs at the deadline",
                    self.raw,
                    target - queue.completed
                )));
            }
        }
        match &queue.error {
            Some(why) => Err(Error::System(why.clone())),
            None => Ok(()),
        }
    }

    pub(super) fn record_event(&self, event: &EmuEvent) -> Result<()> {
        let state = event.state.clone();
        let mut marks = state.marks.lock();
        marks.recorded += 1;
        let mark = marks.recorded;
        drop(marks);
        self.push(Box::new(move || {
            let mut marks = state.marks.lock();
            marks.completed = marks.completed.max(mark);
            state.changed.notify_all();
            Ok(())
        }))
    }

    pub(super) fn wait_for(&self, event: &EmuEvent) -> Result<()> {
        let state = event.state.clone();
        let target = state.marks.lock().recorded;
        let raw = self.raw;
        let limit = event.limit;
        self.push(Box::new(move || {
            state.wait(target, Instant::now() + limit).map_err(|_| {
                format!("emu stream {raw:#x} waited {limit:?} for an event that was never reached")
            })
        }))
    }
}

impl Drop for EmuStream {
    fn drop(&mut self) {
        // The last handle gone (a destroyed stream): the worker ends once
        // its queue is empty.
        self.close();
    }
}

#[derive(Default)]
struct Marks {
    /// Records made so far.
    recorded: u64,
    /// The latest record that completed.
    completed: u64,
}

#[derive(Default)]
struct EventState {
    marks: Mutex<Marks>,
    changed: Condvar,
}

impl EventState {
    fn wait(&self, target: u64, deadline: Instant) -> Result<()> {
        let mut marks = self.marks.lock();
        while marks.completed < target {
            if self.changed.wait_until(&mut marks, deadline).timed_out() && marks.completed < target
            {
                return Err(Error::System(
                    "an event was not reached by its deadline".into(),
                ));
            }
        }
        Ok(())
    }
}

/// An event of the emulated device.
pub struct EmuEvent {
    state: Arc<EventState>,
    /// How long a stream waiting on it waits.
    limit: Duration,
}

impl EmuEvent {
    pub(super) fn new(limit: Duration) -> EmuEvent {
        EmuEvent {
            state: Arc::default(),
            limit,
        }
    }

    pub(super) fn query(&self) -> bool {
        let marks = self.state.marks.lock();
        marks.completed >= marks.recorded
    }

    pub(super) fn synchronize(&self, deadline: Instant) -> Result<()> {
        let target = self.state.marks.lock().recorded;
        self.state.wait(target, deadline)
    }
}

struct JointState {
    /// Streams that have not reached the task yet.
    missing: usize,
    work: Option<Work>,
    /// The work started: the streams wait for it without a deadline of
    /// their own (the engine's work keeps its own).
    started: bool,
    done: bool,
    /// A stream could not take its entry: the others stop waiting.
    cancelled: bool,
}

struct Joint {
    state: Mutex<JointState>,
    changed: Condvar,
}

impl Joint {
    /// A stream reached the task: the last to arrive runs it; the others
    /// wait until it is done.
    fn arrive(&self, limit: Duration) -> std::result::Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut state = self.state.lock();
        state.missing -= 1;
        if state.missing == 0 {
            let work = state.work.take();
            state.started = true;
            drop(state);
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                if let Some(work) = work {
                    work()
                }
            }));
            let mut state = self.state.lock();
            state.done = true;
            self.changed.notify_all();
            return outcome
                .map_err(|p| format!("a joint task panicked: {}", describe_panic(p.as_ref())));
        }
        while !state.done {
            if state.cancelled {
                return Err("a joint task was cancelled: one of its streams was destroyed".into());
            }
            if state.started {
                self.changed.wait(&mut state);
            } else if self.changed.wait_until(&mut state, deadline).timed_out()
                && !state.started
                && !state.done
            {
                return Err(format!(
                    "a joint task waited {limit:?} for {} more of its streams",
                    state.missing
                ));
            }
        }
        Ok(())
    }
}

/// Enqueues `work` on every stream of `streams` (distinct) as one task.
pub(super) fn enqueue_joint(streams: &[&EmuStream], work: Work, limit: Duration) -> Result<()> {
    let joint = Arc::new(Joint {
        state: Mutex::new(JointState {
            missing: streams.len(),
            work: Some(work),
            started: false,
            done: false,
            cancelled: false,
        }),
        changed: Condvar::new(),
    });
    for stream in streams {
        let theirs = joint.clone();
        if let Err(err) = stream.push(Box::new(move || theirs.arrive(limit))) {
            joint.state.lock().cancelled = true;
            joint.changed.notify_all();
            return Err(err);
        }
    }
    Ok(())
}
