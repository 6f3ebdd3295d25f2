use std::{ptr, slice};

use half::{bf16, f16};
use proptest::prelude::*;

use super::minifloat::{f32_to_mini, MiniFloat, BF16, E4M3, E4M3_TO_F32, E5M2, E5M2_TO_F32};
use super::packed::{e4m3_to_f32, e5m2_to_f32, f32_to_bf16_bits, f32_to_e4m3, f32_to_e5m2};
use super::{decode_f64, encode_f64, ReduceKernel, Store};
use crate::types::{DataType, RedOp};

const OPS: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

/// A small deterministic generator for test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Elements mixing raw bit patterns with small "nice" values.
    fn elements(&mut self, dtype: DataType, count: usize) -> Vec<u8> {
        let size = dtype.size();
        let mut v = self.bytes(count * size);
        for i in 0..count {
            if self.next() & 1 == 0 {
                let x = (self.next() % 41) as f64 / 4.0 - 5.0;
                encode_f64(dtype, x, &mut v[i * size..(i + 1) * size]);
            }
        }
        v
    }
}

fn int_value(dtype: DataType, b: &[u8]) -> i128 {
    let mut w = [0u8; 8];
    w[..dtype.size()].copy_from_slice(&b[..dtype.size()]);
    let u = u64::from_le_bytes(w);
    match dtype {
        DataType::Int8 => i128::from(u as u8 as i8),
        DataType::Uint8 => i128::from(u as u8),
        DataType::Int32 => i128::from(u as u32 as i32),
        DataType::Uint32 => i128::from(u as u32),
        DataType::Int64 => i128::from(u as i64),
        _ => i128::from(u),
    }
}

/// Reduces an integer to the type's range, two's complement.
fn wrap(dtype: DataType, v: i128) -> i128 {
    let bits = 8 * dtype.size() as u32;
    let m = v & ((1i128 << bits) - 1);
    let signed = matches!(dtype, DataType::Int8 | DataType::Int32 | DataType::Int64);
    if signed && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

fn int_bytes(dtype: DataType, v: i128) -> Vec<u8> {
    v.to_le_bytes()[..dtype.size()].to_vec()
}

/// Rounds to the float dtype.
fn round(dtype: DataType, v: f64) -> f64 {
    let mut b = [0u8; 8];
    encode_f64(dtype, v, &mut b);
    decode_f64(dtype, &b)
}

fn float_bytes(dtype: DataType, v: f64) -> Vec<u8> {
    let mut b = vec![0u8; dtype.size()];
    encode_f64(dtype, v, &mut b);
    b
}

fn max_ref(a: f64, b: f64) -> f64 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

fn min_ref(a: f64, b: f64) -> f64 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// The straightforward scalar reference: one element.
fn reference_one(
    dtype: DataType,
    op: RedOp,
    nranks: usize,
    acc: Option<&[u8]>,
    x: &[u8],
    finish: bool,
) -> Vec<u8> {
    if !dtype.is_float() {
        let x = int_value(dtype, x);
        let pre = match op {
            RedOp::PreMulSum { scalar } => wrap(dtype, x.wrapping_mul(int_value(dtype, &scalar))),
            _ => x,
        };
        let mut r = match acc.map(|a| int_value(dtype, a)) {
            None => pre,
            Some(a) => match op {
                RedOp::Prod => wrap(dtype, a.wrapping_mul(x)),
                RedOp::Max => a.max(x),
                RedOp::Min => a.min(x),
                _ => wrap(dtype, a + pre),
            },
        };
        if finish && op == RedOp::Avg {
            r /= nranks as i128; // truncates toward zero
        }
        return int_bytes(dtype, r);
    }
    let x = decode_f64(dtype, x);
    let scale = match op {
        RedOp::PreMulSum { scalar } => Some(decode_f64(dtype, &scalar)),
        RedOp::Avg if dtype == DataType::Float64 => Some(1.0 / nranks as f64),
        RedOp::Avg => Some(f64::from(1.0f32 / nranks as f32)),
        _ => None,
    };
    // The kernels scale in the compute type (f32 below float64): the
    // product is rounded to f32 before it is rounded to the datatype.
    let pre = match scale {
        Some(s) if s != 1.0 && dtype == DataType::Float64 => round(dtype, x * s),
        Some(s) if s != 1.0 => round(dtype, f64::from((x as f32) * (s as f32))),
        _ => x,
    };
    let r = match acc.map(|a| decode_f64(dtype, a)) {
        None => pre,
        Some(a) => match op {
            RedOp::Prod => round(dtype, a * x),
            RedOp::Max => max_ref(a, x),
            RedOp::Min => min_ref(a, x),
            _ => round(dtype, a + pre),
        },
    };
    if acc.is_none() && scale.map(|s| s == 1.0).unwrap_or(true) {
        // Identity: the bytes are copied exactly.
        return float_bytes(dtype, x);
    }
    float_bytes(dtype, r)
}

fn same_element(dtype: DataType, got: &[u8], want: &[u8]) -> bool {
    if got == want {
        return true;
    }
    dtype.is_float() && decode_f64(dtype, got).is_nan() && decode_f64(dtype, want).is_nan()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Alias {
    /// acc, input, out all distinct
    None,
    /// out == acc
    OutAcc,
    /// out == input
    OutInput,
    /// acc == input, out distinct
    AccInput,
    /// acc == input == out
    All,
}

/// Runs the kernel in one configuration, writing with `store`, and
/// checks every element against the reference.
#[allow(clippy::too_many_arguments)]
fn check(
    store: Store,
    rng: &mut Rng,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
    count: usize,
    with_acc: bool,
    finish: bool,
    alias: Alias,
    misalign: usize,
) {
    let size = dtype.size();
    let bytes = count * size;
    let acc_data = rng.elements(dtype, count);
    let in_data = match alias {
        Alias::AccInput | Alias::All => acc_data.clone(),
        _ => rng.elements(dtype, count),
    };
    let mut want = Vec::with_capacity(bytes);
    for i in 0..count {
        let r = i * size..(i + 1) * size;
        let acc = with_acc.then(|| &acc_data[r.clone()]);
        want.extend(reference_one(dtype, op, nranks, acc, &in_data[r], finish));
    }
    // Three regions in one buffer, each at `misalign` from an 8-byte
    // boundary.
    let stride = (bytes + 15) / 8 * 8 + 8;
    let mut buf = vec![0u64; 3 * stride / 8 + 1];
    let base = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: every offset below stays inside `buf`.
    let (pa, pi, po) = unsafe {
        let pa = base.add(misalign);
        let pi = base.add(stride + misalign);
        let po = base.add(2 * stride + misalign);
        ptr::copy_nonoverlapping(acc_data.as_ptr(), pa, bytes);
        ptr::copy_nonoverlapping(in_data.as_ptr(), pi, bytes);
        match alias {
            Alias::None => (pa, pi, po),
            Alias::OutAcc => (pa, pi, pa),
            Alias::OutInput => (pa, pi, pi),
            Alias::AccInput => (pa, pa, po),
            Alias::All => (pa, pa, pa),
        }
    };
    let k = ReduceKernel::new(dtype, op, nranks).unwrap();
    let acc = with_acc.then_some(pa.cast_const());
    // SAFETY: the regions are valid for `bytes` bytes, identical or
    // disjoint.
    let got = unsafe {
        k.run_with_store(store, acc, pi.cast_const(), po, count, finish);
        slice::from_raw_parts(po.cast_const(), bytes).to_vec()
    };
    for i in 0..count {
        let r = i * size..(i + 1) * size;
        assert!(
            same_element(dtype, &got[r.clone()], &want[r.clone()]),
            "{store:?} {dtype:?} {op:?} n={nranks} count={count} acc={with_acc} finish={finish} \
             alias={alias:?} misalign={misalign} element {i}: acc={:?} in={:?} got={:?} want={:?}",
            with_acc.then(|| &acc_data[r.clone()]),
            &in_data[r.clone()],
            &got[r.clone()],
            &want[r],
        );
    }
}

fn premul(dtype: DataType, rng: &mut Rng) -> RedOp {
    let mut scalar = [0u8; 8];
    let v = if dtype.is_float() {
        [0.75, -1.5, 3.0, 0.1][(rng.next() % 4) as usize]
    } else {
        [3.0, -1.0, 7.0, 200.0][(rng.next() % 4) as usize]
    };
    encode_f64(dtype, v, &mut scalar);
    RedOp::PreMulSum { scalar }
}

/// `check` with `store` in every layout: each aliasing of the three
/// operands, then without an accumulator, in place or not.
#[allow(clippy::too_many_arguments)]
fn check_every_layout(
    store: Store,
    rng: &mut Rng,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
    count: usize,
    finish: bool,
    misalign: usize,
) {
    let with_acc = [
        Alias::None,
        Alias::OutAcc,
        Alias::OutInput,
        Alias::AccInput,
        Alias::All,
    ];
    for alias in with_acc {
        check(
            store, rng, dtype, op, nranks, count, true, finish, alias, misalign,
        );
    }
    for alias in [Alias::None, Alias::OutInput] {
        check(
            store, rng, dtype, op, nranks, count, false, finish, alias, misalign,
        );
    }
}

#[test]
fn every_dtype_op_layout_matches_reference() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for dtype in DataType::ALL {
        let mut ops = OPS.to_vec();
        ops.push(premul(dtype, &mut rng));
        ops.push(premul(dtype, &mut rng));
        for op in ops {
            for count in [0usize, 1, 2, 7, 33, 300, 517] {
                for finish in [false, true] {
                    for misalign in [0usize, 1, 4] {
                        let nranks = [1, 3, 8][(count + misalign) % 3];
                        check_every_layout(
                            Store::Cached,
                            &mut rng,
                            dtype,
                            op,
                            nranks,
                            count,
                            finish,
                            misalign,
                        );
                    }
                }
            }
        }
    }
}

/// The streaming path: results of many lines with heads and tails off
/// a line boundary, every layout, outputs off 16-byte boundaries.
#[test]
fn streaming_stores_write_what_the_reference_gives() {
    let mut rng = Rng(0x0bad_cafe_f00d_d00d);
    for dtype in DataType::ALL {
        let mut ops = OPS.to_vec();
        ops.push(premul(dtype, &mut rng));
        for op in ops {
            for count in [1, 37, 1000] {
                for finish in [false, true] {
                    for misalign in [0usize, 1, 4] {
                        let nranks = [3, 8][misalign % 2];
                        check_every_layout(
                            Store::Streaming,
                            &mut rng,
                            dtype,
                            op,
                            nranks,
                            count,
                            finish,
                            misalign,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn streaming_copies_equal_ordinary_copies_at_every_alignment() {
    let src: Vec<u8> = (0..1200u32).map(|i| (i * 131 % 251) as u8).collect();
    for len in [0, 1, 15, 255, 256, 257, 700, 1100] {
        for src_off in [0, 1, 8] {
            for dst_off in [0, 3, 16, 17] {
                let mut dst = vec![0xa5u8; 1200 + 32];
                let before = dst.clone();
                for store in [Store::Streaming, Store::Cached] {
                    // SAFETY: both ranges lie inside their vectors
                    // (offsets + len <= 1118 < 1200), which are distinct.
                    unsafe {
                        store.copy(src[src_off..].as_ptr(), dst[dst_off..].as_mut_ptr(), len)
                    };
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert_eq!(dst[..dst_off], before[..dst_off], "{store:?} wrote before");
                    assert_eq!(
                        dst[dst_off + len..],
                        before[dst_off + len..],
                        "{store:?} wrote after"
                    );
                }
            }
        }
    }
}

#[test]
fn integer_avg_truncates_toward_zero() {
    let k = ReduceKernel::new(DataType::Int32, RedOp::Avg, 4).unwrap();
    let acc: [i32; 4] = [-3, 3, -8, i32::MIN];
    let input: [i32; 4] = [0, 4, 1, 0];
    let mut out = [0i32; 4];
    // SAFETY: arrays of 4 i32.
    unsafe {
        k.run(
            Some(acc.as_ptr().cast()),
            input.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            4,
            true,
        )
    };
    assert_eq!(out, [0, 1, -1, i32::MIN / 4]);
    // i8 with a rank count beyond the type's range.
    let k = ReduceKernel::new(DataType::Int8, RedOp::Avg, 128).unwrap();
    let input: [i8; 2] = [-128, 127];
    let mut out = [5i8; 2];
    // SAFETY: arrays of 2 i8.
    unsafe {
        k.run(
            None,
            input.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            2,
            true,
        )
    };
    assert_eq!(out, [-1, 0]);
}

#[test]
fn transforms_are_reported() {
    assert!(!ReduceKernel::new(DataType::Float32, RedOp::Sum, 4)
        .unwrap()
        .has_input_transform());
    assert!(ReduceKernel::new(DataType::Float32, RedOp::Avg, 4)
        .unwrap()
        .has_input_transform());
    assert!(!ReduceKernel::new(DataType::Float32, RedOp::Avg, 1)
        .unwrap()
        .has_input_transform());
    let int_avg = ReduceKernel::new(DataType::Int64, RedOp::Avg, 4).unwrap();
    assert!(!int_avg.has_input_transform());
    assert!(int_avg.has_output_transform());
    let mut scalar = [0u8; 8];
    encode_f64(DataType::Bfloat16, 2.0, &mut scalar);
    let k = ReduceKernel::new(DataType::Bfloat16, RedOp::PreMulSum { scalar }, 4).unwrap();
    assert!(k.has_input_transform());
    assert_eq!(k.dtype(), DataType::Bfloat16);
    assert!(ReduceKernel::new(DataType::Float32, RedOp::Sum, 0).is_err());
}

#[test]
fn f32_avg_example() {
    let k = ReduceKernel::new(DataType::Float32, RedOp::Avg, 4).unwrap();
    let a = [1.0f32, 2.0, 3.0];
    let mut acc = [0f32; 3];
    // SAFETY: arrays of 3 f32; out == input is allowed.
    unsafe {
        k.run(None, a.as_ptr().cast(), acc.as_mut_ptr().cast(), 3, false);
        for _ in 0..3 {
            k.run(
                Some(acc.as_ptr().cast()),
                a.as_ptr().cast(),
                acc.as_mut_ptr().cast(),
                3,
                false,
            );
        }
    }
    assert_eq!(acc, [1.0, 2.0, 3.0]);
}

#[test]
fn float_max_min_propagate_nan() {
    for dtype in [DataType::Float32, DataType::Float16, DataType::Float8e4m3] {
        for op in [RedOp::Max, RedOp::Min] {
            let k = ReduceKernel::new(dtype, op, 2).unwrap();
            let size = dtype.size();
            let mut a = vec![0u8; 2 * size];
            let mut b = vec![0u8; 2 * size];
            encode_f64(dtype, f64::NAN, &mut a[..size]);
            encode_f64(dtype, 1.0, &mut a[size..]);
            encode_f64(dtype, 1.0, &mut b[..size]);
            encode_f64(dtype, f64::NAN, &mut b[size..]);
            let mut out = vec![0u8; 2 * size];
            // SAFETY: buffers of 2 elements.
            unsafe { k.run(Some(a.as_ptr()), b.as_ptr(), out.as_mut_ptr(), 2, false) };
            assert!(decode_f64(dtype, &out[..size]).is_nan());
            assert!(decode_f64(dtype, &out[size..]).is_nan());
        }
    }
}

#[test]
fn integer_sum_and_prod_wrap() {
    let k = ReduceKernel::new(DataType::Uint8, RedOp::Sum, 2).unwrap();
    let (a, b, mut o) = ([250u8, 1], [10u8, 2], [0u8; 2]);
    // SAFETY: arrays of 2 bytes.
    unsafe { k.run(Some(a.as_ptr()), b.as_ptr(), o.as_mut_ptr(), 2, true) };
    assert_eq!(o, [4, 3]);
    let k = ReduceKernel::new(DataType::Int64, RedOp::Prod, 2).unwrap();
    let (a, b, mut o) = ([i64::MAX, -3], [2i64, 5], [0i64; 2]);
    // SAFETY: arrays of 2 i64.
    unsafe {
        k.run(
            Some(a.as_ptr().cast()),
            b.as_ptr().cast(),
            o.as_mut_ptr().cast(),
            2,
            true,
        )
    };
    assert_eq!(o, [-2, -15]);
}

fn fp8_dtypes() -> [(DataType, MiniFloat); 2] {
    [(DataType::Float8e4m3, E4M3), (DataType::Float8e5m2, E5M2)]
}

#[test]
fn fp8_every_code_round_trips() {
    for (dtype, fmt) in fp8_dtypes() {
        for code in 0..=255u8 {
            let v = decode_f64(dtype, &[code]);
            let mut b = [0u8];
            encode_f64(dtype, v, &mut b);
            let via_f32 = f32_to_mini(fmt, v as f32) as u8;
            if v.is_nan() {
                assert!(decode_f64(dtype, &b).is_nan(), "{dtype:?} {code:#x}");
                assert_eq!(b[0] & 0x7f, 0x7f);
                assert_eq!(via_f32 & 0x7f, 0x7f);
            } else {
                assert_eq!(b[0], code, "{dtype:?} {code:#x} = {v}");
                assert_eq!(via_f32, code, "{dtype:?} {code:#x} = {v}");
            }
        }
    }
}

#[test]
fn fast_fp8_codecs_match_generic() {
    for code in 0..=255u8 {
        let d4 = e4m3_to_f32(code).to_bits();
        let t4 = E4M3_TO_F32[usize::from(code)];
        assert!(d4 == t4 || (f32::from_bits(d4).is_nan() && f32::from_bits(t4).is_nan()));
        let d5 = e5m2_to_f32(code).to_bits();
        let t5 = E5M2_TO_F32[usize::from(code)];
        assert!(d5 == t5 || (f32::from_bits(d5).is_nan() && f32::from_bits(t5).is_nan()));
    }
    let check = |x: f32| {
        assert_eq!(
            f32_to_e4m3(x),
            f32_to_mini(E4M3, x) as u8,
            "e4m3 {x:e} {:#x}",
            x.to_bits()
        );
        assert_eq!(
            f32_to_e5m2(x),
            f32_to_mini(E5M2, x) as u8,
            "e5m2 {x:e} {:#x}",
            x.to_bits()
        );
    };
    // Every sign/exponent/top-mantissa prefix with the low bits at and
    // around both formats' rounding points.
    let lows: [u32; 12] = [
        0, 1, 0x7_ffff, 0x8_0000, 0x8_0001, 0xf_ffff, 0x10_0000, 0x10_0001, 0x17_ffff, 0x18_0000,
        0x1f_ffff, 0x0c_3456,
    ];
    for hi in 0..(1u32 << 11) {
        for &lo in &lows {
            check(f32::from_bits((hi << 21) | lo));
        }
    }
    let mut rng = Rng(7);
    for _ in 0..300_000 {
        check(f32::from_bits(rng.next() as u32));
        // Concentrated on the formats' ranges.
        check(f32::from_bits(
            0x3000_0000 + (rng.next() as u32 % 0x1800_0000),
        ));
    }
}

#[test]
fn fp8_known_values() {
    let e4 = |c: u8| decode_f64(DataType::Float8e4m3, &[c]);
    let e5 = |c: u8| decode_f64(DataType::Float8e5m2, &[c]);
    assert_eq!(e4(0x7e), 448.0);
    assert_eq!(e4(0xfe), -448.0);
    assert!(e4(0x7f).is_nan() && e4(0xff).is_nan());
    assert_eq!(e4(0x78), 256.0);
    assert_eq!(e4(0x01), 2f64.powi(-9));
    assert_eq!(e4(0x08), 2f64.powi(-6));
    assert_eq!(e4(0x38), 1.0);
    assert_eq!(e5(0x7b), 57344.0);
    assert_eq!(e5(0x7c), f64::INFINITY);
    assert_eq!(e5(0xfc), f64::NEG_INFINITY);
    assert!(e5(0x7d).is_nan() && e5(0x7e).is_nan() && e5(0xff).is_nan());
    assert_eq!(e5(0x01), 2f64.powi(-16));
    assert_eq!(e5(0x3c), 1.0);
    assert_eq!(e4(0x80), 0.0);
    assert!(e4(0x80).is_sign_negative());

    let enc = |dtype, v: f64| {
        let mut b = [0u8];
        encode_f64(dtype, v, &mut b);
        b[0]
    };
    // e4m3 saturates (satfinite), including infinities.
    for v in [449.0, 464.0, 480.0, 1e6, f64::INFINITY, f64::MAX] {
        assert_eq!(enc(DataType::Float8e4m3, v), 0x7e, "{v}");
        assert_eq!(enc(DataType::Float8e4m3, -v), 0xfe, "{v}");
    }
    assert_eq!(enc(DataType::Float8e4m3, f64::NAN) & 0x7f, 0x7f);
    // e5m2 overflows to infinity past the rounding midpoint.
    assert_eq!(enc(DataType::Float8e5m2, 61440.0), 0x7c); // tie -> even = inf
    assert_eq!(enc(DataType::Float8e5m2, 61439.0), 0x7b);
    assert_eq!(enc(DataType::Float8e5m2, 1e9), 0x7c);
    assert_eq!(enc(DataType::Float8e5m2, -f64::INFINITY), 0xfc);
    // Underflow to signed zero; smallest subnormal's half rounds to 0.
    assert_eq!(enc(DataType::Float8e4m3, 2f64.powi(-10)), 0x00);
    assert_eq!(enc(DataType::Float8e4m3, 2f64.powi(-10) * 1.0001), 0x01);
    assert_eq!(enc(DataType::Float8e4m3, -1e-30), 0x80);
    assert_eq!(enc(DataType::Float8e5m2, 3.0 * 2f64.powi(-17)), 0x02); // 1.5 ulp -> 2
}

#[test]
fn fp8_midpoints_round_to_even() {
    for (dtype, fmt) in fp8_dtypes() {
        let max = fmt.max_finite() as u8;
        for code in 0..max {
            let lo = decode_f64(dtype, &[code]);
            let hi = decode_f64(dtype, &[code + 1]);
            let mid = (lo + hi) / 2.0;
            let even = if code % 2 == 0 { code } else { code + 1 };
            for (v, want) in [
                (mid, even),
                (mid - (hi - lo) / 64.0, code),
                (mid + (hi - lo) / 64.0, code + 1),
            ] {
                let mut b = [0u8];
                encode_f64(dtype, v, &mut b);
                assert_eq!(
                    b[0],
                    want,
                    "{dtype:?} {v} between {code:#x} and {:#x}",
                    code + 1
                );
                assert_eq!(f32_to_mini(fmt, v as f32) as u8, want, "{dtype:?} f32 {v}");
                encode_f64(dtype, -v, &mut b);
                assert_eq!(b[0], want | 0x80, "{dtype:?} {}", -v);
            }
        }
        // Past the largest finite value: between max and the next
        // (virtual) step.
        let top = decode_f64(dtype, &[max]);
        let step = top - decode_f64(dtype, &[max - 1]);
        let mut b = [0u8];
        encode_f64(dtype, top + step / 2.0, &mut b);
        let beyond = if fmt.saturate { max } else { fmt.inf() as u8 };
        assert_eq!(b[0], beyond, "{dtype:?}");
        encode_f64(dtype, top + step / 2.0 - step / 64.0, &mut b);
        assert_eq!(b[0], max, "{dtype:?}");
    }
}

#[test]
fn f16_bf16_codecs_agree_with_half() {
    let mut rng = Rng(99);
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        65504.0,
        65520.0,
        65519.0,
        6e-8,
        3e-8,
        2.9e-8,
        1e-45,
        f32::MAX,
        f32::INFINITY,
        f32::MIN_POSITIVE,
    ];
    let mut values: Vec<f32> = specials.to_vec();
    values.extend((0..200_000).map(|_| f32::from_bits(rng.next() as u32)));
    // Values near f16's range, where rounding matters most.
    values.extend(
        (0..200_000).map(|_| f32::from_bits(0x3000_0000 + (rng.next() as u32 % 0x1800_0000))),
    );
    for x in values {
        for x in [x, -x] {
            let mut b = [0u8; 2];
            encode_f64(DataType::Float16, f64::from(x), &mut b);
            let want = f16::from_f32(x);
            if x.is_nan() {
                assert!(f16::from_le_bytes(b).is_nan());
                continue;
            }
            assert_eq!(u16::from_le_bytes(b), want.to_bits(), "f16 {x:e}");
            encode_f64(DataType::Bfloat16, f64::from(x), &mut b);
            let want = bf16::from_f32(x);
            assert_eq!(u16::from_le_bytes(b), want.to_bits(), "bf16 {x:e}");
            assert_eq!(f32_to_bf16_bits(x), want.to_bits(), "bf16 fast {x:e}");
            assert_eq!(
                f32_to_mini(BF16, x) as u16,
                want.to_bits(),
                "bf16 mini {x:e}"
            );
        }
    }
    assert!(bf16::from_bits(f32_to_bf16_bits(f32::NAN)).is_nan());
}

#[test]
fn f64_rounding_avoids_double_rounding() {
    // Just above the midpoint between 1.0 and the next e4m3 value
    // (1.125): rounding via f32 first would land on the midpoint and
    // then tie to even (1.0); the correct answer is 1.125.
    let v = 1.0625 + 2f64.powi(-40);
    let mut b = [0u8];
    encode_f64(DataType::Float8e4m3, v, &mut b);
    assert_eq!(b[0], 0x39);
    let mut h = [0u8; 2];
    let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    encode_f64(DataType::Float16, v, &mut h);
    assert_eq!(u16::from_le_bytes(h), 0x3c01);
}

#[test]
fn short_buffers_do_not_panic() {
    let mut b = [0u8; 1];
    encode_f64(DataType::Float64, 1.0, &mut b);
    assert_eq!(b, [0]);
    assert!(decode_f64(DataType::Int32, &[1, 2]).is_nan());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_runs_match_reference(
        dtype_idx in 0usize..12,
        op_idx in 0usize..6,
        nranks in 1usize..20,
        count in 0usize..3000,
        finish: bool,
        with_acc: bool,
        streaming: bool,
        alias_idx in 0usize..5,
        misalign in 0usize..8,
        seed: u64,
    ) {
        let dtype = DataType::ALL[dtype_idx];
        let mut rng = Rng(seed | 1);
        let op = if op_idx < 5 { OPS[op_idx] } else {
            let mut scalar = [0u8; 8];
            scalar[..dtype.size()].copy_from_slice(&rng.elements(dtype, 1));
            RedOp::PreMulSum { scalar }
        };
        let alias = [Alias::None, Alias::OutAcc, Alias::OutInput, Alias::AccInput, Alias::All][alias_idx];
        let alias = if with_acc { alias } else if alias_idx % 2 == 0 { Alias::None } else { Alias::OutInput };
        let store = if streaming { Store::Streaming } else { Store::Cached };
        check(store, &mut rng, dtype, op, nranks, count, with_acc, finish, alias, misalign);
    }
}
