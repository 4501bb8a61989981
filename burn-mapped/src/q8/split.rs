//! The split activation format of the dp4a kernel, on the host: what Flex runs for
//! [`Q8Backend::q8_split`](super::Q8Backend::q8_split) and
//! [`q8_matmul_split`](super::Q8Backend::q8_matmul_split), so the format has a definition a
//! CPU-only test can hold to the f64 reference, beside the GPU kernel that reads it.
//!
//! Per block of [`SPLIT_BLOCK`] values of an activation row: the scale `s = max |x| / 32639`
//! ([`SPLIT_Q_MAX`]) and `q = round(x / s)`, `|q| <= 32639`, as two int8 bytes `q = 256 hi +
//! lo`. The words of a split of `[T, in]` (`B = T * in / 16` blocks, in row order): `4 B`
//! words of high bytes (block `b` at words `4b..4b + 4`, value `i` of the block in byte `i % 4`
//! of word `i / 4`), `4 B` of low bytes, then `B` scales as f32 bits. A block with a non-finite
//! value gets a NaN scale (its row's products are NaN).

use half::f16;

use crate::slabs::Slabs;

/// Values per block.
pub const SPLIT_BLOCK: usize = 16;

/// Words per block: four of high bytes, four of low bytes, the scale.
pub const SPLIT_WORDS: usize = 9;

/// Smallest slab of weight bytes worth a task of its own.
const MIN_BYTES_PER_THREAD: usize = 256 * 1024;

/// The largest `|q|`: `127 * 256 + 127`, so both bytes are int8.
pub const SPLIT_Q_MAX: f32 = 32639.0;

/// The split of `x` (`[t, inp]` row-major, `inp % 16 == 0`) as words.
pub(crate) fn split(x: &[f32], t: usize, inp: usize) -> Vec<u32> {
    debug_assert!(inp.is_multiple_of(SPLIT_BLOCK) && x.len() == t * inp);
    let blocks = t * inp / SPLIT_BLOCK;
    let mut words = vec![0u32; SPLIT_WORDS * blocks];
    let (planes, scales) = words.split_at_mut(8 * blocks);
    let (hi, lo) = planes.split_at_mut(4 * blocks);
    for (b, values) in x.chunks_exact(SPLIT_BLOCK).enumerate() {
        let m = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let finite = values.iter().all(|v| v.is_finite());
        let (s, inv) = match (finite, m > 0.0) {
            (false, _) => (f32::NAN, 0.0),
            (true, true) => (m / SPLIT_Q_MAX, SPLIT_Q_MAX / m),
            (true, false) => (0.0, 0.0),
        };
        scales[b] = s.to_bits();
        for (i, &v) in values.iter().enumerate() {
            let q = (v * inv).round().clamp(-SPLIT_Q_MAX, SPLIT_Q_MAX) as i32;
            // `q = 256 hi + lo` with both in int8: `lo` is `q`'s low byte read signed.
            let l = q as i8;
            let h = ((q - l as i32) >> 8) as i8;
            hi[4 * b + i / 4] |= u32::from(h as u8) << (8 * (i % 4));
            lo[4 * b + i / 4] |= u32::from(l as u8) << (8 * (i % 4));
        }
    }
    words
}

/// `y[t, o] = scales[o] * sum_b s_b * (sum_i q[o, 16b + i] * xq[t, 16b + i]) (+ bias[o])`
/// from a [`split`] of `t` rows of `inp` values, exact in i32 per block; output rows in
/// slabs on the crate's pool.
pub(crate) fn gemm(
    words: &[u32],
    t: usize,
    w: &[i8],
    scales: &[f16],
    bias: Option<&[f32]>,
    inp: usize,
) -> Vec<f32> {
    let slabs = Slabs {
        row_bytes: inp,
        min_bytes: MIN_BYTES_PER_THREAD,
        threads: 0,
        row_multiple: 1,
    };
    gemm_in(&slabs, words, t, w, scales, bias, inp)
}

/// [`gemm`] cut as `slabs` says, so tests can force many slabs on small matrices.
fn gemm_in(
    slabs: &Slabs,
    words: &[u32],
    t: usize,
    w: &[i8],
    scales: &[f16],
    bias: Option<&[f32]>,
    inp: usize,
) -> Vec<f32> {
    let out = scales.len();
    let nblk = inp / SPLIT_BLOCK;
    let blocks = t * nblk;
    debug_assert!(words.len() == SPLIT_WORDS * blocks && w.len() == out * inp);
    let byte = |plane: usize, b: usize, i: usize| -> i32 {
        i32::from((words[plane * 4 * blocks + 4 * b + i / 4] >> (8 * (i % 4))) as u8 as i8)
    };
    let q: Vec<i32> = (0..blocks * SPLIT_BLOCK)
        .map(|k| {
            let (b, i) = (k / SPLIT_BLOCK, k % SPLIT_BLOCK);
            256 * byte(0, b, i) + byte(1, b, i)
        })
        .collect();
    let s: Vec<f32> = words[8 * blocks..]
        .iter()
        .map(|&v| f32::from_bits(v))
        .collect();
    slabs.run(out, t, |start, rows, dst| {
        for (o, y) in (start..start + rows).zip(dst.chunks_exact_mut(t)) {
            let row = &w[o * inp..(o + 1) * inp];
            for (r, y) in y.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for k in 0..nblk {
                    let b = r * nblk + k;
                    let xq = &q[b * SPLIT_BLOCK..(b + 1) * SPLIT_BLOCK];
                    let wk = &row[k * SPLIT_BLOCK..(k + 1) * SPLIT_BLOCK];
                    let dot: i32 = wk.iter().zip(xq).map(|(&a, &b)| i32::from(a) * b).sum();
                    acc += s[b] * dot as f32;
                }
                let v = acc * scales[o].to_f32();
                *y = bias.map_or(v, |bias| v + bias[o]);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block's bytes rebuild `q` within half a step of `x / s`, for values across the
    /// range, zeros and the extremes.
    #[test]
    fn the_bytes_of_each_value_rebuild_it_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| match i {
                0 => 0.0,
                1 => -3.5,
                2 => 3.5,
                _ => ((i * 37 % 101) as f32 - 50.0) * 0.07,
            })
            .collect();
        let words = split(&x, 2, 32);
        let blocks = 4;
        for (b, values) in x.chunks_exact(SPLIT_BLOCK).enumerate() {
            let s = f32::from_bits(words[8 * blocks + b]);
            let m = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(s, m / SPLIT_Q_MAX, "block {b}");
            for (i, &v) in values.iter().enumerate() {
                let byte = |plane: usize| {
                    i64::from(
                        (words[plane * 4 * blocks + 4 * b + i / 4] >> (8 * (i % 4))) as u8 as i8,
                    )
                };
                let q = 256 * byte(0) + byte(1);
                assert!(q.abs() <= SPLIT_Q_MAX as i64, "block {b} value {i}: q {q}");
                let err = (f64::from(v) - f64::from(s) * q as f64).abs();
                assert!(
                    err <= f64::from(s) * 0.5 * (1.0 + 1e-6),
                    "block {b} value {i}: {err}"
                );
            }
        }
    }

    /// The product cut into many slabs is the product in one, element for element.
    #[test]
    fn slabs_do_not_change_the_product() {
        let (t, inp, out) = (3, 64, 37);
        let x: Vec<f32> = (0..t * inp).map(|i| (i * 29 % 83) as f32 - 41.0).collect();
        let w: Vec<i8> = (0..out * inp).map(|i| (i * 53 % 255) as u8 as i8).collect();
        let scales: Vec<f16> = (0..out)
            .map(|o| f16::from_f32(0.01 * (o + 1) as f32))
            .collect();
        let bias: Vec<f32> = (0..out).map(|o| o as f32 * 0.5).collect();
        let words = split(&x, t, inp);
        let cut = |threads, min_bytes| Slabs {
            row_bytes: inp,
            min_bytes,
            threads,
            row_multiple: 1,
        };
        for bias in [None, Some(bias.as_slice())] {
            let whole = gemm_in(&cut(1, usize::MAX), &words, t, &w, &scales, bias, inp);
            assert!(whole.iter().all(|v| v.is_finite()));
            for threads in [2, 5, 37] {
                let slabbed = gemm_in(&cut(threads, 1), &words, t, &w, &scales, bias, inp);
                assert_eq!(
                    slabbed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{threads} slabs"
                );
            }
        }
    }

    #[test]
    fn a_non_finite_value_makes_its_block_scale_nan_and_only_its_block() {
        let mut x = vec![1.0f32; 48];
        x[20] = f32::INFINITY;
        let words = split(&x, 1, 48);
        let s = |b: usize| f32::from_bits(words[8 * 3 + b]);
        assert!(s(1).is_nan());
        assert_eq!((s(0), s(2)), (1.0 / SPLIT_Q_MAX, 1.0 / SPLIT_Q_MAX));
    }
}
