//! The q8 product on packed int8 dot products (`dp4a`: SPIR-V's `OpSDot` on packed 4x8-bit
//! operands, native where Vulkan offers `shaderIntegerDotProduct`; CubeCL lowers it to
//! shifts and multiplies elsewhere, WGSL included, so the kernel is correct everywhere and
//! fast where the instruction is).
//!
//! Why: from a few activation rows on, the FMA kernel ([`super::fma`]) spends its time on
//! arithmetic, one f32 FMA per weight and activation row plus the unpacking of each byte.
//! Here one instruction multiplies four weights by four activation bytes and adds them, the
//! weights need no unpacking, and the activations a lane reads shrink from 64 to 32 bytes
//! per 16 weights.
//!
//! Activations: [`quantize_kernel`] splits each block of 16 activations of a row
//! into 16-bit integers `q` with one f32 scale per block (`s = max |x| / 32639`, `x ≈ s *
//! q`, `|x - s * q| <= s / 2`), and each `q` into a high and a low signed byte
//! (`q = 256 * hi + lo`, hence the bound 32639 = 127 * 256 + 127). So every activation keeps
//! ~16 significant bits relative to its block's largest magnitude; f16 (what the fp16
//! reference arms compute in) keeps 11 relative to each value, so the split is the finer of
//! the two for every value within 2^5 of its block's largest. Products are exact in i32 per
//! block (at most 16 * 127 * 32639), then scaled and added in f32. Non-finite activations
//! make their block's scale NaN, so they propagate as NaN.
//!
//! Two launches per product, both on the activation tensor's client (ordered on Burn's
//! stream, no host synchronization): the split (`T * in / 16` threads) and the product, laid
//! out like the FMA kernel ([`DotTuning`]). Products over the same activations can share one
//! split ([`Q8Input`](crate::q8::Q8Input)): one launch each instead of two. Needs `in % 16 ==
//! 0` (a block is one 16-byte load of weights); other widths take the FMA kernel. The default
//! where `dp4a` is native (SPIR-V), where it outran the FMA kernel at every `T` measured
//! (`docs/GPU.md`); elsewhere only through an explicit [`Tuning`](crate::q8::Tuning).

use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::common::{clamped_bases, grid, scales_and_bias_buffers, write_rows, zeros};
// A block is one scale and one 16-byte load of weights; the format is defined in `split`.
use crate::q8::split::{SPLIT_BLOCK as BLOCK, SPLIT_Q_MAX as DOT_Q_MAX, SPLIT_WORDS};
use crate::q8::tuning::{DotTuning, MANY_FROM, TILE};

/// Threads per cube of the split.
const QUANT_THREADS: usize = 64;

/// Four words: 16 int8 values.
pub type Word4 = Vector<i32, Const<4>>;

/// The activation rows one pass of the kernel is compiled for, given `t` rows in all. From
/// [`MANY_FROM`] to seven rows ([`DotTuning::MANY`]'s) run the eight-row kernel, the rows past
/// `t` reading row `t - 1` again and writing nothing: the kernels compiled for five, six or
/// seven rows each took longer than the eight-row one (`docs/GPU.md`), whose spare rows cost
/// only activation loads.
pub(super) fn kernel_tile(t: usize) -> usize {
    if t >= MANY_FROM { TILE } else { t }
}

/// Whether the kernel runs a row of `inp` values (whole blocks).
pub(super) fn fits(inp: usize) -> bool {
    inp.is_multiple_of(BLOCK)
}

/// Splits each block of [`BLOCK`] activations into its scale and two vectors of four words
/// ([`split_block`]). One thread per block of every activation row.
#[cube(launch_unchecked)]
fn quantize_kernel(
    x: &[Vector<f32, Const<4>>],
    xq: &mut [Word4],
    xs: &mut [f32],
    blocks: usize,
    xs_at: usize,
) {
    let b = ABSOLUTE_POS;
    if b < blocks {
        let mut v = Array::<Vector<f32, Const<4>>>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            v[i] = x[b * 4 + i];
        }
        split_block(&v, xq, xs, b, blocks, xs_at);
    }
}

/// Writes block `b` of a split (its [`BLOCK`] values `v`, four vectors of four) as the dp4a
/// kernel reads it: its scale at `xs[xs_at + b]`, the high bytes of `q` at `xq[b]` and the low
/// bytes at `xq[blocks + b]`, in the order of the values: two planes, so the lanes' loads of
/// either are contiguous. `xq` and `xs` are views of one buffer (the scales after both planes,
/// `xs_at = 8 * blocks`). For kernels that compute a product's input and split it in the same
/// pass.
#[cube]
pub fn split_block(
    v: &Array<Vector<f32, Const<4>>>,
    xq: &mut [Word4],
    xs: &mut [f32],
    b: usize,
    blocks: usize,
    xs_at: usize,
) {
    let mut m = 0.0f32;
    let mut finite = true;
    #[unroll]
    for i in 0..4usize {
        #[unroll]
        for c in 0..4usize {
            let a = f32::abs(v[i].extract(c));
            // NaN fails the comparison too.
            finite = finite && a <= f32::MAX;
            m = f32::max(m, a);
        }
    }
    let mut inv = 0.0f32;
    if m > 0.0 {
        inv = DOT_Q_MAX / m;
    }
    let mut s = m / DOT_Q_MAX;
    if !finite {
        // A quiet NaN spelled as bits: WGSL has no NaN literal.
        s = f32::reinterpret(0x7FC0_0000u32);
        inv = 0.0;
    }
    let mut hi = Word4::new(0i32);
    let mut lo = Word4::new(0i32);
    #[unroll]
    for i in 0..4usize {
        let mut hw = 0u32;
        let mut lw = 0u32;
        #[unroll]
        for c in 0..4usize {
            // `u = q + 32896` lies in [257, 65535]: its high byte is `hi + 128` and its
            // low byte `lo + 128`, so flipping each byte's top bit leaves the int8 bits.
            let q = f32::clamp(f32::round(v[i].extract(c) * inv), -DOT_Q_MAX, DOT_Q_MAX);
            let u = u32::cast_from(q + 32896.0);
            hw |= ((u >> 8) ^ 0x80u32) << (8 * c as u32);
            lw |= ((u & 255u32) ^ 0x80u32) << (8 * c as u32);
        }
        hi.insert(i, i32::reinterpret(hw));
        lo.insert(i, i32::reinterpret(lw));
    }
    xq[b] = hi;
    xq[blocks + b] = lo;
    xs[xs_at + b] = s;
}

/// Adds one stride of `rows` weight blocks (`wv[first..first + rows]`, block `blk` of each
/// row) times the tile's activation blocks (low plane at `lo_at`, scales at `xs_at`) into
/// `acc`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn dot_step(
    wv: &Array<Word4>,
    first: usize,
    xq: &[Word4],
    xs: &[f32],
    x_base: &Array<usize>,
    lo_at: usize,
    xs_at: usize,
    blk: usize,
    acc: &mut Array<f32>,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
) {
    #[unroll]
    for j in 0..tile {
        let b = x_base[j] + blk;
        let hi = xq[b];
        let lo = xq[lo_at + b];
        let s = xs[xs_at + b];
        #[unroll]
        for r in 0..rows {
            let w = wv[first + r];
            let mut h = dp4a(w.extract(0usize), hi.extract(0usize), 0i32);
            h = dp4a(w.extract(1usize), hi.extract(1usize), h);
            h = dp4a(w.extract(2usize), hi.extract(2usize), h);
            h = dp4a(w.extract(3usize), hi.extract(3usize), h);
            // |256 h + lo-sum| <= 16 * 127 * 32639: exact in i32.
            let mut q = dp4a(w.extract(0usize), lo.extract(0usize), h << 8);
            q = dp4a(w.extract(1usize), lo.extract(1usize), q);
            q = dp4a(w.extract(2usize), lo.extract(2usize), q);
            q = dp4a(w.extract(3usize), lo.extract(3usize), q);
            acc[r * tile + j] += s * f32::cast_from(q);
        }
    }
}

/// The rows of cube `cube_x` of a product: the kernels below, for one weight or for several
/// over the same split.
#[cube]
#[allow(clippy::too_many_arguments)]
fn dot_rows(
    xq: &[Word4],
    xs: &[f32],
    w: &[Word4],
    scales: &[u32],
    bias: &[f32],
    y: &mut [f32],
    t_total: usize,
    out: usize,
    nblk: usize,
    cube_x: usize,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] unroll: usize,
    #[comptime] has_bias: bool,
    #[comptime] bias_each: bool,
) {
    let lane = UNIT_POS_X as usize;
    let group = UNIT_POS_Y as usize;
    let row0 = (cube_x * groups + group) * rows;
    let t0 = CUBE_POS_Y as usize * tile;

    let mut acc = zeros(rows * tile);
    let row_base = clamped_bases(row0, out, nblk, rows);
    let x_base = clamped_bases(t0, t_total, nblk, tile);

    let lo_at = t_total * nblk;
    let xs_at = 8 * lo_at;
    let mut k = lane;
    while k + (unroll - 1) * lanes < nblk {
        let mut wv = Array::<Word4>::new(rows * unroll);
        #[unroll]
        for u in 0..unroll {
            #[unroll]
            for r in 0..rows {
                wv[u * rows + r] = w[row_base[r] + k + u * lanes];
            }
        }
        #[unroll]
        for u in 0..unroll {
            dot_step(
                &wv,
                u * rows,
                xq,
                xs,
                &x_base,
                lo_at,
                xs_at,
                k + u * lanes,
                &mut acc,
                tile,
                rows,
            );
        }
        k += unroll * lanes;
    }
    while k < nblk {
        let mut wv = Array::<Word4>::new(rows);
        #[unroll]
        for r in 0..rows {
            wv[r] = w[row_base[r] + k];
        }
        dot_step(
            &wv, 0, xq, xs, &x_base, lo_at, xs_at, k, &mut acc, tile, rows,
        );
        k += lanes;
    }
    write_rows(
        &acc, scales, bias, y, t_total, out, row0, t0, tile, rows, lanes, groups, true, has_bias,
        bias_each,
    );
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dot_kernel(
    xq: &[Word4],
    xs: &[f32],
    w: &[Word4],
    scales: &[u32],
    bias: &[f32],
    y: &mut [f32],
    t_total: usize,
    out: usize,
    nblk: usize,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] unroll: usize,
    #[comptime] has_bias: bool,
    #[comptime] bias_each: bool,
) {
    dot_rows(
        xq,
        xs,
        w,
        scales,
        bias,
        y,
        t_total,
        out,
        nblk,
        CUBE_POS_X as usize,
        tile,
        rows,
        lanes,
        groups,
        unroll,
        has_bias,
        bias_each,
    );
}

/// Two products over one split in one launch, `CUBE_POS_Z` picking the weight; a cube past
/// its weight's rows does nothing.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dot2_kernel(
    xq: &[Word4],
    xs: &[f32],
    w0: &[Word4],
    scales0: &[u32],
    bias0: &[f32],
    y0: &mut [f32],
    out0: usize,
    w1: &[Word4],
    scales1: &[u32],
    bias1: &[f32],
    y1: &mut [f32],
    out1: usize,
    t_total: usize,
    nblk: usize,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] unroll: usize,
    #[comptime] has_bias: bool,
    #[comptime] bias_each: bool,
) {
    let cube_x = CUBE_POS_X as usize;
    let first = cube_x * groups * rows;
    if CUBE_POS_Z == 0 {
        if first < out0 {
            dot_rows(
                xq, xs, w0, scales0, bias0, y0, t_total, out0, nblk, cube_x, tile, rows, lanes,
                groups, unroll, has_bias, bias_each,
            );
        }
    } else if first < out1 {
        dot_rows(
            xq, xs, w1, scales1, bias1, y1, t_total, out1, nblk, cube_x, tile, rows, lanes, groups,
            unroll, has_bias, bias_each,
        );
    }
}

/// Three products over one split in one launch (as [`dot2_kernel`]).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dot3_kernel(
    xq: &[Word4],
    xs: &[f32],
    w0: &[Word4],
    scales0: &[u32],
    bias0: &[f32],
    y0: &mut [f32],
    out0: usize,
    w1: &[Word4],
    scales1: &[u32],
    bias1: &[f32],
    y1: &mut [f32],
    out1: usize,
    w2: &[Word4],
    scales2: &[u32],
    bias2: &[f32],
    y2: &mut [f32],
    out2: usize,
    t_total: usize,
    nblk: usize,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] unroll: usize,
    #[comptime] has_bias: bool,
    #[comptime] bias_each: bool,
) {
    let cube_x = CUBE_POS_X as usize;
    let first = cube_x * groups * rows;
    if CUBE_POS_Z == 0 {
        if first < out0 {
            dot_rows(
                xq, xs, w0, scales0, bias0, y0, t_total, out0, nblk, cube_x, tile, rows, lanes,
                groups, unroll, has_bias, bias_each,
            );
        }
    } else if CUBE_POS_Z == 1 {
        if first < out1 {
            dot_rows(
                xq, xs, w1, scales1, bias1, y1, t_total, out1, nblk, cube_x, tile, rows, lanes,
                groups, unroll, has_bias, bias_each,
            );
        }
    } else if first < out2 {
        dot_rows(
            xq, xs, w2, scales2, bias2, y2, t_total, out2, nblk, cube_x, tile, rows, lanes, groups,
            unroll, has_bias, bias_each,
        );
    }
}

/// The split activations of `x` (`[t, inp]` f32, contiguous, `inp % 16 == 0`) on `x`'s
/// client, as one U32 tensor `[t, 9 * inp / 16]` (the format of [`crate::q8::split`]): the high plane,
/// the low plane (`t * inp / 16` vectors of four words each), then the scales. The shape only
/// counts the words: the planes run over every row, not row by row.
pub(super) fn split(x: &CubeTensor) -> CubeTensor {
    let [t, inp] = x.meta.shape().dims::<2>();
    let blocks = t * inp / BLOCK;
    let client = x.client.clone();
    let out = client.empty(blocks * SPLIT_WORDS * size_of::<u32>());
    // SAFETY: `x` holds `t * inp / 4` vec4 f32 (four per block); `out` holds `9 * blocks`
    // words, viewed as `2 * blocks` vectors of four (the planes, words `0..8 * blocks`) and as
    // `9 * blocks` f32 of which the kernel writes `8 * blocks..`: disjoint ranges, each element
    // written once by thread `b < blocks`.
    unsafe {
        quantize_kernel::launch_unchecked(
            &client,
            CubeCount::Static(blocks.div_ceil(QUANT_THREADS) as u32, 1, 1),
            CubeDim::new_1d(QUANT_THREADS as u32),
            BufferArg::from_raw_parts(x.handle.clone(), t * inp / 4),
            BufferArg::from_raw_parts(out.clone(), 2 * blocks),
            BufferArg::from_raw_parts(out.clone(), SPLIT_WORDS * blocks),
            blocks,
            8 * blocks,
        );
    }
    CubeTensor::new_contiguous(
        client,
        x.device.clone(),
        Shape::new([t, SPLIT_WORDS * inp / BLOCK]),
        out,
        DType::U32,
    )
}

/// The dp4a product `y = x W^T * scale (+ bias)` on activations [`split`] from `x`, on the
/// split's client. `split`, `values`, `scales` and `bias` are contiguous and checked by the
/// caller (`inp % 16 == 0`, the split's `9 * inp / 16` words per row); `y` is the caller's
/// output (`[t, out]` f32).
pub(super) fn run_split(
    split: &CubeTensor,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
    y: &Handle,
    tuning: DotTuning,
) {
    let t = split.meta.shape().dims::<2>()[0];
    let out = values.meta.shape().dims::<2>()[0];
    if let Some(b) = bias {
        assert!(
            b.dtype == DType::F32 && b.meta.shape().num_elements() == out,
            "q8: bias must be f32 [{out}]"
        );
    }
    let bias = bias.map(|b| Addend {
        handle: &b.handle,
        each: false,
    });
    // SAFETY: the caller checked the split against the weight and sized `y` `[t, out]`; the
    // bias was checked above.
    unsafe {
        launch(
            &split.client,
            &split.handle,
            t,
            values,
            scales,
            bias,
            y,
            tuning,
            kernel_tile(t),
        )
    }
}

/// What a product adds to its output: `out` f32 added to every activation row's output (a
/// bias) or, `each`, one f32 per output element (`t * out`: a residual stream).
#[derive(Debug, Clone, Copy)]
pub(super) struct Addend<'a> {
    pub(super) handle: &'a Handle,
    pub(super) each: bool,
}

impl Addend<'_> {
    /// The f32 it holds for a product of `t` rows of `out`.
    fn len(&self, t: usize, out: usize) -> usize {
        if self.each { t * out } else { out }
    }
}

/// Launches the dp4a kernel on `client` over a split of `t` rows in `split`, the weight's
/// values, its scales (F16 `[out]`) and an optional addend, into `y`, compiled for `tile`
/// activation rows per pass ([`kernel_tile`], or 1: the kernel a single row runs).
///
/// # Safety
///
/// `split` holds a split of `t` rows of the weight's width (`9 * t * in / 16` words), `values`
/// is a contiguous I8 `[out, in]` tensor with `in % 16 == 0`, `bias` holds what
/// [`Addend::len`] says, and `y` holds `t * out` f32.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn launch(
    client: &Client,
    split: &Handle,
    t: usize,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<Addend<'_>>,
    y: &Handle,
    tuning: DotTuning,
    tile: usize,
) {
    let [out, inp] = values.meta.shape().dims::<2>();
    let has_bias = bias.is_some();
    let bias_each = bias.is_some_and(|b| b.each);
    let bias_len = bias.map_or(out, |b| b.len(t, out));
    // SAFETY: the caller vouches for the bias's length.
    let (scales, bias) =
        unsafe { scales_and_bias_buffers(scales, bias.map(|b| b.handle), out, bias_len) };
    let nblk = inp / BLOCK;
    let (count, dim) = grid(out, t, tile, tuning.lanes, tuning.groups, tuning.rows);
    // SAFETY: lengths are in elements of the bound type: the split `2 * t * nblk` vectors of
    // four words (its planes) and `9 * t * nblk` f32 (the kernel reads the scales from word
    // `8 * t * nblk` on), both read-only views of one buffer as [`split`] wrote it, `values`
    // `out * inp` bytes as `out * nblk` vectors of four words, `y` `t * out` f32 (the scales
    // and bias: see `scales_and_bias`), as the caller vouches. The kernel clamps every row
    // and activation row to these bounds and writes each `y` element at most once.
    unsafe {
        dot_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(split.clone(), 2 * t * nblk),
            BufferArg::from_raw_parts(split.clone(), SPLIT_WORDS * t * nblk),
            BufferArg::from_raw_parts(values.handle.clone(), out * nblk),
            scales,
            bias,
            BufferArg::from_raw_parts(y.clone(), t * out),
            t,
            out,
            nblk,
            tile,
            tuning.rows,
            tuning.lanes,
            tuning.groups,
            tuning.unroll,
            has_bias,
            bias_each,
        );
    }
}

/// One product of [`launch_parts`]: the weight's values and scales, its bias, its output.
pub(super) struct Part<'a> {
    pub(super) values: &'a CubeTensor,
    pub(super) scales: &'a CubeTensor,
    pub(super) bias: Option<Addend<'a>>,
    pub(super) y: &'a Handle,
}

/// A part's bindings, as [`launch`] builds them, and its rows.
pub(super) type PartArgs = (BufferArg, BufferArg, BufferArg, BufferArg, usize);

impl Part<'_> {
    /// Its rows.
    pub(super) fn out(&self) -> usize {
        self.values.meta.shape().dims::<2>()[0]
    }

    /// Its weight's, scales', addend's and output's bindings for `t` activation rows of
    /// `nblk` blocks, and its rows.
    ///
    /// # Safety
    ///
    /// As [`launch`]: the addend holds what [`Addend::len`] says and `y` `t * out` f32.
    pub(super) unsafe fn args(&self, t: usize, nblk: usize) -> PartArgs {
        let out = self.out();
        let bias_len = self.bias.map_or(out, |b| b.len(t, out));
        // SAFETY: the caller vouches for the addend's and `y`'s lengths; `values` is a
        // contiguous I8 `[out, 16 * nblk]` tensor (`DirectWeight::new` checked it), read as
        // `out * nblk` vectors of four words.
        unsafe {
            let (scales, bias) =
                scales_and_bias_buffers(self.scales, self.bias.map(|b| b.handle), out, bias_len);
            (
                BufferArg::from_raw_parts(self.values.handle.clone(), out * nblk),
                scales,
                bias,
                BufferArg::from_raw_parts(self.y.clone(), t * out),
                out,
            )
        }
    }
}

/// Launches one to three products over the same split of `t` rows as one dispatch (the weights
/// side by side along the grid's third axis), `tile` rows per pass as for [`launch`].
///
/// # Safety
///
/// As [`launch`], for every part; the parts share the weights' width and whether they have a
/// kind of addend, and write different buffers.
pub(super) unsafe fn launch_parts(
    client: &Client,
    split: &Handle,
    t: usize,
    parts: &[Part<'_>],
    tuning: DotTuning,
    tile: usize,
) {
    if let [p] = parts {
        // SAFETY: the caller's contract.
        unsafe {
            launch(
                client, split, t, p.values, p.scales, p.bias, p.y, tuning, tile,
            )
        };
        return;
    }
    assert!(matches!(parts.len(), 2 | 3), "1 to 3 products per launch");
    let inp = parts[0].values.meta.shape().dims::<2>()[1];
    let nblk = inp / BLOCK;
    let has_bias = parts[0].bias.is_some();
    let bias_each = parts[0].bias.is_some_and(|b| b.each);
    let widest = parts.iter().map(Part::out).max().unwrap_or(0);
    let (count, dim) = grid(widest, t, tile, tuning.lanes, tuning.groups, tuning.rows);
    let CubeCount::Static(x, y, _) = count else {
        unreachable!("grid() is static")
    };
    let count = CubeCount::Static(x, y, parts.len() as u32);
    // SAFETY: the caller vouches for each part's lengths (see `launch`).
    let mut args = parts.iter().map(|p| unsafe { p.args(t, nblk) });
    let (xq, xs) = unsafe {
        (
            BufferArg::from_raw_parts(split.clone(), 2 * t * nblk),
            BufferArg::from_raw_parts(split.clone(), SPLIT_WORDS * t * nblk),
        )
    };
    let (w0, s0, b0, y0, o0) = args.next().expect("two or three parts");
    let (w1, s1, b1, y1, o1) = args.next().expect("two or three parts");
    // SAFETY: as above; the kernels clamp every row to its part's `out` and skip cubes past
    // it.
    unsafe {
        match args.next() {
            None => dot2_kernel::launch_unchecked(
                client,
                count,
                dim,
                xq,
                xs,
                w0,
                s0,
                b0,
                y0,
                o0,
                w1,
                s1,
                b1,
                y1,
                o1,
                t,
                nblk,
                tile,
                tuning.rows,
                tuning.lanes,
                tuning.groups,
                tuning.unroll,
                has_bias,
                bias_each,
            ),
            Some((w2, s2, b2, y2, o2)) => dot3_kernel::launch_unchecked(
                client,
                count,
                dim,
                xq,
                xs,
                w0,
                s0,
                b0,
                y0,
                o0,
                w1,
                s1,
                b1,
                y1,
                o1,
                w2,
                s2,
                b2,
                y2,
                o2,
                t,
                nblk,
                tile,
                tuning.rows,
                tuning.lanes,
                tuning.groups,
                tuning.unroll,
                has_bias,
                bias_each,
            ),
        }
    }
}
