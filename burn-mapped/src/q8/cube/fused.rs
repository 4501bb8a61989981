//! dp4a products that compute their own input: each cube derives its activation row from f32
//! buffers through a [`Prologue`] (a norm, an activation function), splits it into shared
//! memory and runs the product on it, all in one launch.
//!
//! Why: a decode step on a GPU pays a few microseconds of device time per launch however
//! little the launch does, and the kernels that only prepare a product's input (a norm and
//! its split, an activation and its split) are a third of a transformer layer's launches.
//! Here every cube recomputes that input instead: one more read of a row the device's cache
//! already holds (every cube reads the same one) and a few operations per value, against a
//! launch and a round trip of the split through memory.

use burn_cubecl::cubecl;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::common::{clamped_bases, grid, write_rows, zeros};
use super::dot::{Part, Word4, dot_step};
use crate::q8::split::SPLIT_BLOCK as BLOCK;
use crate::q8::tuning::DotTuning;

/// How a fused product computes its activation rows, split as
/// [`split_block`](super::dot::split_block) writes a split.
#[cube]
pub trait Prologue: Send + Sync + 'static {
    /// Writes the split of activation row `t` (`n` values): block `b` as
    /// [`split_block`](super::dot::split_block) writes it with `blocks = n / 16` and
    /// `xs_at = 0`. Every one of the cube's `threads` threads calls it, with the launch's `first`,
    /// `second` and `scalar`; the kernel synchronizes the cube after it.
    #[allow(clippy::too_many_arguments)]
    fn split_row(
        first: &[f32],
        second: &[f32],
        scalar: f32,
        t: usize,
        xq: &mut [Word4],
        xs: &mut [f32],
        #[comptime] n: usize,
        #[comptime] threads: usize,
    );
}

/// What a [`Prologue`] reads: two f32 buffers with the f32 each holds, and a scalar.
#[derive(Debug, Clone, Copy)]
pub struct PrologueInput<'a> {
    /// The first buffer.
    pub first: &'a Handle,
    /// Its length in f32.
    pub first_len: usize,
    /// The second buffer (may be the first again).
    pub second: &'a Handle,
    /// Its length in f32.
    pub second_len: usize,
    /// The scalar.
    pub scalar: f32,
}

/// A product's input read from memory rather than computed: row `t` of a split of
/// `CUBE_COUNT_Y` rows of `n` values (`first`, its words bound as f32; `second` and `scalar`
/// unused), copied into shared memory. Run as a [`Prologue`], the cube's weights are loaded
/// before the copy waits on the split, instead of after it.
pub(super) struct StagedSplit;

#[cube]
impl Prologue for StagedSplit {
    #[allow(clippy::too_many_arguments)]
    fn split_row(
        split: &[f32],
        _second: &[f32],
        _scalar: f32,
        t: usize,
        xq: &mut [Word4],
        xs: &mut [f32],
        #[comptime] n: usize,
        #[comptime] threads: usize,
    ) {
        let tid = UNIT_POS as usize;
        let nblk = comptime!(n / BLOCK);
        let per = comptime!((n / BLOCK).div_ceil(threads));
        let lo_at = CUBE_COUNT_Y as usize * nblk;
        let mut hi = Array::<Word4>::new(per);
        let mut lo = Array::<Word4>::new(per);
        let mut sc = Array::<f32>::new(per);
        #[unroll]
        for r in 0..per {
            let b = tid + r * threads;
            let mut h = Word4::new(0i32);
            let mut l = Word4::new(0i32);
            let mut s = 0.0f32;
            if b < nblk {
                let at = t * nblk + b;
                #[unroll]
                for k in 0..4usize {
                    h.insert(k, i32::reinterpret(split[4 * at + k]));
                    l.insert(k, i32::reinterpret(split[4 * (lo_at + at) + k]));
                }
                s = split[8 * lo_at + at];
            }
            hi[r] = h;
            lo[r] = l;
            sc[r] = s;
        }
        #[unroll]
        for r in 0..per {
            let b = tid + r * threads;
            if b < nblk {
                xq[b] = hi[r];
                xq[nblk + b] = lo[r];
                xs[b] = sc[r];
            }
        }
    }
}

/// One to three products over the same computed input, `CUBE_POS_Z` picking the weight (parts
/// past the first two may repeat the first, never reached); a cube past its weight's rows
/// skips the prologue too. One activation row per cube row (`CUBE_POS_Y`).
///
/// Each thread loads all its weight blocks (`ceil(n / 16 / lanes)` per row) before the
/// prologue, so their fetch from memory overlaps the prologue's work instead of following it.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn fused_kernel<P: Prologue>(
    first: &[f32],
    second: &[f32],
    scalar: f32,
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
    #[comptime] n: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] has_bias: bool,
    #[comptime] bias_each: bool,
) {
    let cube_x = CUBE_POS_X as usize;
    let z = CUBE_POS_Z;
    let out = part_rows(out0, out1, out2);
    // The same for every thread of the cube, so the barriers below stay uniform.
    if cube_x * groups * rows < out {
        let nblk = comptime!(n / BLOCK);
        let per = comptime!((n / BLOCK).div_ceil(lanes));
        let row0 = (cube_x * groups + UNIT_POS_Y as usize) * rows;
        let row_base = clamped_bases(row0, out, nblk, rows);
        let mut wv = Array::<Word4>::new(comptime!(per * rows));
        if z == 0 {
            load_weights(w0, &row_base, &mut wv, nblk, per, rows, lanes);
        } else if z == 1 {
            load_weights(w1, &row_base, &mut wv, nblk, per, rows, lanes);
        } else {
            load_weights(w2, &row_base, &mut wv, nblk, per, rows, lanes);
        }
        let mut xq = Shared::<[Word4]>::new_slice(comptime!(2 * nblk));
        let mut xs = Shared::<[f32]>::new_slice(nblk);
        P::split_row(
            first,
            second,
            scalar,
            CUBE_POS_Y as usize,
            &mut xq,
            &mut xs,
            n,
            lanes * groups,
        );
        sync_cube();
        let acc = dot_loaded(&wv, &xq, &xs, nblk, per, rows, lanes);
        let t0 = CUBE_POS_Y as usize;
        if z == 0 {
            write_rows(
                &acc, scales0, bias0, y0, t_total, out0, row0, t0, 1usize, rows, lanes, groups,
                true, has_bias, bias_each,
            );
        } else if z == 1 {
            write_rows(
                &acc, scales1, bias1, y1, t_total, out1, row0, t0, 1usize, rows, lanes, groups,
                true, has_bias, bias_each,
            );
        } else {
            write_rows(
                &acc, scales2, bias2, y2, t_total, out2, row0, t0, 1usize, rows, lanes, groups,
                true, has_bias, bias_each,
            );
        }
    }
}

/// The rows of the part `CUBE_POS_Z` picks, of up to three.
#[cube]
pub(super) fn part_rows(out0: usize, out1: usize, out2: usize) -> usize {
    let mut out = out0;
    if CUBE_POS_Z == 1 {
        out = out1;
    } else if CUBE_POS_Z == 2 {
        out = out2;
    }
    out
}

/// A thread's weight blocks: block `lane + i * lanes` of each of its `rows` rows (at
/// `row_base`) as `wv[i * rows + r]`, zero past the row's `nblk` blocks.
#[cube]
fn load_weights(
    w: &[Word4],
    row_base: &Array<usize>,
    wv: &mut Array<Word4>,
    #[comptime] nblk: usize,
    #[comptime] per: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
) {
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for i in 0..per {
        let blk = lane + i * lanes;
        #[unroll]
        for r in 0..rows {
            let mut v = Word4::new(0i32);
            if blk < nblk {
                v = w[row_base[r] + blk];
            }
            wv[i * rows + r] = v;
        }
    }
}

/// The thread's partial sums of its rows over the split in `xq` and `xs` (one row: the
/// high plane, the low plane from block `nblk`, the scales) with the weights
/// [`load_weights`] loaded; a block past the row reads the last (its weights are zero).
#[cube]
pub(super) fn dot_loaded(
    wv: &Array<Word4>,
    xq: &[Word4],
    xs: &[f32],
    #[comptime] nblk: usize,
    #[comptime] per: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
) -> Array<f32> {
    let lane = UNIT_POS_X as usize;
    let mut acc = zeros(rows);
    let mut x_base = Array::<usize>::new(1usize);
    x_base[0] = 0;
    #[unroll]
    for i in 0..per {
        let mut blk = lane + i * lanes;
        if blk >= nblk {
            blk = nblk - 1;
        }
        dot_step(
            wv,
            i * rows,
            xq,
            xs,
            &x_base,
            nblk,
            0,
            blk,
            &mut acc,
            1usize,
            rows,
        );
    }
    acc
}

/// Shared memory a fused product's cube keeps for other than its split (the prologue's
/// cube-wide sums and maxima).
const SHARED_RESERVE: usize = 4096;

/// The widest row a fused product takes on `client`'s device: its split in shared memory (36
/// bytes per 16 values) within the shared memory the device gives a cube, less
/// [`SHARED_RESERVE`]. 5456 values under WebGPU's default of 16 KiB, 20016 in the 48 KiB of
/// Vulkan on NVIDIA GPUs (every Qwen2 size up to 14B; 32B's MLP is 27648 wide).
pub fn fused_max_in(client: &Client) -> usize {
    let shared = client.properties().hardware.max_shared_memory_size;
    shared.saturating_sub(SHARED_RESERVE) / 36 * 16
}

/// The launch shape of a fused product over `out` rows of `inp` values. A lane holds its
/// blocks of a row in registers from before the prologue, so lanes double from 8 until a lane
/// holds at most ten; a cube has 128 threads, or 256 once a row takes 32 lanes, to cover the
/// wait on those loads; and a group takes two rows where there are rows enough (every cube
/// recomputes the prologue, so fewer cubes do less of it).
fn shape(out: usize, inp: usize) -> DotTuning {
    let nblk = inp / BLOCK;
    let mut lanes = 8;
    while lanes < 256 && nblk > 10 * lanes {
        lanes *= 2;
    }
    let threads = if lanes >= 32 { 256 } else { 128 };
    DotTuning {
        lanes,
        groups: (threads / lanes).max(1),
        rows: if out >= 2048 { 2 } else { 1 },
        unroll: 1,
    }
}

/// Launches one to three products of `t` activation rows of `n` values computed by `P` from
/// `input`, as one dispatch: one cube row per activation row, in the layout [`shape`] picks.
///
/// # Safety
///
/// `P` reads `input`'s buffers within the lengths given for `t` rows of `n`; `n % 16 == 0` and
/// `n <= fused_max_in(client)`; each part is as for [`launch`](super::dot::launch) over `t` rows of `n`
/// (its addend holding what it says, `y` `t * out` f32); the parts share their kind of addend,
/// and no part writes a buffer that `input` or another part reads or writes.
pub(super) unsafe fn launch<P: Prologue>(
    client: &Client,
    input: PrologueInput<'_>,
    t: usize,
    n: usize,
    parts: &[Part<'_>],
) {
    assert!((1..=3).contains(&parts.len()), "1 to 3 products per launch");
    let widest = parts.iter().map(Part::out).max().unwrap_or(0);
    let tuning = shape(widest, n);
    let nblk = n / BLOCK;
    let has_bias = parts[0].bias.is_some();
    let bias_each = parts[0].bias.is_some_and(|b| b.each);
    let (count, dim) = grid(widest, t, 1, tuning.lanes, tuning.groups, tuning.rows);
    let CubeCount::Static(x, y, _) = count else {
        unreachable!("grid() is static")
    };
    let count = CubeCount::Static(x, y, parts.len() as u32);
    // SAFETY: the caller vouches for each part's lengths; the grid's third axis stops at the
    // parts given, so a repeated first part is bound but never run.
    let mut args = (0..3).map(|i| unsafe { parts[i.min(parts.len() - 1)].args(t, nblk) });
    let (w0, s0, b0, y0, o0) = args.next().expect("three parts");
    let (w1, s1, b1, y1, o1) = args.next().expect("three parts");
    let (w2, s2, b2, y2, o2) = args.next().expect("three parts");
    // SAFETY: the caller vouches for the input's lengths and the parts'; the kernel clamps
    // every row to its part's `out`, skips cubes past it, and reads the input only through `P`.
    unsafe {
        fused_kernel::launch_unchecked::<P>(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(input.first.clone(), input.first_len),
            BufferArg::from_raw_parts(input.second.clone(), input.second_len),
            input.scalar,
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
            n,
            tuning.rows,
            tuning.lanes,
            tuning.groups,
            has_bias,
            bias_each,
        );
    }
}
