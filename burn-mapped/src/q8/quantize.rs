//! Symmetric per-row int8 quantization with f16 scales, done on the host by converters.

use burn::tensor::f16;

use super::error::Q8Error;

/// Largest magnitude a quantized value takes; -128 is never produced, so the range is
/// symmetric and negating a row negates its values exactly.
pub const Q8_MAX: i8 = 127;

/// Int8 values and per-row scales of one `[out, in]` matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Rows {
    /// `[out, in]` row-major.
    pub values: Vec<i8>,
    /// One scale per output row: `w[o, i] ≈ scales[o] * values[o, i]`.
    pub scales: Vec<f16>,
}

/// Quantizes a row-major `[out, in]` f32 matrix row by row.
///
/// Each row gets `scale = f16(absmax / 127)` and `q = round(w / scale)` clamped to
/// `[-127, 127]`. The division uses the scale *after* rounding to f16, so the stored pair
/// is self-consistent (the clamp catches the case where f16 rounding made the scale a little
/// smaller than `absmax / 127`). An all-zero row, or one whose scale underflows f16 to zero
/// (absmax below about 4e-6), gets scale 0 and all-zero values.
///
/// # Errors
///
/// [`Q8Error::Length`] if `w.len() != out * in`, [`Q8Error::NonFinite`] on a NaN or
/// infinite weight, [`Q8Error::ScaleOverflow`] if a row's scale does not fit in f16
/// (absmax above about 8.3e6).
pub fn quantize_rows(w: &[f32], out: usize, inp: usize) -> Result<Q8Rows, Q8Error> {
    check_len("weights", w.len(), out, inp)?;
    let mut values = vec![0i8; w.len()];
    let mut scales = Vec::with_capacity(out);
    if inp == 0 {
        scales.resize(out, f16::ZERO);
        return Ok(Q8Rows { values, scales });
    }
    for (row, (src, dst)) in w
        .chunks_exact(inp)
        .zip(values.chunks_exact_mut(inp))
        .enumerate()
    {
        let mut absmax = 0f32;
        for (col, &v) in src.iter().enumerate() {
            if !v.is_finite() {
                return Err(Q8Error::NonFinite { row, col, value: v });
            }
            absmax = absmax.max(v.abs());
        }
        let scale = f16::from_f32(absmax / f32::from(Q8_MAX));
        if scale.is_infinite() {
            return Err(Q8Error::ScaleOverflow { row, absmax });
        }
        scales.push(scale);
        let s = scale.to_f32();
        if s == 0.0 {
            continue;
        }
        let (s, max) = (f64::from(s), f64::from(Q8_MAX));
        for (q, &v) in dst.iter_mut().zip(src) {
            // In f64 the quotient is rounded once before `round`, so ties are decided on
            // the exact value rather than on an f32 approximation of it.
            *q = (f64::from(v) / s).round().clamp(-max, max) as i8;
        }
    }
    Ok(Q8Rows { values, scales })
}

/// `scales[o] * values[o, i]` as f32 (exact: an f16 times a small integer fits in f32).
pub fn dequantize_rows(
    values: &[i8],
    scales: &[f16],
    out: usize,
    inp: usize,
) -> Result<Vec<f32>, Q8Error> {
    check_len("values", values.len(), out, inp)?;
    check_len("scales", scales.len(), out, 1)?;
    let mut w = Vec::with_capacity(values.len());
    for (o, &s) in scales.iter().enumerate() {
        let s = s.to_f32();
        w.extend(
            values[o * inp..(o + 1) * inp]
                .iter()
                .map(|&q| s * f32::from(q)),
        );
    }
    Ok(w)
}

/// Quantization error as a relative Frobenius norm, `||W - dequant(Q)||_F / ||W||_F`, in
/// f64. Zero for an all-zero `W` that quantized to zeros.
pub fn relative_error(
    w: &[f32],
    values: &[i8],
    scales: &[f16],
    out: usize,
    inp: usize,
) -> Result<f64, Q8Error> {
    check_len("weights", w.len(), out, inp)?;
    check_len("values", values.len(), out, inp)?;
    check_len("scales", scales.len(), out, 1)?;
    let (mut diff, mut norm) = (0f64, 0f64);
    for (o, scale) in scales.iter().enumerate() {
        let s = f64::from(scale.to_f32());
        for i in o * inp..(o + 1) * inp {
            let v = f64::from(w[i]);
            let d = v - s * f64::from(values[i]);
            diff += d * d;
            norm += v * v;
        }
    }
    Ok(if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    })
}

fn check_len(what: &'static str, len: usize, out: usize, inp: usize) -> Result<(), Q8Error> {
    match out.checked_mul(inp) {
        Some(n) if n == len => Ok(()),
        expected => Err(Q8Error::Length {
            what,
            len,
            out,
            inp,
            expected,
        }),
    }
}
