//! Streams and events of the device's context, the ordering between the
//! ranks' streams, and host work enqueued on them (host functions, joint
//! tasks run on threads of their own).

use super::*;

/// `later` waits for everything enqueued on `earlier` so far. The
/// streams' context is current.
pub(super) fn order(earlier: CUstream, later: CUstream) -> Result<()> {
    // Work outside a capture is waited for on each launch of the graph
    // that `later` captures.
    let wait = if capture_graph(later)?.is_some() && capture_graph(earlier)?.is_none() {
        sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32
    } else {
        0
    };
    let mut event = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    call("cuEventCreate", unsafe {
        api::cuEventCreate(
            &mut event,
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    })?;
    // SAFETY: live streams of the current context and a fresh event,
    // destroyed once both calls are enqueued (CUDA releases it when done).
    unsafe {
        let ordered = call("cuEventRecord", api::cuEventRecord(event, earlier)).and_then(|()| {
            call(
                "cuStreamWaitEvent",
                api::cuStreamWaitEvent(later, event, wait),
            )
        });
        api::cuEventDestroy_v2(event);
        ordered
    }
}

/// The raw stream of a backend stream.
pub(super) fn raw_of(stream: &dyn Stream) -> Result<CUstream> {
    stream
        .as_any()
        .downcast_ref::<CudaStream>()
        .map(|s| s.raw as CUstream)
        .ok_or_else(|| Error::InvalidArgument("not a stream of the CUDA backend".into()))
}

/// Joins `streams` into the first: work enqueued on it next runs after
/// everything enqueued so far on all of them.
pub(super) fn join(streams: &[Arc<dyn Stream>]) -> Result<CUstream> {
    let first = raw_of(
        streams
            .first()
            .ok_or_else(|| Error::InvalidArgument("device work needs a stream".into()))?
            .as_ref(),
    )?;
    for other in &streams[1..] {
        let other = raw_of(other.as_ref())?;
        if other != first {
            order(other, first)?;
        }
    }
    Ok(first)
}

/// The other streams wait for what was enqueued on the first.
pub(super) fn fork(first: CUstream, streams: &[Arc<dyn Stream>]) -> Result<()> {
    for other in &streams[1..] {
        let other = raw_of(other.as_ref())?;
        if other != first {
            order(first, other)?;
        }
    }
    Ok(())
}

pub(super) unsafe extern "C" fn run_host_work(arg: *mut c_void) {
    // SAFETY: `arg` is the box `enqueue_host` leaked for this call, run
    // once by the driver.
    let work = unsafe { Box::from_raw(arg.cast::<Work>()) };
    IN_HOST_FUNCTION.with(|f| f.set(true));
    work();
    IN_HOST_FUNCTION.with(|f| f.set(false));
}

/// Runs `work` on the host in `stream`'s order (`cuLaunchHostFunc`). The
/// stream's context is current.
pub(super) fn enqueue_host(stream: CUstream, work: Work) -> Result<()> {
    let arg = Box::into_raw(Box::new(work));
    // SAFETY: the function takes back the box it is given, once.
    let r = unsafe { api::cuLaunchHostFunc(stream, Some(run_host_work), arg.cast()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the driver did not take the box.
        drop(unsafe { Box::from_raw(arg) });
    }
    call("cuLaunchHostFunc", r)
}

/// A task of [`Device::enqueue_joint`]: run on a thread of its own, then
/// the mapped word its stream waits for is set (also when the task is
/// dropped unrun, so that the stream goes on; the task reports why).
pub(super) struct JointTask {
    pub(super) work: Option<Work>,
    pub(super) flag: usize,
}

impl JointTask {
    fn run(mut self) {
        if let Some(work) = self.work.take() {
            work();
        }
    }
}

impl Drop for JointTask {
    fn drop(&mut self) {
        // SAFETY: the pinned word the stream waits for, kept until the
        // wait passed (which this store allows).
        unsafe { AtomicU32::from_ptr(self.flag as *mut u32) }.store(1, Ordering::Release);
    }
}

/// The host function of a joint task: starts its thread and returns.
pub(super) unsafe extern "C" fn start_joint_task(arg: *mut c_void) {
    // SAFETY: the box `enqueue_joint` leaked for this call, run once.
    let task = unsafe { Box::from_raw(arg.cast::<JointTask>()) };
    // A thread that cannot start drops the task unrun, which sets the
    // word (the work, dropped, reports that it never ran).
    let _ = std::thread::Builder::new()
        .name("rccl-staged-task".into())
        .spawn(move || task.run());
}

/// A stream: the caller's `cudaStream_t`, or one this backend created, of
/// the device's context.
pub struct CudaStream {
    pub(super) raw: usize,
    pub(super) context: usize,
}

impl CudaStream {
    fn enter(&self) -> Result<Current> {
        Current::enter(self.context as CUcontext)
    }
}

impl Stream for CudaStream {
    fn raw(&self) -> usize {
        self.raw
    }

    fn enqueue(&self, work: Work) -> Result<()> {
        let _current = self.enter()?;
        let stream = self.raw as CUstream;
        if capture_graph(stream)?.is_some() {
            // A replay would run the work again, after it was consumed.
            return Err(Error::InvalidArgument(
                "host work cannot be captured in a CUDA graph".into(),
            ));
        }
        enqueue_host(stream, work)
    }

    unsafe fn copy_async(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: the caller's contract.
        call("cuMemcpyAsync", unsafe {
            api::cuMemcpyAsync(dst as u64, src as u64, bytes, self.raw as CUstream)
        })
    }

    fn record(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        let _current = self.enter()?;
        // SAFETY: a live event and stream.
        call("cuEventRecord", unsafe {
            api::cuEventRecord(event, self.raw as CUstream)
        })
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let event = own_event(event)?;
        let _current = self.enter()?;
        let stream = self.raw as CUstream;
        // In a capture, the event (of work outside it) is waited for on
        // each launch of the graph.
        let flags = if capture_graph(stream)?.is_some() {
            sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32
        } else {
            0
        };
        // SAFETY: a live event and stream.
        call("cuStreamWaitEvent", unsafe {
            api::cuStreamWaitEvent(stream, event, flags)
        })
    }

    fn capturing(&self) -> Result<bool> {
        let _current = self.enter()?;
        capture_graph(self.raw as CUstream).map(|graph| graph.is_some())
    }

    fn synchronize(&self, deadline: Instant) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: a live stream.
        poll(deadline, || unsafe {
            api::cuStreamQuery(self.raw as CUstream)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Polls `query` until it stops answering "not ready" or `deadline`.
pub(super) fn poll(deadline: Instant, query: impl Fn() -> sys::CUresult) -> Result<()> {
    loop {
        match query() {
            sys::CUresult::CUDA_ERROR_NOT_READY if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(50))
            }
            sys::CUresult::CUDA_ERROR_NOT_READY => {
                return Err(Error::System("waited past the deadline".into()))
            }
            other => return call("cuStreamQuery/cuEventQuery", other),
        }
    }
}

/// An event of the CUDA backend, of the device's context.
pub struct CudaEvent {
    pub(super) raw: usize,
    pub(super) context: usize,
}

pub(super) fn own_event(event: &dyn Event) -> Result<CUevent> {
    event
        .as_any()
        .downcast_ref::<CudaEvent>()
        .map(|e| e.raw as CUevent)
        .ok_or_else(|| Error::InvalidArgument("not an event of the CUDA backend".into()))
}

impl Event for CudaEvent {
    fn query(&self) -> bool {
        // A failure to ask counts as done: `synchronize` reports it.
        let Ok(_current) = Current::enter(self.context as CUcontext) else {
            return true;
        };
        // SAFETY: a live event.
        let answer = unsafe { api::cuEventQuery(self.raw as CUevent) };
        answer != sys::CUresult::CUDA_ERROR_NOT_READY
    }

    fn synchronize(&self, deadline: Instant) -> Result<()> {
        let _current = Current::enter(self.context as CUcontext)?;
        // SAFETY: a live event.
        poll(deadline, || unsafe {
            api::cuEventQuery(self.raw as CUevent)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // A host function may not call CUDA: there the event is left to
        // the process (dropped there only when its last user was).
        if IN_HOST_FUNCTION.with(|f| f.get()) {
            return;
        }
        let _current = Current::enter(self.context as CUcontext);
        // SAFETY: the event is not used after this; CUDA releases it once
        // any pending record completes.
        unsafe { api::cuEventDestroy_v2(self.raw as CUevent) };
    }
}
