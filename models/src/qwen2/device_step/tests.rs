//! The step's own kernels on the first wgpu adapter (Mesa's lavapipe in CI), each against an
//! f64 reference computed here. Without an adapter they skip, unless
//! `BURN_MAPPED_REQUIRE_GPU=1`.

use burn::tensor::Tensor;
use burn_cubecl::cubecl;
use burn_mapped::q8::direct::{
    Addend, DirectWeight, Product, PrologueInput, cube_float, fused_products, paired_products,
    split_words, staged_product,
};
use burn_mapped::q8::{Q8Weight, quantize_rows};
use burn_mapped_tests::synthetic::XorShift;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::kernels::{self, ARGMAX_PARTS, THREADS};
use super::{ATTENTION_SPAN, Dims, Nucleus, argmax, attention_splits, sample_top_p};
use crate::qwen2::rope;

pub(super) fn client() -> Option<Client> {
    let device = burn_mapped_tests::gpu::wgpu_device()?;
    let probe = Tensor::<1>::from_floats([0.0], &device);
    Some(
        cube_float(&probe)
            .expect("a wgpu tensor is a CubeCL tensor")
            .client,
    )
}

/// A fixed stream of values in `[-1, 1)`.
pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
    XorShift::seeded(seed)
        .take(n)
        .map(|s| (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

pub(super) fn upload(c: &Client, v: &[f32]) -> Handle {
    c.create_from_slice(f32::as_bytes(v))
}

pub(super) fn upload_u32(c: &Client, v: &[u32]) -> Handle {
    c.create_from_slice(u32::as_bytes(v))
}

pub(super) fn words(c: &Client, h: &Handle) -> Vec<u32> {
    let bytes = c.read_one(h.clone()).expect("read back");
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

pub(super) fn floats(c: &Client, h: &Handle) -> Vec<f32> {
    words(c, h).into_iter().map(f32::from_bits).collect()
}

/// The values a split of `n` values stands for, and each value's block scale.
pub(super) fn unsplit(words: &[u32], n: usize) -> Vec<(f64, f64)> {
    let blocks = n / 16;
    let byte = |plane: usize, i: usize| {
        let word = words[plane * 4 * blocks + i / 4];
        f64::from((word >> (8 * (i % 4))) as u8 as i8)
    };
    (0..n)
        .map(|i| {
            let s = f64::from(f32::from_bits(words[8 * blocks + i / 16]));
            (s * (256.0 * byte(0, i) + byte(1, i)), s)
        })
        .collect()
}

/// Every value of a split within half a step of its f64 reference (plus f32 rounding of the
/// reference's inputs).
fn assert_split_close(got: &[(f64, f64)], want: &[f64], what: &str) {
    for (i, (&(value, step), &w)) in got.iter().zip(want).enumerate() {
        let bound = step / 2.0 + 1e-5 * w.abs().max(step);
        assert!(
            (value - w).abs() <= bound,
            "{what}[{i}]: {value} against {w} (bound {bound:e})"
        );
    }
}

/// RMSNorm of each row of `x` (rows of `w.len()` values) with weight `w`, in f64.
pub(super) fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let n = w.len();
    x.chunks_exact(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + f64::from(eps)).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&x, &w)| f64::from(x) * inv * f64::from(w))
        })
        .collect()
}

/// `rows` rows of `n` values for a norm, the rows after the first a thousandth of its
/// magnitude, and the norm's weights around 1.
pub(super) fn norm_rows(rows: usize, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut x: Vec<f32> = values(rows * n, seed).iter().map(|v| 3.0 * v).collect();
    x[n..].iter_mut().for_each(|v| *v *= 1e-3);
    let w = values(n, seed + 1).iter().map(|v| 1.0 + 0.5 * v).collect();
    (x, w)
}

/// The norm's input: `rows` rows of `n` in `x`, its `n` weights in `w`.
pub(super) fn norm_input<'a>(
    x: &'a Handle,
    w: &'a Handle,
    rows: usize,
    n: usize,
    eps: f32,
) -> PrologueInput<'a> {
    PrologueInput {
        first: x,
        first_len: rows * n,
        second: w,
        second_len: n,
        scalar: eps,
    }
}

#[test]
fn rms_split_is_the_norm_within_the_split() {
    let Some(c) = client() else { return };
    // 56 blocks fit one pass of the cube's threads; 304 take two. Three rows, of which the
    // last two are normed (one cube each) into a split of two rows.
    for n in [896usize, 4864] {
        let x: Vec<f32> = values(3 * n, 1).iter().map(|v| 3.0 * v).collect();
        let w: Vec<f32> = values(n, 2).iter().map(|v| 1.0 + 0.5 * v).collect();
        let eps = 1e-6f32;
        let out = c.empty(2 * 9 * n / 16 * 4);
        // SAFETY: `x` holds three rows of `n` f32, `w` `n` f32 and `out` a split of two rows.
        unsafe {
            kernels::rms_split_kernel::launch_unchecked(
                &c,
                CubeCount::Static(1, 2, 1),
                CubeDim::new_1d(THREADS as u32),
                BufferArg::from_raw_parts(upload(&c, &x), 3 * n),
                BufferArg::from_raw_parts(upload(&c, &w), n),
                BufferArg::from_raw_parts(out.clone(), 2 * 2 * n / 16),
                BufferArg::from_raw_parts(out.clone(), 2 * 9 * n / 16),
                eps,
                1,
                n,
            );
        }
        let want = rms_norm(&x[n..], &w, eps);
        assert_split_close(&unsplit(&words(&c, &out), 2 * n), &want, "rms");
    }
}

/// The values of the split `words` of `silu(gate) * up` (`len` of them), each checked against
/// the f64 products `g` and `u` and their bounds: `|silu'| < 1.1`, so the error is at most
/// `1.1 |u| dg + |silu(g)| du + dg du`, plus the split's half step.
pub(super) fn assert_silu_mul(
    words: &[u32],
    len: usize,
    g: &[(f64, f64)],
    u: &[(f64, f64)],
    what: &str,
) -> Vec<f64> {
    let silu = |g: f64| g / (1.0 + (-g).exp());
    let got = unsplit(words, len);
    for (i, ((&(value, step), &(g, dg)), &(u, du))) in got.iter().zip(g).zip(u).enumerate() {
        let want = silu(g) * u;
        let bound = 1.1 * u.abs() * dg + silu(g).abs() * du + dg * du + step / 2.0;
        let bound = bound + 1e-5 * want.abs().max(step);
        assert!(
            (value - want).abs() <= bound,
            "{what} silu(gate) * up [{i}]: {value} against {want} (bound {bound:e})"
        );
    }
    got.into_iter().map(|(value, _)| value).collect()
}

/// A q8 weight `[out, inp]` quantized from a fixed stream, on the tests' wgpu device, and its
/// values and scales in f64.
pub(super) fn q8_weight(out: usize, inp: usize, seed: u64) -> (DirectWeight, Vec<f64>, Vec<f64>) {
    let device = burn_mapped_tests::gpu::wgpu_device().expect("a client implies a device");
    let rows = quantize_rows(&values(out * inp, seed), out, inp).expect("finite weights");
    let weight = Q8Weight::from_rows(&rows, out, inp, &device).expect("a q8 weight");
    let direct = DirectWeight::new(&weight).expect("whole blocks on a CubeCL device");
    let q = rows.values.iter().map(|&v| f64::from(v)).collect();
    let s = rows.scales.iter().map(|s| s.to_f64()).collect();
    (direct, q, s)
}

/// `x W^T` of `rows` rows of `x` (f64, rows of `inp`) under a q8 weight, with each element's
/// bound: the split rounds every value to half a step of its block (`max |x| / 32639`, 2 %
/// margin for the kernel's f32 step), and the kernel's f32 input and sums add `1e-5` of the
/// magnitudes.
fn product_bounds(x: &[f64], q: &[f64], s: &[f64], inp: usize) -> Vec<(f64, f64)> {
    let out = s.len();
    x.chunks_exact(inp)
        .flat_map(|row| {
            let half_step: Vec<f64> = row
                .chunks_exact(16)
                .map(|b| b.iter().fold(0f64, |m, v| m.max(v.abs())) / 32639.0 / 2.0)
                .collect();
            (0..out)
                .map(|o| {
                    let w = &q[o * inp..][..inp];
                    let dot: f64 = w.iter().zip(row).map(|(w, x)| w * x).sum();
                    let mag: f64 = w.iter().zip(row).map(|(w, x)| (w * x).abs()).sum();
                    let round: f64 = (0..inp).map(|i| w[i].abs() * half_step[i / 16]).sum();
                    (s[o] * dot, s[o].abs() * (1.02 * round + 1e-5 * mag))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

pub(super) fn assert_within(got: &[f32], want: &[(f64, f64)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &(w, bound))) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= bound,
            "{what}[{i}]: {g} against {w} (error {err:e}, bound {bound:e})"
        );
    }
}

#[test]
fn fused_norm_products_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // Two rows of the hidden width (56 blocks: fewer than a cube's threads), three products of
    // row counts that leave cubes part-full (with biases, as q, k and v), the widest with rows
    // enough for two rows per thread, on rows of unequal magnitude.
    let (n, rows, eps) = (896usize, 2usize, 1e-6f32);
    let (x, w) = norm_rows(rows, n, 40);
    let outs = [2056usize, 40, 24];
    let weights: Vec<_> = outs
        .iter()
        .enumerate()
        .map(|(i, &o)| q8_weight(o, n, 42 + i as u64))
        .collect();
    let biases: Vec<Vec<f32>> = outs
        .iter()
        .enumerate()
        .map(|(i, &o)| values(o, 50 + i as u64))
        .collect();
    let (xh, wh) = (upload(&c, &x), upload(&c, &w));
    let bh: Vec<Handle> = biases.iter().map(|b| upload(&c, b)).collect();
    let ys: Vec<Handle> = outs
        .iter()
        .map(|&o| upload(&c, &vec![f32::NAN; rows * o]))
        .collect();
    let parts: Vec<Product> = (0..3)
        .map(|i| Product {
            weight: &weights[i].0,
            add: Addend::Bias(&bh[i]),
            y: &ys[i],
        })
        .collect();
    let input = norm_input(&xh, &wh, rows, n, eps);
    // SAFETY: the norm reads `rows` rows of `n` and `n` weights, the lengths given.
    unsafe { fused_products::<kernels::NormInput>(input, rows, &parts) }.expect("launch");
    let normed = rms_norm(&x, &w, eps);
    for (i, ((weight, q, s), bias)) in weights.iter().zip(&biases).enumerate() {
        let mut want = product_bounds(&normed, q, s, n);
        for (k, (value, _)) in want.iter_mut().enumerate() {
            *value += f64::from(bias[k % weight.out_features()]);
        }
        assert_within(&floats(&c, &ys[i]), &want, &format!("part {i}"));
    }
}

#[test]
fn paired_gate_up_and_staged_down_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // The model's widths: gate/up 4864 x 896 (sixteen lanes of four blocks per row), down
    // 4864 wide (304 blocks: two per thread of its cubes), two rows of unequal magnitude, the
    // down projection adding a residual.
    let (n, inter, out, rows, eps) = (896usize, 4864usize, 40usize, 2usize, 1e-6f32);
    let (x, w) = norm_rows(rows, n, 60);
    let (gate, gq, gs) = q8_weight(inter, n, 62);
    let (up, uq, us) = q8_weight(inter, n, 63);
    let (down, dq, ds) = q8_weight(out, inter, 64);
    let residual = values(rows * out, 65);
    let (xh, wh, rh) = (upload(&c, &x), upload(&c, &w), upload(&c, &residual));
    let split = upload_u32(&c, &vec![0x7FC0_0000; split_words(rows, inter)]);
    let y = upload(&c, &vec![f32::NAN; rows * out]);
    let input = norm_input(&xh, &wh, rows, n, eps);
    // SAFETY: the norm reads `rows` rows of `n` and `n` weights, the lengths given.
    unsafe {
        paired_products::<kernels::NormInput, kernels::SiluMul>(input, rows, &gate, &up, &split)
    }
    .expect("launch");
    let normed = rms_norm(&x, &w, eps);
    let (g, u) = (
        product_bounds(&normed, &gq, &gs, n),
        product_bounds(&normed, &uq, &us, n),
    );
    let got = assert_silu_mul(&words(&c, &split), rows * inter, &g, &u, "q8");
    let product = Product {
        weight: &down,
        add: Addend::Residual(&rh),
        y: &y,
    };
    staged_product(&split, rows, product).expect("launch");
    // The split's values are the down projection's exact input.
    let mut want = product_bounds(&got, &dq, &ds, inter);
    for (value, r) in want.iter_mut().zip(&residual) {
        value.0 += f64::from(*r);
    }
    assert_within(&floats(&c, &y), &want, "down");
}

/// Single-query attention in f64: `q` (one head's `d` values) over positions `0..len`, whose
/// key and value `i` are `key(p, i)` and `value(p, i)`, scores scaled by `scale`.
fn attend(
    q: &[f64],
    len: usize,
    scale: f32,
    key: impl Fn(usize, usize) -> f64,
    value: impl Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let d = q.len();
    let scores: Vec<f64> = (0..len)
        .map(|p| (0..d).map(|i| q[i] * key(p, i)).sum::<f64>() * f64::from(scale))
        .collect();
    let top = scores.iter().copied().fold(f64::MIN, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..d)
        .map(|i| (0..len).map(|p| weights[p] * value(p, i)).sum::<f64>() / total)
        .collect()
}

/// `x` rotated by position `pos`'s angles, per head of `d` (the host step's RoPE, in f64).
fn rotate(x: &[f32], d: usize, cos: &[f32], sin: &[f32]) -> Vec<f64> {
    let half = d / 2;
    let mut out = vec![0f64; x.len()];
    for (h, head) in x.chunks_exact(d).enumerate() {
        for i in 0..half {
            let (a, b) = (f64::from(head[i]), f64::from(head[i + half]));
            let (c, s) = (f64::from(cos[i]), f64::from(sin[i]));
            out[h * d + i] = a * c - b * s;
            out[h * d + i + half] = b * c + a * s;
        }
    }
    out
}

/// A `[kv_heads, capacity, d]` cache of values from `seed` at positions before `from`, NaN
/// from there on: a read past what a kernel may read carries NaN into its output.
fn cache_before(seed: u64, kv_heads: usize, capacity: usize, d: usize, from: usize) -> Vec<f32> {
    let mut all = values(kv_heads * capacity * d, seed);
    for g in 0..kv_heads {
        for p in from..capacity {
            all[(g * capacity + p) * d..][..d].fill(f32::NAN);
        }
    }
    all
}

/// RoPE's `cos` and `sin` for every position, `[capacity, d / 2]` each (the host step's).
fn rope_tables(capacity: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
    let half = d / 2;
    let (mut cos, mut sin) = (vec![0f32; capacity * half], vec![0f32; capacity * half]);
    for p in 0..capacity {
        rope::angles(
            1e6,
            d,
            p,
            &mut cos[p * half..][..half],
            &mut sin[p * half..][..half],
        );
    }
    (cos, sin)
}

/// A decode step's attention at position `pos` of a cache of `capacity`, `heads` heads of `d`
/// over `kv_heads` key/value heads, against the f64 reference: the new key and value written
/// at `pos` alone, the output over every position up to `pos`. Each head takes the cubes the
/// step gives it for `capacity` ([`attention_splits`]), combined as the step combines them.
fn decode_attention_case(
    c: &Client,
    heads: usize,
    kv_heads: usize,
    d: usize,
    capacity: usize,
    pos: usize,
) {
    let group = heads / kv_heads;
    let splits = attention_splits(capacity);
    let q = values(heads * d, 5);
    let k = values(kv_heads * d, 6);
    let v = values(kv_heads * d, 7);
    // Cached positions before `pos` hold keys and values; the rest NaN.
    let kc0 = cache_before(8, kv_heads, capacity, d, pos);
    let vc0 = cache_before(9, kv_heads, capacity, d, pos);
    let half = d / 2;
    let (cos, sin) = rope_tables(capacity, d);
    let (kc, vc) = (upload(c, &kc0), upload(c, &vc0));
    let out = c.empty(9 * heads * d / 16 * 4);
    let blocks = heads * d / 16;
    let scale = 1.0 / (d as f32).sqrt();
    let p_buf = upload_u32(c, &[pos as u32]);
    let parts_len = heads * splits * (d + 2);
    let parts = c.empty(parts_len * 4);
    let (span, split) = if splits > 1 {
        (ATTENTION_SPAN, true)
    } else {
        (capacity, false)
    };
    // SAFETY: every buffer holds what the kernels index for these shapes.
    unsafe {
        kernels::attention_kernel::launch_unchecked(
            c,
            CubeCount::Static(heads as u32, 1, splits as u32),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(upload(c, &q), heads * d),
            BufferArg::from_raw_parts(upload(c, &k), kv_heads * d),
            BufferArg::from_raw_parts(upload(c, &v), kv_heads * d),
            BufferArg::from_raw_parts(upload(c, &cos), capacity * half),
            BufferArg::from_raw_parts(upload(c, &sin), capacity * half),
            BufferArg::from_raw_parts(p_buf.clone(), 1),
            BufferArg::from_raw_parts(kc.clone(), kv_heads * capacity * d),
            BufferArg::from_raw_parts(vc.clone(), kv_heads * capacity * d),
            BufferArg::from_raw_parts(kc.clone(), kv_heads * capacity * d / 4),
            BufferArg::from_raw_parts(out.clone(), 2 * blocks),
            BufferArg::from_raw_parts(out.clone(), 9 * blocks),
            BufferArg::from_raw_parts(parts.clone(), parts_len),
            capacity,
            span,
            scale,
            d,
            group,
            heads,
            false,
            split,
        );
        if split {
            kernels::attention_combine_kernel::launch_unchecked(
                c,
                CubeCount::Static(heads as u32, 1, 1),
                CubeDim::new_1d(d as u32),
                BufferArg::from_raw_parts(parts, parts_len),
                BufferArg::from_raw_parts(p_buf, 1),
                BufferArg::from_raw_parts(out.clone(), 2 * blocks),
                BufferArg::from_raw_parts(out.clone(), 9 * blocks),
                capacity,
                splits,
                d,
                heads,
            );
        }
    }
    let (cp, sp) = (&cos[pos * half..][..half], &sin[pos * half..][..half]);
    let k_now = rotate(&k, d, cp, sp);
    let (kc1, vc1) = (floats(c, &kc), floats(c, &vc));
    for g in 0..kv_heads {
        for i in 0..d {
            let at = (g * capacity + pos) * d + i;
            let key = k_now[g * d + i];
            assert!((f64::from(kc1[at]) - key).abs() <= 1e-6 * key.abs().max(1.0));
            assert_eq!(vc1[at], v[g * d + i]);
        }
        for p in 0..pos {
            let at = (g * capacity + p) * d;
            assert_eq!(kc1[at..at + d], kc0[at..at + d], "cached key {p} kept");
        }
        for p in pos + 1..capacity {
            let at = (g * capacity + p) * d;
            assert!(
                kc1[at].is_nan() && vc1[at].is_nan(),
                "position {p} untouched"
            );
        }
    }
    let q_now = rotate(&q, d, cp, sp);
    let mut want = vec![0f64; heads * d];
    for h in 0..heads {
        let g = h / group;
        let key = |p: usize, i: usize| {
            if p == pos {
                k_now[g * d + i]
            } else {
                f64::from(kc0[(g * capacity + p) * d + i])
            }
        };
        let value = |p: usize, i: usize| {
            if p == pos {
                f64::from(v[g * d + i])
            } else {
                f64::from(vc0[(g * capacity + p) * d + i])
            }
        };
        let head = &q_now[h * d..][..d];
        let out = attend(head, pos + 1, scale, key, value);
        want[h * d..][..d].copy_from_slice(&out);
    }
    let what = format!("attention, {splits} cubes a head, position {pos} of {capacity}");
    assert_split_close(&unsplit(&words(c, &out), heads * d), &want, &what);
}

#[test]
fn attention_writes_the_cache_and_attends_over_the_prefix() {
    let Some(c) = client() else { return };
    decode_attention_case(&c, 4, 2, 64, 8, 5);
}

/// A cache longer than one cube's pass: each head's positions split over cubes, whose ranges
/// past the position are empty, then combined; at 0.5B's and 7B's head shapes (64 and 128
/// wide, groups of 7 and 7), the position at a range's first, middle and last slot.
#[test]
fn attention_over_a_long_cache_splits_and_combines_the_prefix() {
    let Some(c) = client() else { return };
    assert!(attention_splits(700) > 2, "the case must split");
    for (heads, kv_heads, d, pos) in [(14, 2, 64, 640), (7, 1, 128, 555), (14, 2, 64, 383)] {
        decode_attention_case(&c, heads, kv_heads, d, 700, pos);
    }
}

#[test]
fn argmax_takes_the_first_maximum() {
    let Some(c) = client() else { return };
    let capacity = 8;
    // A vocabulary of a few values per slice of the first pass, one of fewer values than
    // slices (most slices empty), and one of many per slice with the maxima in different
    // slices; NaN never chosen.
    for (n, first, second) in [(1000, 300, 700), (50, 17, 40), (151_936, 30_000, 140_000)] {
        let mut logits = values(n, 10);
        logits[3] = f32::NAN;
        logits[second] = 5.0;
        logits[first] = 5.0;
        let logits = upload(&c, &logits);
        let ids = upload_u32(&c, &[11, 12, 13, 14, 15, 16, 17, 18, 19]);
        let p = upload_u32(&c, &[4]);
        let parts = (
            upload(&c, &[0.0; ARGMAX_PARTS]),
            upload(&c, &[0.0; ARGMAX_PARTS]),
        );
        let d = Dims {
            vocab: n,
            capacity,
            ..Dims::default()
        };
        // SAFETY: `logits` holds `n` f32, `ids` `capacity + 1` ids, `p` one word, each part
        // `ARGMAX_PARTS`.
        unsafe { argmax(&c, &logits, &parts, &ids, &p, d) };
        // The first of the two maxima, at the next position; the position advances.
        assert_eq!(
            (words(&c, &ids)[5], words(&c, &p)[0]),
            (first as u32, 5),
            "vocabulary of {n}"
        );
    }
}

/// The top-p kernel's choice for `logits` and the draw `u`, and the position after.
fn top_p(c: &Client, logits: &[f32], temperature: f64, top_p: f64, u: f32) -> (u32, u32) {
    let n = logits.len();
    let capacity = 4;
    let pos = 2;
    let mut draws = vec![0.0f32; capacity + 1];
    draws[pos + 1] = u;
    let ids = upload_u32(c, &[7; 5]);
    let p = upload_u32(c, &[pos as u32]);
    let parts = (
        upload(c, &[0.0; ARGMAX_PARTS]),
        upload(c, &[0.0; ARGMAX_PARTS]),
    );
    let nucleus = Nucleus {
        draws: upload(c, &draws),
        cand: c.empty(4 * n),
        cand_ids: c.empty(4 * n),
        counts: c.empty(4 * ARGMAX_PARTS),
    };
    let d = Dims {
        vocab: n,
        capacity,
        ..Dims::default()
    };
    // SAFETY: `logits` and the scratch hold `n` words, `draws` and `ids` `capacity + 1`, `p`
    // one, each part `ARGMAX_PARTS`.
    unsafe {
        sample_top_p(
            c,
            &upload(c, logits),
            &parts,
            &nucleus,
            &ids,
            &p,
            d,
            (1.0 / temperature) as f32,
            top_p as f32,
        );
    }
    (words(c, &ids)[pos + 1], words(c, &p)[0])
}

/// The nucleus in f64, in id order, each member with its weight: the fewest most likely ids
/// (ties by the lower id) whose weight reaches `top_p` of the total.
fn nucleus(logits: &[f32], temperature: f64, top_p: f64) -> Vec<(u32, f64)> {
    let max = logits.iter().map(|&x| x as f64).fold(f64::MIN, f64::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&x| ((x as f64 - max) / temperature).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(a.cmp(&b)));
    let mut kept = 0.0;
    let mut members = Vec::new();
    for id in order {
        kept += w[id];
        members.push((id as u32, w[id]));
        if kept >= top_p * total {
            break;
        }
    }
    members.sort_by_key(|&(id, _)| id);
    members
}

#[test]
fn top_p_draws_from_the_nucleus_in_id_order() {
    let Some(c) = client() else { return };
    // Logits spread evenly over `[-scale, scale)`: wide (a few candidates, as a language
    // model's) and narrow (most of the vocabulary).
    for (case, (n, scale, temperature, top_p_)) in [
        (3000, 6.0, 1.0, 0.9),
        (1000, 6.0, 0.5, 0.3),
        (777, 6.0, 2.0, 1.0),
        (5000, 6.0, 1.3, 0.02),
        (20000, 30.0, 0.8, 0.95),
        (4000, 0.5, 1.0, 0.99),
        // The model's vocabulary: several positions per thread of each slice's cube.
        (151_936, 3.0, 1.0, 0.9),
    ]
    .into_iter()
    .enumerate()
    {
        let logits: Vec<f32> = values(n, 20 + case as u64)
            .iter()
            .map(|x| scale * x)
            .collect();
        let members = nucleus(&logits, temperature, top_p_);
        let kept: f64 = members.iter().map(|m| m.1).sum();
        // A draw in the middle of a member's share picks that member: the first, the last,
        // and a few between.
        let mut picks: Vec<usize> = vec![0, members.len() - 1, members.len() / 2];
        picks.extend((1..members.len()).step_by(members.len().div_ceil(5)));
        for pick in picks {
            let before: f64 = members[..pick].iter().map(|m| m.1).sum();
            let u = (before + members[pick].1 / 2.0) / kept;
            let (got, pos) = top_p(&c, &logits, temperature, top_p_, u as f32);
            assert_eq!(
                got,
                members[pick].0,
                "n {n}, T {temperature}, top-p {top_p_}: draw {u} of a nucleus of {}",
                members.len()
            );
            assert_eq!(pos, 3);
        }
    }
    // Ties at the nucleus's edge join by the lower id: three equal maxima, top-p 0.6 keeps
    // two of them (ids 10 and 20), each half the nucleus.
    let mut tied = vec![-30.0f32; 700];
    for id in [10, 20, 600] {
        tied[id] = 1.5;
    }
    for (u, want) in [(0.25, 10), (0.75, 20), (0.9999, 20)] {
        assert_eq!(top_p(&c, &tied, 1.0, 0.6, u).0, want, "ties, draw {u}");
    }
    // A tiny top-p is the greedy choice; a NaN logit chooses nothing (the vocabulary's size).
    let logits = values(900, 31);
    let greedy = (0..900)
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
        .unwrap() as u32;
    assert_eq!(top_p(&c, &logits, 0.8, 1e-7, 0.99).0, greedy);
    let mut bad = logits.clone();
    bad[450] = f32::NAN;
    assert_eq!(top_p(&c, &bad, 1.0, 0.9, 0.5), (900, 3));
}

#[test]
fn prefill_writes_every_row_and_attends_causally() {
    let Some(c) = client() else { return };
    // Three prompt rows at positions 2..5 over a cache holding positions 0 and 1; the rest NaN,
    // which a read past a row's own position would carry into its output.
    let (heads, kv_heads, d, capacity) = (4usize, 2usize, 64usize, 8usize);
    let (base, rows) = (2usize, 3usize);
    let group = heads / kv_heads;
    let q = values(rows * heads * d, 11);
    let k = values(rows * kv_heads * d, 12);
    let v = values(rows * kv_heads * d, 13);
    let kc0 = cache_before(14, kv_heads, capacity, d, base);
    let vc0 = cache_before(15, kv_heads, capacity, d, base);
    let half = d / 2;
    let (cos, sin) = rope_tables(capacity, d);
    let (kc, vc) = (upload(&c, &kc0), upload(&c, &vc0));
    let (qh, kh, vh) = (upload(&c, &q), upload(&c, &k), upload(&c, &v));
    let (ch, sh) = (upload(&c, &cos), upload(&c, &sin));
    let pos = upload_u32(&c, &[base as u32]);
    let out = c.empty(rows * 9 * heads * d / 16 * 4);
    let blocks = rows * heads * d / 16;
    let scale = 1.0 / (d as f32).sqrt();
    // SAFETY: every buffer holds what the kernels index for these shapes.
    unsafe {
        kernels::cache_write_kernel::launch_unchecked(
            &c,
            CubeCount::Static(kv_heads as u32, rows as u32, 1),
            CubeDim::new_1d(d as u32),
            BufferArg::from_raw_parts(kh.clone(), rows * kv_heads * d),
            BufferArg::from_raw_parts(vh.clone(), rows * kv_heads * d),
            BufferArg::from_raw_parts(ch.clone(), capacity * half),
            BufferArg::from_raw_parts(sh.clone(), capacity * half),
            BufferArg::from_raw_parts(pos.clone(), 1),
            BufferArg::from_raw_parts(kc.clone(), kv_heads * capacity * d),
            BufferArg::from_raw_parts(vc.clone(), kv_heads * capacity * d),
            capacity,
            d,
        );
        kernels::attention_kernel::launch_unchecked(
            &c,
            CubeCount::Static(heads as u32, rows as u32, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(qh, rows * heads * d),
            BufferArg::from_raw_parts(kh, rows * kv_heads * d),
            BufferArg::from_raw_parts(vh, rows * kv_heads * d),
            BufferArg::from_raw_parts(ch, capacity * half),
            BufferArg::from_raw_parts(sh, capacity * half),
            BufferArg::from_raw_parts(pos, 1),
            BufferArg::from_raw_parts(kc.clone(), kv_heads * capacity * d),
            BufferArg::from_raw_parts(vc.clone(), kv_heads * capacity * d),
            BufferArg::from_raw_parts(kc.clone(), kv_heads * capacity * d / 4),
            BufferArg::from_raw_parts(out.clone(), 2 * blocks),
            BufferArg::from_raw_parts(out.clone(), 9 * blocks),
            BufferArg::from_raw_parts(c.empty(4), 1),
            capacity,
            capacity,
            scale,
            d,
            group,
            heads,
            true,
            false,
        );
    }
    let angles = |p: usize| (&cos[p * half..][..half], &sin[p * half..][..half]);
    // Every position's key (rotated at its position) and value, from the cache or the rows.
    let mut keys = vec![vec![0f64; kv_heads * d]; base + rows];
    let mut vals = vec![vec![0f64; kv_heads * d]; base + rows];
    for p in 0..base + rows {
        for g in 0..kv_heads {
            for i in 0..d {
                let at = (g * capacity + p) * d + i;
                keys[p][g * d + i] = f64::from(kc0[at]);
                vals[p][g * d + i] = f64::from(vc0[at]);
            }
        }
    }
    for t in 0..rows {
        let p = base + t;
        let (cp, sp) = angles(p);
        keys[p] = rotate(&k[t * kv_heads * d..][..kv_heads * d], d, cp, sp);
        vals[p] = v[t * kv_heads * d..][..kv_heads * d]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
    }
    let (kc1, vc1) = (floats(&c, &kc), floats(&c, &vc));
    for p in 0..capacity {
        for g in 0..kv_heads {
            for i in 0..d {
                let at = (g * capacity + p) * d + i;
                if p < base + rows {
                    let key = keys[p][g * d + i];
                    let close = (f64::from(kc1[at]) - key).abs() <= 1e-6 * key.abs().max(1.0);
                    assert!(close, "key {p}/{g}/{i}: {} against {key}", kc1[at]);
                    assert_eq!(f64::from(vc1[at]), vals[p][g * d + i], "value {p}/{g}/{i}");
                } else {
                    assert!(
                        kc1[at].is_nan() && vc1[at].is_nan(),
                        "position {p} untouched"
                    );
                }
            }
        }
    }
    let mut want = vec![0f64; rows * heads * d];
    for t in 0..rows {
        let p = base + t;
        let (cp, sp) = angles(p);
        let q_now = rotate(&q[t * heads * d..][..heads * d], d, cp, sp);
        for h in 0..heads {
            let g = h / group;
            let out = attend(
                &q_now[h * d..][..d],
                p + 1,
                scale,
                |j, i| keys[j][g * d + i],
                |j, i| vals[j][g * d + i],
            );
            want[(t * heads + h) * d..][..d].copy_from_slice(&out);
        }
    }
    assert_split_close(
        &unsplit(&words(&c, &out), rows * heads * d),
        &want,
        "prefill attention",
    );
}

#[test]
fn prompt_attention_in_tiles_matches_the_f64_reference_at_the_models_shapes() {
    let Some(c) = client() else { return };
    // A prompt pass's rows over a cache that holds their positions and those before them,
    // NaN past the last (a read past a row's own position carries NaN only where the pass
    // reads beyond its end; within it, a missed mask shows as a wrong value). Qwen2.5-0.5B's
    // heads (14 over 2, 64 values) and the 7B's (28 over 4, 128): a first pass, and passes
    // after earlier ones whose rows fill no whole tile of queries or keys; each in every tile
    // of keys the device's shared memory holds.
    let cases = [
        (14usize, 2usize, 64usize, 64usize, 0usize, 20usize),
        (14, 2, 64, 120, 40, 37),
        (28, 4, 128, 100, 21, 50),
        (28, 4, 128, 200, 13, 150),
    ];
    let max_shared = c.properties().hardware.max_shared_memory_size;
    for (case, (heads, kv_heads, d, capacity, base, rows)) in cases.into_iter().enumerate() {
        let widest = kernels::prompt_attention_keys(d, max_shared).unwrap_or_else(|| {
            panic!("{max_shared} bytes of shared memory hold no tile of keys of {d} values")
        });
        let seed = 900 + 10 * case as u64;
        let group = heads / kv_heads;
        let q = values(rows * heads * d, seed);
        let kc0 = cache_before(seed + 1, kv_heads, capacity, d, base + rows);
        let vc0 = cache_before(seed + 2, kv_heads, capacity, d, base + rows);
        let half = d / 2;
        let (cos, sin) = rope_tables(capacity, d);
        let scale = 1.0 / (d as f32).sqrt();
        let mut want = vec![0f64; rows * heads * d];
        for t in 0..rows {
            let p = base + t;
            let q_now = rotate(
                &q[t * heads * d..][..heads * d],
                d,
                &cos[p * half..][..half],
                &sin[p * half..][..half],
            );
            for h in 0..heads {
                let g = h / group;
                let at = |j: usize, i: usize| (g * capacity + j) * d + i;
                let out = attend(
                    &q_now[h * d..][..d],
                    p + 1,
                    scale,
                    |j, i| f64::from(kc0[at(j, i)]),
                    |j, i| f64::from(vc0[at(j, i)]),
                );
                want[(t * heads + h) * d..][..d].copy_from_slice(&out);
            }
        }
        let (kc, vc, qh) = (upload(&c, &kc0), upload(&c, &vc0), upload(&c, &q));
        let (ch, sh) = (upload(&c, &cos), upload(&c, &sin));
        let pos = upload_u32(&c, &[base as u32]);
        let blocks = rows * heads * d / 16;
        for keys in [16, 32].into_iter().filter(|&k| k <= widest) {
            let out = c.empty(9 * blocks * 4);
            // SAFETY: every buffer holds what the kernel indexes for these shapes (the cache
            // as vectors of four).
            unsafe {
                kernels::prompt_attention_kernel::launch_unchecked(
                    &c,
                    CubeCount::Static(
                        heads as u32,
                        rows.div_ceil(kernels::PROMPT_QUERIES) as u32,
                        1,
                    ),
                    CubeDim::new_1d(THREADS as u32),
                    BufferArg::from_raw_parts(qh.clone(), rows * heads * d),
                    BufferArg::from_raw_parts(ch.clone(), capacity * half),
                    BufferArg::from_raw_parts(sh.clone(), capacity * half),
                    BufferArg::from_raw_parts(pos.clone(), 1),
                    BufferArg::from_raw_parts(kc.clone(), kv_heads * capacity * d / 4),
                    BufferArg::from_raw_parts(vc.clone(), kv_heads * capacity * d / 4),
                    BufferArg::from_raw_parts(out.clone(), 2 * blocks),
                    BufferArg::from_raw_parts(out.clone(), 9 * blocks),
                    rows,
                    capacity,
                    scale,
                    d,
                    group,
                    heads,
                    keys,
                );
            }
            // Beside the split's half step, f32 softmax arithmetic (its `exp` the device's) at
            // 1e-5 of the head row's largest output: a mask or tile missed moves outputs by far
            // more.
            let got = unsplit(&words(&c, &out), rows * heads * d);
            let mut worst = 0f64;
            for (i, (&(value, step), &w)) in got.iter().zip(&want).enumerate() {
                let row = &want[i / d * d..][..d];
                let top = row.iter().fold(0f64, |m, v| m.max(v.abs()));
                let bound = step / 2.0 + 1e-5 * top;
                worst = worst.max((value - w).abs() / bound);
                assert!(
                    (value - w).abs() <= bound,
                    "prompt attention, {heads} heads of {d}, tiles of {keys} keys, rows \
                     {base}..{}[{i}]: {value} against {w} (bound {bound:e})",
                    base + rows
                );
            }
            eprintln!("{heads} heads of {d}, {keys} keys: largest error {worst:.3} of its bound");
        }
    }
}
