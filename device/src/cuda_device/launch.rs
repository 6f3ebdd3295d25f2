//! Device work on CUDA: a launch's pinned memory (status words, each
//! round's table of grid blocks, the work blocks), one interpreter kernel
//! per round, the host function that reports the channels' ends, and the
//! ownership of that state by a CUDA graph when the launch is captured.

use super::*;

/// A launch's report of how each run ended (the engine's `done`).
pub(super) type Done = Box<dyn FnMut(std::result::Result<(), WorkFailure>) + Send>;

/// What a launch keeps until it can run no more: after its run, or, when
/// captured in a CUDA graph, until the graph and every executable graph
/// made from it are gone (the graph's user object owns it then).
pub(super) struct LaunchState {
    /// The status words (one per channel, first), each round's table of
    /// grid blocks and the work blocks.
    pub(super) pinned: Option<Pinned>,
    pub(super) channels: usize,
    /// (round, block, channel) of each status word.
    pub(super) channel_of: Vec<(usize, usize, usize)>,
    pub(super) timeout: Duration,
    pub(super) done: Mutex<Option<Done>>,
    pub(super) spare: Arc<Mutex<Vec<Pinned>>>,
    /// The watcher's list and this launch's id in it: followed (its abort
    /// words set when it must stop) as long as it can run.
    pub(super) watch: (WatchList, u64),
}

impl LaunchState {
    /// How the last run ended, from the status words its kernels wrote.
    fn ended(&self) -> std::result::Result<(), WorkFailure> {
        let pinned = self.pinned.as_ref().expect("held until dropped");
        // SAFETY: every kernel of the run wrote its words before the host
        // function that calls this runs (stream order); `channels` words
        // lie at the start of the pinned memory.
        let ends = unsafe { std::slice::from_raw_parts(pinned.ptr.cast::<i32>(), self.channels) };
        let Some(c) = ends.iter().position(|&e| e != 0) else {
            return Ok(());
        };
        Err(WorkFailure {
            error: Error::System(format!(
                "device work did not finish: channel {c} of the launch ended with {} (1 aborted, \
                 2 still waiting {:?} after it started, 3 too large: a step of too many \
                 primitives or a channel of too many peers)",
                ends[c], self.timeout
            )),
            timed_out: ends.contains(&2),
            unfinished: ends
                .iter()
                .zip(&self.channel_of)
                .filter(|(&end, _)| end != 0)
                .map(|(_, &at)| at)
                .collect(),
        })
    }

    /// Reports a run: the only one of an ordinary launch (`done` goes
    /// with it), or one replay of a captured launch.
    fn report(&self, last: bool) {
        let result = self.ended();
        let mut done = self.done.lock();
        if last {
            let taken = done.take();
            drop(done);
            unwatch(&self.watch.0, self.watch.1);
            if let Some(mut done) = taken {
                done(result);
            }
        } else if let Some(done) = done.as_mut() {
            done(result);
        }
    }

    /// Reports the launch failed without running to the end (its context
    /// faulted, so its host function never runs).
    pub(super) fn fail(&self, error: Error) {
        unwatch(&self.watch.0, self.watch.1);
        let taken = self.done.lock().take();
        if let Some(mut done) = taken {
            done(Err(error.into()));
        }
    }
}

impl Drop for LaunchState {
    fn drop(&mut self) {
        unwatch(&self.watch.0, self.watch.1);
        if let Some(pinned) = self.pinned.take() {
            self.spare.lock().push(pinned);
        }
    }
}

/// Runs `body` as a host function's (or user object destructor's) body:
/// memory freed meanwhile is freed later, since it may not call CUDA.
pub(super) fn as_host_function(body: impl FnOnce()) {
    IN_HOST_FUNCTION.with(|f| f.set(true));
    body();
    IN_HOST_FUNCTION.with(|f| f.set(false));
}

/// The host function after an ordinary launch: reports its run and drops
/// the reference `Arc::into_raw` gave it.
pub(super) unsafe extern "C" fn launch_ran(arg: *mut c_void) {
    // SAFETY: the reference `launch_work` leaked for this call, which
    // the driver makes once.
    let state = unsafe { Arc::from_raw(arg.cast_const().cast::<LaunchState>()) };
    as_host_function(|| {
        state.report(true);
        drop(state);
    });
}

/// The host node of a captured launch: reports each replay; the graph's
/// user object owns the argument.
pub(super) unsafe extern "C" fn launch_replayed(arg: *mut c_void) {
    // SAFETY: the user object keeps the state until the graph and its
    // executables are gone, after their last replay.
    let state = unsafe { &*arg.cast_const().cast::<LaunchState>() };
    as_host_function(|| state.report(false));
}

/// The user object's destructor of a captured launch.
pub(super) unsafe extern "C" fn launch_released(arg: *mut c_void) {
    // SAFETY: the reference `launch_work` gave the user object, released
    // once by the driver.
    let state = unsafe { Arc::from_raw(arg.cast_const().cast::<LaunchState>()) };
    as_host_function(|| drop(state));
}

/// An event recorded on `stream` now, for the fault watcher, which
/// destroys it. The stream's context is current.
pub(super) fn fault_event(stream: CUstream) -> Result<CUevent> {
    let mut event = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    call("cuEventCreate", unsafe {
        api::cuEventCreate(
            &mut event,
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    })?;
    // SAFETY: a fresh event on a live stream.
    let recorded = call("cuEventRecord", unsafe {
        api::cuEventRecord(event, stream)
    });
    if recorded.is_err() {
        // SAFETY: the event, unrecorded, goes now.
        unsafe { api::cuEventDestroy_v2(event) };
    }
    recorded.map(|()| event)
}

/// The graph `stream` captures into, if it is capturing; an invalidated
/// capture is refused (the calls after its error fail). The stream's
/// context is current.
pub(super) fn capture_graph(stream: CUstream) -> Result<Option<sys::CUgraph>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream, valid out-pointers; the optional ones unused.
    call("cuStreamGetCaptureInfo", unsafe {
        api::cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })?;
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(None),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(Some(graph)),
        _ => Err(Error::System(
            "the stream's CUDA graph capture was invalidated".into(),
        )),
    }
}

/// Makes the captured launch's state the graph's: a user object owns it,
/// kept by the graph and by every executable graph made from it until
/// they are gone, and a host node reports each replay with it. The
/// stream's context is current.
pub(super) fn own_in_graph(
    graph: sys::CUgraph,
    first: CUstream,
    state: Arc<LaunchState>,
) -> Result<()> {
    let arg = Arc::into_raw(state).cast_mut().cast::<c_void>();
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    // SAFETY: the destructor takes back the reference it is given, once.
    let made =
        unsafe { api::cuUserObjectCreate(&mut object, arg, Some(launch_released), 1, flags) };
    if made != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the driver did not take the reference.
        drop(unsafe { Arc::from_raw(arg.cast_const().cast::<LaunchState>()) });
        return call("cuUserObjectCreate", made);
    }
    let moved = sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: a live graph under capture and the object just made, whose
    // one reference moves to the graph.
    let retained = unsafe { api::cuGraphRetainUserObject(graph, object, 1, moved) };
    if retained != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the caller's reference; the destructor frees the state.
        unsafe { api::cuUserObjectRelease(object, 1) };
        return call("cuGraphRetainUserObject", retained);
    }
    // SAFETY: the graph keeps `arg` alive for every run of this node.
    call("cuLaunchHostFunc", unsafe {
        api::cuLaunchHostFunc(first, Some(launch_replayed), arg)
    })
}

/// The grid of a round of device work: its blocks (a channel of one
/// rank's work each), their threads, and the most peers of a channel (the
/// FIFO ends each block keeps in shared memory).
fn grid_of(round: &[Arc<crate::work::Work>]) -> (usize, u32, usize) {
    let blocks = round.iter().map(|w| w.nchannels()).sum();
    let protocol = round.iter().find_map(|w| w.protocol());
    let peers = round
        .iter()
        .map(|w| w.max_channel_peers())
        .max()
        .unwrap_or(0);
    (blocks, work_threads(protocol), peers)
}

impl CudaDevice {
    /// [`Device::launch_work`]: each round one kernel over every channel of
    /// every rank's work, on the caller's stream.
    pub(super) fn launch_rounds(
        &self,
        streams: &[Arc<dyn Stream>],
        launch: WorkLaunch,
    ) -> Result<()> {
        let _current = self.enter()?;
        let kernels = &self.kernels;
        let first = join(streams)?;
        let graph = capture_graph(first)?;
        let WorkLaunch {
            rounds,
            timeout,
            done,
            stop,
        } = launch;
        // A timeout past the global timer's range is none.
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // The status words, then each round's table of grid blocks, then
        // each work block, each part at a 16-byte aligned offset.
        let channels: usize = rounds.iter().flatten().map(|w| w.nchannels()).sum();
        let words_bytes = (channels * 4).next_multiple_of(16);
        let tables_bytes: usize = rounds
            .iter()
            .map(|round| {
                let blocks: usize = round.iter().map(|w| w.nchannels()).sum();
                (blocks * size_of::<WorkBlock>()).next_multiple_of(16)
            })
            .sum();
        let total = words_bytes
            + tables_bytes
            + rounds
                .iter()
                .flatten()
                .map(|w| w.bytes().len().next_multiple_of(16))
                .sum::<usize>();
        // A round's blocks wait for each other through their FIFOs: a grid
        // that cannot be resident at once is refused before any round is
        // launched.
        for round in &rounds {
            let (nblocks, threads, peers) = grid_of(round);
            if nblocks > 0 {
                kernels
                    .check_work_resident(nblocks as u32, threads, peers)
                    .map_err(err)?;
            }
        }
        let pinned = self.pinned(total)?;
        let id = match self.follow(stop, self.abort_words_of(&rounds)) {
            Ok(id) => id,
            Err(e) => {
                self.spare_pinned.lock().push(pinned);
                return Err(e);
            }
        };
        let mut state = LaunchState {
            pinned: Some(pinned),
            channels,
            channel_of: Vec::with_capacity(channels),
            timeout,
            done: Mutex::new(Some(done)),
            spare: self.spare_pinned.clone(),
            watch: (self.watched.clone(), id),
        };
        let base = state.pinned.as_ref().expect("just set").ptr;
        let mut table_at = words_bytes;
        let mut work_at = words_bytes + tables_bytes;
        let mut word = 0usize;
        // Per round: its table's address, its grid blocks, and what its
        // blocks need (threads, FIFO ends of shared memory).
        let mut launches = Vec::with_capacity(rounds.len());
        for (index, round) in rounds.iter().enumerate() {
            let table = table_at;
            let mut nblocks = 0usize;
            for (block, work) in round.iter().enumerate() {
                state
                    .channel_of
                    .extend((0..work.nchannels()).map(|c| (index, block, c)));
                let bytes = work.bytes();
                // SAFETY: the pinned memory holds `total` bytes, laid out
                // above; no kernel of this launch runs yet.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(work_at), bytes.len())
                };
                for channel in 0..work.nchannels() {
                    let entry = WorkBlock {
                        // SAFETY: within the pinned memory (mapped: the
                        // device sees it at the host's addresses).
                        work: unsafe { base.add(work_at) }.cast::<WorkHeader>(),
                        // SAFETY: as above, one of the `channels` words.
                        status: unsafe { base.add(4 * word) }.cast::<i32>(),
                        channel: channel as u32,
                        pad: 0,
                    };
                    // SAFETY: entry `nblocks` of the round's table, inside
                    // the memory and 8-byte aligned.
                    unsafe {
                        base.add(table_at)
                            .cast::<WorkBlock>()
                            .add(nblocks)
                            .write(entry)
                    };
                    nblocks += 1;
                    word += 1;
                }
                work_at += bytes.len().next_multiple_of(16);
            }
            table_at += (nblocks * size_of::<WorkBlock>()).next_multiple_of(16);
            let (_, threads, peers) = grid_of(round);
            launches.push((table, nblocks, threads, peers));
        }
        let state = Arc::new(state);
        // A round without channels has nothing for a block to run.
        for &(table, nblocks, threads, peers) in launches.iter().filter(|l| l.1 > 0) {
            // Every block of the round (each rank's channels) in one grid:
            // a block waits for its peers' blocks through their FIFOs, so
            // they must all be resident at once.
            // SAFETY: the table and the blocks lie in mapped pinned memory
            // the launch state keeps while the launch can run; the work's
            // addresses are device memory the engine keeps until `done` is
            // dropped; the status words are `channels` words of the same
            // memory.
            unsafe {
                kernels.run_work(
                    base.add(table) as u64,
                    nblocks as u32,
                    threads,
                    peers,
                    timeout_ns,
                    first,
                )
            }
            .map_err(err)?;
        }
        match graph {
            None => {
                let arg = Arc::into_raw(state.clone());
                // SAFETY: the function takes back the reference it is
                // given, once.
                let r = unsafe {
                    api::cuLaunchHostFunc(first, Some(launch_ran), arg.cast_mut().cast())
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    // SAFETY: the driver did not take the reference.
                    drop(unsafe { Arc::from_raw(arg) });
                }
                call("cuLaunchHostFunc", r)?;
                let watched = fault_event(first);
                match watched {
                    Ok(event) => self.faults.watch(self.context, event, &state),
                    // The context failed since the host function was
                    // enqueued, which may never run.
                    Err(e) => {
                        state.fail(e.clone());
                        return Err(e);
                    }
                }
            }
            Some(graph) => own_in_graph(graph, first, state)?,
        }
        fork(first, streams)
    }
}
