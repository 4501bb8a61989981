//! Numbers as the tests compute them independently of the code under test: medians, IEEE
//! binary16 decoded by hand, little-endian f32 bytes.

use std::borrow::Borrow;
use std::path::Path;

/// The median of `values` (the mean of the middle two for an even count).
///
/// # Panics
/// When `values` is empty.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    assert!(!v.is_empty(), "the median of nothing");
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// IEEE binary16 from its bits: 1 sign, 5 exponent (bias 15), 10 fraction bits.
pub fn f16_value(bits: u16) -> f64 {
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let frac = f64::from(bits & 0x3ff);
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 => f64::NAN,
        e => sign * (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// `values` as little-endian bytes.
pub fn f32_le_bytes<V: Borrow<f32>>(values: impl IntoIterator<Item = V>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|v| v.borrow().to_le_bytes())
        .collect()
}

/// A file of little-endian f32s.
pub fn read_f32s(path: impl AsRef<Path>) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn binary16_decodes_normals_subnormals_and_nan() {
        assert_eq!(f16_value(0x3c00), 1.0);
        assert_eq!(f16_value(0xc000), -2.0);
        assert_eq!(f16_value(0x0001), 2f64.powi(-24));
        assert!(f16_value(0x7e00).is_nan());
    }
}
