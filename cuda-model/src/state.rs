//! The driver's state: devices and their primary contexts, each thread's
//! context stack, allocations, streams (their queues; `streams.rs` runs
//! them), events, capture sequences, graphs and modules. One lock guards
//! it all; one condition variable tells every waiter that something
//! completed.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUresult;
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::occupancy::SmLoad;
use crate::user::{Hold, Refs};
use crate::vmm::Vmm;
use crate::work::{Node, Work};
use crate::{report, Res};

/// The switches of the crate's documentation.
pub(crate) struct Config {
    pub devices: usize,
    pub sms: usize,
    pub deadline: Duration,
    pub sync_copies: bool,
    pub peer_access: bool,
    pub alloc_waits: bool,
    pub late: Duration,
    pub fault: Option<(String, u64)>,
}

impl Config {
    pub(crate) fn from_env() -> Config {
        let number = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(default)
        };
        let on = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        let fault = std::env::var("RCCL_CUDA_MODEL_FAULT")
            .ok()
            .map(|v| match v.split_once(':') {
                Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
                None => (v, 1),
            });
        Config {
            devices: number("RCCL_CUDA_MODEL_DEVICES", 2).max(1) as usize,
            sms: number("RCCL_CUDA_MODEL_SMS", 4).max(1) as usize,
            deadline: Duration::from_millis(number("RCCL_CUDA_MODEL_DEADLINE_MS", 20_000)),
            sync_copies: on("RCCL_CUDA_MODEL_SYNC_COPIES"),
            peer_access: on("RCCL_CUDA_MODEL_PEER_ACCESS"),
            late: Duration::from_millis(number("RCCL_CUDA_MODEL_LATE_MS", 0)),
            alloc_waits: std::env::var("RCCL_CUDA_MODEL_ALLOC_WAITS").map_or(true, |v| v != "0"),
            fault,
        }
    }
}

/// A device and its primary context.
#[derive(Default)]
pub(crate) struct DeviceState {
    /// Primary context retains; the context exists while above zero.
    pub retains: u32,
    /// The context's sticky error (a faulted kernel).
    pub sticky: Option<CUresult>,
    /// What the blocks resident on each of the device's SMs hold now.
    pub sms: Vec<SmLoad>,
    /// Kernels launched and not yet complete, by launch number.
    pub kernels: BTreeSet<u64>,
    /// The legacy default stream's id.
    pub legacy: u64,
    /// A host function of the context runs now: the model runs them one
    /// at a time, as CUDA may.
    pub host_busy: bool,
}

/// What an allocation is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// `cuMemAlloc` / `cuMemAllocAsync` memory.
    Device,
    /// `cuMemHostAlloc` memory with its flags.
    PinnedHost { flags: u32 },
    /// A `cuMemMap` mapping with access set: the devices (a bit each)
    /// that may access it.
    Mapped { access: u64 },
}

pub(crate) struct Alloc {
    pub size: usize,
    pub kind: Kind,
    /// The device whose context allocated it.
    pub dev: usize,
    pub id: u64,
}

/// An operation in a stream's queue.
pub(crate) struct Op {
    pub seq: u64,
    /// (stream, seq) pairs that must complete first.
    pub deps: Vec<(u64, u64)>,
    /// The launch number when the operation runs kernels.
    pub kernel: Option<u64>,
    pub work: Work,
}

pub(crate) struct StreamState {
    pub dev: usize,
    /// Synchronizes with the legacy default stream (not
    /// `CU_STREAM_NON_BLOCKING`).
    pub blocking: bool,
    pub legacy: bool,
    pub queue: VecDeque<Op>,
    pub enqueued: u64,
    pub done: u64,
    pub destroyed: bool,
    /// The capture sequence the stream takes part in.
    pub capture: Option<u64>,
}

pub(crate) struct EventState {
    pub dev: usize,
    pub flags: u32,
    /// The stream position its last record stands for.
    pub target: Option<(u64, u64)>,
    /// When the stream reached the last record.
    pub time: Option<Instant>,
    /// Recorded inside a capture sequence: which, and the nodes it
    /// stands for.
    pub captured: Option<(u64, Vec<usize>)>,
}

/// A capture sequence (`cuStreamBeginCapture`).
pub(crate) struct Capture {
    pub origin: u64,
    pub mode: u32,
    pub thread: std::thread::ThreadId,
    pub nodes: Vec<Node>,
    /// Each captured stream's last nodes.
    pub tails: HashMap<u64, Vec<usize>>,
    /// Why it was invalidated, if it was.
    pub invalid: bool,
    /// Memory of `cuMemAllocAsync` in the capture, owned by its graph.
    pub allocs: Vec<u64>,
    /// The handle the graph will have (`cuStreamGetCaptureInfo`).
    pub graph: u64,
    /// User object references retained by the graph being captured.
    pub refs: Refs,
}

pub(crate) struct Graph {
    pub dev: usize,
    pub nodes: std::sync::Arc<Vec<Node>>,
    pub allocs: Vec<u64>,
    pub refs: Refs,
}

/// An executable graph: its graph's nodes, device and user object
/// references.
pub(crate) struct Exec {
    pub dev: usize,
    pub nodes: std::sync::Arc<Vec<Node>>,
    pub hold: std::sync::Arc<Hold>,
}

pub(crate) struct Module {
    pub dev: usize,
}

pub(crate) struct Function {
    pub module: u64,
    pub name: &'static str,
}

#[derive(Default)]
pub(crate) struct State {
    pub config: Option<Config>,
    pub devices: Vec<DeviceState>,
    pub allocs: BTreeMap<u64, Alloc>,
    pub streams: HashMap<u64, StreamState>,
    pub events: HashMap<u64, EventState>,
    pub captures: HashMap<u64, Capture>,
    pub modules: HashMap<u64, Module>,
    pub functions: HashMap<u64, Function>,
    pub graphs: HashMap<u64, Graph>,
    pub execs: HashMap<u64, Exec>,
    /// Kernels started so far, per name: what fault injection and
    /// `rccl_cuda_model_launches` count.
    pub launches: HashMap<&'static str, u64>,
    pub vmm: Vmm,
    next: u64,
}

pub(crate) struct Model {
    pub state: Mutex<State>,
    pub changed: Condvar,
}

pub(crate) static MODEL: LazyLock<Model> = LazyLock::new(|| Model {
    state: Mutex::new(State::default()),
    changed: Condvar::new(),
});

thread_local! {
    /// The thread's context stack: device ordinals of primary contexts.
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Handles are numbers that no pointer of the process takes: each kind in
/// a range of its own, so a handle of one kind passed for another is
/// refused.
pub(crate) const CONTEXT_BASE: u64 = 0xc0_0000;
pub(crate) const STREAM_BASE: u64 = 0x51_0000;
pub(crate) const EVENT_BASE: u64 = 0xe0_0000;
pub(crate) const MODULE_BASE: u64 = 0x30_0000;
pub(crate) const FUNCTION_BASE: u64 = 0xf0_0000;
pub(crate) const GRAPH_BASE: u64 = 0x60_0000;
pub(crate) const EXEC_BASE: u64 = 0x70_0000;
pub(crate) const USER_OBJECT_BASE: u64 = 0x80_0000;

pub(crate) fn lock() -> MutexGuard<'static, State> {
    MODEL.state.lock()
}

pub(crate) fn notify() {
    MODEL.changed.notify_all();
}

/// Waits (the lock released meanwhile) until `done` holds; past the
/// deadline, reports `what` and fails with `CUDA_ERROR_LAUNCH_TIMEOUT`,
/// where a GPU would hang.
pub(crate) fn wait_until(
    st: &mut MutexGuard<'static, State>,
    what: impl Fn() -> String,
    mut done: impl FnMut(&State) -> bool,
) -> Res<()> {
    let deadline = Instant::now() + st.config().deadline;
    while !done(st) {
        if MODEL.changed.wait_until(st, deadline).timed_out() && !done(st) {
            report(format_args!(
                "{} still waiting after {:?}: on a GPU this hangs",
                what(),
                st.config().deadline
            ));
            return Err(CUresult::CUDA_ERROR_LAUNCH_TIMEOUT);
        }
    }
    Ok(())
}

impl State {
    pub fn config(&self) -> &Config {
        self.config.as_ref().expect("checked by initialized()")
    }

    pub fn handle(&mut self, base: u64) -> u64 {
        self.next += 1;
        (base + self.next) << 4
    }

    pub fn initialized(&self) -> Res<()> {
        match self.config {
            Some(_) => Ok(()),
            None => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
        }
    }

    pub fn device(&self, ordinal: i32) -> Res<usize> {
        self.initialized()?;
        usize::try_from(ordinal)
            .ok()
            .filter(|&d| d < self.devices.len())
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }

    /// The device of a context handle, whose context exists.
    pub fn context(&self, handle: u64) -> Res<usize> {
        self.initialized()?;
        let dev = (handle >> 4)
            .checked_sub(CONTEXT_BASE)
            .map(|d| d as usize)
            .filter(|&d| handle & 0xf == 0 && d < self.devices.len())
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        if self.devices[dev].retains == 0 {
            return Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
        }
        Ok(dev)
    }

    /// The device of the calling thread's current context: what every
    /// call that needs a context asks first. Its sticky error, if any.
    pub fn current(&self) -> Res<usize> {
        self.initialized()?;
        let dev = current_dev().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        let device = &self.devices[dev];
        if device.retains == 0 {
            return Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
        }
        device.sticky.map_or(Ok(dev), Err)
    }

    /// The allocation holding `[ptr, ptr + len)`, if one does.
    pub fn find(&self, ptr: u64, len: usize) -> Option<(u64, &Alloc)> {
        let (&base, alloc) = self.allocs.range(..=ptr).next_back()?;
        let end = base + alloc.size as u64;
        (ptr < end && ptr + len as u64 <= end).then_some((base, alloc))
    }

    /// Whether a kernel or copy of device `dev` may touch `[ptr, ptr +
    /// len)`: memory of this device, or mapped pinned host memory (any
    /// host memory when `host_ok`).
    pub fn reachable(&self, dev: usize, ptr: u64, len: usize, host_ok: bool) -> bool {
        match self.find(ptr, len) {
            Some((_, a)) => match a.kind {
                Kind::Device => a.dev == dev || self.config().peer_access,
                Kind::PinnedHost { .. } => true,
                Kind::Mapped { access } => access & (1 << dev) != 0,
            },
            None => host_ok,
        }
    }

    /// The stream a handle names, in the current context (0 and
    /// `CU_STREAM_LEGACY`: its legacy default stream).
    pub fn stream(&self, raw: u64) -> Res<u64> {
        let dev = self.current()?;
        if raw == 0 || raw == 1 {
            return Ok(self.devices[dev].legacy);
        }
        match self.streams.get(&raw) {
            Some(s) if !s.destroyed && s.dev == dev => Ok(raw),
            Some(s) if !s.destroyed => Err(CUresult::CUDA_ERROR_INVALID_CONTEXT),
            _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// The event a handle names.
    pub fn event(&self, handle: u64) -> Res<u64> {
        self.initialized()?;
        self.events
            .contains_key(&handle)
            .then_some(handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Device memory and pinned host memory: 256-byte aligned, as the
    /// driver aligns, and filled with garbage (CUDA does not zero it).
    pub fn allocate(&mut self, size: usize, kind: Kind, dev: usize) -> Res<u64> {
        let layout = allocation_layout(size)?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: fresh memory of `layout.size()` bytes.
        unsafe { ptr.write_bytes(0xa5, layout.size()) };
        let id = self.handle(0);
        self.allocs.insert(
            ptr as u64,
            Alloc {
                size,
                kind,
                dev,
                id,
            },
        );
        Ok(ptr as u64)
    }

    /// Frees the allocation at `base` (nothing when it is gone already).
    pub fn release(&mut self, base: u64) {
        if let Some(a) = self.allocs.remove(&base) {
            let layout = allocation_layout(a.size).expect("allocated with this layout");
            // SAFETY: allocated by `allocate` with this layout, removed
            // from the table so freed once.
            unsafe { std::alloc::dealloc(base as *mut u8, layout) };
        }
    }

    /// Enqueues `run` on `stream` after what the legacy stream's rules
    /// order it behind: the legacy stream waits for every blocking stream
    /// of its device, a blocking stream for the legacy stream.
    /// `after`: one more (stream, seq) to wait for (an event's).
    pub fn enqueue(&mut self, stream: u64, work: Work, after: Option<(u64, u64)>) -> Res<u64> {
        let (dev, blocking, legacy) = {
            let s = &self.streams[&stream];
            (s.dev, s.blocking, s.legacy)
        };
        let mut deps: Vec<(u64, u64)> = after.into_iter().collect();
        if legacy {
            for (&id, s) in &self.streams {
                if s.dev == dev && s.blocking && !s.legacy {
                    if s.capture.is_some() {
                        // The legacy stream would wait for a capturing
                        // stream: the capture is invalidated.
                        self.invalidate(s.capture);
                        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
                    }
                    deps.push((id, s.enqueued));
                }
            }
        } else if blocking {
            deps.push((
                self.devices[dev].legacy,
                self.streams[&self.devices[dev].legacy].enqueued,
            ));
        }
        let kernel = matches!(work, Work::Kernel(_) | Work::Graph { .. });
        let launch = kernel.then(|| self.handle(0));
        if let Some(k) = launch {
            self.devices[dev].kernels.insert(k);
        }
        let s = self.streams.get_mut(&stream).expect("checked by stream()");
        s.enqueued += 1;
        let seq = s.enqueued;
        s.queue.push_back(Op {
            seq,
            deps,
            kernel: launch,
            work,
        });
        notify();
        Ok(seq)
    }

    /// Waits until `stream` completed everything enqueued so far; the
    /// context's sticky error if a kernel faulted.
    pub fn drain(st: &mut MutexGuard<'static, State>, stream: u64) -> Res<()> {
        let target = st.streams[&stream].enqueued;
        let dev = st.streams[&stream].dev;
        wait_until(
            st,
            || format!("a synchronization of stream {stream:#x} of device {dev}"),
            |s| s.reached(stream, target) || s.devices[dev].sticky.is_some(),
        )?;
        st.devices[dev].sticky.map_or(Ok(()), Err)
    }

    /// Whether `stream` completed its `seq`-th operation (a stream that
    /// is gone completed all of its).
    pub fn reached(&self, stream: u64, seq: u64) -> bool {
        self.streams.get(&stream).is_none_or(|s| s.done >= seq)
    }

    /// Waits for every kernel of `dev` launched so far: what allocation
    /// and free may do (the implicit synchronization CUDA allows).
    pub fn wait_kernels(st: &mut MutexGuard<'static, State>, dev: usize, call: &str) -> Res<()> {
        if !st.config().alloc_waits {
            return Ok(());
        }
        let before: Vec<u64> = st.devices[dev].kernels.iter().copied().collect();
        let last = before.last().copied();
        wait_until(
            st,
            || {
                format!(
                    "{call} on device {dev} waits for the kernels launched before it \
                     (CUDA may synchronize allocation with running kernels)"
                )
            },
            |s| last.is_none_or(|last| s.devices[dev].kernels.range(..=last).next().is_none()),
        )
    }

    /// The capture sequences an unsafe call (one that may synchronize
    /// implicitly) violates from this thread: every global-mode capture,
    /// and this thread's own unless relaxed. They are invalidated.
    pub fn unsafe_call(&mut self) -> Res<()> {
        let me = std::thread::current().id();
        let violated: Vec<u64> = self
            .captures
            .iter()
            .filter(|(_, c)| {
                let global = c.mode == 0;
                let thread_local = c.mode == 1 && c.thread == me;
                !c.invalid && (global || thread_local)
            })
            .map(|(&id, _)| id)
            .collect();
        if violated.is_empty() {
            return Ok(());
        }
        for id in violated {
            self.invalidate(Some(id));
        }
        Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    }

    pub fn invalidate(&mut self, capture: Option<u64>) {
        if let Some(c) = capture.and_then(|id| self.captures.get_mut(&id)) {
            c.invalid = true;
        }
    }

    /// Adds a node to `stream`'s capture, after the stream's last nodes.
    pub fn capture_node(&mut self, capture: u64, stream: u64, work: Work) -> Res<()> {
        let c = self
            .captures
            .get_mut(&capture)
            .expect("a stream's capture is live");
        if c.invalid {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        let deps = c.tails.get(&stream).cloned().unwrap_or_default();
        c.nodes.push(Node { deps, work });
        let at = c.nodes.len() - 1;
        c.tails.insert(stream, vec![at]);
        Ok(())
    }

    /// The capture `stream` takes part in, if any.
    pub fn capturing(&self, stream: u64) -> Option<u64> {
        self.streams.get(&stream).and_then(|s| s.capture)
    }
}

fn allocation_layout(size: usize) -> Res<std::alloc::Layout> {
    std::alloc::Layout::from_size_align(size.max(1), 256)
        .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

pub(crate) fn current_dev() -> Option<usize> {
    STACK.with(|s| s.borrow().last().copied())
}

pub(crate) fn with_stack<T>(f: impl FnOnce(&mut Vec<usize>) -> T) -> T {
    STACK.with(|s| f(&mut s.borrow_mut()))
}
