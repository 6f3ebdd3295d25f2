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

mod convert;
mod loops;
mod minifloat;
mod native;
mod packed;
mod store;

use std::ptr;

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};

pub use convert::{decode_f64, encode_f64};
pub use store::{copy_streaming, Store};

use loops::drive;
use native::Native;
use packed::{packed_loop, E4m3, E5m2, Packed};
use store::{copy_streaming_unfenced, store_fence};

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

/// The reduction of a reducing collective on the host: the kernel that
/// reads the user's input and the one that combines partial results.
#[derive(Clone)]
pub struct Reduction {
    /// Applied when a primitive reads the user's send buffer: includes the
    /// op's input transform (PreMulSum's scalar, Avg's 1/n for floats).
    pub input: ReduceKernel,
    /// Applied to data already transformed (a peer's partial result or the
    /// receive buffer).
    pub partial: ReduceKernel,
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
            RedOp::PreMulSumDevice { scalar } => {
                return Err(Error::InvalidArgument(format!(
                    "the PreMulSum scalar at {scalar:#x} is in device memory: the host kernels \
                     take its value (RedOp::PreMulSum)"
                )))
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
                unsafe {
                    match store {
                        Store::Cached => ptr::copy_nonoverlapping(input, out, bytes),
                        Store::Streaming => copy_streaming_unfenced(input, out, bytes),
                    }
                }
            }
            return;
        }
        // SAFETY: (for every arm) forwarded from this function's contract.
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
        // SAFETY: (for every arm) forwarded from this function's contract.
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
        // SAFETY: (for every arm) forwarded from this function's contract.
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

#[cfg(test)]
mod tests;
