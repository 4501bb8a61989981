//! The fused products ([`super::fused`], [`super::paired`]) over a GGUF's own blocks: Q8_0,
//! Q5_0, Q4_K and Q6_K rows read on the device as the file stores them, against the same
//! split of the activations as the q8 kernels.
//!
//! Why: at 7B the q8 store reads 1.6× the bytes of the Q4_K_M blocks it was made from, and a
//! decode step is bound by the bytes it reads. Here nothing is converted: the weight is the
//! tensor's bytes, bound as words.
//!
//! A thread takes a row's blocks in units of 32 values that one load of 16 quant bytes covers
//! (a Q8_0 or Q5_0 block; a Q4_K sub-block pair's 16 bytes of nibbles; a Q6_K quarter's low and
//! high nibbles with their two high bits), each unit two blocks of 16 of the split. Within a
//! block of 16 the weight is `a * q - m` with small integers `q` (4 to 8 bits) and f32 `a`
//! and `m` from the block's scales, so its product with the split is
//! `s * (a * sum(q * x) - m * sum(x))` over the block's integer activations `x`: the two sums
//! are `dp4a` chains, exact in i32, and the block's scale `s` and `a`, `m` apply once.
//! Rows and blocks start on 2-byte boundaries (Q8_0, Q5_0 and Q6_K blocks are 34, 22 and
//! 210 bytes), so a word at an offset of 2 is put together from two. Q4_K, most of a Q4_K_M
//! model's bytes, is read in 16-byte loads instead (the weight bound a second time as vectors
//! of four words): a super-block's head (its two f16 and twelve scale bytes) and each unit's
//! quants are one aligned load each, 144-byte super-blocks keeping 16-byte alignment (at 7B
//! on an H100: 11 % less device time per token with the interleaved pair below). Q6_K put
//! together from two aligned loads measured slower than its word loads, so it keeps those.
//!
//! Two choices make a step's wide products shorter chains of waits (7B on an H100: 3.36 ms of
//! device time a token against 4.00). A product whose input is a split already in memory (the
//! down projection's, written by gate/up) reads it where it lies, through the caches, instead
//! of every cube copying it into shared memory first ([`block_tile_kernel`]): down 1.48 →
//! 0.91 ms a token. And a Q4_K gate/up pair asks for its first units before the prologue and
//! for each step's next units before it multiplies the current ones: gate/up 1.64 → 1.55 ms.

use burn_cubecl::cubecl;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::server::Handle;
use half::f16;

use super::common::{clamped_bases, f16_bits_to_f32, grid, write_rows, zeros};
use super::dot::{Addend, Word4};
use super::fused::{Prologue, PrologueInput, part_rows};
use super::paired::{Pairing, pair_and_split};
use crate::gguf::{BlockLayout, GgmlType};
use crate::q8::split::SPLIT_BLOCK as BLOCK;
use crate::q8::tuning::DotTuning;

/// ggml's type ids, as the kernels are compiled for them.
const Q5_0: u32 = 6;
const Q8_0: u32 = 8;
const Q4_K: u32 = 12;
const Q6_K: u32 = 14;

/// Values in a unit: what one 16-byte load of quants covers.
const UNIT: usize = 32;

/// The kernels' id of `layout`'s type, or `None` for a type they do not read.
pub(super) fn kind(layout: BlockLayout) -> Option<u32> {
    match layout.ty() {
        GgmlType::Q8_0 => Some(Q8_0),
        GgmlType::Q5_0 => Some(Q5_0),
        GgmlType::Q4_K => Some(Q4_K),
        GgmlType::Q6_K => Some(Q6_K),
        _ => None,
    }
}

/// Bytes in a row of `n` values of the type with id `kind`.
fn row_bytes(kind: u32, n: usize) -> usize {
    match kind {
        Q8_0 => n / 32 * 34,
        Q5_0 => n / 32 * 22,
        Q4_K => n / 256 * 144,
        _ => n / 256 * 210,
    }
}

/// The word at byte `o` (even) of `w`: one word, or the halves of two.
#[cube]
fn word_at(w: &[u32], o: usize) -> u32 {
    let i = o / 4;
    let mut v = w[i];
    if o % 4 == 2 {
        v = (v >> 16) | (w[i + 1] << 16);
    }
    v
}

/// The f16 at byte `o` (even) of `w`, as f32.
#[cube]
fn f16_at(w: &[u32], o: usize) -> f32 {
    f16_bits_to_f32((w[o / 4] >> (8 * (o % 4)) as u32) & 0xFFFFu32)
}

/// The byte at `o` of `w`.
#[cube]
fn byte_at(w: &[u32], o: usize) -> u32 {
    (w[o / 4] >> (8 * (o % 4)) as u32) & 255u32
}

/// `s * (a * sum(q * x) - m * sum(x))` over block `blk` of the split in `xq`/`xs` (its low
/// plane `lo_off` vectors on, its scales `s_off` f32 on) and the 16 int8 `q` in the four words
/// of `v`; without `offset`, `m` is not read.
#[cube]
#[allow(clippy::too_many_arguments)]
fn block_dot(
    v: &Array<u32>,
    xq: &[Word4],
    xs: &[f32],
    blk: usize,
    lo_off: usize,
    s_off: usize,
    a: f32,
    m: f32,
    #[comptime] offset: bool,
) -> f32 {
    let hi = xq[blk];
    let lo = xq[lo_off + blk];
    let mut r = a * f32::cast_from(split_dot(v[0], v[1], v[2], v[3], hi, lo));
    if comptime!(offset) {
        let ones = 0x0101_0101u32;
        r -= m * f32::cast_from(split_dot(ones, ones, ones, ones, hi, lo));
    }
    xs[s_off + blk] * r
}

/// `sum(q * x)` over 16 int8 `q` (four words) and the split's integers `x = 256 hi + lo`:
/// `|256 h + lo-sum| <= 16 * 128 * 32639`, exact in i32.
#[cube]
fn split_dot(w0: u32, w1: u32, w2: u32, w3: u32, hi: Word4, lo: Word4) -> i32 {
    let w0 = i32::reinterpret(w0);
    let w1 = i32::reinterpret(w1);
    let w2 = i32::reinterpret(w2);
    let w3 = i32::reinterpret(w3);
    let mut h = dp4a(w0, hi.extract(0usize), 0i32);
    h = dp4a(w1, hi.extract(1usize), h);
    h = dp4a(w2, hi.extract(2usize), h);
    h = dp4a(w3, hi.extract(3usize), h);
    let mut q = dp4a(w0, lo.extract(0usize), h << 8);
    q = dp4a(w1, lo.extract(1usize), q);
    q = dp4a(w2, lo.extract(2usize), q);
    dp4a(w3, lo.extract(3usize), q)
}

/// Bits 0..4 of `x` moved to bit 4 of bytes 0..4: a Q5_0 quant's fifth bit, four at a time.
#[cube]
fn spread4(x: u32) -> u32 {
    ((x & 1u32) << 4) | ((x & 2u32) << 11) | ((x & 4u32) << 18) | ((x & 8u32) << 25)
}

/// A Q4_K sub-block's 6-bit scale and minimum (`j < 8`) from the scale bytes' three words
/// (bytes 4..16 of the super-block), as `scale | minimum << 8`.
#[cube]
fn q4k_scale_min(w1: u32, w2: u32, w3: u32, j: usize) -> u32 {
    let i = (j % 4) as u32;
    let a = (w1 >> (8 * i)) & 255u32;
    let b = (w2 >> (8 * i)) & 255u32;
    let c = (w3 >> (8 * i)) & 255u32;
    let mut sc = a & 63u32;
    let mut mn = b & 63u32;
    if j >= 4 {
        sc = (c & 15u32) | ((a >> 6) << 4);
        mn = (c >> 4) | ((b >> 6) << 4);
    }
    sc | (mn << 8)
}

/// How many blocks of 16 a unit's second block follows its first, by type.
fn second_block(kind: u32) -> usize {
    match kind {
        Q4_K => 2,
        Q6_K => 4,
        _ => 1,
    }
}

/// Unit `k` of the row at byte `base`, of type `kind`, times the split (the row's blocks from
/// block `x0` of its planes, as [`block_dot`] reads them): its two blocks of 16.
#[cube]
#[allow(clippy::too_many_arguments)]
fn unit_dot(
    w: &[u32],
    wv: &[Word4],
    base: usize,
    k: usize,
    xq: &[Word4],
    xs: &[f32],
    x0: usize,
    lo_off: usize,
    s_off: usize,
    #[comptime] kind: u32,
) -> f32 {
    let mut lo = Array::<u32>::new(4usize);
    let mut hi = Array::<u32>::new(4usize);
    let mut coef = Array::<f32>::new(4usize);
    let b = x0 + unit_decode(w, wv, base, k, &mut lo, &mut hi, &mut coef, kind);
    let offset = comptime!(kind != Q8_0);
    block_dot(&lo, xq, xs, b, lo_off, s_off, coef[0], coef[1], offset)
        + block_dot(
            &hi,
            xq,
            xs,
            b + comptime!(second_block(kind)),
            lo_off,
            s_off,
            coef[2],
            coef[3],
            offset,
        )
}

/// Unit `k` of the row at byte `base` (of `w`, and of the same bytes as vectors `wv`), of
/// type `kind`: the int8 quants of its first block of 16
/// in `lo` and of its second in `hi` (four words each), and `[a, m]` of each in `coef`, so that
/// each value is `a * q - m`; returns the first block's index in the row (the second is
/// [`second_block`] after it).
#[cube]
#[allow(clippy::too_many_arguments)]
fn unit_decode(
    w: &[u32],
    wv: &[Word4],
    base: usize,
    k: usize,
    lo: &mut Array<u32>,
    hi: &mut Array<u32>,
    coef: &mut Array<f32>,
    #[comptime] kind: u32,
) -> usize {
    let mut first = 2 * k;
    if comptime!(kind == Q8_0) {
        let o = base + 34 * k;
        let d = f16_at(w, o);
        #[unroll]
        for i in 0..4usize {
            lo[i] = word_at(w, o + 2 + 4 * i);
            hi[i] = word_at(w, o + 18 + 4 * i);
        }
        coef[0] = d;
        coef[1] = 0.0;
        coef[2] = d;
        coef[3] = 0.0;
    } else if comptime!(kind == Q5_0) {
        let o = base + 22 * k;
        let d = f16_at(w, o);
        let qh = word_at(w, o + 2);
        #[unroll]
        for i in 0..4usize {
            let q = word_at(w, o + 6 + 4 * i);
            lo[i] = (q & 0x0F0F_0F0Fu32) | spread4((qh >> (4 * i) as u32) & 15u32);
            hi[i] = ((q >> 4) & 0x0F0F_0F0Fu32) | spread4((qh >> (16 + 4 * i) as u32) & 15u32);
        }
        coef[0] = d;
        coef[1] = 16.0 * d;
        coef[2] = d;
        coef[3] = 16.0 * d;
    } else if comptime!(kind == Q4_K) {
        let mut raw = Array::<Word4>::new(2usize);
        q4k_fetch(wv, base, k, &mut raw, 0usize);
        first = q4k_decode(raw[0], raw[1], k, lo, hi, coef);
    } else {
        // Q6_K, unit u of 8: half n of the super-block, quarter pair g (g and g + 2 share
        // their low-bit bytes), half h of each quarter.
        let s = k / 8;
        let u = k % 8;
        let n = u / 4;
        let g = (u / 2) % 2;
        let h = u % 2;
        let o = base + 210 * s;
        let d = f16_at(w, o + 208);
        let ql = o + 64 * n + 32 * g + 16 * h;
        let qh = o + 128 + 32 * n + 16 * h;
        let shift = (2 * g) as u32;
        #[unroll]
        for i in 0..4usize {
            let l = word_at(w, ql + 4 * i);
            let t = word_at(w, qh + 4 * i);
            lo[i] = (l & 0x0F0F_0F0Fu32) | (((t >> shift) & 0x0303_0303u32) << 4);
            hi[i] = ((l >> 4) & 0x0F0F_0F0Fu32) | (((t >> (shift + 4)) & 0x0303_0303u32) << 4);
        }
        let b = 8 * n + 2 * g + h;
        // The scales are int8: sign-extended through the top byte.
        let a0 = d * f32::cast_from(i32::reinterpret(byte_at(w, o + 192 + b) << 24) >> 24);
        let a1 = d * f32::cast_from(i32::reinterpret(byte_at(w, o + 196 + b) << 24) >> 24);
        first = 16 * s + b;
        coef[0] = a0;
        coef[1] = 32.0 * a0;
        coef[2] = a1;
        coef[3] = 32.0 * a1;
    }
    first
}

/// Q4_K unit `k`'s raw bytes in the row at byte `base`: its super-block's 16-byte head into
/// `raw[at]` and its 16 quant bytes into `raw[at + 1]`.
#[cube]
fn q4k_fetch(wv: &[Word4], base: usize, k: usize, raw: &mut Array<Word4>, at: usize) {
    let o = base + 144 * (k / 8);
    raw[at] = wv[o / 16];
    raw[at + 1] = wv[(o + 16 + 16 * (k % 8)) / 16];
}

/// [`unit_decode`] of a Q4_K unit `k` from its fetched head and quants.
#[cube]
fn q4k_decode(
    head: Word4,
    q: Word4,
    k: usize,
    lo: &mut Array<u32>,
    hi: &mut Array<u32>,
    coef: &mut Array<f32>,
) -> usize {
    // Unit u of 8 in a super-block: pair p of sub-blocks (2p, 2p + 1), half h of each.
    let s = k / 8;
    let u = k % 8;
    let p = u / 2;
    let h = u % 2;
    let dm = u32::reinterpret(head.extract(0usize));
    let w1 = u32::reinterpret(head.extract(1usize));
    let w2 = u32::reinterpret(head.extract(2usize));
    let w3 = u32::reinterpret(head.extract(3usize));
    let d = f16_bits_to_f32(dm & 0xFFFFu32);
    let dmin = f16_bits_to_f32(dm >> 16);
    let sm0 = q4k_scale_min(w1, w2, w3, 2 * p);
    let sm1 = q4k_scale_min(w1, w2, w3, 2 * p + 1);
    #[unroll]
    for i in 0..4usize {
        let qi = u32::reinterpret(q.extract(i));
        lo[i] = qi & 0x0F0F_0F0Fu32;
        hi[i] = (qi >> 4) & 0x0F0F_0F0Fu32;
    }
    coef[0] = d * f32::cast_from(sm0 & 255u32);
    coef[1] = dmin * f32::cast_from(sm0 >> 8);
    coef[2] = d * f32::cast_from(sm1 & 255u32);
    coef[3] = dmin * f32::cast_from(sm1 >> 8);
    16 * s + 4 * p + h
}

/// A fetched Q4_K unit `k` ([`q4k_fetch`]) times the split: its two blocks of 16.
#[cube]
fn q4k_unit_dot(
    head: Word4,
    q: Word4,
    k: usize,
    xq: &[Word4],
    xs: &[f32],
    x0: usize,
    lo_off: usize,
    s_off: usize,
) -> f32 {
    let mut lo = Array::<u32>::new(4usize);
    let mut hi = Array::<u32>::new(4usize);
    let mut coef = Array::<f32>::new(4usize);
    let b = x0 + q4k_decode(head, q, k, &mut lo, &mut hi, &mut coef);
    block_dot(&lo, xq, xs, b, lo_off, s_off, coef[0], coef[1], true)
        + block_dot(&hi, xq, xs, b + 2, lo_off, s_off, coef[2], coef[3], true)
}

/// `k + lanes`, or the row's last unit past its end: a fetch ahead that never leaves the row.
#[cube]
fn ahead(k: usize, lanes: usize, units: usize) -> usize {
    let mut n = k + lanes;
    if n >= units {
        n = units - 1;
    }
    n
}

/// Adds this thread's units of `rows` rows from `row0` (a row past `out` reads the last) into
/// `acc`: unit `lane + i * lanes` of each.
#[cube]
#[allow(clippy::too_many_arguments)]
fn rows_dot(
    w: &[u32],
    wv: &[Word4],
    row0: usize,
    out: usize,
    xq: &[Word4],
    xs: &[f32],
    x0: usize,
    lo_off: usize,
    s_off: usize,
    acc: &mut Array<f32>,
    #[comptime] n: usize,
    #[comptime] kind: u32,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
) {
    let units = comptime!(n / UNIT);
    let stride = comptime!(row_bytes(kind, n));
    let mut k = UNIT_POS_X as usize;
    while k < units {
        #[unroll]
        for r in 0..rows {
            let mut row = row0 + r;
            if row >= out {
                row = out - 1;
            }
            acc[r] += unit_dot(w, wv, row * stride, k, xq, xs, x0, lo_off, s_off, kind);
        }
        k += lanes;
    }
}

/// [`fused_kernel`](super::fused) over blocks: one to three products of the computed input,
/// `CUBE_POS_Z` picking the weight, each compiled for its own block type.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn block_fused_kernel<P: Prologue>(
    first: &[f32],
    second: &[f32],
    scalar: f32,
    w0: &[u32],
    wv0: &[Word4],
    bias0: &[f32],
    y0: &mut [f32],
    out0: usize,
    w1: &[u32],
    wv1: &[Word4],
    bias1: &[f32],
    y1: &mut [f32],
    out1: usize,
    w2: &[u32],
    wv2: &[Word4],
    bias2: &[f32],
    y2: &mut [f32],
    out2: usize,
    t_total: usize,
    #[comptime] n: usize,
    #[comptime] k0: u32,
    #[comptime] k1: u32,
    #[comptime] k2: u32,
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
        let row0 = (cube_x * groups + UNIT_POS_Y as usize) * rows;
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
        let t0 = CUBE_POS_Y as usize;
        let mut acc = zeros(rows);
        if z == 0 {
            rows_dot(
                w0, wv0, row0, out0, &xq, &xs, 0usize, nblk, 0usize, &mut acc, n, k0, rows, lanes,
            );
            write_rows(
                &acc, w0, bias0, y0, t_total, out0, row0, t0, 1usize, rows, lanes, groups, false,
                has_bias, bias_each,
            );
        } else if z == 1 {
            rows_dot(
                w1, wv1, row0, out1, &xq, &xs, 0usize, nblk, 0usize, &mut acc, n, k1, rows, lanes,
            );
            write_rows(
                &acc, w1, bias1, y1, t_total, out1, row0, t0, 1usize, rows, lanes, groups, false,
                has_bias, bias_each,
            );
        } else {
            rows_dot(
                w2, wv2, row0, out2, &xq, &xs, 0usize, nblk, 0usize, &mut acc, n, k2, rows, lanes,
            );
            write_rows(
                &acc, w2, bias2, y2, t_total, out2, row0, t0, 1usize, rows, lanes, groups, false,
                has_bias, bias_each,
            );
        }
    }
}

/// One product of a split in memory, read where it lies: cube row `y` takes activation rows
/// `y * tile..(y + 1) * tile` of the split of `t_total` rows (high plane, low plane, scales; a
/// row past `t_total` reads the last and is not written) through the device's caches, with no
/// prologue and no copy into shared memory, one output row a group. For a wide input (a 7B
/// down projection's split is 42.6 KB) the copy each cube made was most of the product's
/// time, and the shared memory it held kept cubes off the multiprocessors. A prompt's rows
/// take tiles of [`TILE`](crate::q8::tuning::TILE): each unit of the weight is decoded once
/// for all of them, so the weight is read once per tile instead of once per row.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn block_tile_kernel(
    sq: &[Word4],
    ss: &[f32],
    w0: &[u32],
    wv0: &[Word4],
    bias0: &[f32],
    y0: &mut [f32],
    out0: usize,
    t_total: usize,
    #[comptime] n: usize,
    #[comptime] k0: u32,
    #[comptime] tile: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] has_bias: bool,
    #[comptime] bias_each: bool,
) {
    let cube_x = CUBE_POS_X as usize;
    if cube_x * groups < out0 {
        let nblk = comptime!(n / BLOCK);
        let units = comptime!(n / UNIT);
        let stride = comptime!(row_bytes(k0, n));
        let second = comptime!(second_block(k0));
        let offset = comptime!(k0 != Q8_0);
        let plane = t_total * nblk;
        let t0 = CUBE_POS_Y as usize * tile;
        let row0 = cube_x * groups + UNIT_POS_Y as usize;
        let mut row = row0;
        if row >= out0 {
            row = out0 - 1;
        }
        let x0 = clamped_bases(t0, t_total, nblk, tile);
        let mut acc = zeros(tile);
        let mut lo = Array::<u32>::new(4usize);
        let mut hi = Array::<u32>::new(4usize);
        let mut coef = Array::<f32>::new(4usize);
        let mut k = UNIT_POS_X as usize;
        while k < units {
            let b = unit_decode(w0, wv0, row * stride, k, &mut lo, &mut hi, &mut coef, k0);
            #[unroll]
            for j in 0..tile {
                let at = x0[j] + b;
                acc[j] += block_dot(&lo, sq, ss, at, plane, 8 * plane, coef[0], coef[1], offset)
                    + block_dot(
                        &hi,
                        sq,
                        ss,
                        at + second,
                        plane,
                        8 * plane,
                        coef[2],
                        coef[3],
                        offset,
                    );
            }
            k += lanes;
        }
        write_rows(
            &acc, w0, bias0, y0, t_total, out0, row0, t0, tile, 1usize, lanes, groups, false,
            has_bias, bias_each,
        );
    }
}

/// Launches [`block_tile_kernel`]: one product of the split of `t` rows in `split` (`len`
/// words), `tile` rows a cube: one for a decode step's single row (more cubes, each shorter:
/// at 7B on an H100 the down projection took 914 µs a step against 1022 with four rows a group
/// and 1484 copying the split), [`TILE`](crate::q8::tuning::TILE) for a prompt's.
///
/// # Safety
///
/// As for [`launch`]; `split` holds `len` words, the split of `t` rows of `n` values.
pub(super) unsafe fn launch_split(
    client: &Client,
    split: &Handle,
    len: usize,
    t: usize,
    n: usize,
    w: &BlockPart<'_>,
    tile: usize,
) {
    let tuning = shape(w.out, n);
    let has_bias = w.bias.is_some();
    let bias_each = w.bias.is_some_and(|b| b.each);
    let (count, dim) = grid(w.out, t, tile, tuning.lanes, tuning.groups, 1);
    // SAFETY: the caller vouches for the split's `len` words and the part's lengths; the kernel
    // clamps every row to `out` and every activation row to `t`, and writes only those within.
    unsafe {
        let (words, vectors, bias, y, out) = w.args(t);
        block_tile_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(split.clone(), len / 4),
            BufferArg::from_raw_parts(split.clone(), len),
            words,
            vectors,
            bias,
            y,
            out,
            t,
            n,
            w.kind(),
            tile,
            tuning.lanes,
            tuning.groups,
            has_bias,
            bias_each,
        );
    }
}

/// [`paired_kernel`](super::paired) over blocks: cube `(c, t)` computes rows
/// `16 c..16 c + 16` of both products and writes the combination's block `c` of row `t`'s split.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn block_paired_kernel<P: Prologue, C: Pairing>(
    first: &[f32],
    second: &[f32],
    scalar: f32,
    wa: &[u32],
    wb: &[u32],
    wva: &[Word4],
    wvb: &[Word4],
    out_q: &mut [Word4],
    out_s: &mut [f32],
    #[comptime] n: usize,
    #[comptime] ka: u32,
    #[comptime] kb: u32,
    #[comptime] lanes: usize,
) {
    let nblk = comptime!(n / BLOCK);
    let t = CUBE_POS_Y as usize;
    let row = CUBE_POS_X as usize * BLOCK + UNIT_POS_Y as usize;
    // A Q4_K pair's first units are asked for before the prologue, so their fetch overlaps the
    // norm.
    let raw = first_units(wva, wvb, row, n, ka, kb);
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
    let acc = paired_rows(
        wa, wb, wva, wvb, row, raw, &xq, &xs, 0usize, nblk, 0usize, n, ka, kb, lanes,
    );
    pair_and_split::<C>(acc[0], acc[1], 1.0, 1.0, out_q, out_s, lanes);
}

/// [`block_paired_kernel`] over a split in memory: row `t` of a split of `t_total` rows (high
/// plane, low plane, scales) read where it lies, through the device's caches, instead of every
/// cube norming the input and splitting it into shared memory. For a wide input that prologue
/// was a large part of the launch (7B gate/up on an H100: 1.41 ms a token with the norm apart,
/// 1.58 with it in every cube); for a narrow one the norm's own launch costs more than it saves.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn block_paired_split_kernel<C: Pairing>(
    sq: &[Word4],
    ss: &[f32],
    wa: &[u32],
    wb: &[u32],
    wva: &[Word4],
    wvb: &[Word4],
    out_q: &mut [Word4],
    out_s: &mut [f32],
    t_total: usize,
    #[comptime] n: usize,
    #[comptime] ka: u32,
    #[comptime] kb: u32,
    #[comptime] lanes: usize,
) {
    let nblk = comptime!(n / BLOCK);
    let t = CUBE_POS_Y as usize;
    let row = CUBE_POS_X as usize * BLOCK + UNIT_POS_Y as usize;
    let plane = t_total * nblk;
    let raw = first_units(wva, wvb, row, n, ka, kb);
    let acc = paired_rows(
        wa,
        wb,
        wva,
        wvb,
        row,
        raw,
        sq,
        ss,
        t * nblk,
        plane,
        8 * plane,
        n,
        ka,
        kb,
        lanes,
    );
    pair_and_split::<C>(acc[0], acc[1], 1.0, 1.0, out_q, out_s, lanes);
}

/// A Q4_K pair's first units of row `row` for this thread ([`q4k_fetch`]: both weights' heads
/// and quants); unread for other types.
#[cube]
fn first_units(
    wva: &[Word4],
    wvb: &[Word4],
    row: usize,
    #[comptime] n: usize,
    #[comptime] ka: u32,
    #[comptime] kb: u32,
) -> Array<Word4> {
    let mut raw = Array::<Word4>::new(4usize);
    if comptime!(ka == Q4_K && kb == Q4_K) {
        let k = UNIT_POS_X as usize;
        q4k_fetch(wva, row * comptime!(row_bytes(ka, n)), k, &mut raw, 0usize);
        q4k_fetch(wvb, row * comptime!(row_bytes(kb, n)), k, &mut raw, 2usize);
    }
    raw
}

/// This thread's units of row `row` of both weights times the split (its blocks from block
/// `x0` of its planes, as [`block_dot`] reads them), as `[a, b]`; a Q4_K pair starts from
/// `raw` ([`first_units`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn paired_rows(
    wa: &[u32],
    wb: &[u32],
    wva: &[Word4],
    wvb: &[Word4],
    row: usize,
    raw: Array<Word4>,
    xq: &[Word4],
    xs: &[f32],
    x0: usize,
    lo_off: usize,
    s_off: usize,
    #[comptime] n: usize,
    #[comptime] ka: u32,
    #[comptime] kb: u32,
    #[comptime] lanes: usize,
) -> Array<f32> {
    // The two rows' units in one loop, both loads of a step in flight together: at 7B on an
    // H100 gate/up took 11 % less time than one row's loop after the other's.
    let units = comptime!(n / UNIT);
    let stride_a = comptime!(row_bytes(ka, n));
    let stride_b = comptime!(row_bytes(kb, n));
    let mut raw = raw;
    let mut a = 0.0f32;
    let mut b = 0.0f32;
    let mut k = UNIT_POS_X as usize;
    if comptime!(ka == Q4_K && kb == Q4_K) {
        // Each step asks for the next step's units before it multiplies this one's.
        while k < units {
            let kn = ahead(k, lanes, units);
            let mut next = Array::<Word4>::new(4usize);
            q4k_fetch(wva, row * stride_a, kn, &mut next, 0usize);
            q4k_fetch(wvb, row * stride_b, kn, &mut next, 2usize);
            a += q4k_unit_dot(raw[0], raw[1], k, xq, xs, x0, lo_off, s_off);
            b += q4k_unit_dot(raw[2], raw[3], k, xq, xs, x0, lo_off, s_off);
            #[unroll]
            for i in 0..4usize {
                raw[i] = next[i];
            }
            k += lanes;
        }
    } else {
        while k < units {
            a += unit_dot(wa, wva, row * stride_a, k, xq, xs, x0, lo_off, s_off, ka);
            b += unit_dot(wb, wvb, row * stride_b, k, xq, xs, x0, lo_off, s_off, kb);
            k += lanes;
        }
    }
    let mut acc = Array::<f32>::new(2usize);
    acc[0] = a;
    acc[1] = b;
    acc
}

/// Row `ids[pos[0] + t]` of a block matrix of `rows` rows of `n` values, dequantized into row
/// `t` of `out` (`t` the cube's row of the grid), one unit a thread; an id past the matrix
/// writes nothing.
#[cube(launch_unchecked)]
fn block_rows_kernel(
    w: &[u32],
    wv: &[Word4],
    ids: &[u32],
    pos: &[u32],
    out: &mut [f32],
    rows: usize,
    #[comptime] n: usize,
    #[comptime] kind: u32,
) {
    let k = ABSOLUTE_POS_X as usize;
    let t = CUBE_POS_Y as usize;
    let token = ids[pos[0] as usize + t] as usize;
    if k < comptime!(n / UNIT) && token < rows {
        let mut lo = Array::<u32>::new(4usize);
        let mut hi = Array::<u32>::new(4usize);
        let mut coef = Array::<f32>::new(4usize);
        let stride = comptime!(row_bytes(kind, n));
        let b = unit_decode(w, wv, token * stride, k, &mut lo, &mut hi, &mut coef, kind);
        let at = t * n + BLOCK * b;
        let second = at + comptime!(BLOCK * second_block(kind));
        #[unroll]
        for i in 0..16usize {
            out[at + i] = unit_value(&lo, &coef, 0usize, i);
            out[second + i] = unit_value(&hi, &coef, 2usize, i);
        }
    }
}

/// Value `i` of a decoded block of 16 (its int8 quants in the four words `q`, its `a` and `m`
/// at `coef[c]` and `coef[c + 1]`): `a * q_i - m`.
#[cube]
fn unit_value(
    q: &Array<u32>,
    coef: &Array<f32>,
    #[comptime] c: usize,
    #[comptime] i: usize,
) -> f32 {
    let shift = comptime!((24 - 8 * (i % 4)) as u32);
    let qi = i32::reinterpret(q[comptime!(i / 4)] << shift) >> 24;
    coef[c] * f32::cast_from(qi) - coef[c + 1]
}

/// Launches [`block_rows_kernel`] for `t` rows of `out` (`t * n` f32) from a block weight.
///
/// # Safety
///
/// The weight as for [`launch`]; `ids` holds `ids_len` ids and `pos[0] + t <= ids_len` when
/// the launch runs; `out` holds `t * n` f32 and is none of the other buffers.
pub(super) unsafe fn launch_rows(
    client: &Client,
    weight: BlockPart<'_>,
    ids: &Handle,
    ids_len: usize,
    pos: &Handle,
    t: usize,
    out: &Handle,
) {
    let n = weight.layout.cols();
    let threads = 64;
    // SAFETY: the caller vouches for the lengths; a thread past the row's units or a row past
    // the matrix writes nothing, and each thread writes its own unit's 32 values.
    unsafe {
        block_rows_kernel::launch_unchecked(
            client,
            CubeCount::Static((n / UNIT).div_ceil(threads) as u32, t as u32, 1),
            CubeDim::new_1d(threads as u32),
            BufferArg::from_raw_parts(weight.bytes.clone(), weight.words()),
            BufferArg::from_raw_parts(weight.bytes.clone(), weight.vectors()),
            BufferArg::from_raw_parts(ids.clone(), ids_len),
            BufferArg::from_raw_parts(pos.clone(), 1),
            BufferArg::from_raw_parts(out.clone(), t * n),
            weight.out,
            n,
            weight.kind(),
        );
    }
}

/// The launch shape over `out` rows of `inp` values: lanes double from 8 while a lane would
/// take more than four units of a row, up to 128; a cube has 128 threads, or 256 once a row
/// takes 32 lanes; two rows a group where there are rows enough, four over rows of 8192 values
/// or more, where every cube copies a split of 36 bytes per 16 values into shared memory (a
/// 7B down projection: 1.6 ms a step against 2.5 ms with two rows on an H100). Unrolling the
/// units' loop measured slower (docs/GPU.md).
fn shape(out: usize, inp: usize) -> DotTuning {
    let units = inp / UNIT;
    let mut lanes = 8;
    while lanes < 128 && units > 4 * lanes {
        lanes *= 2;
    }
    let threads = if lanes >= 32 { 256 } else { 128 };
    DotTuning {
        lanes,
        groups: (threads / lanes).max(1),
        rows: if out < 2048 {
            1
        } else if inp >= 8192 {
            4
        } else {
            2
        },
        unroll: 1,
    }
}

/// A block weight as the kernels bind it, and in a product, its addend and output.
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockPart<'a> {
    /// The tensor's bytes, `out` rows of its layout's row bytes, in a buffer of whole words.
    pub(super) bytes: &'a Handle,
    /// What they hold.
    pub(super) layout: BlockLayout,
    /// Its rows.
    pub(super) out: usize,
    /// What a product adds (unused by the paired kernel).
    pub(super) bias: Option<Addend<'a>>,
    /// A product's output, `t * out` f32 (unused by the paired kernel).
    pub(super) y: &'a Handle,
}

impl BlockPart<'_> {
    fn words(&self) -> usize {
        (self.out * self.layout.row_bytes()).div_ceil(4)
    }

    /// Whole 16-byte vectors in its bytes: what the Q4_K loads bind (a Q4_K weight is whole
    /// vectors).
    fn vectors(&self) -> usize {
        self.out * self.layout.row_bytes() / 16
    }

    fn kind(&self) -> u32 {
        kind(self.layout).expect("a block type the kernels read, checked by the caller")
    }

    /// The product kernels' arguments for this part over `t` activation rows: its bytes as
    /// words and as vectors, its addend (`out` f32, `t * out` for one per element, or one word
    /// of the weight standing in for none), its output (`t * out` f32) and `out`.
    ///
    /// # Safety
    ///
    /// The part's buffers hold what its fields say for `t` rows.
    unsafe fn args(&self, t: usize) -> (BufferArg, BufferArg, BufferArg, BufferArg, usize) {
        let bias_len = self
            .bias
            .map_or(1, |b| if b.each { t * self.out } else { self.out });
        let bias = self.bias.map_or(self.bytes, |b| b.handle);
        // SAFETY: the caller vouches for the lengths; a missing addend is never read.
        unsafe {
            (
                BufferArg::from_raw_parts(self.bytes.clone(), self.words()),
                BufferArg::from_raw_parts(self.bytes.clone(), self.vectors()),
                BufferArg::from_raw_parts(bias.clone(), bias_len),
                BufferArg::from_raw_parts(self.y.clone(), t * self.out),
                self.out,
            )
        }
    }
}

/// [`fused::launch`](super::fused) over block weights, each part with its addend and output.
///
/// # Safety
///
/// As for the q8 launch; each weight's bytes hold `out` rows of its layout over `n` values
/// (`n % 256 == 0` for Q4_K/Q6_K, `n % 32 == 0` otherwise) in whole words, of a type [`kind`]
/// names.
pub(super) unsafe fn launch<P: Prologue>(
    client: &Client,
    input: PrologueInput<'_>,
    t: usize,
    n: usize,
    parts: &[BlockPart<'_>],
) {
    assert!((1..=3).contains(&parts.len()), "1 to 3 products per launch");
    let widest = parts.iter().map(|w| w.out).max().unwrap_or(0);
    let tuning = shape(widest, n);
    let has_bias = parts[0].bias.is_some();
    let bias_each = parts[0].bias.is_some_and(|b| b.each);
    let (count, dim) = grid(widest, t, 1, tuning.lanes, tuning.groups, tuning.rows);
    let CubeCount::Static(x, y, _) = count else {
        unreachable!("grid() is static")
    };
    let count = CubeCount::Static(x, y, parts.len() as u32);
    let at = |i: usize| &parts[i.min(parts.len() - 1)];
    let kinds = [at(0).kind(), at(1).kind(), at(2).kind()];
    // SAFETY: the caller vouches for each part's lengths; the grid's third axis stops at the
    // parts given, so a repeated last part is bound but never run.
    let mut args = (0..3).map(|i| unsafe { at(i).args(t) });
    let (w0, v0, b0, y0, o0) = args.next().expect("three parts");
    let (w1, v1, b1, y1, o1) = args.next().expect("three parts");
    let (w2, v2, b2, y2, o2) = args.next().expect("three parts");
    // SAFETY: the caller vouches for the input's lengths and the parts'; the kernel clamps
    // every row to its part's `out`, skips cubes past it, and reads the input only through `P`.
    unsafe {
        block_fused_kernel::launch_unchecked::<P>(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(input.first.clone(), input.first_len),
            BufferArg::from_raw_parts(input.second.clone(), input.second_len),
            input.scalar,
            w0,
            v0,
            b0,
            y0,
            o0,
            w1,
            v1,
            b1,
            y1,
            o1,
            w2,
            v2,
            b2,
            y2,
            o2,
            t,
            n,
            kinds[0],
            kinds[1],
            kinds[2],
            tuning.rows,
            tuning.lanes,
            tuning.groups,
            has_bias,
            bias_each,
        );
    }
}

/// [`paired::launch`](super::paired) over two block weights of `out` rows.
///
/// # Safety
///
/// As for the q8 launch, each weight as for [`launch`]; `out % 16 == 0`.
pub(super) unsafe fn launch_paired<P: Prologue, C: Pairing>(
    client: &Client,
    input: PrologueInput<'_>,
    t: usize,
    n: usize,
    [a, b]: [BlockPart<'_>; 2],
    split: &Handle,
) {
    let out = a.out;
    let lanes = paired_lanes(n);
    let blocks = t * out / BLOCK;
    // SAFETY: the caller vouches for every length: the weights' words, the split's planes
    // `2 * blocks` vectors of four words and its `9 * blocks` f32 of which the kernel writes
    // the last `blocks`; each cube writes its own block of each.
    unsafe {
        let [wa, wb, va, vb, out_q, out_s] = paired_buffers(&a, &b, split, blocks);
        block_paired_kernel::launch_unchecked::<P, C>(
            client,
            CubeCount::Static((out / BLOCK) as u32, t as u32, 1),
            CubeDim::new_2d(lanes as u32, BLOCK as u32),
            BufferArg::from_raw_parts(input.first.clone(), input.first_len),
            BufferArg::from_raw_parts(input.second.clone(), input.second_len),
            input.scalar,
            wa,
            wb,
            va,
            vb,
            out_q,
            out_s,
            n,
            a.kind(),
            b.kind(),
            lanes,
        );
    }
}

/// [`launch_paired`] over the split of `t` rows in `input` (`len` words), read in place
/// ([`block_paired_split_kernel`]).
///
/// # Safety
///
/// As for [`launch_paired`]; `input` holds `len` words, the split of `t` rows of `n` values,
/// and is not `split`.
pub(super) unsafe fn launch_paired_split<C: Pairing>(
    client: &Client,
    input: &Handle,
    len: usize,
    t: usize,
    n: usize,
    [a, b]: [BlockPart<'_>; 2],
    split: &Handle,
) {
    let out = a.out;
    let lanes = paired_lanes(n);
    let blocks = t * out / BLOCK;
    // SAFETY: as for `launch_paired`; the input is read within its `len` words, rows `< t`.
    unsafe {
        let [wa, wb, va, vb, out_q, out_s] = paired_buffers(&a, &b, split, blocks);
        block_paired_split_kernel::launch_unchecked::<C>(
            client,
            CubeCount::Static((out / BLOCK) as u32, t as u32, 1),
            CubeDim::new_2d(lanes as u32, BLOCK as u32),
            BufferArg::from_raw_parts(input.clone(), len / 4),
            BufferArg::from_raw_parts(input.clone(), len),
            wa,
            wb,
            va,
            vb,
            out_q,
            out_s,
            t,
            n,
            a.kind(),
            b.kind(),
            lanes,
        );
    }
}

/// What a paired launch binds besides its input: both weights as words and as vectors, then
/// the split it writes (`blocks` blocks) as planes and as f32.
///
/// # Safety
///
/// As for [`launch_paired`]: the parts' bytes and the split hold what their lengths say.
unsafe fn paired_buffers(
    a: &BlockPart<'_>,
    b: &BlockPart<'_>,
    split: &Handle,
    blocks: usize,
) -> [BufferArg; 6] {
    // SAFETY: the caller vouches for the lengths.
    unsafe {
        [
            BufferArg::from_raw_parts(a.bytes.clone(), a.words()),
            BufferArg::from_raw_parts(b.bytes.clone(), b.words()),
            BufferArg::from_raw_parts(a.bytes.clone(), a.vectors()),
            BufferArg::from_raw_parts(b.bytes.clone(), b.vectors()),
            BufferArg::from_raw_parts(split.clone(), 2 * blocks),
            BufferArg::from_raw_parts(split.clone(), 9 * blocks),
        ]
    }
}

/// The paired products' lanes per row of `n` values: 16 where a lane would take more than
/// four units with 8.
fn paired_lanes(n: usize) -> usize {
    if n / UNIT > 4 * 8 { 16 } else { 8 }
}

/// Every row of a block matrix of rows of `n` values, dequantized into `out` as f16: a
/// prompt's weight for the matrix units ([`super::matrix`]). One unit a thread, the grid's
/// rows the matrix's.
#[cube(launch_unchecked)]
fn block_f16_kernel(
    w: &[u32],
    wv: &[Word4],
    out: &mut [F16x4],
    rows: usize,
    #[comptime] n: usize,
    #[comptime] kind: u32,
) {
    let k = ABSOLUTE_POS_X as usize;
    let r = CUBE_POS_Y as usize;
    if k < comptime!(n / UNIT) && r < rows {
        let mut lo = Array::<u32>::new(4usize);
        let mut hi = Array::<u32>::new(4usize);
        let mut coef = Array::<f32>::new(4usize);
        let stride = comptime!(row_bytes(kind, n));
        let b = unit_decode(w, wv, r * stride, k, &mut lo, &mut hi, &mut coef, kind);
        // In vectors of four: a thread's 32 values in 8 stores of 8 bytes, not 32 of 2.
        let at = (r * n + BLOCK * b) / 4;
        let second = at + comptime!(BLOCK * second_block(kind) / 4);
        #[unroll]
        for v in 0..4usize {
            let mut a = F16x4::new(f16::cast_from(0.0f32));
            let mut c = F16x4::new(f16::cast_from(0.0f32));
            #[unroll]
            for i in 0..4usize {
                a.insert(
                    i,
                    f16::cast_from(unit_value(&lo, &coef, 0usize, comptime!(4 * v + i))),
                );
                c.insert(
                    i,
                    f16::cast_from(unit_value(&hi, &coef, 2usize, comptime!(4 * v + i))),
                );
            }
            out[at + v] = a;
            out[second + v] = c;
        }
    }
}

/// Four f16 values, one 8-byte store.
type F16x4 = Vector<f16, Const<4>>;

/// Launches [`block_f16_kernel`] over the whole of a block weight into `out` (`out * n` f16).
///
/// # Safety
///
/// The weight as for [`launch`], of at most 65535 rows (a grid's `y`); `out` holds
/// `weight.out * n` f16 and is not the weight.
pub(super) unsafe fn launch_f16(client: &Client, weight: BlockPart<'_>, out: &Handle) {
    let n = weight.layout.cols();
    let threads = 64;
    // SAFETY: the caller vouches for the lengths; a thread past the row's units or the
    // matrix's rows writes nothing, and each thread writes its own unit's 32 values.
    unsafe {
        block_f16_kernel::launch_unchecked(
            client,
            CubeCount::Static((n / UNIT).div_ceil(threads) as u32, weight.out as u32, 1),
            CubeDim::new_1d(threads as u32),
            BufferArg::from_raw_parts(weight.bytes.clone(), weight.words()),
            BufferArg::from_raw_parts(weight.bytes.clone(), weight.vectors()),
            BufferArg::from_raw_parts(out.clone(), weight.out * n / 4),
            weight.out,
            n,
            weight.kind(),
        );
    }
}
