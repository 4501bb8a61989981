//! The q8 GEMV/GEMM on the host: int8 weights read in place from their (mapped) storage.
//!
//! Work is split by output rows into slabs ([`Slabs`]); each slab walks its rows once and,
//! for every small block of rows, runs all activation tiles against it while those rows are
//! still in cache, so any `T` costs one pass over the weights in DRAM. Activation rows are
//! taken in tiles of at most [`TILE_T`]; a block of `R` rows times a tile of `TT` columns
//! keeps `R * TT = 8` vector accumulators live (see [`block_shape`]).
//!
//! On x86_64 with AVX2 and FMA (detected at run time) the inner loop is explicit 256-bit
//! code: sign-extend 8 int8 to i32, convert to f32, fused multiply-add with 8 activations.
//! Elsewhere a portable loop over `[f32; 8]` lane arrays lets LLVM vectorize for the target
//! baseline. Both accumulate in f32 in 8 lanes and add the lanes at the end of a row.

use burn::tensor::f16;

use crate::pool;
use crate::pool::TASKS_PER_THREAD;
use crate::slabs::Slabs;

/// Most activation columns one tile holds; larger `T` is split into tiles of this size.
const TILE_T: usize = 4;
/// Vector width, in f32 lanes, of the accumulators.
const LANES: usize = 8;
/// Smallest slab of weight bytes worth a task of its own: below this, handing work to another
/// worker costs more than it saves.
const MIN_BYTES_PER_THREAD: usize = 256 * 1024;

/// How many slabs a large matrix is split into for `requested` (0: the pool's choice,
/// [`TASKS_PER_THREAD`] per thread of [`pool::threads`]; see
/// [`Tuning::host_threads`](super::Tuning::host_threads)).
pub(super) fn threads(requested: usize) -> usize {
    match requested {
        0 => pool::threads() * TASKS_PER_THREAD,
        n => n,
    }
}

/// Which inner loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    /// Plain Rust over lane arrays.
    Portable,
    /// x86_64 AVX2 + FMA intrinsics.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Isa {
    /// The loop of the process's CPU tier ([`crate::host::cpu_tier`]); q8 has no AVX-512 loop,
    /// so that tier runs the AVX2 one.
    pub(super) fn detect() -> Self {
        match crate::host::cpu_tier() {
            crate::host::CpuTier::Scalar => Isa::Portable,
            #[cfg(target_arch = "x86_64")]
            _ => Isa::Avx2,
            #[cfg(not(target_arch = "x86_64"))]
            _ => Isa::Portable,
        }
    }
}

/// The name of the inner loop this machine runs (for benchmark reports).
pub fn cpu_kernel_name() -> &'static str {
    match Isa::detect() {
        Isa::Portable => "portable",
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => "avx2+fma",
    }
}

/// Operands of one product `y[t, o] = scale[o] * sum_i x[t, i] * w[o, i] + bias[o]`.
#[derive(Clone, Copy)]
pub(super) struct Gemm<'a> {
    /// `[t, inp]` row-major.
    pub x: &'a [f32],
    /// `[out, inp]` row-major.
    pub w: &'a [i8],
    /// `[out]`.
    pub scales: &'a [f16],
    /// `[out]`.
    pub bias: Option<&'a [f32]>,
    pub t: usize,
    pub out: usize,
    pub inp: usize,
}

/// Computes the product into a new `[t, out]` buffer. The buffer starts as NaN, so an
/// element the kernel failed to write shows up in any comparison.
pub(super) fn gemm(args: Gemm<'_>, isa: Isa, threads: usize) -> Vec<f32> {
    gemm_split(args, isa, threads, MIN_BYTES_PER_THREAD)
}

/// [`gemm`] with the per-thread minimum as a parameter, so tests can force many threads on
/// small matrices.
fn gemm_split(args: Gemm<'_>, isa: Isa, threads: usize, min_bytes: usize) -> Vec<f32> {
    let Gemm { t, out, inp, .. } = args;
    assert_eq!(args.x.len(), t * inp, "q8 cpu: x length");
    assert_eq!(args.w.len(), out * inp, "q8 cpu: weight length");
    assert_eq!(args.scales.len(), out, "q8 cpu: scale length");
    if let Some(b) = args.bias {
        assert_eq!(b.len(), out, "q8 cpu: bias length");
    }
    // Rows are handed out in multiples of 8 so every thread but the last runs full blocks.
    let slabs = Slabs {
        row_bytes: inp,
        min_bytes,
        threads,
        row_multiple: 8,
    };
    slabs.run(out, t, |start, rows, dst| {
        rows_into(args, isa, start, rows, dst)
    })
}

/// `(R, TT)`: rows per block and activation columns per tile, with `R * TT` accumulators.
fn block_shape(t: usize) -> (usize, usize) {
    match t.min(TILE_T) {
        1 => (8, 1),
        2 => (4, 2),
        tt => (2, tt),
    }
}

/// Computes output rows `start..start + rows` for every activation row into `dst`
/// (`[rows, t]`).
fn rows_into(args: Gemm<'_>, isa: Isa, start: usize, rows: usize, dst: &mut [f32]) {
    let t = args.t;
    let (r_block, _) = block_shape(t);
    let mut o = start;
    while o < start + rows {
        let r = r_block.min(start + rows - o);
        let mut t0 = 0;
        while t0 < t {
            let tt = TILE_T.min(t - t0);
            let mut acc = [[0f32; TILE_T]; 8];
            block(args, isa, o, r, t0, tt, &mut acc);
            for (k, acc_row) in acc.iter().enumerate().take(r) {
                let row = o + k;
                let s = args.scales[row].to_f32();
                let b = args.bias.map_or(0.0, |b| b[row]);
                for (j, &a) in acc_row.iter().enumerate().take(tt) {
                    dst[(row - start) * t + t0 + j] = s * a + b;
                }
            }
            t0 += tt;
        }
        o += r;
    }
}

/// Raw dot products of rows `o..o + r` with activation rows `t0..t0 + tt` into `acc`.
fn block(
    args: Gemm<'_>,
    isa: Isa,
    o: usize,
    r: usize,
    t0: usize,
    tt: usize,
    acc: &mut [[f32; TILE_T]; 8],
) {
    let inp = args.inp;
    let w = |k: usize| &args.w[(o + k) * inp..(o + k + 1) * inp];
    let x = |j: usize| &args.x[(t0 + j) * inp..(t0 + j + 1) * inp];
    // The rows the next block will read (fewer at the end of the matrix).
    let next_block = |r: usize| {
        let start = ((o + r) * inp).min(args.w.len());
        &args.w[start..((o + 2 * r) * inp).min(args.w.len())]
    };
    macro_rules! run {
        ($r:literal, $tt:literal) => {{
            let ws: [&[i8]; $r] = std::array::from_fn(w);
            let xs: [&[f32]; $tt] = std::array::from_fn(x);
            let res = match isa {
                Isa::Portable => dot_portable::<$r, $tt>(ws, xs),
                // SAFETY: `Isa::Avx2` comes only from a CPU tier the CPU supports
                // (`CpuTier::supported`: AVX2, FMA and F16C at least).
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { avx2::dot::<$r, $tt>(ws, xs, next_block($r)) },
            };
            for k in 0..$r {
                acc[k][..$tt].copy_from_slice(&res[k]);
            }
        }};
    }
    // Row counts without a kernel of their own: one row at a time.
    macro_rules! row_by_row {
        ($tt:literal) => {
            for k in 0..r {
                run_one::<$tt>(args, isa, o + k, t0, acc, k)
            }
        };
    }
    match (r, tt) {
        (8, 1) => run!(8, 1),
        (4, 2) => run!(4, 2),
        (4, 1) => run!(4, 1),
        (2, 1) => run!(2, 1),
        (2, 2) => run!(2, 2),
        (2, 3) => run!(2, 3),
        (2, 4) => run!(2, 4),
        (_, 1) => row_by_row!(1),
        (_, 2) => row_by_row!(2),
        (_, 3) => row_by_row!(3),
        (_, 4) => row_by_row!(4),
        _ => unreachable!("tiles hold 1..={TILE_T} columns"),
    }
}

/// One leftover row (fewer rows remain than a block holds).
fn run_one<const TT: usize>(
    args: Gemm<'_>,
    isa: Isa,
    row: usize,
    t0: usize,
    acc: &mut [[f32; TILE_T]; 8],
    k: usize,
) {
    let inp = args.inp;
    let ws = [&args.w[row * inp..(row + 1) * inp]];
    let xs: [&[f32]; TT] = std::array::from_fn(|j| &args.x[(t0 + j) * inp..(t0 + j + 1) * inp]);
    let res = match isa {
        Isa::Portable => dot_portable::<1, TT>(ws, xs),
        // SAFETY: `Isa::Avx2` comes only from a CPU tier the CPU supports (AVX2 and FMA).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot::<1, TT>(ws, xs, &[]) },
    };
    acc[k][..TT].copy_from_slice(&res[0]);
}

/// `R x TT` dot products over lane arrays; the fixed-size inner loops vectorize.
#[inline(always)]
fn dot_portable<const R: usize, const TT: usize>(w: [&[i8]; R], x: [&[f32]; TT]) -> [[f32; TT]; R] {
    let n = x.first().map_or(0, |x| x.len());
    let full = n - n % LANES;
    let mut acc = [[[0f32; LANES]; TT]; R];
    let mut i = 0;
    while i < full {
        let mut wv = [[0f32; LANES]; R];
        for (k, wk) in wv.iter_mut().enumerate() {
            let src: &[i8; LANES] = w[k][i..i + LANES].try_into().expect("in bounds");
            for l in 0..LANES {
                wk[l] = f32::from(src[l]);
            }
        }
        for j in 0..TT {
            let xv: &[f32; LANES] = x[j][i..i + LANES].try_into().expect("in bounds");
            for k in 0..R {
                for l in 0..LANES {
                    acc[k][j][l] += wv[k][l] * xv[l];
                }
            }
        }
        i += LANES;
    }
    let mut res = [[0f32; TT]; R];
    for k in 0..R {
        for j in 0..TT {
            let mut s = hsum(&acc[k][j]);
            for c in full..n {
                s += f32::from(w[k][c]) * x[j][c];
            }
            res[k][j] = s;
        }
    }
    res
}

fn hsum(v: &[f32; LANES]) -> f32 {
    ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{LANES, hsum};

    /// `R x TT` dot products with 256-bit FMA, prefetching `next` (the following block's
    /// rows) at the pace this block is read: short rows make `R` short streams that the
    /// hardware prefetcher does not ramp up for, so narrow matrices (Qwen2's 896-wide rows)
    /// would otherwise read far below the memory's rate while wide ones do not.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA. All slices of `w` and `x` must have the same length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot<const R: usize, const TT: usize>(
        w: [&[i8]; R],
        x: [&[f32]; TT],
        next: &[i8],
    ) -> [[f32; TT]; R] {
        let n = x.first().map_or(0, |x| x.len());
        for wk in &w {
            assert_eq!(wk.len(), n, "q8 avx2: row lengths differ");
        }
        for xj in &x {
            assert_eq!(xj.len(), n, "q8 avx2: activation lengths differ");
        }
        let full = n - n % LANES;
        let mut acc = [[_mm256_setzero_ps(); TT]; R];
        let mut i = 0;
        while i < full {
            // Each step reads `8 * R` bytes of this block; fetch as many of the next.
            if i * R < next.len() {
                // SAFETY: the address lies inside `next`; a prefetch reads nothing into the
                // program and cannot fault.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(i * R).cast()) };
            }
            let mut wv = [_mm256_setzero_ps(); R];
            for k in 0..R {
                // SAFETY: `i + 8 <= full <= n == w[k].len()`, so the 8 bytes read are in
                // bounds; the load has no alignment requirement.
                let bytes = unsafe { _mm_loadl_epi64(w[k].as_ptr().add(i).cast()) };
                wv[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
            }
            for j in 0..TT {
                // SAFETY: `i + 8 <= n == x[j].len()`; unaligned load.
                let xv = unsafe { _mm256_loadu_ps(x[j].as_ptr().add(i)) };
                for k in 0..R {
                    acc[k][j] = _mm256_fmadd_ps(wv[k], xv, acc[k][j]);
                }
            }
            i += LANES;
        }
        let mut res = [[0f32; TT]; R];
        for k in 0..R {
            for j in 0..TT {
                let mut lanes = [0f32; LANES];
                // SAFETY: `lanes` holds exactly 8 f32; unaligned store.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[k][j]) };
                let mut s = hsum(&lanes);
                for c in full..n {
                    s += f32::from(w[k][c]) * x[j][c];
                }
                res[k][j] = s;
            }
        }
        res
    }
}

/// Unit tests reach the portable and AVX2 inner loops directly, which the public op cannot
/// select; the public op is tested against an f64 reference in `tests/suite/q8_cpu.rs`.
#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn every_inner_loop_matches_an_f64_reference() {
        let mut isas = vec![Isa::Portable];
        if Isa::detect() != Isa::Portable {
            isas.push(Isa::detect());
        }
        let mut seed = 7;
        for &(out, inp) in &[(37, 53), (8, 8), (1, 1), (19, 64), (3, 0)] {
            let w: Vec<i8> = (0..out * inp)
                .map(|_| ((lcg(&mut seed) % 255) as i32 - 127) as i8)
                .collect();
            let scales: Vec<f16> = (0..out)
                .map(|_| f16::from_f32(0.001 + (lcg(&mut seed) % 1000) as f32 * 1e-4))
                .collect();
            let bias: Vec<f32> = (0..out).map(|o| o as f32 * 0.25 - 3.0).collect();
            for t in (1..=8).chain([11]) {
                let x: Vec<f32> = (0..t * inp)
                    .map(|_| (lcg(&mut seed) % 20001) as f32 * 1e-4 - 1.0)
                    .collect();
                for &isa in &isas {
                    for threads in [1, 3] {
                        let args = Gemm {
                            x: &x,
                            w: &w,
                            scales: &scales,
                            bias: Some(&bias),
                            t,
                            out,
                            inp,
                        };
                        let y = gemm_split(args, isa, threads, 1);
                        for tt in 0..t {
                            for o in 0..out {
                                let s = f64::from(scales[o].to_f32());
                                let (mut dot, mut mag) = (0f64, 0f64);
                                for i in 0..inp {
                                    let p = f64::from(w[o * inp + i]) * f64::from(x[tt * inp + i]);
                                    dot += p;
                                    mag += p.abs();
                                }
                                let want = s * dot + f64::from(bias[o]);
                                let tol = (inp as f64 + 4.0)
                                    * f64::from(f32::EPSILON)
                                    * (s * mag + f64::from(bias[o]).abs());
                                let got = f64::from(y[tt * out + o]);
                                assert!(
                                    (got - want).abs() <= tol,
                                    "{isa:?} threads={threads} [{out},{inp}] t={tt}/{t} o={o}: {got} vs {want} (tol {tol})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
