//! Waiting that survives oversubscription: spin, then yield, then park,
//! always with a deadline and an abort flag.
//!
//! Ranks usually outnumber cores, so a waiter must give its core away
//! quickly: it spins a little (the cheapest wake-up when the peer runs on
//! another core), then yields (lets a peer on this core run), then parks on
//! a futex word with a growing timeout.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::futex;

/// How long a waiter spins before yielding, in nanoseconds: a peer on
/// another core usually answers within this. Zero when ranks outnumber
/// cores ([`spin_before_yielding`]).
static SPIN_FOR_NS: AtomicU64 = AtomicU64::new(20_000);

/// Sets how long waiters of this process spin before they yield. A process
/// whose host runs more ranks than it has cores sets it to zero: a spinning
/// waiter would only keep the core from the peer it waits for.
pub fn spin_before_yielding(spin: Duration) {
    SPIN_FOR_NS.store(
        spin.as_nanos().min(u128::from(u64::MAX)) as u64,
        Ordering::Relaxed,
    );
}
/// Whether waiters of this process spin before they yield (they do not
/// when its host runs more ranks than it has cores).
pub fn spinning() -> bool {
    SPIN_FOR_NS.load(Ordering::Relaxed) != 0
}

/// How long it then yields before parking: when ranks outnumber cores,
/// yielding hands the core to the peer it waits for.
const YIELD_FOR: Duration = Duration::from_micros(200);
/// Pause instructions per spinning snooze, and snoozes per clock reading.
const PAUSES_PER_SPIN: u32 = 4;
const SPINS_PER_CLOCK_READ: u32 = 64;
const PARK_MIN: Duration = Duration::from_micros(50);
const PARK_MAX: Duration = Duration::from_millis(5);

/// Why a wait ended without its condition becoming true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitError {
    /// The deadline passed.
    TimedOut,
    /// The abort flag was raised.
    Aborted,
}

/// A word to park on: sleep while it still holds the value last seen.
#[derive(Clone, Copy, Debug)]
pub struct ParkOn<'a> {
    /// The futex word.
    pub word: &'a AtomicU32,
    /// The value seen when the condition was checked.
    pub seen: u32,
    /// A count of parked waiters that the waking side reads to decide
    /// whether a wake-up system call is needed.
    pub sleepers: Option<&'a AtomicU32>,
}

/// Escalating backoff for one waiter; reset it whenever progress is made.
#[derive(Debug)]
pub struct Backoff {
    /// When the current wait began (set by its first snooze).
    since: Option<Instant>,
    rounds: u32,
    park: Duration,
    park_max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

impl Backoff {
    /// A fresh backoff, starting with spinning.
    pub fn new() -> Backoff {
        Backoff::with_max_park(PARK_MAX)
    }

    /// A backoff whose parks last at most `park_max` (longer for threads
    /// that are woken explicitly, such as proxies).
    pub fn with_max_park(park_max: Duration) -> Backoff {
        Backoff {
            since: None,
            rounds: 0,
            park: PARK_MIN,
            park_max,
        }
    }

    /// Caps how long one park may last from now on: a waiter that parks on
    /// one of several things it waits for must look at the others soon.
    pub fn set_park_max(&mut self, park_max: Duration) {
        self.park_max = park_max;
        self.park = self.park.min(park_max);
    }

    /// Forgets the waiting so far (call after progress).
    pub fn reset(&mut self) {
        self.since = None;
        self.rounds = 0;
        self.park = PARK_MIN;
    }

    /// Waits a little, escalating from spinning to yielding to parking.
    ///
    /// With `park_on`, the park sleeps on that futex word (woken as soon as
    /// it changes); otherwise it sleeps. Fails when `deadline` has passed or
    /// `abort` is raised, so callers loop `check condition; snooze` safely.
    pub fn snooze(
        &mut self,
        park_on: Option<ParkOn<'_>>,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<(), WaitError> {
        if abort.load(Ordering::Relaxed) {
            return Err(WaitError::Aborted);
        }
        self.rounds = self.rounds.wrapping_add(1);
        let spin_for_ns = SPIN_FOR_NS.load(Ordering::Relaxed);
        // Reading the clock costs a few tens of nanoseconds: spin a little
        // between readings. Each spin is short (a pause instruction takes
        // tens of cycles), so the caller looks at its condition again
        // within about 0.1 us of it becoming true. A waiter that must not
        // spin (ranks outnumber cores) goes straight to yielding.
        if spin_for_ns != 0 && !self.rounds.is_multiple_of(SPINS_PER_CLOCK_READ) {
            for _ in 0..PAUSES_PER_SPIN {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitError::TimedOut);
        }
        let waited = now - *self.since.get_or_insert(now);
        let spin_for = Duration::from_nanos(spin_for_ns);
        if waited < spin_for {
            return Ok(());
        }
        if waited < spin_for + YIELD_FOR {
            std::thread::yield_now();
            return Ok(());
        }
        let sleep = self.park.min(deadline - now);
        match park_on {
            Some(p) => {
                if let Some(sleepers) = p.sleepers {
                    sleepers.fetch_add(1, Ordering::SeqCst);
                }
                futex::wait(p.word, p.seen, sleep);
                if let Some(sleepers) = p.sleepers {
                    sleepers.fetch_sub(1, Ordering::SeqCst);
                }
            }
            None => std::thread::sleep(sleep),
        }
        self.park = (self.park * 2).min(self.park_max);
        Ok(())
    }
}

/// Waits until `ready()` returns `Some`, or the deadline or abort.
pub fn wait_until<T>(
    mut ready: impl FnMut() -> Option<T>,
    park_word: Option<&AtomicU32>,
    deadline: Instant,
    abort: &AtomicBool,
) -> Result<T, WaitError> {
    let mut backoff = Backoff::new();
    loop {
        let seen = park_word.map(|w| w.load(Ordering::Acquire));
        if let Some(value) = ready() {
            return Ok(value);
        }
        let park_on = park_word.zip(seen).map(|(word, seen)| ParkOn {
            word,
            seen,
            sleepers: None,
        });
        backoff.snooze(park_on, deadline, abort)?;
    }
}
