//! Two dp4a products over one computed input whose outputs are combined element by element
//! (`C::combine(a, b)`: a gated MLP's `silu(gate) * up`) and written as the split the next
//! product reads, in one launch.
//!
//! Why: the alternative writes both products' rows to memory and has every cube of the next
//! product read them back and compute the combination and its split itself, a prologue of
//! two full rows per cube. Here each cube computes sixteen rows of both products, one split
//! block, so the combination and its quantization happen once and the next product only
//! copies its split into shared memory ([`StagedSplit`](super::fused::StagedSplit)).

use burn_cubecl::cubecl;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::common::row_scale;
use super::dot::{Word4, split_block};
use super::fused::{Prologue, PrologueInput, dot_loaded};
use crate::q8::split::SPLIT_BLOCK as BLOCK;

/// How [`paired_kernel`] combines an output of the first product (`a`) with the same output
/// of the second (`b`).
#[cube]
pub trait Pairing: Send + Sync + 'static {
    /// The combined value.
    fn combine(a: f32, b: f32) -> f32;
}

/// Cube `(c, t)` computes rows `16 c..16 c + 16` of both products for activation row `t`,
/// derived by `P` from `first` and `second`, and writes the combination's block `c` of row
/// `t`'s split. Group `UNIT_POS_Y` (sixteen of them) takes one row of each weight; its `lanes`
/// threads split the row's blocks, all loaded before the prologue runs.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn paired_kernel<P: Prologue, C: Pairing>(
    first: &[f32],
    second: &[f32],
    scalar: f32,
    wa: &[Word4],
    scales_a: &[u32],
    wb: &[Word4],
    scales_b: &[u32],
    out_q: &mut [Word4],
    out_s: &mut [f32],
    #[comptime] n: usize,
    #[comptime] lanes: usize,
) {
    let nblk = comptime!(n / BLOCK);
    let per = comptime!((n / BLOCK).div_ceil(lanes));
    let lane = UNIT_POS_X as usize;
    let group = UNIT_POS_Y as usize;
    let c = CUBE_POS_X as usize;
    let t = CUBE_POS_Y as usize;
    let row = c * BLOCK + group;
    let mut wv = Array::<Word4>::new(comptime!(2 * per));
    #[unroll]
    for i in 0..per {
        let blk = lane + i * lanes;
        let mut va = Word4::new(0i32);
        let mut vb = Word4::new(0i32);
        if blk < nblk {
            va = wa[row * nblk + blk];
            vb = wb[row * nblk + blk];
        }
        wv[2 * i] = va;
        wv[2 * i + 1] = vb;
    }
    let mut xq = Shared::<[Word4]>::new_slice(comptime!(2 * nblk));
    let mut xs = Shared::<[f32]>::new_slice(nblk);
    P::split_row(
        first,
        second,
        scalar,
        t,
        &mut xq,
        &mut xs,
        n,
        comptime!(lanes * BLOCK),
    );
    sync_cube();
    let acc = dot_loaded(&wv, &xq, &xs, nblk, per, 2usize, lanes);
    pair_and_split::<C>(
        acc[0],
        acc[1],
        row_scale(scales_a, row),
        row_scale(scales_b, row),
        out_q,
        out_s,
        lanes,
    );
}

/// Adds the lanes' partial sums `a` and `b` of each group's row of the two products, combines
/// the row's two sums (scaled by `scale_a` and `scale_b`) through `C`, and writes the cube's
/// sixteen as block `CUBE_POS_X` of row `CUBE_POS_Y`'s split: the end of the paired kernels,
/// over q8 weights and over blocks.
#[cube]
pub(super) fn pair_and_split<C: Pairing>(
    a: f32,
    b: f32,
    scale_a: f32,
    scale_b: f32,
    out_q: &mut [Word4],
    out_s: &mut [f32],
    #[comptime] lanes: usize,
) {
    let lane = UNIT_POS_X as usize;
    let group = UNIT_POS_Y as usize;
    let c = CUBE_POS_X as usize;
    let t = CUBE_POS_Y as usize;
    let mut partial = Shared::<[f32]>::new_slice(comptime!(2 * lanes * BLOCK));
    let slot = 2 * (group * lanes + lane);
    partial[slot] = a;
    partial[slot + 1] = b;
    sync_cube();
    let mut combined = Shared::<[f32]>::new_slice(BLOCK);
    if lane == 0 {
        let mut sa = 0.0f32;
        let mut sb = 0.0f32;
        for l in 0..lanes {
            sa += partial[2 * (group * lanes + l)];
            sb += partial[2 * (group * lanes + l) + 1];
        }
        combined[group] = C::combine(sa * scale_a, sb * scale_b);
    }
    sync_cube();
    if UNIT_POS == 0 {
        let mut v = Array::<Vector<f32, Const<4>>>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            let mut four = Vector::<f32, Const<4>>::new(0.0f32);
            #[unroll]
            for k in 0..4usize {
                four.insert(k, combined[4 * i + k]);
            }
            v[i] = four;
        }
        let blocks = CUBE_COUNT_X as usize * CUBE_COUNT_Y as usize;
        split_block(
            &v,
            out_q,
            out_s,
            t * CUBE_COUNT_X as usize + c,
            blocks,
            8 * blocks,
        );
    }
}

/// The lanes per row of `n` values: from 8, doubling while a lane would hold more than four
/// blocks of each weight, up to 16 (sixteen rows of 16 lanes make WebGPU's default limit of
/// 256 threads).
fn lanes(n: usize) -> usize {
    let nblk = n / BLOCK;
    if nblk > 4 * 8 { 16 } else { 8 }
}

/// Launches the paired products of `t` activation rows of `n` values, computed by `P` from
/// `input`, into `split` (the combination's split, `9 * t * out / 16` words). Each weight is
/// its int8 values and its f16 scales.
///
/// # Safety
///
/// `P` reads `input`'s buffers within the lengths given for `t` rows of `n`; `n % 16 == 0`,
/// `n <= fused_max_in(client)`; both weights' values are contiguous I8 `[out, n]` with `out % 16 == 0`
/// and their scales `out` f16; `split` holds `9 * t * out / 16` words and is none of the other
/// buffers.
pub(super) unsafe fn launch<P: Prologue, C: Pairing>(
    client: &Client,
    input: PrologueInput<'_>,
    t: usize,
    n: usize,
    [a, b]: [(&Handle, &Handle); 2],
    out: usize,
    split: &Handle,
) {
    let nblk = n / BLOCK;
    let lanes = lanes(n);
    let blocks = t * out / BLOCK;
    // SAFETY: the caller vouches for every length: the weights `out * nblk` vectors of four
    // words, the scales `ceil(out / 2)` words, the split's planes `2 * blocks` vectors of four
    // words and its `9 * blocks` f32 of which the kernel writes the last `blocks`; each cube
    // writes its own block of each.
    unsafe {
        paired_kernel::launch_unchecked::<P, C>(
            client,
            CubeCount::Static((out / BLOCK) as u32, t as u32, 1),
            CubeDim::new_2d(lanes as u32, BLOCK as u32),
            BufferArg::from_raw_parts(input.first.clone(), input.first_len),
            BufferArg::from_raw_parts(input.second.clone(), input.second_len),
            input.scalar,
            BufferArg::from_raw_parts(a.0.clone(), out * nblk),
            BufferArg::from_raw_parts(a.1.clone(), out.div_ceil(2)),
            BufferArg::from_raw_parts(b.0.clone(), out * nblk),
            BufferArg::from_raw_parts(b.1.clone(), out.div_ceil(2)),
            BufferArg::from_raw_parts(split.clone(), 2 * blocks),
            BufferArg::from_raw_parts(split.clone(), 9 * blocks),
            n,
            lanes,
        );
    }
}
