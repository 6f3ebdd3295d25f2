//! One element of any datatype to and from `f64`: how scalars and test
//! data cross between a datatype's bytes and ordinary numbers.

use half::{bf16, f16};

use super::minifloat::{f64_to_mini, BF16, E4M3, E4M3_TO_F32, E5M2, E5M2_TO_F32, F16};
use crate::types::DataType;

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
