//! The test driver: launch modes, buffers, timing, checking and reporting,
//! following nccl-tests' `common.cu` flow. This file starts a run (flags,
//! launch, communicators, header, one [`worker::Worker`] per thread); the
//! files beside it each hold one part of a worker's job.

mod bench;
mod books;
mod data;
mod rank;
mod report;
mod worker;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Mutex;

use clap::Parser;
use rccl::device::Device;
use rccl::tuning::Selection;
use rccl::{Communicator, Config};

use super::args::{Args, BufferMemory, MemoryFlag};
use super::coll::Coll;
use super::format::engine_error;
use super::json::JsonDoc;
use super::launch::{self, Launch};
use worker::{Outcome, Worker};

/// Environment switch that corrupts one output element after the checked
/// operation, so tests can see the checker report it.
pub const CORRUPT_ENV: &str = "RCCL_PERF_CORRUPT";

type Res<T> = Result<T, String>;

/// `--psk-file`: the process's encryption key, before any connection.
fn set_psk(args: &Args) -> Res<()> {
    let Some(path) = &args.psk_file else {
        return Ok(());
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--psk-file {}: {e}", path.display()))?;
    let key = text.lines().next().unwrap_or("");
    rccl::set_encryption(Some(key.as_bytes()))
        .map_err(|e| format!("--psk-file {}: {e}", path.display()))
}

/// Runs the perf test `coll` with this process's command line; the exit
/// status follows nccl-tests (non-zero on wrong data or failures).
pub fn main(coll: Coll) -> ExitCode {
    let args = Args::parse();
    let outcome = set_psk(&args)
        .and_then(|()| Launch::detect())
        .and_then(|launch| {
            if args.procs > 1 && matches!(launch, Launch::Threads) {
                return Ok(launch::spawn_local(args.procs));
            }
            run(coll, &args, launch).map(|ok| {
                if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            })
        });
    outcome.unwrap_or_else(|msg| {
        println!("{msg}");
        let _ = std::io::stdout().flush();
        ExitCode::from(2)
    })
}

/// -I and -K after nccl-tests' checks (which disable them with a note).
fn per_iter_settings(args: &Args) -> (bool, usize) {
    let mut on = args.per_iter_timing == 1;
    if args.per_iter_timing != 0 && args.per_iter_timing != 1 {
        eprintln!("per-iteration timing (-I) only supports 0=off or 1=on. Disabling.");
    }
    let mut skip = args.per_iter_skip;
    let iters = args.iters.max(1) as i64;
    if skip < 0 || i64::from(skip) >= iters {
        eprintln!(
            "per-iteration skip (-K) must be between 0 and {}. Disabling.",
            iters - 1
        );
        skip = 0;
    }
    if skip != 0 && !on {
        eprintln!("per-iteration skip (-K) requires per-iteration timing (-I 1). Disabling.");
        skip = 0;
    }
    if args.iters == 0 {
        on = false;
    }
    (on, skip as usize)
}

fn run(coll: Coll, args: &Args, launch: Launch) -> Res<bool> {
    if args.minbytes > args.maxbytes {
        return Err(format!(
            "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
            args.minbytes, args.maxbytes
        ));
    }
    if args.nthreads == 0 || args.ngpus == 0 {
        return Err("-t and -g must be at least 1".into());
    }
    for flag in args.ignored() {
        eprintln!("# note: {flag} is accepted but has no effect in rccl-tests yet");
    }
    if args.timeout > 0 {
        std::env::set_var("RCCL_TIMEOUT_MS", (args.timeout * 1000).to_string());
    }
    let (per_iter, skip) = per_iter_settings(args);
    let device = memory_device(args)?;
    let is_main_proc = match launch {
        Launch::Threads => true,
        Launch::Env { rank, .. } | Launch::Mpi { rank, .. } => rank == 0,
    };
    let json = match (&args.output_file, is_main_proc) {
        (Some(path), true) => {
            let argv: Vec<String> = std::env::args().collect();
            match JsonDoc::create(path, &argv) {
                Ok(doc) => {
                    println!("# Writing JSON output to {}", doc.path);
                    Some(Mutex::new(doc))
                }
                Err(line) => {
                    println!("{line}");
                    None
                }
            }
        }
        _ => None,
    };
    let result = run_ranks(
        coll,
        args,
        &launch,
        is_main_proc,
        json.as_ref(),
        (per_iter, skip),
        device,
    );
    if let Some(doc) = json {
        let mut doc = doc.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Err(msg) = &result {
            doc.error(msg.clone());
        }
        let path = doc.path.clone();
        if let Err(e) = doc.finish() {
            eprintln!("# writing {path}: {e}");
        }
    }
    result
}

/// The settings of the measured communicators: the environment's, with
/// `--deterministic`, where given, over `NCCL_DETERMINISTIC`. Every rank
/// process parses the same command line (`--procs` passes it on), so the
/// ranks agree on the mode as the engine requires.
fn measured_config(args: &Args, launch: &Launch) -> Res<Config> {
    let init = match launch {
        Launch::Threads => "ncclCommInitAll",
        Launch::Env { .. } | Launch::Mpi { .. } => "ncclCommInitRank",
    };
    let mut config = Config::from_env().map_err(engine_error(init))?;
    if let Some(on) = args.deterministic {
        config.deterministic = on;
    }
    Ok(config)
}

/// The header's line on the deterministic mode: on or off, and what set
/// it, as a run's bits depend on it.
fn deterministic_line(args: &Args, config: &Config) -> String {
    let state = if config.deterministic { "on" } else { "off" };
    let by = match (args.deterministic, rccl::env::var("NCCL_DETERMINISTIC")) {
        (Some(true), _) => " (--deterministic)".to_string(),
        (Some(false), _) => " (--deterministic 0)".to_string(),
        (None, Some(value)) => format!(" (NCCL_DETERMINISTIC={value})"),
        (None, None) => String::new(),
    };
    format!("# Deterministic: {state}{by}\n")
}

/// The device whose memory the buffers live in (`--memory`), or `None`
/// for host memory.
fn memory_device(args: &Args) -> Res<Option<&'static dyn Device>> {
    match args.memory {
        MemoryFlag::Place(BufferMemory::Host) => Ok(None),
        MemoryFlag::Place(BufferMemory::Device) => {
            rccl::device::active().map(Some).ok_or_else(|| {
                format!(
                    "--memory device: {}",
                    rccl::device::selection_problem().unwrap_or("no device backend is active")
                )
            })
        }
        MemoryFlag::Report(_) => Ok(rccl::device::active()),
    }
}

fn run_ranks(
    coll: Coll,
    args: &Args,
    launch: &Launch,
    is_main_proc: bool,
    json: Option<&Mutex<JsonDoc>>,
    per_iter: (bool, usize),
    device: Option<&'static dyn Device>,
) -> Res<bool> {
    // Read after -T, which sets the timeout through the environment.
    let config = measured_config(args, launch)?;
    if is_main_proc {
        print!("{}", run_header(coll, args, &config, per_iter, device));
    }
    // Per thread, each rank's measured and bookkeeping communicators.
    let mut comms: Vec<Vec<(Communicator, Communicator)>> = Vec::new();
    let mut device_base = 0;
    let mut ranks_per_proc = args.nthreads * args.ngpus;
    // Keeps MPI initialized until every rank is done.
    let mut _mpi = None;
    match launch {
        Launch::Threads => {
            let nranks = args.nthreads * args.ngpus;
            let all = Communicator::init_all_config(nranks, config)
                .map_err(engine_error("ncclCommInitAll"))?;
            let books = Communicator::init_all_config(nranks, bookkeeping_config(all[0].config()))
                .map_err(engine_error("ncclCommInitAll (bookkeeping)"))?;
            let mut it = all.into_iter().zip(books);
            for _ in 0..args.nthreads {
                comms.push(it.by_ref().take(args.ngpus).collect());
            }
        }
        Launch::Env {
            nranks, local_rank, ..
        }
        | Launch::Mpi {
            nranks, local_rank, ..
        } => {
            if args.nthreads * args.ngpus != 1 {
                return Err(format!(
                    "with one process per rank ({nranks} ranks from the environment), -t and -g must be 1"
                ));
            }
            let (comm, session) = launch::join(launch, config)?;
            _mpi = session;
            let books = comm
                .split_config(
                    Some(0),
                    comm.rank() as i32,
                    bookkeeping_config(comm.config()),
                )
                .map_err(engine_error("ncclCommSplit (bookkeeping)"))?
                .ok_or("the bookkeeping split gave this rank no communicator")?;
            comms.push(vec![(comm, books)]);
            device_base = *local_rank;
            ranks_per_proc = 1;
        }
    }
    let setup = RunSetup {
        per_iter: per_iter.0,
        skip: per_iter.1,
        ranks_per_proc,
        launch: launch.name(),
        gather: args.output_file.is_some() || per_iter.0 || args.stragglers,
        device,
    };
    let results: Vec<Res<Outcome>> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        let mut first = None;
        for (t, thread_comms) in comms.into_iter().enumerate() {
            let main = is_main_proc && t == 0;
            let worker = Worker::new(
                coll,
                args,
                thread_comms,
                main,
                device_base + t * args.ngpus,
                if main { json } else { None },
                setup,
            );
            if t == 0 {
                first = Some(worker);
            } else {
                handles.push(s.spawn(move || worker.and_then(|w| w.run_all())));
            }
        }
        let mut out = vec![first.expect("one thread").and_then(|w| w.run_all())];
        out.extend(handles.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("a test thread panicked".into()))
        }));
        out
    });
    let mut ok = true;
    for r in results {
        match r {
            Ok(o) => ok &= o.ok,
            Err(e) => return Err(e),
        }
    }
    Ok(ok)
}

/// FIFO bytes per connection of the bookkeeping communicators, whose
/// messages are a few numbers per rank.
const BOOKKEEPING_FIFO_BYTES: usize = 64 << 10;

/// Settings of the communicators the harness's own bookkeeping runs on
/// (the device list, barriers, times and error counts), beside the
/// measured ones as nccl-tests keeps its bookkeeping in MPI: the measured
/// settings without `NCCL_ALGO` / `NCCL_PROTO`, which are meant for the
/// measured collective alone (`NCCL_ALGO=tree` leaves all-gather no
/// algorithm), and with small FIFOs on one channel.
fn bookkeeping_config(measured: &Config) -> Config {
    Config {
        proto: Selection::default(),
        algo: Selection::default(),
        buffsize: BOOKKEEPING_FIFO_BYTES,
        ll_buffsize: BOOKKEEPING_FIFO_BYTES,
        ll128_buffsize: BOOKKEEPING_FIFO_BYTES,
        min_channels: 1,
        max_channels: 1,
        ..measured.clone()
    }
}

/// Settings shared by every thread of a run.
#[derive(Clone, Copy)]
struct RunSetup {
    /// -I 1 in force.
    per_iter: bool,
    /// -K in force.
    skip: usize,
    /// Ranks each process drives (nccl-tests' process rows group these).
    ranks_per_proc: usize,
    /// The launch's name, for the JSON file.
    launch: &'static str,
    /// Whether every rank's times are gathered after each half (for -J,
    /// -I 1 or --stragglers); the same on every rank, as it adds a
    /// collective.
    gather: bool,
    /// The device the buffers live on (`None`: host memory).
    device: Option<&'static dyn Device>,
}

/// The memory the buffers live in, as the header names it.
fn memory_name(device: Option<&'static dyn Device>) -> String {
    match device {
        None => "host".into(),
        Some(device) => format!("device {}", device.label()),
    }
}

fn run_header(
    coll: Coll,
    args: &Args,
    config: &Config,
    per_iter: (bool, usize),
    device: Option<&'static dyn Device>,
) -> String {
    let mut out = format!(
        "# rccl-tests version {} rccl-rs={} revision={} memory={}\n",
        env!("CARGO_PKG_VERSION"),
        env!("CARGO_PKG_VERSION"),
        env!("RCCL_BUILD_REVISION"),
        memory_name(device)
    );
    out += &format!("# Collective test starting: {}\n", coll.program_name());
    let (step, kind) = if args.stepfactor > 1 {
        (args.stepfactor, "factor")
    } else {
        (args.stepbytes, "bytes")
    };
    out += &format!(
        "# nThread {} nGpus {} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: {} unalign: {}\n",
        args.nthreads, args.ngpus, args.minbytes, args.maxbytes, step, kind, args.warmup_iters, args.iters,
        args.agg_iters, args.check, args.cudagraph, args.unalign
    );
    if args.blocking == 1 {
        out += "# Blocking Enabled: wait for completion and barrier after each collective \n";
    }
    if args.blocking > 1 {
        out += "# Blocking Enabled: wait for completion after each collective (no barrier) \n";
    }
    if per_iter.0 {
        out += "# Per-Iteration Report: host clock timing; i_* uses max over process rows";
        if per_iter.1 > 0 {
            out += &format!("; summary skips first {} iterations", per_iter.1);
        }
        out += " \n";
    }
    if args.parallel_init != 0 {
        out += "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n";
    }
    out += &deterministic_line(args, config);
    out += "#\n";
    out
}
