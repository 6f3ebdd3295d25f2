//! What the engine calls as calls are made and launched: the API events
//! of each call and of its group (v5 on), and the group, collective and
//! point-to-point events of each launch.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rccl_algorithms::CollKind;

use super::abi::{
    CollApiV5, GroupApiV5, Handle, P2pApiV5, BELOW_TASK, COLL, COLL_API, COLL_API_MASK, GROUP,
    GROUP_API, GROUP_API_MASK, GROUP_END_API_START, GROUP_START_API_STOP, P2P, P2P_API,
    P2P_API_MASK, PROXY_EVENTS,
};
use super::describe::{datatype, func, p2p_func, Call, Coll, P2p, Task};
use super::proxy::ProxyEvents;
use super::{CProfiler, Profiler};
use crate::tuning::Choice;
use crate::types::{OpArgs, OpKind};

/// A call's API event of a profiler plug-in (v5 on), already stopped as
/// NCCL stops it once the call is queued: its handle is the `parentObj`
/// of the call's collective or point-to-point event, null without one.
#[derive(Clone, Copy)]
pub(crate) struct ApiEvent(*mut c_void);

impl ApiEvent {
    pub fn new(handle: *mut c_void) -> Self {
        ApiEvent(handle)
    }

    pub fn handle(self) -> *mut c_void {
        self.0
    }
}

impl Default for ApiEvent {
    fn default() -> Self {
        ApiEvent(std::ptr::null_mut())
    }
}

// SAFETY: the handle is only passed back to the plug-in as a parent.
unsafe impl Send for ApiEvent {}

thread_local! {
    /// This thread's open group API event (v5 on) and its plug-in: from
    /// the first call of the outermost group (or of a call outside any)
    /// to the end of that group.
    static GROUP_API_EVENT: Cell<Option<(Handle, &'static Profiler)>> = const { Cell::new(None) };
}

/// The end of this thread's outermost group (or of a call outside any):
/// the group API event's end state is recorded when it begins, and the
/// event stops when it is dropped, after the group's launch.
pub(crate) struct GroupApiEnd(Option<(Handle, &'static Profiler)>);

impl GroupApiEnd {
    pub(crate) fn begin() -> GroupApiEnd {
        let open = GROUP_API_EVENT.with(Cell::take);
        if let Some((handle, profiler)) = open {
            profiler.record(handle, GROUP_END_API_START, std::ptr::null_mut());
        }
        GroupApiEnd(open)
    }
}

impl Drop for GroupApiEnd {
    fn drop(&mut self) {
        if let Some((handle, profiler)) = self.0 {
            profiler.stop(handle);
        }
    }
}

impl CProfiler {
    /// The API events of `op`, a call made at group depth `depth` (v5 on,
    /// as the mask asks): the thread's group API event, started by the
    /// first call of a group, and the call's own, started and stopped here.
    pub(crate) fn api_call(&self, op: OpArgs, depth: usize) -> ApiEvent {
        let (session, profiler) = (&self.session, self.session.profiler);
        if profiler.library.version < 5 || self.mask & GROUP_API_MASK == 0 {
            return ApiEvent::default();
        }
        let group = GROUP_API_EVENT.with(|open| match open.get() {
            Some((handle, _)) => handle,
            None => {
                // NCCL counts the group every call opens inside its own.
                let api = GroupApiV5 {
                    graph_captured: false,
                    group_depth: depth as c_int + 1,
                };
                let handle = session.start(GROUP_API, std::ptr::null_mut(), api);
                if !handle.is_null() {
                    open.set(Some((handle, profiler)));
                    profiler.record(handle, GROUP_START_API_STOP, std::ptr::null_mut());
                }
                handle
            }
        });
        let dt = datatype(op.dtype).as_ptr();
        let handle = match op.kind {
            OpKind::Coll { kind, root, .. } if self.mask & COLL_API_MASK != 0 => {
                let api = CollApiV5 {
                    func: func(kind).0.as_ptr(),
                    count: op.count,
                    datatype: dt,
                    root: root as c_int,
                    stream: std::ptr::null_mut(),
                    graph_captured: false,
                };
                session.start(COLL_API, group, api)
            }
            OpKind::Send { .. } | OpKind::Recv { .. } if self.mask & P2P_API_MASK != 0 => {
                let api = P2pApiV5 {
                    func: p2p_func(matches!(op.kind, OpKind::Send { .. })).0.as_ptr(),
                    count: op.count,
                    datatype: dt,
                    stream: std::ptr::null_mut(),
                    graph_captured: false,
                };
                session.start(P2P_API, group, api)
            }
            _ => std::ptr::null_mut(),
        };
        profiler.stop(handle);
        ApiEvent::new(handle)
    }
}

/// The events of one communicator's share of a launch: its group event and
/// the events of its calls, stopped (calls first) when dropped.
#[derive(Default)]
pub(crate) struct LaunchEvents {
    /// The plug-in, once the launch has asked for events.
    profiler: Option<&'static Profiler>,
    group: Handle,
    tasks: Vec<Handle>,
    /// The proxy events of its collectives, by their sequence numbers:
    /// when they are on, its events stop once the proxy has sent what the
    /// launch published.
    proxy: Option<(Arc<ProxyEvents>, Vec<u32>)>,
}

// SAFETY: the handles are only passed back to the plug-in's `stopEvent`,
// which NCCL calls from whichever thread completes the work.
unsafe impl Send for LaunchEvents {}

impl LaunchEvents {
    /// Starts the group event of the launch, once, if the mask asks for it
    /// or for anything below it.
    fn group(&mut self, profiler: &CProfiler) -> Handle {
        if self.profiler.is_none() {
            self.profiler = Some(profiler.session.profiler);
            if profiler.mask & (GROUP | COLL | P2P | BELOW_TASK) != 0 {
                self.group = profiler.session.start_group();
            }
        }
        self.group
    }

    /// Starts the event of `call`, of type `bit`, with its API event `api`;
    /// its handle, or null.
    fn task(&mut self, profiler: &CProfiler, call: Call, bit: u64, api: ApiEvent) -> Handle {
        let group = self.group(profiler);
        if profiler.mask & (bit | BELOW_TASK) == 0 {
            return std::ptr::null_mut();
        }
        let task = Task {
            call,
            group,
            api: api.handle(),
        };
        let handle = profiler.session.start_task(&task, profiler.comm_hash);
        if !handle.is_null() {
            self.tasks.push(handle);
        }
        handle
    }

    /// Starts the event of collective `op` (with the tuner's `choice`),
    /// whose pieces carry `seq`, and, the first time, the group's.
    pub(crate) fn collective(
        &mut self,
        profiler: &CProfiler,
        op: OpArgs,
        api_event: ApiEvent,
        choice: &Choice,
        seq: u64,
    ) {
        let OpKind::Coll { kind, root, .. } = op.kind else {
            return;
        };
        let index = CollKind::ALL.iter().position(|&k| k == kind).unwrap_or(0);
        let seq_number = profiler.seq_numbers[index].fetch_add(1, Ordering::Relaxed);
        let call = Call::Coll(Coll {
            seq_number,
            kind,
            send: op.send.cast(),
            recv: op.recv.cast(),
            count: op.count,
            root: root as c_int,
            dtype: op.dtype,
            nchannels: choice.params.nchannels.min(u8::MAX as usize) as u8,
            algorithm: choice.algorithm.name(),
            protocol: choice.protocol,
        });
        let handle = self.task(profiler, call, COLL, api_event);
        if profiler.mask & PROXY_EVENTS != 0 && !handle.is_null() {
            let (events, calls) = self
                .proxy
                .get_or_insert_with(|| (profiler.proxy.clone(), Vec::new()));
            events.begin_call(seq as u32, handle);
            calls.push(seq as u32);
        }
    }

    /// Starts the events of a batch of sends and receives over `nchannels`
    /// channels and, the first time, the group's.
    pub(crate) fn p2p(
        &mut self,
        profiler: &CProfiler,
        ops: impl IntoIterator<Item = (OpArgs, ApiEvent)>,
        nchannels: usize,
    ) {
        for (op, api_event) in ops {
            let (send, buff, peer) = match op.kind {
                OpKind::Send { peer } => (true, op.send as *mut c_void, peer),
                OpKind::Recv { peer } => (false, op.recv.cast(), peer),
                OpKind::Coll { .. } => continue,
            };
            let call = Call::P2p(P2p {
                send,
                buff,
                dtype: op.dtype,
                count: op.count,
                peer: peer as c_int,
                nchannels: nchannels.min(u8::MAX as usize) as u8,
            });
            self.task(profiler, call, P2P, api_event);
        }
    }
}

impl Drop for LaunchEvents {
    fn drop(&mut self) {
        let Some(profiler) = self.profiler else {
            return;
        };
        // Handles this plug-in's startEvent gave, each stopped once, while
        // the communicator's context is alive (the launch holds the
        // communicator; its proxy events stop what is left when it goes).
        let handles = self.tasks.drain(..).chain(Some(self.group));
        match self.proxy.take() {
            Some((events, calls)) => events.end_launch(calls, handles.collect()),
            None => handles.for_each(|handle| profiler.stop(handle)),
        }
    }
}
