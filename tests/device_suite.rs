//! The correctness suite through the C ABI on device buffers, with
//! streams: every collective x datatype x op (PreMulSum and Avg included)
//! x count, in place and out of place, for 1, 2, 3, 4 and 8 ranks as
//! threads. Each rank checks its output against the suite's reference
//! (tests/common) and against the same call on host buffers, bit for bit;
//! in the deterministic mode, against the mode's reference.
//! It runs on the emulated GPU, and with `RCCL_DEVICE=cuda` on the CUDA
//! backend: over the CUDA driver model in
//! [`the_suite_over_the_cuda_driver_model`], on a GPU where one is.

mod common;
mod device_cases;
#[path = "common/driver_model.rs"]
mod driver_model;

use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::{all_cases, check, deterministic, test_config, Case, CaseBuffers};
use device_cases::{
    create_stream, destroy_stream, device_under_test, last_error, read_back, run_case_of,
    synchronize, to_device,
};
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
    let cases = all_cases(nranks, kinds, dtypes);
    cases_with(nranks, config, &cases, CaseBuffers::new, check);
}

/// Runs `cases` on `nranks` ranks as threads with `config`, each rank's
/// buffers laid out by `buffers` and its device output checked by `check`.
fn cases_with(
    nranks: usize,
    config: rccl::Config,
    cases: &[Case],
    buffers: fn(&Case, usize, usize) -> CaseBuffers,
    check: fn(&Case, usize, usize, &[u8]) -> Result<(), String>,
) {
    device_under_test();
    let comms = c_comms_with(nranks, config);
    let failures = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for (rank, &comm) in comms.iter().enumerate() {
            let failures = &failures;
            // Handles cross into the rank's thread as integers.
            let comm = comm as usize;
            s.spawn(move || {
                let comm = comm as ncclComm_t;
                let stream = create_stream();
                for case in cases {
                    let at = (nranks, rank);
                    if let Err(msg) = run_case_of(case, comm, stream, at, buffers, check) {
                        failures.lock().push(msg);
                        // SAFETY: this rank stops: its peers' waits end.
                        unsafe { ncclCommAbort(comm) };
                        return;
                    }
                }
                destroy_stream(stream);
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

/// The deterministic mode on device memory: its calls give the
/// reference's bits (and the host path's) whatever algorithm, protocol,
/// channel count and rank count (the bits of a fixed rank count fixed).
#[test]
fn deterministic_calls_give_the_reference_bits() {
    let runs = [
        (4, "ring", "Simple", 2),
        (4, "tree", "LL", 3),
        (3, "rhd", "LL128", 1),
        (8, "oneshot", "Simple", 2),
    ];
    for (nranks, algo, proto, channels) in runs {
        let config = rccl::Config {
            deterministic: true,
            algo: Selection::parse("NCCL_ALGO", algo).unwrap(),
            proto: Selection::parse("NCCL_PROTO", proto).unwrap(),
            min_channels: channels,
            max_channels: channels,
            ..test_config()
        };
        let cases = deterministic::cases(nranks);
        cases_with(
            nranks,
            config,
            &cases,
            deterministic::buffers,
            deterministic::check,
        );
    }
}

/// Through the C ABI, outside any group: rank 0's call on device memory
/// returns although rank 1 has not called yet (this thread makes rank 1's
/// call only afterwards: a call that waited for its peer would never
/// return, and fails at its deadline instead); both complete at stream
/// synchronize.
#[test]
fn a_call_returns_before_its_peer_arrives_and_completes_at_synchronize() {
    device_under_test();
    let comms = c_comms(2);
    let count = 1000;
    let streams: Vec<cudaStream_t> = (0..2).map(|_| create_stream()).collect();
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
        synchronize(stream).unwrap();
        assert_eq!(read_back(bufs[rank].1, count), vec![3u8; count]);
    }
}

/// Through the C ABI: counts beyond buffers that ncclMemAlloc made are
/// refused with ncclInvalidArgument naming the buffer, its allocation's
/// size and the count (an all-reduce of 2^40 floats on 4 KiB, a send of
/// 2^40, an all-gather whose receive buffer holds one rank's part), and
/// nothing is enqueued: the communicator then runs a call that fits. The
/// allocation may be larger than asked (CUDA rounds it up to its
/// granularity, 2 MiB): the all-gather's part fills it.
#[test]
fn counts_beyond_an_ncclmemalloc_buffer_are_refused_naming_it() {
    let device = device_under_test();
    let comms = c_comms(2);
    let float = DataType::Float32 as ncclDataType_t;
    let bytes = 4096;
    let fits = bytes / 4;
    let streams = [create_stream(), create_stream()];
    let mut bufs = [(null_mut(), null_mut()); 2];
    for (send, recv) in &mut bufs {
        // SAFETY: writable slots.
        unsafe {
            assert_eq!(ncclMemAlloc(send, bytes), ncclSuccess);
            assert_eq!(ncclMemAlloc(recv, bytes), ncclSuccess);
        }
    }
    let (send, recv) = bufs[0];
    let held = device.allocation(recv.cast()).unwrap().1;
    assert!(held >= bytes);
    assert_eq!(device.allocation(send.cast()).unwrap().1, held);
    let part = held / 4;
    let huge = 1usize << 40;
    let refused = |rc: ncclResult_t, buffer: &str, count: usize| {
        assert_eq!(rc, ncclInvalidArgument, "count {count} on {buffer}");
        let said = last_error(comms[0]);
        for part in [
            buffer.to_string(),
            format!("count {count} "),
            format!("allocation ({held} bytes "),
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
        let rc = ncclAllGather(send, recv, part, float, comms[0], streams[0]);
        refused(rc, "recvbuff", part);
    }
    for rank in 0..2 {
        let (send, recv) = bufs[rank];
        // SAFETY: buffers of `fits` floats, freed after the stream ran.
        let rc = unsafe { ncclAllReduce(send, recv, fits, float, 0, comms[rank], streams[rank]) };
        assert_eq!(rc, ncclSuccess, "{}", last_error(comms[rank]));
    }
    for rank in 0..2 {
        synchronize(streams[rank]).unwrap();
        // SAFETY: live handles, each released once after its stream ran.
        unsafe {
            assert_eq!(ncclMemFree(bufs[rank].0), ncclSuccess);
            assert_eq!(ncclMemFree(bufs[rank].1), ncclSuccess);
        }
        destroy_stream(streams[rank]);
    }
}

/// ncclCommDestroy right after enqueuing sends and receives on device
/// memory, before the peers arrive, behaves as a finalize then a destroy:
/// the work completes. A ring of four ranks, each sending its values to
/// the next and receiving from the previous; the last rank enqueues
/// 300 ms late, so its receiver destroys long before the data comes.
#[test]
fn destroy_right_after_enqueuing_lets_the_work_complete() {
    device_under_test();
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
                let stream = create_stream();
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
                synchronize(stream).unwrap();
                destroy_stream(stream);
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
/// kernels, or on the emulated GPU their interpreter compiled for the
/// host), never the host executor: each call of each rank launches one
/// block, whether a collective, an in-place one-shot all-reduce (which the
/// host runs on its board) or a group of sends and receives, driven from
/// one thread for both ranks. The blocks are counted on the emulated GPU
/// only (the CUDA backend keeps no count); on CUDA the results are checked.
#[test]
fn calls_on_device_memory_run_as_device_work() {
    let counted = device_under_test().backend() == "emu";
    let comms = c_comms(2);
    let stream = create_stream();
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
        synchronize(stream).unwrap();
        // Other tests of this binary may launch work meanwhile: at least
        // this group's two blocks ran.
        assert!(!counted || rccl_device::emu::works_run() >= before + 2);
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
    let device = device_under_test();
    let comms = c_comms(2);
    let count = 256;
    let float32 = DataType::Float32 as ncclDataType_t;
    let three = 3.0f32.to_le_bytes();
    let mut streams = Vec::new();
    let mut outs = Vec::new();
    let mut gates = Vec::new();
    for (rank, &comm) in comms.iter().enumerate() {
        let stream = create_stream();
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
        synchronize(stream).unwrap();
        let out = read_back(outs[rank], 4 * count);
        for (i, got) in out.chunks(4).enumerate() {
            let got = f32::from_le_bytes(got.try_into().unwrap());
            assert_eq!(got, 3.0 * (1000 + 2 * i) as f32, "rank {rank} element {i}");
        }
    }
}

/// The suite on the CUDA backend, unchanged, over the CUDA driver model
/// with its strict defaults (allocation waits for running kernels,
/// synchronous copies and memsets land late), in a child process: every
/// rank count, the forced protocols, and the stream-order tests above.
/// The ranks as threads share device 0, so all their blocks must be
/// resident at once: the model gets the SMs of an H200 (132) instead of
/// its default 4.
#[test]
fn the_suite_over_the_cuda_driver_model() {
    driver_model::over_the_model(
        "the_suite_over_the_cuda_driver_model",
        &[("RCCL_CUDA_MODEL_SMS", "132")],
        || {
            let parts: [(&str, fn()); 12] = [
                ("one_rank", one_rank),
                ("two_ranks", two_ranks),
                ("three_ranks", three_ranks),
                ("four_ranks", four_ranks),
                ("eight_ranks", eight_ranks),
                ("ll_and_ll128_forced", ll_and_ll128_forced),
                (
                    "deterministic_calls_give_the_reference_bits",
                    deterministic_calls_give_the_reference_bits,
                ),
                (
                    "a_call_returns_before_its_peer_arrives_and_completes_at_synchronize",
                    a_call_returns_before_its_peer_arrives_and_completes_at_synchronize,
                ),
                (
                    "counts_beyond_an_ncclmemalloc_buffer_are_refused_naming_it",
                    counts_beyond_an_ncclmemalloc_buffer_are_refused_naming_it,
                ),
                (
                    "destroy_right_after_enqueuing_lets_the_work_complete",
                    destroy_right_after_enqueuing_lets_the_work_complete,
                ),
                (
                    "calls_on_device_memory_run_as_device_work",
                    calls_on_device_memory_run_as_device_work,
                ),
                (
                    "a_device_premulsum_scalar_is_read_when_the_collective_runs",
                    a_device_premulsum_scalar_is_read_when_the_collective_runs,
                ),
            ];
            assert_eq!(device_under_test().backend(), "cuda");
            for (name, part) in parts {
                let started = Instant::now();
                part();
                eprintln!("{name}: {:?} over the model", started.elapsed());
            }
        },
    );
}
