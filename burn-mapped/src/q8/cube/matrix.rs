//! A prompt's products on the device's matrix units (tensor cores, through Vulkan's cooperative
//! matrices): each weight dequantized to f16 into a scratch matrix, the pass's activation rows
//! turned from their split into f16, each row divided by its largest value, and one f16 matrix
//! product with f32 accumulation through cubek (the matmul routines Burn's CubeCL backend runs:
//! its cooperative-matrix routine where the device has one, its unit routine elsewhere), the
//! rows multiplied back as the addend goes in.
//!
//! Why: the dp4a kernels ([`super::blocks`], [`super::dot`]) decode every unit of a weight
//! once per tile of eight positions and multiply on the shader cores, so a long prompt is
//! bound by the cores' integer throughput (7B on an H100: ~750 prompt tokens a second against
//! llama.cpp's ~9.7k). A matrix unit multiplies a 16×16 tile in the time a core does a few
//! products; the price is writing each weight as f16 once per pass (at 7B, 15 GB for 4.4 GB of
//! blocks) and f16 inputs, whose 11-bit significand is finer than the 4–6 bits of the weights'
//! own quantization.
//!
//! The division is what keeps f16 safe: a gated MLP's `silu(gate) * up` can pass f16's 65504
//! where weights are large (a speed-test 7B's random blocks are), while a row scaled to at most
//! 1 keeps 11 significant bits down to `6e-5` of its largest value.

use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use cubecl::server::Handle;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::launch_ref;
use cubek::matmul::strategy::Strategy;
use cubek::std::InputBinding;
use half::f16;

use super::blocks;
use super::common::row_scale;
use super::direct::{Addend, DirectError, DirectWeight, Inner, Product, check, split_words};
use super::dot::Word4;
use crate::q8::split::{SPLIT_BLOCK as BLOCK, SPLIT_Q_MAX};

/// Threads per cube of this module's elementwise kernels.
const THREADS: usize = 256;

/// Whether `client`'s device multiplies f16 matrices into f32 on its matrix units (Vulkan's
/// cooperative matrices), where [`matrix_products`] is worth its conversions.
pub fn matrix_units(client: &Client) -> bool {
    let f16 = ElemType::Float(FloatKind::F16);
    let f32 = ElemType::Float(FloatKind::F32);
    client
        .properties()
        .features
        .matmul
        .cmma
        .iter()
        .any(|c| c.a_type == f16 && c.b_type == f16 && c.cd_type == f32)
}

/// Device buffers [`matrix_products`] works in, for up to `rows` activation rows and weights
/// of up to `max_in` values a row, `max_out` rows and `max_values` values: the rows as f16, a
/// weight as f16 and a product's output before its addend.
#[derive(Debug)]
pub struct MatrixScratch {
    x: Handle,
    /// Each row's largest `|x|`, which its f16 values are divided by.
    r: Handle,
    w: Handle,
    y: Handle,
    rows: usize,
    max_in: usize,
    max_out: usize,
    max_values: usize,
}

impl MatrixScratch {
    /// Allocates the buffers on `client`.
    pub fn new(
        client: &Client,
        rows: usize,
        max_in: usize,
        max_out: usize,
        max_values: usize,
    ) -> Self {
        Self {
            x: client.empty(2 * rows * max_in),
            r: client.empty(4 * rows),
            w: client.empty(2 * max_values),
            y: client.empty(4 * rows * max_out),
            rows,
            max_in,
            max_out,
            max_values,
        }
    }

    /// Their device bytes.
    pub fn bytes(&self) -> u64 {
        [&self.x, &self.r, &self.w, &self.y]
            .iter()
            .map(|h| h.size_in_used())
            .sum()
    }
}

/// Enqueues [`products`](super::direct::products) of `rows` activation rows (their split in
/// `split`) through the matrix units: the rows to f16 once, then per product its weight to
/// f16, one f16 product into f32 and the addend. Any count of products of one width; their
/// weights q8 or blocks, each at most 65535 rows.
///
/// # Errors
///
/// [`DirectError::BufferTooSmall`] where a buffer is smaller than the products need;
/// [`DirectError::Parts`] where the scratch is too small, widths differ, a weight's rows are
/// not a multiple of 4 or the matrix product cannot be set up on the device.
pub fn matrix_products(
    split: &Handle,
    rows: usize,
    parts: &[Product<'_>],
    scratch: &MatrixScratch,
) -> Result<(), DirectError> {
    let Some(first) = parts.first() else {
        return Err(DirectError::Parts("no products".into()));
    };
    let inp = first.weight.in_features();
    let client = first.weight.client();
    check("split", split, split_words(rows, inp))?;
    // A grid dimension a row: at most 65535.
    if rows > scratch.rows.min(65535) || inp > scratch.max_in || !inp.is_multiple_of(BLOCK) {
        return Err(DirectError::Parts(format!(
            "{rows} rows of {inp} values do not fit the matrix scratch ({} of {})",
            scratch.rows, scratch.max_in
        )));
    }
    for p in parts {
        let out = p.weight.out_features();
        if p.weight.in_features() != inp
            || out > scratch.max_out
            || out * inp > scratch.max_values
            || out > 65535
            || !out.is_multiple_of(4)
        {
            return Err(DirectError::Parts(format!(
                "a [{out}, {}] weight in matrix products of width {inp} (scratch: {} rows)",
                p.weight.in_features(),
                scratch.max_out
            )));
        }
        check("y", p.y, rows * out)?;
        if let Addend::Bias(b) | Addend::Residual(b) = p.add {
            check("addend", b, p.add.len(rows, out))?;
        }
    }
    let blocks = rows * inp / BLOCK;
    // SAFETY: the split holds `blocks` blocks (checked above), the scratch `rows * inp` f16
    // and `rows` f32; one cube a row.
    unsafe {
        split_f16_kernel::launch_unchecked(
            client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(split.clone(), 2 * blocks),
            BufferArg::from_raw_parts(split.clone(), 9 * blocks),
            BufferArg::from_raw_parts(scratch.x.clone(), rows * inp),
            BufferArg::from_raw_parts(scratch.r.clone(), rows),
            blocks,
            inp / BLOCK,
        );
    }
    for p in parts {
        product(p, rows, inp, scratch)?;
    }
    Ok(())
}

/// One product of [`matrix_products`], its input already in `scratch.x`.
fn product(
    p: &Product<'_>,
    rows: usize,
    inp: usize,
    scratch: &MatrixScratch,
) -> Result<(), DirectError> {
    let weight: &DirectWeight = p.weight;
    let client = weight.client();
    let out = weight.out_features();
    match &weight.inner {
        Inner::Q8 { values, scales } => {
            let words = inp / 4;
            // SAFETY: `values` is I8 `[out, inp]` and `scales` F16 `[out]`, contiguous
            // (`DirectWeight::new`); the scratch holds `out * inp` f16 (checked by the caller).
            unsafe {
                q8_f16_kernel::launch_unchecked(
                    client,
                    CubeCount::Static(words.div_ceil(THREADS) as u32, out as u32, 1),
                    CubeDim::new_1d(THREADS as u32),
                    BufferArg::from_raw_parts(values.handle.clone(), out * words),
                    BufferArg::from_raw_parts(scales.handle.clone(), out.div_ceil(2)),
                    BufferArg::from_raw_parts(scratch.w.clone(), out * inp),
                    words,
                );
            }
        }
        Inner::Blocks { .. } => {
            let part = weight
                .block_part(None, p.y)
                .ok_or_else(|| DirectError::Parts("a block weight without blocks".into()))?;
            // SAFETY: the weight's bytes hold its layout's `out` rows (`DirectWeight::blocks`),
            // at most 65535 and the scratch `out * inp` f16 (checked by the caller).
            unsafe { blocks::launch_f16(client, part, &scratch.w) };
        }
    }
    let device = weight.device();
    let lhs = CubeTensor::new_contiguous(
        client.clone(),
        device.clone(),
        Shape::new([rows, inp]),
        scratch.x.clone(),
        DType::F16,
    );
    // The weight `[out, inp]` read as its transpose `[inp, out]`.
    let mut rhs = CubeTensor::new_contiguous(
        client.clone(),
        device.clone(),
        Shape::new([out, inp]),
        scratch.w.clone(),
        DType::F16,
    );
    rhs.meta.swap(0, 1);
    let y = CubeTensor::new_contiguous(
        client.clone(),
        device,
        Shape::new([rows, out]),
        scratch.y.clone(),
        DType::F32,
    );
    let (f16, f32) = (
        ElemType::Float(FloatKind::F16),
        ElemType::Float(FloatKind::F32),
    );
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: f16,
        rhs: f16,
        out: f32,
    });
    launch_ref(
        &Strategy::Auto,
        client,
        InputBinding::new(lhs.binding(), f16),
        InputBinding::new(rhs.binding(), f16),
        y.binding(),
        &mut dtypes,
    )
    .map_err(|e| DirectError::Parts(format!("matrix product: {e:?}")))?;
    // 0: none (one word of `scratch.r` bound, never read), 1: one per column (a bias), 2: one
    // per element (a residual).
    let (add, kind) = match p.add {
        Addend::None => (&scratch.r, 0),
        Addend::Bias(b) => (b, 1),
        Addend::Residual(r) => (r, 2),
    };
    let add_len = p.add.len(rows, out).max(1);
    let len = rows * out;
    // SAFETY: `scratch.y` and `p.y` hold `rows * out` f32, `scratch.r` `rows` and the addend
    // `add_len` (checked by the caller); `p.y` is none of the others. A grid row a matrix row:
    // one dimension of the whole would pass the grid's 65535 at 7B's MLP width from 886 rows.
    unsafe {
        finish_kernel::launch_unchecked(
            client,
            CubeCount::Static(out.div_ceil(THREADS) as u32, rows as u32, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(scratch.y.clone(), len),
            BufferArg::from_raw_parts(scratch.r.clone(), rows),
            BufferArg::from_raw_parts(add.clone(), add_len),
            BufferArg::from_raw_parts(p.y.clone(), len),
            rows,
            out,
            kind,
        );
    }
    Ok(())
}

/// Row `CUBE_POS_X` of a split (`per_row` blocks; its high planes `xq[b]`, low planes
/// `xq[blocks + b]`, scales `xs[8 * blocks + b]`) as f16 divided by the row's largest `|x|`,
/// which goes to `r`: the cube's threads find it from the blocks' scales, then write a block
/// each in turn.
#[cube(launch_unchecked)]
fn split_f16_kernel(
    xq: &[Word4],
    xs: &[f32],
    x: &mut [f16],
    r: &mut [f32],
    blocks: usize,
    per_row: usize,
) {
    let row = CUBE_POS_X as usize;
    let tid = UNIT_POS as usize;
    let first = row * per_row;
    let mut top = Shared::<[f32]>::new_slice(THREADS);
    let mut m = 0.0f32;
    let mut b = tid;
    while b < per_row {
        m = f32::max(m, xs[8 * blocks + first + b]);
        b += THREADS;
    }
    top[tid] = m;
    sync_cube();
    let mut stride = (THREADS / 2).runtime();
    while stride > 0 {
        if tid < stride {
            top[tid] = f32::max(top[tid], top[tid + stride]);
        }
        sync_cube();
        stride /= 2;
    }
    // A block's scale is its largest `|x|` over `SPLIT_Q_MAX`.
    let largest = top[0] * SPLIT_Q_MAX;
    let mut inv = 0.0f32;
    if largest > 0.0 {
        inv = 1.0 / largest;
    }
    if tid == 0 {
        r[row] = largest;
    }
    b = tid;
    while b < per_row {
        let at = first + b;
        let hi = xq[at];
        let lo = xq[blocks + at];
        // A non-finite block's scale is NaN: its values stay NaN.
        let s = xs[8 * blocks + at] * inv;
        #[unroll]
        for i in 0..16usize {
            let shift = (24 - 8 * (i % 4)) as u32;
            let h = i32::reinterpret(u32::reinterpret(hi.extract(i / 4)) << shift) >> 24;
            let l = i32::reinterpret(u32::reinterpret(lo.extract(i / 4)) << shift) >> 24;
            x[at * BLOCK + i] = f16::cast_from(s * f32::cast_from(256 * h + l));
        }
        b += THREADS;
    }
}

/// A q8 matrix (int8 values bound as words, f16 scales two a word) as f16, `words` words a
/// row: one word, four values, a thread; the grid's rows the matrix's.
#[cube(launch_unchecked)]
fn q8_f16_kernel(values: &[u32], scales: &[u32], w: &mut [f16], words: usize) {
    let k = ABSOLUTE_POS_X as usize;
    let r = CUBE_POS_Y as usize;
    if k < words {
        let s = row_scale(scales, r);
        let v = values[r * words + k];
        #[unroll]
        for i in 0..4usize {
            let q = i32::reinterpret(v << (24 - 8 * i) as u32) >> 24;
            w[(r * words + k) * 4 + i] = f16::cast_from(s * f32::cast_from(q));
        }
    }
}

/// `y = p * r[row] + add` over `rows` rows of `out`: the product of rows divided by `r`
/// multiplied back, and the addend (`kind` 0: none, 1: one per column, 2: one per element).
/// The grid's rows are the matrix's.
#[cube(launch_unchecked)]
fn finish_kernel(
    p: &[f32],
    r: &[f32],
    add: &[f32],
    y: &mut [f32],
    rows: usize,
    out: usize,
    #[comptime] kind: u32,
) {
    let col = ABSOLUTE_POS_X as usize;
    let row = CUBE_POS_Y as usize;
    if col < out && row < rows {
        let i = row * out + col;
        let mut v = p[i] * r[row];
        if comptime!(kind == 1) {
            v += add[col];
        } else if comptime!(kind == 2) {
            v += add[i];
        }
        y[i] = v;
    }
}
