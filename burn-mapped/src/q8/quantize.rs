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
    let mut sums = ErrorSums::default();
    sums.add(values, scales, inp, |i| f64::from(w[i]));
    Ok(sums.ratio())
}

/// Running sums of `||W - dequant||^2` and `||W||^2`, in f64.
#[derive(Debug, Clone, Copy, Default)]
struct ErrorSums {
    diff: f64,
    norm: f64,
}

impl ErrorSums {
    /// Adds whole rows; `exact(i)` is the source value of element `i` of `values`.
    fn add(&mut self, values: &[i8], scales: &[f16], inp: usize, exact: impl Fn(usize) -> f64) {
        for (o, scale) in scales.iter().enumerate() {
            let s = f64::from(scale.to_f32());
            let start = o * inp;
            for (i, &q) in values[start..start + inp].iter().enumerate() {
                let v = exact(start + i);
                let d = v - s * f64::from(q);
                self.diff += d * d;
                self.norm += v * v;
            }
        }
    }

    /// The relative error, or the absolute one for an all-zero matrix.
    fn ratio(self) -> f64 {
        if self.norm == 0.0 {
            self.diff.sqrt()
        } else {
            (self.diff / self.norm).sqrt()
        }
    }
}

/// Quantizes one `[out, in]` matrix a block of whole rows at a time, so a converter can feed
/// it from a mapped input without first making an f32 copy of the whole matrix. The result
/// is what [`quantize_rows`] gives for the whole matrix, plus its [`relative_error`].
#[derive(Debug, Clone)]
pub struct Q8Builder {
    out: usize,
    inp: usize,
    rows_done: usize,
    rows: Q8Rows,
    sums: ErrorSums,
}

impl Q8Builder {
    /// A builder for an `[out, in]` matrix.
    pub fn new(out: usize, inp: usize) -> Self {
        Self {
            out,
            inp,
            rows_done: 0,
            rows: Q8Rows {
                values: Vec::with_capacity(out.saturating_mul(inp)),
                scales: Vec::with_capacity(out),
            },
            sums: ErrorSums::default(),
        }
    }

    /// Quantizes the next whole rows; the error is measured against `rows` themselves.
    ///
    /// # Errors
    ///
    /// As [`push_exact`](Self::push_exact).
    pub fn push(&mut self, rows: &[f32]) -> Result<(), Q8Error> {
        self.push_inner(rows, None)
    }

    /// Quantizes the next whole rows from `rows` (the source rounded to f32, as the kernels
    /// compute) and measures the error against `exact`, the source values themselves (for
    /// f64 sources).
    ///
    /// # Errors
    ///
    /// [`Q8Error::Length`] if `rows` is not a whole number of rows, the rows would pass
    /// `out`, or `exact` differs in length; the errors of [`quantize_rows`], whose row index
    /// counts from the top of the matrix.
    pub fn push_exact(&mut self, rows: &[f32], exact: &[f64]) -> Result<(), Q8Error> {
        if exact.len() != rows.len() {
            return Err(Q8Error::Length {
                what: "exact source values",
                len: exact.len(),
                out: rows.len().checked_div(self.inp).unwrap_or(0),
                inp: self.inp,
                expected: Some(rows.len()),
            });
        }
        self.push_inner(rows, Some(exact))
    }

    fn push_inner(&mut self, rows: &[f32], exact: Option<&[f64]>) -> Result<(), Q8Error> {
        let n = match rows.len().checked_div(self.inp) {
            Some(n) if n * self.inp == rows.len() && self.rows_done + n <= self.out => n,
            None if rows.is_empty() => return Ok(()),
            _ => {
                return Err(Q8Error::Length {
                    what: "rows pushed",
                    len: self.rows_done * self.inp + rows.len(),
                    out: self.out,
                    inp: self.inp,
                    expected: self.out.checked_mul(self.inp),
                });
            }
        };
        let block = quantize_rows(rows, n, self.inp).map_err(|e| match e {
            Q8Error::NonFinite { row, col, value } => Q8Error::NonFinite {
                row: row + self.rows_done,
                col,
                value,
            },
            Q8Error::ScaleOverflow { row, absmax } => Q8Error::ScaleOverflow {
                row: row + self.rows_done,
                absmax,
            },
            other => other,
        })?;
        match exact {
            Some(exact) => self
                .sums
                .add(&block.values, &block.scales, self.inp, |i| exact[i]),
            None => self.sums.add(&block.values, &block.scales, self.inp, |i| {
                f64::from(rows[i])
            }),
        }
        self.rows.values.extend_from_slice(&block.values);
        self.rows.scales.extend_from_slice(&block.scales);
        self.rows_done += n;
        Ok(())
    }

    /// The quantized matrix and `||W - dequant||_F / ||W||_F` over every pushed row.
    ///
    /// # Errors
    ///
    /// [`Q8Error::Length`] unless exactly `out` rows were pushed (any number when `in` is 0).
    pub fn finish(mut self) -> Result<(Q8Rows, f64), Q8Error> {
        if self.inp == 0 {
            self.rows.scales.resize(self.out, f16::ZERO);
        } else if self.rows_done != self.out {
            return Err(Q8Error::Length {
                what: "rows pushed",
                len: self.rows_done * self.inp,
                out: self.out,
                inp: self.inp,
                expected: self.out.checked_mul(self.inp),
            });
        }
        Ok((self.rows, self.sums.ratio()))
    }
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
