//! The step's own kernels on the first wgpu adapter (Mesa's lavapipe in CI), each against an
//! f64 reference computed here. Without an adapter they skip, unless
//! `BURN_MAPPED_REQUIRE_GPU=1`.

use burn::tensor::{Device, DeviceType, Tensor};
use burn_cubecl::cubecl;
use burn_mapped::q8::direct::cube_float;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::kernels::{self, THREADS};
use crate::qwen2::rope;

fn client() -> Option<Client> {
    let required = std::env::var("BURN_MAPPED_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let Some(device) = Device::enumerate(DeviceType::Wgpu)
        .into_vec()
        .into_iter()
        .next()
    else {
        assert!(!required, "BURN_MAPPED_REQUIRE_GPU=1 but no wgpu adapter");
        eprintln!("no wgpu adapter: skipping (set BURN_MAPPED_REQUIRE_GPU=1 to fail)");
        return None;
    };
    let probe = Tensor::<1>::from_floats([0.0], &device);
    Some(
        cube_float(&probe)
            .expect("a wgpu tensor is a CubeCL tensor")
            .client,
    )
}

/// A fixed stream of values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn upload(c: &Client, v: &[f32]) -> Handle {
    c.create_from_slice(f32::as_bytes(v))
}

fn upload_u32(c: &Client, v: &[u32]) -> Handle {
    c.create_from_slice(u32::as_bytes(v))
}

fn words(c: &Client, h: &Handle) -> Vec<u32> {
    let bytes = c.read_one(h.clone()).expect("read back");
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn floats(c: &Client, h: &Handle) -> Vec<f32> {
    words(c, h).into_iter().map(f32::from_bits).collect()
}

/// The values a split of `n` values stands for, and each value's block scale.
fn unsplit(words: &[u32], n: usize) -> Vec<(f64, f64)> {
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

#[test]
fn rms_split_is_the_norm_within_the_split() {
    let Some(c) = client() else { return };
    // 56 blocks fit one pass of the cube's threads; 304 take two.
    for n in [896usize, 4864] {
        let x: Vec<f32> = values(n, 1).iter().map(|v| 3.0 * v).collect();
        let w: Vec<f32> = values(n, 2).iter().map(|v| 1.0 + 0.5 * v).collect();
        let eps = 1e-6f32;
        let out = c.empty(9 * n / 16 * 4);
        // SAFETY: `x`, `w` hold `n` f32 and `out` a split of `n` values.
        unsafe {
            kernels::rms_split_kernel::launch_unchecked(
                &c,
                CubeCount::Static(1, 1, 1),
                CubeDim::new_1d(THREADS as u32),
                BufferArg::from_raw_parts(upload(&c, &x), n),
                BufferArg::from_raw_parts(upload(&c, &w), n),
                BufferArg::from_raw_parts(out.clone(), 2 * n / 16),
                BufferArg::from_raw_parts(out.clone(), 9 * n / 16),
                n,
                eps,
            );
        }
        let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + f64::from(eps)).sqrt();
        let want: Vec<f64> = x
            .iter()
            .zip(&w)
            .map(|(&x, &w)| f64::from(x) * inv * f64::from(w))
            .collect();
        assert_split_close(&unsplit(&words(&c, &out), n), &want, "rms");
    }
}

#[test]
fn silu_split_is_silu_times_up_within_the_split() {
    let Some(c) = client() else { return };
    let n = 4864;
    let gate: Vec<f32> = values(n, 3).iter().map(|v| 8.0 * v).collect();
    let up = values(n, 4);
    let out = c.empty(9 * n / 16 * 4);
    // SAFETY: `gate`, `up` hold `n` f32 and `out` a split of `n` values.
    unsafe {
        kernels::silu_split_kernel::launch_unchecked(
            &c,
            CubeCount::Static((n / 16).div_ceil(64) as u32, 1, 1),
            CubeDim::new_1d(64),
            BufferArg::from_raw_parts(upload(&c, &gate), n),
            BufferArg::from_raw_parts(upload(&c, &up), n),
            BufferArg::from_raw_parts(out.clone(), 2 * n / 16),
            BufferArg::from_raw_parts(out.clone(), 9 * n / 16),
            n,
        );
    }
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            g / (1.0 + (-g).exp()) * f64::from(u)
        })
        .collect();
    assert_split_close(&unsplit(&words(&c, &out), n), &want, "silu");
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

#[test]
fn attention_writes_the_cache_and_attends_over_the_prefix() {
    let Some(c) = client() else { return };
    let (heads, kv_heads, d, capacity, pos) = (4usize, 2usize, 64usize, 8usize, 5usize);
    let group = heads / kv_heads;
    let q = values(heads * d, 5);
    let k = values(kv_heads * d, 6);
    let v = values(kv_heads * d, 7);
    // Cached positions before `pos` hold keys and values; the rest NaN, which a read past
    // the prefix would carry into the output.
    let cached = |seed| {
        let mut all = values(kv_heads * capacity * d, seed);
        for g in 0..kv_heads {
            for p in pos..capacity {
                all[(g * capacity + p) * d..][..d].fill(f32::NAN);
            }
        }
        all
    };
    let (kc0, vc0) = (cached(8), cached(9));
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
    let (kc, vc) = (upload(&c, &kc0), upload(&c, &vc0));
    let out = c.empty(9 * heads * d / 16 * 4);
    let blocks = heads * d / 16;
    let scale = 1.0 / (d as f32).sqrt();
    // SAFETY: every buffer holds what the kernel indexes for these shapes.
    unsafe {
        kernels::attention_kernel::launch_unchecked(
            &c,
            CubeCount::Static(heads as u32, 1, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(upload(&c, &q), heads * d),
            BufferArg::from_raw_parts(upload(&c, &k), kv_heads * d),
            BufferArg::from_raw_parts(upload(&c, &v), kv_heads * d),
            BufferArg::from_raw_parts(upload(&c, &cos), capacity * half),
            BufferArg::from_raw_parts(upload(&c, &sin), capacity * half),
            BufferArg::from_raw_parts(upload_u32(&c, &[pos as u32]), 1),
            BufferArg::from_raw_parts(kc.clone(), kv_heads * capacity * d),
            BufferArg::from_raw_parts(vc.clone(), kv_heads * capacity * d),
            BufferArg::from_raw_parts(out.clone(), 2 * blocks),
            BufferArg::from_raw_parts(out.clone(), 9 * blocks),
            capacity,
            scale,
            d,
            group,
            heads,
        );
    }
    let (cp, sp) = (&cos[pos * half..][..half], &sin[pos * half..][..half]);
    let k_now = rotate(&k, d, cp, sp);
    let (kc1, vc1) = (floats(&c, &kc), floats(&c, &vc));
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
    }
    let q_now = rotate(&q, d, cp, sp);
    let mut want = vec![0f64; heads * d];
    for h in 0..heads {
        let g = h / group;
        let key = |p: usize| -> Vec<f64> {
            if p == pos {
                k_now[g * d..][..d].to_vec()
            } else {
                kc0[(g * capacity + p) * d..][..d]
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect()
            }
        };
        let value = |p: usize, i: usize| {
            if p == pos {
                f64::from(v[g * d + i])
            } else {
                f64::from(vc0[(g * capacity + p) * d + i])
            }
        };
        let scores: Vec<f64> = (0..=pos)
            .map(|p| {
                let kp = key(p);
                (0..d).map(|i| q_now[h * d + i] * kp[i]).sum::<f64>() * f64::from(scale)
            })
            .collect();
        let top = scores.iter().copied().fold(f64::MIN, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
        let total: f64 = weights.iter().sum();
        for i in 0..d {
            want[h * d + i] = (0..=pos).map(|p| weights[p] * value(p, i)).sum::<f64>() / total;
        }
    }
    assert_split_close(&unsplit(&words(&c, &out), heads * d), &want, "attention");
}

#[test]
fn argmax_takes_the_first_maximum_and_leaves_the_prompt() {
    let Some(c) = client() else { return };
    let n = 1000;
    let mut logits = values(n, 10);
    logits[3] = f32::NAN;
    logits[700] = 5.0;
    logits[300] = 5.0;
    let logits = upload(&c, &logits);
    let capacity = 8;
    let run = |pos: u32, prompt: u32| {
        let ids = upload_u32(&c, &[11, 12, 13, 14, 15, 16, 17, 18, 19]);
        let p = upload_u32(&c, &[pos]);
        // SAFETY: `logits` holds `n` f32, `ids` `capacity + 1` ids, `p` and the prompt one
        // word each.
        unsafe {
            kernels::argmax_kernel::launch_unchecked(
                &c,
                CubeCount::Static(1, 1, 1),
                CubeDim::new_1d(THREADS as u32),
                BufferArg::from_raw_parts(logits.clone(), n),
                BufferArg::from_raw_parts(ids.clone(), capacity + 1),
                BufferArg::from_raw_parts(p.clone(), 1),
                BufferArg::from_raw_parts(upload_u32(&c, &[prompt]), 1),
                n,
                capacity,
            );
        }
        (words(&c, &ids), words(&c, &p)[0])
    };
    // Inside the prompt: the prompt's token stays; the position advances.
    let (ids, pos) = run(2, 5);
    assert_eq!((ids[3], pos), (14, 3));
    // At the prompt's end: the choice, the first of the two maxima.
    let (ids, pos) = run(4, 5);
    assert_eq!((ids[5], pos), (300, 5));
}
