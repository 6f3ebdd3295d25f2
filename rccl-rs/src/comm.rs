//! The communicator: creation (from a unique id, the environment, or for N
//! ranks of one process), split, and teardown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rccl_algorithms::Topology;
use rccl_transports::network::providers::{self, NetInit};
use rccl_transports::network::socket::SocketDevice;
use rccl_transports::process::ProcessId;
use rccl_transports::transport::Transport;

use crate::net::Nic;

use crate::bootstrap::{Bootstrap, UniqueId};
use crate::config::{Config, MAX_CHANNELS};
use crate::error::{Error, Result};
use crate::executor;
use crate::state::ExecState;

/// What each rank tells the others at init.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    /// Its address on the network (the port is not used).
    pub data_addr: SocketAddr,
    /// Its host name, for messages.
    pub host: String,
    /// What identifies its host: ranks with equal ids share memory
    /// (`NCCL_HOSTID`, or the host name and boot id).
    pub host_id: String,
    /// Its process id, for messages.
    pub pid: u32,
    /// Its process's start time (clock ticks since boot, 0 if unknown):
    /// with the pid, what a peer on the same host watches to learn
    /// promptly that it died.
    pub start: u64,
    /// Settings that must agree across ranks: buffsize, min and max
    /// channels, shared memory disabled.
    pub shape: [u64; SHAPE_WORDS],
    /// Its host's network devices, the first one holding `data_addr`'s
    /// address or not (see [`crate::net::select_nics`]).
    pub nics: Vec<Nic>,
}

impl PeerInfo {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let addr = self.data_addr.to_string();
        for field in [
            addr.as_bytes(),
            self.host.as_bytes(),
            self.host_id.as_bytes(),
        ] {
            out.extend_from_slice(&(field.len() as u32).to_le_bytes());
            out.extend_from_slice(field);
        }
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.start.to_le_bytes());
        for word in self.shape {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&(self.nics.len() as u32).to_le_bytes());
        for nic in &self.nics {
            for field in [nic.name.as_bytes(), nic.addr.to_string().as_bytes()] {
                out.extend_from_slice(&(field.len() as u32).to_le_bytes());
                out.extend_from_slice(field);
            }
            out.extend_from_slice(&nic.speed_mbps.to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8], rank: usize) -> Result<PeerInfo> {
        let mut reader = Reader(bytes);
        let parsed = (|| {
            let addr = reader.string()?;
            let host = reader.string()?;
            let host_id = reader.string()?;
            let pid = reader.u32()?;
            let start = reader.u64()?;
            let mut shape = [0u64; SHAPE_WORDS];
            for word in &mut shape {
                *word = reader.u64()?;
            }
            let count = reader.u32()? as usize;
            if count > MAX_NICS {
                return None;
            }
            let mut nics = Vec::with_capacity(count);
            for _ in 0..count {
                nics.push(Nic {
                    name: reader.string()?,
                    addr: reader.string()?.parse().ok()?,
                    speed_mbps: reader.u32()?,
                });
            }
            Some(PeerInfo {
                nics,
                data_addr: addr.parse().ok()?,
                host,
                host_id,
                pid,
                start,
                shape,
            })
        })()
        .filter(|_| reader.0.is_empty());
        parsed.ok_or_else(|| Error::Remote(format!("rank {rank} sent malformed init information")))
    }
}

/// A bound on the NICs a peer may announce, before anything is allocated
/// for them (NCCL's socket transport uses at most 16).
const MAX_NICS: usize = 64;

/// Reads little-endian fields off a byte slice.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn string(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}

/// Tuner choices remembered per call shape: a training loop repeats the
/// same few calls, and choosing costs more than the smallest call itself.
#[derive(Default)]
pub(crate) struct ChoiceCache {
    /// The tuner generation the entries were made under.
    generation: u64,
    entries: Vec<(ChoiceKey, crate::tuning::Choice)>,
    /// The entry replaced next once the cache is full.
    next_victim: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct ChoiceKey {
    kind: rccl_algorithms::CollKind,
    count: usize,
    elem_size: usize,
    root: usize,
    in_place: bool,
}

/// Call shapes a communicator remembers the choice for.
const CHOICE_CACHE_ENTRIES: usize = 16;

/// What a communicator is doing, for hang reports on request: set when a
/// launch starts and ends, and refreshed while it is stuck.
#[derive(Default)]
pub(crate) struct Activity {
    /// When the launch in flight started.
    pub since: Option<Instant>,
    /// Its first operation (sequence number and name) and how many
    /// operations it holds.
    pub first: (u64, &'static str),
    pub ops: usize,
    /// How long it had made no progress, and what each stuck channel
    /// waited for, at the last check.
    pub stalled: Option<std::time::Duration>,
    pub waiting: Vec<String>,
}

/// Every live communicator of this process, for hang reports.
static LIVE: Mutex<Vec<std::sync::Weak<CommInner>>> = Mutex::new(Vec::new());

fn register(inner: &Arc<CommInner>) {
    let mut live = LIVE.lock();
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(inner));
}

/// The state of every live communicator of this process, one block per
/// communicator: the operation in flight (sequence number, collective),
/// and per stuck channel the step, primitive and the peer waited for.
pub fn hang_report() -> String {
    let live: Vec<Arc<CommInner>> = LIVE.lock().iter().filter_map(|w| w.upgrade()).collect();
    if live.is_empty() {
        return "rccl: no live communicators".to_string();
    }
    live.iter()
        .map(|c| c.report())
        .collect::<Vec<_>>()
        .join("\n")
}

/// How long a peer whose process is gone may keep its last words unread
/// (see [`CommInner::peer_gone`]).
const PROCESS_GONE_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

pub(crate) struct CommInner {
    pub rank: usize,
    pub nranks: usize,
    pub config: Config,
    pub bootstrap: Bootstrap,
    /// The network connections to other hosts go through (its entry of
    /// the transport table).
    pub net: Arc<dyn Transport>,
    pub peers: Vec<PeerInfo>,
    /// Per rank, its process when it runs elsewhere on this host and this
    /// rank sees it (same pid namespace), found at init while every rank
    /// runs: waits on a peer check that it still does.
    pub processes: Vec<Option<ProcessId>>,
    /// When each peer's process was first seen gone while its bootstrap
    /// connection was not yet read to its end (see [`CommInner::peer_gone`]).
    process_gone_since: Mutex<std::collections::HashMap<usize, Instant>>,
    pub abort: Arc<AtomicBool>,
    /// How the communicator was ended, once `abort` is set: "aborted"
    /// (`ncclCommAbort`) or "destroyed" (`ncclCommDestroy` while another
    /// thread ran an operation on it).
    ended: std::sync::OnceLock<&'static str>,
    /// The first failure; every later call returns it.
    pub poisoned: std::sync::OnceLock<Error>,
    /// Sequence number of the next collective (every rank counts the same
    /// collectives, so it is part of each piece's tag).
    pub next_seq: AtomicU64,
    /// Sequence number of the next batch of sends and receives (for
    /// reports only: ranks take part in different batches).
    pub next_p2p_seq: AtomicU64,
    /// Whether every peer is reached through shared memory.
    pub all_shm: bool,
    /// Whether the transport table links this rank's device work with
    /// every peer's, as decided at its first call on device memory.
    pub device_work_reaches_all: std::sync::OnceLock<bool>,
    /// Which ranks share a host.
    pub topology: Topology,
    /// The rails: NICs per host that the channels spread over (the fewest
    /// any host has); channel `c` crosses hosts on NIC `c mod rails`.
    pub rails: usize,
    pub exec: Mutex<ExecState>,
    pub activity: Mutex<Activity>,
    /// What peers waiting on this rank said they run.
    pub heard: Mutex<crate::stuck::Heard>,
    splits: AtomicU64,
    /// The cost model's link figures, read once at init.
    pub link_model: crate::tuning::LinkModel,
    choices: Mutex<ChoiceCache>,
    /// Launches enqueued on streams and not finished yet.
    pub queued: crate::queue::Queued,
    /// This communicator's context of a C tuner plug-in
    /// (`NCCL_TUNER_PLUGIN`), finalized when the communicator goes.
    tuner: Option<crate::tuner_plugin::CTuner>,
    /// This communicator's context of a C profiler plug-in
    /// (`NCCL_PROFILER_PLUGIN`), finalized when the communicator goes;
    /// `None`, the common case, costs a call one test.
    pub profiler: Option<crate::profiler_plugin::CProfiler>,
}

impl crate::queue::Owner for CommInner {
    fn rank(&self) -> usize {
        self.rank
    }

    fn timeout(&self) -> std::time::Duration {
        self.config.timeout
    }

    fn check_usable(&self) -> Result<()> {
        CommInner::check_usable(self)
    }
}

impl CommInner {
    /// Bytes each rank may post on the board: the configured size when
    /// every rank shares this host, else 0 (no board).
    pub fn board_bytes(&self) -> usize {
        if self.all_shm && self.nranks > 1 {
            self.config.board_bytes
        } else {
            0
        }
    }

    /// What the tuner picks for a collective call, remembered per call
    /// shape (while no tuner plug-in is installed).
    pub fn choose(
        &self,
        spec: &rccl_algorithms::CollSpec,
        elem_size: usize,
        in_place: bool,
    ) -> Result<crate::tuning::Choice> {
        let key = ChoiceKey {
            kind: spec.kind,
            count: spec.count,
            elem_size,
            root: spec.root,
            in_place,
        };
        let generation = crate::tuning::generation();
        let cacheable = !crate::tuning::has_plugin();
        if cacheable {
            let cache = self.choices.lock();
            if cache.generation == generation {
                if let Some((_, choice)) = cache.entries.iter().find(|(k, _)| *k == key) {
                    return Ok(*choice);
                }
            }
        }
        let choice = crate::tuning::choose(
            &self.config,
            spec,
            elem_size,
            &crate::tuning::Placement {
                all_shm: self.all_shm,
                topology: &self.topology,
                in_place,
                board_bytes: self.board_bytes(),
                model: &self.link_model,
                rails: self.rails,
                tuner: self
                    .tuner
                    .as_ref()
                    .map(|t| t as &dyn crate::tuning::TunerPlugin),
            },
        )?;
        if cacheable {
            let mut cache = self.choices.lock();
            if cache.generation != generation {
                *cache = ChoiceCache {
                    generation,
                    ..ChoiceCache::default()
                };
            }
            if cache.entries.len() < CHOICE_CACHE_ENTRIES {
                cache.entries.push((key, choice));
            } else {
                let victim = cache.next_victim;
                cache.entries[victim] = (key, choice);
                cache.next_victim = (victim + 1) % CHOICE_CACHE_ENTRIES;
            }
        }
        Ok(choice)
    }

    /// Whether `peer` runs on this rank's host and may be reached through
    /// shared memory.
    pub fn shares_memory_with(&self, peer: usize) -> bool {
        !self.config.shm_disable && self.peers[peer].host_id == self.peers[self.rank].host_id
    }

    /// "rank 3 (host h, pid 42)"; for a rank on another host, with its
    /// address: "rank 3 (host h, 10.0.0.2, pid 42)".
    pub fn describe(&self, rank: usize) -> String {
        match self.peers.get(rank) {
            Some(p) if p.host_id != self.peers[self.rank].host_id => format!(
                "rank {rank} (host {}, {}, pid {})",
                p.host,
                p.data_addr.ip(),
                p.pid
            ),
            Some(p) => format!("rank {rank} (host {}, pid {})", p.host, p.pid),
            None => format!("rank {rank}"),
        }
    }

    /// This communicator's part of a hang report.
    pub fn report(&self) -> String {
        let head = format!("rank {} of {}", self.rank, self.nranks);
        let activity = self.activity.lock();
        let mut text = match activity.since {
            None => format!("{head}: no operation in flight"),
            Some(since) => {
                let (seq, name) = activity.first;
                let more = match activity.ops {
                    0 | 1 => String::new(),
                    n => format!(" and {} more", n - 1),
                };
                let mut text = format!(
                    "{head}: operation #{seq} {name}{more} in flight for {:?}",
                    since.elapsed()
                );
                match activity.stalled {
                    Some(stalled) => {
                        text += &format!(", no progress for {stalled:?}");
                        for line in &activity.waiting {
                            text += &format!("\n  {line}");
                        }
                    }
                    None => text += ", progressing",
                }
                text
            }
        };
        drop(activity);
        if self.abort.load(Ordering::Relaxed) {
            text += &format!("\n  {}", self.ended_how());
        }
        if let Some(err) = self.poisoned.get() {
            text += &format!("\n  failed: {err}");
        }
        text
    }

    /// Logs what init found: the placement, the rings and trees, and how
    /// peers will be reached (`NCCL_DEBUG=INFO`, subsystems INIT and GRAPH).
    fn log_init(&self) {
        use crate::debug::{GRAPH, INIT};
        let (rank, n) = (self.rank, self.nranks);
        tracing::info!(
            target: INIT,
            "[{rank}] comm {:p} rank {rank} nRanks {n} nHosts {} host {} - Init COMPLETE",
            self,
            self.topology.nhosts(),
            self.peers[rank].host
        );
        if !tracing::enabled!(target: GRAPH, tracing::Level::INFO) {
            return;
        }
        for (host, ranks) in self.topology.hosts().iter().enumerate() {
            let name = &self.peers[ranks[0]].host;
            tracing::info!(target: GRAPH, "[{rank}] Topology: host {host} ({name}): ranks {ranks:?}");
        }
        let nics: Vec<String> = self.peers[rank]
            .nics
            .iter()
            .enumerate()
            .map(|(i, nic)| format!("[{i}]{}:{}<{}Mb/s>", nic.name, nic.addr, nic.speed_mbps))
            .collect();
        tracing::info!(
            target: GRAPH,
            "[{rank}] NET/Socket : Using {} ; {} rail(s) across {} host(s)",
            nics.join(" "),
            self.rails,
            self.topology.nhosts()
        );
        // As NCCL: per channel its ring, the tree it runs with all
        // channels in use (both on a lone or last odd channel), and the
        // NIC its traffic between hosts takes.
        let nch = self.config.max_channels;
        for channel in 0..nch {
            let ring: Vec<String> = self
                .topology
                .ring_order(channel)
                .iter()
                .map(|r| r.to_string())
                .collect();
            let nic = if self.topology.nhosts() > 1 {
                let rail = channel % self.rails;
                let nic = &self.peers[rank].nics[rail];
                format!(" ; NIC {rail} {} {}", nic.name, nic.addr)
            } else {
                String::new()
            };
            tracing::info!(
                target: GRAPH,
                "[{rank}] Channel {channel:02}/{nch:02} : Ring : {}{nic}",
                ring.join(" ")
            );
            for &t in rccl_algorithms::tree::channel_trees(nch, channel) {
                let node = rccl_algorithms::tree::channel_tree(&self.topology, channel, t, rank);
                let parent = node.parent.map_or("-1".to_string(), |p| p.to_string());
                tracing::info!(
                    target: GRAPH,
                    "[{rank}] Channel {channel:02}/{nch:02} : Tree {t} : {parent} -> {rank} -> {:?}",
                    node.children
                );
            }
        }
        for peer in (0..n).filter(|&p| p != rank) {
            let via = if self.shares_memory_with(peer) {
                "SHM/direct".to_string()
            } else {
                format!("{} {}", self.net.name(), self.peers[peer].data_addr)
            };
            tracing::info!(target: GRAPH, "[{rank}] Transport to rank {peer} ({}): {via}", self.peers[peer].host);
        }
    }

    /// Fails if the communicator was aborted or has failed.
    pub fn check_usable(&self) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(self.ended_error());
        }
        if let Some(err) = self.poisoned.get() {
            return Err(err.clone());
        }
        Ok(())
    }

    /// Ends every operation in flight and every later call: `how` says
    /// how ("aborted", "destroyed") in their errors and in the note peers
    /// get. Peers waiting on this rank learn it at once through its
    /// connections (an operation in flight tells them as it stops).
    pub fn end(&self, how: &'static str) {
        let _ = self.ended.set(how);
        self.abort.store(true, Ordering::SeqCst);
        if let Some(state) = self.exec.try_lock() {
            close_links(self, &state, &self.ended_error());
        }
    }

    /// How the communicator was ended ("aborted" unless said otherwise).
    pub fn ended_how(&self) -> &'static str {
        self.ended.get().copied().unwrap_or("aborted")
    }

    /// The error of a call on an ended communicator.
    pub fn ended_error(&self) -> Error {
        if self.ended.get().is_none() {
            if let Some(why) = self.bootstrap.broken() {
                return Error::System(format!("rank {}: bootstrap: {why}", self.rank));
            }
        }
        let how = self.ended_how();
        let during = if how == "destroyed" {
            " (ncclCommDestroy) while this call was in flight"
        } else {
            ""
        };
        Error::InvalidUsage(format!(
            "rank {}: the communicator was {how}{during}",
            self.rank
        ))
    }

    /// Records the communicator's first failure.
    pub fn poison(&self, err: &Error) {
        // The first failure stays; later ones are its consequences.
        if self.poisoned.set(err.clone()).is_ok() {
            self.bootstrap.record_failure(&failure_note(self, err));
        }
    }

    /// Whether `peer` runs in another process than this rank.
    pub fn in_other_process(&self, peer: usize) -> bool {
        let (me, them) = (&self.peers[self.rank], &self.peers[peer]);
        them.pid != me.pid || them.start != me.start || them.host_id != me.host_id
    }

    /// Why `peer` can take no part any more, if that is known: its process
    /// on this host is gone, or its bootstrap connection with this rank
    /// ended (a process that dies closes its sockets). For waits on a peer
    /// that no connection of the communicator joins yet (connection
    /// setup), which no closing note can end.
    pub fn peer_gone(&self, peer: usize) -> Option<Error> {
        let why = match self.processes[peer].and_then(|process| process.gone()) {
            Some(why) if self.said_all_it_could(peer) => format!("died: {why}"),
            Some(_) => return None,
            None => self.bootstrap.peer_gone(peer)?,
        };
        let gone = Error::Remote(format!("rank {}: {} {why}", self.rank, self.describe(peer)));
        // A failure the peer told before it went is the news, not its end.
        Some(crate::stuck::peer_failure(self).unwrap_or(gone))
    }

    /// Whether what `peer`, whose process is gone, said before it went has
    /// been read: its bootstrap connection was read to its end, or
    /// [`PROCESS_GONE_GRACE`] passed since its process was first seen gone
    /// (a peer that never opened a connection to this rank leaves none to
    /// read). A rank that fails and exits at once tells its failure first;
    /// without this, a peer could see the process end before the reader
    /// thread reached the note, and report a death instead of the cause.
    fn said_all_it_could(&self, peer: usize) -> bool {
        if self.bootstrap.read_to_end(peer) {
            return true;
        }
        let now = Instant::now();
        let since = *self.process_gone_since.lock().entry(peer).or_insert(now);
        now.duration_since(since) >= PROCESS_GONE_GRACE
    }

    /// The failure of one of `peers` that runs in this process, as this
    /// rank reports it: read without a socket, so that it arrives even
    /// when the failed rank could open none to tell this one.
    pub fn peer_failure_in_process(&self, peers: &[usize]) -> Option<Error> {
        peers.iter().find_map(|&peer| {
            if self.in_other_process(peer) {
                return None;
            }
            let note = self.bootstrap.failure_in_process(peer)?;
            let context = format!("rank {}: word from {}", self.rank, self.describe(peer));
            Some(executor::note_error(&note, &context))
        })
    }
}

/// What a wait on peers that no connection joins yet (connection setup)
/// checks between its attempts: at once whether this rank was aborted or
/// destroyed, and every [`executor::STALL_CHECK_EVERY`] whether a peer
/// told it of a failure or one of the peers waited for is gone (a peer
/// that died or left before setting up its side never will).
#[derive(Clone, Default)]
pub(crate) struct PeerWatch {
    next: Option<Instant>,
}

impl PeerWatch {
    pub fn check(&mut self, comm: &CommInner, peers: &[usize]) -> Result<()> {
        if comm.abort.load(Ordering::Relaxed) {
            return Err(comm.ended_error());
        }
        let now = Instant::now();
        if self.next.is_some_and(|next| now < next) {
            return Ok(());
        }
        self.next = Some(now + executor::STALL_CHECK_EVERY);
        let failure = crate::stuck::peer_failure(comm)
            .or_else(|| peers.iter().find_map(|&peer| comm.peer_gone(peer)));
        failure.map_or(Ok(()), Err)
    }
}

/// A communicator: a group of ranks that run collectives together.
///
/// Every rank creates its own `Communicator` with the same unique id and
/// rank count. The handle is cheap to share between threads, but like an
/// NCCL communicator it runs one operation (or group) at a time; a second
/// thread calling into it waits for the first.
///
/// ```
/// use rccl::{Communicator, RedOp};
///
/// let comms = Communicator::init_all(2).unwrap();
/// std::thread::scope(|s| {
///     for comm in &comms {
///         s.spawn(move || {
///             let mine = [comm.rank() as f32 + 1.0; 4];
///             let mut sum = [0.0f32; 4];
///             comm.all_reduce(&mine, &mut sum, RedOp::Sum).unwrap();
///             assert_eq!(sum, [3.0; 4]);
///         });
///     }
/// });
/// ```
#[derive(Clone)]
pub struct Communicator {
    pub(crate) inner: Arc<CommInner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.rank)
            .field("nranks", &self.inner.nranks)
            .finish()
    }
}

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
        if nranks == 0 {
            return Err(Error::InvalidArgument("nranks must be at least 1".into()));
        }
        if rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range for {nranks} ranks"
            )));
        }
        config.validate()?;
        crate::debug::init();
        crate::tuning::register_schedule_files_from_env()?;
        crate::tuning::check_algorithm_names(&config.algo)?;
        crate::signal::install_from_env()?;
        let bootstrap = Bootstrap::init(id, rank, nranks, config.timeout, abort.clone())?;
        let ip = bootstrap.peer_addr(rank).ip();
        let me = PeerInfo {
            nics: crate::net::host_nics(ip)?,
            data_addr: SocketAddr::new(ip, 0),
            host: crate::net::hostname(),
            host_id: host_id(),
            pid: std::process::id(),
            start: rccl_transports::process::ProcessId::current().map_or(0, |p| p.start),
            shape: settings_shape(&config),
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
                 NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS, NCCL_SHM_DISABLE, NCCL_PROTO, \
                 NCCL_ALGO or RCCL_BOARD_BYTES ({:?} against {:?}); set them alike on every rank",
                me.shape, p.shape
            )));
        }
        // Every rank uses as many rails as the host with the fewest NICs
        // has, so channel c's rail is the same everywhere.
        let rails = peers.iter().map(|p| p.nics.len()).min().unwrap_or(1).max(1);
        let devices = me.nics[..rails.min(me.nics.len())]
            .iter()
            .map(|nic| SocketDevice {
                name: nic.name.clone(),
                ip: nic.addr,
            })
            .collect();
        // Channels follow the rails unless NCCL_MAX_NCHANNELS (or a
        // configured maximum other than the default) says otherwise.
        if rccl_env::var("NCCL_MAX_NCHANNELS").is_none()
            && config.max_channels == Config::default().max_channels
        {
            config.max_channels = config.max_channels.max(rails).min(MAX_CHANNELS);
        }
        let mut link_model = crate::tuning::LinkModel::from_env();
        if let Some(slowest) = me.nics[..rails.min(me.nics.len())]
            .iter()
            .map(|nic| f64::from(nic.speed_mbps) / 8e3)
            .reduce(f64::min)
        {
            link_model.net_bandwidth_gbs = link_model.net_bandwidth_gbs.min(slowest);
        }
        let init = NetInit {
            rank,
            devices,
            secret: bootstrap.secret(),
        };
        let net = providers::choose(&init, config.net.as_deref())
            .map_err(|e| Error::InvalidUsage(format!("rank {rank}: {e}")))?
            .transport;
        let all_shm =
            (0..nranks).all(|peer| !config.shm_disable && peers[peer].host_id == me.host_id);
        // Hosts numbered by the first rank seen on each.
        let host_of = peers
            .iter()
            .map(|p| {
                peers
                    .iter()
                    .position(|q| q.host_id == p.host_id)
                    .unwrap_or(0)
            })
            .collect();
        let topology = Topology::from_hosts(host_of);
        let tuner = crate::tuner_plugin::open(nranks, topology.hosts(), hash_of(&bootstrap));
        let profiler =
            crate::profiler_plugin::open(hash_of(&bootstrap), topology.hosts().len(), nranks, rank);
        let channels = config.max_channels;
        let no_links = || {
            (0..channels)
                .map(|_| (0..nranks).map(|_| None).collect())
                .collect()
        };
        let own_pid = std::process::id();
        let processes = peers
            .iter()
            .map(|p| {
                let process = ProcessId {
                    pid: p.pid,
                    start: p.start,
                };
                (p.host_id == me.host_id && p.start != 0 && p.pid != own_pid && process.visible())
                    .then_some(process)
            })
            .collect();
        let inner = Arc::new(CommInner {
            rank,
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
            exec: Mutex::new(ExecState {
                links: no_links(),
                device_links: no_links(),
                board: None,
                lone: None,
                device_work: None,
            }),
            activity: Mutex::new(Activity::default()),
            heard: Mutex::default(),
            splits: AtomicU64::new(0),
            link_model,
            choices: Mutex::new(ChoiceCache::default()),
            queued: crate::queue::Queued::default(),
            tuner,
            profiler,
        });
        register(&inner);
        let local_ranks = inner
            .topology
            .local_ranks(inner.topology.host_of(inner.rank))
            .len();
        if local_ranks > host_cpus() {
            rccl_transports::wait::spin_before_yielding(std::time::Duration::ZERO);
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
        let (rank, nranks) = rank_from_env()?;
        let addr = match rccl_env::var("NCCL_COMM_ID") {
            Some(addr) => addr,
            None => {
                let host = env_required("MASTER_ADDR")?;
                let port = rendezvous_port(&env_required("MASTER_PORT")?)?;
                if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                }
            }
        };
        let id = UniqueId::from_address(&addr)?;
        if rank == 0 {
            id.serve_root()?;
        }
        Communicator::init_rank(nranks, &id, rank)
    }

    /// This rank's index (`ncclCommUserRank`).
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks (`ncclCommCount`).
    pub fn count(&self) -> usize {
        self.inner.nranks
    }

    /// The ranks of every host, in rank order (hosts numbered by their
    /// lowest rank).
    pub fn hosts(&self) -> &[Vec<usize>] {
        self.inner.topology.hosts()
    }

    /// A 64-bit hash of the communicator's secret, the same on every rank
    /// and different between communicators (NCCL's `commHash`).
    pub fn hash(&self) -> u64 {
        hash_of(&self.inner.bootstrap)
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The rails: NICs per host that channels spread over between hosts
    /// (the fewest any host of the communicator has; channel `c` uses NIC
    /// `c mod rails`).
    pub fn rails(&self) -> usize {
        self.inner.rails
    }

    /// What the tuner picks on this rank for a collective call of `count`
    /// elements of `elem_size` bytes (NCCL's count; `root` for rooted
    /// calls): algorithm, protocol and channels, as the call itself would
    /// get them. For reports (the perf tests' JSON); nothing is run.
    pub fn tuning_choice(
        &self,
        kind: rccl_algorithms::CollKind,
        count: usize,
        elem_size: usize,
        root: usize,
        in_place: bool,
    ) -> Result<crate::tuning::Choice> {
        let spec = rccl_algorithms::CollSpec {
            kind,
            nranks: self.inner.nranks,
            root,
            count,
        };
        self.inner.choose(&spec, elem_size, in_place)
    }

    /// Splits the communicator (`ncclCommSplit`): ranks passing the same
    /// `color` form a new communicator, ordered by `key` then by rank;
    /// ranks passing `None` (NCCL's `NCCL_SPLIT_NOCOLOR`) take part but get
    /// no communicator. Every rank must call it.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.split_config(color, key, self.inner.config.clone())
    }

    /// As [`Communicator::split`], the new communicator with settings
    /// `config` (`ncclCommSplit`'s config).
    pub fn split_config(
        &self,
        color: Option<u32>,
        key: i32,
        config: Config,
    ) -> Result<Option<Communicator>> {
        let inner = &self.inner;
        inner.check_usable()?;
        let split = inner.splits.fetch_add(1, Ordering::Relaxed);
        let mut mine = Vec::with_capacity(9);
        mine.push(u8::from(color.is_some()));
        mine.extend_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = inner.bootstrap.allgather(&mine)?;
        let mut members = Vec::new();
        for (rank, bytes) in all.iter().enumerate() {
            if bytes.len() != 9 {
                return Err(Error::Remote(format!(
                    "rank {rank} sent a malformed split request"
                )));
            }
            let their_color =
                (bytes[0] == 1).then(|| u32::from_le_bytes(bytes[1..5].try_into().unwrap()));
            let their_key = i32::from_le_bytes(bytes[5..9].try_into().unwrap());
            if their_color.is_some() && their_color == color {
                members.push((their_key, rank));
            }
        }
        let Some(_) = color else {
            return Ok(None);
        };
        members.sort_unstable();
        let new_rank = members
            .iter()
            .position(|&(_, r)| r == inner.rank)
            .ok_or_else(|| Error::Internal("split lost this rank".into()))?;
        let tag = SPLIT_TAG_BASE + split;
        let leader = members[0].1;
        let id = if leader == inner.rank {
            let id = UniqueId::new()?;
            for &(_, member) in &members[1..] {
                inner.bootstrap.send(member, tag, &id.0)?;
            }
            id
        } else {
            let bytes = inner.bootstrap.recv(leader, tag)?;
            UniqueId(bytes.try_into().map_err(|_| {
                Error::Remote(format!(
                    "rank {leader} sent a malformed unique id for split"
                ))
            })?)
        };
        Communicator::init_rank_config(members.len(), &id, new_rank, config).map(Some)
    }

    /// Waits until this rank's outstanding work on the communicator is
    /// done and reports any failure (`ncclCommFinalize`). A local step, as
    /// NCCL's: no rank waits for another, so one thread may finalize the
    /// ranks of [`Communicator::init_all`] one after another. Operations on
    /// host memory complete before they return, so this waits only for one
    /// that another thread still runs, and for launches queued on streams
    /// (at most the timeout each); what the connections still hold for
    /// peers goes out when the communicator is dropped.
    pub fn finalize(&self) -> Result<()> {
        let inner = &self.inner;
        inner.check_usable()?;
        inner.queued.wait_idle(&**inner)?;
        inner.check_usable()?;
        if inner.exec.try_lock_for(inner.config.timeout).is_none() {
            return Err(Error::System(format!(
                "rank {}: finalize waited {:?} for an operation another thread runs on the \
                 communicator",
                inner.rank, inner.config.timeout
            )));
        }
        inner.check_usable()
    }

    /// Stops every operation in flight on this communicator, from any
    /// thread (`ncclCommAbort`); they and every later call fail.
    ///
    /// Peers waiting on this rank learn it at once through its connections
    /// (an operation in flight tells them as it stops).
    pub fn abort(&self) {
        self.inner.end("aborted");
    }

    /// Gives up this handle (`ncclCommDestroy`). Work this rank queued on
    /// streams completes first, as a finalize would let it (at most the
    /// timeout): its failure, or the wait's, is returned, and destroying
    /// never drops it unsaid ([`Communicator::abort`] is the way to drop
    /// it). Then, if another thread still runs an operation on the
    /// communicator through another handle, that operation is aborted,
    /// failing with an error that says the communicator was destroyed,
    /// and its peers are told, rather than left waiting for their
    /// deadline.
    pub fn destroy(self) -> Result<()> {
        let queued = self.inner.queued.wait_idle(&*self.inner);
        // The handles of calls in flight and of queued work are clones of
        // this one.
        if Arc::strong_count(&self.inner) > 1 {
            self.inner.end("destroyed");
        }
        queued
    }

    /// What this communicator is doing, for diagnosing a hang: the
    /// operation in flight (sequence number, collective), how long it has
    /// made no progress, and per stuck channel the step, primitive and the
    /// peer (rank, host, pid) it waits for. Callable from any thread while
    /// another is blocked in the operation; refreshed every 100 ms of
    /// waiting. [`crate::hang_report`] reports every live communicator.
    pub fn hang_report(&self) -> String {
        self.inner.report()
    }

    /// The communicator's first failure, if any (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        self.inner.poisoned.get().cloned()
    }
}

/// How the note a rank leaves its peers ends when it destroys its
/// communicator in order, its queued work done: everything it sent has
/// arrived before the note.
pub(crate) const LEFT_IN_ORDER: &str = "destroyed its communicator";

impl Drop for CommInner {
    fn drop(&mut self) {
        // Peers still waiting on this rank hear why instead of timing out;
        // those whose device work still reads what this rank sent hear
        // that it left in order, not that the connection broke.
        let note = format!("{} {LEFT_IN_ORDER}", self.describe(self.rank));
        let state = self.exec.get_mut();
        for link in state.all_links() {
            link.conn.close_with(&note);
        }
        for conn in state
            .device_work
            .iter()
            .flat_map(|links| links.net.values())
        {
            conn.close_with(&note);
        }
    }
}

/// Closes every connection of a failed communicator, telling each peer
/// why, so that ranks waiting on this one stop at once with the cause
/// instead of timing out. A failure that came from a peer's note is passed
/// on unchanged: every rank names the rank where it started. Returns the
/// note.
pub(crate) fn close_links(comm: &CommInner, state: &ExecState, error: &Error) -> String {
    let links = || state.all_links();
    let note = links()
        .find_map(|link| link.conn.peer_note())
        .or_else(|| state.board.as_ref().and_then(|link| link.board.note()))
        .unwrap_or_else(|| failure_note(comm, error));
    for link in links() {
        link.conn.close_with(&note);
    }
    if let Some(link) = &state.board {
        link.board.close_with(&note);
    }
    note
}

/// What peers are told of this rank's failure: who failed and why, marked
/// as a usage error every rank shares where it is one.
pub(crate) fn failure_note(comm: &CommInner, error: &Error) -> String {
    // A broken bootstrap listener sets the abort flag too; its error says
    // why.
    let ended_by_user = comm.ended.get().is_some() || comm.bootstrap.broken().is_none();
    if comm.abort.load(Ordering::Relaxed) && ended_by_user {
        // Work was cut short: not the note of a rank that left in order
        // (LEFT_IN_ORDER), which peers' device work reads on past.
        return format!(
            "{} {} its communicator with its work unfinished",
            comm.describe(comm.rank),
            comm.ended_how()
        );
    }
    let usage = matches!(error, Error::InvalidUsage(_));
    format!(
        "{}{} failed: {error}",
        if usage { executor::USAGE_NOTE } else { "" },
        comm.describe(comm.rank)
    )
}

impl crate::stuck::Member for CommInner {
    fn rank(&self) -> usize {
        self.rank
    }
    fn describe(&self, rank: usize) -> String {
        CommInner::describe(self, rank)
    }
    fn bootstrap(&self) -> &Bootstrap {
        &self.bootstrap
    }
    fn heard(&self) -> &Mutex<crate::stuck::Heard> {
        &self.heard
    }
}

const SPLIT_TAG_BASE: u64 = 1 << 40;

/// How long `init_all` lets a failing rank's own error be recorded before
/// a remote error that followed from it.
const CAUSE_FIRST: std::time::Duration = std::time::Duration::from_millis(50);

/// Words of settings every rank must share.
const SHAPE_WORDS: usize = 8;

/// The settings that must agree across ranks, as words to compare.
fn settings_shape(config: &Config) -> [u64; SHAPE_WORDS] {
    use std::hash::{Hash, Hasher};
    let mut selections = std::collections::hash_map::DefaultHasher::new();
    (&config.proto, &config.algo).hash(&mut selections);
    [
        config.buffsize as u64,
        config.ll_buffsize as u64,
        config.ll128_buffsize as u64,
        config.min_channels as u64,
        config.max_channels as u64,
        u64::from(config.shm_disable) | u64::from(config.p2p_disable) << 1,
        selections.finish(),
        config.board_bytes as u64,
    ]
}

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

/// The communicator hash of [`Communicator::hash`], from its secret.
fn hash_of(bootstrap: &Bootstrap) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"rccl-rs communicator hash")
        .chain_update(bootstrap.secret().0)
        .finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
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

/// The rendezvous port for `MASTER_PORT`: torchrun's agent keeps its own
/// store on that port when it sets `TORCHELASTIC_USE_AGENT_STORE=True`, so
/// the rendezvous takes the next one.
fn rendezvous_port(master_port: &str) -> Result<u16> {
    let port: u16 = master_port.trim().parse().map_err(|_| {
        Error::InvalidArgument(format!("MASTER_PORT={master_port} is not a port number"))
    })?;
    let agent_store = std::env::var("TORCHELASTIC_USE_AGENT_STORE")
        .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    if !agent_store {
        return Ok(port);
    }
    port.checked_add(1).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "MASTER_PORT={port} is torchrun's store, and no port follows it for the rendezvous; \
             choose a lower --master-port or set NCCL_COMM_ID"
        ))
    })
}

fn env_required(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::InvalidArgument(format!("{name} is not set")))
}

/// This process's rank and the world size, from the variables of the
/// launchers in use: torchrun (`RANK`, `WORLD_SIZE`), Slurm
/// (`SLURM_PROCID`, `SLURM_NTASKS`), OpenMPI (`OMPI_COMM_WORLD_RANK`,
/// `OMPI_COMM_WORLD_SIZE`) and MPICH / Hydra (`PMI_RANK`, `PMI_SIZE`).
pub fn rank_from_env() -> Result<(usize, usize)> {
    launcher_rank_from_env()?.ok_or_else(|| {
        Error::InvalidArgument(
            "no rank in the environment: set RANK and WORLD_SIZE (or run under torchrun, Slurm or mpirun)"
                .into(),
        )
    })
}

/// As [`rank_from_env`], `None` where no launcher set both of its
/// variables. A variable that is set must hold a rank of the job: a value
/// that is not a number, a world size of 0 or a rank beyond it is an error
/// naming the variable and its value.
pub fn launcher_rank_from_env() -> Result<Option<(usize, usize)>> {
    launcher_rank(|name| std::env::var(name).ok())
}

/// [`launcher_rank_from_env`] with the variables looked up through `var`.
fn launcher_rank(var: impl Fn(&str) -> Option<String>) -> Result<Option<(usize, usize)>> {
    let number = |name: &str, expected: &str| -> Result<Option<usize>> {
        var(name)
            .map(|text| {
                text.trim().parse().map_err(|_| {
                    Error::InvalidArgument(format!("{name}={text:?} is not {expected}"))
                })
            })
            .transpose()
    };
    for (rank_var, size_var) in [
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ] {
        let rank = number(rank_var, "a rank (a whole number from 0)")?;
        let size = number(size_var, "a number of ranks (a whole number from 1)")?;
        let (Some(rank), Some(size)) = (rank, size) else {
            continue;
        };
        if size == 0 {
            return Err(Error::InvalidArgument(format!(
                "{size_var}=0: a job has at least one rank"
            )));
        }
        if rank >= size {
            return Err(Error::InvalidArgument(format!(
                "{rank_var}={rank} is out of range for {size_var}={size} (ranks 0 to {})",
                size - 1
            )));
        }
        return Ok(Some((rank, size)));
    }
    Ok(None)
}

/// The deadline of an operation starting now.
/// Fuzzing of the init information each rank decodes from every other.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn info() -> PeerInfo {
        PeerInfo {
            data_addr: "10.0.0.2:4242".parse().unwrap(),
            host: "node".into(),
            host_id: "node/boot".into(),
            pid: 42,
            start: 7,
            shape: [1, 2, 3, 4, 5, 6, 7, 8],
            nics: vec![
                Nic {
                    name: "tb0".into(),
                    addr: "10.231.0.2".parse().unwrap(),
                    speed_mbps: 2000,
                },
                Nic {
                    name: "tb1".into(),
                    addr: "10.232.0.2".parse().unwrap(),
                    speed_mbps: 10_000,
                },
            ],
        }
    }

    #[test]
    fn peer_info_round_trips_and_refuses_trailing_bytes() {
        let bytes = info().encode();
        assert_eq!(PeerInfo::decode(&bytes, 1), Ok(info()));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(PeerInfo::decode(&longer, 1).is_err());
        assert!(PeerInfo::decode(&bytes[..bytes.len() - 1], 1).is_err());
        // A NIC count past the bound is refused before anything is read.
        let mut many = info();
        many.nics = vec![many.nics[0].clone(); MAX_NICS + 1];
        assert!(PeerInfo::decode(&many.encode(), 1).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_decode_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Err(err) = PeerInfo::decode(&bytes, 3) {
                prop_assert!(err.to_string().contains("rank 3"));
            }
        }

        #[test]
        fn mutated_info_decodes_or_refuses(at in 0usize..120, value in any::<u8>(), cut in 0usize..130) {
            let mut bytes = info().encode();
            let n = bytes.len();
            bytes[at % n] = value;
            bytes.truncate(cut.max(1));
            let _ = PeerInfo::decode(&bytes, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank_of(vars: &[(&str, &str)]) -> Result<Option<(usize, usize)>> {
        launcher_rank(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn launcher_ranks_are_read_in_order_and_half_set_pairs_skipped() {
        assert_eq!(rank_of(&[]), Ok(None));
        assert_eq!(
            rank_of(&[("RANK", "1"), ("WORLD_SIZE", "2")]),
            Ok(Some((1, 2)))
        );
        assert_eq!(
            rank_of(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", " 4 ")]),
            Ok(Some((3, 4)))
        );
        // A batch script's own Slurm step: a rank without a world size.
        assert_eq!(rank_of(&[("SLURM_PROCID", "0")]), Ok(None));
        assert_eq!(
            rank_of(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_RANK", "5"),
                ("OMPI_COMM_WORLD_SIZE", "8"),
            ]),
            Ok(Some((0, 2)))
        );
    }

    #[test]
    fn a_launcher_rank_outside_the_job_is_refused_naming_the_variable() {
        let refused = |vars: &[(&str, &str)], says: &str| {
            let err = rank_of(vars).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(err.to_string().contains(says), "{err} lacks {says}");
        };
        refused(
            &[("RANK", "2"), ("WORLD_SIZE", "2")],
            "RANK=2 is out of range for WORLD_SIZE=2",
        );
        refused(
            &[("RANK", "abc"), ("WORLD_SIZE", "2")],
            "RANK=\"abc\" is not a rank",
        );
        refused(
            &[("RANK", "-1"), ("WORLD_SIZE", "2")],
            "RANK=\"-1\" is not a rank",
        );
        refused(&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE=0");
        refused(
            &[("RANK", "0"), ("WORLD_SIZE", "two")],
            "WORLD_SIZE=\"two\"",
        );
        refused(&[("RANK", "x")], "RANK=\"x\"");
        refused(
            &[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")],
            "OMPI_COMM_WORLD_RANK=4 is out of range for OMPI_COMM_WORLD_SIZE=4",
        );
        refused(
            &[("PMI_RANK", ""), ("PMI_SIZE", "2")],
            "PMI_RANK=\"\" is not a rank",
        );
        refused(
            &[("SLURM_PROCID", "-1"), ("SLURM_NTASKS", "2")],
            "SLURM_PROCID=\"-1\"",
        );
    }
}
