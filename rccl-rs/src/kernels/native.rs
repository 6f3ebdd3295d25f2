//! Element arithmetic of the types computed element by element: integers,
//! `f32` and `f64` natively, `bfloat16` and both `float8` types in `f32`.

use half::bf16;

use super::packed::{
    e4m3_to_f32, e5m2_to_f32, f32_to_bf16_bits, f32_to_e4m3, f32_to_e5m2, E4m3, E5m2,
};
use super::Pre;

/// Arithmetic of a type computed natively (integers, `f32`, `f64`).
pub(super) trait Native: Copy + Default + 'static {
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
