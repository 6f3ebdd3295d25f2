//! Floating-point types stored narrower than their `f32` compute type: the
//! `float8` storage types, the branch-free `f32` codecs of `bfloat16` and
//! both `float8` types, and the chunked loop that converts `float16` slices.

use std::mem::size_of;
use std::ptr;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::CHUNK;

/// A storage type narrower than its `f32` compute type. Every bit pattern is
/// a valid value.
pub(super) trait Packed: Copy + Default {
    fn decode(src: &[Self], dst: &mut [f32]);
    fn encode(src: &[f32], dst: &mut [Self]);
}

impl Packed for f16 {
    #[inline]
    fn decode(src: &[Self], dst: &mut [f32]) {
        // Uses F16C when the CPU has it (detected once per call).
        src.convert_to_f32_slice(dst);
    }
    #[inline]
    fn encode(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

/// `f32` to `bfloat16` bits, round-to-nearest-even; NaN stays NaN (quiet).
#[inline(always)]
pub(super) fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        ((bits >> 16) | 0x40) as u16
    } else {
        // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to
        // even; a carry into the exponent is the correct result (up to inf).
        (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
    }
}

/// `float8 e4m3` code to `f32`, branch-free so loops vectorize.
#[inline(always)]
pub(super) fn e4m3_to_f32(c: u8) -> f32 {
    let c = u32::from(c);
    let sign = (c & 0x80) << 24;
    let mag = c & 0x7f;
    // Normal: exponent field e (bias 7) becomes e + 120 (bias 127).
    let normal = f32::from_bits((mag << 20) + (120 << 23));
    // Subnormal (exponent field 0): mantissa * 2^-9, exact.
    let sub = mag as f32 * (1.0 / 512.0);
    let v = if mag >= 0x08 { normal } else { sub };
    let v = if mag == 0x7f { f32::NAN } else { v };
    f32::from_bits(v.to_bits() | sign)
}

/// `float8 e5m2` code to `f32`, branch-free so loops vectorize.
#[inline(always)]
pub(super) fn e5m2_to_f32(c: u8) -> f32 {
    let c = u32::from(c);
    let sign = (c & 0x80) << 24;
    let mag = c & 0x7f;
    // Normal: exponent field e (bias 15) becomes e + 112 (bias 127).
    let normal = f32::from_bits((mag << 21) + (112 << 23));
    // Infinity / NaN: all-ones exponent, mantissa kept.
    let special = f32::from_bits(0x7f80_0000 | ((mag & 3) << 21));
    // Subnormal (exponent field 0): mantissa * 2^-16, exact.
    let sub = mag as f32 * (1.0 / 65536.0);
    let v = if mag >= 0x04 { normal } else { sub };
    let v = if mag >= 0x7c { special } else { v };
    f32::from_bits(v.to_bits() | sign)
}

/// `f32` to `float8 e4m3`, round-to-nearest-even, saturating to ±448
/// (infinities included); NaN becomes `0x7f` with the sign. Branch-free.
#[inline(always)]
pub(super) fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7fff_ffff;
    // Everything above 448 (0x43e0_0000), infinity included, saturates.
    let clamped = abs.min(0x43e0_0000);
    // Normal results (>= 2^-6): round the mantissa to 3 bits, rebias.
    let normal = ((clamped + 0x7_ffff + ((clamped >> 20) & 1)) >> 20).wrapping_sub(120 << 3);
    // Subnormal results: adding 2^14 (ulp 2^-9) makes the FPU round the
    // value to a multiple of 2^-9, left in the low mantissa bits.
    let sub = (f32::from_bits(clamped) + 16384.0)
        .to_bits()
        .wrapping_sub(0x4680_0000);
    let mag = if clamped < 0x3c80_0000 { sub } else { normal };
    let mag = if abs > 0x7f80_0000 { 0x7f } else { mag };
    (mag | sign) as u8
}

/// `f32` to `float8 e5m2`, round-to-nearest-even, overflowing to ±inf;
/// NaN becomes `0x7f` with the sign. Branch-free.
#[inline(always)]
pub(super) fn f32_to_e5m2(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7fff_ffff;
    // Everything from 2^16 up rounds to infinity; clamping there keeps the
    // shifted result in range.
    let clamped = abs.min(0x4780_0000);
    // Normal results (>= 2^-14): round the mantissa to 2 bits, rebias.
    let normal = ((clamped + 0xf_ffff + ((clamped >> 21) & 1)) >> 21).wrapping_sub(112 << 2);
    // Subnormal results: adding 2^7 (ulp 2^-16) rounds to a multiple of
    // 2^-16.
    let sub = (f32::from_bits(clamped) + 128.0)
        .to_bits()
        .wrapping_sub(0x4300_0000);
    let mag = if clamped < 0x3880_0000 { sub } else { normal };
    let mag = if abs > 0x7f80_0000 { 0x7f } else { mag };
    (mag | sign) as u8
}

/// `float8 e4m3` storage (the "fn" variant).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub(super) struct E4m3(pub(super) u8);

/// `float8 e5m2` storage.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub(super) struct E5m2(pub(super) u8);

/// The chunked loop for narrow types: decode to `f32`, apply the input
/// transform (rounded to the storage type), combine, encode.
///
/// # Safety
/// As [`ReduceKernel::run`](super::ReduceKernel::run), with `count > 0` and `P` the datatype's type.
#[inline(always)]
pub(super) unsafe fn packed_loop<P: Packed, F: Fn(f32, f32) -> f32>(
    f: F,
    pre: Option<f32>,
    acc: Option<*const u8>,
    input: *const u8,
    out: *mut u8,
    count: usize,
) {
    let mut raw_a = [P::default(); CHUNK];
    let mut raw_b = [P::default(); CHUNK];
    let mut fa = [0f32; CHUNK];
    let mut fb = [0f32; CHUNK];
    let mut done = 0;
    while done < count {
        let m = (count - done).min(CHUNK);
        let off = done * size_of::<P>();
        let bytes = m * size_of::<P>();
        // SAFETY: `input` is valid for `off + bytes` bytes; the buffer is a
        // distinct stack array of CHUNK >= m elements, any bit pattern valid.
        unsafe { ptr::copy_nonoverlapping(input.add(off), raw_b.as_mut_ptr().cast::<u8>(), bytes) };
        let (rb, fb) = (&mut raw_b[..m], &mut fb[..m]);
        if let Some(s) = pre {
            P::decode(rb, fb);
            for x in fb.iter_mut() {
                *x *= s;
            }
            P::encode(fb, rb);
        }
        match acc {
            Some(a) => {
                // SAFETY: as for `input` above.
                unsafe {
                    ptr::copy_nonoverlapping(a.add(off), raw_a.as_mut_ptr().cast::<u8>(), bytes)
                };
                let (ra, fa) = (&mut raw_a[..m], &mut fa[..m]);
                P::decode(ra, fa);
                P::decode(rb, fb);
                for (x, &y) in fa.iter_mut().zip(fb.iter()) {
                    *x = f(*x, y);
                }
                P::encode(fa, ra);
                // SAFETY: `out` is valid for `off + bytes` bytes; this chunk
                // of every input has been read already, so an output
                // identical to an input is fine.
                unsafe { ptr::copy_nonoverlapping(ra.as_ptr().cast::<u8>(), out.add(off), bytes) };
            }
            None => {
                // SAFETY: as above.
                unsafe { ptr::copy_nonoverlapping(rb.as_ptr().cast::<u8>(), out.add(off), bytes) };
            }
        }
        done += m;
    }
}
