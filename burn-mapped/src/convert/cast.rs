//! Float casts between f64, f32, f16 and bf16, all rounding to nearest, ties to even.
//!
//! Widening casts (f16/bf16 -> f32, anything -> f64) are exact. Narrowing casts round once:
//!
//! - f64 -> f32 is Rust's `as`, which rounds to nearest even.
//! - f32 -> f16 / bf16 is `half`'s `from_f32` (software, or x86 F16C in its default rounding
//!   mode); both round to nearest even over all 23 fraction bits.
//! - f16 <-> bf16 widens to f32 (exact) and narrows once.
//! - f64 -> f16 / bf16 does **not** use `half::f16::from_f64`: that function drops the low 32
//!   fraction bits before rounding, so a value just above a tie (`1 + 2^-11 + 2^-40`) rounds
//!   down. Instead the value is first narrowed to f32 with round-to-odd, which keeps enough
//!   information (24 bits >= 11 + 2) for the second rounding to give the correctly rounded
//!   result (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
//!   algorithms using rounding to odd", IEEE TC 2008).
//!
//! Underflow gives a subnormal or signed zero, and NaN stays NaN (quieted, sign kept). A finite
//! value past the target's range cannot be represented: [`cast_into`] refuses it
//! ([`Overflow`]) rather than storing an infinity in its place.

use burn::tensor::DType;
use half::{bf16, f16};

use super::format::CastTo;

/// Whether values of `dtype` are floats a cast applies to.
pub(crate) fn is_castable_float(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F64 | DType::F32 | DType::Flex32 | DType::F16 | DType::BF16
    )
}

/// f64 -> f32 rounding to odd: truncate toward zero, and if anything was lost set the last
/// fraction bit. Only used as the first step of a double rounding (see module docs).
fn f64_to_f32_round_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if nearest.is_nan() || f64::from(nearest) == x {
        return nearest;
    }
    // Inexact: step back toward zero if round-to-nearest went away from it.
    let truncated = if f64::from(nearest).abs() > x.abs() {
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        nearest
    };
    f32::from_bits(truncated.to_bits() | 1)
}

fn f64_to_f16(x: f64) -> f16 {
    f16::from_f32(f64_to_f32_round_odd(x))
}

fn f64_to_bf16(x: f64) -> bf16 {
    bf16::from_f32(f64_to_f32_round_odd(x))
}

fn chunks<const N: usize>(input: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    input
        .chunks_exact(N)
        .map(|c| c.try_into().expect("chunks_exact yields N bytes"))
}

/// A finite value the cast target cannot represent (it would become an infinity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Overflow {
    /// Element index within the input.
    pub index: u64,
    /// The value.
    pub value: f64,
}

/// Appends the cast of `input` (little-endian elements of `from`) to `out` as `to`.
///
/// `from` must be a castable float and `input.len()` a multiple of its size (the caller
/// checks both); the input needs no alignment.
///
/// # Errors
/// [`Overflow`] for the first finite value that would become infinite; `out` then holds the
/// elements before it.
pub(crate) fn cast_into(
    from: DType,
    to: CastTo,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), Overflow> {
    macro_rules! each {
        ($n:literal, $decode:expr, $narrow:expr) => {
            for (i, bytes) in chunks::<$n>(input).enumerate() {
                let wide: f64 = $decode(bytes);
                let narrow = $narrow(wide);
                if wide.is_finite() && !narrow.is_finite() {
                    return Err(Overflow {
                        index: i as u64,
                        value: wide,
                    });
                }
                out.extend_from_slice(&narrow.to_le_bytes());
            }
        };
    }
    let f64_at = |b: [u8; 8]| f64::from_le_bytes(b);
    let f32_at = |b: [u8; 4]| f64::from(f32::from_le_bytes(b));
    let f16_at = |b: [u8; 2]| f64::from(f16::from_le_bytes(b).to_f32());
    let bf16_at = |b: [u8; 2]| f64::from(bf16::from_le_bytes(b).to_f32());
    // Exact widenings go through f64 and back without change.
    let to_f32 = |v: f64| v as f32;
    let to_f16 = |v: f64| f16::from_f32(v as f32);
    let to_bf16 = |v: f64| bf16::from_f32(v as f32);
    match (from, to) {
        (DType::F64, CastTo::F32) => each!(8, f64_at, to_f32),
        (DType::F64, CastTo::F16) => each!(8, f64_at, f64_to_f16),
        (DType::F64, CastTo::BF16) => each!(8, f64_at, f64_to_bf16),
        (DType::F32 | DType::Flex32, CastTo::F32) => out.extend_from_slice(input),
        (DType::F32 | DType::Flex32, CastTo::F16) => each!(4, f32_at, to_f16),
        (DType::F32 | DType::Flex32, CastTo::BF16) => each!(4, f32_at, to_bf16),
        (DType::F16, CastTo::F32) => each!(2, f16_at, to_f32),
        (DType::F16, CastTo::F16) | (DType::BF16, CastTo::BF16) => out.extend_from_slice(input),
        (DType::F16, CastTo::BF16) => each!(2, f16_at, to_bf16),
        (DType::BF16, CastTo::F32) => each!(2, bf16_at, to_f32),
        (DType::BF16, CastTo::F16) => each!(2, bf16_at, to_f16),
        (other, _) => unreachable!("cast_into called with non-float dtype {other:?}"),
    }
    Ok(())
}

/// Appends the values of `input` (little-endian elements of the float type `from`) to `out`
/// as f32: exact for f32, f16 and bf16; f64 rounds to nearest even.
pub(crate) fn widen_to_f32(from: DType, input: &[u8], out: &mut Vec<f32>) {
    match from {
        DType::F64 => out.extend(chunks::<8>(input).map(|b| f64::from_le_bytes(b) as f32)),
        DType::F32 | DType::Flex32 => out.extend(chunks::<4>(input).map(f32::from_le_bytes)),
        DType::F16 => out.extend(chunks::<2>(input).map(|b| f16::from_le_bytes(b).to_f32())),
        DType::BF16 => out.extend(chunks::<2>(input).map(|b| bf16::from_le_bytes(b).to_f32())),
        other => unreachable!("widen_to_f32 called with non-float dtype {other:?}"),
    }
}

// Unit tests because the round-to-odd step is private; the public behaviour is tested
// end to end in tests/suite/convert.rs.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finite_value_past_the_range_is_refused_not_made_infinite() {
        let input: Vec<u8> = [1.0f32, 65504.0, 70000.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut out = Vec::new();
        let err = cast_into(DType::F32, CastTo::F16, &input, &mut out).unwrap_err();
        assert_eq!(
            err,
            Overflow {
                index: 2,
                value: 70000.0
            }
        );
        // Infinities and NaN are representable and pass.
        let input: Vec<u8> = [f32::INFINITY, f32::NAN]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        cast_into(DType::F32, CastTo::F16, &input, &mut out).unwrap();
        let big = f64::MAX.to_le_bytes();
        assert!(cast_into(DType::F64, CastTo::F32, &big, &mut out).is_err());
        assert!(cast_into(DType::F64, CastTo::BF16, &big, &mut out).is_err());
    }

    #[test]
    fn round_to_odd_truncates_and_marks_inexact_results() {
        // Exact values pass through.
        assert_eq!(f64_to_f32_round_odd(1.5), 1.5);
        // 1 + 2^-30 is between 1 and 1 + 2^-23: truncate to 1, then set the last bit.
        let x = 1.0 + 2f64.powi(-30);
        assert_eq!(f64_to_f32_round_odd(x).to_bits(), 1.0f32.to_bits() | 1);
        // Just below 1 + 2^-23 (nearest would round up): still truncated, then odd.
        let y = 1.0 + 2f64.powi(-23) - 2f64.powi(-40);
        assert_eq!(f64_to_f32_round_odd(y).to_bits(), 1.0f32.to_bits() | 1);
        // Negative values mirror.
        assert_eq!(f64_to_f32_round_odd(-y).to_bits(), (-1.0f32).to_bits() | 1);
    }
}
