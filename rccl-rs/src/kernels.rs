//! Host reduction kernels: the element-wise arithmetic every reducing
//! collective applies, for every datatype and operator.
//!
//! A [`ReduceKernel`] is prepared once per collective call from its
//! `(datatype, op, nranks)`; the executor then calls [`ReduceKernel::run`] on
//! each chunk of data it combines.
//!
//! # Semantics
//!
//! * Integer `Sum` and `Prod` wrap around (two's complement), like NCCL.
//! * `Avg` on integer types sums (wrapping) and divides by `nranks` in the
//!   output transform, truncating toward zero like C division. `Avg` on
//!   floating-point types multiplies each input by `1/nranks` (computed in
//!   the compute type: `f32` for 8/16/32-bit floats, `f64` for `f64`) and
//!   sums.
//! * `PreMulSum` multiplies each input by its scalar (decoded from the
//!   datatype's own encoding; integer multiplication wraps) and sums.
//! * `Max` / `Min` on floating-point types propagate NaN: if either operand
//!   is NaN, the result is NaN (IEEE 754-2019 `maximum`/`minimum` style, not
//!   C's `fmax`, so a NaN in any rank's data is never silently dropped).
//!   When the operands compare equal (e.g. `+0.0` and `-0.0`) the input
//!   operand is returned.
//! * `float16`, `bfloat16` and both `float8` types are computed in `f32` and
//!   rounded back to the storage type with round-to-nearest-even after each
//!   step; the input transform's result is rounded to the storage type too
//!   (as NCCL does when it multiplies in the storage type). Because `f32`
//!   has more than twice the precision of these types plus two bits, every
//!   result is the correctly rounded result of the exact operation.
//! * `float8 e4m3` is the "fn" variant (no infinities, max ±448, NaN =
//!   `0x7f`/`0xff`); conversions to it saturate: any finite value or
//!   infinity beyond ±448 (after rounding) becomes ±448, as CUDA's
//!   `__NV_SATFINITE` conversions do. NaN stays NaN.
//! * `float8 e5m2` is IEEE-like: values beyond its range round to ±inf.
//! * NaN results of 8-bit conversions are `0x7f` with the input's sign.

use std::mem::{align_of, size_of};
use std::ptr;
use std::slice;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};

/// Elements processed per step by the chunked (conversion / unaligned) paths.
const CHUNK: usize = 256;

/// The combining operator, once `Avg` and `PreMulSum` are reduced to `Sum`
/// plus transforms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
    Sum,
    Prod,
    Max,
    Min,
}

/// An input-transform multiplier, in the form the compute type wants.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pre {
    /// Integer scalar, two's complement, sign-extended to 64 bits.
    Int(u64),
    /// Floating-point scalar (exactly representable in the compute type).
    Float(f64),
}

/// The reduction one collective call applies, prepared once per call.
#[derive(Clone, Debug)]
pub struct ReduceKernel {
    dtype: DataType,
    op: RedOp,
    nranks: usize,
    combine: Combine,
    /// Input transform `x * scalar`; `None` when it is the identity.
    pre: Option<Pre>,
    /// Output transform for integer `Avg`: divide by this; `None` when it is
    /// the identity.
    post_div: Option<u64>,
}

impl ReduceKernel {
    /// Validates the pair; `nranks >= 1` (used by `Avg`).
    ///
    /// Every `(datatype, op)` pair is valid; the only error is `nranks == 0`.
    pub fn new(dtype: DataType, op: RedOp, nranks: usize) -> Result<ReduceKernel> {
        if nranks == 0 {
            return Err(Error::InvalidArgument(
                "reduction kernel needs at least one rank".to_string(),
            ));
        }
        let (combine, pre, post_div) = match op {
            RedOp::Sum => (Combine::Sum, None, None),
            RedOp::Prod => (Combine::Prod, None, None),
            RedOp::Max => (Combine::Max, None, None),
            RedOp::Min => (Combine::Min, None, None),
            RedOp::Avg => {
                if dtype.is_float() {
                    let recip = if dtype == DataType::Float64 {
                        1.0 / nranks as f64
                    } else {
                        f64::from(1.0f32 / nranks as f32)
                    };
                    (Combine::Sum, Some(Pre::Float(recip)), None)
                } else {
                    (Combine::Sum, None, Some(nranks as u64))
                }
            }
            RedOp::PreMulSum { scalar } => {
                (Combine::Sum, Some(decode_scalar(dtype, &scalar)), None)
            }
        };
        // Multiplying by one is the identity (up to NaN payloads).
        let pre = pre.filter(|p| !matches!(p, Pre::Int(1)) && *p != Pre::Float(1.0));
        let post_div = post_div.filter(|&n| n != 1);
        Ok(ReduceKernel {
            dtype,
            op,
            nranks,
            combine,
            pre,
            post_div,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The operator this kernel was built for.
    pub fn op(&self) -> RedOp {
        self.op
    }

    /// The rank count this kernel was built for.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Whether `pre` is not the identity (lets the executor skip work when
    /// sending a user's buffer).
    pub fn has_input_transform(&self) -> bool {
        self.pre.is_some()
    }

    /// Whether the output transform applied when `finish` is true is not
    /// the identity.
    pub fn has_output_transform(&self) -> bool {
        self.post_div.is_some()
    }

    /// `out[i] = acc[i] OP pre(input[i])` (`acc = Some`), or
    /// `out[i] = pre(input[i])` (`acc = None`); when `finish` is true the
    /// output transform is applied to the result: `out[i] = post(...)`.
    ///
    /// `count` elements of the kernel's datatype. `out` may be exactly equal
    /// to `acc` or to `input` (in-place), and `acc` may equal `input`.
    ///
    /// # Safety
    ///
    /// Each pointer must be valid for `count * dtype.size()` bytes (reads for
    /// `acc` and `input`, writes for `out`), with any alignment. Ranges must
    /// be either identical or disjoint, never partially overlapping. With
    /// `count == 0` the pointers are not used.
    pub unsafe fn run(
        &self,
        acc: Option<*const u8>,
        input: *const u8,
        out: *mut u8,
        count: usize,
        finish: bool,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_unfenced(Store::Cached, acc, input, out, count, finish) }
    }

    /// [`ReduceKernel::run`] writing `out` with `store`s. With
    /// `Store::Streaming`, whole 64-byte lines of `out` take non-temporal
    /// stores (see [`copy_streaming`]), fenced before it returns. An `out`
    /// that is one of the inputs is written with ordinary stores, since its
    /// lines were just read into the cache, where a store costs no extra
    /// read; so are pointers not aligned for the element type and float16,
    /// whose loops convert through `f32`.
    ///
    /// # Safety
    ///
    /// As [`ReduceKernel::run`].
    pub unsafe fn run_with_store(
        &self,
        store: Store,
        acc: Option<*const u8>,
        input: *const u8,
        out: *mut u8,
        count: usize,
        finish: bool,
    ) {
        let aliased = acc == Some(out.cast_const()) || input == out.cast_const();
        let store = if aliased { Store::Cached } else { store };
        // SAFETY: forwarded from the caller.
        unsafe { self.run_unfenced(store, acc, input, out, count, finish) };
        if store == Store::Streaming {
            store_fence();
        }
    }

    /// The body of `run` and `run_with_store`; streaming stores are left
    /// unfenced, and only used when `out` is disjoint from the inputs.
    ///
    /// # Safety
    ///
    /// As [`ReduceKernel::run`]; with `Store::Streaming`, `out` disjoint
    /// from `acc` and `input`.
    unsafe fn run_unfenced(
        &self,
        store: Store,
        acc: Option<*const u8>,
        input: *const u8,
        out: *mut u8,
        count: usize,
        finish: bool,
    ) {
        if count == 0 {
            return;
        }
        let post = if finish { self.post_div } else { None };
        if acc.is_none() && self.pre.is_none() && post.is_none() {
            // Identity: a copy.
            if input != out.cast_const() {
                let bytes = count * self.dtype.size();
                // SAFETY: the caller guarantees both ranges are valid for
                // `bytes` and, being unequal, disjoint.
                match store {
                    Store::Cached => unsafe { ptr::copy_nonoverlapping(input, out, bytes) },
                    Store::Streaming => unsafe { copy_streaming_unfenced(input, out, bytes) },
                }
            }
            return;
        }
        // SAFETY (for every arm): forwarded from this function's contract.
        unsafe {
            match self.dtype {
                DataType::Int8 => self.run_native::<i8>(acc, input, out, count, post, store),
                DataType::Uint8 => self.run_native::<u8>(acc, input, out, count, post, store),
                DataType::Int32 => self.run_native::<i32>(acc, input, out, count, post, store),
                DataType::Uint32 => self.run_native::<u32>(acc, input, out, count, post, store),
                DataType::Int64 => self.run_native::<i64>(acc, input, out, count, post, store),
                DataType::Uint64 => self.run_native::<u64>(acc, input, out, count, post, store),
                DataType::Float32 => self.run_native::<f32>(acc, input, out, count, post, store),
                DataType::Float64 => self.run_native::<f64>(acc, input, out, count, post, store),
                DataType::Float16 => self.run_packed::<f16>(acc, input, out, count),
                DataType::Bfloat16 => self.run_native::<bf16>(acc, input, out, count, post, store),
                DataType::Float8e4m3 => {
                    self.run_native::<E4m3>(acc, input, out, count, post, store)
                }
                DataType::Float8e5m2 => {
                    self.run_native::<E5m2>(acc, input, out, count, post, store)
                }
            }
        }
    }

    /// Types computed element by element (all but float16): uses an AVX2
    /// build of the loops when the CPU has AVX2.
    ///
    /// # Safety
    /// As [`ReduceKernel::run`], with `count > 0`.
    unsafe fn run_native<T: Native>(
        &self,
        acc: Option<*const u8>,
        input: *const u8,
        out: *mut u8,
        count: usize,
        post: Option<u64>,
        store: Store,
    ) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked above); the rest is
            // forwarded from this function's contract.
            return unsafe { self.run_native_avx2::<T>(acc, input, out, count, post, store) };
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.run_native_body::<T>(acc, input, out, count, post, store) }
    }

    /// [`ReduceKernel::run_native_body`] compiled for AVX2.
    ///
    /// # Safety
    /// As [`ReduceKernel::run`], with `count > 0`, on a CPU with AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_native_avx2<T: Native>(
        &self,
        acc: Option<*const u8>,
        input: *const u8,
        out: *mut u8,
        count: usize,
        post: Option<u64>,
        store: Store,
    ) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.run_native_body::<T>(acc, input, out, count, post, store) }
    }

    /// The loops of [`ReduceKernel::run_native`], inlined into each build.
    ///
    /// # Safety
    /// As [`ReduceKernel::run`], with `count > 0`.
    #[inline(always)]
    unsafe fn run_native_body<T: Native>(
        &self,
        acc: Option<*const u8>,
        input: *const u8,
        out: *mut u8,
        count: usize,
        post: Option<u64>,
        store: Store,
    ) {
        let pre = self.pre.map(T::scale_from);
        // SAFETY (for every arm): forwarded from this function's contract.
        unsafe {
            match self.combine {
                Combine::Sum => match (pre, post) {
                    (None, None) => drive(|a: T, b| a.add(b), |x| x, acc, input, out, count, store),
                    (Some(s), None) => drive(
                        move |a: T, b: T| a.add(b.scale(s)),
                        move |x: T| x.scale(s),
                        acc,
                        input,
                        out,
                        count,
                        store,
                    ),
                    (None, Some(n)) => drive(
                        move |a: T, b| a.add(b).div_n(n),
                        move |x| x.div_n(n),
                        acc,
                        input,
                        out,
                        count,
                        store,
                    ),
                    (Some(s), Some(n)) => drive(
                        move |a: T, b: T| a.add(b.scale(s)).div_n(n),
                        move |x: T| x.scale(s).div_n(n),
                        acc,
                        input,
                        out,
                        count,
                        store,
                    ),
                },
                // Prod, Max and Min never carry transforms (see `new`).
                Combine::Prod => drive(|a: T, b| a.mul(b), |x| x, acc, input, out, count, store),
                Combine::Max => drive(|a: T, b| a.max_nan(b), |x| x, acc, input, out, count, store),
                Combine::Min => drive(|a: T, b| a.min_nan(b), |x| x, acc, input, out, count, store),
            }
        }
    }

    /// Types stored narrower than their compute type (`f32`).
    ///
    /// # Safety
    /// As [`ReduceKernel::run`], with `count > 0`.
    unsafe fn run_packed<P: Packed>(
        &self,
        acc: Option<*const u8>,
        input: *const u8,
        out: *mut u8,
        count: usize,
    ) {
        let pre = match self.pre {
            Some(Pre::Float(s)) => Some(s as f32),
            Some(Pre::Int(s)) => Some(s as i64 as f32),
            None => None,
        };
        // SAFETY (for every arm): forwarded from this function's contract.
        unsafe {
            match self.combine {
                Combine::Sum => packed_loop::<P, _>(|a, b| a + b, pre, acc, input, out, count),
                Combine::Prod => packed_loop::<P, _>(|a, b| a * b, pre, acc, input, out, count),
                Combine::Max => {
                    packed_loop::<P, _>(|a: f32, b| a.max_nan(b), pre, acc, input, out, count)
                }
                Combine::Min => {
                    packed_loop::<P, _>(|a: f32, b| a.min_nan(b), pre, acc, input, out, count)
                }
            }
        }
    }
}

/// Decodes a `PreMulSum` scalar stored in `dtype`'s encoding.
fn decode_scalar(dtype: DataType, bytes: &[u8; 8]) -> Pre {
    let le = |n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&bytes[..n]);
        u64::from_le_bytes(b)
    };
    match dtype {
        DataType::Int8 => Pre::Int(bytes[0] as i8 as i64 as u64),
        DataType::Uint8 => Pre::Int(u64::from(bytes[0])),
        DataType::Int32 => Pre::Int(le(4) as u32 as i32 as i64 as u64),
        DataType::Uint32 => Pre::Int(le(4)),
        DataType::Int64 | DataType::Uint64 => Pre::Int(le(8)),
        _ => Pre::Float(decode_f64(dtype, &bytes[..dtype.size()])),
    }
}

// ---------------------------------------------------------------------------
// Element arithmetic
// ---------------------------------------------------------------------------

/// Arithmetic of a type computed natively (integers, `f32`, `f64`).
trait Native: Copy + Default + 'static {
    fn add(self, other: Self) -> Self;
    fn mul(self, other: Self) -> Self;
    /// Maximum; NaN-propagating for floats; `other` on ties.
    fn max_nan(self, other: Self) -> Self;
    /// Minimum; NaN-propagating for floats; `other` on ties.
    fn min_nan(self, other: Self) -> Self;
    /// Division by `n >= 1` truncating toward zero (integers; identity for
    /// floats, which never use it).
    fn div_n(self, n: u64) -> Self;
    /// The input-transform multiplier's type (the compute type).
    type Scale: Copy;
    /// The input transform `self * s`, rounded to `Self`.
    fn scale(self, s: Self::Scale) -> Self;
    fn scale_from(p: Pre) -> Self::Scale;
}

macro_rules! native_int {
    ($($t:ty => |$x:ident, $n:ident| $div:expr;)*) => {$(
        impl Native for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            #[inline(always)]
            fn max_nan(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            #[inline(always)]
            fn min_nan(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            #[inline(always)]
            fn div_n(self, n: u64) -> Self {
                let $x = self;
                let $n = n;
                $div
            }
            type Scale = $t;
            #[inline(always)]
            fn scale(self, s: $t) -> Self {
                self.wrapping_mul(s)
            }
            #[inline(always)]
            fn scale_from(p: Pre) -> $t {
                match p {
                    Pre::Int(v) => v as $t,
                    Pre::Float(f) => f as $t,
                }
            }
        }
    )*};
}

// Narrow types divide in i64 with `n` clamped: once `n` exceeds every
// magnitude of the type, any larger `n` gives the same quotient (0).
native_int! {
    i8 => |x, n| (i64::from(x) / n.min(1 << 40) as i64) as i8;
    u8 => |x, n| (u64::from(x) / n) as u8;
    i32 => |x, n| (i64::from(x) / n.min(1 << 40) as i64) as i32;
    u32 => |x, n| (u64::from(x) / n) as u32;
    i64 => |x, n| if n <= i64::MAX as u64 { x / n as i64 } else { (i128::from(x) / i128::from(n)) as i64 };
    u64 => |x, n| x / n;
}

macro_rules! native_float {
    ($($t:ty),*) => {$(
        impl Native for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self + other
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                self * other
            }
            #[inline(always)]
            fn max_nan(self, other: Self) -> Self {
                if self.is_nan() || self > other { self } else { other }
            }
            #[inline(always)]
            fn min_nan(self, other: Self) -> Self {
                if self.is_nan() || self < other { self } else { other }
            }
            #[inline(always)]
            fn div_n(self, _n: u64) -> Self {
                self
            }
            type Scale = $t;
            #[inline(always)]
            fn scale(self, s: $t) -> Self {
                self * s
            }
            #[inline(always)]
            fn scale_from(p: Pre) -> $t {
                match p {
                    Pre::Int(v) => v as i64 as $t,
                    Pre::Float(f) => f as $t,
                }
            }
        }
    )*};
}

native_float!(f32, f64);

/// Narrow floating-point types computed element by element in `f32`:
/// decode, operate, round back (nearest-even). Max/min return one of the
/// operands unchanged.
macro_rules! native_narrow {
    ($($t:ty: $dec:expr, $enc:expr;)*) => {$(
        impl Native for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                $enc($dec(self) + $dec(other))
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                $enc($dec(self) * $dec(other))
            }
            #[inline(always)]
            fn max_nan(self, other: Self) -> Self {
                let a: f32 = $dec(self);
                if a.is_nan() || a > $dec(other) { self } else { other }
            }
            #[inline(always)]
            fn min_nan(self, other: Self) -> Self {
                let a: f32 = $dec(self);
                if a.is_nan() || a < $dec(other) { self } else { other }
            }
            #[inline(always)]
            fn div_n(self, _n: u64) -> Self {
                self
            }
            type Scale = f32;
            #[inline(always)]
            fn scale(self, s: f32) -> Self {
                $enc($dec(self) * s)
            }
            #[inline(always)]
            fn scale_from(p: Pre) -> f32 {
                match p {
                    Pre::Int(v) => v as i64 as f32,
                    Pre::Float(f) => f as f32,
                }
            }
        }
    )*};
}

native_narrow! {
    bf16: |x: bf16| f32::from_bits(u32::from(x.to_bits()) << 16),
        |x: f32| bf16::from_bits(f32_to_bf16_bits(x));
    E4m3: |x: E4m3| e4m3_to_f32(x.0), |x: f32| E4m3(f32_to_e4m3(x));
    E5m2: |x: E5m2| e5m2_to_f32(x.0), |x: f32| E5m2(f32_to_e5m2(x));
}

// ---------------------------------------------------------------------------
// Loops over native types
// ---------------------------------------------------------------------------

/// Runs `out = f2(acc, input)` or `out = f1(input)` over `count > 0`
/// elements, on slices when every pointer is aligned for `T`, else through
/// aligned stack buffers; with `Store::Streaming` and aligned pointers,
/// `out`'s whole lines take non-temporal stores.
///
/// # Safety
/// As [`ReduceKernel::run`], with `count > 0` and `T` the datatype's type;
/// with `Store::Streaming`, `out` disjoint from the inputs.
#[inline(always)]
unsafe fn drive<T: Native, F2: Fn(T, T) -> T, F1: Fn(T) -> T>(
    f2: F2,
    f1: F1,
    acc: Option<*const u8>,
    input: *const u8,
    out: *mut u8,
    count: usize,
    store: Store,
) {
    let aligned = |p: *const u8| (p as usize) & (align_of::<T>() - 1) == 0;
    let all_aligned =
        aligned(input) && aligned(out.cast_const()) && acc.map(aligned).unwrap_or(true);
    // SAFETY (for every arm): the pointers are valid for count elements of
    // T, identical or disjoint (caller's contract); the aligned variants
    // are only chosen when every pointer is aligned for T.
    // the streaming variants only when `out` is disjoint from the inputs.
    unsafe {
        match (acc, all_aligned, store) {
            (Some(a), true, Store::Streaming) => {
                zip_streaming(&f2, a.cast(), input.cast(), out.cast(), count)
            }
            (Some(a), true, Store::Cached) => {
                zip_aligned(&f2, a.cast(), input.cast(), out.cast(), count)
            }
            (Some(a), false, _) => zip_unaligned(&f2, a, input, out, count),
            (None, true, Store::Streaming) => map_streaming(&f1, input.cast(), out.cast(), count),
            (None, true, Store::Cached) => map_aligned(&f1, input.cast(), out.cast(), count),
            (None, false, _) => map_unaligned(&f1, input, out, count),
        }
    }
}

/// One cache line of results on its way to a non-temporal store.
#[repr(C, align(64))]
struct Line([u8; LINE_BYTES]);

/// Bytes of a cache line.
const LINE_BYTES: usize = 64;

/// `(head, lines)`: the elements of `T` before `o` reaches a line
/// boundary (at most `n`), then the whole lines after them.
#[inline(always)]
fn line_split<T>(o: *mut T, n: usize) -> (usize, usize) {
    let head = ((LINE_BYTES - (o as usize) % LINE_BYTES) % LINE_BYTES / size_of::<T>()).min(n);
    (head, (n - head) * size_of::<T>() / LINE_BYTES)
}

/// Writes the `n` elements of `o`: each whole line computed by `value`
/// (the element's index to its result) into a [`Line`] and written with
/// non-temporal stores (unfenced); the elements before the first line
/// boundary and after the last whole line by `cached(from, len)`, with
/// ordinary stores.
///
/// # Safety
/// `o` aligned, non-null and valid for `n` elements; `value` and `cached`
/// sound for every index below `n`.
#[inline(always)]
unsafe fn stream_lines<T: Copy>(
    o: *mut T,
    n: usize,
    cached: impl Fn(usize, usize),
    value: impl Fn(usize) -> T,
) {
    let per_line = LINE_BYTES / size_of::<T>();
    let (head, lines) = line_split(o, n);
    let tail = head + lines * per_line;
    let mut line = Line([0; LINE_BYTES]);
    let slot = line.0.as_mut_ptr().cast::<T>();
    cached(0, head);
    for l in 0..lines {
        let at = head + l * per_line;
        for i in 0..per_line {
            // SAFETY: `line` holds `per_line` elements of `T` (64 bytes,
            // aligned for every element type).
            unsafe { slot.add(i).write(value(at + i)) };
        }
        // SAFETY: `o + at` is 64-byte aligned (`line_split`) and its line
        // lies below `n` elements.
        unsafe { stream_line(&line, o.add(at).cast()) };
    }
    cached(tail, n - tail);
}

/// `o[i] = f(a[i], b[i])` for aligned pointers and an `o` disjoint from
/// both inputs, its whole lines written with non-temporal stores
/// ([`stream_lines`]).
///
/// # Safety
/// `a`, `b`, `o` aligned, non-null and valid for `n` elements; `o`
/// disjoint from `a` and `b`.
#[inline(always)]
unsafe fn zip_streaming<T: Copy, F: Fn(T, T) -> T>(
    f: &F,
    a: *const T,
    b: *const T,
    o: *mut T,
    n: usize,
) {
    // SAFETY: every index `stream_lines` passes to the closures stays
    // below `n`, where the pointers are valid.
    unsafe {
        stream_lines(
            o,
            n,
            |from, len| zip_aligned(f, a.add(from), b.add(from), o.add(from), len),
            |i| f(a.add(i).read(), b.add(i).read()),
        )
    }
}

/// `o[i] = f(b[i])` as [`zip_streaming`] writes it.
///
/// # Safety
/// `b`, `o` aligned, non-null and valid for `n` elements, disjoint.
#[inline(always)]
unsafe fn map_streaming<T: Copy, F: Fn(T) -> T>(f: &F, b: *const T, o: *mut T, n: usize) {
    // SAFETY: as in `zip_streaming`.
    unsafe {
        stream_lines(
            o,
            n,
            |from, len| map_aligned(f, b.add(from), o.add(from), len),
            |i| f(b.add(i).read()),
        )
    }
}

/// Writes `line` to the 64-byte aligned `o` with non-temporal stores
/// (ordinary ones off x86_64).
///
/// # Safety
/// `o` valid for 64 bytes of writes, 64-byte aligned, disjoint from `line`.
#[inline(always)]
unsafe fn stream_line(line: &Line, o: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: both addresses are 16-byte aligned at every step (`Line` and
    // `o` are 64-byte aligned) and valid for the 64 bytes; SSE2 is part of
    // every x86_64 CPU.
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        for i in (0..LINE_BYTES).step_by(16) {
            let v = _mm_load_si128(line.0.as_ptr().add(i).cast::<__m128i>());
            _mm_stream_si128(o.add(i).cast::<__m128i>(), v);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        ptr::copy_nonoverlapping(line.0.as_ptr(), o, LINE_BYTES)
    };
}

/// `o[i] = f(a[i], b[i])` for aligned pointers, shaping the slices by how
/// `o` aliases the inputs so that no `&mut` slice overlaps a `&` slice.
///
/// # Safety
/// `a`, `b`, `o` aligned, non-null and valid for `n` elements; each pair is
/// identical or disjoint.
#[inline(always)]
unsafe fn zip_aligned<T: Copy, F: Fn(T, T) -> T>(
    f: &F,
    a: *const T,
    b: *const T,
    o: *mut T,
    n: usize,
) {
    if o.cast_const() == a {
        // SAFETY: `o` is valid for n aligned elements and no other
        // reference to that range exists while `o` is live (b is either the
        // same range, read only through `o`, or disjoint).
        let o = unsafe { slice::from_raw_parts_mut(o, n) };
        if b == a {
            for x in o.iter_mut() {
                *x = f(*x, *x);
            }
        } else {
            // SAFETY: `b` is valid, aligned and disjoint from `o`.
            let b = unsafe { slice::from_raw_parts(b, n) };
            for (x, &y) in o.iter_mut().zip(b) {
                *x = f(*x, y);
            }
        }
    } else if o.cast_const() == b {
        // SAFETY: `a` and `o` are valid, aligned and disjoint (o != a).
        let (a, o) = unsafe { (slice::from_raw_parts(a, n), slice::from_raw_parts_mut(o, n)) };
        for (x, &y) in o.iter_mut().zip(a) {
            *x = f(y, *x);
        }
    } else {
        // SAFETY: `o` is disjoint from both inputs; the inputs are only
        // read, so they may be identical.
        let (a, b, o) = unsafe {
            (
                slice::from_raw_parts(a, n),
                slice::from_raw_parts(b, n),
                slice::from_raw_parts_mut(o, n),
            )
        };
        for ((x, &p), &q) in o.iter_mut().zip(a).zip(b) {
            *x = f(p, q);
        }
    }
}

/// `o[i] = f(b[i])` for aligned pointers.
///
/// # Safety
/// `b`, `o` aligned, non-null and valid for `n` elements; identical or
/// disjoint.
#[inline(always)]
unsafe fn map_aligned<T: Copy, F: Fn(T) -> T>(f: &F, b: *const T, o: *mut T, n: usize) {
    if o.cast_const() == b {
        // SAFETY: valid aligned range, only reference to it.
        let o = unsafe { slice::from_raw_parts_mut(o, n) };
        for x in o.iter_mut() {
            *x = f(*x);
        }
    } else {
        // SAFETY: valid aligned disjoint ranges.
        let (b, o) = unsafe { (slice::from_raw_parts(b, n), slice::from_raw_parts_mut(o, n)) };
        for (x, &y) in o.iter_mut().zip(b) {
            *x = f(y);
        }
    }
}

/// `zip_aligned` for pointers of any alignment: each chunk is copied into
/// aligned stack buffers, combined there and copied out.
///
/// # Safety
/// Byte pointers valid for `n * size_of::<T>()` bytes, identical or
/// disjoint; every bit pattern must be a valid `T` (true of all element
/// types here).
#[inline(always)]
unsafe fn zip_unaligned<T: Native, F: Fn(T, T) -> T>(
    f: &F,
    a: *const u8,
    b: *const u8,
    o: *mut u8,
    n: usize,
) {
    let mut ba = [T::default(); CHUNK];
    let mut bb = [T::default(); CHUNK];
    let mut done = 0;
    while done < n {
        let m = (n - done).min(CHUNK);
        let off = done * size_of::<T>();
        let bytes = m * size_of::<T>();
        // SAFETY: the sources are valid for `off + bytes` bytes; the stack
        // buffers hold CHUNK >= m elements and are distinct from caller
        // memory. Reading this chunk of both inputs completes before it is
        // written, and chunks are disjoint, so an aliased output is fine.
        unsafe {
            ptr::copy_nonoverlapping(a.add(off), ba.as_mut_ptr().cast::<u8>(), bytes);
            ptr::copy_nonoverlapping(b.add(off), bb.as_mut_ptr().cast::<u8>(), bytes);
        }
        for (x, &y) in ba[..m].iter_mut().zip(&bb[..m]) {
            *x = f(*x, y);
        }
        // SAFETY: `o` is valid for `off + bytes` bytes; the buffer is ours.
        unsafe { ptr::copy_nonoverlapping(ba.as_ptr().cast::<u8>(), o.add(off), bytes) };
        done += m;
    }
}

/// `map_aligned` for pointers of any alignment.
///
/// # Safety
/// As [`zip_unaligned`].
#[inline(always)]
unsafe fn map_unaligned<T: Native, F: Fn(T) -> T>(f: &F, b: *const u8, o: *mut u8, n: usize) {
    let mut bb = [T::default(); CHUNK];
    let mut done = 0;
    while done < n {
        let m = (n - done).min(CHUNK);
        let off = done * size_of::<T>();
        let bytes = m * size_of::<T>();
        // SAFETY: as in `zip_unaligned`.
        unsafe { ptr::copy_nonoverlapping(b.add(off), bb.as_mut_ptr().cast::<u8>(), bytes) };
        for x in bb[..m].iter_mut() {
            *x = f(*x);
        }
        // SAFETY: as in `zip_unaligned`.
        unsafe { ptr::copy_nonoverlapping(bb.as_ptr().cast::<u8>(), o.add(off), bytes) };
        done += m;
    }
}

// ---------------------------------------------------------------------------
// Streaming (non-temporal) stores
// ---------------------------------------------------------------------------

/// How a primitive writes what it produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// Ordinary stores: the data stays cached for its next reader (FIFO
    /// slots, calls that fit the caches).
    Cached,
    /// Non-temporal stores ([`copy_streaming`]): for outputs larger than
    /// the last-level cache, which the call does not read again soon.
    Streaming,
}

impl Store {
    /// Copies `bytes` from `src` to `dst` with these stores.
    ///
    /// # Safety
    ///
    /// As [`copy_streaming`].
    pub unsafe fn copy(self, src: *const u8, dst: *mut u8, bytes: usize) {
        // SAFETY (both arms): forwarded from the caller.
        match self {
            Store::Cached => unsafe { ptr::copy_nonoverlapping(src, dst, bytes) },
            Store::Streaming => unsafe { copy_streaming(src, dst, bytes) },
        }
    }
}

/// Copies below this many bytes use ordinary stores: there is no whole
/// cache line to gain.
const STREAMING_MIN_BYTES: usize = 256;

/// Copies `bytes` from `src` to `dst` with non-temporal stores and fences
/// them, so that a later release store publishes them like ordinary ones.
///
/// An ordinary store to a line that is not cached first reads the line
/// from memory; a non-temporal store writes it without the read and
/// without evicting cached data. For an output far larger than the last
/// level cache, written once and not read again soon, that saves a third
/// of the memory traffic of a copy. On other architectures it is an
/// ordinary copy.
///
/// # Safety
///
/// `src` valid for reads and `dst` for writes of `bytes` bytes, the
/// ranges disjoint; any alignment.
pub unsafe fn copy_streaming(src: *const u8, dst: *mut u8, bytes: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { copy_streaming_unfenced(src, dst, bytes) };
    store_fence();
}

/// Orders every earlier non-temporal store before later stores.
#[inline]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86_64 CPU; sfence has no operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// [`copy_streaming`] without the closing fence (the caller fences).
///
/// # Safety
///
/// As [`copy_streaming`].
#[inline]
unsafe fn copy_streaming_unfenced(src: *const u8, dst: *mut u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    if bytes >= STREAMING_MIN_BYTES {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        // Ordinary stores up to the first 16-byte boundary of `dst`, then
        // 16-byte streaming stores, then ordinary stores for the rest.
        let head = (16 - (dst as usize & 15)) & 15;
        let body = (bytes - head) & !15;
        // SAFETY: every offset stays below `bytes`, inside both ranges
        // (caller's contract); the streamed addresses `dst + head + i` are
        // 16-byte aligned as `_mm_stream_si128` requires; SSE2 is part of
        // every x86_64 CPU.
        unsafe {
            ptr::copy_nonoverlapping(src, dst, head);
            let (s, d) = (src.add(head), dst.add(head));
            for i in (0..body).step_by(16) {
                let v = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                _mm_stream_si128(d.add(i).cast::<__m128i>(), v);
            }
            ptr::copy_nonoverlapping(s.add(body), d.add(body), bytes - head - body);
        }
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { ptr::copy_nonoverlapping(src, dst, bytes) };
}

// ---------------------------------------------------------------------------
// Narrow floating-point types, computed in f32
// ---------------------------------------------------------------------------

/// A storage type narrower than its `f32` compute type. Every bit pattern is
/// a valid value.
trait Packed: Copy + Default {
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
fn f32_to_bf16_bits(x: f32) -> u16 {
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
fn e4m3_to_f32(c: u8) -> f32 {
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
fn e5m2_to_f32(c: u8) -> f32 {
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
fn f32_to_e4m3(x: f32) -> u8 {
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
fn f32_to_e5m2(x: f32) -> u8 {
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
struct E4m3(u8);

/// `float8 e5m2` storage.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
#[repr(transparent)]
struct E5m2(u8);

/// The chunked loop for narrow types: decode to `f32`, apply the input
/// transform (rounded to the storage type), combine, encode.
///
/// # Safety
/// As [`ReduceKernel::run`], with `count > 0` and `P` the datatype's type.
#[inline(always)]
unsafe fn packed_loop<P: Packed, F: Fn(f32, f32) -> f32>(
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

// ---------------------------------------------------------------------------
// Small floating-point formats
// ---------------------------------------------------------------------------

/// A binary floating-point format of at most 16 bits.
#[derive(Clone, Copy, Debug)]
struct MiniFloat {
    /// Exponent bits.
    exp: u32,
    /// Mantissa (fraction) bits.
    mant: u32,
    /// Exponent bias.
    bias: i32,
    /// IEEE-style specials (all-ones exponent: inf / NaN). Otherwise only
    /// the all-ones code is NaN and there is no infinity ("fn" variant).
    ieee: bool,
    /// Out-of-range values (and infinities) saturate to the largest finite
    /// value instead of becoming infinity.
    saturate: bool,
    /// The NaN code produced (without sign).
    nan: u32,
}

impl MiniFloat {
    /// Code of the largest finite magnitude.
    const fn max_finite(self) -> u32 {
        if self.ieee {
            (((1 << self.exp) - 1) << self.mant) - 1
        } else {
            (1 << (self.exp + self.mant)) - 2
        }
    }

    /// Code of +infinity (IEEE formats only).
    const fn inf(self) -> u32 {
        ((1 << self.exp) - 1) << self.mant
    }

    const fn sign_bit(self) -> u32 {
        1 << (self.exp + self.mant)
    }
}

const E4M3: MiniFloat = MiniFloat {
    exp: 4,
    mant: 3,
    bias: 7,
    ieee: false,
    saturate: true,
    nan: 0x7f,
};
const E5M2: MiniFloat = MiniFloat {
    exp: 5,
    mant: 2,
    bias: 15,
    ieee: true,
    saturate: false,
    nan: 0x7f,
};
const F16: MiniFloat = MiniFloat {
    exp: 5,
    mant: 10,
    bias: 15,
    ieee: true,
    saturate: false,
    nan: 0x7e00,
};
const BF16: MiniFloat = MiniFloat {
    exp: 8,
    mant: 7,
    bias: 127,
    ieee: true,
    saturate: false,
    nan: 0x7fc0,
};

/// Decodes `code` of format `f` to the bits of the (exactly) equal `f32`.
const fn mini_to_f32_bits(f: MiniFloat, code: u32) -> u32 {
    let sign = if code & f.sign_bit() != 0 {
        1u32 << 31
    } else {
        0
    };
    let e = (code >> f.mant) & ((1 << f.exp) - 1);
    let m = code & ((1 << f.mant) - 1);
    let e_max = (1 << f.exp) - 1;
    if f.ieee && e == e_max {
        return if m == 0 {
            sign | 0x7f80_0000
        } else {
            sign | 0x7fc0_0000
        };
    }
    if !f.ieee && e == e_max && m == (1 << f.mant) - 1 {
        return sign | 0x7fc0_0000;
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // Subnormal: m * 2^(1 - bias - mant); normalize on m's top bit p.
        let p = 31 - m.leading_zeros();
        let exp_field = (p as i32 + 1 - f.bias - f.mant as i32 + 127) as u32;
        return sign | (exp_field << 23) | ((m - (1 << p)) << (23 - p));
    }
    let exp_field = (e as i32 - f.bias + 127) as u32;
    sign | (exp_field << 23) | (m << (23 - f.mant))
}

const fn mini_table(f: MiniFloat) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = mini_to_f32_bits(f, i as u32);
        i += 1;
    }
    t
}

/// `f32` bits of every `float8 e4m3` code.
static E4M3_TO_F32: [u32; 256] = mini_table(E4M3);
/// `f32` bits of every `float8 e5m2` code.
static E5M2_TO_F32: [u32; 256] = mini_table(E5M2);

/// Shifts `v` right by `s` bits, rounding to nearest, ties to even.
#[inline(always)]
fn shift_rne(v: u64, s: u32) -> u64 {
    if s == 0 {
        return v;
    }
    if s > 64 {
        return 0;
    }
    let q = if s == 64 { 0 } else { v >> s };
    let rem = if s == 64 { v } else { v & ((1u64 << s) - 1) };
    let half = 1u64 << (s - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// Rounds a binary float given as `(negative, magnitude bits)` in a source
/// format with `src_mant` fraction bits and bias `src_bias` to format `f`,
/// round-to-nearest-even, handling subnormals, overflow and NaN.
#[inline(always)]
fn round_to_mini(f: MiniFloat, negative: bool, abs: u64, src_mant: u32, src_bias: i32) -> u32 {
    let sign = if negative { f.sign_bit() } else { 0 };
    let src_exp_field = abs >> src_mant;
    let frac_mask = (1u64 << src_mant) - 1;
    // All-ones exponent field of the source (f32: 0xff, f64: 0x7ff).
    let src_exp_max = ((src_bias as u64) << 1) | 1;
    if src_exp_field == src_exp_max {
        if abs & frac_mask != 0 {
            return sign | f.nan;
        }
        // Infinity.
        return sign
            | if f.ieee && !f.saturate {
                f.inf()
            } else {
                f.max_finite()
            };
    }
    if abs == 0 {
        return sign;
    }
    // Significand with its implicit bit and unbiased exponent; source
    // subnormals are normalized first.
    let (sig, e) = if src_exp_field == 0 {
        let lz = abs.leading_zeros() - (63 - src_mant);
        (abs << lz, 1 - src_bias - lz as i32)
    } else {
        (
            (abs & frac_mask) | (1u64 << src_mant),
            src_exp_field as i32 - src_bias,
        )
    };
    let target_e = e + f.bias;
    let code = if target_e >= 1 {
        let q = shift_rne(sig, src_mant - f.mant);
        // q in [2^mant, 2^(mant+1)]; a carry moves into the exponent.
        ((target_e as u64) << f.mant) + q - (1u64 << f.mant)
    } else {
        // Subnormal in the target: units of 2^(1 - bias - mant).
        let shift = (src_mant - f.mant) as i64 + 1 - target_e as i64;
        shift_rne(sig, shift.min(65) as u32)
    };
    let max = u64::from(f.max_finite());
    let mag = if code > max {
        if f.saturate || !f.ieee {
            f.max_finite()
        } else {
            f.inf()
        }
    } else {
        code as u32
    };
    sign | mag
}

/// `f32` to format `f` (the generic reference for the fast codecs).
#[cfg(test)]
fn f32_to_mini(f: MiniFloat, x: f32) -> u32 {
    let bits = x.to_bits();
    round_to_mini(f, bits >> 31 != 0, u64::from(bits & 0x7fff_ffff), 23, 127)
}

/// `f64` to format `f`.
#[inline]
fn f64_to_mini(f: MiniFloat, x: f64) -> u32 {
    let bits = x.to_bits();
    round_to_mini(f, bits >> 63 != 0, bits & 0x7fff_ffff_ffff_ffff, 52, 1023)
}

// ---------------------------------------------------------------------------
// Public conversions
// ---------------------------------------------------------------------------

/// Writes `value` as one element of `dtype` into `out[..dtype.size()]`
/// (little-endian), rounding to nearest-even for floating-point types
/// (`float8 e4m3` saturating to ±448); integers convert with an `as` cast
/// (saturating, NaN to 0). Does nothing if `out` is shorter than one element.
pub fn encode_f64(dtype: DataType, value: f64, out: &mut [u8]) {
    let Some(out) = out.get_mut(..dtype.size()) else {
        return;
    };
    match dtype {
        DataType::Int8 => out.copy_from_slice(&(value as i8).to_le_bytes()),
        DataType::Uint8 => out.copy_from_slice(&(value as u8).to_le_bytes()),
        DataType::Int32 => out.copy_from_slice(&(value as i32).to_le_bytes()),
        DataType::Uint32 => out.copy_from_slice(&(value as u32).to_le_bytes()),
        DataType::Int64 => out.copy_from_slice(&(value as i64).to_le_bytes()),
        DataType::Uint64 => out.copy_from_slice(&(value as u64).to_le_bytes()),
        DataType::Float32 => out.copy_from_slice(&(value as f32).to_le_bytes()),
        DataType::Float64 => out.copy_from_slice(&value.to_le_bytes()),
        DataType::Float16 => out.copy_from_slice(&(f64_to_mini(F16, value) as u16).to_le_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&(f64_to_mini(BF16, value) as u16).to_le_bytes()),
        DataType::Float8e4m3 => out[0] = f64_to_mini(E4M3, value) as u8,
        DataType::Float8e5m2 => out[0] = f64_to_mini(E5M2, value) as u8,
    }
}

/// Reads one element of `dtype` from `bytes[..dtype.size()]`
/// (little-endian) as `f64` (exact except for 64-bit integers beyond 2^53).
/// Returns NaN if `bytes` is shorter than one element.
pub fn decode_f64(dtype: DataType, bytes: &[u8]) -> f64 {
    let Some(b) = bytes.get(..dtype.size()) else {
        return f64::NAN;
    };
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    let v = u64::from_le_bytes(w);
    match dtype {
        DataType::Int8 => f64::from(v as u8 as i8),
        DataType::Uint8 => f64::from(v as u8),
        DataType::Int32 => f64::from(v as u32 as i32),
        DataType::Uint32 => f64::from(v as u32),
        DataType::Int64 => v as i64 as f64,
        DataType::Uint64 => v as f64,
        DataType::Float32 => f64::from(f32::from_bits(v as u32)),
        DataType::Float64 => f64::from_bits(v),
        DataType::Float16 => f16::from_bits(v as u16).to_f64(),
        DataType::Bfloat16 => bf16::from_bits(v as u16).to_f64(),
        DataType::Float8e4m3 => f64::from(f32::from_bits(E4M3_TO_F32[v as u8 as usize])),
        DataType::Float8e5m2 => f64::from(f32::from_bits(E5M2_TO_F32[v as u8 as usize])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
                RedOp::PreMulSum { scalar } => {
                    wrap(dtype, x.wrapping_mul(int_value(dtype, &scalar)))
                }
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
            0, 1, 0x7_ffff, 0x8_0000, 0x8_0001, 0xf_ffff, 0x10_0000, 0x10_0001, 0x17_ffff,
            0x18_0000, 0x1f_ffff, 0x0c_3456,
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
}
