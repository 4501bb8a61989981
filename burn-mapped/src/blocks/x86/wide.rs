//! The prompt kernels: many activation rows ([`WIDE_T`](crate::blocks::act::WIDE_T) or more)
//! against the same weights, as a matrix product.
//!
//! A decode step's kernels take a weight row's bytes once per tile of eight activation rows
//! and pay, per 32 values and activation row, an integer dot, its conversion to f32 and two
//! multiplies: fine for one row, and the bound on a prompt. Here the activation rows come in
//! lane groups ([`Lanes`]): each 32-bit lane of a register holds four values of one of eight
//! rows, so a weight row's four values broadcast to every lane meet eight activation rows in one
//! dot instruction, and one conversion and one FMA per 32 values serve all eight. A weight row
//! is decoded once per token block (its values as unsigned bytes, its coefficients as f32) into
//! a scratch buffer that stays in L1, and `R` rows run against `G` lane groups at once, so each
//! activation register is reused `R` times and each broadcast `G` times.
//!
//! Integer offsets (Q5_0's 16, Q6_K's 32, and with VNNI Q8_0's 128 after its values are made
//! unsigned) start the dot at `offset * -sum`; Q4_K's minima are subtracted in f32 against
//! `scale * sum`.

/// Defines `wide::rows` in an ISA module of [`kernels`], from its `dot`, `load`, `q5_0_u`,
/// `q6_k_merge`, `wide_q8_store`, `wide_q8_dot` and `wide_q8_init`, with `R` weight rows and
/// `G` lane groups per step.
macro_rules! wide_kernels {
    ($features:literal, $r:literal, $g:literal) => {
        pub(crate) mod wide {
            use std::arch::x86_64::*;

            use super::{dot, load, q5_0_u, q6_k_merge, wide_q8_dot, wide_q8_init, wide_q8_store};
            use crate::blocks::act::{ACT_BLOCK, Acts, LANE_BLOCK, LANES, Lanes};
            use crate::blocks::kernel::Cols;
            use crate::gguf::format::{GgmlType, f16_at, q4_k_scale_min};

            /// Weight rows per step.
            const R: usize = $r;
            /// Lane groups per step.
            const G: usize = $g;
            /// Activation bytes one token block may take: about half of a core's L2, so the
            /// block stays there while every weight row of the slab runs against it.
            const ACT_BUDGET: usize = 384 * 1024;

            /// The block types, as a const parameter.
            const Q8: u8 = 0;
            const Q5: u8 = 1;
            const Q4K: u8 = 2;
            const Q6K: u8 = 3;

            /// Up to `R` weight rows decoded: values as the dot's unsigned operand, and per
            /// 32 values the multiplier of each 16 and (Q4_K) the minimum's coefficient.
            struct Decoded {
                u: Vec<u8>,
                mul: Vec<f32>,
                min: Vec<f32>,
                inp: usize,
            }

            /// Rows `start..start + rows` of `w` against every activation row of `acts` (in
            /// lane groups), into those columns of `cols` (`[t, out]`), `bias` (indexed by
            /// row) added.
            ///
            /// # Safety
            ///
            /// The CPU has this module's features; `w` holds rows `start..start + rows` of
            /// `row_bytes` bytes, whole blocks of `ty` whose values number `acts.inp()`;
            /// `cols` has `t` rows of at least `start + rows` columns, writable, which no
            /// other thread touches meanwhile.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn rows(
                ty: GgmlType,
                w: &[u8],
                row_bytes: usize,
                acts: &Acts<'_>,
                t: usize,
                start: usize,
                rows: usize,
                bias: Option<&[f32]>,
                cols: Cols,
            ) {
                let lanes = acts.lanes().expect("wide kernels run on lane groups");
                let inp = acts.inp();
                let chunks = inp / ACT_BLOCK;
                assert!(
                    lanes.groups == t.div_ceil(LANES)
                        && lanes.q.len() == lanes.groups * chunks * LANE_BLOCK
                        && lanes.f.len() == lanes.groups * chunks * 2 * LANES
                        && lanes.i.len() == lanes.groups * chunks * 3 * LANES
                        && w.len() >= (start + rows) * row_bytes
                        && cols.stride >= start + rows
                        && bias.is_none_or(|b| b.len() >= start + rows),
                    "lane groups, weights and output disagree on their sizes"
                );
                // SAFETY: the caller's contract and the assertion above.
                unsafe {
                    match ty {
                        GgmlType::Q8_0 => {
                            run::<Q8>(w, row_bytes, lanes, inp, t, start, rows, bias, cols)
                        }
                        GgmlType::Q5_0 => {
                            run::<Q5>(w, row_bytes, lanes, inp, t, start, rows, bias, cols)
                        }
                        GgmlType::Q4_K => {
                            run::<Q4K>(w, row_bytes, lanes, inp, t, start, rows, bias, cols)
                        }
                        GgmlType::Q6_K => {
                            run::<Q6K>(w, row_bytes, lanes, inp, t, start, rows, bias, cols)
                        }
                        other => unreachable!("BlockLayout admits no product for {}", other.name()),
                    }
                }
            }

            /// [`rows`] for one block type: token blocks, then `R` rows decoded at a time,
            /// then `G` lane groups at a time.
            ///
            /// # Safety
            /// As [`rows`], with the sizes checked.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            unsafe fn run<const K: u8>(
                w: &[u8],
                row_bytes: usize,
                lanes: &Lanes,
                inp: usize,
                t: usize,
                start: usize,
                rows: usize,
                bias: Option<&[f32]>,
                cols: Cols,
            ) {
                let chunks = inp / ACT_BLOCK;
                let mut dec = Decoded {
                    u: vec![0; R * inp],
                    mul: vec![0.0; R * chunks * 2],
                    min: vec![0.0; R * chunks],
                    inp,
                };
                let per_block = (ACT_BUDGET / (LANES * inp)).max(G);
                let mut g0 = 0;
                while g0 < lanes.groups {
                    let g1 = (g0 + per_block).min(lanes.groups);
                    let mut o = 0;
                    while o < rows {
                        let n = R.min(rows - o);
                        for r in 0..n {
                            let row =
                                &w[(start + o + r) * row_bytes..(start + o + r + 1) * row_bytes];
                            // SAFETY: `row` holds the blocks of `inp` values.
                            unsafe { decode::<K>(row, r, &mut dec) };
                        }
                        let mut g = g0;
                        while g < g1 {
                            let m = G.min(g1 - g);
                            // SAFETY: groups `g..g + m` exist; decoded rows `0..n` are set.
                            unsafe {
                                if n == R && m == G {
                                    let acc = step::<K, R, G>(&dec, 0, lanes, chunks, g);
                                    store(&acc, start + o, g, t, bias, cols);
                                } else {
                                    for r in 0..n {
                                        for gg in g..g + m {
                                            let acc = step::<K, 1, 1>(&dec, r, lanes, chunks, gg);
                                            store(&acc, start + o + r, gg, t, bias, cols);
                                        }
                                    }
                                }
                            }
                            g += m;
                        }
                        o += n;
                    }
                    g0 = g1;
                }
            }

            /// The sums of `acc` (weight rows from `o`, lane groups from `g`) plus the bias,
            /// into their columns of `cols`, the lanes past `t` left out.
            ///
            /// # Safety
            /// As [`rows`]' `cols`, for columns `o..o + RR`.
            #[target_feature(enable = $features)]
            unsafe fn store<const RR: usize, const GG: usize>(
                acc: &[[__m256; GG]; RR],
                o: usize,
                g: usize,
                t: usize,
                bias: Option<&[f32]>,
                cols: Cols,
            ) {
                for (r, row) in acc.iter().enumerate() {
                    let b = _mm256_set1_ps(bias.map_or(0.0, |b| b[o + r]));
                    for (gi, &v) in row.iter().enumerate() {
                        let t0 = (g + gi) * LANES;
                        let mut lane = [0f32; LANES];
                        // SAFETY: `lane` holds eight f32.
                        unsafe { _mm256_storeu_ps(lane.as_mut_ptr(), _mm256_add_ps(v, b)) };
                        for (j, &y) in lane.iter().enumerate().take(t - t0) {
                            // SAFETY: row `t0 + j < t`, column `o + r`: the caller's contract.
                            unsafe { *cols.base.add((t0 + j) * cols.stride + o + r) = y };
                        }
                    }
                }
            }

            /// Weight row `row` (whole blocks of `K`) into slot `r` of `dec`.
            ///
            /// # Safety
            /// The CPU has this module's features; `row` holds `dec.inp` values of `K`.
            #[target_feature(enable = $features)]
            unsafe fn decode<const K: u8>(row: &[u8], r: usize, dec: &mut Decoded) {
                let inp = dec.inp;
                let chunks = inp / ACT_BLOCK;
                let u = &mut dec.u[r * inp..(r + 1) * inp];
                let mul = &mut dec.mul[r * chunks * 2..(r + 1) * chunks * 2];
                let min = &mut dec.min[r * chunks..(r + 1) * chunks];
                match K {
                    Q8 => {
                        assert_eq!(row.len(), chunks * 34, "Q8_0 row");
                        for c in 0..chunks {
                            let d = f16_at(row, 34 * c);
                            mul[2 * c..2 * c + 2].fill(d);
                            // SAFETY: block `c` is 34 bytes, its values at 2-33.
                            put(
                                u,
                                c,
                                wide_q8_store(unsafe { load(row.as_ptr().add(34 * c + 2)) }),
                            );
                        }
                    }
                    Q5 => {
                        assert_eq!(row.len(), chunks * 22, "Q5_0 row");
                        for c in 0..chunks {
                            let d = f16_at(row, 22 * c);
                            mul[2 * c..2 * c + 2].fill(d);
                            // SAFETY: block `c` is 22 bytes.
                            put(u, c, unsafe { q5_0_u(row.as_ptr().add(22 * c)) });
                        }
                    }
                    Q4K => {
                        assert_eq!(row.len(), chunks / 8 * 144, "Q4_K row");
                        let low4 = _mm256_set1_epi8(0x0F);
                        for (sb, p) in row.chunks_exact(144).enumerate() {
                            let (d, dmin) = (f16_at(p, 0), f16_at(p, 2));
                            for k in 0..8 {
                                let (sc, m) = q4_k_scale_min(k, &p[4..16]);
                                let c = 8 * sb + k;
                                mul[2 * c..2 * c + 2].fill(d * f32::from(sc));
                                min[c] = dmin * f32::from(m);
                            }
                            for g in 0..4 {
                                // SAFETY: bytes 16.. of the super-block are 128 nibble bytes.
                                let qv = unsafe { load(p.as_ptr().add(16 + 32 * g)) };
                                put(u, 8 * sb + 2 * g, _mm256_and_si256(qv, low4));
                                put(
                                    u,
                                    8 * sb + 2 * g + 1,
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(qv), low4),
                                );
                            }
                        }
                    }
                    _ => {
                        assert_eq!(row.len(), chunks / 8 * 210, "Q6_K row");
                        let low4 = _mm256_set1_epi8(0x0F);
                        for (sb, p) in row.chunks_exact(210).enumerate() {
                            let d = f16_at(p, 208);
                            for half in 0..2 {
                                for k in 0..4 {
                                    let c = 8 * sb + 4 * half + k;
                                    for h in 0..2 {
                                        let sc = p[192 + 8 * half + 2 * k + h] as i8;
                                        mul[2 * c + h] = d * f32::from(sc);
                                    }
                                }
                                // SAFETY: the super-block's low bits at 0-127, high at 128-191.
                                let (ql0, ql1, qh) = unsafe {
                                    (
                                        load(p.as_ptr().add(64 * half)),
                                        load(p.as_ptr().add(64 * half + 32)),
                                        load(p.as_ptr().add(128 + 32 * half)),
                                    )
                                };
                                let vals = [
                                    q6_k_merge(
                                        _mm256_and_si256(ql0, low4),
                                        _mm256_slli_epi16::<4>(qh),
                                    ),
                                    q6_k_merge(
                                        _mm256_and_si256(ql1, low4),
                                        _mm256_slli_epi16::<2>(qh),
                                    ),
                                    q6_k_merge(
                                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4),
                                        qh,
                                    ),
                                    q6_k_merge(
                                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                                        _mm256_srli_epi16::<2>(qh),
                                    ),
                                ];
                                for (k, v) in vals.into_iter().enumerate() {
                                    put(u, 8 * sb + 4 * half + k, v);
                                }
                            }
                        }
                    }
                }
            }

            /// `v` into chunk `c` (32 bytes) of `u`.
            #[target_feature(enable = $features)]
            #[inline]
            fn put(u: &mut [u8], c: usize, v: __m256i) {
                let dst = &mut u[32 * c..32 * c + 32];
                // SAFETY: `dst` is 32 writable bytes.
                unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
            }

            /// Decoded rows `r0..r0 + RR` against lane groups `g..g + GG`, every chunk: per
            /// row and group, the eight activation rows' sums.
            ///
            /// # Safety
            /// The CPU has this module's features; the rows are decoded, the groups exist.
            #[target_feature(enable = $features)]
            unsafe fn step<const K: u8, const RR: usize, const GG: usize>(
                dec: &Decoded,
                r0: usize,
                lanes: &Lanes,
                chunks: usize,
                g: usize,
            ) -> [[__m256; GG]; RR] {
                let mut acc = [[_mm256_setzero_ps(); GG]; RR];
                let (q, f, iv) = (lanes.q.as_ptr(), lanes.f.as_ptr(), lanes.i.as_ptr());
                let u = dec.u.as_ptr();
                for c in 0..chunks {
                    let at: [usize; GG] = std::array::from_fn(|gi| (g + gi) * chunks + c);
                    // SAFETY: every `at` is a block of an existing group; the decoded rows
                    // hold `chunks` chunks.
                    unsafe {
                        // Where each dot starts: the offset times minus the sum, per lane.
                        let init: [[__m256i; GG]; 2] = std::array::from_fn(|h| {
                            std::array::from_fn(|gi| {
                                let s = iv.add(at[gi] * 3 * LANES);
                                match K {
                                    Q8 => wide_q8_init(load(s.cast())),
                                    Q5 => _mm256_slli_epi32::<4>(load(s.cast())),
                                    Q4K => _mm256_setzero_si256(),
                                    _ => {
                                        _mm256_slli_epi32::<5>(load(s.add((1 + h) * LANES).cast()))
                                    }
                                }
                            })
                        });
                        let mut lo = [init[0]; RR];
                        let mut hi = [init[1]; RR];
                        for k in 0..8 {
                            let a: [__m256i; GG] = std::array::from_fn(|gi| {
                                load(q.add(at[gi] * LANE_BLOCK + k * ACT_BLOCK).cast())
                            });
                            for r in 0..RR {
                                let wb = _mm256_set1_epi32(
                                    u.add((r0 + r) * dec.inp + ACT_BLOCK * c + 4 * k)
                                        .cast::<i32>()
                                        .read_unaligned(),
                                );
                                for gi in 0..GG {
                                    if K == Q8 {
                                        lo[r][gi] = wide_q8_dot(lo[r][gi], wb, a[gi]);
                                    } else if K == Q6K && k >= 4 {
                                        hi[r][gi] = dot(hi[r][gi], wb, a[gi]);
                                    } else {
                                        lo[r][gi] = dot(lo[r][gi], wb, a[gi]);
                                    }
                                }
                            }
                        }
                        for r in 0..RR {
                            let row = r0 + r;
                            let m = dec.mul.as_ptr().add((row * chunks + c) * 2);
                            for gi in 0..GG {
                                let d = _mm256_loadu_ps(f.add(at[gi] * 2 * LANES));
                                let c0 = _mm256_mul_ps(_mm256_set1_ps(*m), d);
                                acc[r][gi] =
                                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[r][gi]), c0, acc[r][gi]);
                                if K == Q6K {
                                    let c1 = _mm256_mul_ps(_mm256_set1_ps(*m.add(1)), d);
                                    acc[r][gi] = _mm256_fmadd_ps(
                                        _mm256_cvtepi32_ps(hi[r][gi]),
                                        c1,
                                        acc[r][gi],
                                    );
                                }
                                if K == Q4K {
                                    let ds = _mm256_loadu_ps(f.add(at[gi] * 2 * LANES + LANES));
                                    let mn =
                                        _mm256_set1_ps(*dec.min.as_ptr().add(row * chunks + c));
                                    acc[r][gi] = _mm256_fnmadd_ps(mn, ds, acc[r][gi]);
                                }
                            }
                        }
                    }
                }
                acc
            }
        }
    };
}
