//! The FMA kernel: one f32 fused multiply-add per weight and activation row, on every CubeCL
//! device and every row width that is a multiple of 4.
//!
//! Layout ([`CubeTuning`]): a cube is `lanes x groups` threads. Each group of `lanes` threads
//! owns `rows` output rows; its lanes stride along those rows together, so each load
//! instruction reads consecutive words of one row, and `unroll` strides are loaded before
//! any arithmetic. Every lane keeps `rows x tile` f32 accumulators and reads each activation
//! value once for all of its rows. A load reads `vector` (1, 2 or 4) consecutive words of a
//! row, `4 * vector` weights, so neighbouring lanes need activations `vector` vec4 apart: wide
//! weight loads scatter a warp's activation loads over `vector` times the bytes they use. That
//! costs little where the weights' bytes bound the kernel (one or two activation rows); from
//! a few rows on, where arithmetic and activation loads do, narrower loads and more rows per
//! thread win, hence a launch shape per tile ([`CubeTuning::default_for`]). A cube column
//! (`CUBE_POS_Y`) handles one tile of at most [`TILE`] activation rows; `T > TILE` runs
//! `ceil(T / TILE)` tiles in one dispatch, each a pass over the weights. The lanes' partial
//! sums are added through shared memory at the end ([`write_rows`]).

use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::common::{clamped_bases, grid, scales_and_bias, write_rows, zeros};
use crate::q8::tuning::{CubeTuning, TILE};

/// Adds one stride of `rows` weight vectors (`wv[first..first + rows]`, starting at
/// activation vector `xi0` of each row) times the tile's activations into `acc`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate<N: Size>(
    wv: &Array<Vector<u32, N>>,
    first: usize,
    x: &[Vector<f32, Const<4>>],
    x_base: &Array<usize>,
    xi0: usize,
    acc: &mut Array<f32>,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
) {
    #[unroll]
    for v in 0..N::value() {
        // Unpack four int8 per row without an int-to-float conversion (a quarter-rate
        // instruction on common GPUs): flipping the sign bits turns each byte into
        // `u = value + 128`, and the bits `0x4B00_0000 | u` are the f32 `2^23 + u`, so
        // subtracting `2^23 + 128` leaves `value`, exactly.
        let mut wf = Array::<f32>::new(rows * 4);
        #[unroll]
        for r in 0..rows {
            let word = wv[first + r].extract(v) ^ 0x8080_8080u32;
            #[unroll]
            for b in 0..4 {
                let bits = ((word >> (8 * b as u32)) & 255u32) | 0x4B00_0000u32;
                wf[r * 4 + b] = f32::reinterpret(bits) - 8_388_736.0;
            }
        }
        let xi = xi0 + v;
        #[unroll]
        for j in 0..tile {
            let xv = x[x_base[j] + xi];
            #[unroll]
            for r in 0..rows {
                let mut a = acc[r * tile + j];
                #[unroll]
                for b in 0..4 {
                    a += wf[r * 4 + b] * xv.extract(b);
                }
                acc[r * tile + j] = a;
            }
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn q8_gemm_kernel<N: Size>(
    x: &[Vector<f32, Const<4>>],
    w: &[Vector<u32, N>],
    scales: &[u32],
    bias: &[f32],
    y: &mut [f32],
    t_total: usize,
    out: usize,
    words: usize,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] unroll: usize,
    #[comptime] has_bias: bool,
) {
    let lane = UNIT_POS_X as usize;
    let group = UNIT_POS_Y as usize;
    let row0 = (CUBE_POS_X as usize * groups + group) * rows;
    let t0 = CUBE_POS_Y as usize * tile;
    let n = N::value();
    // Vec4 activations per row: in / 4.
    let x_row = words * n;

    let mut acc = zeros(rows * tile);
    let row_base = clamped_bases(row0, out, words, rows);
    let x_base = clamped_bases(t0, t_total, x_row, tile);

    let mut k = lane;
    // Main loop: `unroll` strides of every row are loaded before any arithmetic, so
    // `rows * unroll` loads are in flight per thread.
    while k + (unroll - 1) * lanes < words {
        let mut wv = Array::<Vector<u32, N>>::new(rows * unroll);
        #[unroll]
        for u in 0..unroll {
            #[unroll]
            for r in 0..rows {
                wv[u * rows + r] = w[row_base[r] + k + u * lanes];
            }
        }
        #[unroll]
        for u in 0..unroll {
            accumulate::<N>(
                &wv,
                u * rows,
                x,
                &x_base,
                (k + u * lanes) * n,
                &mut acc,
                tile,
                rows,
            );
        }
        k += unroll * lanes;
    }
    // The strides left over (fewer than `unroll`), one at a time.
    while k < words {
        let mut wv = Array::<Vector<u32, N>>::new(rows);
        #[unroll]
        for r in 0..rows {
            wv[r] = w[row_base[r] + k];
        }
        accumulate::<N>(&wv, 0, x, &x_base, k * n, &mut acc, tile, rows);
        k += lanes;
    }

    write_rows(
        &acc, scales, bias, y, t_total, out, row0, t0, tile, rows, lanes, groups, true, has_bias,
        false,
    );
}

/// The FMA product `y = x W^T * scale (+ bias)` on `x`'s client. `x`, `values`, `scales` and
/// `bias` are contiguous and checked by the caller (`inp % 4 == 0`, non-empty); `y` is the
/// caller's output (`[t, out]` f32).
pub(super) fn run(
    x: &CubeTensor,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
    y: &Handle,
    tuning: CubeTuning,
) {
    let [t, inp] = x.meta.shape().dims::<2>();
    let out = values.meta.shape().dims::<2>()[0];
    let tile = t.min(TILE);
    let n = if tuning.vector >= 4 && inp.is_multiple_of(16) {
        4
    } else if tuning.vector >= 2 && inp.is_multiple_of(8) {
        2
    } else {
        1
    };
    let words = inp / (4 * n);
    let (count, dim) = grid(out, t, tile, tuning.lanes, tuning.groups, tuning.rows);
    let (scales, bias_arg) = scales_and_bias(scales, bias, out);
    // SAFETY: every length below is the number of elements of the stated type that the
    // buffer holds: `x` is `[t, inp]` f32 (`t * inp / 4` vec4), `values` `[out, inp]` bytes
    // (`out * words` vectors of `n` words), `y` `t * out` f32 (the scales and bias: see
    // `scales_and_bias`). The kernel clamps every row and column index to these bounds and
    // writes each `y` element at most once.
    unsafe {
        q8_gemm_kernel::launch_unchecked(
            &x.client,
            count,
            dim,
            n,
            BufferArg::from_raw_parts(x.handle.clone(), t * inp / 4),
            BufferArg::from_raw_parts(values.handle.clone(), out * words),
            scales,
            bias_arg,
            BufferArg::from_raw_parts(y.clone(), t * out),
            t,
            out,
            words,
            tile,
            tuning.rows,
            tuning.lanes,
            tuning.groups,
            tuning.unroll,
            bias.is_some(),
        );
    }
}
