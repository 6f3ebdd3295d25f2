//! How the ranks of a perf run come to be: threads of this process,
//! processes started by a launcher (torchrun, Slurm, mpirun / mpiexec)
//! that join through environment variables or through MPI, or processes
//! this binary starts itself (`--procs N`).

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use rccl::{Communicator, Config};

/// How ranks are laid out.
pub enum Launch {
    /// Every rank a thread of this process: -t threads of -g ranks.
    Threads,
    /// One rank per process, joining through `NCCL_COMM_ID` or
    /// `MASTER_ADDR`/`MASTER_PORT`.
    Env {
        /// This process's rank.
        rank: usize,
        /// Ranks (processes) in all.
        nranks: usize,
        /// This process's index among those of its host.
        local_rank: usize,
    },
    /// One rank per process under mpirun / mpiexec, joining through an id
    /// that rank 0 broadcasts with MPI (the `mpi` feature).
    Mpi {
        /// This process's rank.
        rank: usize,
        /// Ranks (processes) in all.
        nranks: usize,
        /// This process's index among those of its host.
        local_rank: usize,
    },
}

impl Launch {
    /// The launch this process is in, from its environment. A launcher's
    /// variable that names no rank of the job is refused (running alone
    /// would leave the job's real ranks waiting for this one).
    pub fn detect() -> Result<Launch, String> {
        let refused = |reason: String| format!("refusing to start: {reason}");
        let launcher = rccl::launcher_rank_from_env().map_err(|e| refused(e.to_string()))?;
        let (rank, nranks) = match launcher {
            Some((rank, nranks)) if nranks > 1 => (rank, nranks),
            _ => return Ok(Launch::Threads),
        };
        let local_rank = local_rank_from_env(nranks).map_err(refused)?;
        let has_address =
            std::env::var_os("NCCL_COMM_ID").is_some() || std::env::var_os("MASTER_ADDR").is_some();
        Ok(if cfg!(feature = "mpi") && !has_address && under_mpi() {
            Launch::Mpi {
                rank,
                nranks,
                local_rank,
            }
        } else {
            Launch::Env {
                rank,
                nranks,
                local_rank,
            }
        })
    }

    /// A word for the JSON file: "threads", "env" or "mpi".
    pub fn name(&self) -> &'static str {
        match self {
            Launch::Threads => "threads",
            Launch::Env { .. } => "env",
            Launch::Mpi { .. } => "mpi",
        }
    }
}

/// Whether an MPI launcher started this process (OpenMPI's or PMIx's
/// variables, or MPICH Hydra's `PMI_SIZE`).
fn under_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// This process's index among the processes of its host, from the first
/// launcher variable set (0 without one), in a job of `nranks` ranks; a
/// value that is not a number below `nranks` is an error naming it.
fn local_rank_from_env(nranks: usize) -> Result<usize, String> {
    let Some((name, text)) = [
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ]
    .into_iter()
    .find_map(|name| Some((name, std::env::var(name).ok()?))) else {
        return Ok(0);
    };
    match text.trim().parse::<usize>() {
        Ok(local) if local < nranks => Ok(local),
        Ok(local) => Err(format!(
            "{name}={local} is out of range for a job of {nranks} ranks"
        )),
        Err(_) => Err(format!(
            "{name}={text:?} is not a local rank (a whole number from 0)"
        )),
    }
}

/// What keeps MPI initialized (finalized when dropped).
pub struct MpiSession {
    #[cfg(feature = "mpi")]
    _universe: mpi::environment::Universe,
}

/// Joins this process's communicator for a [`Launch::Env`] or
/// [`Launch::Mpi`] launch, with the settings `config`.
pub fn join(launch: &Launch, config: Config) -> Result<(Communicator, Option<MpiSession>), String> {
    let engine = |what: &'static str| super::format::engine_error(what);
    match *launch {
        Launch::Threads => Err("join: not a process launch".into()),
        Launch::Env { .. } => Ok((
            Communicator::from_env_config(config).map_err(engine("ncclCommInitRank"))?,
            None,
        )),
        Launch::Mpi { rank, nranks, .. } => join_mpi(rank, nranks, config),
    }
}

#[cfg(feature = "mpi")]
fn join_mpi(
    env_rank: usize,
    env_nranks: usize,
    config: Config,
) -> Result<(Communicator, Option<MpiSession>), String> {
    use mpi::traits::{Communicator as _, Root as _};
    let universe = mpi::initialize().ok_or("MPI_Init failed (was MPI already initialized?)")?;
    let world = universe.world();
    let (rank, nranks) = (world.rank() as usize, world.size() as usize);
    if (rank, nranks) != (env_rank, env_nranks) {
        return Err(format!(
            "MPI says rank {rank} of {nranks}, the launcher's variables rank {env_rank} of {env_nranks}: \
             was this binary built against the MPI of this mpirun/mpiexec (MPICC)?"
        ));
    }
    // Rank 0 makes the id and broadcasts its 128 bytes; if it cannot, it
    // broadcasts zeros so the other ranks fail instead of waiting.
    let mut bytes = [0u8; 128];
    let mut made = Ok(());
    if rank == 0 {
        match rccl::UniqueId::new() {
            Ok(id) => bytes = id.0,
            Err(e) => made = Err(e),
        }
    }
    world.process_at_rank(0).broadcast_into(&mut bytes[..]);
    made.map_err(super::format::engine_error("ncclGetUniqueId"))?;
    if bytes.iter().all(|&b| b == 0) {
        return Err("rank 0 could not create the unique id".into());
    }
    let comm = Communicator::init_rank_config(nranks, &rccl::UniqueId(bytes), rank, config)
        .map_err(super::format::engine_error("ncclCommInitRank"))?;
    Ok((
        comm,
        Some(MpiSession {
            _universe: universe,
        }),
    ))
}

#[cfg(not(feature = "mpi"))]
fn join_mpi(
    _rank: usize,
    _nranks: usize,
    _config: Config,
) -> Result<(Communicator, Option<MpiSession>), String> {
    // Launch::detect only picks Mpi with the feature.
    Err("this build has no MPI support (build with --features mpi)".into())
}

/// Random hex for the children's `NCCL_COMM_SECRET`.
fn random_hex() -> String {
    let mut buf = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .is_ok();
    if !ok {
        let t = Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id());
        buf.copy_from_slice(&t.to_le_bytes());
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The CPUs this process may run on.
fn allowed_cores() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set, and
    // sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this process; `set` is a valid out-pointer.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` was filled by sched_getaffinity; the index is in range.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Restricts process `pid` (and the threads it starts later) to `core`;
/// failure only costs stable timings, so it is reported and ignored.
fn bind_to_core(pid: u32, core: usize) {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; CPU_SET writes
    // inside it for core < CPU_SETSIZE (cores come from allowed_cores).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe {
        libc::sched_setaffinity(
            pid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
    if rc != 0 {
        eprintln!(
            "--procs: could not bind rank process {pid} to core {core}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// `--procs N`: starts N copies of this program with this command line,
/// as ranks 0..N on 127.0.0.1 (torchrun's variables), and waits for them.
/// Rank 0 prints the results; the exit status is the worst child's.
pub fn spawn_local(nprocs: usize) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("--procs: cannot find this program: {e}");
            return ExitCode::from(2);
        }
    };
    let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => {
            eprintln!("--procs: no free port on 127.0.0.1: {e}");
            return ExitCode::from(2);
        }
    };
    let secret = std::env::var("NCCL_COMM_SECRET").unwrap_or_else(|_| random_hex());
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let cores = allowed_cores();
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..nprocs {
        let mut cmd = Command::new(&exe);
        cmd.args(&args);
        for var in [
            "NCCL_COMM_ID",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_RANK",
            "PMI_SIZE",
            "PMIX_RANK",
            "SLURM_PROCID",
            "SLURM_NTASKS",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", nprocs.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", nprocs.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("NCCL_COMM_SECRET", &secret);
        match cmd.spawn() {
            Ok(c) => {
                // Like mpirun, bind each rank to a core of its own when
                // there are enough: unbound, two ranks on two cores were
                // often scheduled onto one and ran up to 3x slower.
                if nprocs <= cores.len() {
                    bind_to_core(c.id(), cores[rank]);
                }
                children.push(c)
            }
            Err(e) => {
                eprintln!("--procs: starting rank {rank}: {e}");
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return ExitCode::from(2);
            }
        }
    }
    // Wait for every child; once one fails, give the others a grace
    // period to report and exit, then stop them.
    let mut status: Vec<Option<i32>> = vec![None; nprocs];
    let mut failed_at: Option<Instant> = None;
    while status.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if status[i].is_some() {
                continue;
            }
            if let Ok(Some(s)) = c.try_wait() {
                let code = s.code().unwrap_or(2);
                status[i] = Some(code);
                if code != 0 && failed_at.is_none() {
                    failed_at = Some(Instant::now());
                }
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(10)) {
            for (i, c) in children.iter_mut().enumerate() {
                if status[i].is_none() {
                    eprintln!("--procs: stopping rank {i} after another rank failed");
                    let _ = c.kill();
                    let _ = c.wait();
                    status[i] = Some(2);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let worst = status.iter().flatten().copied().max().unwrap_or(0);
    ExitCode::from(worst.clamp(0, 255) as u8)
}
