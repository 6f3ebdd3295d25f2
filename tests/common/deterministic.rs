//! The deterministic mode's calls for the process, host and device
//! suites: AllReduce, ReduceScatter and Reduce over every float datatype
//! and every op, on inputs of mixed magnitudes (so that the order of a sum
//! shows in its last bits), each output checked bit for bit against
//! `rccl::deterministic::reference_bytes` over all ranks' inputs, which
//! every rank computes for itself.

use super::{chunk_bytes, encode, Case, CaseBuffers};
use rccl::{deterministic, CollKind, DataType, RedOp};

/// Names what a rank of a process suite expects of its calls: `reference`
/// (every output is the reference's bits) or `other` (at least one is
/// not: the same calls without the mode, to show the check can fail).
pub const EXPECT: &str = "RCCL_TEST_DETERMINISTIC_EXPECT";

const DTYPES: [DataType; 6] = [
    DataType::Float32,
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Float64,
    DataType::Float8e4m3,
    DataType::Float8e5m2,
];

/// The calls: each reducing collective x float datatype, with Sum and
/// with one of the other ops in turn (so each op runs three times), an odd
/// count and one spanning several pipeline chunks, in place and not.
pub fn cases(nranks: usize) -> Vec<Case> {
    let kinds = [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::Reduce,
    ];
    let mut cases = Vec::new();
    for (k, kind) in kinds.into_iter().enumerate() {
        for (d, dtype) in DTYPES.into_iter().enumerate() {
            let turn = k * DTYPES.len() + d;
            let other = match turn % 5 {
                0 => RedOp::Prod,
                1 => RedOp::Max,
                2 => RedOp::Min,
                3 => RedOp::Avg,
                _ => pre_mul_sum(dtype),
            };
            for (o, op) in [RedOp::Sum, other].into_iter().enumerate() {
                let count = if o == 0 {
                    37
                } else {
                    2 * chunk_bytes() / dtype.size() + 3
                };
                cases.push(Case {
                    kind,
                    dtype,
                    op,
                    count,
                    root: nranks - 1,
                    in_place: (turn + o) % 2 == 1,
                });
            }
        }
    }
    cases
}

/// PreMulSum by 0.37 rounded to `dtype` (0.46875 and 0.4375 for the two
/// 8-bit formats, whose grids are coarser).
fn pre_mul_sum(dtype: DataType) -> RedOp {
    let mut scalar = [0u8; 8];
    match dtype {
        DataType::Float8e4m3 => scalar[0] = 0x2f,
        DataType::Float8e5m2 => scalar[0] = 0x37,
        _ => encode(dtype, 0.37, &mut scalar[..dtype.size()]),
    }
    RedOp::PreMulSum { scalar }
}

/// Rank `rank`'s send elements for `case`: magnitudes from 1e-3 to 1e3 of
/// either sign (near 1 for Prod, so that products stay finite), and for
/// the 8-bit formats any finite bits.
pub fn input(case: &Case, nranks: usize, rank: usize) -> Vec<u8> {
    let size = case.dtype.size();
    let len = case.kind.send_len(case.count, nranks, rank, case.root);
    let mut x =
        (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((case.count as u64) << 8) | 1;
    let mut bytes = vec![0u8; len * size];
    for element in bytes.chunks_exact_mut(size) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let sign = if x & (1 << 40) == 0 { 1.0 } else { -1.0 };
        let fraction = (x % 10_000) as f64 / 10_000.0;
        let (prod, e4m3, e5m2) = (
            case.op == RedOp::Prod,
            case.dtype == DataType::Float8e4m3,
            case.dtype == DataType::Float8e5m2,
        );
        if e4m3 || e5m2 {
            // Prod: exponents one either side of the bias.
            let (man_bits, bias) = if e4m3 { (3, 7) } else { (2, 15) };
            let mut bits = (x >> 29) as u8;
            if prod {
                let exp = bias - 1 + (x >> 50) % 3;
                bits = (bits & 0x80) | (exp << man_bits) as u8 | (bits & ((1 << man_bits) - 1));
            }
            let finite = |b: u8| {
                if e4m3 {
                    b & 0x7f != 0x7f
                } else {
                    b & 0x7c != 0x7c
                }
            };
            while !finite(bits) {
                bits = bits.wrapping_add(17);
            }
            element[0] = bits;
        } else if prod {
            encode(case.dtype, sign * (0.5 + 1.5 * fraction), element);
        } else {
            let exponent = ((x >> 20) % 7) as i32 - 3;
            encode(
                case.dtype,
                sign * 10.0 * fraction * 10f64.powi(exponent),
                element,
            );
        }
    }
    bytes
}

/// Rank `rank`'s buffers for `case`, its send region holding [`input`].
pub fn buffers(case: &Case, nranks: usize, rank: usize) -> CaseBuffers {
    CaseBuffers::with_input(case, nranks, rank, &input(case, nranks, rank))
}

/// Whether `out` (rank `rank`'s receive region after `case`) holds the
/// reference's bits; else the first element that differs.
pub fn check(case: &Case, nranks: usize, rank: usize, out: &[u8]) -> Result<(), String> {
    let want = if case.kind == CollKind::Reduce && rank != case.root {
        Vec::new()
    } else {
        let inputs: Vec<Vec<u8>> = (0..nranks).map(|r| input(case, nranks, r)).collect();
        let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        deterministic::reference_bytes(case.kind, case.dtype, &views, case.op, rank)
            .map_err(|e| format!("{case:?}: {e}"))?
    };
    if out == want {
        return Ok(());
    }
    let size = case.dtype.size();
    let at = out
        .chunks(size)
        .zip(want.chunks(size))
        .position(|(o, w)| o != w)
        .unwrap_or(out.len().min(want.len()) / size);
    Err(format!(
        "{case:?} on rank {rank} of {nranks}: element {at} is {:02x?}, the reference's {:02x?} \
         ({} elements out, {} expected)",
        out.get(at * size..(at + 1) * size),
        want.get(at * size..(at + 1) * size),
        out.len() / size,
        want.len() / size,
    ))
}

/// Panics unless the failures of [`check`] over this rank's calls are
/// what [`EXPECT`] says (`reference` where it is not set).
pub fn assert_expected(rank: usize, calls: usize, failures: &[String]) {
    match std::env::var(EXPECT).as_deref() {
        Ok("other") => assert!(
            !failures.is_empty(),
            "rank {rank}: all {calls} calls gave the reference's bits without the mode"
        ),
        _ => assert!(
            failures.is_empty(),
            "rank {rank}: {} of {calls} calls are not the reference's bits:\n{}",
            failures.len(),
            failures[..failures.len().min(5)].join("\n")
        ),
    }
}
