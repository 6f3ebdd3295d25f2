//! The correctness suite shared by the thread and process tests: every
//! collective x datatype x op x count x in-place/out-of-place, each rank
//! checking its own output against a reference computed here,
//! independently of the engine's kernels.

#![allow(dead_code)]

pub mod deterministic;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rccl::device::Stream;
use rccl::{CollKind, Communicator, Config, DataType, RedOp};

/// FIFO bytes per connection in tests: small, so that modest counts span
/// several pipeline chunks and slots.
pub const TEST_BUFFSIZE: usize = 8 << 10;

/// The settings every test communicator uses: two channels, small FIFOs,
/// shared memory between ranks of this host.
pub fn test_config() -> Config {
    Config {
        timeout: std::time::Duration::from_secs(60),
        min_channels: 2,
        max_channels: 2,
        buffsize: TEST_BUFFSIZE,
        ll_buffsize: TEST_LL_BUFFSIZE,
        ll128_buffsize: TEST_LL128_BUFFSIZE,
        ..Config::default()
    }
}

/// LL and LL128 FIFO bytes in tests: slots of 256 and 960 payload bytes.
pub const TEST_LL_BUFFSIZE: usize = 2 << 10;
pub const TEST_LL128_BUFFSIZE: usize = 7680;

/// As [`test_config`], through TCP sockets only.
pub fn tcp_config() -> Config {
    Config {
        shm_disable: true,
        ..test_config()
    }
}

/// The largest pipeline chunk the tuner uses under [`test_config`] (that
/// of the Simple protocol), in bytes.
pub fn chunk_bytes() -> usize {
    rccl::tuning::chunk_bytes(&test_config(), rccl_transports::Protocol::Simple)
}

/// Every reduction op the suite runs, PreMulSum with the scalar 2.
pub fn ops(dtype: DataType) -> Vec<RedOp> {
    let mut scalar = [0u8; 8];
    encode(dtype, 2.0, &mut scalar[..dtype.size()]);
    vec![
        RedOp::Sum,
        RedOp::Prod,
        RedOp::Max,
        RedOp::Min,
        RedOp::Avg,
        RedOp::PreMulSum { scalar },
    ]
}

/// One call of the suite.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub kind: CollKind,
    pub dtype: DataType,
    pub op: RedOp,
    pub count: usize,
    pub root: usize,
    pub in_place: bool,
}

/// The counts each collective runs with: none, one, an odd count, and one
/// spanning several pipeline chunks.
pub fn counts(dtype: DataType) -> [usize; 4] {
    [0, 1, 37, 3 * chunk_bytes() / dtype.size() + 5]
}

/// Every case for `nranks` ranks, in one order all ranks agree on.
pub fn all_cases(nranks: usize, kinds: &[CollKind], dtypes: &[DataType]) -> Vec<Case> {
    let mut cases = Vec::new();
    for &kind in kinds {
        for &dtype in dtypes {
            let ops = if kind.reduces() {
                ops(dtype)
            } else {
                vec![RedOp::Sum]
            };
            for op in ops {
                for count in counts(dtype) {
                    for in_place in [false, true] {
                        if in_place && kind == CollKind::AllToAll {
                            continue;
                        }
                        let root = (cases.len() * 5 + 1) % nranks;
                        cases.push(Case {
                            kind,
                            dtype,
                            op,
                            count,
                            root,
                            in_place,
                        });
                    }
                }
            }
        }
    }
    cases
}

// ---- element encoding, independent of the engine ----

fn fp8_encode(value: f64, exp_bits: u32, man_bits: u32) -> u8 {
    // Only small integers and halves are used, all exactly representable.
    if value == 0.0 {
        return 0;
    }
    let sign = if value < 0.0 { 0x80 } else { 0 };
    let mag = value.abs();
    let exp = mag.log2().floor() as i32;
    let bias = (1 << (exp_bits - 1)) - 1;
    let man = ((mag / 2f64.powi(exp) - 1.0) * f64::from(1u32 << man_bits)).round() as u8;
    sign | (((exp + bias) as u8) << man_bits) | man
}

fn fp8_decode(bits: u8, exp_bits: u32, man_bits: u32) -> f64 {
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits & 0x7f) >> man_bits);
    let man = f64::from(bits & ((1 << man_bits) - 1));
    let bias = (1 << (exp_bits - 1)) - 1;
    let scale = f64::from(1u32 << man_bits);
    if exp == 0 {
        sign * man / scale * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + man / scale) * 2f64.powi(exp - bias)
    }
}

/// Writes `value` as one element of `dtype`.
pub fn encode(dtype: DataType, value: f64, out: &mut [u8]) {
    match dtype {
        DataType::Int8 | DataType::Uint8 => out[0] = value as i64 as u8,
        DataType::Int32 | DataType::Uint32 => {
            out.copy_from_slice(&(value as i64 as u32).to_le_bytes())
        }
        DataType::Int64 | DataType::Uint64 => out.copy_from_slice(&(value as i64).to_le_bytes()),
        DataType::Float16 => out.copy_from_slice(&half::f16::from_f64(value).to_le_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&half::bf16::from_f64(value).to_le_bytes()),
        DataType::Float32 => out.copy_from_slice(&(value as f32).to_le_bytes()),
        DataType::Float64 => out.copy_from_slice(&value.to_le_bytes()),
        DataType::Float8e4m3 => out[0] = fp8_encode(value, 4, 3),
        DataType::Float8e5m2 => out[0] = fp8_encode(value, 5, 2),
    }
}

/// Reads one element of `dtype` as a float.
pub fn decode(dtype: DataType, bytes: &[u8]) -> f64 {
    match dtype {
        DataType::Float16 => half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        DataType::Bfloat16 => half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        DataType::Float32 => f64::from(f32::from_le_bytes(bytes[..4].try_into().unwrap())),
        DataType::Float64 => f64::from_le_bytes(bytes[..8].try_into().unwrap()),
        DataType::Float8e4m3 => fp8_decode(bytes[0], 4, 3),
        DataType::Float8e5m2 => fp8_decode(bytes[0], 5, 2),
        _ => unreachable!("decode is for floats"),
    }
}

/// The input of rank `rank` at send element `i`: small values whose sums,
/// products and partial results are exact in every datatype.
pub fn input(dtype: DataType, op: RedOp, rank: usize, i: usize) -> f64 {
    let signed = !matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
    let h = (rank * 7 + i * 3 + i / 11) % 5;
    match op {
        RedOp::Prod => {
            if (rank + i).is_multiple_of(4) {
                2.0
            } else if signed && (rank + 2 * i).is_multiple_of(5) {
                -1.0
            } else {
                1.0
            }
        }
        // e5m2 has 2 mantissa bits: keep every partial sum a small integer.
        _ if dtype == DataType::Float8e5m2 => (h % 2) as f64,
        _ if signed => h as f64 - 2.0,
        _ => h as f64,
    }
}

/// The exact reduction of `values` under `op` for `dtype`, or `None` when
/// the result is only approximately defined (float Avg).
fn reduce_ref(dtype: DataType, op: RedOp, values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let r = match op {
        RedOp::Sum => values.iter().sum(),
        RedOp::Prod => values.iter().product(),
        RedOp::Max => values.iter().cloned().fold(f64::MIN, f64::max),
        RedOp::Min => values.iter().cloned().fold(f64::MAX, f64::min),
        RedOp::PreMulSum { .. } | RedOp::PreMulSumDevice { .. } => {
            values.iter().map(|v| 2.0 * v).sum()
        }
        RedOp::Avg => {
            let sum: f64 = values.iter().sum();
            if dtype.is_float() {
                sum / n
            } else {
                (sum / n).trunc()
            }
        }
    };
    wrap_int(dtype, r)
}

/// Integer results wrap like the C types.
fn wrap_int(dtype: DataType, v: f64) -> f64 {
    let i = v as i64;
    match dtype {
        DataType::Int8 => f64::from(i as i8),
        DataType::Uint8 => f64::from(i as u8),
        DataType::Int32 => f64::from(i as i32),
        DataType::Uint32 => f64::from(i as u32),
        DataType::Int64 | DataType::Uint64 => i as f64,
        _ => v,
    }
}

/// Buffers of one rank for one case, out-of-place or in-place.
pub struct CaseBuffers {
    /// The whole allocation (in place: the one shared buffer).
    pub send: Vec<u8>,
    pub recv: Vec<u8>,
    send_offset: usize,
    recv_offset: usize,
}

const SENTINEL: u8 = 0xA5;

impl CaseBuffers {
    pub fn new(case: &Case, nranks: usize, rank: usize) -> CaseBuffers {
        let size = case.dtype.size();
        let send_len = case.kind.send_len(case.count, nranks, rank, case.root);
        let mut input_bytes = vec![0u8; send_len * size];
        for (i, element) in input_bytes.chunks_exact_mut(size).enumerate() {
            encode(case.dtype, input(case.dtype, case.op, rank, i), element);
        }
        CaseBuffers::with_input(case, nranks, rank, &input_bytes)
    }

    /// As [`CaseBuffers::new`], the send region holding `input` (the
    /// rank's send length of the case's datatype).
    pub fn with_input(case: &Case, nranks: usize, rank: usize, input: &[u8]) -> CaseBuffers {
        let size = case.dtype.size();
        let send_len = case.kind.send_len(case.count, nranks, rank, case.root);
        let recv_len = case.kind.recv_len(case.count, nranks, rank, case.root);
        assert_eq!(input.len(), send_len * size, "{case:?} on rank {rank}");
        let fill = |buf: &mut [u8], offset: usize| {
            buf[offset * size..(offset + send_len) * size].copy_from_slice(input);
        };
        if case.in_place {
            let total = send_len.max(recv_len);
            let mut buf = vec![SENTINEL; total * size];
            // A rank with only one of the two buffers (a non-root of
            // gather, scatter, broadcast or reduce) has nothing to alias.
            let (send_offset, recv_offset) = match (
                case.kind.in_place_send_offset(case.count, rank, case.root),
                case.kind.in_place_recv_offset(case.count, rank, case.root),
            ) {
                (Some(s), _) => (s, 0),
                (None, Some(r)) => (0, r),
                (None, None) => unreachable!("no in-place form"),
            };
            let (send_offset, recv_offset) = if send_len == 0 || recv_len == 0 {
                (0, 0)
            } else {
                (send_offset, recv_offset)
            };
            // Ranks without a send buffer (broadcast non-roots) have none to fill.
            fill(&mut buf, send_offset);
            CaseBuffers {
                send: buf,
                recv: Vec::new(),
                send_offset,
                recv_offset,
            }
        } else {
            let mut send = vec![SENTINEL; send_len * size];
            fill(&mut send, 0);
            CaseBuffers {
                send,
                recv: vec![SENTINEL; recv_len * size],
                send_offset: 0,
                recv_offset: 0,
            }
        }
    }

    /// The call's send and receive pointers for buffers laid out as these
    /// at `send_base` and `recv_base` (copies of [`CaseBuffers::send`] and
    /// [`CaseBuffers::recv`], in host or device memory).
    pub fn pointers_at(
        &self,
        case: &Case,
        send_base: *mut u8,
        recv_base: *mut u8,
    ) -> (*const u8, *mut u8) {
        let size = case.dtype.size();
        if self.recv.is_empty() && case.in_place {
            (
                send_base.wrapping_add(self.send_offset * size) as *const u8,
                send_base.wrapping_add(self.recv_offset * size),
            )
        } else {
            (send_base as *const u8, recv_base)
        }
    }

    /// Runs the case on `comm`.
    pub fn run(&mut self, comm: &Communicator, case: &Case) -> rccl::Result<()> {
        let bases = (self.send.as_mut_ptr(), self.recv.as_mut_ptr());
        let (send, recv) = self.pointers_at(case, bases.0, bases.1);
        // SAFETY: the buffers were sized from the collective's lengths for
        // this rank (in place: the larger one, with NCCL's offsets) and
        // outlive the call, which completes before it returns.
        let call = rccl::CollCall {
            kind: case.kind,
            count: case.count,
            dtype: case.dtype,
            op: case.op,
            root: case.root,
        };
        unsafe { comm.collective_raw(call, send, recv) }
    }

    /// The receive region after the call.
    pub fn output(&self, case: &Case, nranks: usize, rank: usize) -> &[u8] {
        let size = case.dtype.size();
        let recv_len = case.kind.recv_len(case.count, nranks, rank, case.root);
        if case.in_place {
            &self.send[self.recv_offset * size..(self.recv_offset + recv_len) * size]
        } else {
            &self.recv
        }
    }
}

/// Checks `out` (rank `rank`'s receive region) against the reference;
/// returns a description of the first wrong element.
pub fn check(case: &Case, nranks: usize, rank: usize, out: &[u8]) -> Result<(), String> {
    let size = case.dtype.size();
    let count = case.count;
    let inputs_of = |src_index: usize| -> Vec<f64> {
        (0..nranks)
            .map(|r| input(case.dtype, case.op, r, src_index))
            .collect()
    };
    let expected = |i: usize| -> f64 {
        match case.kind {
            CollKind::AllReduce | CollKind::Reduce => {
                reduce_ref(case.dtype, case.op, &inputs_of(i))
            }
            CollKind::ReduceScatter => {
                reduce_ref(case.dtype, case.op, &inputs_of(rank * count + i))
            }
            CollKind::Broadcast => input(case.dtype, case.op, case.root, i),
            CollKind::AllGather | CollKind::Gather => {
                input(case.dtype, case.op, i / count, i % count)
            }
            CollKind::AllToAll => input(case.dtype, case.op, i / count, rank * count + i % count),
            CollKind::Scatter => input(case.dtype, case.op, case.root, rank * count + i),
        }
    };
    let approximate = case.op == RedOp::Avg && case.dtype.is_float();
    for i in 0..out.len() / size {
        let got = &out[i * size..(i + 1) * size];
        let want = expected(i);
        let ok = if approximate {
            let tolerance = match case.dtype {
                DataType::Float8e4m3 | DataType::Float8e5m2 => 0.25,
                DataType::Float16 | DataType::Bfloat16 => 0.02,
                _ => 1e-5,
            };
            (decode(case.dtype, got) - want).abs() <= tolerance * want.abs().max(1.0)
        } else {
            let mut bytes = vec![0u8; size];
            encode(case.dtype, want, &mut bytes);
            got == bytes.as_slice()
        };
        if !ok {
            return Err(format!(
                "{case:?} on rank {rank} of {nranks}: element {i} is {got:02x?}, expected {want}"
            ));
        }
    }
    Ok(())
}

/// Runs `cases` on `nranks` ranks as threads, each rank checking its own
/// output; returns every failure (a rank stops at its first error).
pub fn suite_on_threads(nranks: usize, config: Config, cases: &[Case]) -> Vec<String> {
    let comms = Communicator::init_all_config(nranks, config).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    run_on_host(comm, cases, CaseBuffers::new, check).unwrap_or_else(|e| vec![e])
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// Runs `cases` on `comm` over host buffers that `buffers` lays out, each
/// output checked by `check`: every check's failure, or the first call's
/// error (after it the ranks' calls no longer pair up, so the run stops).
pub fn run_on_host(
    comm: &Communicator,
    cases: &[Case],
    buffers: fn(&Case, usize, usize) -> CaseBuffers,
    check: fn(&Case, usize, usize, &[u8]) -> Result<(), String>,
) -> Result<Vec<String>, String> {
    let (rank, nranks) = (comm.rank(), comm.count());
    let mut failures = Vec::new();
    for case in cases {
        let mut bufs = buffers(case, nranks, rank);
        bufs.run(comm, case)
            .map_err(|e| format!("{case:?} on rank {rank}: {e}"))?;
        if let Err(msg) = check(case, nranks, rank, bufs.output(case, nranks, rank)) {
            failures.push(msg);
        }
    }
    Ok(failures)
}

/// Holds `stream` until the returned flag is raised (at most 20 s).
pub fn gate(stream: &dyn Stream) -> Arc<AtomicBool> {
    let open = Arc::new(AtomicBool::new(false));
    let theirs = open.clone();
    stream
        .enqueue(Box::new(move || {
            let until = Instant::now() + Duration::from_secs(20);
            while !theirs.load(Ordering::Acquire) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }))
        .unwrap();
    open
}
