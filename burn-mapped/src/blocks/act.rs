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
/// Activation rows in one lane group: one per f32 lane of a 256-bit register.
pub(super) const LANES: usize = 8;
/// From this many activation rows on (a prompt), the vector kernels take the rows in lane
/// groups ([`Lanes`]) and each weight row once per group, instead of in tiles.
pub(super) const WIDE_T: usize = 16;
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

/// Quantizes `x` (`[t, inp]`, row-major) into `t` packed rows (a prompt's on the pool's
/// threads).
pub(super) fn quantize(x: &[f32], t: usize, inp: usize) -> Vec<u8> {
    assert!(inp.is_multiple_of(ACT_BLOCK) && x.len() == t * inp);
    let row = row_bytes(inp);
    let mut out = vec![0u8; t * row];
    if t == 0 {
        return out;
    }
    crate::pool::for_each_piece(&mut out, row, t >= WIDE_T, &|first, piece| {
        let xs = &x[first * inp..first * inp + piece.len() / row * inp];
        quantize_rows(xs, inp, piece);
    });
    out
}

/// [`quantize`] of the rows `xs` into `out` (as many packed rows).
fn quantize_rows(xs: &[f32], inp: usize, out: &mut [u8]) {
    let row = row_bytes(inp);
    for (xs, dst) in xs.chunks_exact(inp).zip(out.chunks_exact_mut(row)) {
        let (q, rest) = dst.split_at_mut(inp);
        let (d, sums) = rest.split_at_mut(inp / ACT_BLOCK * 4);
        for (b, block) in xs.chunks_exact(ACT_BLOCK).enumerate() {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / Q_MAX;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (i, &v) in block.iter().enumerate() {
                q[b * ACT_BLOCK + i] = round_away(v * inv) as u8;
            }
            d[4 * b..4 * b + 4].copy_from_slice(&scale.to_le_bytes());
        }
        for (k, span) in q.chunks_exact(SUM_SPAN).enumerate() {
            let s: i16 = span.iter().map(|&v| i16::from(v as i8)).sum();
            sums[2 * k..2 * k + 2].copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// `x` rounded half away from zero, as `f32::round` does, saturated to i8 (NaN to 0). Adding
/// the largest f32 below one half, signed as `x`, then truncating is exact for every `x` (the
/// sum rounds up to the next integer only from a half on) and vectorizes where `round` is a
/// library call on baseline x86-64.
#[inline(always)]
fn round_away(x: f32) -> i8 {
    // `as` truncates toward zero, saturates and maps NaN to 0; the scale carries a NaN into
    // the product.
    (x + 0.499_999_97_f32.copysign(x)) as i8
}

/// Packed activation rows as the kernels read them.
///
/// By row, in flat arrays indexed `[t * blocks + b]`: each block's scale, and the scale
/// times the block's sum per 32 and per 16 values (what a minimum, or an offset applied in
/// f32, multiplies). And in tiles of [`TILE_T`] rows (the last may hold fewer) for the vector
/// kernels, which then reach every row of a tile from one pointer: each block's values,
/// scale, and `-16 * sum` and `-128 * sum` (Q5_0's offset, and Q8_0's when its values are
/// made unsigned, times the sum: exact as the start of an integer dot product) side by side
/// for the tile's rows, block `b` of row `t0 + j` of the tile at rows `t0..t0 + tt` at index
/// `t0 * blocks + b * tt + j` (times 32 for the values).
pub(super) struct Acts<'a> {
    q: &'a [i8],
    inp: usize,
    t: usize,
    d: Vec<f32>,
    ds32: Vec<f32>,
    ds16: Vec<f32>,
    tq: Vec<i8>,
    td: Vec<f32>,
    toff16: Vec<i32>,
    toff128: Vec<i32>,
    lanes: Option<Lanes>,
}

/// The rows in lane groups, for the wide kernels: group `g` holds rows `8g..8g + 8` (rows
/// past `t` are zeros), block `b` of a group at index `g * blocks + b`, with
///
/// ```text
/// q    i8  [.., 8, 8, 4]  dword k of lane j: values 4k..4k + 4 of row 8g + j's block
/// f    f32 [.., 2, 8]     per lane: the block's scale, then scale * sum
/// i    i32 [.., 3, 8]     per lane: -sum, -sum of values 0-15, -sum of values 16-31
/// ```
///
/// so one broadcast dword of a weight row meets eight rows' values in one register, and the
/// products of a block's eight dwords sum to the eight rows' dot products lane by lane.
pub(super) struct Lanes {
    pub q: Vec<i8>,
    pub f: Vec<f32>,
    pub i: Vec<i32>,
    pub groups: usize,
}

/// Bytes of values per block of one lane group.
pub(super) const LANE_BLOCK: usize = LANES * ACT_BLOCK;

/// One tile of [`Acts`]: `rows` activation rows, interleaved by block.
pub(super) struct Tile<'a> {
    /// Block `b` of row `j` at `[(b * rows + j) * 32..][..32]`.
    pub q: &'a [i8],
    /// Scale of block `b` of row `j` at `[b * rows + j]`.
    pub d: &'a [f32],
    /// `-16 *` the sum of block `b` of row `j` at `[b * rows + j]`.
    pub off16: &'a [i32],
    /// `-128 *` the sum of block `b` of row `j` at `[b * rows + j]`.
    pub off128: &'a [i32],
    pub rows: usize,
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
        let mut sum32 = Vec::with_capacity(t * blocks);
        let mut lo16 = Vec::with_capacity(t * blocks);
        let mut ds32 = Vec::with_capacity(t * blocks);
        let mut ds16 = Vec::with_capacity(t * blocks * 2);
        for r in bytes.chunks_exact(row) {
            let (scales, sums) = r[inp..].split_at(blocks * 4);
            let sum16 = |k: usize| i32::from(i16::from_le_bytes([sums[2 * k], sums[2 * k + 1]]));
            for (b, c) in scales.chunks_exact(4).enumerate() {
                let scale = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let (lo, hi) = (sum16(2 * b), sum16(2 * b + 1));
                d.push(scale);
                sum32.push(lo + hi);
                lo16.push(lo);
                // Sums of 32 values of at most 127 are exact in f32.
                ds32.push(scale * (lo + hi) as f32);
                ds16.push(scale * lo as f32);
                ds16.push(scale * hi as f32);
            }
        }
        if t >= WIDE_T {
            let lanes = Lanes::new(all, row, t, inp, &d, &ds32, &sum32, &lo16);
            return Acts {
                q: all,
                inp,
                t,
                d,
                ds32,
                ds16,
                tq: Vec::new(),
                td: Vec::new(),
                toff16: Vec::new(),
                toff128: Vec::new(),
                lanes: Some(lanes),
            };
        }
        let mut tq = vec![0i8; t * inp];
        let mut td = vec![0f32; t * blocks];
        let mut toff16 = vec![0i32; t * blocks];
        let mut toff128 = vec![0i32; t * blocks];
        for t0 in (0..t).step_by(TILE_T) {
            let tt = TILE_T.min(t - t0);
            for j in 0..tt {
                let src = &all[(t0 + j) * row..(t0 + j) * row + inp];
                for b in 0..blocks {
                    let at = t0 * blocks + b * tt + j;
                    tq[at * ACT_BLOCK..(at + 1) * ACT_BLOCK]
                        .copy_from_slice(&src[b * ACT_BLOCK..(b + 1) * ACT_BLOCK]);
                    td[at] = d[(t0 + j) * blocks + b];
                    toff16[at] = -16 * sum32[(t0 + j) * blocks + b];
                    toff128[at] = -128 * sum32[(t0 + j) * blocks + b];
                }
            }
        }
        // Rows of values are `row` bytes apart: `q` indexes the whole buffer by row.
        Acts {
            q: all,
            inp,
            t,
            d,
            ds32,
            ds16,
            tq,
            td,
            toff16,
            toff128,
            lanes: None,
        }
    }

    /// The rows in lane groups, built from [`WIDE_T`] rows on.
    #[inline(always)]
    pub(super) fn lanes(&self) -> Option<&Lanes> {
        self.lanes.as_ref()
    }

    /// Values per row.
    #[inline(always)]
    pub(super) fn inp(&self) -> usize {
        self.inp
    }

    /// Activation rows.
    #[inline(always)]
    pub(super) fn rows(&self) -> usize {
        self.t
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

    /// The tile of rows `t0..` (`t0` a multiple of [`TILE_T`]; fewer than [`WIDE_T`] rows).
    pub(super) fn tile(&self, t0: usize) -> Tile<'_> {
        assert!(self.lanes.is_none(), "rows in lane groups have no tiles");
        assert!(
            t0.is_multiple_of(TILE_T) && t0 < self.t,
            "tiles start at multiples of TILE_T"
        );
        let blocks = self.inp / ACT_BLOCK;
        let rows = TILE_T.min(self.t - t0);
        let (lo, hi) = (t0 * blocks, (t0 + rows) * blocks);
        Tile {
            q: &self.tq[lo * ACT_BLOCK..hi * ACT_BLOCK],
            d: &self.td[lo..hi],
            off16: &self.toff16[lo..hi],
            off128: &self.toff128[lo..hi],
            rows,
        }
    }
}

impl Lanes {
    /// The lane groups of `t` packed rows (`row` bytes apart in `all`) and their scales,
    /// `scale * sum` and sums (of 32 and of the first 16 values) by row and block.
    #[allow(clippy::too_many_arguments)]
    fn new(
        all: &[i8],
        row: usize,
        t: usize,
        inp: usize,
        d: &[f32],
        ds32: &[f32],
        sum32: &[i32],
        lo16: &[i32],
    ) -> Self {
        let blocks = inp / ACT_BLOCK;
        let groups = t.div_ceil(LANES);
        let mut q = vec![0i8; groups * blocks * LANE_BLOCK];
        let mut f = vec![0f32; groups * blocks * 2 * LANES];
        let mut i = vec![0i32; groups * blocks * 3 * LANES];
        for r in 0..t {
            let (g, j) = (r / LANES, r % LANES);
            let src = &all[r * row..r * row + inp];
            for b in 0..blocks {
                let at = g * blocks + b;
                let dst = &mut q[at * LANE_BLOCK..(at + 1) * LANE_BLOCK];
                for (k, v) in src[b * ACT_BLOCK..(b + 1) * ACT_BLOCK]
                    .chunks_exact(4)
                    .enumerate()
                {
                    dst[k * ACT_BLOCK + 4 * j..][..4].copy_from_slice(v);
                }
                let rb = r * blocks + b;
                f[at * 2 * LANES + j] = d[rb];
                f[at * 2 * LANES + LANES + j] = ds32[rb];
                i[at * 3 * LANES + j] = -sum32[rb];
                i[at * 3 * LANES + LANES + j] = -lo16[rb];
                i[at * 3 * LANES + 2 * LANES + j] = lo16[rb] - sum32[rb];
            }
        }
        Lanes { q, f, i, groups }
    }
}
