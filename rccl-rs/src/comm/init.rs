//! Joining a communicator: as one rank of a unique id's communicator
//! (`ncclCommInitRank`), as every rank of one process (`ncclCommInitAll`),
//! or as the environment describes it. Every rank tells the others what it
//! is (its address, host, process, NICs and the settings that must agree),
//! and from that each builds the same placement: hosts, rails, channels
//! and the network transport.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rccl_algorithms::Topology;
use rccl_transports::network::SocketDevice;
use rccl_transports::network::{self, NetInit};
use rccl_transports::ProcessId;
use rccl_transports::Transport;

use super::choices::ChoiceCache;
use super::report::{register, Activity};
use super::state::ExecState;
use super::wire::{settings_shape, PeerInfo};
use super::{hash_of, CommInner, Communicator};
use crate::bootstrap::{Bootstrap, UniqueId};
use crate::config::{Config, MAX_CHANNELS};
use crate::error::{Error, Result};
use crate::job::{rank_from_env, rendezvous_address};
use crate::net::Nic;

impl Communicator {
    /// Joins the communicator of `nranks` ranks named by `id` as `rank`
    /// (`ncclCommInitRank`), with settings from the environment.
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize) -> Result<Communicator> {
        Communicator::init_rank_config(nranks, id, rank, Config::from_env()?)
    }

    /// As [`Communicator::init_rank`], with explicit settings
    /// (`ncclCommInitRankConfig`).
    pub fn init_rank_config(
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: Config,
    ) -> Result<Communicator> {
        Communicator::init_rank_aborted_by(nranks, id, rank, config, Arc::default())
    }

    /// As [`Communicator::init_rank_config`]; setting `abort` stops the
    /// init (and, once made, aborts the communicator).
    fn init_rank_aborted_by(
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        mut config: Config,
        abort: Arc<AtomicBool>,
    ) -> Result<Communicator> {
        check_rank(nranks, rank)?;
        config.validate()?;
        set_up_process(&config)?;
        let bootstrap = Bootstrap::init(id, rank, nranks, config.timeout, abort.clone())?;
        let (me, peers) = exchange_peer_info(&bootstrap, rank, &config)?;
        // Every rank uses as many rails as the host with the fewest NICs
        // has, so channel c's rail is the same everywhere.
        let rails = peers.iter().map(|p| p.nics.len()).min().unwrap_or(1).max(1);
        let rail_nics = &me.nics[..rails.min(me.nics.len())];
        spread_channels_over_rails(&mut config, rails);
        let mut link_model = crate::tuning::LinkModel::from_env();
        if let Some(slowest) = rail_nics
            .iter()
            .map(|nic| f64::from(nic.speed_mbps) / 8e3)
            .reduce(f64::min)
        {
            link_model.net_bandwidth_gbs = link_model.net_bandwidth_gbs.min(slowest);
        }
        let net = network_transport(&bootstrap, rank, rail_nics, &config)?;
        let all_shm =
            (0..nranks).all(|peer| !config.shm_disable && peers[peer].host_id == me.host_id);
        let topology = topology_of(&peers);
        let tuner = crate::plugins::tuner::open(nranks, topology.hosts(), hash_of(&bootstrap));
        let profiler = crate::plugins::profiler::open(
            hash_of(&bootstrap),
            topology.hosts().len(),
            nranks,
            rank,
        );
        let exec = unconnected(config.max_channels, nranks);
        let processes = visible_processes(&peers, &me);
        let memory = crate::memory::Ledger::new(rank, config.max_mem_bytes);
        let inner = Arc::new(CommInner {
            rank,
            memory,
            suspended: AtomicBool::new(false),
            resumes: AtomicU64::new(0),
            nranks,
            config,
            bootstrap,
            net,
            peers,
            processes,
            process_gone_since: Mutex::default(),
            abort,
            ended: std::sync::OnceLock::new(),
            poisoned: std::sync::OnceLock::new(),
            device_work_reaches_all: std::sync::OnceLock::new(),
            next_seq: AtomicU64::new(0),
            next_p2p_seq: AtomicU64::new(0),
            all_shm,
            topology,
            rails,
            exec: Mutex::new(exec),
            activity: Mutex::new(Activity::default()),
            heard: Mutex::default(),
            splits: AtomicU64::new(0),
            link_model,
            choices: Mutex::new(ChoiceCache::default()),
            queued: crate::queue::Queued::default(),
            one_sided_queued: Arc::default(),
            tuner,
            profiler,
            one_sided: Mutex::default(),
            symmetric_calls: AtomicU64::new(0),
        });
        register(&inner);
        let local_ranks = inner
            .topology
            .local_ranks(inner.topology.host_of(inner.rank))
            .len();
        if local_ranks > host_cpus() {
            rccl_transports::spin_before_yielding(std::time::Duration::ZERO);
        }
        inner.log_init();
        Ok(Communicator { inner })
    }

    /// Creates `nranks` communicators of one process, one per rank
    /// (`ncclCommInitAll`); drive each from its own thread, or several from
    /// one thread inside a group.
    pub fn init_all(nranks: usize) -> Result<Vec<Communicator>> {
        Communicator::init_all_config(nranks, Config::from_env()?)
    }

    /// As [`Communicator::init_all`], with explicit settings.
    pub fn init_all_config(nranks: usize, config: Config) -> Result<Vec<Communicator>> {
        if nranks == 0 {
            return Err(Error::InvalidArgument("nranks must be at least 1".into()));
        }
        let id = UniqueId::new()?;
        // The first rank to fail stops the others, which would otherwise
        // wait for it until the timeout, and its error is the one returned.
        let aborts: Vec<Arc<AtomicBool>> = (0..nranks).map(|_| Arc::default()).collect();
        let first_failure = Mutex::new(None);
        let comms = std::thread::scope(|s| {
            let handles: Vec<_> = (0..nranks)
                .map(|rank| {
                    let (id, config, aborts, first_failure) =
                        (&id, config.clone(), &aborts, &first_failure);
                    s.spawn(move || {
                        let abort = aborts[rank].clone();
                        let made =
                            Communicator::init_rank_aborted_by(nranks, id, rank, config, abort);
                        if let Err(err) = &made {
                            // A rank that failed because a peer did (a
                            // remote error) records later: the peer's own
                            // error, which its thread records only after
                            // its connections closed, is the cause.
                            if matches!(err, Error::Remote(_)) {
                                std::thread::sleep(CAUSE_FIRST);
                            }
                            first_failure.lock().get_or_insert_with(|| err.clone());
                            for abort in aborts {
                                abort.store(true, Ordering::SeqCst);
                            }
                        }
                        made
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Internal("init thread panicked".into())))
                })
                .collect::<Result<Vec<_>>>()
        });
        match first_failure.into_inner() {
            Some(err) => Err(err),
            None => comms,
        }
    }

    /// Joins the communicator described by the environment:
    /// `NCCL_COMM_ID=host:port` with `RANK`/`WORLD_SIZE` (or the torchrun
    /// variables `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`). Rank 0
    /// serves the rendezvous at that address (under torchrun, whose agent
    /// serves its own store on `MASTER_PORT`, at the port after it). The
    /// ranks authenticate with a secret from `NCCL_COMM_SECRET` or the
    /// user's key file and the launcher's job name
    /// ([`UniqueId::from_address`]).
    pub fn from_env() -> Result<Communicator> {
        Communicator::from_env_config(Config::from_env()?)
    }

    /// As [`Communicator::from_env`], with explicit settings: the launch
    /// still comes from the environment, the communicator's settings from
    /// `config` (a program's own switches over the `NCCL_*` variables).
    pub fn from_env_config(config: Config) -> Result<Communicator> {
        let (rank, nranks) = rank_from_env()?;
        let id = UniqueId::from_address(&rendezvous_address()?)?;
        if rank == 0 {
            id.serve_root()?;
        }
        Communicator::init_rank_config(nranks, &id, rank, config)
    }
}

/// Refuses a rank outside the communicator.
fn check_rank(nranks: usize, rank: usize) -> Result<()> {
    if nranks == 0 {
        return Err(Error::InvalidArgument("nranks must be at least 1".into()));
    }
    if rank >= nranks {
        return Err(Error::InvalidArgument(format!(
            "rank {rank} is out of range for {nranks} ranks"
        )));
    }
    Ok(())
}

/// What the process sets up once the settings are known: logging, the
/// tuner's schedule files, and hang reports on a signal.
fn set_up_process(config: &Config) -> Result<()> {
    crate::debug::init();
    crate::tuning::register_schedule_files_from_env()?;
    crate::tuning::check_algorithm_names(&config.algo)?;
    super::signal::install_from_env()
}

/// This rank's init information and every rank's, as each sent it;
/// settings that must agree across ranks and do not are a usage error.
fn exchange_peer_info(
    bootstrap: &Bootstrap,
    rank: usize,
    config: &Config,
) -> Result<(PeerInfo, Vec<PeerInfo>)> {
    let ip = bootstrap.peer_addr(rank).ip();
    let me = PeerInfo {
        nics: crate::net::host_nics(ip)?,
        data_addr: SocketAddr::new(ip, 0),
        host: crate::net::hostname(),
        host_id: host_id(),
        pid: std::process::id(),
        start: ProcessId::current().map_or(0, |p| p.start),
        shape: settings_shape(config),
    };
    let peers = bootstrap
        .allgather(&me.encode())?
        .iter()
        .enumerate()
        .map(|(r, bytes)| PeerInfo::decode(bytes, r))
        .collect::<Result<Vec<_>>>()?;
    if let Some((r, p)) = peers.iter().enumerate().find(|(_, p)| p.shape != me.shape) {
        return Err(Error::InvalidUsage(format!(
            "rank {rank} and rank {r} disagree on NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE, \
             NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS, NCCL_SHM_DISABLE, NCCL_P2P_DISABLE, \
             NCCL_DETERMINISTIC, NCCL_PROTO, NCCL_ALGO or RCCL_BOARD_BYTES ({:?} against {:?}); \
             set them alike on every rank",
            me.shape, p.shape
        )));
    }
    Ok((me, peers))
}

/// Channels follow the rails unless `NCCL_MAX_NCHANNELS` (or a configured
/// maximum other than the default) says otherwise.
fn spread_channels_over_rails(config: &mut Config, rails: usize) {
    if rccl_env::var("NCCL_MAX_NCHANNELS").is_none()
        && config.max_channels == Config::default().max_channels
    {
        config.max_channels = config.max_channels.max(rails).min(MAX_CHANNELS);
    }
}

/// The transport that connections to other hosts go through, over this
/// rank's rail NICs (`NCCL_NET` chooses among the providers).
fn network_transport(
    bootstrap: &Bootstrap,
    rank: usize,
    rail_nics: &[Nic],
    config: &Config,
) -> Result<Arc<dyn Transport>> {
    let devices = rail_nics
        .iter()
        .map(|nic| SocketDevice {
            name: nic.name.clone(),
            ip: nic.addr,
        })
        .collect();
    let init = NetInit {
        rank,
        devices,
        secret: bootstrap.secret(),
    };
    Ok(network::choose(&init, config.net.as_deref())
        .map_err(|e| Error::InvalidUsage(format!("rank {rank}: {e}")))?
        .transport)
}

/// Which ranks share a host, hosts numbered by the first rank seen on
/// each.
fn topology_of(peers: &[PeerInfo]) -> Topology {
    let host_of = peers
        .iter()
        .map(|p| {
            peers
                .iter()
                .position(|q| q.host_id == p.host_id)
                .unwrap_or(0)
        })
        .collect();
    Topology::from_hosts(host_of)
}

/// A communicator's state before its first launch: no connection on any
/// channel to any peer.
fn unconnected(channels: usize, nranks: usize) -> ExecState {
    let no_links = || {
        (0..channels)
            .map(|_| (0..nranks).map(|_| None).collect())
            .collect()
    };
    ExecState {
        host_links: no_links(),
        staged_links: no_links(),
        board: None,
        lone: None,
        device_links: None,
    }
}

/// Per rank, its process when it runs elsewhere on this host and this
/// rank sees it (same pid namespace).
fn visible_processes(peers: &[PeerInfo], me: &PeerInfo) -> Vec<Option<ProcessId>> {
    let own_pid = std::process::id();
    peers
        .iter()
        .map(|p| {
            let process = ProcessId {
                pid: p.pid,
                start: p.start,
            };
            (p.host_id == me.host_id && p.start != 0 && p.pid != own_pid && process.visible())
                .then_some(process)
        })
        .collect()
}

/// How long `init_all` lets a failing rank's own error be recorded before
/// a remote error that followed from it.
const CAUSE_FIRST: std::time::Duration = std::time::Duration::from_millis(50);

/// CPUs the host's ranks share: the online CPUs, not this process's
/// affinity mask (a launcher that binds each rank to its own core leaves
/// every rank one CPU, yet the ranks do not compete), at most the
/// process's cgroup quota where one is set (which the standard library's
/// count honours, along with the mask).
fn host_cpus() -> usize {
    // SAFETY: sysconf only reads a system setting.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let online = usize::try_from(online).unwrap_or(1).max(1);
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    if allowed < online && quota_limited() {
        allowed
    } else {
        online
    }
}

/// Whether a cgroup CPU quota (cgroup v2 `cpu.max`) limits this process.
fn quota_limited() -> bool {
    std::fs::read_to_string("/sys/fs/cgroup/cpu.max")
        .map(|text| !text.trim_start().starts_with("max"))
        .unwrap_or(false)
}

/// What identifies this host: `NCCL_HOSTID` when set (test beds that
/// emulate hosts on one machine set it), else the host name and boot id.
fn host_id() -> String {
    if let Some(id) = rccl_env::var("NCCL_HOSTID") {
        return id;
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", crate::net::hostname(), boot.trim())
}
