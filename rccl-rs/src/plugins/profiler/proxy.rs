//! The network proxy's events: the proxy operations and steps of the
//! collectives in progress on this rank, as the connections' observers
//! report the pieces they move.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Arc;

use parking_lot::Mutex;
use rccl_transports::{StepObserver, Tag};

use super::abi::{
    Handle, ProxyOpDescr, ProxyStateArgs, ProxyStepDescr, NET_PLUGIN, PROXY_EVENTS, PROXY_OP,
    PROXY_OP_IN_PROGRESS, PROXY_OP_RECV_DONE, PROXY_OP_RECV_POSTED, PROXY_OP_SEND_DONE,
    PROXY_OP_SEND_POSTED, PROXY_STEP, PROXY_STEP_RECV_GPU_WAIT, PROXY_STEP_SEND_WAIT,
};
use super::{CProfiler, Session};

/// A communicator's proxy events: the collectives in progress whose
/// pieces the network proxy reports, and their open proxy operations.
pub(super) struct ProxyEvents {
    pub session: Session,
    pub mask: u64,
    /// Held across every call into the plug-in for these events, so that
    /// the proxy thread and the thread that ends a call take turns.
    pub state: Mutex<ProxyState>,
}

// SAFETY: the context is only passed back to the plug-in, under `state`'s
// lock; NCCL calls a profiler from its proxy thread too.
unsafe impl Send for ProxyEvents {}
// SAFETY: as above.
unsafe impl Sync for ProxyEvents {}

#[derive(Default)]
pub(super) struct ProxyState {
    /// The communicator (and its plug-in context) is gone.
    closed: bool,
    /// By the sequence number its pieces' tags carry, each collective in
    /// progress with a collective event.
    calls: HashMap<u32, ProxyCall>,
    /// The number of the last step started, to name the next.
    last_step: usize,
}

/// A collective in progress: its event and its open proxy operations.
struct ProxyCall {
    parent: Handle,
    ops: Vec<ProxyOp>,
}

/// One proxy operation: the pieces of a call one connection moves one way.
struct ProxyOp {
    channel: u8,
    peer: c_int,
    send: bool,
    handle: Handle,
    /// Its steps so far, to number the next.
    steps: c_int,
    /// Its sends in flight: the step's number for `sent`, and its event.
    open_steps: Vec<(usize, Handle)>,
}

impl ProxyEvents {
    fn record(&self, handle: Handle, state: c_int, bytes: usize) {
        let mut args = ProxyStateArgs {
            trans_size: bytes,
            steps: 1,
            room: [0; 3],
        };
        let args = std::ptr::addr_of_mut!(args).cast();
        self.session.profiler.record(handle, state, args);
    }

    fn stop(&self, handle: Handle) {
        self.session.profiler.stop(handle);
    }

    /// Reports nothing more: the communicator (and its plug-in context)
    /// is gone.
    pub(super) fn close(&self) {
        self.state.lock().closed = true;
    }

    /// Starts the proxy events of collective `seq` (whose event is
    /// `parent`) from now until [`ProxyEvents::end_call`].
    pub(super) fn begin_call(&self, seq: u32, parent: Handle) {
        let mut state = self.state.lock();
        let call = ProxyCall {
            parent,
            ops: Vec::new(),
        };
        state.calls.insert(seq, call);
    }

    /// Stops the proxy operations of collective `seq`, their open steps
    /// first.
    pub(super) fn end_call(&self, seq: u32) {
        let mut state = self.state.lock();
        let Some(call) = state.calls.remove(&seq) else {
            return;
        };
        if state.closed {
            return;
        }
        for op in call.ops {
            for (_, step) in op.open_steps {
                self.stop(step);
            }
            if self.session.profiler.library.version < 4 {
                let done = if op.send {
                    PROXY_OP_SEND_DONE
                } else {
                    PROXY_OP_RECV_DONE
                };
                self.record(op.handle, done, 0);
            }
            self.stop(op.handle);
        }
    }

    /// Starts a step of `bytes` of call `tag` on `channel` to or from
    /// `peer`, in its proxy operation (started with its first step): a
    /// send's step stays open and its number comes back, a receive's is
    /// stopped at once; `None` when the call is not in progress here.
    fn start_step(
        &self,
        tag: Tag,
        channel: u8,
        peer: c_int,
        send: bool,
        bytes: usize,
    ) -> Option<usize> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        if state.closed {
            return None;
        }
        let call = state.calls.get_mut(&tag.seq)?;
        let index = match call
            .ops
            .iter()
            .position(|op| op.channel == channel && op.peer == peer && op.send == send)
        {
            Some(index) => index,
            None => {
                let descr = ProxyOpDescr {
                    // SAFETY: getpid has no preconditions.
                    pid: unsafe { libc::getpid() },
                    channel_id: channel,
                    peer,
                    n_steps: 0,
                    chunk_size: bytes as c_int,
                    is_send: send as c_int,
                };
                let handle = self.session.start(PROXY_OP, call.parent, descr);
                let state = match (self.session.profiler.library.version, send) {
                    (4.., _) => PROXY_OP_IN_PROGRESS,
                    (_, true) => PROXY_OP_SEND_POSTED,
                    (_, false) => PROXY_OP_RECV_POSTED,
                };
                self.record(handle, state, bytes);
                call.ops.push(ProxyOp {
                    channel,
                    peer,
                    send,
                    handle,
                    steps: 0,
                    open_steps: Vec::new(),
                });
                call.ops.len() - 1
            }
        };
        let op = &mut call.ops[index];
        op.steps += 1;
        if self.mask & (PROXY_STEP | NET_PLUGIN) == 0 || op.handle.is_null() {
            return None;
        }
        let step = ProxyStepDescr { step: op.steps - 1 };
        let handle = self.session.start(PROXY_STEP, op.handle, step);
        if handle.is_null() {
            return None;
        }
        state.last_step += 1;
        let id = state.last_step;
        if send {
            self.record(handle, PROXY_STEP_SEND_WAIT, bytes);
            op.open_steps.push((id, handle));
        } else {
            self.record(handle, PROXY_STEP_RECV_GPU_WAIT, bytes);
            self.stop(handle);
        }
        Some(id)
    }

    /// Stops send step `id` if its operation is still open.
    fn stop_send_step(&self, id: usize) {
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        for op in state
            .calls
            .values_mut()
            .flat_map(|call| call.ops.iter_mut())
        {
            if let Some(at) = op.open_steps.iter().position(|&(step, _)| step == id) {
                let (_, handle) = op.open_steps.swap_remove(at);
                self.stop(handle);
                return;
            }
        }
    }
}

/// What the network proxy reports of one connection: the channel and
/// peer of its proxy operations.
struct ConnectionSteps {
    events: Arc<ProxyEvents>,
    channel: u8,
    peer: c_int,
}

impl StepObserver for ConnectionSteps {
    fn send_posted(&self, tag: Tag, bytes: usize) -> usize {
        self.events
            .start_step(tag, self.channel, self.peer, true, bytes)
            .unwrap_or(0)
    }

    fn sent(&self, step: usize) {
        if step != 0 {
            self.events.stop_send_step(step);
        }
    }

    fn received(&self, tag: Tag, bytes: usize) {
        self.events
            .start_step(tag, self.channel, self.peer, false, bytes);
    }
}

impl CProfiler {
    /// The observer of a network connection on `channel` to `peer`, when
    /// the mask asks for proxy events.
    pub(crate) fn step_observer(
        &self,
        channel: usize,
        peer: usize,
    ) -> Option<Arc<dyn StepObserver>> {
        (self.mask & PROXY_EVENTS != 0).then(|| {
            Arc::new(ConnectionSteps {
                events: self.proxy.clone(),
                channel: channel.min(u8::MAX as usize) as u8,
                peer: peer as c_int,
            }) as Arc<dyn StepObserver>
        })
    }
}
