//! Element encoding for filling and checking buffers.
//!
//! The checker keeps its own conversions (rather than the engine's kernels)
//! so that a conversion bug in the engine cannot hide itself.

use rccl::DataType;

/// Exponent and mantissa widths of an 8-bit float type.
fn minifloat_layout(dtype: DataType) -> Option<(u32, u32)> {
    match dtype {
        DataType::Float8e4m3 => Some((4, 3)),
        DataType::Float8e5m2 => Some((5, 2)),
        _ => None,
    }
}

fn decode_minifloat(bits: u8, ebits: u32, mbits: u32, ieee_specials: bool) -> f64 {
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = u32::from((bits >> mbits) & ((1u8 << ebits) - 1));
    let man = u32::from(bits & ((1u8 << mbits) - 1));
    let bias = (1i32 << (ebits - 1)) - 1;
    let emax = (1u32 << ebits) - 1;
    if ieee_specials && exp == emax {
        return if man == 0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if !ieee_specials && exp == emax && man == (1 << mbits) - 1 {
        return f64::NAN;
    }
    let frac = f64::from(man) / f64::from(1u32 << mbits);
    if exp == 0 {
        sign * frac * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + frac) * 2f64.powi(exp as i32 - bias)
    }
}

/// Nearest 8-bit encoding of `value` (round to nearest, ties to even code).
fn encode_minifloat(value: f64, ebits: u32, mbits: u32, ieee_specials: bool) -> u8 {
    let sign: u8 = if value.is_sign_negative() { 0x80 } else { 0 };
    let mag = value.abs();
    let bias = (1i32 << (ebits - 1)) - 1;
    let min_normal_exp = 1 - bias;
    // Exponent of the binade `mag` falls in, clamped to the subnormal range.
    let e = if mag == 0.0 {
        min_normal_exp
    } else {
        (mag.log2().floor() as i32).max(min_normal_exp)
    };
    let quantum = 2f64.powi(e - mbits as i32);
    let steps = (mag / quantum).round_ties_even_compat();
    // steps is in [0, 2^(mbits+1)]; 2^(mbits+1) carries into the next binade.
    let (exp_field, man) = if e == min_normal_exp && steps < f64::from(1u32 << mbits) {
        (0u32, steps as u32)
    } else if steps >= f64::from(1u32 << (mbits + 1)) {
        ((e + 1 + bias) as u32, 0)
    } else {
        ((e + bias) as u32, steps as u32 - (1 << mbits))
    };
    let emax = (1u32 << ebits) - 1;
    let max_code = if ieee_specials {
        ((emax - 1) << mbits) | ((1 << mbits) - 1)
    } else {
        (emax << mbits) | ((1 << mbits) - 2)
    };
    let code = ((exp_field << mbits) | man).min(max_code);
    sign | code as u8
}

trait RoundTiesEven {
    fn round_ties_even_compat(self) -> f64;
}

impl RoundTiesEven for f64 {
    fn round_ties_even_compat(self) -> f64 {
        let r = self.round();
        if (self - self.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
            r - self.signum()
        } else {
            r
        }
    }
}

/// Writes `value` in `dtype`'s encoding into `out[..dtype.size()]`.
/// Integers wrap to the type's width.
pub fn encode(dtype: DataType, value: f64, out: &mut [u8]) {
    match dtype {
        DataType::Int8
        | DataType::Uint8
        | DataType::Int32
        | DataType::Uint32
        | DataType::Int64
        | DataType::Uint64 => {
            let bits = (value as i64) as u64;
            out[..dtype.size()].copy_from_slice(&bits.to_le_bytes()[..dtype.size()]);
        }
        DataType::Float16 => out[..2].copy_from_slice(&half::f16::from_f64(value).to_le_bytes()),
        DataType::Bfloat16 => out[..2].copy_from_slice(&half::bf16::from_f64(value).to_le_bytes()),
        DataType::Float32 => out[..4].copy_from_slice(&(value as f32).to_le_bytes()),
        DataType::Float64 => out[..8].copy_from_slice(&value.to_le_bytes()),
        DataType::Float8e4m3 | DataType::Float8e5m2 => {
            let (e, m) = minifloat_layout(dtype).expect("8-bit float");
            out[0] = encode_minifloat(value, e, m, dtype == DataType::Float8e5m2);
        }
    }
}

/// Reads one element of `dtype` from `bytes`.
pub fn decode(dtype: DataType, bytes: &[u8]) -> f64 {
    let mut raw = [0u8; 8];
    raw[..dtype.size()].copy_from_slice(&bytes[..dtype.size()]);
    match dtype {
        DataType::Int8 => f64::from(raw[0] as i8),
        DataType::Uint8 => f64::from(raw[0]),
        DataType::Int32 => f64::from(i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
        DataType::Uint32 => f64::from(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
        DataType::Int64 => i64::from_le_bytes(raw) as f64,
        DataType::Uint64 => u64::from_le_bytes(raw) as f64,
        DataType::Float16 => half::f16::from_le_bytes([raw[0], raw[1]]).to_f64(),
        DataType::Bfloat16 => half::bf16::from_le_bytes([raw[0], raw[1]]).to_f64(),
        DataType::Float32 => f64::from(f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
        DataType::Float64 => f64::from_le_bytes(raw),
        DataType::Float8e4m3 | DataType::Float8e5m2 => {
            let (e, m) = minifloat_layout(dtype).expect("8-bit float");
            decode_minifloat(raw[0], e, m, dtype == DataType::Float8e5m2)
        }
    }
}

/// Largest magnitude up to which every integer is exact in `dtype` (capped
/// so that generated values stay small).
pub fn exact_int_limit(dtype: DataType) -> i64 {
    match dtype {
        DataType::Int8 => 127,
        DataType::Uint8 => 255,
        DataType::Float16 => 2048,
        DataType::Bfloat16 => 256,
        DataType::Float8e4m3 => 16,
        DataType::Float8e5m2 => 8,
        _ => 1 << 20,
    }
}

/// Relative spacing of `dtype` (one unit in the last place at 1.0).
pub fn epsilon(dtype: DataType) -> f64 {
    match dtype {
        DataType::Float16 => 2f64.powi(-10),
        DataType::Bfloat16 => 2f64.powi(-7),
        DataType::Float32 => 2f64.powi(-23),
        DataType::Float64 => 2f64.powi(-52),
        DataType::Float8e4m3 => 2f64.powi(-3),
        DataType::Float8e5m2 => 2f64.powi(-2),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_round_trips_every_finite_code() {
        for dtype in [DataType::Float8e4m3, DataType::Float8e5m2] {
            for code in 0..=255u8 {
                let v = decode(dtype, &[code]);
                if !v.is_finite() {
                    continue;
                }
                let mut out = [0u8];
                encode(dtype, v, &mut out);
                let back = decode(dtype, &out);
                assert_eq!(back, v, "{dtype:?} code {code:#x}");
            }
        }
    }

    #[test]
    fn fp8_known_values() {
        assert_eq!(decode(DataType::Float8e4m3, &[0x7e]), 448.0);
        assert_eq!(decode(DataType::Float8e5m2, &[0x7b]), 57344.0);
        assert_eq!(decode(DataType::Float8e4m3, &[0x38]), 1.0);
        assert_eq!(decode(DataType::Float8e5m2, &[0x3c]), 1.0);
    }

    #[test]
    fn small_integers_are_exact_in_every_type() {
        for dtype in DataType::ALL {
            let limit = exact_int_limit(dtype);
            let signed = !matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
            let lo = if signed { -limit } else { 0 };
            for v in lo..=limit.min(300) {
                let mut out = [0u8; 8];
                encode(dtype, v as f64, &mut out);
                assert_eq!(decode(dtype, &out), v as f64, "{dtype:?} {v}");
            }
        }
    }
}
