//! The tuner: which algorithm, which protocol, how many channels and what
//! chunk size each operation gets, within what the user's `NCCL_ALGO` /
//! `NCCL_PROTO` allow ([`Selection`]). It ranks the candidates by the
//! simulator's closed forms (`rccl_simulator::tune::decide`) on a cluster
//! of the communicator's placement and link figures, within a host and
//! across hosts alike: one cost model, tested against the simulator's
//! replay.

use rccl_algorithms::{Algorithm, CollKind, CollSpec, OrderedRing, Params, Ring, Topology};
use rccl_simulator::estimate::estimate_us;
use rccl_simulator::tune::{decide, engine_cluster, params_for, EngineLinks};
use rccl_transports::Protocol;

use crate::config::{Config, FIFO_SLOTS};
use crate::error::{Error, Result};
pub use crate::selection::Selection;

/// Bytes per channel below which adding a channel does not pay: each
/// channel's connection and pipeline have a fixed cost.
const BYTES_PER_CHANNEL: usize = 512 << 10;

/// NCCL's algorithms that have no implementation here. `NCCL_ALGO` may
/// name them, so settings written for NCCL (`^nvls`) keep working; they
/// are never picked.
pub(crate) const NCCL_ONLY_ALGORITHMS: [&str; 5] =
    ["collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"];

/// Refuses an `NCCL_ALGO` that names an unknown algorithm: known are the
/// built-in ones, those registered so far and [`NCCL_ONLY_ALGORITHMS`].
pub(crate) fn check_algorithm_names(selection: &Selection) -> Result<()> {
    let mut known: Vec<&str> = algorithms().iter().map(|a| a.name()).collect();
    known.push(SYMMETRIC_ALGORITHM);
    selection.check_names("NCCL_ALGO", "algorithm", &known, &NCCL_ONLY_ALGORITHMS)
}

/// The name `NCCL_ALGO` gives collectives on symmetric windows
/// (`NCCL_ALGO=^symmetric` keeps them on the staged path).
pub const SYMMETRIC_ALGORITHM: &str = "symmetric";

/// From this many bytes an all-reduce on symmetric windows runs in two
/// shots (each rank reduces one block, then copies the others' blocks):
/// below it the extra barrier costs more than the `n - 1` reads of every
/// input it saves.
const SYMMETRIC_TWO_SHOT_BYTES: usize = 32 << 10;

/// How a collective on symmetric windows runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymmetricSchedule {
    /// Every rank reads every peer's input (all-reduce: folds all of them;
    /// all-gather: copies them; reduce-scatter: folds its own block).
    OneShot,
    /// All-reduce: each rank folds its block of every input into its
    /// receive buffer, then copies every peer's folded block.
    TwoShot,
}

/// How a collective of `bytes` per rank whose buffers lie in symmetric
/// windows on every rank of one host runs, or `None` to stage it through
/// FIFOs. Reading peers' windows in place moves every byte once, where
/// staging copies it into a FIFO and out again, so it is taken whenever
/// it serves (except for an all-reduce the board runs: it needs one
/// barrier where windows need two, the planner checks): all-reduce, all-gather and reduce-scatter, allowed by
/// `NCCL_ALGO`; in the deterministic mode only all-gather (no reduction
/// order to keep). An in-place all-reduce runs in two shots (one shot
/// would overwrite the input peers still read).
pub fn symmetric_schedule(
    config: &Config,
    kind: CollKind,
    bytes: usize,
    in_place: bool,
) -> Option<SymmetricSchedule> {
    let served = match kind {
        CollKind::AllGather => true,
        CollKind::AllReduce | CollKind::ReduceScatter => !config.deterministic,
        _ => false,
    };
    if !served || bytes == 0 || !config.algo.allows(kind, SYMMETRIC_ALGORITHM) {
        return None;
    }
    Some(
        if kind == CollKind::AllReduce && (in_place || bytes >= SYMMETRIC_TWO_SHOT_BYTES) {
            SymmetricSchedule::TwoShot
        } else {
            SymmetricSchedule::OneShot
        },
    )
}

/// What the tuner picked for one operation.
#[derive(Clone, Copy)]
pub struct Choice {
    /// The algorithm whose schedule runs.
    pub algorithm: &'static dyn Algorithm,
    /// The protocol its pieces travel with.
    pub protocol: Protocol,
    /// Channels and chunking.
    pub params: Params,
}

/// Where an operation runs: what the tuner needs to know beyond the call.
#[doc(hidden)]
pub struct Placement<'a> {
    /// Whether every peer is reached through shared memory (network
    /// connections carry every protocol as Simple, so the lighter protocols
    /// only pay within a host).
    pub all_shm: bool,
    /// Which ranks share a host.
    pub topology: &'a Topology,
    /// Whether the call is in place (some algorithms need separate
    /// buffers).
    pub in_place: bool,
    /// Bytes each rank can post on the communicator's board (0 without
    /// one): one-shot all-reduce calls that fit run through the board,
    /// which stages the input, so they may also be in place.
    pub board_bytes: usize,
    /// The link figures of the cost model.
    pub model: &'a LinkModel,
    /// NICs per host the channels spread over (channel `c` on NIC
    /// `c mod rails`).
    pub rails: usize,
    /// The communicator's own tuner (a C tuner plug-in's context), asked
    /// before the process-wide one.
    pub tuner: Option<&'a dyn TunerPlugin>,
}

/// Name of the algorithm that runs through the board when the call fits.
pub const BOARD_ALGORITHM: &str = "oneshot";

/// Link figures of the cost model's cluster: the latency of one step and
/// the bandwidth of one stream, within a host (shared memory) and between
/// hosts (the network). Defaults were measured on a 2-core host; override
/// them with `RCCL_SHM_LAT_US`, `RCCL_SHM_BW_GBS`, `RCCL_NET_LAT_US`,
/// `RCCL_NET_BW_GBS`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[doc(hidden)]
pub struct LinkModel {
    /// Microseconds per step through shared memory (Simple protocol).
    pub shm_latency_us: f64,
    /// GB/s of one stream through shared memory.
    pub shm_bandwidth_gbs: f64,
    /// Microseconds per step across the network.
    pub net_latency_us: f64,
    /// GB/s of one stream across the network.
    pub net_bandwidth_gbs: f64,
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel::MEASURED
    }
}

impl LinkModel {
    /// The figures measured on a 2-core host (the defaults).
    pub const MEASURED: LinkModel = LinkModel {
        shm_latency_us: 1.0,
        shm_bandwidth_gbs: 5.0,
        net_latency_us: 40.0,
        net_bandwidth_gbs: 1.0,
    };

    /// The same figures as the simulator's engine cluster takes them, with
    /// `rails` NICs per host.
    pub fn links(&self, rails: usize) -> EngineLinks {
        EngineLinks {
            shm_gbs: self.shm_bandwidth_gbs,
            shm_latency_us: self.shm_latency_us,
            nic_gbs: self.net_bandwidth_gbs,
            nic_latency_us: self.net_latency_us,
            rails,
        }
    }

    /// The defaults overridden by the environment.
    pub fn from_env() -> LinkModel {
        let var = |name: &str, default: f64| {
            rccl_env::var(name)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| *v > 0.0)
                .unwrap_or(default)
        };
        let d = LinkModel::default();
        LinkModel {
            shm_latency_us: var("RCCL_SHM_LAT_US", d.shm_latency_us),
            shm_bandwidth_gbs: var("RCCL_SHM_BW_GBS", d.shm_bandwidth_gbs),
            net_latency_us: var("RCCL_NET_LAT_US", d.net_latency_us),
            net_bandwidth_gbs: var("RCCL_NET_BW_GBS", d.net_bandwidth_gbs),
        }
    }
}

/// A tuner plug-in: may override any part of the choice for a call. What
/// it names must still be allowed by `NCCL_ALGO` / `NCCL_PROTO` and fit the
/// call, or the built-in choice stands.
pub trait TunerPlugin: Send + Sync {
    /// The plug-in's name, for logs.
    fn name(&self) -> &str;
    /// The choice for a call of `bytes` per rank on `topology`, or `None`
    /// to leave it to the built-in model.
    fn choose(&self, kind: CollKind, bytes: usize, topology: &Topology) -> Option<TunerHint>;

    /// As [`choose`](Self::choose), shown the model's estimates for the
    /// allowed choices and the channel count it picked; by default,
    /// `choose`.
    fn choose_from(&self, call: &TunerCall<'_>) -> Option<TunerHint> {
        self.choose(call.kind, call.bytes, call.topology)
    }

    /// A chunk size in bytes to use instead of `chunk_bytes` for the
    /// chosen algorithm, protocol and channels, or `None` to keep it.
    fn chunk_bytes(
        &self,
        _kind: CollKind,
        _bytes: usize,
        _algorithm: &str,
        _protocol: Protocol,
        _nchannels: usize,
        _chunk_bytes: usize,
    ) -> Option<usize> {
        None
    }
}

/// What a plug-in is shown of a call in [`TunerPlugin::choose_from`].
pub struct TunerCall<'a> {
    pub kind: CollKind,
    /// Bytes per rank.
    pub bytes: usize,
    pub topology: &'a Topology,
    /// Each allowed algorithm and protocol with the model's estimate.
    pub costs: &'a [TunerCost],
    /// The channels the model picked.
    pub nchannels: usize,
}

/// The model's estimate for one allowed algorithm and protocol.
#[derive(Clone, Copy, Debug)]
pub struct TunerCost {
    pub algorithm: &'static str,
    pub protocol: Protocol,
    /// Microseconds; `None` for an algorithm the model does not know.
    pub us: Option<f64>,
}

/// What a plug-in asks for; `None` fields are left to the model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunerHint {
    /// Algorithm name.
    pub algorithm: Option<String>,
    /// Protocol.
    pub protocol: Option<Protocol>,
    /// Channel count.
    pub nchannels: Option<usize>,
}

static PLUGIN: parking_lot::RwLock<Option<Box<dyn TunerPlugin>>> = parking_lot::RwLock::new(None);

/// Installs (or with `None`, removes) the process-wide tuner plug-in.
pub fn set_tuner_plugin(plugin: Option<Box<dyn TunerPlugin>>) {
    let installed = plugin.is_some();
    *PLUGIN.write() = plugin;
    PLUGIN_INSTALLED.store(installed, std::sync::atomic::Ordering::Relaxed);
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`PLUGIN`] holds a plug-in, readable without its lock.
static PLUGIN_INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a C tuner library is loaded in this process.
static TUNER_LIBRARY_LOADED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Notes that a C tuner library was loaded (choices are then not
/// remembered).
pub(crate) fn note_tuner_library_loaded() {
    TUNER_LIBRARY_LOADED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Counts changes to what the tuner may choose from (plug-in, registered
/// algorithms), so that communicators know when their remembered choices
/// are stale.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The current count of changes to the tuner's options.
pub(crate) fn generation() -> u64 {
    GENERATION.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a tuner plug-in is installed or a C tuner library loaded: its
/// answers may differ from call to call, so choices are not remembered
/// while one is.
pub(crate) fn has_plugin() -> bool {
    PLUGIN_INSTALLED.load(std::sync::atomic::Ordering::Relaxed)
        || TUNER_LIBRARY_LOADED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Picks algorithm, protocol and parameters for `spec` with
/// `elem_size`-byte elements: the cheapest allowed pair under the cost
/// model, unless a tuner plug-in asks otherwise.
///
/// With [`Config::deterministic`] a reducing collective runs the
/// [`OrderedRing`] whatever `NCCL_ALGO` or a plug-in says: its order per
/// element is fixed by the element and the rank count alone, and it moves
/// the ring's bytes, so the ring's cost ranks its protocols and cut (which
/// change its speed, not its bits). An all-reduce that fits the board goes
/// there: the board folds its posts in the same order, in one round or (from
/// 8 KiB) two, in less time than the ring's 2(n-1) steps
/// ([`for_device_work`] turns it back to the ordered ring where there is no
/// board).
#[doc(hidden)]
pub fn choose(
    config: &Config,
    spec: &CollSpec,
    elem_size: usize,
    placement: &Placement<'_>,
) -> Result<Choice> {
    let bytes = spec.count * elem_size;
    let kind = spec.kind;
    // Simple first: it wins ties, as it measured fastest on a CPU, and
    // across hosts, where every protocol travels as Simple and only the
    // chunk would differ, Simple's larger chunks are best.
    let protocols: Vec<Protocol> = [Protocol::Simple, Protocol::Ll128, Protocol::Ll]
        .into_iter()
        .filter(|p| config.proto.allows(kind, p.name()))
        .collect();
    if protocols.is_empty() {
        return Err(Error::InvalidUsage(format!(
            "NCCL_PROTO=\"{}\" leaves no protocol for {}",
            config.proto,
            kind.name()
        )));
    }
    let on_board = bytes <= placement.board_bytes && kind == CollKind::AllReduce;
    let deterministic = config.deterministic && OrderedRing.supports(kind);
    let fits = |a: &&'static dyn Algorithm| {
        if deterministic {
            let serves = if on_board {
                BOARD_ALGORITHM
            } else {
                Ring.name()
            };
            return a.name() == serves;
        }
        a.supports(kind)
            && a.supports_topology(placement.topology)
            && (!placement.in_place
                || a.supports_in_place(kind)
                || (on_board && a.name() == BOARD_ALGORITHM))
            && config.algo.allows(kind, a.name())
    };
    let candidates: Vec<&'static dyn Algorithm> = algorithms().into_iter().filter(fits).collect();
    if candidates.is_empty() {
        return Err(Error::InvalidUsage(format!(
            "NCCL_ALGO=\"{}\" leaves no algorithm that implements {}{} on this placement",
            config.algo,
            kind.name(),
            if placement.in_place { " in place" } else { "" }
        )));
    }
    let nchannels = channels_for(config, bytes, placement.all_shm, placement.rails);
    let cut = |protocol: Protocol| Params {
        nchannels,
        chunk_elems: (chunk_bytes(config, protocol) / elem_size).max(1),
    };
    // Across hosts the first allowed protocol is as good as any.
    let ranked: &[Protocol] = if placement.all_shm {
        &protocols
    } else {
        &protocols[..1]
    };
    let cluster = engine_cluster(placement.topology, &placement.model.links(placement.rails));
    let builtin = builtin_first(kind, &candidates);
    let decision = decide(
        &cluster,
        placement.topology,
        spec,
        elem_size,
        &builtin,
        ranked,
        cut,
    );
    // Unmodeled (user) algorithms run only when nothing else is allowed.
    let (mut algorithm, mut protocol) = match &decision {
        Some(d) => {
            tracing::info!(
                target: crate::debug::TUNING,
                "{}: {bytes} Bytes on {} hosts x {} rails, {nchannels} channels: {}/{} \
                 expected in {:.1} us",
                kind.name(),
                placement.topology.nhosts(),
                placement.rails,
                d.algorithm.name(),
                d.protocol.name(),
                d.estimate_us
            );
            (builtin[d.index], d.protocol)
        }
        None => (candidates[0], ranked[0]),
    };
    let mut nchannels = nchannels;
    let global = PLUGIN.read();
    let asked: Vec<&dyn TunerPlugin> = placement
        .tuner
        .into_iter()
        .chain(global.as_deref())
        .filter(|_| !deterministic)
        .collect();
    let costs: Vec<TunerCost> = if asked.is_empty() {
        Vec::new()
    } else {
        candidates
            .iter()
            .flat_map(|&algorithm| {
                let (cluster, topology) = (&cluster, placement.topology);
                protocols.iter().map(move |&protocol| TunerCost {
                    algorithm: algorithm.name(),
                    protocol,
                    us: is_builtin(algorithm)
                        .then(|| {
                            estimate_us(
                                cluster,
                                algorithm.name(),
                                spec,
                                elem_size,
                                protocol,
                                &params_for(algorithm, topology, spec, elem_size, cut(protocol)),
                            )
                        })
                        .flatten(),
                })
            })
            .collect()
    };
    for plugin in &asked {
        let call = TunerCall {
            kind,
            bytes,
            topology: placement.topology,
            costs: &costs,
            nchannels,
        };
        let Some(hint) = plugin.choose_from(&call) else {
            continue;
        };
        if let Some(a) = hint
            .algorithm
            .as_deref()
            .and_then(|n| candidates.iter().find(|a| a.name().eq_ignore_ascii_case(n)))
        {
            algorithm = *a;
        }
        if let Some(p) = hint.protocol.filter(|p| protocols.contains(p)) {
            protocol = p;
        }
        if let Some(c) = hint.nchannels {
            nchannels = c.clamp(config.min_channels, config.max_channels);
        }
        tracing::info!(
            target: crate::debug::TUNING,
            "tuner plug-in {}: {} {bytes} bytes -> {}/{}, {nchannels} channels",
            plugin.name(),
            kind.name(),
            algorithm.name(),
            protocol.name()
        );
    }
    let mut chunk = chunk_bytes(config, protocol);
    for plugin in &asked {
        // No larger than the connections' buffers hold.
        if let Some(c) =
            plugin.chunk_bytes(kind, bytes, algorithm.name(), protocol, nchannels, chunk)
        {
            chunk = c.min(chunk_bytes(config, protocol));
        }
    }
    drop(global);
    // The cut the closed forms ranked it with (the tree's chunks shrink
    // with its depth).
    let params = params_for(
        algorithm,
        placement.topology,
        spec,
        elem_size,
        Params {
            nchannels,
            chunk_elems: (chunk / elem_size).max(1),
        },
    );
    if deterministic && algorithm.name() != BOARD_ALGORITHM {
        algorithm = &OrderedRing;
    }
    Ok(Choice {
        algorithm,
        protocol,
        params,
    })
}

/// `choice` for device work, which has no board: in the deterministic mode
/// the ordered ring where the host would have folded the board's posts in
/// its order (one-shot's schedule folds in another).
pub(crate) fn for_device_work(config: &Config, choice: Choice) -> Choice {
    if config.deterministic && choice.algorithm.name() == BOARD_ALGORITHM {
        Choice {
            algorithm: &OrderedRing,
            ..choice
        }
    } else {
        choice
    }
}

/// Whether `algorithm` is a built-in one, whose time the closed forms
/// know.
fn is_builtin(algorithm: &dyn Algorithm) -> bool {
    rccl_algorithms::builtin(algorithm.name()).is_some_and(|b| std::ptr::addr_eq(algorithm, b))
}

/// The built-in algorithms among `candidates`, the collective's default
/// first so that it wins ties.
fn builtin_first(
    kind: CollKind,
    candidates: &[&'static dyn Algorithm],
) -> Vec<&'static dyn Algorithm> {
    let default = rccl_algorithms::default_for(kind);
    let mut builtin: Vec<&'static dyn Algorithm> = candidates
        .iter()
        .copied()
        .filter(|a| is_builtin(*a))
        .collect();
    if let Some(at) = builtin.iter().position(|a| std::ptr::addr_eq(*a, default)) {
        builtin[..=at].rotate_right(1);
    }
    builtin
}

/// Algorithms registered by the application, besides the built-in ones.
static REGISTERED: parking_lot::RwLock<Vec<&'static dyn Algorithm>> =
    parking_lot::RwLock::new(Vec::new());

/// Every algorithm the tuner may pick: the built-in ones, then those
/// registered with [`register_algorithm`].
pub fn algorithms() -> Vec<&'static dyn Algorithm> {
    let mut all: Vec<_> = rccl_algorithms::builtins().to_vec();
    all.extend(REGISTERED.read().iter().copied());
    all
}

/// Makes a researcher's algorithm selectable by name through `NCCL_ALGO`.
///
/// Before it is accepted, its schedules are run through the symbolic
/// executor for every collective it claims, 1 to 8 ranks, several counts,
/// 1 and 2 channels, in and out of place where it claims so; the first
/// wrong schedule refuses it, with the verifier's message naming the rank,
/// channel, step and primitive.
pub fn register_algorithm(algorithm: &'static dyn Algorithm) -> Result<()> {
    let name = algorithm.name();
    if algorithms()
        .iter()
        .any(|a| a.name().eq_ignore_ascii_case(name))
    {
        return Err(Error::InvalidArgument(format!(
            "an algorithm named {name:?} is already registered"
        )));
    }
    for kind in CollKind::ALL.into_iter().filter(|&k| algorithm.supports(k)) {
        for nranks in 1..=8 {
            for count in [0, 1, 7, 64, 1000] {
                for nchannels in [1, 2] {
                    let spec = CollSpec {
                        kind,
                        nranks,
                        root: nranks - 1,
                        count,
                    };
                    let params = Params {
                        nchannels,
                        chunk_elems: 16,
                    };
                    let topology = Topology::flat(nranks);
                    for in_place in [false, true] {
                        if in_place
                            && (!algorithm.supports_in_place(kind) || kind == CollKind::AllToAll)
                        {
                            continue;
                        }
                        rccl_algorithms::verify_on(algorithm, &spec, &params, &topology, in_place)
                            .map_err(|e| {
                                Error::InvalidArgument(format!(
                                    "algorithm {name:?} refused: {} on {nranks} ranks, count {count}, \
                                     {nchannels} channel(s){}: {e}",
                                    kind.name(),
                                    if in_place { ", in place" } else { "" }
                                ))
                            })?;
                    }
                }
            }
        }
    }
    REGISTERED.write().push(algorithm);
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Loads and registers the schedule files named in `RCCL_SCHEDULE_FILES`
/// (a `:`-separated list), once per process; each is verified as it loads.
pub(crate) fn register_schedule_files_from_env() -> Result<()> {
    static LOADED: std::sync::OnceLock<std::result::Result<(), Error>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let Some(list) = rccl_env::var("RCCL_SCHEDULE_FILES") else {
                return Ok(());
            };
            for path in list.split(':').filter(|p| !p.is_empty()) {
                let loaded = rccl_algorithms::file::load_schedule_file(std::path::Path::new(path))
                    .map_err(|e| Error::InvalidArgument(format!("RCCL_SCHEDULE_FILES: {e}")))?;
                let leaked: &'static dyn Algorithm = Box::leak(Box::new(loaded));
                if !algorithms()
                    .iter()
                    .any(|a| a.name().eq_ignore_ascii_case(leaked.name()))
                {
                    REGISTERED.write().push(leaked);
                    GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Ok(())
        })
        .clone()
}

/// Channels and protocol for a batch of sends and receives whose largest
/// message is `bytes` long, on a communicator of `rails` rails.
#[doc(hidden)]
pub fn p2p_choice(config: &Config, bytes: usize, rails: usize) -> (usize, Protocol) {
    (channels_for(config, bytes, false, rails), Protocol::Simple)
}

/// Channels for `bytes` on `rails` rails: the rule `rccl-sim` shares
/// ([`rccl_simulator::tune::channels`]), within `NCCL_MIN_NCHANNELS` /
/// `NCCL_MAX_NCHANNELS`. Within a host the fewest (measured: 1 MiB
/// all-reduce over two processes ran at 5.7 GB/s on two channels against
/// 9.4 GB/s at 512 KiB on one).
fn channels_for(config: &Config, bytes: usize, all_shm: bool, rails: usize) -> usize {
    rccl_simulator::tune::channels(
        bytes,
        all_shm,
        rails,
        BYTES_PER_CHANNEL,
        config.min_channels,
        config.max_channels,
    )
}

/// The pipeline chunk for `protocol`: half a connection's FIFO, so a
/// sender can fill one chunk while the receiver drains the previous one
/// (and every chunk fits the FIFO, which the schedules' deadlock freedom
/// relies on).
#[doc(hidden)]
pub fn chunk_bytes(config: &Config, protocol: Protocol) -> usize {
    config.slot_bytes(protocol) * FIFO_SLOTS / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_algorithms_and_protocols_are_refused_with_the_known_ones() {
        let err = check_algorithm_names(&Selection::parse("NCCL_ALGO", "^ring,bogus").unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"bogus\"") && err.contains("oneshot"),
            "{err}"
        );
        assert_eq!(
            check_algorithm_names(
                &Selection::parse("NCCL_ALGO", "^nvls,collnetdirect,pat").unwrap()
            ),
            Ok(())
        );
        let proto = Config {
            proto: Selection::parse("NCCL_PROTO", "LL,Simpel").unwrap(),
            ..Config::default()
        };
        let err = proto.clone().validate().unwrap_err().to_string();
        assert!(
            err.contains("unknown protocol \"Simpel\" (known: LL, LL128, Simple)"),
            "{err}"
        );
    }

    fn placement(topology: &Topology, all_shm: bool) -> Placement<'_> {
        Placement {
            all_shm,
            topology,
            in_place: false,
            board_bytes: 0,
            model: &LinkModel::MEASURED,
            rails: 1,
            tuner: None,
        }
    }

    #[test]
    fn in_place_one_shot_only_through_the_board() {
        let config = Config::default();
        let topology = Topology::flat(2);
        let spec = CollSpec {
            kind: CollKind::AllReduce,
            nranks: 2,
            root: 0,
            count: 16,
        };
        let mut on = placement(&topology, true);
        on.in_place = true;
        on.board_bytes = 64;
        let name = |p: &Placement<'_>| choose(&config, &spec, 4, p).unwrap().algorithm.name();
        assert_eq!(name(&on), BOARD_ALGORITHM);
        on.board_bytes = 32;
        assert_ne!(
            name(&on),
            BOARD_ALGORITHM,
            "64 bytes do not fit a 32-byte post"
        );
    }

    #[test]
    fn the_deterministic_mode_runs_the_ordered_ring_or_the_board() {
        let config = Config {
            deterministic: true,
            algo: Selection::parse("NCCL_ALGO", "tree").unwrap(),
            ..Config::default()
        };
        let topology = Topology::flat(4);
        let spec = |kind, count| CollSpec {
            kind,
            nranks: 4,
            root: 0,
            count,
        };
        let mut on = placement(&topology, true);
        on.board_bytes = 64 << 10;
        let choice = |kind, count, p: &Placement<'_>| choose(&config, &spec(kind, count), 4, p);
        // An all-reduce that fits the board goes there, whose fold follows
        // the stated order; device work, which has no board, takes the ring.
        let largest = choice(CollKind::AllReduce, 16 << 10, &on).unwrap();
        assert_eq!(largest.algorithm.name(), BOARD_ALGORITHM);
        let small = choice(CollKind::AllReduce, 2, &on).unwrap();
        assert_eq!(small.algorithm.name(), BOARD_ALGORITHM);
        assert_eq!(
            for_device_work(&config, small).algorithm.name(),
            OrderedRing.name()
        );
        // Everything else takes the ordered ring, whatever NCCL_ALGO says.
        let off = placement(&topology, true);
        for (kind, count, p) in [
            (CollKind::AllReduce, 2, &off),
            (CollKind::AllReduce, 1 << 20, &on),
            (CollKind::ReduceScatter, 8, &on),
            (CollKind::Reduce, 8, &on),
        ] {
            let name = choice(kind, count, p).unwrap().algorithm.name();
            assert_eq!(name, OrderedRing.name(), "{} of {count}", kind.name());
        }
    }

    fn pick(
        config: &Config,
        kind: CollKind,
        bytes: usize,
        topology: &Topology,
        shm: bool,
    ) -> (&'static str, Protocol) {
        let spec = CollSpec {
            kind,
            nranks: topology.nranks(),
            root: 0,
            count: bytes / 4,
        };
        let choice = choose(config, &spec, 4, &placement(topology, shm)).unwrap();
        (choice.algorithm.name(), choice.protocol)
    }

    #[test]
    fn the_model_follows_the_measured_protocols_and_picks_bandwidth_algorithms_for_large_calls() {
        let config = Config::default();
        let one_host = Topology::flat(4);
        // On a CPU, LL's flagged words cost a twentieth of Simple's
        // bandwidth: Simple for small calls (medium ones may go to LL128,
        // whose smaller chunks fill a pipeline sooner; see
        // `within_a_host_the_choice_replays_near_the_fastest_candidate`).
        for bytes in [8, 4096] {
            assert_eq!(
                pick(&config, CollKind::AllReduce, bytes, &one_host, true).1,
                Protocol::Simple
            );
        }
        // A latency-first algorithm for the smallest calls.
        let (algorithm, _) = pick(&config, CollKind::AllReduce, 8, &one_host, true);
        assert!(
            matches!(algorithm, "oneshot" | "rhd" | "tree"),
            "{algorithm}"
        );
        // Large calls go to a bandwidth-optimal algorithm with Simple.
        let (algorithm, proto) = pick(&config, CollKind::AllReduce, 64 << 20, &one_host, true);
        assert!(matches!(algorithm, "ring" | "rhd"), "{algorithm}");
        assert_eq!(proto, Protocol::Simple);
        // Across hosts, everything travels as Simple.
        let two_hosts = Topology::from_hosts(vec![0, 0, 1, 1]);
        assert_eq!(
            pick(&config, CollKind::AllReduce, 8, &two_hosts, false).1,
            Protocol::Simple
        );
        // Large all-reduces across hosts cross the network once per rail
        // (hier), or once each way (the double binary tree over 2 hosts,
        // each host the root of one tree and the leaf of the other), not
        // once per rank as the ring.
        let (algorithm, _) = pick(&config, CollKind::AllReduce, 64 << 20, &two_hosts, false);
        assert!(matches!(algorithm, "hier" | "tree"), "{algorithm}");
    }

    #[test]
    fn user_selections_narrow_the_choice_or_fail_clearly() {
        let topology = Topology::flat(4);
        let forced = Config {
            proto: Selection::parse("NCCL_PROTO", "LL128").unwrap(),
            algo: Selection::parse("NCCL_ALGO", "allreduce:tree").unwrap(),
            ..Config::default()
        };
        assert_eq!(
            pick(&forced, CollKind::AllReduce, 8, &topology, true),
            ("tree", Protocol::Ll128)
        );
        let none = Config {
            proto: Selection::parse("NCCL_PROTO", "^LL,LL128,Simple").unwrap(),
            ..Config::default()
        };
        let spec = CollSpec {
            kind: CollKind::AllReduce,
            nranks: 4,
            root: 0,
            count: 2,
        };
        let err = choose(&none, &spec, 4, &placement(&topology, true))
            .err()
            .unwrap();
        assert!(err.to_string().contains("NCCL_PROTO"), "{err}");
    }

    /// The replayed time of the candidate `choose` picks for `spec` on a
    /// host of `topology`'s ranks, of the fastest built-in candidate
    /// (every protocol, cut as `choose` cuts it), and the pick's name.
    fn replayed(config: &Config, spec: &CollSpec, topology: &Topology) -> (f64, f64, String) {
        let choice = choose(config, spec, 4, &placement(topology, true)).unwrap();
        let cluster = engine_cluster(topology, &LinkModel::MEASURED.links(1));
        let replay = |algorithm: &'static dyn Algorithm, protocol: Protocol| {
            let params = params_for(
                algorithm,
                topology,
                spec,
                4,
                Params {
                    nchannels: choice.params.nchannels,
                    chunk_elems: chunk_bytes(config, protocol) / 4,
                },
            );
            rccl_simulator::simulate(&cluster, spec, 4, algorithm, protocol, &params)
                .ok()
                .map(|r| r.time_us)
        };
        let fastest = rccl_algorithms::builtins()
            .iter()
            .filter(|a| a.supports(spec.kind))
            .flat_map(|&a| Protocol::ALL.map(|p| replay(a, p)))
            .flatten()
            .fold(f64::INFINITY, f64::min);
        let picked = replay(choice.algorithm, choice.protocol).unwrap();
        let name = format!("{}/{}", choice.algorithm.name(), choice.protocol.name());
        (picked, fastest, name)
    }

    #[test]
    fn within_a_host_the_choice_replays_near_the_fastest_candidate() {
        let config = Config::default();
        let mut worst = (0.0, String::new());
        for nranks in [2, 4] {
            let topology = Topology::flat(nranks);
            for kind in CollKind::ALL {
                for shift in (3..=27).step_by(4) {
                    let bytes = 1usize << shift;
                    let count = match kind {
                        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => {
                            bytes / 4 / nranks
                        }
                        _ => bytes / 4,
                    };
                    let spec = CollSpec {
                        kind,
                        nranks,
                        root: 0,
                        count: count.max(1),
                    };
                    let (picked, fastest, name) = replayed(&config, &spec, &topology);
                    let loss = picked / fastest - 1.0;
                    if loss > worst.0 {
                        worst = (
                            loss,
                            format!(
                                "{} on {nranks} ranks, {bytes} B: {name} replays in \
                                 {picked:.1} us, the fastest in {fastest:.1} us",
                                kind.name()
                            ),
                        );
                    }
                }
            }
        }
        println!("the worst pick: {}", worst.1);
        // The closed forms rank protocols only roughly where LL128's
        // smaller chunks and Simple's fewer steps nearly balance.
        assert!(worst.0 <= 0.10, "{}", worst.1);
    }

    #[test]
    fn channels_follow_the_rails_across_hosts() {
        let config = Config {
            max_channels: 8,
            ..Config::default()
        };
        let mib = 1 << 20;
        // Within a host: the fewest channels, whatever the rails.
        assert_eq!(channels_for(&config, 64 * mib, true, 4), 1);
        // Small calls: fewer channels than rails; from `rails` channels on,
        // a multiple of the rails, within NCCL_MIN/MAX_NCHANNELS.
        assert_eq!(channels_for(&config, 8, false, 2), 1);
        assert_eq!(channels_for(&config, mib, false, 2), 2);
        assert_eq!(channels_for(&config, 3 * mib, false, 4), 8);
        assert_eq!(channels_for(&config, 5 * mib / 2, false, 1), 5);
        assert_eq!(channels_for(&config, 64 * mib, false, 2), 8);
        let narrow = Config {
            min_channels: 3,
            max_channels: 3,
            ..Config::default()
        };
        assert_eq!(channels_for(&narrow, 64 * mib, false, 2), 3);
        assert_eq!(channels_for(&narrow, 8, false, 2), 3);
    }

    #[test]
    fn across_hosts_the_choice_is_the_closed_forms_and_near_the_fastest_replay() {
        use rccl_simulator::tune::{engine_cluster, fastest, params_for, Candidate, EngineLinks};
        let config = Config {
            max_channels: 4,
            ..Config::default()
        };
        let model = LinkModel::MEASURED;
        let mut picked = std::collections::BTreeSet::new();
        for (host_of, rails) in [
            (vec![0, 1, 2, 3, 4, 5, 6, 7], 1),
            (vec![0, 0, 1, 1], 2),
            (vec![0, 0, 1, 1, 2, 2, 3, 3], 2),
            (vec![0, 1, 0, 1, 2, 2], 1),
        ] {
            let topology = Topology::from_hosts(host_of.clone());
            for bytes in [64usize, 64 << 10, 16 << 20] {
                let spec = CollSpec {
                    kind: CollKind::AllReduce,
                    nranks: host_of.len(),
                    root: 0,
                    count: bytes / 4,
                };
                let mut at = placement(&topology, false);
                at.rails = rails;
                let choice = choose(&config, &spec, 4, &at).unwrap();
                // The same question asked of the simulator directly.
                let cluster = engine_cluster(
                    &topology,
                    &EngineLinks {
                        shm_gbs: model.shm_bandwidth_gbs,
                        shm_latency_us: model.shm_latency_us,
                        nic_gbs: model.net_bandwidth_gbs,
                        nic_latency_us: model.net_latency_us,
                        rails,
                    },
                );
                let allowed: Vec<&'static dyn Algorithm> = rccl_algorithms::builtins()
                    .iter()
                    .copied()
                    .filter(|a| a.supports(spec.kind) && a.supports_topology(&topology))
                    .collect();
                let base = Params {
                    nchannels: choice.params.nchannels,
                    chunk_elems: chunk_bytes(&config, Protocol::Simple) / 4,
                };
                let tried: Vec<Candidate<'_>> = allowed
                    .iter()
                    .map(|&algorithm| Candidate {
                        algorithm,
                        protocol: Protocol::Simple,
                        params: params_for(algorithm, &topology, &spec, 4, base),
                    })
                    .collect();
                let ranking = fastest(&cluster, &spec, 4, &tried);
                let best = ranking.times_us[ranking.best.unwrap()].unwrap();
                let chosen = allowed
                    .iter()
                    .position(|a| std::ptr::eq(*a, choice.algorithm))
                    .unwrap();
                let time = ranking.times_us[chosen].unwrap();
                // The closed forms rank close candidates only roughly
                // (simulator/tests/closed_form.rs measures how closely).
                assert!(
                    time <= best * 1.10,
                    "{host_of:?} x {rails} rails, {bytes} bytes: {} replays in {time:.1} us, \
                     the fastest in {best:.1} us",
                    choice.algorithm.name()
                );
                assert_eq!(choice.params, tried[chosen].params);
                assert_eq!(choice.protocol, Protocol::Simple);
                picked.insert(choice.algorithm.name());
            }
        }
        // The sizes and placements above do not all want one algorithm.
        assert!(picked.len() >= 2, "{picked:?}");
    }
}
