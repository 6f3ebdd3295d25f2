//! Measures this machine's copy and reduction rates in each regime of the
//! `local-shm` preset (each cache level, memory, streaming) with every
//! core busy, as they are under one rank per core (two ranks on this
//! machine's two cores), and prints them as a
//! [`Probe`]'s JSON: what `rccl-sim --probe` scales the preset's rates
//! by (`ClusterSpec::calibrate`).
//!
//! `cargo run --release -p rccl-simulator --example probe_local [SAMPLES]`
//!
//! Each sample runs every (regime, operation) on one thread per allowed
//! core at once, each thread on its own buffers, for `SAMPLE_MS`; the
//! figure kept is the fastest sample's mean per-thread rate (SAMPLES: 3),
//! as `scripts/sim-validate.sh` keeps the fastest round of a collective.
//! The operations are the engine's own kernels: a copy (`Store::copy`)
//! and a float32 sum of two inputs into a third buffer
//! (`ReduceKernel::run_with_store`), in 512 KiB pieces (a FIFO slot's
//! size) so that the C library's own non-temporal copy path never runs.
//! A sample also times the hand-off: two threads on two cores passing
//! each other 64 KiB pieces through a FIFO of 8 slots each way (each
//! copies its data in, the other copies it out), the shape of two ranks'
//! shared-memory transfers, which cross from one core's caches to the
//! other's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use rccl::kernels::{ReduceKernel, Store};
use rccl::{DataType, RedOp};
use rccl_simulator::cluster;
use rccl_simulator::probe::{Probe, Rates};

const KIB: usize = 1024;
/// How long one thread repeats one (regime, operation) per sample.
const SAMPLE_MS: u64 = 60;
const PIECE: usize = 512 * KIB;

#[derive(Clone, Copy)]
enum Op {
    Copy,
    Reduce,
}

/// The hand-off's piece and slot count: a FIFO of 8 slots, as the
/// engine's.
const HANDOFF_PIECE: usize = 64 * KIB;
const HANDOFF_SLOTS: usize = 8;

/// One direction of the hand-off between two threads: `HANDOFF_SLOTS`
/// slots at `slots`, and how many pieces the writer has put in and the
/// reader has taken out.
struct Ring {
    slots: *mut u8,
    written: AtomicUsize,
    read: AtomicUsize,
}

// SAFETY: the slots are shared by exactly one writer and one reader.
// The writer writes slot `i % HANDOFF_SLOTS` only while
// `i - read < HANDOFF_SLOTS` (the reader is done with its previous
// piece, published by its release store of `read`), and the reader
// reads it only once `written > i` (published by the writer's release
// store after the copy); the buffer outlives both threads.
unsafe impl Sync for Ring {}

/// One thread's side of the hand-off: puts pieces of `src` into `out`
/// and takes pieces of `input` into `dst`, whichever can go, for
/// `SAMPLE_MS`; its rate of pieces taken in, GB/s.
fn exchange(out: &Ring, input: &Ring, src: &[u8], dst: &mut [u8], start: &Barrier) -> f64 {
    let pieces = src.len() / HANDOFF_PIECE;
    let (mut sent, mut got) = (0usize, 0usize);
    start.wait();
    let begin = Instant::now();
    // No wait here blocks: each pass tries both directions and the loop
    // ends at the deadline whatever the peer does.
    while begin.elapsed() < Duration::from_millis(SAMPLE_MS) {
        let mut moved = false;
        if sent - out.read.load(Ordering::Acquire) < HANDOFF_SLOTS {
            // SAFETY: the slot is free (see `Ring`); the source piece lies
            // inside `src`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr().add(sent % pieces * HANDOFF_PIECE),
                    out.slots.add(sent % HANDOFF_SLOTS * HANDOFF_PIECE),
                    HANDOFF_PIECE,
                )
            };
            sent += 1;
            out.written.store(sent, Ordering::Release);
            moved = true;
        }
        if input.written.load(Ordering::Acquire) > got {
            // SAFETY: the slot holds a published piece (see `Ring`); the
            // destination piece lies inside `dst`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    input.slots.add(got % HANDOFF_SLOTS * HANDOFF_PIECE),
                    dst.as_mut_ptr().add(got % pieces * HANDOFF_PIECE),
                    HANDOFF_PIECE,
                )
            };
            got += 1;
            input.read.store(got, Ordering::Release);
            moved = true;
        }
        if !moved {
            std::hint::spin_loop();
        }
    }
    (got * HANDOFF_PIECE) as f64 / begin.elapsed().as_secs_f64() / 1e9
}

/// Two threads on two cores hand each other `len` bytes over and over
/// through a FIFO each way, as two ranks' shared-memory transfers do: the
/// mean per-thread rate, GB/s.
fn handoff(cores: &[usize], len: usize) -> f64 {
    let pair = [cores[0], *cores.get(1).unwrap_or(&cores[0])];
    let mut slots = vec![0u8; 2 * HANDOFF_SLOTS * HANDOFF_PIECE];
    let (first, second) = slots.split_at_mut(HANDOFF_SLOTS * HANDOFF_PIECE);
    let rings = [first, second].map(|slots| Ring {
        slots: slots.as_mut_ptr(),
        written: AtomicUsize::new(0),
        read: AtomicUsize::new(0),
    });
    mean_rate(&pair, |side, start| {
        let src = vec![1u8; len];
        let mut dst = vec![0u8; len];
        exchange(&rings[side], &rings[1 - side], &src, &mut dst, start)
    })
}

/// Runs `work(i, start)` on one thread per entry of `cores`, thread `i`
/// bound to `cores[i]`, the threads meeting at `start` before they time
/// anything: the mean of the rates they return.
fn mean_rate(cores: &[usize], work: impl Fn(usize, &Barrier) -> f64 + Sync) -> f64 {
    let start = Barrier::new(cores.len());
    let rates: Vec<f64> = std::thread::scope(|s| {
        let threads: Vec<_> = cores
            .iter()
            .enumerate()
            .map(|(i, &core)| {
                let (work, start) = (&work, &start);
                s.spawn(move || {
                    bind_to(core);
                    work(i, start)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a probe thread"))
            .collect()
    });
    rates.iter().sum::<f64>() / rates.len() as f64
}

fn bind_to(core: usize) {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; CPU_SET writes
    // inside it for core < CPU_SETSIZE.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread. Failure only costs stable timings.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

fn allowed_cores() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set, and
    // sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this process; `set` is a valid out-pointer.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return vec![0];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` was filled by sched_getaffinity; the index is in range.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// One thread's rate for `op` over `len`-byte operands, GB/s of output.
fn run_one(op: Op, len: usize, store: Store, start: &Barrier) -> f64 {
    let kernel = ReduceKernel::new(DataType::Float32, RedOp::Sum, 2).expect("a valid kernel");
    let a = vec![1.0f32; len / 4];
    let b = vec![2.0f32; len / 4];
    let mut out = vec![0.0f32; len / 4];
    let pass = |out: &mut [f32]| {
        for offset in (0..len).step_by(PIECE) {
            let bytes = PIECE.min(len - offset);
            // SAFETY: `a`, `b` and `out` are distinct allocations of `len`
            // bytes; every piece lies inside them.
            unsafe {
                let src = a.as_ptr().cast::<u8>().add(offset);
                let dst = out.as_mut_ptr().cast::<u8>().add(offset);
                match op {
                    Op::Copy => store.copy(src, dst, bytes),
                    Op::Reduce => kernel.run_with_store(
                        store,
                        Some(b.as_ptr().cast::<u8>().add(offset)),
                        src,
                        dst,
                        bytes / 4,
                        false,
                    ),
                }
            }
        }
    };
    pass(&mut out);
    start.wait();
    let begin = Instant::now();
    let mut passes = 0usize;
    while begin.elapsed() < Duration::from_millis(SAMPLE_MS) {
        pass(&mut out);
        passes += 1;
    }
    std::hint::black_box(&out);
    (passes * len) as f64 / begin.elapsed().as_secs_f64() / 1e9
}

/// The mean per-thread rate of `op` with every core busy.
fn sample(cores: &[usize], op: Op, len: usize, store: Store) -> f64 {
    mean_rate(cores, |_, start| run_one(op, len, store, start))
}

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("SAMPLES: a count"))
        .unwrap_or(3);
    let cores = allowed_cores();
    // Each operand's size per thread in each regime, for the preset's
    // two ranks on two cores: a reduction's three operands take 3/4 of a
    // core's L2 share (512 KiB), 3/8 of its L3 share (16 MiB, and well
    // beyond its L2), and three times the whole L3 beyond the caches.
    let per_core = |bytes: usize| bytes / 2;
    let beyond = cluster::LOCAL_L3_BYTES / 2;
    let regimes = [
        (per_core(cluster::LOCAL_L2_BYTES) / 4, Store::Cached),
        (per_core(cluster::LOCAL_L3_BYTES) / 8, Store::Cached),
        (beyond, Store::Cached),
        (beyond, Store::Streaming),
    ];
    let mut best = vec![Rates::default(); regimes.len()];
    let mut handoff_gbs = 0.0f64;
    for _ in 0..samples {
        handoff_gbs = handoff_gbs.max(handoff(&cores, regimes[1].0));
        for (fastest, &(len, store)) in best.iter_mut().zip(&regimes) {
            *fastest = fastest.max(Rates {
                copy_gbs: sample(&cores, Op::Copy, len, store),
                reduce_gbs: sample(&cores, Op::Reduce, len, store),
            });
        }
    }
    let streaming = best.pop().expect("the streaming regime");
    let memory = best.pop().expect("the memory regime");
    let probe = Probe {
        caches: best,
        memory,
        streaming,
        handoff_gbs,
    };
    println!("{}", probe.to_json());
}
