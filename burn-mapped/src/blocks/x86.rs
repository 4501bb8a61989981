//! The block kernels in x86-64 vector code, twice: with AVX2's `vpmaddubsw` + `vpmaddwd` for
//! the unsigned-by-signed byte dot product, and with AVX-512 VNNI's `vpdpbusd`, which does
//! the same in one instruction. Both give, per 32 values, eight i32 lanes of which lanes 0-3
//! cover values 0-15 and lanes 4-7 values 16-31 (what Q6_K's two scales per 32 need).
//!
//! The loops index with raw pointers: [`row`](avx2::row) checks once that the weight row and
//! every activation row hold the same number of values, which bounds every access.

macro_rules! kernels {
    ($name:ident, $features:literal, |$u:ident, $a:ident| $dot:expr) => {
        pub(super) mod $name {
            use std::arch::x86_64::*;

            use crate::blocks::act::{ACT_BLOCK, Acts, TILE_T};
            use crate::gguf::format::{GgmlType, q4_k_scale_min};

            /// Eight i32 sums of four `u[i] * a[i]` each.
            #[target_feature(enable = $features)]
            #[inline]
            fn dot($u: __m256i, $a: __m256i) -> __m256i {
                $dot
            }

            /// The f16 at `p` as f32.
            ///
            /// Written as two instructions: left to the compiler, converting one f16 becomes
            /// an insert into some other register (only lane 0 is used, so any register will
            /// do), which may be a live accumulator, and chains every block to the previous one
            /// through it. `vmovd` writes the whole register.
            ///
            /// # Safety
            /// `p` points to two readable bytes.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn f16(p: *const u8) -> f32 {
                // SAFETY: the caller's contract.
                let h = u32::from(unsafe { p.cast::<u16>().read_unaligned() });
                let out: f32;
                // SAFETY: F16C is among the features this module is compiled for; the two
                // instructions read and write registers only.
                unsafe {
                    std::arch::asm!(
                        "vmovd {x}, {h:e}",
                        "vcvtph2ps {x}, {x}",
                        h = in(reg) h,
                        x = out(xmm_reg) out,
                        options(pure, nomem, nostack, preserves_flags),
                    );
                }
                out
            }

            /// # Safety
            /// `p` points to 32 readable bytes.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn load(p: *const u8) -> __m256i {
                // SAFETY: the caller's contract.
                unsafe { _mm256_loadu_si256(p.cast()) }
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
            }

            /// Where activation row `t0 + j` starts: values, scales, `scale * sum` per 32 and
            /// per 16.
            struct Rows<const T: usize> {
                q: [*const u8; T],
                d: [*const f32; T],
                ds32: [*const f32; T],
                ds16: [*const f32; T],
            }

            impl<const T: usize> Rows<T> {
                fn new(acts: &Acts<'_>, t0: usize) -> Self {
                    Rows {
                        q: std::array::from_fn(|j| acts.q(t0 + j).as_ptr().cast()),
                        d: std::array::from_fn(|j| acts.d(t0 + j).as_ptr()),
                        ds32: std::array::from_fn(|j| acts.ds32(t0 + j).as_ptr()),
                        ds16: std::array::from_fn(|j| acts.ds16(t0 + j).as_ptr()),
                    }
                }
            }

            /// One weight row against activation rows `t0..t0 + tt`.
            ///
            /// # Safety
            ///
            /// The CPU must have the features this module is compiled for.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn row(
                ty: GgmlType,
                w: &[u8],
                acts: &Acts<'_>,
                t0: usize,
                tt: usize,
                res: &mut [f32; TILE_T],
            ) {
                let (bb, be) = (ty.type_size() as usize, ty.block_size() as usize);
                let blocks = w.len() / bb;
                assert!(
                    w.len() % bb == 0 && (t0..t0 + tt).all(|t| acts.q(t).len() == blocks * be),
                    "block row and activations disagree on the row width"
                );
                macro_rules! by_t {
                    ($f:ident) => {
                        // SAFETY: the assertion above: `blocks` whole blocks in `w`, and
                        // `blocks * be` values (with their scales and sums) in every row.
                        unsafe {
                            match tt {
                                1 => $f::<1>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                2 => $f::<2>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                3 => $f::<3>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                4 => $f::<4>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                5 => $f::<5>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                6 => $f::<6>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                7 => $f::<7>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                8 => $f::<8>(w.as_ptr(), blocks, Rows::new(acts, t0), res),
                                _ => unreachable!("tiles hold 1..={TILE_T} rows"),
                            }
                        }
                    };
                }
                match ty {
                    GgmlType::Q8_0 => by_t!(q8_0),
                    GgmlType::Q5_0 => by_t!(q5_0),
                    GgmlType::Q4_K => by_t!(q4_k),
                    GgmlType::Q6_K => by_t!(q6_k),
                    other => unreachable!("BlockLayout admits no product for {}", other.name()),
                }
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn finish<const T: usize>(acc: [__m256; T], off: [f32; T], res: &mut [f32; TILE_T]) {
                for j in 0..T {
                    res[j] = hsum(acc[j]) - off[j];
                }
            }

            /// Q8_0: signed values, so the dot takes `|w|` against `a` with `w`'s sign.
            ///
            /// # Safety
            /// `w` holds `blocks` blocks; each row of `rows` their values, scales and sums.
            #[target_feature(enable = $features)]
            unsafe fn q8_0<const T: usize>(
                w: *const u8,
                blocks: usize,
                rows: Rows<T>,
                res: &mut [f32; TILE_T],
            ) {
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..blocks {
                    // SAFETY: block `b` of `w`, block `b` of every activation row.
                    unsafe {
                        let p = w.add(34 * b);
                        let d = f16(p);
                        let wv = load(p.add(2));
                        let uw = _mm256_sign_epi8(wv, wv);
                        for j in 0..T {
                            let a = _mm256_sign_epi8(load(rows.q[j].add(ACT_BLOCK * b)), wv);
                            let s = _mm256_cvtepi32_ps(dot(uw, a));
                            let c = _mm256_set1_ps(d * *rows.d[j].add(b));
                            acc[j] = _mm256_fmadd_ps(s, c, acc[j]);
                        }
                    }
                }
                finish(acc, [0.0; T], res);
            }

            /// Q5_0: 5-bit unsigned values (nibble plus a bit of `qh`), offset 16.
            ///
            /// # Safety
            /// As [`q8_0`].
            #[target_feature(enable = $features)]
            unsafe fn q5_0<const T: usize>(
                w: *const u8,
                blocks: usize,
                rows: Rows<T>,
                res: &mut [f32; TILE_T],
            ) {
                let mut acc = [_mm256_setzero_ps(); T];
                let mut off = [0f32; T];
                let low4 = _mm256_set1_epi8(0x0F);
                let spread = _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                    3, 3, 3, 3, 3, 3,
                );
                let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                let high = _mm256_set1_epi8(0x10);
                for b in 0..blocks {
                    // SAFETY: block `b` of `w`, block `b` of every activation row.
                    unsafe {
                        let p = w.add(22 * b);
                        let d = f16(p);
                        let qh = p.add(2).cast::<i32>().read_unaligned();
                        let qs = _mm_loadu_si128(p.add(6).cast());
                        let nib =
                            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), low4);
                        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
                        let u = _mm256_or_si256(nib, _mm256_and_si256(set, high));
                        for j in 0..T {
                            let s = _mm256_cvtepi32_ps(dot(u, load(rows.q[j].add(ACT_BLOCK * b))));
                            let c = d * *rows.d[j].add(b);
                            acc[j] = _mm256_fmadd_ps(s, _mm256_set1_ps(c), acc[j]);
                            off[j] += 16.0 * d * *rows.ds32[j].add(b);
                        }
                    }
                }
                finish(acc, off, res);
            }

            /// Q4_K: eight sub-blocks of 32 nibbles, each with a 6-bit scale and minimum.
            ///
            /// # Safety
            /// As [`q8_0`].
            #[target_feature(enable = $features)]
            unsafe fn q4_k<const T: usize>(
                w: *const u8,
                blocks: usize,
                rows: Rows<T>,
                res: &mut [f32; TILE_T],
            ) {
                let mut acc = [_mm256_setzero_ps(); T];
                let mut off = [0f32; T];
                let low4 = _mm256_set1_epi8(0x0F);
                for sb in 0..blocks {
                    // SAFETY: super-block `sb` of `w` (144 bytes), blocks `8sb..8sb + 8` of
                    // every activation row.
                    unsafe {
                        let p = w.add(144 * sb);
                        let (d, dmin) = (f16(p), f16(p.add(2)));
                        let scales = std::slice::from_raw_parts(p.add(4), 12);
                        for g in 0..4 {
                            let qv = load(p.add(16 + 32 * g));
                            let halves = [
                                _mm256_and_si256(qv, low4),
                                _mm256_and_si256(_mm256_srli_epi16(qv, 4), low4),
                            ];
                            for (h, u) in halves.into_iter().enumerate() {
                                let c = 2 * g + h;
                                let (sc, m) = q4_k_scale_min(c, scales);
                                let (mul, sub) = (d * f32::from(sc), dmin * f32::from(m));
                                let ab = 8 * sb + c;
                                for j in 0..T {
                                    let s = _mm256_cvtepi32_ps(dot(
                                        u,
                                        load(rows.q[j].add(ACT_BLOCK * ab)),
                                    ));
                                    let cf = _mm256_set1_ps(mul * *rows.d[j].add(ab));
                                    acc[j] = _mm256_fmadd_ps(s, cf, acc[j]);
                                    off[j] += sub * *rows.ds32[j].add(ab);
                                }
                            }
                        }
                    }
                }
                finish(acc, off, res);
            }

            /// Q6_K: 6-bit unsigned values offset by 32, a signed 8-bit scale per 16.
            ///
            /// # Safety
            /// As [`q8_0`].
            #[target_feature(enable = $features)]
            unsafe fn q6_k<const T: usize>(
                w: *const u8,
                blocks: usize,
                rows: Rows<T>,
                res: &mut [f32; TILE_T],
            ) {
                let mut acc = [_mm256_setzero_ps(); T];
                let mut off = [0f32; T];
                let low4 = _mm256_set1_epi8(0x0F);
                let two = _mm256_set1_epi8(3);
                for sb in 0..blocks {
                    // SAFETY: super-block `sb` of `w` (210 bytes), blocks `8sb..8sb + 8` of
                    // every activation row.
                    unsafe {
                        let p = w.add(210 * sb);
                        let d = f16(p.add(208));
                        for half in 0..2 {
                            let ql0 = load(p.add(64 * half));
                            let ql1 = load(p.add(64 * half + 32));
                            let qh = load(p.add(128 + 32 * half));
                            let vals = [
                                _mm256_or_si256(
                                    _mm256_and_si256(ql0, low4),
                                    _mm256_slli_epi16(_mm256_and_si256(qh, two), 4),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(ql1, low4),
                                    _mm256_slli_epi16(
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), two),
                                        4,
                                    ),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                    _mm256_slli_epi16(
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 4), two),
                                        4,
                                    ),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                    _mm256_slli_epi16(
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 6), two),
                                        4,
                                    ),
                                ),
                            ];
                            let sc = p.add(192 + 8 * half).cast::<i8>();
                            for (k, u) in vals.into_iter().enumerate() {
                                let sa = d * f32::from(*sc.add(2 * k));
                                let sbb = d * f32::from(*sc.add(2 * k + 1));
                                let ab = 8 * sb + 4 * half + k;
                                for j in 0..T {
                                    let s = _mm256_cvtepi32_ps(dot(
                                        u,
                                        load(rows.q[j].add(ACT_BLOCK * ab)),
                                    ));
                                    let da = *rows.d[j].add(ab);
                                    let (ca, cb) = (sa * da, sbb * da);
                                    let coef = _mm256_setr_ps(ca, ca, ca, ca, cb, cb, cb, cb);
                                    acc[j] = _mm256_fmadd_ps(s, coef, acc[j]);
                                    off[j] += 32.0
                                        * (sa * *rows.ds16[j].add(2 * ab)
                                            + sbb * *rows.ds16[j].add(2 * ab + 1));
                                }
                            }
                        }
                    }
                }
                finish(acc, off, res);
            }
        }
    };
}

kernels!(avx2, "avx2,fma,f16c", |u, a| _mm256_madd_epi16(
    _mm256_maddubs_epi16(u, a),
    _mm256_set1_epi16(1)
));
kernels!(vnni, "avx2,fma,f16c,avx512vnni,avx512vl", |u, a| {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a)
});
