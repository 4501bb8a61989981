//! Activations quantized once per product input: 8-bit values with one f32 scale per 32, and
//! the sum of every 16 quantized values (the block types with an offset or a minimum subtract
//! `offset * sum` instead of widening each value).
//!
//! One activation row of `in` values (`in % 32 == 0`) packs into [`row_bytes`]`(in)` bytes:
//!
//! ```text
//! q    i8  [in]        q[i] = round(x[i] / d[i / 32]), ties away from zero
//! d    f32 [in / 32]   d[b] = max |x[32b .. 32b + 32]| / 127 (0 for a block of zeros)
//! sum  i16 [in / 16]   sum[k] = q[16k] + ... + q[16k + 15]
//! ```
//!
//! little-endian, in that order, so a `[T, row_bytes(in)]` u8 tensor holds `T` rows.

/// Activation rows one pass over a weight row serves.
pub(super) const TILE_T: usize = 8;
/// Values per activation scale.
pub const ACT_BLOCK: usize = 32;
/// Values per activation sum.
pub(super) const SUM_SPAN: usize = 16;
/// Largest quantized magnitude.
const Q_MAX: f32 = 127.0;

/// Bytes one packed row of `inp` values takes (`inp % 32 == 0`).
pub fn row_bytes(inp: usize) -> usize {
    inp + inp / ACT_BLOCK * 4 + inp / SUM_SPAN * 2
}

/// Quantizes `x` (`[t, inp]`, row-major) into `t` packed rows.
pub(super) fn quantize(x: &[f32], t: usize, inp: usize) -> Vec<u8> {
    assert!(inp.is_multiple_of(ACT_BLOCK) && x.len() == t * inp);
    let row = row_bytes(inp);
    let mut out = vec![0u8; t * row];
    for (xs, dst) in x.chunks_exact(inp).zip(out.chunks_exact_mut(row)) {
        let (q, rest) = dst.split_at_mut(inp);
        let (d, sums) = rest.split_at_mut(inp / ACT_BLOCK * 4);
        for (b, block) in xs.chunks_exact(ACT_BLOCK).enumerate() {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / Q_MAX;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (i, &v) in block.iter().enumerate() {
                // `as` saturates and maps NaN to 0; the scale carries a NaN into the product.
                q[b * ACT_BLOCK + i] = ((v * inv).round() as i8) as u8;
            }
            d[4 * b..4 * b + 4].copy_from_slice(&scale.to_le_bytes());
        }
        for (k, span) in q.chunks_exact(SUM_SPAN).enumerate() {
            let s: i16 = span.iter().map(|&v| i16::from(v as i8)).sum();
            sums[2 * k..2 * k + 2].copy_from_slice(&s.to_le_bytes());
        }
    }
    out
}

/// Packed activation rows as the kernels read them: values in place, and per block the
/// scale, the scale times the block's sum (what an offset or minimum multiplies), and the
/// same per 16 values, in flat arrays indexed `[t * blocks + b]`.
pub(super) struct Acts<'a> {
    q: &'a [i8],
    inp: usize,
    d: Vec<f32>,
    ds32: Vec<f32>,
    ds16: Vec<f32>,
}

impl<'a> Acts<'a> {
    /// Reads `t` packed rows of `inp` values from `bytes`.
    pub(super) fn parse(bytes: &'a [u8], t: usize, inp: usize) -> Self {
        let row = row_bytes(inp);
        assert_eq!(bytes.len(), t * row, "packed activations: length");
        // SAFETY: i8 and u8 have the same size and alignment; the slice is borrowed for 'a.
        let all = unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) };
        let blocks = inp / ACT_BLOCK;
        let mut d = Vec::with_capacity(t * blocks);
        let mut ds32 = Vec::with_capacity(t * blocks);
        let mut ds16 = Vec::with_capacity(t * blocks * 2);
        for r in bytes.chunks_exact(row) {
            let (scales, sums) = r[inp..].split_at(blocks * 4);
            let sum16 = |k: usize| f32::from(i16::from_le_bytes([sums[2 * k], sums[2 * k + 1]]));
            for (b, c) in scales.chunks_exact(4).enumerate() {
                let scale = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                d.push(scale);
                ds32.push(scale * (sum16(2 * b) + sum16(2 * b + 1)));
                ds16.push(scale * sum16(2 * b));
                ds16.push(scale * sum16(2 * b + 1));
            }
        }
        // Rows of values are `row` bytes apart: `q` indexes the whole buffer by row.
        Acts {
            q: all,
            inp,
            d,
            ds32,
            ds16,
        }
    }

    /// Row stride of the values, in bytes.
    #[inline(always)]
    pub(super) fn stride(&self) -> usize {
        row_bytes(self.inp)
    }

    /// Quantized values of row `t` (`inp` of them).
    #[inline(always)]
    pub(super) fn q(&self, t: usize) -> &'a [i8] {
        &self.q[t * self.stride()..t * self.stride() + self.inp]
    }

    /// Scales of row `t`, one per 32 values.
    #[inline(always)]
    pub(super) fn d(&self, t: usize) -> &[f32] {
        let n = self.inp / ACT_BLOCK;
        &self.d[t * n..(t + 1) * n]
    }

    /// `scale * sum` of row `t`, one per 32 values.
    #[inline(always)]
    pub(super) fn ds32(&self, t: usize) -> &[f32] {
        let n = self.inp / ACT_BLOCK;
        &self.ds32[t * n..(t + 1) * n]
    }

    /// `scale * sum` of row `t`, one per 16 values.
    #[inline(always)]
    pub(super) fn ds16(&self, t: usize) -> &[f32] {
        let n = self.inp / SUM_SPAN;
        &self.ds16[t * n..(t + 1) * n]
    }
}
