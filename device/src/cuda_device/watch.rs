//! The watchers of launches in flight: the one that sets the abort words of
//! launches whose communicator stops, and the one that finds launches of a
//! faulted context (whose host functions never run).

use super::*;

/// Ordinary launches in flight, each with an event recorded after its
/// host function. After a kernel fault (a sticky error) no host function
/// of the context runs: the fault watcher finds the error on the events
/// and reports those launches failed, so their communicators learn it.
#[derive(Default)]
pub(super) struct Faults {
    pub(super) pending: Mutex<Vec<(usize, std::sync::Weak<LaunchState>)>>,
    pub(super) wake: parking_lot::Condvar,
    pub(super) watching: OnceLock<()>,
}

/// How often the fault watcher queries the launches in flight.
pub(super) const FAULT_POLL: Duration = Duration::from_millis(5);

impl Faults {
    /// Watches `state` until its event (of `context`) completes; starts
    /// the watcher on first use.
    pub(super) fn watch(
        self: &Arc<Self>,
        context: usize,
        event: CUevent,
        state: &Arc<LaunchState>,
    ) {
        self.watching.get_or_init(|| {
            let faults = self.clone();
            let _ = std::thread::Builder::new()
                .name("rccl-cuda-faults".into())
                .spawn(move || faults.run(context));
        });
        self.pending
            .lock()
            .push((event as usize, Arc::downgrade(state)));
        self.wake.notify_one();
    }

    fn run(&self, context: usize) {
        // The device's context, current on this thread for its life; a
        // failure shows in the queries below.
        let _current = Current::enter(context as CUcontext);
        loop {
            let mut pending = std::mem::take(&mut *self.pending.lock());
            pending.retain(|&(event, ref state)| {
                // SAFETY: an event `launch_work` created for this watch,
                // destroyed here only.
                let answer = unsafe { api::cuEventQuery(event as CUevent) };
                if answer == sys::CUresult::CUDA_ERROR_NOT_READY {
                    return true;
                }
                if let (Err(e), Some(state)) = (check("cuEventQuery", answer), state.upgrade()) {
                    state.fail(Error::System(format!(
                        "the CUDA context failed while device work ran ({e}): its kernels \
                         stopped and nothing more runs in the context"
                    )));
                }
                // SAFETY: as above, destroyed once.
                unsafe { api::cuEventDestroy_v2(event as CUevent) };
                false
            });
            let mut list = self.pending.lock();
            list.extend(pending);
            if list.is_empty() {
                self.wake.wait(&mut list);
            } else {
                drop(list);
                std::thread::sleep(FAULT_POLL);
            }
        }
    }
}

/// Words of mapped page-locked memory the kernels poll to stop
/// ([`Device::alloc_abort_word`]): host and device addresses of each.
#[derive(Default)]
pub(super) struct AbortWords {
    pub(super) idle: Vec<(usize, u64)>,
    /// Every word handed out: device address -> host address.
    pub(super) given: HashMap<u64, usize>,
}

/// Abort words a page of them holds.
pub(super) const ABORT_WORDS_PER_PAGE: usize = 1024;

/// A launch in flight whose blocks' abort words the watcher sets (host
/// addresses) once its `stop` answers `true`.
pub(super) struct Watched {
    pub(super) id: u64,
    pub(super) stop: Box<dyn Fn() -> bool + Send>,
    pub(super) words: Vec<usize>,
    pub(super) stopped: bool,
}

/// How often the watcher asks each launch in flight whether to stop it.
pub(super) const WATCH: Duration = Duration::from_millis(10);

/// The launches the watcher thread follows.
pub(super) type WatchList = Arc<Mutex<Vec<Watched>>>;

/// Follows `list`: sets the abort words of each launch whose `stop`
/// answers `true` (a communicator aborted or failed, a peer died, a
/// connection broke), which ends its kernels' waits.
pub(super) fn watch(list: WatchList) {
    loop {
        std::thread::sleep(WATCH);
        for launch in list.lock().iter_mut().filter(|l| !l.stopped) {
            if (launch.stop)() {
                for &word in &launch.words {
                    // SAFETY: a mapped page-locked word of this device,
                    // kept while the launch is listed (its abort word);
                    // the kernels read it with atomic loads.
                    unsafe { AtomicU32::from_ptr(word as *mut u32) }.store(1, Ordering::Release);
                }
                launch.stopped = true;
            }
        }
    }
}

/// Adds a page of mapped page-locked abort words to `words`.
pub(super) fn add_abort_words(words: &mut AbortWords) -> Result<()> {
    let bytes = ABORT_WORDS_PER_PAGE * 4;
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    let mut host = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the page is kept for the life of the
    // process (words go back to the idle list, never to the driver).
    call("cuMemHostAlloc", unsafe {
        api::cuMemHostAlloc(&mut host, bytes, flags)
    })?;
    let mut device: sys::CUdeviceptr = 0;
    // SAFETY: `host` is mapped memory of the current context; a valid
    // out-pointer.
    call("cuMemHostGetDevicePointer", unsafe {
        api::cuMemHostGetDevicePointer_v2(&mut device, host, 0)
    })?;
    for k in (0..ABORT_WORDS_PER_PAGE).rev() {
        words
            .idle
            .push((host as usize + 4 * k, device + 4 * k as u64));
    }
    Ok(())
}

/// Stops following launch `id`.
pub(super) fn unwatch(list: &WatchList, id: u64) {
    let mut list = list.lock();
    let gone = list
        .iter()
        .position(|l| l.id == id)
        .map(|at| list.swap_remove(at));
    drop(list);
    drop(gone);
}
