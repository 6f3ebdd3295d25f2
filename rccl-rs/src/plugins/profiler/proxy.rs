//! The network proxy's events: the proxy operations and steps of the
//! collectives in progress on this rank, as the connections' observers
//! report the pieces they move. A piece that arrives before its call has
//! begun here waits for it; a launch's events stop once the proxy has
//! completed the sends the launch published, so that sends it posts after
//! the calls ended on this rank are reported too.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::sync::Arc;

use parking_lot::Mutex;
use rccl_transports::{Fifo, StepObserver, Tag};

use super::abi::{
    Handle, ProxyOpDescr, ProxyStateArgs, ProxyStepDescr, NET_PLUGIN, PROXY_EVENTS, PROXY_OP,
    PROXY_OP_IN_PROGRESS, PROXY_OP_RECV_DONE, PROXY_OP_RECV_POSTED, PROXY_OP_SEND_DONE,
    PROXY_OP_SEND_POSTED, PROXY_STEP, PROXY_STEP_RECV_GPU_WAIT, PROXY_STEP_SEND_WAIT,
};
use super::{CProfiler, Session};
use crate::agreement::call::P2P_CALL;

/// The most received pieces kept for calls not begun here yet; past it the
/// oldest go unreported.
const MAX_EARLY_PIECES: usize = 4096;

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
    /// By the sequence number its pieces' tags carry, each collective with
    /// a collective event, from its start until its launch's events stop.
    calls: HashMap<u32, ProxyCall>,
    /// The number of the last step started, to name the next.
    last_step: usize,
    /// The sequence number of the last call begun here.
    newest: Option<u32>,
    /// Received pieces of calls not begun here yet, oldest first.
    early: VecDeque<MovedPiece>,
    /// The send FIFO of each observed connection.
    sends: Vec<SendSide>,
    /// Launches whose calls have ended here, oldest first, each waiting
    /// for the sends it published.
    ending: VecDeque<EndingLaunch>,
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

/// A piece the proxy moved: its call, connection, direction and size.
#[derive(Clone, Copy)]
struct MovedPiece {
    seq: u32,
    channel: u8,
    peer: c_int,
    send: bool,
    bytes: usize,
}

/// A connection's send FIFO and how many of its pieces the proxy has sent.
struct SendSide {
    fifo: Fifo,
    sent: u32,
}

impl SendSide {
    /// Whether the proxy has sent the first `published` pieces, or never
    /// will (the connection failed).
    fn sent_all(&self, published: u32) -> bool {
        self.fifo.failed() || self.sent.wrapping_sub(published) as i32 >= 0
    }
}

/// The events of a launch whose calls ended on this rank.
struct EndingLaunch {
    /// Per connection, the pieces published when the calls ended.
    published: Vec<u32>,
    /// The sequence numbers of its collectives with proxy events.
    calls: Vec<u32>,
    /// Its calls' events, then its group event.
    handles: Vec<Handle>,
}

/// Whether call `seq` comes after call `newest` (sequence numbers wrap).
fn after(seq: u32, newest: Option<u32>) -> bool {
    match newest {
        Some(newest) => seq.wrapping_sub(newest) as i32 > 0,
        None => true,
    }
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

    /// Stops every launch's events still waiting for the proxy, then
    /// reports nothing more: the communicator (and its plug-in context)
    /// is going.
    pub(super) fn close(&self) {
        let mut state = self.state.lock();
        while let Some(launch) = state.ending.pop_front() {
            self.stop_launch(&mut state, launch);
        }
        state.closed = true;
    }

    /// Starts the proxy events of collective `seq` (whose event is
    /// `parent`), with those of the pieces that arrived before it.
    pub(super) fn begin_call(&self, seq: u32, parent: Handle) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let call = ProxyCall {
            parent,
            ops: Vec::new(),
        };
        state.calls.insert(seq, call);
        state.newest = Some(seq);
        // Pieces of earlier calls without an event go.
        let (now, later): (Vec<MovedPiece>, Vec<MovedPiece>) = std::mem::take(&mut state.early)
            .into_iter()
            .filter(|piece| piece.seq == seq || after(piece.seq, state.newest))
            .partition(|piece| piece.seq == seq);
        state.early = later.into();
        if state.closed {
            return;
        }
        for piece in now {
            self.step(state, piece);
        }
    }

    /// Hands over the events of a launch whose calls have ended here: its
    /// collectives `calls` (whose proxy operations stop first) and
    /// `handles`, its calls' events then its group event; they stop once
    /// the proxy has sent every piece published by now.
    pub(super) fn end_launch(&self, calls: Vec<u32>, handles: Vec<Handle>) {
        let mut state = self.state.lock();
        let published = state
            .sends
            .iter()
            .map(|side| side.fifo.published())
            .collect();
        state.ending.push_back(EndingLaunch {
            published,
            calls,
            handles,
        });
        self.stop_sent_launches(&mut state);
    }

    /// Stops, oldest first, the events of the launches whose sends have
    /// all been sent.
    fn stop_sent_launches(&self, state: &mut ProxyState) {
        while let Some(launch) = state.ending.front() {
            let sent = (state.sends.iter().zip(&launch.published))
                .all(|(side, &published)| side.sent_all(published));
            if !sent {
                return;
            }
            if let Some(launch) = state.ending.pop_front() {
                self.stop_launch(state, launch);
            }
        }
    }

    /// Stops the proxy operations of a launch's collectives, their open
    /// steps first, then the launch's events.
    fn stop_launch(&self, state: &mut ProxyState, launch: EndingLaunch) {
        for seq in launch.calls {
            let Some(call) = state.calls.remove(&seq) else {
                continue;
            };
            if state.closed {
                continue;
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
        if !state.closed {
            for handle in launch.handles {
                self.stop(handle);
            }
        }
    }

    /// Starts a step of `piece` in its proxy operation (started with its
    /// first step): a send's step stays open and its number comes back, a
    /// receive's is stopped at once; `None` when its call has no events
    /// here.
    fn step(&self, state: &mut ProxyState, piece: MovedPiece) -> Option<usize> {
        let MovedPiece {
            seq,
            channel,
            peer,
            send,
            bytes,
        } = piece;
        let call = state.calls.get_mut(&seq)?;
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

    /// Reports a send posted; the number of its step, 0 for none.
    fn send_posted(&self, piece: MovedPiece) -> usize {
        let mut state = self.state.lock();
        if state.closed {
            return 0;
        }
        self.step(&mut state, piece).unwrap_or(0)
    }

    /// Reports a piece received: at once when its call has begun here,
    /// when it begins if it has not yet.
    fn received(&self, piece: MovedPiece, call: u32) {
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        if call != P2P_CALL
            && !state.calls.contains_key(&piece.seq)
            && after(piece.seq, state.newest)
        {
            if state.early.len() == MAX_EARLY_PIECES {
                state.early.pop_front();
            }
            state.early.push_back(piece);
            return;
        }
        self.step(&mut state, piece);
    }

    /// Counts a send of connection `side` sent and stops its step (0: none)
    /// if its operation is still open; then stops the launches whose sends
    /// are all sent.
    fn sent(&self, side: usize, step: usize) {
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        if let Some(side) = state.sends.get_mut(side) {
            side.sent = side.sent.wrapping_add(1);
        }
        // Step numbers start at 1.
        let open = state
            .calls
            .values_mut()
            .flat_map(|call| call.ops.iter_mut())
            .find_map(|op| {
                let at = op.open_steps.iter().position(|&(id, _)| id == step)?;
                Some(op.open_steps.swap_remove(at).1)
            });
        if let Some(handle) = open {
            self.stop(handle);
        }
        self.stop_sent_launches(&mut state);
    }

    /// Watches the send FIFO `fifo` of a new connection; its index.
    fn watch(&self, fifo: &Fifo) -> usize {
        let mut state = self.state.lock();
        state.sends.push(SendSide {
            fifo: fifo.clone(),
            sent: fifo.published(),
        });
        state.sends.len() - 1
    }
}

/// What the network proxy reports of one connection: the channel and
/// peer of its proxy operations, and its send FIFO's index among the
/// watched.
struct ConnectionSteps {
    events: Arc<ProxyEvents>,
    channel: u8,
    peer: c_int,
    side: usize,
}

impl ConnectionSteps {
    fn piece(&self, tag: Tag, send: bool, bytes: usize) -> MovedPiece {
        MovedPiece {
            seq: tag.seq,
            channel: self.channel,
            peer: self.peer,
            send,
            bytes,
        }
    }
}

impl StepObserver for ConnectionSteps {
    fn send_posted(&self, tag: Tag, bytes: usize) -> usize {
        self.events.send_posted(self.piece(tag, true, bytes))
    }

    fn sent(&self, step: usize) {
        self.events.sent(self.side, step);
    }

    fn received(&self, tag: Tag, bytes: usize) {
        self.events
            .received(self.piece(tag, false, bytes), tag.call);
    }
}

impl CProfiler {
    /// The observer of a network connection on `channel` to `peer` whose
    /// proxy drains `send_fifo`, when the mask asks for proxy events.
    pub(crate) fn step_observer(
        &self,
        channel: usize,
        peer: usize,
        send_fifo: &Fifo,
    ) -> Option<Arc<dyn StepObserver>> {
        (self.mask & PROXY_EVENTS != 0).then(|| {
            Arc::new(ConnectionSteps {
                events: self.proxy.clone(),
                channel: channel.min(u8::MAX as usize) as u8,
                peer: peer as c_int,
                side: self.proxy.watch(send_fifo),
            }) as Arc<dyn StepObserver>
        })
    }
}
