//! Deterministic reductions (`Config::deterministic`): AllReduce,
//! ReduceScatter and Reduce give the bits `rccl::deterministic::reference`
//! computes, whatever algorithm `NCCL_ALGO` asks for, the protocol, the
//! channels, the chunk (through the FIFO size) and in place or not; without
//! the mode the same calls give other bits (so the check can fail). Small
//! all-reduces may take the board, whose fold follows the same order.

mod common;

use common::test_config;
use half::{bf16, f16};
use proptest::prelude::*;
use rccl::tuning::Selection;
use rccl::{deterministic, CollKind, Communicator, Config, Element, RedOp, F8E4M3, F8E5M2};

/// One way to run a call: what the user may vary without changing the
/// deterministic mode's bits.
#[derive(Clone, Debug)]
struct Cut {
    algo: &'static str,
    proto: &'static str,
    channels: usize,
    buffsize: usize,
    in_place: bool,
    /// Whether the board may serve small all-reduces.
    board: bool,
}

const ALGOS: [&str; 6] = ["ring", "tree", "rhd", "hier", "oneshot", "direct,ring"];
const PROTOS: [&str; 3] = ["Simple", "LL", "LL128"];

fn config(cut: &Cut, deterministic: bool) -> Config {
    Config {
        algo: Selection::parse("NCCL_ALGO", cut.algo).unwrap(),
        proto: Selection::parse("NCCL_PROTO", cut.proto).unwrap(),
        min_channels: cut.channels,
        max_channels: cut.channels,
        buffsize: cut.buffsize,
        board_bytes: if cut.board {
            Config::default().board_bytes
        } else {
            0
        },
        deterministic,
        ..test_config()
    }
}

/// What every rank receives from `kind` over `inputs` (one per rank), the
/// ranks as threads of this process; Reduce's root is the last rank.
fn run<T: Element + Send + Sync>(
    kind: CollKind,
    inputs: &[Vec<T>],
    op: RedOp,
    config: Config,
    in_place: bool,
) -> Vec<Vec<T>> {
    let nranks = inputs.len();
    let comms = Communicator::init_all_config(nranks, config).unwrap();
    let root = nranks - 1;
    std::thread::scope(|s| {
        let runs: Vec<_> = comms
            .iter()
            .zip(inputs)
            .enumerate()
            .map(|(rank, (comm, input))| {
                s.spawn(move || {
                    let len = input.len();
                    let out_len = match kind {
                        CollKind::ReduceScatter => len / nranks,
                        CollKind::Reduce if rank != root => 0,
                        _ => len,
                    };
                    let zero: T = bytemuck::Zeroable::zeroed();
                    match (kind, in_place) {
                        (CollKind::AllReduce, true) => {
                            let mut buf = input.clone();
                            comm.all_reduce_in_place(&mut buf, op).unwrap();
                            buf
                        }
                        (CollKind::ReduceScatter, true) => {
                            let mut buf = input.clone();
                            comm.reduce_scatter_in_place(&mut buf, op).unwrap();
                            buf[rank * out_len..(rank + 1) * out_len].to_vec()
                        }
                        _ => {
                            let mut out = vec![zero; out_len];
                            match kind {
                                CollKind::AllReduce => comm.all_reduce(input, &mut out, op),
                                CollKind::ReduceScatter => comm.reduce_scatter(input, &mut out, op),
                                _ => comm.reduce(input, &mut out, op, root),
                            }
                            .unwrap();
                            out
                        }
                    }
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// What every rank should receive: the reference, per rank.
fn expected<T: Element>(kind: CollKind, inputs: &[Vec<T>], op: RedOp) -> Vec<Vec<T>> {
    let views: Vec<&[T]> = inputs.iter().map(|x| x.as_slice()).collect();
    let nranks = inputs.len();
    (0..nranks)
        .map(|rank| match kind {
            CollKind::Reduce if rank != nranks - 1 => Vec::new(),
            _ => deterministic::reference(kind, &views, op, rank).unwrap(),
        })
        .collect()
}

fn bits<T: Element>(outputs: &[Vec<T>]) -> Vec<Vec<u8>> {
    outputs
        .iter()
        .map(|o| bytemuck::cast_slice(o).to_vec())
        .collect()
}

/// Values of mixed magnitudes (1e-4 to 1e4, either sign), so that the
/// order of a sum shows in its last bits.
fn values(seed: u64, len: usize) -> Vec<f64> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mantissa = (x % 10_000) as f64 / 1_000.0;
            let exponent = ((x >> 20) % 9) as i32 - 4;
            let sign = if x & (1 << 40) == 0 { 1.0 } else { -1.0 };
            sign * mantissa * 10f64.powi(exponent)
        })
        .collect()
}

fn inputs<T: Element>(nranks: usize, len: usize, seed: u64, from: fn(f64) -> T) -> Vec<Vec<T>> {
    (0..nranks)
        .map(|r| {
            values(seed + r as u64 * 7919, len)
                .into_iter()
                .map(from)
                .collect()
        })
        .collect()
}

/// 8-bit floats of every finite magnitude, as raw bits (`is_finite` tells
/// the format's NaN and infinity bits apart).
fn fp8_inputs<T: Element>(
    nranks: usize,
    len: usize,
    seed: u64,
    from: fn(u8) -> T,
    is_finite: fn(u8) -> bool,
) -> Vec<Vec<T>> {
    inputs(nranks, len, seed, |v| v)
        .into_iter()
        .map(|x| {
            x.into_iter()
                .map(|v| {
                    let mut bits = (v.to_bits() >> 29) as u8;
                    while !is_finite(bits) {
                        bits = bits.wrapping_add(17);
                    }
                    from(bits)
                })
                .collect()
        })
        .collect()
}

/// `PreMulSum` by `scalar`, an element of the call's type.
fn pre_mul_sum<T: Element>(scalar: T) -> RedOp {
    let mut bytes = [0u8; 8];
    let scalar = bytemuck::bytes_of(&scalar);
    bytes[..scalar.len()].copy_from_slice(scalar);
    RedOp::PreMulSum { scalar: bytes }
}

/// The op `which` picks (0-4 the plain ops, 5 `PreMulSum` by `scalar`).
fn op_for<T: Element>(which: usize, scalar: T) -> RedOp {
    match which {
        0 => RedOp::Sum,
        1 => RedOp::Prod,
        2 => RedOp::Max,
        3 => RedOp::Min,
        4 => RedOp::Avg,
        _ => pre_mul_sum(scalar),
    }
}

fn check<T: Element + Send + Sync>(kind: CollKind, inputs: &[Vec<T>], op: RedOp, cut: &Cut) {
    let want = bits(&expected(kind, inputs, op));
    let got = bits(&run(kind, inputs, op, config(cut, true), cut.in_place));
    assert!(
        got == want,
        "{} of {} ranks x {} elements, {op:?}, {cut:?}: not the reference's bits",
        kind.name(),
        inputs.len(),
        inputs[0].len()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_cut_gives_the_reference_bits(
        kind in prop::sample::select(vec![CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce]),
        nranks in 2usize..=8,
        per_rank in 1usize..=40,
        seed in any::<u64>(),
        algo in prop::sample::select(ALGOS.to_vec()),
        proto in prop::sample::select(PROTOS.to_vec()),
        channels in 1usize..=4,
        small_fifo in any::<bool>(),
        in_place in any::<bool>(),
        dtype in 0usize..6,
        op in 0usize..6,
        board in any::<bool>(),
    ) {
        // Sizes not divisible by ranks x channels, and FIFOs small enough
        // that a call takes many chunks.
        let len = nranks * per_rank + usize::from(kind != CollKind::ReduceScatter) * (per_rank % 3);
        let cut = Cut {
            algo,
            proto,
            channels,
            buffsize: if small_fifo { 8 * 128 } else { test_config().buffsize },
            in_place: in_place && kind != CollKind::Reduce,
            board,
        };
        let e4m3_finite = |b: u8| b & 0x7f != 0x7f;
        let e5m2_finite = |b: u8| b & 0x7c != 0x7c;
        match dtype {
            0 => check(kind, &inputs(nranks, len, seed, |v| v as f32), op_for(op, 0.37f32), &cut),
            1 => check(kind, &inputs(nranks, len, seed, f16::from_f64), op_for(op, f16::from_f32(0.37)), &cut),
            2 => check(kind, &inputs(nranks, len, seed, bf16::from_f64), op_for(op, bf16::from_f32(0.37)), &cut),
            3 => check(kind, &inputs(nranks, len, seed, |v| v), op_for(op, 0.37f64), &cut),
            // 0x2f and 0x37: 0.46875 and 0.4375.
            4 => check(kind, &fp8_inputs(nranks, len, seed, F8E4M3, e4m3_finite), op_for(op, F8E4M3(0x2f)), &cut),
            _ => check(kind, &fp8_inputs(nranks, len, seed, F8E5M2, e5m2_finite), op_for(op, F8E5M2(0x37)), &cut),
        }
    }
}

#[test]
fn integers_give_the_reference_bits() {
    let cut = Cut {
        algo: "tree",
        proto: "LL",
        channels: 3,
        buffsize: 8 * 128,
        in_place: false,
        board: false,
    };
    let data = inputs(4, 64, 9, |v| (v * 1e4) as i32);
    check(CollKind::ReduceScatter, &data, RedOp::Avg, &cut);
    check(CollKind::AllReduce, &data, RedOp::Sum, &cut);
}

/// Without the mode the ring and the tree reduce in other orders: the same
/// inputs give other bits, which is what the mode is for.
#[test]
fn without_the_mode_the_algorithm_changes_the_bits() {
    let data = inputs(8, 4096, 11, |v| v as f32);
    let cut = |algo| Cut {
        algo,
        proto: "Simple",
        channels: 2,
        buffsize: test_config().buffsize,
        in_place: false,
        board: true,
    };
    let by = |algo, deterministic| {
        bits(&run(
            CollKind::AllReduce,
            &data,
            RedOp::Sum,
            config(&cut(algo), deterministic),
            false,
        ))
    };
    assert_ne!(by("ring", false), by("tree", false));
    assert_eq!(by("ring", true), by("tree", true));
    assert_eq!(
        by("tree", true),
        bits(&expected(CollKind::AllReduce, &data, RedOp::Sum))
    );
}
/// A small all-reduce takes the board (its posts folded in the stated
/// order), out of place and in place.
#[test]
fn the_board_folds_in_the_reference_order() {
    let data = inputs(8, 100, 5, |v| v as f32);
    for in_place in [false, true] {
        let cut = Cut {
            algo: "ring",
            proto: "Simple",
            channels: 2,
            buffsize: test_config().buffsize,
            in_place,
            board: true,
        };
        check(CollKind::AllReduce, &data, RedOp::Sum, &cut);
    }
}
