//! Causal grouped-query attention of the host step, over the host cache.
//!
//! The model is built for baseline x86-64, whose loops take four f32 lanes and no FMA; where
//! the process's CPU tier has AVX2 and FMA, each query's scores and weighted values run in
//! eight-lane registers instead ([`x86`]), four keys at a time and the output held in
//! registers across the positions.

/// Where the attention's operands lie.
#[derive(Clone, Copy)]
pub(super) struct AttnShape {
    pub start: usize,
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub capacity: usize,
}

/// Multiply-adds of one layer's attention below which it stays on the calling thread: a
/// hand-off to the pool costs a few µs, a decode step's attention over a short prefix less.
const PARALLEL_ATTENTION: usize = 1 << 17;

/// Causal grouped-query attention of the `t` new queries (`[t, heads, d]`) over the cached
/// keys and values (`[kv_heads, capacity, d]`, positions `0..start + t` valid): query `i` sees
/// positions `0..=start + i`, and query head `h` reads key/value head `h / (heads / kv_heads)`
/// (HF `repeat_kv`). Softmax in f32 with the row maximum subtracted. The (query, head) pairs
/// are shared out among the pool's threads when the layer's work is worth it.
pub(super) fn attention(q: &[f32], kc: &[f32], vc: &[f32], s: AttnShape, out: &mut [f32]) {
    let d = s.d;
    let parallel = s.t * (s.start + s.t) * s.heads * d >= PARALLEL_ATTENTION;
    // Read once per layer, not per (query, head).
    let avx2 = cfg!(target_arch = "x86_64")
        && d.is_multiple_of(8)
        && burn_mapped::host::cpu_tier() >= burn_mapped::host::CpuTier::Avx2;
    burn_mapped::host::for_each_piece(out, d, parallel, &|first, piece| {
        let mut scores = vec![0f32; s.start + s.t];
        for (n, o) in piece.chunks_exact_mut(d).enumerate() {
            let (i, h) = ((first + n) / s.heads, (first + n) % s.heads);
            attend(q, kc, vc, s, i, h, avx2, &mut scores, o);
        }
    });
}

/// Query `i`, head `h` of [`attention`] into `o` (`d` values), `scores` its scratch; `avx2`:
/// the CPU tier has AVX2 and FMA and `d` is a multiple of 8.
#[allow(clippy::too_many_arguments)]
fn attend(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    s: AttnShape,
    i: usize,
    h: usize,
    avx2: bool,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let d = s.d;
    let scale = 1.0 / (d as f32).sqrt();
    let len = s.start + i + 1;
    let base = (h / (s.heads / s.kv_heads)) * s.capacity * d;
    let at = (i * s.heads + h) * d;
    let qh = &q[at..at + d];
    let keys = &kc[base..base + len * d];
    let values = &vc[base..base + len * d];
    let scores = &mut scores[..len];
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is set only where the process's CPU tier (chosen only where the CPU
        // has them) has AVX2 and FMA, and `d` is a multiple of 8; the slices hold `len` keys
        // and values of `d` values, `qh` and `o` `d` values.
        unsafe {
            x86::scores(qh, keys, scale, scores);
            softmax(scores);
            x86::weighted(scores, values, o);
        }
        return;
    }
    for (j, score) in scores.iter_mut().enumerate() {
        *score = dot(qh, &keys[j * d..(j + 1) * d]) * scale;
    }
    softmax(scores);
    o.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        for (a, &v) in o.iter_mut().zip(&values[j * d..(j + 1) * d]) {
            *a += p * v;
        }
    }
}

/// `scores` as probabilities: in f32, the maximum subtracted.
fn softmax(scores: &mut [f32]) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        sum += *score;
    }
    let inv = 1.0 / sum;
    for score in scores.iter_mut() {
        *score *= inv;
    }
}

/// Dot product in eight independent lanes, so it vectorizes.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Sum of the eight lanes.
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// `scores[j] = scale * q . keys[j]` (`keys`: `scores.len()` rows of `q.len()` values), four
    /// keys at a time, each its own chain of FMAs.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `q.len()` is a multiple of 8; `keys` holds
    /// `scores.len() * q.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores(q: &[f32], keys: &[f32], scale: f32, scores: &mut [f32]) {
        let d = q.len();
        assert!(
            d.is_multiple_of(8) && keys.len() == scores.len() * d,
            "attention operands"
        );
        let (qp, kp) = (q.as_ptr(), keys.as_ptr());
        let len = scores.len();
        let mut j = 0;
        // SAFETY: every load is 8 values at `c < d` of `q` or of key `j + k < len`.
        unsafe {
            while j + 4 <= len {
                let mut acc = [_mm256_setzero_ps(); 4];
                for c in (0..d).step_by(8) {
                    let qv = _mm256_loadu_ps(qp.add(c));
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp.add((j + k) * d + c)), *a);
                    }
                }
                for (k, a) in acc.into_iter().enumerate() {
                    scores[j + k] = hsum(a) * scale;
                }
                j += 4;
            }
            while j < len {
                let mut a = _mm256_setzero_ps();
                for c in (0..d).step_by(8) {
                    a = _mm256_fmadd_ps(
                        _mm256_loadu_ps(qp.add(c)),
                        _mm256_loadu_ps(kp.add(j * d + c)),
                        a,
                    );
                }
                scores[j] = hsum(a) * scale;
                j += 1;
            }
        }
    }

    /// `o = sum_j p[j] * values[j]` (`values`: `p.len()` rows of `o.len()` values), the output
    /// in registers: 64 columns at a time, then 8.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `o.len()` is a multiple of 8; `values` holds
    /// `p.len() * o.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted(p: &[f32], values: &[f32], o: &mut [f32]) {
        let d = o.len();
        assert!(
            d.is_multiple_of(8) && values.len() == p.len() * d,
            "attention operands"
        );
        let vp = values.as_ptr();
        let mut c0 = 0;
        // SAFETY: every load is 8 values at column `c0 + 8k < d` of a row `j < p.len()`; every
        // store 8 values of `o` below `d`.
        unsafe {
            while c0 + 64 <= d {
                let mut acc = [_mm256_setzero_ps(); 8];
                for (j, &pj) in p.iter().enumerate() {
                    let w = _mm256_set1_ps(pj);
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(vp.add(j * d + c0 + 8 * k)), *a);
                    }
                }
                for (k, a) in acc.into_iter().enumerate() {
                    _mm256_storeu_ps(o.as_mut_ptr().add(c0 + 8 * k), a);
                }
                c0 += 64;
            }
            while c0 < d {
                let mut a = _mm256_setzero_ps();
                for (j, &pj) in p.iter().enumerate() {
                    a = _mm256_fmadd_ps(_mm256_set1_ps(pj), _mm256_loadu_ps(vp.add(j * d + c0)), a);
                }
                _mm256_storeu_ps(o.as_mut_ptr().add(c0), a);
                c0 += 8;
            }
        }
    }
}
