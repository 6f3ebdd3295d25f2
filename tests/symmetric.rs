//! Collectives on symmetric windows (`NCCL_WIN_COLL_SYMMETRIC`): with
//! send and receive buffers in windows registered symmetric on every rank
//! of one host, all-reduce, all-gather and reduce-scatter read peers'
//! windows directly. Results must equal the staged path's (bitwise for
//! integers, within rounding for floats), be identical on every rank,
//! and hold over many rounds back to back (a rank reusing its buffers
//! before a peer finished reading them can show as wrong data);
//! `Communicator::symmetric_calls` proves the path ran, and
//! `NCCL_ALGO=^symmetric` or the deterministic mode keep calls staged.

#[path = "common/children.rs"]
mod children;

use std::time::Duration;

use children::spawn_ranks;
use rccl::{Communicator, Config, Element, RedOp, Window, WIN_COLL_SYMMETRIC};

const PAGE: usize = 4096;
/// Element counts per rank: one, odd, and one whose all-reduce runs in
/// two shots.
const COUNTS: [usize; 3] = [1, 1001, 9001];
/// Bytes of each of the window's two regions (send, receive).
const REGION: usize = 4 * 9001 * 8 + PAGE;

/// Shareable host memory registered as a symmetric window: a send
/// region, then a receive region.
struct SymWindow<'c> {
    comm: &'c Communicator,
    ptr: *mut u8,
    window: Window,
}

impl<'c> SymWindow<'c> {
    fn new(comm: &'c Communicator) -> SymWindow<'c> {
        let ptr = rccl::alloc_shareable_host(2 * REGION).unwrap();
        // SAFETY: the memory outlives the window (deregistered on drop).
        let window = unsafe { comm.register_window(ptr, 2 * REGION, WIN_COLL_SYMMETRIC) }.unwrap();
        SymWindow { comm, ptr, window }
    }

    /// `len` elements at byte `offset`.
    #[allow(clippy::mut_from_ref)]
    fn slice<T: Element>(&self, offset: usize, len: usize) -> &mut [T] {
        assert!(offset + len * std::mem::size_of::<T>() <= 2 * REGION);
        // SAFETY: inside the page-aligned allocation; offsets are
        // multiples of 8; each test uses a region through one slice at a
        // time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset).cast(), len) }
    }
}

impl Drop for SymWindow<'_> {
    fn drop(&mut self) {
        self.comm.deregister_window(self.window).unwrap();
        rccl::free_shareable_host(self.ptr).unwrap();
    }
}

/// Element types of the test: integers compare bitwise, floats within
/// rounding (the fold order differs from the staged path's).
trait Value: Element + PartialEq + std::fmt::Debug {
    fn of(small: u32) -> Self;
    fn close(a: Self, b: Self) -> bool {
        a == b
    }
}

impl Value for i32 {
    fn of(small: u32) -> Self {
        small as i32 - 2
    }
}
impl Value for u8 {
    fn of(small: u32) -> Self {
        small as u8
    }
}
impl Value for i64 {
    fn of(small: u32) -> Self {
        (small as i64) << 33
    }
}
impl Value for f32 {
    fn of(small: u32) -> Self {
        small as f32 * 0.75
    }
    fn close(a: Self, b: Self) -> bool {
        (a - b).abs() <= 1e-5 * a.abs().max(1.0)
    }
}
impl Value for f64 {
    fn of(small: u32) -> Self {
        small as f64 * 0.3
    }
    fn close(a: Self, b: Self) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(1.0)
    }
}

/// A small value (products stay finite) that changes with element, rank
/// and round.
fn small(i: usize, rank: usize, round: usize) -> u32 {
    ((i * 7 + rank * 3 + round) % 5 + 1) as u32
}

fn fill<T: Value>(buf: &mut [T], rank: usize, round: usize) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = T::of(small(i, rank, round));
    }
}

/// Checks this rank's result against the staged path's, and (unless
/// `own_block`: a reduce-scatter's) that every rank holds the same bits
/// (gathered through the staged path).
fn check<T: Value>(comm: &Communicator, what: &str, got: &[T], staged: &[T], own_block: bool) {
    for (i, (&a, &b)) in got.iter().zip(staged).enumerate() {
        assert!(
            T::close(a, b),
            "{what}: rank {} element {i}: {a:?} on windows, {b:?} staged",
            comm.rank()
        );
    }
    if own_block {
        return;
    }
    let bytes: &[u8] = bytemuck::cast_slice(got);
    let mut all = vec![0u8; bytes.len() * comm.count()];
    comm.all_gather(bytes, &mut all).unwrap();
    for (r, block) in all.chunks(bytes.len()).enumerate() {
        assert!(
            block == bytes,
            "{what}: rank {r}'s result differs from rank {}'s",
            comm.rank()
        );
    }
}

/// Every collective on `win`, each round checked against the staged path
/// on plain buffers; returns how many ran on the windows' buffers.
fn exercise<T: Value>(comm: &Communicator, win: &SymWindow<'_>, rounds: usize) -> u64 {
    let (rank, n) = (comm.rank(), comm.count());
    let ops = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];
    let mut calls = 0;
    for count in COUNTS {
        for round in 0..rounds {
            let op = ops[round % ops.len()];
            let what = |name: &str| {
                format!(
                    "{name} of {count} {} ({op:?}) round {round}",
                    std::any::type_name::<T>()
                )
            };
            // All-reduce, out of place then in place.
            let mut plain = vec![T::of(0); count];
            fill(&mut plain, rank, round);
            let mut staged = vec![T::of(0); count];
            comm.all_reduce(&plain, &mut staged, op).unwrap();
            let send = win.slice::<T>(0, count);
            fill(send, rank, round);
            let recv = win.slice::<T>(REGION, count);
            comm.all_reduce(send, recv, op).unwrap();
            check(comm, &what("all-reduce"), recv, &staged, false);
            let inplace = win.slice::<T>(0, count);
            fill(inplace, rank, round);
            comm.all_reduce_in_place(inplace, op).unwrap();
            check(comm, &what("in-place all-reduce"), inplace, &staged, false);
            // Reduce-scatter.
            let mut plain = vec![T::of(0); n * count];
            fill(&mut plain, rank, round);
            let mut staged = vec![T::of(0); count];
            comm.reduce_scatter(&plain, &mut staged, op).unwrap();
            let send = win.slice::<T>(0, n * count);
            fill(send, rank, round);
            let recv = win.slice::<T>(REGION, count);
            comm.reduce_scatter(send, recv, op).unwrap();
            check(comm, &what("reduce-scatter"), recv, &staged, true);
            let inplace = win.slice::<T>(REGION, n * count);
            fill(inplace, rank, round);
            comm.reduce_scatter_in_place(inplace, op).unwrap();
            check(
                comm,
                &what("in-place reduce-scatter"),
                &inplace[rank * count..][..count],
                &staged,
                true,
            );
            // All-gather.
            let mut plain = vec![T::of(0); count];
            fill(&mut plain, rank, round);
            let mut staged = vec![T::of(0); n * count];
            comm.all_gather(&plain, &mut staged).unwrap();
            let send = win.slice::<T>(0, count);
            fill(send, rank, round);
            let recv = win.slice::<T>(REGION, n * count);
            comm.all_gather(send, recv).unwrap();
            check(comm, &what("all-gather"), recv, &staged, false);
            let inplace = win.slice::<T>(REGION, n * count);
            fill(&mut inplace[rank * count..][..count], rank, round);
            comm.all_gather_in_place(inplace).unwrap();
            check(comm, &what("in-place all-gather"), inplace, &staged, false);
            calls += 6;
        }
    }
    calls
}

/// Runs every type through `exercise`; `expected(calls)` is how many of
/// them must have run on the windows.
fn every_type(comm: &Communicator, rounds: usize, expected: fn(u64) -> u64) {
    let win = SymWindow::new(comm);
    let before = comm.symmetric_calls();
    let calls = exercise::<i32>(comm, &win, rounds)
        + exercise::<u8>(comm, &win, rounds)
        + exercise::<i64>(comm, &win, rounds)
        + exercise::<f32>(comm, &win, rounds)
        + exercise::<f64>(comm, &win, rounds);
    assert_eq!(
        comm.symmetric_calls() - before,
        expected(calls),
        "rank {}: collectives on symmetric windows",
        comm.rank()
    );
}

/// Small all-reduces run on the board (one barrier, cheaper than the
/// windows' two); without its one-shot algorithm every call of these
/// tests runs on the windows.
fn config() -> Config {
    Config {
        timeout: Duration::from_secs(30),
        algo: rccl::tuning::Selection::parse("NCCL_ALGO", "^oneshot").unwrap(),
        ..Config::default()
    }
}

fn threads(n: usize, body: impl Fn(&Communicator) + Sync) {
    let comms = Communicator::init_all_config(n, config()).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            let body = &body;
            s.spawn(move || body(comm));
        }
    });
}

#[test]
fn collectives_on_symmetric_windows_between_threads_at_2_3_and_4_ranks() {
    for n in [2, 3, 4] {
        threads(n, |comm| every_type(comm, 10, |calls| calls));
    }
}

#[test]
fn small_all_reduces_stay_on_the_board() {
    let comms = Communicator::init_all_config(2, Config::default()).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let win = SymWindow::new(comm);
                let send = win.slice::<f32>(0, 2);
                let recv = win.slice::<f32>(REGION, 2);
                comm.all_reduce(send, recv, RedOp::Sum).unwrap();
                assert_eq!(comm.symmetric_calls(), 0);
                let send = win.slice::<f32>(0, 2);
                let recv = win.slice::<f32>(REGION, 2 * comm.count());
                comm.all_gather(send, recv).unwrap();
                assert_eq!(comm.symmetric_calls(), 1);
            });
        }
    });
}

#[test]
fn many_small_rounds_back_to_back_never_race_a_reader() {
    threads(4, |comm| {
        let win = SymWindow::new(comm);
        let (rank, n) = (comm.rank(), comm.count());
        let before = comm.symmetric_calls();
        for round in 0..2000 {
            let send = win.slice::<i64>(0, 3);
            fill(send, rank, round);
            let recv = win.slice::<i64>(REGION, 3);
            comm.all_reduce(send, recv, RedOp::Sum).unwrap();
            for (i, &x) in recv.iter().enumerate() {
                let want: i64 = (0..n).map(|r| i64::of(small(i, r, round))).sum();
                assert_eq!(x, want, "rank {rank} round {round} element {i}");
            }
        }
        assert_eq!(comm.symmetric_calls() - before, 2000);
    });
}

/// Calls back to back, with no other call between, where rank 0 refills
/// its input at once while the others check their results: a rank that
/// refilled its buffers while a peer still read them shows as wrong data
/// on that peer. Between threads the race depends on timing;
/// `a_slow_reader_never_reads_a_refilled_buffer` makes a reader slow.
fn back_to_back(comm: &Communicator, rounds: usize) {
    let win = SymWindow::new(comm);
    let (rank, n) = (comm.rank(), comm.count());
    let want = |i: usize, r: usize, round: usize| i64::of(small(i, r, round));
    let before = comm.symmetric_calls();
    for round in 0..rounds {
        // One shot: every rank reads every input.
        let count = 3000;
        let send = win.slice::<i64>(0, count);
        fill(send, rank, round);
        let recv = win.slice::<i64>(REGION, count);
        comm.all_reduce(send, recv, RedOp::Sum).unwrap();
        for (i, &x) in recv.iter().enumerate().filter(|_| rank != 0) {
            let sum: i64 = (0..n).map(|r| want(i, r, round)).sum();
            assert_eq!(x, sum, "all-reduce: rank {rank} round {round} element {i}");
        }
        let count = REGION / 8 / n - PAGE;
        let send = win.slice::<i64>(0, count);
        fill(send, rank, round);
        let recv = win.slice::<i64>(REGION, n * count);
        comm.all_gather(send, recv).unwrap();
        for (i, &x) in recv.iter().enumerate().filter(|_| rank != 0) {
            let (r, i) = (i / count, i % count);
            assert_eq!(
                x,
                want(i, r, round),
                "all-gather: rank {rank} round {round} element {i} of rank {r}"
            );
        }
    }
    assert_eq!(comm.symmetric_calls() - before, 2 * rounds as u64);
}

#[test]
fn calls_back_to_back_never_race_a_reader() {
    threads(4, |comm| back_to_back(comm, 300));
}

/// Rank 1 sleeps before it reads its peers' windows (the test-only
/// `RCCL_FAULT_INJECT=symmetric-read=MS`): rank 0, whose result is not
/// checked, would refill its input meanwhile, were it not held until
/// every rank has finished reading.
#[test]
fn a_slow_reader_never_reads_a_refilled_buffer() {
    let mut ranks = spawn_ranks("child_rank", 3, |rank| {
        let mut vars = vec![
            (CHILD.to_string(), "back-to-back".to_string()),
            ("NCCL_ALGO".to_string(), "^oneshot".to_string()),
        ];
        if rank == 1 {
            vars.push((
                "RCCL_FAULT_INJECT".to_string(),
                "symmetric-read=10".to_string(),
            ));
        }
        vars
    });
    let ok = ranks.wait_all(Duration::from_secs(120));
    assert!(ok.iter().all(|&ok| ok), "{ok:?}");
}

/// The mismatch fails the communicator, whose deregistration is then
/// refused; dropping it releases the window, so its memory can be freed.
#[test]
fn buffers_at_different_offsets_fail_on_every_rank_naming_them() {
    let memory = std::sync::Mutex::new(Vec::new());
    threads(2, |comm| {
        let win = SymWindow::new(comm);
        let offset = comm.rank() * 64;
        let send = win.slice::<f32>(offset, 5);
        let recv = win.slice::<f32>(REGION, 5);
        let err = comm
            .all_reduce(send, recv, RedOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("send at offset 0 of window #0")
                && err.contains("send at offset 64 of window #0"),
            "{err}"
        );
        assert_eq!(comm.symmetric_calls(), 0);
        let refused = comm.deregister_window(win.window).unwrap_err().to_string();
        assert!(
            refused.contains("send at offset 64 of window #0"),
            "{refused}"
        );
        memory.lock().unwrap().push(win.ptr as usize);
        std::mem::forget(win);
    });
    for ptr in memory.into_inner().unwrap() {
        assert!(rccl::free_shareable_host(ptr as *mut u8).unwrap());
    }
}

const CHILD: &str = "RCCL_SYMMETRIC_CHILD";

/// One rank of the processes' tests; does nothing when run directly.
#[test]
fn child_rank() {
    let Some(role) = std::env::var_os(CHILD) else {
        return;
    };
    let comm = Communicator::from_env_config(Config {
        timeout: Duration::from_secs(30),
        ..Config::from_env().unwrap()
    })
    .unwrap();
    match role.to_str().unwrap() {
        "symmetric" => every_type(&comm, 4, |calls| calls),
        "staged" => every_type(&comm, 2, |_| 0),
        // Only all-gathers: reductions keep their stated order.
        "deterministic" => every_type(&comm, 2, |calls| calls / 3),
        "back-to-back" => back_to_back(&comm, 20),
        other => panic!("unknown role {other}"),
    }
}

fn processes(n: usize, role: &str, env: &[(&str, &str)]) {
    let mut ranks = spawn_ranks("child_rank", n, |_| {
        let mut vars = vec![(CHILD.to_string(), role.to_string())];
        vars.extend(env.iter().map(|&(k, v)| (k.to_string(), v.to_string())));
        vars
    });
    let ok = ranks.wait_all(Duration::from_secs(120));
    assert!(ok.iter().all(|&ok| ok), "{role}: {ok:?}");
}

#[test]
fn collectives_on_symmetric_windows_between_processes_at_2_3_and_4_ranks() {
    for n in [2, 3, 4] {
        processes(n, "symmetric", &[("NCCL_ALGO", "^oneshot")]);
    }
}

#[test]
fn nccl_algo_and_the_deterministic_mode_keep_calls_staged() {
    processes(2, "staged", &[("NCCL_ALGO", "^symmetric")]);
    processes(3, "deterministic", &[("NCCL_DETERMINISTIC", "1")]);
}
