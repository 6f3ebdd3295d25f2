//! Device work on the host twin: rccl-algorithms' schedules encoded for
//! the kernels' interpreter (kernels/work.h) and run by one thread per rank
//! and channel over FIFOs in host memory, for every protocol, against the
//! result the host path computes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rccl::kernels::ReduceKernel;
use rccl::{DataType, RedOp};
use rccl_algorithms::{builtin, CollKind, CollSpec, Params, Topology};
use rccl_device::abi::{op, FifoView};
use rccl_device::twin::{self, ChannelEnd};
use rccl_device::work::{encode, WorkCall, WorkLinks};
use rccl_transports::Protocol;
use rccl_transports::{fifo_bytes, FifoMemory, HeapMemory};

const SLOT_BYTES: usize = 256;
const NSLOTS: usize = 4;

/// Every directed FIFO of every channel, and each rank's staging buffers.
struct Fabric {
    protocol: Protocol,
    /// `fifos[channel][from][to]`.
    fifos: Vec<Vec<Vec<Arc<HeapMemory>>>>,
    /// `scratch[rank][channel]`.
    scratch: Vec<Vec<Vec<u8>>>,
}

impl Fabric {
    fn new(protocol: Protocol, nranks: usize, nchannels: usize) -> Fabric {
        let bytes = fifo_bytes(protocol, NSLOTS, SLOT_BYTES);
        Fabric {
            protocol,
            fifos: (0..nchannels)
                .map(|_| {
                    (0..nranks)
                        .map(|_| {
                            (0..nranks)
                                .map(|_| Arc::new(HeapMemory::new(bytes)))
                                .collect()
                        })
                        .collect()
                })
                .collect(),
            scratch: (0..nranks)
                .map(|_| (0..nchannels).map(|_| vec![0u8; SLOT_BYTES]).collect())
                .collect(),
        }
    }

    fn view(&self, mem: &HeapMemory) -> FifoView {
        FifoView::whole(
            mem.base(),
            self.protocol.abi(),
            NSLOTS as u32,
            SLOT_BYTES as u32,
        )
    }
}

/// One rank's view of the fabric.
struct RankLinks<'a> {
    fabric: &'a Fabric,
    rank: usize,
}

impl WorkLinks for RankLinks<'_> {
    fn fifos(&self, channel: usize, peer: usize) -> (FifoView, FifoView) {
        let f = &self.fabric.fifos[channel];
        (
            self.fabric.view(&f[self.rank][peer]),
            self.fabric.view(&f[peer][self.rank]),
        )
    }
    fn scratch(&self, channel: usize) -> (*mut u8, u64) {
        let buf = &self.fabric.scratch[self.rank][channel];
        // The interpreter writes the buffer through this address; no Rust
        // reference to it is used while the work runs.
        (buf.as_ptr().cast_mut(), buf.len() as u64)
    }
}

/// Runs an all-reduce of `inputs` with `algorithm` (one per rank, `count` elements of
/// `dtype`) through device work on the twin; each rank's output.
fn all_reduce(
    algorithm: &str,
    dtype: DataType,
    red: RedOp,
    protocol: Protocol,
    nchannels: usize,
    inputs: &[Vec<u8>],
) -> Vec<Vec<u8>> {
    let nranks = inputs.len();
    let count = inputs[0].len() / dtype.size();
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks,
        root: 0,
        count,
    };
    let params = Params {
        nchannels,
        chunk_elems: 48,
    };
    let algorithm = builtin(algorithm).expect("algorithm");
    let fabric = Fabric::new(protocol, nranks, nchannels);
    let mut outputs: Vec<Vec<u8>> = inputs.iter().map(|i| vec![0u8; i.len()]).collect();
    let abort = AtomicU32::new(0);
    let (code, scalar) = match red {
        RedOp::Sum => (op::SUM, 0),
        RedOp::Avg => (op::AVG, 0),
        RedOp::PreMulSum { scalar } => (op::PRE_MUL_SUM, u64::from_le_bytes(scalar)),
        other => panic!("{other:?} not used here"),
    };
    let works: Vec<_> = (0..nranks)
        .map(|rank| {
            let schedule = algorithm.schedule(&spec, rank, &params, &Topology::flat(nranks));
            let call = WorkCall {
                sendbuf: inputs[rank].as_ptr(),
                recvbuf: outputs[rank].as_mut_ptr(),
                dtype: dtype as i32,
                op: code,
                nranks: nranks as u64,
                scalar,
                scalar_ptr: std::ptr::null(),
                elem_size: dtype.size() as u32,
                tag: [1, 2, count as u32],
                abort: abort.as_ptr(),
            };
            encode(
                &schedule,
                &call,
                &RankLinks {
                    fabric: &fabric,
                    rank,
                },
            )
            .expect("encodes")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ends: Vec<ChannelEnd> = std::thread::scope(|s| {
        let runs: Vec<_> = works
            .iter()
            .flat_map(|work| (0..nchannels).map(move |c| (work, c)))
            .map(|(work, c)| {
                // SAFETY: every address in `work` points into `inputs`,
                // `outputs` and `fabric`, which outlive the scope; each
                // channel of each rank runs on exactly one thread.
                s.spawn(move || unsafe { twin::run_channel(work, c, u64::MAX) })
            })
            .collect();
        // A stuck run is stopped through the abort word, not waited on.
        while !runs.iter().all(|r| r.is_finished()) {
            if Instant::now() > deadline {
                abort.store(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        runs.into_iter()
            .map(|r| r.join().expect("no panic"))
            .collect()
    });
    assert!(ends.iter().all(|&e| e == ChannelEnd::Done), "{ends:?}");
    outputs
}

/// The all-reduce's result as the host computes it: every input
/// transformed once, partial results combined without it.
fn expected(dtype: DataType, red: RedOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let n = inputs.len();
    let count = inputs[0].len() / dtype.size();
    let input_kernel = ReduceKernel::new(dtype, red, n).expect("kernel");
    let partial = match red {
        RedOp::PreMulSum { .. } => RedOp::Sum,
        RedOp::Avg if dtype.is_float() => RedOp::Sum,
        other => other,
    };
    let partial_kernel = ReduceKernel::new(dtype, partial, n).expect("kernel");
    // Exact data (small integers), so the order of the ring does not
    // matter here: fold rank 0..n.
    let mut acc = vec![0u8; count * dtype.size()];
    // SAFETY: every buffer holds `count` elements; acc is disjoint from
    // the inputs.
    unsafe { input_kernel.run(None, inputs[0].as_ptr(), acc.as_mut_ptr(), count, n == 1) };
    for (r, input) in inputs.iter().enumerate().skip(1) {
        let mut term = vec![0u8; acc.len()];
        // SAFETY: as above.
        unsafe {
            input_kernel.run(None, input.as_ptr(), term.as_mut_ptr(), count, false);
            let out = acc.as_mut_ptr();
            partial_kernel.run(
                Some(out.cast_const()),
                term.as_ptr(),
                out,
                count,
                r == n - 1,
            );
        }
    }
    acc
}

fn inputs(dtype: DataType, nranks: usize, count: usize) -> Vec<Vec<u8>> {
    (0..nranks)
        .map(|r| {
            let mut buf = vec![0u8; count * dtype.size()];
            for (i, chunk) in buf.chunks_mut(dtype.size()).enumerate() {
                // Small integers (multiples of the rank count for Avg):
                // every partial sum is exact in every type.
                let v = (((i * 7 + r * 13) % 16) * nranks) as f64;
                rccl::kernels::encode_f64(dtype, v, chunk);
            }
            buf
        })
        .collect()
}

#[test]
fn ring_and_tree_all_reduce_run_as_device_work_on_every_protocol() {
    let cases = [
        (DataType::Int32, RedOp::Sum),
        (DataType::Float32, RedOp::Avg),
        (DataType::Bfloat16, RedOp::Sum),
        (DataType::Int64, RedOp::Avg),
        (
            DataType::Float16,
            RedOp::PreMulSum {
                scalar: 0x4000u64.to_le_bytes(), // 2.0
            },
        ),
    ];
    for algorithm in ["ring", "tree", "rhd", "oneshot"] {
        for protocol in Protocol::ALL {
            for (dtype, red) in cases {
                for (nranks, nchannels, count) in [(4, 1, 1000), (3, 2, 777), (2, 2, 64)] {
                    let ins = inputs(dtype, nranks, count);
                    let outs = all_reduce(algorithm, dtype, red, protocol, nchannels, &ins);
                    let want = expected(dtype, red, &ins);
                    for (rank, out) in outs.iter().enumerate() {
                        assert!(
                            *out == want,
                            "{algorithm} {protocol:?} {dtype:?} {red:?} {nranks} ranks \
                             {nchannels} channels: rank {rank} differs"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_stuck_channel_stops_on_the_abort_word() {
    // Rank 1 never runs: rank 0's ring waits for it until aborted.
    let fabric = Fabric::new(Protocol::Simple, 2, 1);
    let spec = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 2,
        root: 0,
        count: 64,
    };
    let params = Params {
        nchannels: 1,
        chunk_elems: 16,
    };
    let schedule = builtin("ring")
        .expect("ring")
        .schedule(&spec, 0, &params, &Topology::flat(2));
    let input = vec![1u8; 256];
    let mut output = vec![0u8; 256];
    let abort = AtomicU32::new(0);
    let call = WorkCall {
        sendbuf: input.as_ptr(),
        recvbuf: output.as_mut_ptr(),
        dtype: DataType::Int32 as i32,
        op: op::SUM,
        nranks: 2,
        scalar: 0,
        scalar_ptr: std::ptr::null(),
        elem_size: 4,
        tag: [0; 3],
        abort: abort.as_ptr(),
    };
    let work = encode(
        &schedule,
        &call,
        &RankLinks {
            fabric: &fabric,
            rank: 0,
        },
    )
    .expect("encodes");
    let end = std::thread::scope(|s| {
        // SAFETY: the buffers and the fabric outlive the scope.
        let run = s.spawn(|| unsafe { twin::run_channel(&work, 0, u64::MAX) });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!run.is_finished(), "rank 0 cannot finish alone");
        abort.store(1, Ordering::Relaxed);
        run.join().expect("no panic")
    });
    assert_eq!(end, ChannelEnd::Aborted);
    // With a deadline instead (1 µs after it starts), it gives up.
    abort.store(0, Ordering::Relaxed);
    // SAFETY: as above.
    assert_eq!(
        unsafe { twin::run_channel(&work, 0, 1000) },
        ChannelEnd::GaveUp
    );
}
