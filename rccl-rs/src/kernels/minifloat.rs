//! Binary floating-point formats of at most 16 bits described by their
//! fields: exact decoding tables and correctly rounded conversion from
//! `f32` and `f64`.

/// A binary floating-point format of at most 16 bits.
#[derive(Clone, Copy, Debug)]
pub(super) struct MiniFloat {
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
    pub(super) saturate: bool,
    /// The NaN code produced (without sign).
    nan: u32,
}

impl MiniFloat {
    /// Code of the largest finite magnitude.
    pub(super) const fn max_finite(self) -> u32 {
        if self.ieee {
            (((1 << self.exp) - 1) << self.mant) - 1
        } else {
            (1 << (self.exp + self.mant)) - 2
        }
    }

    /// Code of +infinity (IEEE formats only).
    pub(super) const fn inf(self) -> u32 {
        ((1 << self.exp) - 1) << self.mant
    }

    const fn sign_bit(self) -> u32 {
        1 << (self.exp + self.mant)
    }
}

pub(super) const E4M3: MiniFloat = MiniFloat {
    exp: 4,
    mant: 3,
    bias: 7,
    ieee: false,
    saturate: true,
    nan: 0x7f,
};
pub(super) const E5M2: MiniFloat = MiniFloat {
    exp: 5,
    mant: 2,
    bias: 15,
    ieee: true,
    saturate: false,
    nan: 0x7f,
};
pub(super) const F16: MiniFloat = MiniFloat {
    exp: 5,
    mant: 10,
    bias: 15,
    ieee: true,
    saturate: false,
    nan: 0x7e00,
};
pub(super) const BF16: MiniFloat = MiniFloat {
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
pub(super) static E4M3_TO_F32: [u32; 256] = mini_table(E4M3);
/// `f32` bits of every `float8 e5m2` code.
pub(super) static E5M2_TO_F32: [u32; 256] = mini_table(E5M2);

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
pub(super) fn f32_to_mini(f: MiniFloat, x: f32) -> u32 {
    let bits = x.to_bits();
    round_to_mini(f, bits >> 31 != 0, u64::from(bits & 0x7fff_ffff), 23, 127)
}

/// `f64` to format `f`.
#[inline]
pub(super) fn f64_to_mini(f: MiniFloat, x: f64) -> u32 {
    let bits = x.to_bits();
    round_to_mini(f, bits >> 63 != 0, bits & 0x7fff_ffff_ffff_ffff, 52, 1023)
}
