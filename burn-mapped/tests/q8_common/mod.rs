//! Shared by the q8 tests: fresh random operands and an f64 reference written from the
//! format's definition, independent of the crate's kernels.
#![allow(dead_code)]

use burn::tensor::{DType, Device, Tensor, TensorData, f16};
use burn_mapped::q8::{Q8Input, Q8Rows, Q8Weight, SPLIT_Q_MAX, q8_linear_input};
// By path, not through burn-mapped-tests: `gpu-adopt`, another workspace, includes this module.
#[path = "../../../tests/src/xorshift.rs"]
mod xorshift;
use xorshift::XorShift;

/// A xorshift generator seeded from the clock (or `Q8_SEED`), so every run sees new
/// operands; failures print the seed to replay them.
pub struct Rng(pub XorShift);

impl Rng {
    pub fn fresh() -> Self {
        let seed = std::env::var("Q8_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("Q8_SEED={seed}");
        Rng(XorShift(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Magnitude in [0.1, 1) with a random sign: never zero.
    pub fn nonzero(&mut self) -> f32 {
        let m = 0.1 + 0.9 * self.unit();
        if self.next_u64() & 1 == 0 { m } else { -m }
    }

    pub fn vec_nonzero(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.nonzero()).collect()
    }

    /// Int8 values in [-127, 127], every one drawn fresh.
    pub fn q8_values(&mut self, n: usize) -> Vec<i8> {
        (0..n)
            .map(|_| ((self.next_u64() % 255) as i32 - 127) as i8)
            .collect()
    }

    /// Positive f16 scales of varied magnitude.
    pub fn scales(&mut self, n: usize) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(1e-3 * (1.0 + 99.0 * self.unit())))
            .collect()
    }
}

/// `y[t, o]` in f64 and the bound on the f32 result's error.
///
/// The kernels multiply, accumulate in f32 and then scale and add the bias, so by the
/// standard bound for recursive summation the error is at most `gamma_{in+4} * (|s| *
/// sum_i |q x| + |b|)` with `gamma_n ≈ n * 2^-24` (products, `in` additions spread over lanes
/// and a final lane sum, the scale and the bias each round once). The check uses
/// `f32::EPSILON = 2^-23`, twice the unit roundoff, as margin. A wrong element (a missed
/// row, a wrong scale, a dropped byte) is off by a multiple of a single product, far above
/// this bound.
pub fn reference(
    x: &[f32],
    q: &[i8],
    scales: &[f16],
    bias: Option<&[f32]>,
    t: usize,
    out: usize,
    inp: usize,
) -> Vec<(f64, f64)> {
    let mut res = Vec::with_capacity(t * out);
    for tt in 0..t {
        for o in 0..out {
            let s = scales[o].to_f64();
            let (mut dot, mut mag) = (0f64, 0f64);
            for i in 0..inp {
                let p = f64::from(q[o * inp + i]) * f64::from(x[tt * inp + i]);
                dot += p;
                mag += p.abs();
            }
            let b = bias.map_or(0.0, |b| f64::from(b[o]));
            let tol = (inp as f64 + 4.0) * f64::from(f32::EPSILON) * (s.abs() * mag + b.abs());
            res.push((s * dot + b, tol));
        }
    }
    res
}

/// [`reference`] for the dp4a kernel, whose activations are rounded per block of `block`
/// values to `s * q` with `s = max |x| / q_max` and integer `q`, `|x - s q| <= s / 2`: the
/// bound adds `|scale| * sum_i |q_i| * s_b(i) / 2` (with 2 % margin for the kernel's f32
/// `s` and `1 / s`) to the f32 one. Integer products and their per-block sums are exact.
#[allow(clippy::too_many_arguments)]
pub fn reference_dot(
    x: &[f32],
    q: &[i8],
    scales: &[f16],
    bias: Option<&[f32]>,
    t: usize,
    out: usize,
    inp: usize,
    block: usize,
    q_max: f64,
) -> Vec<(f64, f64)> {
    let mut res = reference(x, q, scales, bias, t, out, inp);
    for tt in 0..t {
        let row = &x[tt * inp..(tt + 1) * inp];
        let half_step: Vec<f64> = row
            .chunks(block)
            .map(|b| b.iter().fold(0f64, |m, v| m.max(f64::from(v.abs()))) / q_max / 2.0)
            .collect();
        for o in 0..out {
            let s = scales[o].to_f64().abs();
            let err: f64 = (0..inp)
                .map(|i| f64::from(q[o * inp + i].unsigned_abs()) * half_step[i / block])
                .sum();
            res[tt * out + o].1 += 1.02 * s * err;
        }
    }
    res
}

/// Asserts `got` (`[t, out]`) is within the bound of the reference everywhere; NaN (an
/// element the kernel never wrote) fails.
pub fn assert_close(got: &[f32], want: &[(f64, f64)], out: usize, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for (k, (&g, &(w, tol))) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= tol,
            "{ctx}: y[{}, {}] = {g}, reference {w}, error {err:e} > bound {tol:e}",
            k / out,
            k % out
        );
    }
}

/// A fresh q8 weight `[out, inp]` on `device`, with the values and scales it holds.
pub fn weight(
    rng: &mut Rng,
    out: usize,
    inp: usize,
    device: &Device,
) -> (Vec<i8>, Vec<f16>, Q8Weight) {
    let q = rng.q8_values(out * inp);
    let s = rng.scales(out);
    let rows = Q8Rows {
        values: q.clone(),
        scales: s.clone(),
    };
    let w = Q8Weight::from_rows(&rows, out, inp, device).unwrap();
    (q, s, w)
}

/// `t` fresh activation rows of `inp` values, row 1 (where there is one) scaled by 1e6 and
/// row 2 by 1e-9: magnitudes far past f16's range and below its normal range.
pub fn spread_rows(rng: &mut Rng, t: usize, inp: usize) -> Vec<f32> {
    let mut x = rng.vec_nonzero(t * inp);
    for (row, factor) in [(1, 1e6f32), (2, 1e-9)] {
        if row < t {
            x[row * inp..(row + 1) * inp]
                .iter_mut()
                .for_each(|v| *v *= factor);
        }
    }
    x
}

/// Asserts that the products of `w` (holding values `q` and scales `s`) over `input`, a split of
/// the `t` rows of `x`, without a bias and with one of fresh values, are within
/// [`reference_dot`]'s bound of the split's rounding; `ctx` names the case.
pub fn check_split_products(
    rng: &mut Rng,
    input: &Q8Input,
    x: &[f32],
    t: usize,
    (q, s, w): (&[i8], &[f16], &Q8Weight),
    device: &Device,
    ctx: &str,
) {
    let (out, inp) = (w.out_features(), x.len() / t);
    let b = rng.vec_nonzero(out);
    for bias in [None, Some(b.as_slice())] {
        let bt = bias.map(|b| {
            Tensor::<1>::from_data(TensorData::new(b.to_vec(), [out]), (device, DType::F32))
        });
        let got = q8_linear_input(input, w, bt)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let want = reference_dot(x, q, s, bias, t, out, inp, 16, f64::from(SPLIT_Q_MAX));
        let ctx = format!("{ctx} [{out}, {inp}] T={t} bias={}", bias.is_some());
        assert_close(&got, &want, out, &ctx);
    }
}
