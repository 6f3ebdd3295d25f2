//! The test driver: launch modes, buffers, timing, checking and reporting,
//! following nccl-tests' `common.cu` flow.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rccl::device::{Device, Stream};
use rccl::tuning::Selection;
use rccl::{CollCall, CollKind, Communicator, Config, DataType, RedOp};
use std::sync::Arc;

use std::sync::Mutex;

use serde_json::{Map, Value};

use super::args::{Args, MemoryFlag, Placement, TestOp};
use super::coll::{Coll, Counts, Pattern};
use super::format::{self, engine_error, hostname};
use super::json::{self, IterStats, JsonDoc};
use super::launch::{self, Launch};

/// Environment switch that corrupts one output element after the checked
/// operation, so tests can see the checker report it.
pub const CORRUPT_ENV: &str = "RCCL_PERF_CORRUPT";

/// The seed of the data used while timing.
const TIMING_SEED: usize = 99;

type Res<T> = Result<T, String>;

/// Runs the perf test `coll` with this process's command line; the exit
/// status follows nccl-tests (non-zero on wrong data or failures).
pub fn main(coll: Coll) -> ExitCode {
    let args = Args::parse();
    let outcome = Launch::detect().and_then(|launch| {
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

/// The device whose memory the buffers live in (`--memory`), or `None`
/// for host memory.
fn memory_device(args: &Args) -> Res<Option<&'static dyn Device>> {
    match args.memory {
        MemoryFlag::Place(Placement::Host) => Ok(None),
        MemoryFlag::Place(Placement::Device) => rccl::device::active().map(Some).ok_or_else(|| {
            format!(
                "--memory device: {}",
                rccl::device::selection_problem().unwrap_or("no device backend is active")
            )
        }),
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
    if is_main_proc {
        print!("{}", run_header(coll, args, per_iter, device));
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
            let all = Communicator::init_all(nranks).map_err(engine_error("ncclCommInitAll"))?;
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
            let (comm, session) = launch::join(launch)?;
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
    out += "#\n";
    out
}

/// One buffer, 64-byte aligned: host memory, or device memory (page
/// aligned).
enum Buffer {
    Host {
        mem: Vec<u64>,
        offset: usize,
    },
    Device {
        ptr: *mut u8,
        device: &'static dyn Device,
    },
}

// SAFETY: the device allocation belongs to this buffer alone, as the
// host one does.
unsafe impl Send for Buffer {}

impl Buffer {
    fn new(bytes: usize, device: Option<&'static dyn Device>) -> Res<Buffer> {
        let Some(device) = device else {
            let mem = vec![0u64; bytes.div_ceil(8) + 16];
            let offset = (64 - (mem.as_ptr() as usize % 64)) % 64;
            return Ok(Buffer::Host { mem, offset });
        };
        let ptr = device
            .alloc(bytes)
            .map_err(|e| format!("{}: cannot allocate device memory: {e}", hostname()))?;
        Ok(Buffer::Device { ptr, device })
    }

    fn ptr(&mut self) -> *mut u8 {
        match self {
            // SAFETY: offset < 64 bytes lies inside the 16-word slack.
            Buffer::Host { mem, offset } => unsafe { mem.as_mut_ptr().cast::<u8>().add(*offset) },
            Buffer::Device { ptr, .. } => *ptr,
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Buffer::Device { ptr, device } = self {
            // SAFETY: the rank's stream was synchronized before its buffers
            // drop (Rank's Drop).
            let _ = unsafe { device.free(*ptr) };
        }
    }
}

struct Rank {
    /// What is measured.
    comm: Communicator,
    /// The harness's own collectives ([`bookkeeping_config`]).
    books: Communicator,
    /// The stream its calls on device memory are ordered on.
    stream: Option<Arc<dyn Stream>>,
    send: Buffer,
    recv: Buffer,
}

impl Rank {
    /// Waits for the work queued on the rank's stream; reports a failure
    /// of the stream or of the work (the communicator's async error).
    fn complete(&self) -> rccl::Result<()> {
        if let Some(stream) = &self.stream {
            stream.synchronize(std::time::Instant::now() + self.comm.config().timeout)?;
            if let Some(err) = self.comm.async_error() {
                return Err(err);
            }
        }
        Ok(())
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        // The buffers drop after this: nothing queued may still use them.
        if let Some(stream) = self.stream.take() {
            let _ = stream.synchronize(std::time::Instant::now() + self.comm.config().timeout);
            if let Some(device) = rccl::device::active() {
                let _ = device.destroy_stream(stream.raw());
            }
        }
    }
}

/// Sizes of one step of the sweep.
#[derive(Clone, Copy)]
struct Setup {
    dtype: DataType,
    counts: Counts,
    /// nccl-tests' `maxbytes / max(send, recv bytes)`: buffer positions to
    /// rotate through.
    steps: usize,
}

impl Setup {
    fn total_bytes(&self) -> usize {
        self.counts.send.max(self.counts.recv) * self.dtype.size()
    }
}

struct Outcome {
    ok: bool,
}

/// One thread: drives its ranks (inside a group when more than one).
struct Worker<'a> {
    coll: Coll,
    args: &'a Args,
    ranks: Vec<Rank>,
    main: bool,
    nranks: usize,
    errors: u64,
    bw_sum: f64,
    bw_count: usize,
    rep: usize,
    corrupt: bool,
    device_base: usize,
    /// The JSON document (main thread of the main process only).
    json: Option<&'a Mutex<JsonDoc>>,
    setup: RunSetup,
    /// The JSON result row being filled.
    row: Map<String, Value>,
    /// The straggler summaries of the row being filled (--stragglers).
    stragglers: Vec<String>,
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for r in &self.ranks {
                r.comm.abort();
                r.books.abort();
            }
        }
    }
}

/// Locks the JSON document (a panicked holder leaves it usable).
fn lock(doc: &Mutex<JsonDoc>) -> std::sync::MutexGuard<'_, JsonDoc> {
    doc.lock().unwrap_or_else(|e| e.into_inner())
}

/// Indices of the smallest and largest of `v` (the first of equals).
fn extremes(v: &[f64]) -> (usize, usize) {
    let mut lo = 0;
    let mut hi = 0;
    for (i, &x) in v.iter().enumerate() {
        if x < v[lo] {
            lo = i;
        }
        if x > v[hi] {
            hi = i;
        }
    }
    (lo, hi)
}

/// Runs `f` inside a group when `enabled`, always closing the group.
fn grouped(enabled: bool, f: impl FnOnce() -> rccl::Result<()>) -> rccl::Result<()> {
    if !enabled {
        return f();
    }
    rccl::group_start();
    let r = f();
    let end = rccl::group_end();
    r.and(end)
}

impl<'a> Worker<'a> {
    fn new(
        coll: Coll,
        args: &'a Args,
        comms: Vec<(Communicator, Communicator)>,
        main: bool,
        device_base: usize,
        json: Option<&'a Mutex<JsonDoc>>,
        setup: RunSetup,
    ) -> Res<Worker<'a>> {
        let nranks = comms.first().map_or(1, |(c, _)| c.count());
        let bytes = args.maxbytes + args.unalign * 8;
        let device = setup.device;
        let ranks = comms
            .into_iter()
            .map(|(comm, books)| {
                let stream = match device {
                    None => None,
                    // -y: every rank on the default stream.
                    Some(device) if args.stream_null != 0 => Some(device.stream(0)),
                    Some(device) => Some(device.create_stream()),
                }
                .transpose()
                .map_err(|e| format!("{}: cannot create a stream: {e}", hostname()))?;
                Ok(Rank {
                    comm,
                    books,
                    stream,
                    send: Buffer::new(bytes, device)?,
                    recv: Buffer::new(bytes, device)?,
                })
            })
            .collect::<Res<Vec<Rank>>>()?;
        Ok(Worker {
            coll,
            args,
            ranks,
            main,
            nranks,
            errors: 0,
            bw_sum: 0.0,
            bw_count: 0,
            rep: 0,
            corrupt: std::env::var(CORRUPT_ENV).is_ok_and(|v| v == "1"),
            device_base,
            json,
            setup,
            row: Map::new(),
            stragglers: Vec::new(),
        })
    }

    fn print(&self, text: &str) {
        if self.main {
            print!("{text}");
            if text.ends_with('\n') {
                let _ = std::io::stdout().flush();
            }
        }
    }

    fn run_all(mut self) -> Res<Outcome> {
        let r = self.run_tests();
        if r.is_err() {
            for rank in &self.ranks {
                rank.comm.abort();
                rank.books.abort();
            }
        }
        r
    }

    fn run_tests(&mut self) -> Res<Outcome> {
        self.device_report()?;
        let header = if self.setup.per_iter {
            format::result_header_per_iter(
                self.args.report_cputime != 0,
                self.args.report_timestamps != 0,
            )
        } else {
            format::result_header(
                self.args.report_cputime != 0,
                self.args.report_timestamps != 0,
            )
        };
        self.print(&header);
        let types: Vec<DataType> = self
            .args
            .datatype
            .0
            .map_or(DataType::ALL.to_vec(), |d| vec![d]);
        let ops: Vec<Option<TestOp>> = if self.coll.uses_op() {
            self.args
                .op
                .0
                .map_or(TestOp::ALL.iter().map(|&o| Some(o)).collect(), |o| {
                    vec![Some(o)]
                })
        } else {
            vec![None]
        };
        let roots: Vec<i32> = if !self.coll.has_root() {
            vec![-1]
        } else if self.args.root < 0 {
            (0..self.nranks as i32).collect()
        } else {
            if self.args.root as usize >= self.nranks {
                return Err(format!(
                    "invalid root {} for {} ranks",
                    self.args.root, self.nranks
                ));
            }
            vec![self.args.root]
        };
        match self.coll.supports(self.nranks) {
            Ok(()) => {
                for &dtype in &types {
                    for &op in &ops {
                        for &root in &roots {
                            self.time_test(dtype, op, root)?;
                        }
                    }
                }
            }
            Err(msg) => self.print(&format!("{msg}\n")),
        }
        self.footer()
    }

    /// "# Using devices": every rank's pid, host and device, gathered
    /// through the communicator to rank 0.
    fn device_report(&mut self) -> Res<()> {
        const REC: usize = 64;
        let n = self.nranks;
        let host = hostname();
        let mut sends: Vec<[u8; REC]> = Vec::new();
        for (i, _) in self.ranks.iter().enumerate() {
            let mut rec = [0u8; REC];
            rec[..4].copy_from_slice(&std::process::id().to_le_bytes());
            rec[4..8].copy_from_slice(&((self.device_base + i) as u32).to_le_bytes());
            let hb = host.as_bytes();
            let len = hb.len().min(REC - 9);
            rec[8..8 + len].copy_from_slice(&hb[..len]);
            sends.push(rec);
        }
        let mut recvs = vec![vec![0u8; REC * n]; self.ranks.len()];
        let multi = self.ranks.len() > 1;
        grouped(multi, || {
            for ((rank, s), r) in self.ranks.iter().zip(&sends).zip(recvs.iter_mut()) {
                // SAFETY: s holds REC bytes and r holds REC * n bytes, both
                // alive until the group ends below.
                unsafe {
                    rank.books.collective_raw(
                        CollCall {
                            kind: CollKind::AllGather,
                            count: REC,
                            dtype: DataType::Uint8,
                            op: RedOp::Sum,
                            root: 0,
                        },
                        s.as_ptr(),
                        r.as_mut_ptr(),
                    )?
                };
            }
            Ok(())
        })
        .map_err(engine_error("ncclAllGather"))?;
        let mut text = String::from("# Using devices\n");
        let (where_, what) = match self.setup.device {
            None => ("[cpu]".to_string(), "host memory"),
            Some(device) => (device.label(), "device memory"),
        };
        let mut devices = Vec::new();
        let mut all_ranks = Vec::new();
        for (rank, rec) in recvs[0].chunks(REC).enumerate() {
            let pid = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
            let dev = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
            let end = rec[8..].iter().position(|&b| b == 0).map_or(REC, |p| 8 + p);
            let host = String::from_utf8_lossy(&rec[8..end]);
            text += &format!("#  Rank {rank:>2} Group {:>2} Pid {pid:>6} on {host:>10} device {dev:>2} {where_} {what}\n", 0);
            // nccl-tests lists one device per process: its first rank's.
            let entry = serde_json::json!({
                "rank": rank, "group": 0, "pid": pid, "hostname": host,
                "device": dev, "device_hex": where_, "device_info": what,
            });
            if rank % self.setup.ranks_per_proc == 0 {
                devices.push(entry.clone());
            }
            all_ranks.push(entry);
        }
        self.print(&text);
        if let Some(doc) = self.json {
            let config = self.json_config(devices, all_ranks);
            lock(doc).set_config(config);
        }
        Ok(())
    }

    /// nccl-tests' `config` object, with rccl-rs' additions under `rccl`.
    fn json_config(&self, devices: Vec<Value>, all_ranks: Vec<Value>) -> Value {
        let a = self.args;
        let mut c = Map::new();
        c.insert("nthreads".into(), a.nthreads.into());
        c.insert("ngpus".into(), a.ngpus.into());
        c.insert("minimum_bytes".into(), a.minbytes.into());
        c.insert("maximum_bytes".into(), a.maxbytes.into());
        if a.stepfactor > 1 {
            c.insert("step_factor".into(), a.stepfactor.into());
        } else {
            c.insert("step_bytes".into(), a.stepbytes.into());
        }
        c.insert("warmup_iters".into(), a.warmup_iters.into());
        c.insert("iterations".into(), a.iters.into());
        c.insert("aggregated_iterations".into(), a.agg_iters.into());
        c.insert("validation".into(), a.check.into());
        c.insert("graph".into(), a.cudagraph.into());
        c.insert(
            "blocking_collectives".into(),
            json::bool_str(a.blocking != 0),
        );
        c.insert(
            "per_iter_timing".into(),
            json::bool_str(self.setup.per_iter),
        );
        c.insert("per_iter_skip".into(), self.setup.skip.into());
        c.insert("parallel_init".into(), json::bool_str(a.parallel_init != 0));
        c.insert("devices".into(), Value::Array(devices));
        let config = self.ranks.first().map(|r| r.comm.config());
        c.insert(
            "rccl".into(),
            serde_json::json!({
                "version": env!("CARGO_PKG_VERSION"),
                "revision": env!("RCCL_BUILD_REVISION"),
                "memory": if self.setup.device.is_some() { "device" } else { "host" },
                "launch": self.setup.launch,
                "nranks": self.nranks,
                "ranks_per_process": self.setup.ranks_per_proc,
                "min_channels": config.map(|c| c.min_channels),
                "max_channels": config.map(|c| c.max_channels),
                "ranks": all_ranks,
            }),
        );
        Value::Object(c)
    }

    /// All-reduces one f64 per thread over every rank (`Sum`, `Min`, `Max`,
    /// or with `None` the value of rank 0). Every rank of the thread
    /// contributes `value` (a sum over ranks is then `ngpus` times the sum
    /// over threads).
    fn allreduce(&mut self, value: f64, op: Option<RedOp>) -> Res<f64> {
        let sends = vec![value; self.ranks.len()];
        self.allreduce_each(&sends, op)
    }

    /// Sums a per-thread count over every thread of every process.
    fn sum_over_threads(&mut self, value: f64) -> Res<f64> {
        let sends: Vec<f64> = (0..self.ranks.len())
            .map(|i| if i == 0 { value } else { 0.0 })
            .collect();
        self.allreduce_each(&sends, Some(RedOp::Sum))
    }

    fn allreduce_each(&mut self, sends: &[f64], op: Option<RedOp>) -> Res<f64> {
        let mut recvs = vec![0f64; self.ranks.len()];
        let multi = self.ranks.len() > 1;
        grouped(multi, || {
            for ((rank, s), r) in self.ranks.iter().zip(sends).zip(recvs.iter_mut()) {
                let (kind, op) = match op {
                    Some(op) => (CollKind::AllReduce, op),
                    None => (CollKind::Broadcast, RedOp::Sum),
                };
                // SAFETY: one f64 each, alive until the group ends.
                unsafe {
                    rank.books.collective_raw(
                        CollCall {
                            kind,
                            count: 1,
                            dtype: DataType::Float64,
                            op,
                            root: 0,
                        },
                        (s as *const f64).cast(),
                        (r as *mut f64).cast(),
                    )?
                };
            }
            Ok(())
        })
        .map_err(engine_error("stats all-reduce"))?;
        Ok(recvs[0])
    }

    /// Waits for every rank's work to complete (on device memory, its
    /// stream), then for every other thread and process.
    fn barrier(&mut self) -> Res<()> {
        self.complete()?;
        self.allreduce(0.0, Some(RedOp::Sum)).map(|_| ())
    }

    /// Waits for the work queued on this thread's ranks' streams (nothing
    /// to wait for on host memory, whose calls complete before they
    /// return).
    fn complete(&self) -> Res<()> {
        for rank in &self.ranks {
            rank.complete()
                .map_err(engine_error(self.coll.program_name()))?;
        }
        Ok(())
    }

    /// Writes `bytes` at `dst` in this run's memory.
    fn write_mem(&self, dst: *mut u8, bytes: &[u8]) {
        match self.setup.device {
            // SAFETY: the callers pass a range inside one of the buffers,
            // with no work in flight on it.
            Some(device) => unsafe { device.copy(dst, bytes.as_ptr(), bytes.len()) }
                .expect("a copy inside a device buffer"),
            // SAFETY: as above.
            None => unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) },
        }
    }

    /// Reads `len` bytes at `src` in this run's memory.
    fn read_mem(&self, src: *const u8, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        match self.setup.device {
            // SAFETY: the callers pass a range inside one of the buffers,
            // with no work in flight on it.
            Some(device) => unsafe { device.copy(out.as_mut_ptr(), src, len) }
                .expect("a copy inside a device buffer"),
            // SAFETY: as above.
            None => unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) },
        }
        out
    }

    fn setup(&self, size: usize, dtype: DataType) -> Setup {
        let elt = dtype.size();
        let counts = self.coll.counts(size / elt, elt, self.nranks);
        let total = counts.send.max(counts.recv) * elt;
        let steps = self.args.maxbytes.checked_div(total).unwrap_or(1).max(1);
        Setup {
            dtype,
            counts,
            steps,
        }
    }

    /// Send and receive pointers of rank `i` at buffer rotation `iter`.
    fn pointers(
        &mut self,
        i: usize,
        st: &Setup,
        in_place: bool,
        iter: usize,
    ) -> (*mut u8, *mut u8) {
        let elt = st.dtype.size();
        let shift = st.total_bytes() * (iter % st.steps) + self.args.unalign * elt;
        let rank = &mut self.ranks[i];
        let r = rank.comm.rank();
        // SAFETY: (all adds below) shift + the call's extent stays inside
        // the maxbytes (+ unalign) each buffer holds: steps * total <=
        // maxbytes, and the in-place offsets stay inside recv's total.
        unsafe {
            let recv = rank.recv.ptr().add(shift);
            if in_place {
                (
                    recv.add(st.counts.send_inplace_offset * elt * r),
                    recv.add(st.counts.recv_inplace_offset * elt * r),
                )
            } else {
                (rank.send.ptr().add(shift), recv)
            }
        }
    }

    /// One operation on every rank of this thread (nccl-tests' startColl).
    fn start_coll(
        &mut self,
        st: &Setup,
        op: Option<TestOp>,
        root: i32,
        in_place: bool,
        iter: usize,
    ) -> Res<()> {
        let phases = self.coll.phases(self.nranks);
        let multi = self.ranks.len() > 1;
        let root = root.max(0) as usize;
        let coll = self.coll;
        let program = coll.program_name();
        for phase in 0..phases {
            grouped(multi, || {
                for i in 0..self.ranks.len() {
                    let (send, recv) = self.pointers(i, st, in_place, iter);
                    let comm = &self.ranks[i].comm;
                    let stream = self.ranks[i].stream.as_deref();
                    let red = op.unwrap_or(TestOp::Sum).red_op(st.dtype, comm.rank());
                    // SAFETY: pointers() keeps both inside this rank's
                    // buffers for the call's counts; they stay alive (self
                    // is borrowed) until the group ends.
                    unsafe {
                        coll.issue(
                            stream,
                            comm,
                            send,
                            recv,
                            st.counts.param,
                            st.dtype,
                            red,
                            root,
                            phase,
                        )?
                    };
                }
                Ok(())
            })
            .map_err(engine_error(program))?;
        }
        Ok(())
    }

    fn pattern(&self, st: &Setup, op: Option<TestOp>, seed: usize) -> Pattern {
        let op = if self.coll.reduces() { op } else { None };
        Pattern::new(st.dtype, op, self.nranks, seed)
    }

    /// Fills every rank's input and clears its output region.
    fn init_data(
        &mut self,
        st: &Setup,
        op: Option<TestOp>,
        root: i32,
        in_place: bool,
        seed: usize,
    ) {
        let pat = self.pattern(st, op, seed);
        let elt = st.dtype.size();
        let root = root.max(0) as usize;
        for i in 0..self.ranks.len() {
            // recv and send are valid for their counts (pointers()); the
            // send region is written last (in place, it lies inside recv).
            let (send, recv) = self.pointers(i, st, in_place, 0);
            let r = self.ranks[i].comm.rank();
            self.write_mem(recv, &vec![0u8; st.counts.recv * elt]);
            if self.coll.sends(r, root) {
                let mut out = vec![0u8; st.counts.send * elt];
                for (j, chunk) in out.chunks_exact_mut(elt).enumerate() {
                    super::codec::encode(st.dtype, self.coll.input(&pat, r, j), chunk);
                }
                self.write_mem(send, &out);
            }
        }
    }

    /// Wrong elements over this thread's ranks.
    fn check_data(
        &mut self,
        st: &Setup,
        op: Option<TestOp>,
        root: i32,
        in_place: bool,
        seed: usize,
    ) -> u64 {
        let pat = self.pattern(st, op, seed);
        let elt = st.dtype.size();
        let root = root.max(0) as usize;
        let mut wrong = 0;
        for i in 0..self.ranks.len() {
            let (_, recv) = self.pointers(i, st, in_place, 0);
            let r = self.ranks[i].comm.rank();
            if !self.coll.receives(r, root) {
                continue;
            }
            // recv is valid for counts.recv elements; the operation has
            // completed.
            let got = self.read_mem(recv, st.counts.recv * elt);
            for (j, chunk) in got.chunks_exact(elt).enumerate() {
                let want = self.coll.expected(&pat, r, root, st.counts.param.max(1), j);
                if !pat.matches(&want, chunk) {
                    wrong += 1;
                }
            }
        }
        wrong
    }

    /// The test fault: flips a high bit of one output element of the first
    /// checked rank.
    fn corrupt_output(&mut self, st: &Setup, root: i32, in_place: bool) {
        let elt = st.dtype.size();
        let target = if self.coll.has_root() {
            root.max(0) as usize
        } else {
            0
        };
        for i in 0..self.ranks.len() {
            if self.ranks[i].comm.rank() == target && st.counts.recv > 0 {
                let (_, recv) = self.pointers(i, st, in_place, 0);
                // recv holds at least one element.
                let last = recv.wrapping_add(elt - 1);
                let mut byte = self.read_mem(last, 1);
                byte[0] ^= 0x40;
                self.write_mem(last, &byte);
            }
        }
    }

    /// Times and checks one size, out-of-place or in-place (nccl-tests'
    /// BenchTime), printing its half of the row.
    fn bench(&mut self, st: &Setup, op: Option<TestOp>, root: i32, in_place: bool) -> Res<()> {
        let args = self.args;
        if args.check > 0 {
            self.init_data(st, op, root, in_place, TIMING_SEED);
        }
        self.start_coll(st, op, root, in_place, 0)?;
        self.barrier()?;
        let agg = args.agg_iters.max(1);
        let iters = args.iters.max(1);
        let agg_group = self.coll.phases(self.nranks) == 1 && agg > 1 && args.blocking != 1;
        let record = self.setup.per_iter;
        let mut iter_times: Vec<f64> = Vec::with_capacity(if record { args.iters } else { 0 });
        let start = Instant::now();
        let mut coll_only = 0.0;
        // Per-iteration clock readings only where they are used: at the
        // smallest sizes two readings cost a sizeable share of a call.
        let timed = record || args.blocking == 3;
        for iter in 0..args.iters {
            let t0 = timed.then(Instant::now);
            if agg_group {
                rccl::group_start();
            }
            let mut r = Ok(());
            for a in 0..agg {
                r = self.start_coll(st, op, root, in_place, iter * agg + a);
                if r.is_err() {
                    break;
                }
                if args.blocking == 1 {
                    r = self.barrier();
                }
            }
            if agg_group {
                let end = rccl::group_end().map_err(engine_error(self.coll.program_name()));
                r = r.and(end);
            }
            r?;
            if timed {
                self.complete()?;
            }
            if let Some(t0) = t0 {
                let took = t0.elapsed().as_secs_f64();
                if record {
                    iter_times.push(took / agg as f64);
                }
                if args.blocking == 3 {
                    coll_only += took;
                    self.barrier()?;
                }
            }
        }
        self.complete()?;
        let elapsed = if args.blocking == 3 {
            coll_only
        } else {
            start.elapsed().as_secs_f64()
        };
        let local = elapsed / (iters * agg) as f64;
        let delta = match args.average {
            0 => self.allreduce(local, None)?,
            2 => self.allreduce(local, Some(RedOp::Min))?,
            3 => self.allreduce(local, Some(RedOp::Max))?,
            _ => self.allreduce(local, Some(RedOp::Sum))? / self.nranks as f64,
        };
        let (algbw, busbw) =
            self.coll
                .bandwidth(st.counts.param, st.dtype.size(), delta, self.nranks);
        // Every rank's own time (and per-iteration times with -I 1), for
        // the JSON file, the -I columns and --stragglers.
        let spread = if self.setup.gather {
            let mut mine = vec![local];
            mine.extend_from_slice(&iter_times);
            Some(self.gather_f64(&mine)?)
        } else {
            None
        };
        self.barrier()?;

        let report = args.check > 0 && (!in_place || self.coll.checks_in_place());
        let mut wrong = 0u64;
        for _ in 0..args.check {
            self.rep += 1;
            let seed = self.rep;
            self.init_data(st, op, root, in_place, seed);
            self.start_coll(st, op, root, in_place, 0)?;
            self.complete()?;
            if self.corrupt {
                self.corrupt_output(st, root, in_place);
            }
            let local = self.check_data(st, op, root, in_place, seed);
            wrong = self.sum_over_threads(local as f64)? as u64;
            if wrong > 0 {
                break;
            }
        }
        let mut text = format::row_body(delta * 1e6, algbw, busbw, report.then_some(wrong));
        let half = if in_place { "in_place" } else { "out_of_place" };
        if self.main && self.json.is_some() {
            let mut h = Map::new();
            let time_key = if args.report_cputime != 0 {
                "cpu_time"
            } else {
                "time"
            };
            h.insert(time_key.into(), json::num(delta * 1e6));
            h.insert("alg_bw".into(), json::num(algbw));
            h.insert("bus_bw".into(), json::num(busbw));
            h.insert(
                "nwrong".into(),
                if report {
                    json::num(wrong as f64)
                } else {
                    Value::Null
                },
            );
            self.row.insert(half.into(), Value::Object(h));
        }
        if let (true, Some(all)) = (self.main, spread.as_ref()) {
            let n = self.nranks;
            let width = 1 + iter_times.len();
            let rank_times: Vec<f64> = (0..n).map(|r| all[r * width]).collect();
            if record && !iter_times.is_empty() {
                let rpp = self.setup.ranks_per_proc.max(1);
                let process_rows: Vec<Vec<f64>> = (0..n / rpp)
                    .map(|p| {
                        (0..iter_times.len())
                            .map(|i| {
                                (p * rpp..(p + 1) * rpp)
                                    .map(|r| all[r * width + 1 + i])
                                    .fold(0.0, f64::max)
                            })
                            .collect()
                    })
                    .collect();
                let times: Vec<f64> = (0..iter_times.len())
                    .map(|i| process_rows.iter().map(|row| row[i]).fold(0.0, f64::max))
                    .collect();
                let skip = self.setup.skip.min(times.len() - 1);
                let stats = IterStats::of(&times[skip..]);
                text += &format!(
                    "  {:>7}  {:>7}  {:>7}  {:>7}",
                    format::float_str(stats.min * 1e6, 7),
                    format::float_str(stats.max * 1e6, 7),
                    format::float_str(stats.p99 * 1e6, 7),
                    format::float_str(stats.cv_pct(), 7)
                );
                if self.json.is_some() {
                    self.row.insert(
                        format!("{half}_per_iter"),
                        json::per_iter_object(&times, skip, &process_rows),
                    );
                }
            }
            let (fast, slow) = extremes(&rank_times);
            let (tmin, tmax) = (rank_times[fast], rank_times[slow]);
            if self.json.is_some() {
                let extra = self
                    .row
                    .entry("rccl")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = extra {
                    m.insert(
                        half.into(),
                        serde_json::json!({
                            "rank_time_us": rank_times.iter().map(|t| json::num(t * 1e6)).collect::<Vec<_>>(),
                            "min_rank_time_us": json::num(tmin * 1e6),
                            "max_rank_time_us": json::num(tmax * 1e6),
                            "fastest_rank": fast,
                            "slowest_rank": slow,
                        }),
                    );
                }
            }
            if args.stragglers {
                let pct = if tmin > 0.0 {
                    (tmax - tmin) / tmin * 100.0
                } else {
                    0.0
                };
                self.stragglers.push(format!(
                    "{}: min {:.2} us (rank {fast})  max {:.2} us (rank {slow})  spread {pct:.1}%",
                    if in_place { "in-place" } else { "out-of-place" },
                    tmin * 1e6,
                    tmax * 1e6,
                ));
            }
        }
        if in_place && args.report_timestamps != 0 {
            text += &format!("{:>21}", format::now_string());
        }
        self.print(&text);
        if report && wrong > 0 {
            self.errors += 1;
        }
        self.bw_sum += busbw;
        self.bw_count += 1;
        Ok(())
    }

    /// All-gathers `values` (the same length on every rank; every rank of
    /// this thread contributes the same values) into rank order.
    fn gather_f64(&mut self, values: &[f64]) -> Res<Vec<f64>> {
        let len = values.len();
        let mut recvs = vec![vec![0f64; len * self.nranks]; self.ranks.len()];
        let multi = self.ranks.len() > 1;
        grouped(multi, || {
            for (rank, r) in self.ranks.iter().zip(recvs.iter_mut()) {
                // SAFETY: values holds len f64 and r holds len * nranks, both
                // alive until the group ends.
                unsafe {
                    rank.books.collective_raw(
                        CollCall {
                            kind: CollKind::AllGather,
                            count: len,
                            dtype: DataType::Float64,
                            op: RedOp::Sum,
                            root: 0,
                        },
                        values.as_ptr().cast(),
                        r.as_mut_ptr().cast(),
                    )?
                };
            }
            Ok(())
        })
        .map_err(engine_error("per-rank times all-gather"))?;
        Ok(recvs.swap_remove(0))
    }

    /// What the tuner picks for this call on the first rank of this
    /// thread: algorithm, protocol and channels, out-of-place and in-place
    /// (the tuner may pick differently for an in-place call).
    fn tuning_json(&self, st: &Setup, root: i32) -> Value {
        let Some(first) = self.ranks.first() else {
            return Value::Null;
        };
        let comm = &first.comm;
        let elt = st.dtype.size();
        let kind = match self.coll {
            Coll::AllReduce => Some(CollKind::AllReduce),
            Coll::AllGather => Some(CollKind::AllGather),
            Coll::Broadcast => Some(CollKind::Broadcast),
            Coll::Reduce => Some(CollKind::Reduce),
            Coll::ReduceScatter => Some(CollKind::ReduceScatter),
            Coll::AllToAll => Some(CollKind::AllToAll),
            Coll::Gather => Some(CollKind::Gather),
            Coll::Scatter => Some(CollKind::Scatter),
            Coll::SendRecv | Coll::HyperCube => None,
        };
        let pick = |in_place: bool| -> Value {
            let (algorithm, protocol, channels) = match kind {
                Some(kind) => {
                    match comm.tuning_choice(
                        kind,
                        st.counts.param,
                        elt,
                        root.max(0) as usize,
                        in_place,
                    ) {
                        Ok(c) => (c.algorithm.name(), c.protocol.name(), c.params.nchannels),
                        Err(e) => return serde_json::json!({ "error": e.to_string() }),
                    }
                }
                None => {
                    // Sends and receives: the largest message of one call.
                    let largest = match self.coll {
                        Coll::HyperCube => st.counts.param * (self.nranks / 2).max(1),
                        _ => st.counts.param,
                    };
                    let (channels, protocol) =
                        rccl::tuning::p2p_choice(comm.config(), largest * elt, comm.rails());
                    ("p2p", protocol.name(), channels)
                }
            };
            serde_json::json!({
                "algorithm": algorithm,
                "protocol": protocol,
                "channels": channels,
            })
        };
        let (out, inp) = (pick(false), pick(true));
        let mut m = Map::new();
        if let Value::Object(o) = &out {
            m.extend(o.clone());
        }
        if inp != out {
            m.insert("in_place_choice".into(), inp);
        }
        Value::Object(m)
    }

    /// The size sweep for one type, op and root (nccl-tests' TimeTest).
    fn time_test(&mut self, dtype: DataType, op: Option<TestOp>, root: i32) -> Res<()> {
        let args = self.args;
        self.barrier()?;
        // Warm-up for every size, doubling.
        let mut size = args.minbytes;
        while size <= args.maxbytes {
            let st = self.setup(size, dtype);
            for iter in 0..args.warmup_iters {
                self.start_coll(&st, op, root, false, iter)?;
            }
            self.complete()?;
            if size == 0 {
                break;
            }
            size *= 2;
        }
        let op_name = match op {
            Some(o) => o.name(),
            None => self.coll.fixed_op_name(),
        };
        let mut cycles = args.run_cycles;
        loop {
            let mut size = args.minbytes;
            while size <= args.maxbytes {
                let st = self.setup(size, dtype);
                self.print(&format::row_preamble(
                    st.total_bytes(),
                    st.counts.param,
                    dtype.name(),
                    op_name,
                    root,
                ));
                self.row = Map::new();
                self.stragglers.clear();
                if self.main && self.json.is_some() {
                    self.row.insert("size".into(), st.total_bytes().into());
                    self.row.insert("count".into(), st.counts.param.into());
                    self.row.insert("type".into(), dtype.name().into());
                    self.row.insert("redop".into(), op_name.into());
                    self.row.insert("root".into(), format!("{root:>6}").into());
                }
                self.bench(&st, op, root, false)?;
                self.bench(&st, op, root, true)?;
                self.print("\n");
                if !self.stragglers.is_empty() {
                    self.print(&format!(
                        "#  stragglers  {}\n",
                        self.stragglers.join("  |  ")
                    ));
                }
                if let (true, Some(doc)) = (self.main, self.json) {
                    let mut row = std::mem::take(&mut self.row);
                    row.insert("actual_iterations".into(), args.iters.into());
                    row.insert("experiment_name".into(), "".into());
                    let tuning = self.tuning_json(&st, root);
                    let extra = row
                        .entry("rccl")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let (Value::Object(m), Value::Object(t)) = (extra, tuning) {
                        // The tuner's choice first, then the per-rank times.
                        let times = std::mem::take(m);
                        m.extend(t);
                        m.extend(times);
                    }
                    lock(doc).results.push(Value::Object(row));
                }
                let next = if args.stepfactor > 1 {
                    size * args.stepfactor
                } else {
                    size + args.stepbytes
                };
                if next == size {
                    break;
                }
                size = next;
            }
            if cycles == 1 {
                break;
            }
            cycles = cycles
                .saturating_sub(1)
                .max(if cycles == 0 { 0 } else { 1 });
        }
        Ok(())
    }

    fn footer(&mut self) -> Res<Outcome> {
        // Errors are counted per thread, then summed over threads and
        // processes, as nccl-tests does.
        let errors = self.sum_over_threads(self.errors as f64)? as u64;
        let bw = if self.bw_count > 0 {
            self.bw_sum / self.bw_count as f64
        } else {
            0.0
        };
        let min_bw: Option<f64> = std::env::var("NCCL_TESTS_MIN_BW")
            .ok()
            .and_then(|v| v.trim().parse().ok());
        let bw_fail = min_bw.is_some_and(|m| bw < m * 0.9);
        if let (true, Some(doc)) = (self.main, self.json) {
            lock(doc).set_footer(errors, bw, min_bw);
        }
        let mut text = format!(
            "# {:<20} : {} {}\n",
            "Out of bounds values",
            errors,
            if errors > 0 { "FAILED" } else { "OK" }
        );
        let verdict = match min_bw {
            None => "",
            Some(_) if bw_fail => "FAILED",
            Some(_) => "OK",
        };
        text += &format!(
            "# {:<20} : {} {}\n",
            "Avg bus bandwidth",
            format::c_g(bw),
            verdict
        );
        text += "#\n";
        text += &format!(
            "# Collective test concluded: {}\n",
            self.coll.program_name()
        );
        text += "#\n\n";
        self.print(&text);
        // The communicators are destroyed when the worker drops them
        // (Communicator::finalize is a blocking barrier per communicator, so
        // one thread cannot finalize several of them).
        Ok(Outcome {
            ok: errors == 0 && !bw_fail,
        })
    }
}
