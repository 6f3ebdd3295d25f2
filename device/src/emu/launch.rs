//! Device work on the emulated GPU: the kernels' interpreter compiled for
//! the host (the twin) runs each channel of each block on a thread of its
//! own, as the GPU runs each on a block of its own, while the stream's
//! worker watches the deadline and the engine's stop condition. The
//! threads are kept between launches; a channel waits for its peers, so a
//! launch never waits for a free thread: one starts when none is idle.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::twin::{self, ChannelEnd};
use crate::work::Work;
use crate::{Error, Result, WorkFailure, WorkLaunch};

/// Blocks run so far by this process's emulated GPU (tests read it to
/// know that a call went through the interpreter).
static WORKS_RUN: AtomicU64 = AtomicU64::new(0);

/// How many blocks of device work the emulated GPU has run in this
/// process.
pub fn works_run() -> u64 {
    WORKS_RUN.load(Ordering::Relaxed)
}

/// How often the watcher looks at the deadline and the stop condition.
const WATCH: Duration = Duration::from_millis(10);

/// Sets a block's abort word: its waits end.
fn abort(work: &Work) {
    // SAFETY: the block is a complete encoding; its abort word, when set,
    // is emu device memory (host memory) that stays valid while the
    // launch runs, read by the interpreter with atomic loads.
    unsafe {
        let word = (*work.header()).abort.cast_mut();
        if !word.is_null() {
            AtomicU32::from_ptr(word).store(1, Ordering::Relaxed);
        }
    }
}

/// Runs `launch` on the calling thread (a stream's worker) and tells its
/// `done` how it ended.
pub(super) fn run(launch: WorkLaunch) {
    let WorkLaunch {
        rounds,
        timeout,
        stop,
        mut done,
    } = launch;
    let deadline = Instant::now() + timeout;
    let mut result = Ok(());
    for (index, round) in rounds.iter().enumerate() {
        WORKS_RUN.fetch_add(round.len() as u64, Ordering::Relaxed);
        result = run_round(index, round, deadline, stop.as_ref(), timeout);
        if result.is_err() {
            break;
        }
    }
    done(result);
}

/// Where a channel reports its end: (block, channel, end).
type Ends = mpsc::Sender<(usize, usize, ChannelEnd)>;

/// One channel to run.
struct Job {
    work: Arc<Work>,
    block: usize,
    channel: usize,
    ends: Ends,
}

/// Idle channel threads, each waiting on its own queue.
static IDLE: Mutex<Vec<mpsc::Sender<Job>>> = Mutex::new(Vec::new());

fn channel_thread(jobs: mpsc::Receiver<Job>, me: mpsc::Sender<Job>) {
    while let Ok(job) = jobs.recv() {
        // SAFETY: the engine's contract for `launch_work`: every address
        // of the block is emu memory valid until `done`, which waits for
        // this end; this thread alone runs this channel of this block; the
        // peers' ends run on other threads of the round.
        let end = unsafe { twin::run_channel(&job.work, job.channel, u64::MAX) };
        // The watcher outlives every sender.
        let _ = job.ends.send((job.block, job.channel, end));
        IDLE.lock().push(me.clone());
    }
}

/// Hands `job` to an idle channel thread, or to a new one.
fn start(job: Job) -> Result<()> {
    let job = match IDLE.lock().pop() {
        Some(thread) => match thread.send(job) {
            Ok(()) => return Ok(()),
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let (tx, rx) = mpsc::channel();
    let me = tx.clone();
    std::thread::Builder::new()
        .name("rccl-emu-channel".into())
        .spawn(move || channel_thread(rx, me))
        .map_err(|e| Error::System(format!("emu device 0: cannot start a channel thread: {e}")))?;
    tx.send(job)
        .map_err(|_| Error::System("emu device 0: a channel thread ended".into()))
}

fn run_round(
    index: usize,
    round: &[Arc<Work>],
    deadline: Instant,
    stop: &dyn Fn() -> bool,
    timeout: Duration,
) -> std::result::Result<(), WorkFailure> {
    let channels: usize = round.iter().map(|w| w.nchannels()).sum();
    let (tx, rx) = mpsc::channel();
    let mut ends: Vec<(usize, usize, ChannelEnd)> = Vec::with_capacity(channels);
    let mut started = 0;
    let mut failed_start = None;
    'start: for (block, work) in round.iter().enumerate() {
        for channel in 0..work.nchannels() {
            let job = Job {
                work: work.clone(),
                block,
                channel,
                ends: tx.clone(),
            };
            if let Err(e) = start(job) {
                failed_start = Some(e);
                break 'start;
            }
            started += 1;
        }
    }
    drop(tx);
    let mut stopped = false;
    let mut timed_out = false;
    if failed_start.is_some() {
        // The channels that started cannot finish without the others.
        round.iter().for_each(|w| abort(w));
        stopped = true;
    }
    while ends.len() < started {
        match rx.recv_timeout(WATCH) {
            Ok(end) => ends.push(end),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if !stopped && (stop() || Instant::now() >= deadline) {
            timed_out = Instant::now() >= deadline;
            round.iter().for_each(|w| abort(w));
            stopped = true;
        }
    }
    if let Some(e) = failed_start {
        return Err(e.into());
    }
    let unfinished: Vec<(usize, usize, ChannelEnd)> = ends
        .into_iter()
        .filter(|(_, _, end)| *end != ChannelEnd::Done)
        .collect();
    if unfinished.is_empty() && started == channels {
        return Ok(());
    }
    let why = if timed_out {
        format!("device work did not finish within {timeout:?}")
    } else {
        "device work was stopped".to_string()
    };
    let listed: Vec<String> = unfinished
        .iter()
        .map(|(b, c, end)| format!("block {b} channel {c}: {end:?}"))
        .collect();
    Err(WorkFailure {
        error: Error::System(format!("{why} ({})", listed.join(", "))),
        timed_out,
        unfinished: unfinished.iter().map(|&(b, c, _)| (index, b, c)).collect(),
    })
}
