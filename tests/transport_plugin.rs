//! A transport added from outside the engine: a test-only entry of the
//! transport table whose FIFOs live on the heap of this process (for ranks
//! that are threads of one process), registered ahead of the built-in
//! ones, carries every collective and shows in `NCCL_DEBUG=INFO` output.
//! Its own binary, since registration is for the whole process; the work
//! runs in child processes so that their logs can be read. A second entry
//! whose setup fails on one rank checks that every peer hears why at once;
//! a third, which counts the device links it makes and has the built-in
//! `P2P/direct` make them, checks that device work takes its links from
//! the table too.

mod common;
mod device_cases;

use std::collections::HashMap;
use std::io;
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rccl::{Communicator, Config, RedOp};
use rccl_transports::table;
use rccl_transports::P2pDirect;
use rccl_transports::{fifo_bytes, HeapMemory};
use rccl_transports::{Connection, Fifo, Protocol};
use rccl_transports::{Context, DeviceLink, Pending, Setup, Transport};
use rcclrs::registry::{self, Entry, Slot};

const CHILD: &str = "RCCL_TRANSPORT_PLUGIN_CHILD";
const FAILING_CHILD: &str = "RCCL_FAILING_SETUP_CHILD";
const DEVICE_CHILD: &str = "RCCL_DEVICE_TRANSPORT_CHILD";

/// One pair's memory: per protocol a FIFO each way, and each side's note.
struct PairMemory {
    /// Per protocol: (leader to follower, follower to leader).
    fifos: Vec<(Arc<HeapMemory>, Arc<HeapMemory>)>,
    notes: [Mutex<Option<String>>; 2],
}

/// Pairs set up by a leading rank, waiting for the other side.
static PAIRS: Mutex<Option<HashMap<u64, Arc<PairMemory>>>> = Mutex::new(None);
static NEXT_PAIR: AtomicU64 = AtomicU64::new(1);
/// Connections the transport made.
static CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

struct Loop;

impl Transport for Loop {
    fn name(&self) -> &'static str {
        "LOOP/heap"
    }

    fn can_connect(&self, cx: &Context<'_>, peer: usize) -> bool {
        cx.endpoints[peer].process.pid == std::process::id()
    }

    fn setup(&self, cx: &Context<'_>, peer: usize, _channel: usize) -> io::Result<Setup> {
        if !cx.leads(peer) {
            return Ok(Setup {
                info: None,
                pending: Box::new(LoopPending { leader: None }),
            });
        }
        let shape = cx.fifo;
        let memory = || {
            Protocol::ALL
                .iter()
                .map(|&p| {
                    let len = fifo_bytes(p, shape.nslots, shape.slot_bytes(p));
                    (
                        Arc::new(HeapMemory::new(len)),
                        Arc::new(HeapMemory::new(len)),
                    )
                })
                .collect()
        };
        let pair = Arc::new(PairMemory {
            fifos: memory(),
            notes: Default::default(),
        });
        let id = NEXT_PAIR.fetch_add(1, Ordering::Relaxed);
        PAIRS
            .lock()
            .unwrap()
            .get_or_insert_with(HashMap::new)
            .insert(id, pair.clone());
        Ok(Setup {
            info: Some(id.to_le_bytes().to_vec()),
            pending: Box::new(LoopPending { leader: Some(pair) }),
        })
    }
}

struct LoopPending {
    leader: Option<Arc<PairMemory>>,
}

impl Pending for LoopPending {
    fn awaits_peer_info(&self) -> bool {
        self.leader.is_none()
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        _peer: usize,
        peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        let (pair, leader) = match self.leader.take() {
            Some(pair) => (pair, true),
            None => {
                let id = u64::from_le_bytes(peer_info.try_into().map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "a malformed pair id")
                })?);
                let pair = PAIRS.lock().unwrap().as_mut().and_then(|p| p.remove(&id));
                (pair.ok_or_else(|| io::Error::other("no such pair"))?, false)
            }
        };
        let fifo = |mem: &Arc<HeapMemory>, p: Protocol| {
            Fifo::in_memory(mem.clone(), p, cx.fifo.nslots, cx.fifo.slot_bytes(p))
        };
        let (mut send, mut recv) = (Vec::new(), Vec::new());
        for (&p, (ahead, back)) in Protocol::ALL.iter().zip(&pair.fifos) {
            let (out, inbound) = if leader { (ahead, back) } else { (back, ahead) };
            send.push(fifo(out, p));
            recv.push(fifo(inbound, p));
        }
        CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Box::new(LoopConnection {
            send,
            recv,
            pair,
            side: usize::from(!leader),
        })))
    }
}

struct LoopConnection {
    send: Vec<Fifo>,
    recv: Vec<Fifo>,
    pair: Arc<PairMemory>,
    side: usize,
}

impl Connection for LoopConnection {
    fn send_fifo(&self, proto: Protocol) -> &Fifo {
        &self.send[proto.index()]
    }
    fn recv_fifo(&self, proto: Protocol) -> &Fifo {
        &self.recv[proto.index()]
    }
    fn failure(&self) -> Option<String> {
        None
    }
    fn transport(&self) -> &'static str {
        "LOOP/heap"
    }
    fn close_with(&self, note: &str) {
        self.pair.notes[self.side]
            .lock()
            .unwrap()
            .get_or_insert_with(|| note.to_string());
        for fifo in self.send.iter().chain(&self.recv) {
            fifo.fail();
        }
    }
    fn peer_note(&self) -> Option<String> {
        self.pair.notes[1 - self.side].lock().unwrap().clone()
    }
}

/// The child: registers the transport, runs all-reduces and an all-gather
/// over 3 ranks on FIFOs (no board), prints what it saw.
#[test]
fn transport_plugin_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    table::register(Arc::new(Loop));
    let config = Config {
        board_bytes: 0,
        ..Config::default()
    };
    let comms = Communicator::init_all_config(3, config).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let n = 4096 + 7;
                let mine: Vec<f32> = (0..n).map(|i| (i * (comm.rank() + 1)) as f32).collect();
                let mut sum = vec![0f32; n];
                comm.all_reduce(&mine, &mut sum, RedOp::Sum).unwrap();
                assert!((0..n).all(|i| sum[i] == (i * 6) as f32));
                let mut all = vec![0u32; 3 * 100];
                comm.all_gather(&[comm.rank() as u32; 100], &mut all)
                    .unwrap();
                assert!((0..300).all(|i| all[i] == (i / 100) as u32));
            });
        }
    });
    println!("CONNECTIONS {}", CONNECTIONS.load(Ordering::Relaxed));
}

/// Runs the child test `test` (its environment flag `flag` set) with
/// connection logs of `subsystems`; the count it printed after `label`,
/// and its log.
fn run_child(test: &str, flag: &str, subsystems: &str, label: &str) -> (usize, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(flag, "1")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", subsystems)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let made = stdout
        .lines()
        .find_map(|l| l.split(&format!("{label} ")).nth(1))
        .unwrap_or_else(|| panic!("the child reports its {label}"))
        .trim()
        .parse()
        .unwrap();
    (made, stderr)
}

#[test]
fn a_transport_registered_from_outside_carries_collectives() {
    let (made, stderr) = run_child(
        "transport_plugin_child",
        CHILD,
        "INIT,SHM,NET",
        "CONNECTIONS",
    );
    // A ring of 3 ranks connects each rank to both neighbours, on every
    // channel; each connection counts once per side.
    assert!(made >= 6, "{made} connections\n{stderr}");
    assert!(stderr.contains("via LOOP/heap"), "{stderr}");
    assert!(!stderr.contains("via SHM/direct"), "{stderr}");
}

/// A transport whose connections never complete and whose setup fails on
/// rank 1: that rank stops at its first connection, telling that one peer;
/// the other peer waits on connections that cannot complete and hears
/// nothing through them.
struct FailsOnRankOne;

const INJECTED: &str = "injected setup failure";

impl Transport for FailsOnRankOne {
    fn name(&self) -> &'static str {
        "FAIL/rank1"
    }

    fn can_connect(&self, cx: &Context<'_>, peer: usize) -> bool {
        cx.endpoints[peer].process.pid == std::process::id()
    }

    fn setup(&self, cx: &Context<'_>, _peer: usize, _channel: usize) -> io::Result<Setup> {
        if cx.rank == 1 {
            return Err(io::Error::other(INJECTED));
        }
        Ok(Setup {
            info: Some(Vec::new()),
            pending: Box::new(NeverConnects),
        })
    }
}

struct NeverConnects;

impl Pending for NeverConnects {
    fn awaits_peer_info(&self) -> bool {
        true
    }

    fn connect(
        &mut self,
        _cx: &Context<'_>,
        _peer: usize,
        _peer_info: &[u8],
        _until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        Ok(None)
    }
}

/// The child: 3 ranks all-reduce over the failing entry; prints each
/// rank's outcome and when it came.
#[test]
fn failing_setup_child() {
    if std::env::var_os(FAILING_CHILD).is_none() {
        return;
    }
    table::register(Arc::new(FailsOnRankOne));
    let config = Config {
        board_bytes: 0,
        timeout: Duration::from_secs(20),
        ..Config::default()
    };
    let comms = Communicator::init_all_config(3, config).unwrap();
    let began = Instant::now();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let mut sum = [0f32; 64];
                let outcome = comm.all_reduce(&[1f32; 64], &mut sum, RedOp::Sum);
                println!(
                    "OUTCOME {} {} {}",
                    comm.rank(),
                    began.elapsed().as_millis(),
                    outcome.map_or_else(|e| e.to_string(), |()| "ok".to_string())
                );
            });
        }
    });
}

/// Every peer of the failing rank fails with its reason well before the
/// timeout (20 s), even those it never told: they are of its process.
#[test]
fn a_rank_whose_setup_fails_stops_every_peer_in_its_process_at_once() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "failing_setup_child", "--nocapture"])
        .env(FAILING_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let outcomes: Vec<(u128, &str)> = stdout
        .lines()
        .filter_map(|l| l.split("OUTCOME ").nth(1))
        .map(|l| {
            let mut words = l.splitn(3, ' ');
            let (_rank, ms, text) = (words.next(), words.next().unwrap(), words.next().unwrap());
            (ms.parse().unwrap(), text)
        })
        .collect();
    assert_eq!(outcomes.len(), 3, "{stdout}");
    for (ms, text) in outcomes {
        println!("{ms} ms: {text}");
        assert!(ms < 3_000, "took {ms} ms: {text}");
        assert!(text.contains(INJECTED), "does not give the cause: {text}");
        assert!(text.contains("rank 1"), "does not name rank 1: {text}");
    }
}

/// Device links the counting entry set up.
static DEVICE_LINKS: AtomicUsize = AtomicUsize::new(0);

/// Carries device work wherever the built-in `P2P/direct` does, which
/// makes its links; counts them.
struct CountsDeviceLinks;

impl Transport for CountsDeviceLinks {
    fn name(&self) -> &'static str {
        "COUNT/direct"
    }

    fn carries_device_work(&self, cx: &Context<'_>, peer: usize) -> bool {
        P2pDirect.carries_device_work(cx, peer)
    }

    fn setup_device(
        &self,
        cx: &Context<'_>,
        peer: usize,
        channel: usize,
        protocol: Protocol,
    ) -> io::Result<Setup<DeviceLink>> {
        let setup = P2pDirect.setup_device(cx, peer, channel, protocol)?;
        DEVICE_LINKS.fetch_add(1, Ordering::Relaxed);
        Ok(setup)
    }
}

/// The child: registers the counting entry, runs an all-reduce on device
/// buffers of the emulated GPU over 3 ranks, checks the sums and prints
/// how many device links the entry made.
#[test]
fn device_transport_child() {
    if std::env::var_os(DEVICE_CHILD).is_none() {
        return;
    }
    device_cases::emu();
    table::register(Arc::new(CountsDeviceLinks));
    let comms = Communicator::init_all_config(3, common::test_config()).unwrap();
    let count = 4096 + 7;
    std::thread::scope(|s| {
        for comm in comms {
            s.spawn(move || {
                let rank = comm.rank();
                let entry = Entry::new(Slot::Ready(comm), true, 0, None);
                registry::insert(entry.clone());
                let comm = entry.handle();
                let stream = device_cases::create_stream();
                let mine: Vec<f32> = (0..count).map(|i| (i * (rank + 1)) as f32).collect();
                let send = device_cases::to_device(bytemuck::cast_slice(&mine));
                let recv = device_cases::to_device(&vec![0u8; count * 4]);
                assert!(
                    device_cases::all_reduce_succeeds(comm, stream, send, recv, count),
                    "rank {rank}: {}",
                    device_cases::last_error(comm)
                );
                let sum = device_cases::read_back(recv, count * 4);
                let sum: &[f32] = bytemuck::cast_slice(&sum);
                assert!((0..count).all(|i| sum[i] == (i * 6) as f32), "rank {rank}");
                // SAFETY: a live handle, destroyed once, its work done.
                assert_eq!(
                    unsafe { rcclrs::ncclCommDestroy(comm) },
                    rcclrs::ncclSuccess
                );
                device_cases::destroy_stream(stream);
            });
        }
    });
    println!("DEVICE LINKS {}", DEVICE_LINKS.load(Ordering::Relaxed));
}

#[test]
fn a_device_transport_registered_from_outside_carries_device_work() {
    let (made, stderr) = run_child(
        "device_transport_child",
        DEVICE_CHILD,
        "INIT,P2P",
        "DEVICE LINKS",
    );
    // A ring of 3 ranks links each rank to both neighbours, on every
    // channel with work; each link counts once per side.
    assert!(made >= 6, "{made} device links\n{stderr}");
    assert!(
        stderr.contains("via COUNT/direct (device work)"),
        "{stderr}"
    );
    assert!(!stderr.contains("via P2P/direct"), "{stderr}");
}
