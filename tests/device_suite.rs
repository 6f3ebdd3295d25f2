//! The correctness suite through the C ABI on device buffers of the
//! emulated GPU, with streams: every collective x datatype x op (PreMulSum
//! and Avg included) x count, in place and out of place, for 1, 2, 3, 4
//! and 8 ranks as threads. Each rank checks its output against the
//! suite's reference (tests/common) and against the same call on host
//! buffers, bit for bit.

mod common;
mod device_cases;

use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::{all_cases, test_config};
use device_cases::{emu, last_error, read_back, run_case, to_device};
use parking_lot::Mutex;
use rccl::tuning::Selection;
use rccl::{CollKind, Communicator, DataType};
use rcclrs::registry::{self, Entry, Slot};
use rcclrs::*;

/// `nranks` communicators with the suite's settings, as C handles.
fn c_comms(nranks: usize) -> Vec<ncclComm_t> {
    c_comms_with(nranks, test_config())
}

/// `nranks` communicators with `config`, as C handles.
fn c_comms_with(nranks: usize, config: rccl::Config) -> Vec<ncclComm_t> {
    Communicator::init_all_config(nranks, config)
        .unwrap()
        .into_iter()
        .map(|comm| {
            let entry = Entry::new(Slot::Ready(comm), true, 0, None);
            registry::insert(entry.clone());
            entry.handle()
        })
        .collect()
}

fn suite(nranks: usize) {
    suite_with(nranks, test_config(), &CollKind::ALL, &DataType::ALL);
}

fn suite_with(nranks: usize, config: rccl::Config, kinds: &[CollKind], dtypes: &[DataType]) {
    emu();
    let comms = c_comms_with(nranks, config);
    let cases = all_cases(nranks, kinds, dtypes);
    let failures = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for (rank, &comm) in comms.iter().enumerate() {
            let (cases, failures) = (&cases, &failures);
            // Handles cross into the rank's thread as integers.
            let comm = comm as usize;
            s.spawn(move || {
                let comm = comm as ncclComm_t;
                let mut stream: cudaStream_t = null_mut();
                // SAFETY: a writable stream slot.
                assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
                for case in cases {
                    if let Err(msg) = run_case(case, comm, stream, nranks, rank) {
                        failures.lock().push(msg);
                        // SAFETY: this rank stops: its peers' waits end.
                        unsafe { ncclCommAbort(comm) };
                        return;
                    }
                }
                // SAFETY: the stream is idle and no longer used.
                assert_eq!(unsafe { rcclrsEmuStreamDestroy(stream) }, ncclSuccess);
                // SAFETY: a live handle, destroyed once.
                assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
            });
        }
    });
    let failures = failures.into_inner();
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

#[test]
fn one_rank() {
    suite(1);
}

#[test]
fn two_ranks() {
    suite(2);
}

#[test]
fn three_ranks() {
    suite(3);
}

#[test]
fn four_ranks() {
    suite(4);
}

#[test]
fn eight_ranks() {
    suite(8);
}

/// The LL and LL128 protocols, which the tuner does not pick for ranks of
/// one host, forced (`NCCL_PROTO`) through the interpreter's FIFOs, with
/// ring and tree (`NCCL_ALGO`): bitwise the host path's results with the
/// same settings.
#[test]
fn ll_and_ll128_forced() {
    let kinds = [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
    ];
    let dtypes = [DataType::Float32, DataType::Bfloat16, DataType::Int8];
    for proto in ["LL", "LL128"] {
        for algo in ["ring", "tree"] {
            let config = rccl::Config {
                proto: Selection::parse("NCCL_PROTO", proto).unwrap(),
                algo: Selection::parse("NCCL_ALGO", &format!("allreduce:{algo}")).unwrap(),
                ..test_config()
            };
            suite_with(3, config, &kinds, &dtypes);
        }
    }
}

/// Through the C ABI, outside any group: rank 0's call on device memory
/// returns although rank 1 has not called yet (this thread makes rank 1's
/// call only afterwards: a call that waited for its peer would never
/// return, and fails at its deadline instead); both complete at stream
/// synchronize.
#[test]
fn a_call_returns_before_its_peer_arrives_and_completes_at_synchronize() {
    emu();
    let comms = c_comms(2);
    let count = 1000;
    let streams: Vec<cudaStream_t> = (0..2)
        .map(|_| {
            let mut stream = null_mut();
            // SAFETY: a writable stream slot.
            assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
            stream
        })
        .collect();
    let bufs: Vec<(*mut u8, *mut u8)> = (0..2)
        .map(|r| {
            let values: Vec<u8> = vec![r as u8 + 1; count];
            (to_device(&values), to_device(&vec![0; count]))
        })
        .collect();
    let started = Instant::now();
    for (rank, &(send, recv)) in bufs.iter().enumerate() {
        // SAFETY: device buffers of `count` bytes, never freed.
        let rc = unsafe {
            ncclAllReduce(
                send.cast(),
                recv.cast(),
                count,
                DataType::Uint8 as ncclDataType_t,
                0,
                comms[rank],
                streams[rank],
            )
        };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comms[rank]));
    }
    assert!(started.elapsed() < Duration::from_secs(5), "a call blocked");
    for (rank, &stream) in streams.iter().enumerate() {
        // SAFETY: a live stream.
        assert_eq!(unsafe { rcclrsEmuStreamSynchronize(stream) }, ncclSuccess);
        assert_eq!(read_back(bufs[rank].1, count), vec![3u8; count]);
    }
}

/// Through the C ABI: counts beyond buffers that ncclMemAlloc made are
/// refused with ncclInvalidArgument naming the buffer, its allocation's
/// size and the count (an all-reduce of 2^40 floats on 4 KiB, a send of
/// 2^40, an all-gather whose receive buffer holds one rank's part), and
/// nothing is enqueued: the communicator then runs a call that fits.
#[test]
fn counts_beyond_an_ncclmemalloc_buffer_are_refused_naming_it() {
    emu();
    let comms = c_comms(2);
    let float = DataType::Float32 as ncclDataType_t;
    let bytes = 4096;
    let fits = bytes / 4;
    let mut streams = [null_mut(); 2];
    let mut bufs = [(null_mut(), null_mut()); 2];
    for rank in 0..2 {
        let (send, recv): &mut (*mut std::ffi::c_void, *mut std::ffi::c_void) = &mut bufs[rank];
        // SAFETY: writable slots.
        unsafe {
            assert_eq!(rcclrsEmuStreamCreate(&mut streams[rank]), ncclSuccess);
            assert_eq!(ncclMemAlloc(send, bytes), ncclSuccess);
            assert_eq!(ncclMemAlloc(recv, bytes), ncclSuccess);
        }
    }
    let (send, recv) = bufs[0];
    let huge = 1usize << 40;
    let refused = |rc: ncclResult_t, buffer: &str, count: usize| {
        assert_eq!(rc, ncclInvalidArgument, "count {count} on {buffer}");
        let said = last_error(comms[0]);
        for part in [
            buffer.to_string(),
            format!("count {count} "),
            format!("allocation ({bytes} bytes "),
        ] {
            assert!(said.contains(&part), "{part:?} not in {said:?}");
        }
        eprintln!("{said}");
    };
    // SAFETY: device buffers of `bytes`; the calls are refused before
    // anything is enqueued (what they check).
    unsafe {
        let rc = ncclAllReduce(send, recv, huge, float, 0, comms[0], streams[0]);
        refused(rc, "sendbuff", huge);
        let rc = ncclSend(send, huge, float, 1, comms[0], streams[0]);
        refused(rc, "sendbuff", huge);
        let rc = ncclAllGather(send, recv, fits, float, comms[0], streams[0]);
        refused(rc, "recvbuff", fits);
    }
    for rank in 0..2 {
        let (send, recv) = bufs[rank];
        // SAFETY: buffers of `fits` floats, freed after the stream ran.
        let rc = unsafe { ncclAllReduce(send, recv, fits, float, 0, comms[rank], streams[rank]) };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comms[rank]));
    }
    for rank in 0..2 {
        // SAFETY: live handles, each released once after its stream ran.
        unsafe {
            assert_eq!(rcclrsEmuStreamSynchronize(streams[rank]), ncclSuccess);
            assert_eq!(ncclMemFree(bufs[rank].0), ncclSuccess);
            assert_eq!(ncclMemFree(bufs[rank].1), ncclSuccess);
            assert_eq!(rcclrsEmuStreamDestroy(streams[rank]), ncclSuccess);
        }
    }
}

/// ncclCommDestroy right after enqueuing sends and receives on device
/// memory, before the peers arrive, behaves as a finalize then a destroy:
/// the work completes. A ring of four ranks, each sending its values to
/// the next and receiving from the previous; the last rank enqueues
/// 300 ms late, so its receiver destroys long before the data comes.
#[test]
fn destroy_right_after_enqueuing_lets_the_work_complete() {
    emu();
    let nranks = 4;
    let comms = c_comms(nranks);
    // Within the FIFOs (TEST_BUFFSIZE): a sender finishes its part, and
    // may destroy, before its late receiver comes.
    let count = 2048;
    std::thread::scope(|s| {
        for (rank, &comm) in comms.iter().enumerate() {
            // Handles cross into the rank's thread as integers.
            let comm = comm as usize;
            s.spawn(move || {
                let comm = comm as ncclComm_t;
                let mut stream: cudaStream_t = null_mut();
                // SAFETY: a writable stream slot.
                assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
                let send = to_device(&vec![rank as u8 + 1; count]);
                let recv = to_device(&vec![0; count]);
                let (next, prev) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
                if rank == nranks - 1 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                let uint8 = DataType::Uint8 as ncclDataType_t;
                // SAFETY: device buffers of `count` bytes, never freed; a
                // live communicator and stream.
                unsafe {
                    assert_eq!(ncclGroupStart(), ncclSuccess);
                    let sent = ncclSend(send.cast(), count, uint8, next as c_int, comm, stream);
                    let received = ncclRecv(recv.cast(), count, uint8, prev as c_int, comm, stream);
                    assert_eq!((sent, received), (ncclSuccess, ncclSuccess));
                    assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error(comm));
                }
                // SAFETY: a live handle, destroyed once.
                let destroyed = unsafe { ncclCommDestroy(comm) };
                assert_eq!(destroyed, ncclSuccess, "rank {rank}: {}", last_error(comm));
                // SAFETY: a live stream, idle once synchronized.
                unsafe {
                    assert_eq!(rcclrsEmuStreamSynchronize(stream), ncclSuccess);
                    assert_eq!(rcclrsEmuStreamDestroy(stream), ncclSuccess);
                }
                let got = read_back(recv, count);
                assert!(
                    got.iter().all(|&v| v == prev as u8 + 1),
                    "rank {rank}: {} of {count} bytes not received",
                    got.iter().filter(|&&v| v != prev as u8 + 1).count()
                );
            });
        }
    });
}

/// Calls on device memory of ranks in one process run as device work (the
/// kernels' interpreter, compiled for the host on the emulated GPU), never
/// the host executor: each call of each rank launches one block, whether
/// a collective, an in-place one-shot all-reduce (which the host runs on
/// its board) or a group of sends and receives, driven from one thread
/// for both ranks.
#[test]
fn calls_on_device_memory_run_as_device_work() {
    emu();
    let comms = c_comms(2);
    let mut stream: cudaStream_t = null_mut();
    // SAFETY: a writable stream slot.
    assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
    let count = 64;
    let bufs: Vec<*mut u8> = (0..2).map(|r| to_device(&[r as u8 + 1; 64])).collect();
    let outs: Vec<*mut u8> = (0..2).map(|_| to_device(&[0; 64])).collect();
    let group = |call: &dyn Fn(usize) -> ncclResult_t| {
        let before = rccl_device::emu::works_run();
        // SAFETY: plain group calls.
        assert_eq!(unsafe { ncclGroupStart() }, ncclSuccess);
        for (rank, &comm) in comms.iter().enumerate() {
            assert_eq!(call(rank), ncclSuccess, "{}", last_error(comm));
        }
        // SAFETY: as above.
        assert_eq!(unsafe { ncclGroupEnd() }, ncclSuccess);
        // SAFETY: a live stream.
        assert_eq!(unsafe { rcclrsEmuStreamSynchronize(stream) }, ncclSuccess);
        // Other tests of this binary may launch work meanwhile: at least
        // this group's two blocks ran.
        assert!(rccl_device::emu::works_run() >= before + 2);
    };
    let uint8 = DataType::Uint8 as ncclDataType_t;
    // In place, small: the host path would take the board.
    // SAFETY (each call): device buffers of `count` bytes, never freed.
    group(&|r| unsafe {
        ncclAllReduce(
            bufs[r].cast(),
            bufs[r].cast(),
            count,
            uint8,
            0,
            comms[r],
            stream,
        )
    });
    for &buf in &bufs {
        assert_eq!(read_back(buf, count), vec![3u8; count]);
    }
    group(&|r| unsafe {
        ncclAllReduce(
            bufs[r].cast(),
            outs[r].cast(),
            count,
            uint8,
            0,
            comms[r],
            stream,
        )
    });
    for &out in &outs {
        assert_eq!(read_back(out, count), vec![6u8; count]);
    }
    // Each rank sends its buffer to the other.
    group(&|r| unsafe {
        let peer = 1 - r as i32;
        let sent = ncclSend(bufs[r].cast(), count, uint8, peer, comms[r], stream);
        if sent != ncclSuccess {
            return sent;
        }
        ncclRecv(outs[r].cast(), count, uint8, peer, comms[r], stream)
    });
    for &out in &outs {
        assert_eq!(read_back(out, count), vec![3u8; count]);
    }
}

/// A PreMulSum scalar in device memory (`ncclScalarDevice`) is read when
/// the collective runs, in its stream's order: each rank's scalar is 1
/// when the op is made and when the call is made, and becomes 3 by a copy
/// its stream runs before the all-reduce; the sum is of 3 times each input.
#[test]
fn a_device_premulsum_scalar_is_read_when_the_collective_runs() {
    let device = emu();
    let comms = c_comms(2);
    let count = 256;
    let float32 = DataType::Float32 as ncclDataType_t;
    let three = 3.0f32.to_le_bytes();
    let mut streams = Vec::new();
    let mut outs = Vec::new();
    let mut gates = Vec::new();
    for (rank, &comm) in comms.iter().enumerate() {
        let mut stream: cudaStream_t = null_mut();
        // SAFETY: a writable stream slot.
        assert_eq!(unsafe { rcclrsEmuStreamCreate(&mut stream) }, ncclSuccess);
        let scalar = to_device(&1.0f32.to_le_bytes());
        let op = device_cases::c_op(
            comm,
            rccl::RedOp::PreMulSumDevice {
                scalar: scalar as usize,
            },
            DataType::Float32,
        );
        gates.push(device_cases::gate(stream));
        // SAFETY: 4 bytes each; `three` outlives the stream's work (it is
        // synchronized below).
        unsafe {
            device
                .stream(stream as usize)
                .unwrap()
                .copy_async(scalar, three.as_ptr(), 4)
        }
        .unwrap();
        let values: Vec<u8> = (0..count)
            .flat_map(|i| ((rank * 1000 + i) as f32).to_le_bytes())
            .collect();
        let (send, recv) = (to_device(&values), to_device(&vec![0; values.len()]));
        // SAFETY: device buffers of `count` floats, never freed.
        let rc =
            unsafe { ncclAllReduce(send.cast(), recv.cast(), count, float32, op, comm, stream) };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comm));
        streams.push(stream);
        outs.push(recv);
    }
    for gate in &gates {
        gate.store(true, std::sync::atomic::Ordering::Release);
    }
    for (rank, &stream) in streams.iter().enumerate() {
        // SAFETY: a live stream.
        assert_eq!(unsafe { rcclrsEmuStreamSynchronize(stream) }, ncclSuccess);
        let out = read_back(outs[rank], 4 * count);
        for (i, got) in out.chunks(4).enumerate() {
            let got = f32::from_le_bytes(got.try_into().unwrap());
            assert_eq!(got, 3.0 * (1000 + 2 * i) as f32, "rank {rank} element {i}");
        }
    }
}
