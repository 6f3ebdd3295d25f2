//! `ncclGroupSimulateEnd`: the estimate is the simulator's replay of the
//! engine's plan, nothing runs, bad arguments fail with the group closed,
//! and the communicators go on working.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use rccl_algorithms::{CollKind, CollSpec, Topology};
use rccl_simulator::{cluster, simulate, Protocol};
use rcclrs::*;

const N: usize = 4;
const FLOAT: ncclDataType_t = 7;
const SUM: ncclRedOp_t = 0;
const SMALL: usize = 1 << 10;
const LARGE: usize = 1 << 20;
/// `NCCL_UNDEF_FLOAT`, what `NCCL_SIM_INFO_INITIALIZER` leaves in
/// estimatedTime.
const UNDEF: f32 = -1.0;

fn sim_info() -> ncclSimInfo_t {
    // NCCL_SIM_INFO_INITIALIZER.
    ncclSimInfo_t {
        size: std::mem::size_of::<ncclSimInfo_t>(),
        magic: 0x7468_5283,
        version: NCCL_VERSION_CODE as u32,
        estimatedTime: UNDEF,
    }
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// `N` communicators of this process, and per rank a send buffer of
/// `rank + 1` and a receive buffer of a sentinel, `LARGE` floats each.
struct Ranks {
    comms: Vec<ncclComm_t>,
    send: Vec<Vec<f32>>,
    recv: Vec<Vec<f32>>,
}

const SENTINEL: f32 = -7.0;

impl Ranks {
    fn new() -> Ranks {
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
    fn queue(&mut self, ranks: &[usize], count: usize) {
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

    /// A group of all-reduces of `counts` on `ranks`, closed by
    /// ncclGroupSimulateEnd: its code and estimate.
    fn simulate(&mut self, ranks: &[usize], counts: &[usize]) -> (ncclResult_t, f32) {
        let mut info = sim_info();
        assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
        for &count in counts {
            self.queue(ranks, count);
        }
        let rc = unsafe { ncclGroupSimulateEnd(&mut info) };
        (rc, info.estimatedTime)
    }

    fn untouched(&self) -> bool {
        self.recv.iter().flatten().all(|&v| v == SENTINEL)
            && (0..N).all(|r| self.send[r].iter().all(|&v| v == r as f32 + 1.0))
    }

    /// A real all-reduce of `count` floats on every rank, checked.
    fn run_all_reduce(&mut self, count: usize) {
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

/// What the simulator computes directly for an all-reduce of `count`
/// floats over the `N` ranks of one host: the tuner's choice for the call,
/// replayed on the `local-shm` preset (`local-tcp` without shared memory).
fn direct_us(count: usize) -> f64 {
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
    };
    let choice = rccl::tuning::choose(&config, &spec, 4, &placement).unwrap();
    let protocol = Protocol::parse(choice.protocol.name()).unwrap();
    let cluster = cluster::local(N, config.shm_disable);
    simulate(
        &cluster,
        &spec,
        4,
        choice.algorithm,
        protocol,
        &choice.params,
    )
    .unwrap()
    .time_us
}

fn assert_close(got: f32, want: f64) {
    let rel = (got as f64 - want).abs() / want;
    assert!(rel <= 1e-6, "estimate {got} us, simulator {want} us");
}

#[test]
fn the_estimate_is_the_simulators_and_nothing_runs() {
    let mut ranks = Ranks::new();
    let every: Vec<usize> = (0..N).collect();

    // One all-reduce on every rank: the simulator's time for it.
    let (rc, small) = ranks.simulate(&every, &[SMALL]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert!(small > 0.0, "{small}");
    assert_close(small, direct_us(SMALL));
    assert!(ranks.untouched(), "a simulated group ran");

    // A larger call takes longer, as the simulator says.
    let (rc, large) = ranks.simulate(&every, &[LARGE]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(large, direct_us(LARGE));
    assert!(large > small, "{large} <= {small}");

    // Two operations on a communicator run one after another: the sum.
    let (rc, both) = ranks.simulate(&every, &[SMALL, LARGE]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert!(both > large, "{both} <= {large}");
    assert_close(both, direct_us(SMALL) + direct_us(LARGE));

    // One rank may ask alone: the replay covers every rank of the call.
    let (rc, alone) = ranks.simulate(&[0], &[LARGE]);
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    assert_close(alone, direct_us(LARGE));
    assert!(ranks.untouched(), "a simulated group ran");

    // The communicators go on: the one-rank simulation took no sequence
    // number, so every rank still agrees on the next collective.
    ranks.run_all_reduce(LARGE);
    ranks.run_all_reduce(SMALL);
}

#[test]
fn bad_calls_fail_clearly_and_close_the_group() {
    let mut ranks = Ranks::new();
    let every: Vec<usize> = (0..N).collect();

    // Outside a group.
    let mut info = sim_info();
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut info) }, ncclInvalidUsage);
    assert!(last_error().contains("without ncclGroupStart"));
    assert_eq!(info.estimatedTime, UNDEF);

    // NULL simInfo: the group is closed and nothing ran.
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    ranks.queue(&every, SMALL);
    assert_eq!(
        unsafe { ncclGroupSimulateEnd(null_mut()) },
        ncclInvalidArgument
    );
    assert!(last_error().contains("simInfo is NULL"), "{}", last_error());
    assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage);
    assert!(ranks.untouched());

    // A simInfo not made by NCCL_SIM_INFO_INITIALIZER.
    type Spoil = fn(&mut ncclSimInfo_t);
    let spoiled: [(Spoil, &str); 3] = [
        (|i| i.magic = 0, "magic"),
        (|i| i.size = 8, "size"),
        (|i| i.version = 0, "version"),
    ];
    for (spoil, field) in spoiled {
        let mut info = sim_info();
        spoil(&mut info);
        assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
        ranks.queue(&every, SMALL);
        assert_eq!(
            unsafe { ncclGroupSimulateEnd(&mut info) },
            ncclInvalidArgument,
            "{field}"
        );
        let message = last_error();
        assert!(
            message.contains(field) && message.contains("NCCL_SIM_INFO_INITIALIZER"),
            "{message}"
        );
        assert_eq!(info.estimatedTime, UNDEF);
        assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage, "{field}");
        assert!(ranks.untouched());
    }

    // Sends and receives are not modeled: refused, group closed.
    let mut info = sim_info();
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    ranks.queue(&every, SMALL);
    let rc = unsafe {
        ncclSend(
            ranks.send[0].as_ptr().cast(),
            4,
            FLOAT,
            1,
            ranks.comms[0],
            null_mut(),
        )
    };
    assert_eq!(rc, ncclSuccess);
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut info) }, ncclInvalidUsage);
    assert!(last_error().contains("send"), "{}", last_error());
    assert_eq!(info.estimatedTime, UNDEF);
    assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage);

    // A call that failed inside the group fails its simulated end too.
    let mut info = sim_info();
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    let rc = unsafe {
        ncclAllReduce(
            ranks.send[0].as_ptr().cast(),
            ranks.recv[0].as_mut_ptr().cast(),
            4,
            FLOAT,
            77,
            ranks.comms[0],
            null_mut(),
        )
    };
    assert_eq!(rc, ncclInvalidArgument);
    assert_eq!(
        unsafe { ncclGroupSimulateEnd(&mut info) },
        ncclInvalidArgument
    );
    assert_eq!(info.estimatedTime, UNDEF);
    assert_eq!(unsafe { ncclGroupEnd() }, ncclInvalidUsage);
    assert!(ranks.untouched());

    // Nested groups: the inner end only closes its level.
    let (mut inner, mut outer) = (sim_info(), sim_info());
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
    ranks.queue(&every, SMALL);
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut inner) }, ncclSuccess);
    assert_eq!(inner.estimatedTime, UNDEF);
    assert_eq!(unsafe { ncclGroupSimulateEnd(&mut outer) }, ncclSuccess);
    assert_close(outer.estimatedTime, direct_us(SMALL));
    assert!(ranks.untouched());

    // A normal group works afterwards.
    ranks.run_all_reduce(SMALL);
}
