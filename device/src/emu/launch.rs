//! Device work on the emulated GPU: the kernels' interpreter compiled for
//! the host (the twin) runs each channel of each block on a thread of its
//! own, as the GPU runs each on a block of its own, while the stream's
//! worker watches the deadline and the engine's stop condition.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::twin::{self, ChannelEnd};
use crate::work::Work;
use crate::{Error, Result, WorkLaunch};

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
        done,
    } = launch;
    let deadline = Instant::now() + timeout;
    let mut result = Ok(());
    for round in &rounds {
        WORKS_RUN.fetch_add(round.len() as u64, Ordering::Relaxed);
        result = run_round(round, deadline, stop.as_ref(), timeout);
        if result.is_err() {
            break;
        }
    }
    done(result);
}

fn run_round(
    round: &[std::sync::Arc<Work>],
    deadline: Instant,
    stop: &dyn Fn() -> bool,
    timeout: Duration,
) -> Result<()> {
    let channels: usize = round.iter().map(|w| w.nchannels()).sum();
    let (tx, rx) = mpsc::channel::<(usize, usize, ChannelEnd)>();
    let mut ends: Vec<(usize, usize, ChannelEnd)> = Vec::with_capacity(channels);
    let mut timed_out = false;
    std::thread::scope(|s| {
        for (b, work) in round.iter().enumerate() {
            for c in 0..work.nchannels() {
                let tx = tx.clone();
                s.spawn(move || {
                    // SAFETY: the engine's contract for `launch_work`: every
                    // address of the block is emu memory valid until `done`;
                    // this thread alone runs channel `c` of block `b`; the
                    // peers' ends run on threads of this round.
                    let end = unsafe { twin::run_channel(work, c, u64::MAX) };
                    // The watcher outlives every sender.
                    let _ = tx.send((b, c, end));
                });
            }
        }
        drop(tx);
        let mut stopped = false;
        while ends.len() < channels {
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
    });
    let unfinished: Vec<String> = ends
        .iter()
        .filter(|(_, _, end)| *end != ChannelEnd::Done)
        .map(|(b, c, end)| format!("block {b} channel {c}: {end:?}"))
        .collect();
    if unfinished.is_empty() && ends.len() == channels {
        return Ok(());
    }
    let why = if timed_out {
        format!("device work did not finish within {timeout:?}")
    } else {
        "device work was stopped".to_string()
    };
    Err(Error::System(format!("{why} ({})", unfinished.join(", "))))
}
