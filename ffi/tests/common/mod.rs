//! What the `ncclGroupSimulateEnd` tests share: communicators with
//! sentinel buffers, simulated groups, and the simulator's own answers
//! to compare with.

// Each test binary uses part of this.
#![allow(dead_code)]

use std::ffi::CStr;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rccl_algorithms::{CollKind, CollSpec, Topology};
use rccl_simulator::{cluster, simulate, simulate_p2p, ClusterSpec, P2pOp, Params, Protocol};
use rcclrs::*;

pub const N: usize = 4;
pub const FLOAT: ncclDataType_t = 7;
pub const SUM: ncclRedOp_t = 0;
pub const SMALL: usize = 1 << 10;
pub const LARGE: usize = 1 << 20;
/// `NCCL_UNDEF_FLOAT`, what `NCCL_SIM_INFO_INITIALIZER` leaves in
/// estimatedTime.
pub const UNDEF: f32 = -1.0;
const SENTINEL: f32 = -7.0;

pub fn sim_info() -> ncclSimInfo_t {
    // NCCL_SIM_INFO_INITIALIZER.
    ncclSimInfo_t {
        size: std::mem::size_of::<ncclSimInfo_t>(),
        magic: 0x7468_5283,
        version: NCCL_VERSION_CODE as u32,
        estimatedTime: UNDEF,
    }
}

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// A send or receive of `count` floats with a peer.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    Send(usize, usize),
    Recv(usize, usize),
}

/// `N` communicators of this process, and per rank a send buffer of
/// `rank + 1` and a receive buffer of a sentinel, `LARGE` floats each.
pub struct Ranks {
    pub comms: Vec<ncclComm_t>,
    pub send: Vec<Vec<f32>>,
    pub recv: Vec<Vec<f32>>,
}

impl Ranks {
    pub fn new() -> Ranks {
        let mut comms = vec![null_mut(); N];
        assert_eq!(
            unsafe { ncclCommInitAll(comms.as_mut_ptr(), N as i32, null()) },
            ncclSuccess,
            "{}",
            last_error()
        );
        Ranks {
            comms,
            send: (0..N).map(|r| vec![r as f32 + 1.0; LARGE]).collect(),
            recv: vec![vec![SENTINEL; LARGE]; N],
        }
    }

    /// Queues an all-reduce of `count` floats on `ranks`.
    pub fn queue(&mut self, ranks: &[usize], count: usize) {
        for &r in ranks {
            let rc = unsafe {
                ncclAllReduce(
                    self.send[r].as_ptr().cast(),
                    self.recv[r].as_mut_ptr().cast(),
                    count,
                    FLOAT,
                    SUM,
                    self.comms[r],
                    null_mut(),
                )
            };
            assert_eq!(rc, ncclSuccess, "{}", last_error());
        }
    }

    /// Queues `calls` on `rank` (its peers post nothing).
    pub fn queue_p2p(&mut self, rank: usize, calls: &[Call]) {
        for &call in calls {
            let rc = match call {
                Call::Send(peer, count) => unsafe {
                    ncclSend(
                        self.send[rank].as_ptr().cast(),
                        count,
                        FLOAT,
                        peer as i32,
                        self.comms[rank],
                        null_mut(),
                    )
                },
                Call::Recv(peer, count) => unsafe {
                    ncclRecv(
                        self.recv[rank].as_mut_ptr().cast(),
                        count,
                        FLOAT,
                        peer as i32,
                        self.comms[rank],
                        null_mut(),
                    )
                },
            };
            assert_eq!(rc, ncclSuccess, "{}", last_error());
        }
    }

    /// A group of all-reduces of `counts` on `ranks`, closed by
    /// ncclGroupSimulateEnd: its code and estimate.
    pub fn simulate(&mut self, ranks: &[usize], counts: &[usize]) -> (ncclResult_t, f32) {
        self.simulate_group(|r| {
            for &count in counts {
                r.queue(ranks, count);
            }
        })
    }

    /// A group of `calls` on `rank` alone, closed by ncclGroupSimulateEnd.
    pub fn simulate_p2p(&mut self, rank: usize, calls: &[Call]) -> (ncclResult_t, f32) {
        self.simulate_group(|r| r.queue_p2p(rank, calls))
    }

    /// The group `queue` builds, closed by ncclGroupSimulateEnd: its code
    /// and estimate. The peers of its sends and receives never post
    /// theirs, so a simulated end that ran anything would wait for them:
    /// one that has not returned within a minute aborts the test.
    pub fn simulate_group(&mut self, queue: impl FnOnce(&mut Ranks)) -> (ncclResult_t, f32) {
        let _watchdog = Watchdog::start(Duration::from_secs(60));
        let mut info = sim_info();
        assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
        queue(self);
        let rc = unsafe { ncclGroupSimulateEnd(&mut info) };
        (rc, info.estimatedTime)
    }

    pub fn untouched(&self) -> bool {
        self.recv.iter().flatten().all(|&v| v == SENTINEL)
            && (0..N).all(|r| self.send[r].iter().all(|&v| v == r as f32 + 1.0))
    }

    /// A real all-reduce of `count` floats on every rank, checked.
    pub fn run_all_reduce(&mut self, count: usize) {
        assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
        self.queue(&(0..N).collect::<Vec<_>>(), count);
        assert_eq!(unsafe { ncclGroupEnd() }, ncclSuccess, "{}", last_error());
        let want = (N * (N + 1) / 2) as f32;
        for recv in &mut self.recv {
            assert!(recv[..count].iter().all(|&v| v == want));
            recv.fill(SENTINEL);
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for &c in &self.comms {
            assert_eq!(unsafe { ncclCommDestroy(c) }, ncclSuccess);
        }
    }
}

/// Aborts the process unless dropped within its time: a hang fails the
/// test instead of stalling the suite.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn start(limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let seen = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while start.elapsed() < limit {
                if seen.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("ncclGroupSimulateEnd did not return within {limit:?}");
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `base` shaped as the test's communicators: `N` ranks on one host, with
/// the FIFO slot sizes and streaming threshold of this environment's
/// settings.
pub fn shaped(base: &ClusterSpec) -> ClusterSpec {
    let config = rccl::Config::from_env().unwrap();
    let mut c = base.with_placement(&[0; N]);
    let [ll, ll128, simple] = config.fifo_shape().slot_bytes;
    c.protocols.ll.slot_bytes = ll;
    c.protocols.ll128.slot_bytes = ll128;
    c.protocols.simple.slot_bytes = simple;
    c.stream_from(config.nt_store_bytes);
    c
}

/// The default modeled cluster: `local-shm`, `local-tcp` without shared
/// memory.
pub fn local() -> ClusterSpec {
    let config = rccl::Config::from_env().unwrap();
    shaped(&cluster::local(N, config.shm_disable))
}

/// What the simulator computes directly for an all-reduce of `count`
/// floats over the `N` ranks of one host: the tuner's choice for the call,
/// replayed on `cluster`.
pub fn direct_us_on(cluster: &ClusterSpec, count: usize) -> f64 {
    let config = rccl::Config::from_env().unwrap();
    let topology = Topology::flat(N);
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: N,
        root: 0,
        count,
    };
    let all_shm = !config.shm_disable;
    let model = rccl::tuning::LinkModel::from_env();
    let placement = rccl::tuning::Placement {
        all_shm,
        topology: &topology,
        in_place: false,
        board_bytes: if all_shm { config.board_bytes } else { 0 },
        model: &model,
        rails: 1,
        tuner: None,
    };
    let choice = rccl::tuning::choose(&config, &spec, 4, &placement).unwrap();
    let protocol = Protocol::parse(choice.protocol.name()).unwrap();
    simulate(
        cluster,
        &spec,
        4,
        choice.algorithm,
        protocol,
        &choice.params,
    )
    .unwrap()
    .time_us
}

/// [`direct_us_on`] the default cluster.
pub fn direct_us(count: usize) -> f64 {
    direct_us_on(&local(), count)
}

/// What the simulator computes directly for `rank`'s `calls` on
/// `cluster`: the engine's channels, protocol and chunk for the batch,
/// replayed by `simulate_p2p`.
pub fn direct_p2p_us_on(cluster: &ClusterSpec, rank: usize, calls: &[Call]) -> f64 {
    let config = rccl::Config::from_env().unwrap();
    let ops: Vec<P2pOp> = calls
        .iter()
        .map(|&c| match c {
            Call::Send(peer, count) => P2pOp::Send {
                peer,
                offset: 0,
                len: count * 4,
            },
            Call::Recv(peer, count) => P2pOp::Recv {
                peer,
                offset: 0,
                len: count * 4,
            },
        })
        .collect();
    let largest = calls
        .iter()
        .map(|&(Call::Send(_, n) | Call::Recv(_, n))| n * 4)
        .max()
        .unwrap_or(0);
    let (nchannels, protocol) = rccl::tuning::p2p_choice(&config, largest, 1);
    let params = Params {
        nchannels,
        chunk_elems: rccl::tuning::chunk_bytes(&config, protocol),
    };
    let protocol = Protocol::parse(protocol.name()).unwrap();
    simulate_p2p(cluster, rank, &ops, protocol, &params)
        .unwrap()
        .time_us
}

/// [`direct_p2p_us_on`] the default cluster.
pub fn direct_p2p_us(rank: usize, calls: &[Call]) -> f64 {
    direct_p2p_us_on(&local(), rank, calls)
}

/// `got` (the C ABI's `float`) equals `want` to its precision.
pub fn assert_close(got: f32, want: f64) {
    let rel = (got as f64 - want).abs() / want;
    assert!(rel <= 1e-6, "estimate {got} us, simulator {want} us");
}
