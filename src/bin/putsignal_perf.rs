//! `putsignal_perf`: one-sided puts against two-sided sends, side by side
//! in one run. Every rank exchanges `size` bytes around a ring (to the
//! next rank, from the previous one) `-n` times, either by
//! `ncclSend`/`ncclRecv` in a group or by `ncclPutSignal` into a window
//! of two slots (a slot is written again once the reader acknowledged it
//! by `ncclSignal`), and the two alternate for `-r` rounds so that both
//! see the same machine. Prints, per size and method, the time per
//! exchange (slowest rank; median and spread over rounds) and the
//! bandwidth at the median.
//!
//! ```text
//! putsignal_perf [-g RANKS] [--procs [--hosts]] [-b 8,1M,16M] [-n ITERS] [-r ROUNDS]
//! ```
//! Ranks are threads of this process, or with `--procs` processes of
//! this host (the window memory then is shareable host memory, mapped by
//! the peer); `--hosts` gives each process a host of its own
//! (`NCCL_HOSTID`), so puts travel as messages over TCP, as across hosts.

use std::process::{Command, ExitCode};
use std::time::Instant;

use rccl::{Communicator, Group, RedOp, WaitDesc, Window};

const DATA: usize = 0;
const ACK: usize = 1;
const CHILD: &str = "RCCL_PUTSIGNAL_PERF_CHILD";

struct Args {
    ranks: usize,
    procs: bool,
    hosts: bool,
    sizes: Vec<usize>,
    iters: usize,
    rounds: usize,
}

fn parse_size(text: &str) -> Result<usize, String> {
    let (digits, unit) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 1 << 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits
        .parse::<usize>()
        .map(|n| n * unit)
        .map_err(|_| format!("bad size {text}"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        ranks: 2,
        procs: false,
        hosts: false,
        sizes: vec![8, 1 << 20, 16 << 20],
        iters: 0,
        rounds: 7,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-g" => args.ranks = value()?.parse().map_err(|e| format!("-g: {e}"))?,
            "--procs" => args.procs = true,
            "--hosts" => args.hosts = true,
            "-b" => {
                args.sizes = value()?
                    .split(',')
                    .map(parse_size)
                    .collect::<Result<_, _>>()?
            }
            "-n" => args.iters = value()?.parse().map_err(|e| format!("-n: {e}"))?,
            "-r" => args.rounds = value()?.parse().map_err(|e| format!("-r: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.ranks < 2 || args.rounds == 0 {
        return Err("-g must be at least 2 and -r at least 1".into());
    }
    if args.hosts && !args.procs {
        return Err("--hosts needs --procs (a host per process)".into());
    }
    Ok(args)
}

/// Exchanges per timed run: many for small sizes, fewer for large ones.
fn iters_for(args: &Args, size: usize) -> usize {
    if args.iters > 0 {
        args.iters
    } else {
        ((64usize << 20) / size.max(1)).clamp(20, 2000)
    }
}

/// One rank's window of two slots of `size` bytes.
struct Slots {
    base: *mut u8,
    size: usize,
    window: Window,
}

impl Slots {
    fn new(comm: &Communicator, size: usize) -> rccl::Result<Slots> {
        let base = rccl::alloc_shareable_host(2 * size)?;
        // SAFETY: the memory stays allocated until `free`, after the
        // window is deregistered.
        let window = unsafe { comm.register_window(base, 2 * size, 0)? };
        Ok(Slots { base, size, window })
    }

    fn free(self, comm: &Communicator) -> rccl::Result<()> {
        comm.deregister_window(self.window)?;
        rccl::free_shareable_host(self.base).map(drop)
    }
}

/// `iters` exchanges by put/signal: before writing a slot again the rank
/// waits for the reader's acknowledgement of the previous use.
fn put_signal(comm: &Communicator, slots: &Slots, src: &[u8], iters: usize) -> rccl::Result<()> {
    let (rank, n) = (comm.rank(), comm.count());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let one = |peer, sig| WaitDesc {
        peer,
        sig,
        ctx: 0,
        count: 1,
    };
    for i in 0..iters {
        if i >= 2 {
            comm.wait_signal(&[one(next, ACK)])?;
        }
        comm.put_signal(src, next, slots.window, (i % 2) * slots.size, DATA, 0)?;
        comm.wait_signal(&[one(prev, DATA)])?;
        comm.signal(prev, ACK, 0)?;
    }
    for _ in 0..iters.min(2) {
        comm.wait_signal(&[one(next, ACK)])?;
    }
    Ok(())
}

fn send_recv(comm: &Communicator, src: &[u8], dst: &mut [u8], iters: usize) -> rccl::Result<()> {
    let (rank, n) = (comm.rank(), comm.count());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    for _ in 0..iters {
        Group::new()
            .send(comm, src, next)?
            .recv(comm, dst, prev)?
            .run()?;
    }
    Ok(())
}

/// The slowest rank's seconds.
fn slowest(comm: &Communicator, seconds: f64) -> rccl::Result<f64> {
    let mut out = [0.0f64];
    comm.all_reduce(&[seconds], &mut out, RedOp::Max)?;
    Ok(out[0])
}

/// Runs the benchmark on this rank; rank 0 prints.
fn bench(comm: &Communicator, args: &Args) -> rccl::Result<()> {
    let rank = comm.rank();
    if rank == 0 {
        println!(
            "# putsignal_perf: {} ranks ({}), {} rounds, slowest rank per round",
            comm.count(),
            match (args.procs, args.hosts) {
                (true, true) => "processes, a host each",
                (true, false) => "processes",
                _ => "threads",
            },
            args.rounds
        );
        println!(
            "# {:>10} {:>11} {:>7} {:>11} {:>11} {:>11} {:>10}",
            "size(B)", "method", "iters", "median(us)", "min(us)", "max(us)", "GB/s"
        );
    }
    for &size in &args.sizes {
        let iters = iters_for(args, size);
        let src: Vec<u8> = (0..size).map(|i| (i * 7 + rank) as u8).collect();
        let mut dst = vec![0u8; size];
        let slots = Slots::new(comm, size)?;
        let mut times = [Vec::new(), Vec::new()];
        // A warm-up of each, then interleaved rounds.
        send_recv(comm, &src, &mut dst, iters.min(10))?;
        put_signal(comm, &slots, &src, iters.min(10))?;
        for _ in 0..args.rounds {
            let start = Instant::now();
            send_recv(comm, &src, &mut dst, iters)?;
            times[0].push(slowest(comm, start.elapsed().as_secs_f64())? / iters as f64);
            let start = Instant::now();
            put_signal(comm, &slots, &src, iters)?;
            times[1].push(slowest(comm, start.elapsed().as_secs_f64())? / iters as f64);
        }
        slots.free(comm)?;
        if rank == 0 {
            for (method, t) in ["send/recv", "put/signal"].iter().zip(&mut times) {
                t.sort_by(f64::total_cmp);
                let median = t[t.len() / 2];
                println!(
                    "  {:>10} {:>11} {:>7} {:>11.2} {:>11.2} {:>11.2} {:>10.3}",
                    size,
                    method,
                    iters,
                    median * 1e6,
                    t[0] * 1e6,
                    t[t.len() - 1] * 1e6,
                    size as f64 / median / 1e9
                );
            }
        }
    }
    Ok(())
}

/// The settings of the environment, with the two signal indices the
/// exchanges use.
fn config() -> Result<rccl::Config, String> {
    let mut config = rccl::Config::from_env().map_err(|e| e.to_string())?;
    config.rma_signals = config.rma_signals.max(2);
    Ok(config)
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    if std::env::var_os(CHILD).is_some() {
        let comm = Communicator::from_env_config(config()?).map_err(|e| e.to_string())?;
        return bench(&comm, &args).map_err(|e| e.to_string());
    }
    if args.procs {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let children: Vec<_> = (0..args.ranks)
            .map(|rank| {
                let mut child = Command::new(&exe);
                if args.hosts {
                    child.env("NCCL_HOSTID", format!("putsignal-perf-host{rank}"));
                }
                child
                    .args(std::env::args().skip(1))
                    .env(CHILD, "1")
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", args.ranks.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .spawn()
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?;
        let mut failed = 0;
        for mut child in children {
            if !child.wait().map_err(|e| e.to_string())?.success() {
                failed += 1;
            }
        }
        return if failed == 0 {
            Ok(())
        } else {
            Err(format!("{failed} rank(s) failed"))
        };
    }
    let comms = Communicator::init_all_config(args.ranks, config()?).map_err(|e| e.to_string())?;
    std::thread::scope(|s| {
        let runs: Vec<_> = comms
            .iter()
            .map(|comm| s.spawn(|| bench(comm, &args)))
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a rank panicked"))
            .collect::<rccl::Result<Vec<()>>>()
    })
    .map(drop)
    .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("putsignal_perf: {e}");
            ExitCode::FAILURE
        }
    }
}
