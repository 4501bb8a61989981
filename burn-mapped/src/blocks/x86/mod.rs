//! The block kernels in x86-64 vector code, twice: with AVX2's `vpmaddubsw` + `vpmaddwd` for
//! the unsigned-by-signed byte dot product, and with AVX-512 VNNI's `vpdpbusd` (on 256-bit
//! registers), which does the same in one instruction and adds it to a start value; the VNNI
//! variant also takes AVX-512 BW's byte masks for Q5_0's fifth bit and a ternary logic
//! instruction for Q6_K's. Both give, per 32 values, eight i32 lanes of which lanes 0-3 cover
//! values 0-15 and lanes 4-7 values 16-31 (what Q6_K's two scales per 32 need).
//!
//! [`rows`](avx2::rows) runs one kernel per weight row and tile of up to
//! [`TILE_T`](super::act::TILE_T) activation rows, each row with its own accumulators (at
//! `T <= 2` two per row, alternating between blocks, so the chain of additions is half as
//! long). Weight rows are read one after the other, a single stream through memory that the
//! hardware prefetchers follow. The tile's activations are interleaved by block
//! ([`Tile`](super::act::Tile)), so one pointer reaches every row's values, scale and sum at
//! fixed offsets.
//!
//! Per 32 values the kernels keep work off the scalar units: a weight scale is broadcast as
//! an f16 and converted in the vector unit. Integer offsets are exact in the integer dot,
//! whose start value holds `offset * -sum(a)` in lane 0 (AVX2 adds it): Q5_0's 16, and with
//! VNNI Q8_0's 128, its values made unsigned by flipping their sign bit (AVX2 moves Q8_0's
//! signs onto the activations instead: 255 * 127 would saturate `vpmaddubsw`'s pair sums).
//! The K-quants take a block's eight or sixteen scales (and Q4_K's minima) as vectors once per
//! 256 values and subtract minimum or offset times the activation sums with one vector FMA
//! per 256 values and row; Q4_K also forms its eight `d * scale * d_a` at once and feeds them
//! to the FMAs as broadcast memory operands.
//!
//! The loops index with raw pointers: [`rows`](avx2::rows) checks once that the weights
//! hold the slab's rows and that every activation row holds as many values as a weight row,
//! which bounds every access.

#[macro_use]
mod wide;

/// Runs `$body` for every `$b` in `0..$blocks`, alternating `$h` between accumulator sets
/// 0 and `set::<T>(1)` (two independent chains per product where that is 1).
macro_rules! two_sets {
    ($blocks:expr, $t:ident, |$b:ident, $h:ident| $body:block) => {{
        let blocks = $blocks;
        let mut i = 0;
        while i + 2 <= blocks {
            {
                let ($b, $h) = (i, 0);
                $body
            }
            {
                let ($b, $h) = (i + 1, set::<$t>(1));
                $body
            }
            i += 2;
        }
        if i < blocks {
            let ($b, $h) = (i, 0);
            $body
        }
    }};
}

macro_rules! kernels {
    ($name:ident, $features:literal, $wide_r:literal, $wide_g:literal, { $($isa:item)* }) => {
        pub(super) mod $name {
            use std::arch::x86_64::*;

            use crate::blocks::act::{ACT_BLOCK, Acts, SUM_SPAN, TILE_T, Tile};
            use crate::gguf::format::GgmlType;

            $($isa)*

            wide_kernels!($features, $wide_r, $wide_g);

            /// # Safety
            /// `p` points to 32 readable bytes.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn load(p: *const u8) -> __m256i {
                // SAFETY: the caller's contract.
                unsafe { _mm256_loadu_si256(p.cast()) }
            }

            /// The f16 at `p` as f32 in all eight lanes (a broadcast, then a conversion that
            /// writes the whole register).
            ///
            /// # Safety
            /// `p` points to two readable bytes.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn f16x8(p: *const u8) -> __m256 {
                // SAFETY: the caller's contract.
                let h = unsafe { p.cast::<i16>().read_unaligned() };
                _mm256_cvtph_ps(_mm_set1_epi16(h))
            }

            /// `x` in lane 0, zeros elsewhere.
            #[target_feature(enable = $features)]
            #[inline]
            fn lane0(x: i32) -> __m256i {
                _mm256_setr_epi32(x, 0, 0, 0, 0, 0, 0, 0)
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
            }

            /// Which of the two accumulator sets chunk `c` adds to: at `T <= 2` they
            /// alternate, to halve the chain of additions each product waits on.
            #[inline(always)]
            const fn set<const T: usize>(c: usize) -> usize {
                if T <= 2 { c & 1 } else { 0 }
            }

            /// The sums of both accumulator sets, per activation row.
            #[target_feature(enable = $features)]
            #[inline]
            fn finish<const T: usize>(acc: [[__m256; T]; 2]) -> [f32; T] {
                let mut out = [0f32; T];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = hsum(_mm256_add_ps(acc[0][j], acc[1][j]));
                }
                out
            }

            /// A tile of `T` activation rows as the kernels read it: values, scales, and
            /// `-16 * sum` and `-128 * sum` of block `b` of row `j` at index `b * T + j` from
            /// `q` (times 32), `d`, `off16` and `off128`; scales and `scale * sum` per 32 and
            /// per 16 values by row.
            struct Act<const T: usize> {
                q: *const u8,
                d: *const f32,
                off16: *const i32,
                off128: *const i32,
                dr: [*const f32; T],
                ds32: [*const f32; T],
                ds16: [*const f32; T],
            }

            impl<const T: usize> Act<T> {
                fn new(tile: &Tile<'_>, acts: &Acts<'_>, t0: usize) -> Self {
                    assert_eq!(tile.rows, T, "tile rows");
                    Act {
                        q: tile.q.as_ptr().cast(),
                        d: tile.d.as_ptr(),
                        off16: tile.off16.as_ptr(),
                        off128: tile.off128.as_ptr(),
                        dr: std::array::from_fn(|j| acts.d(t0 + j).as_ptr()),
                        ds32: std::array::from_fn(|j| acts.ds32(t0 + j).as_ptr()),
                        ds16: std::array::from_fn(|j| acts.ds16(t0 + j).as_ptr()),
                    }
                }
            }

            /// Bytes past the weights being read that the K-quant kernels ask the cache for:
            /// the hardware's stream prefetchers stop at each 4 KiB page, so a stream of rows
            /// would otherwise wait on memory at every page. The lines go to L2 (`T1`), two
            /// pages ahead: at 7B (mostly Q4_K and Q6_K) on 2 Zen 4 cores, decode 1.16× that of
            /// 2 KiB into L1 (docs/PERFORMANCE.md, "K-quant prefetch"). Q5_0 and Q8_0 rows
            /// prefetch per pair of rows instead ([`PAIR_AHEAD`]).
            const PREFETCH_AHEAD: usize = 8192;

            /// Bytes past the weights being read that a decode step's Q5_0 and Q8_0 pairs ask
            /// the cache for ([`Job::run_pairs`]: every line of the pair's rows, that far
            /// on). Those rows are short (616 and 952 bytes at 0.5B), so a pair's lines ask
            /// once each rather than per block, where a prefetch per block measured slower.
            /// On 2 Xeon (AVX-512 VNNI, AMX) cores, 0.5B decode: 36 tok/s without, 45 at
            /// 8 KiB, 50-51 at 1-2 KiB (docs/PERFORMANCE.md, "Q5_0 and Q8_0 rows in pairs,
            /// prefetched").
            const PAIR_AHEAD: usize = 2048;

            /// Prefetches `LINES` cache lines into L2 from [`PREFETCH_AHEAD`] bytes past `p`.
            #[target_feature(enable = $features)]
            #[inline]
            fn prefetch_ahead<const LINES: usize>(p: *const u8) {
                for l in 0..LINES {
                    prefetch_at::<PREFETCH_AHEAD>(p.wrapping_add(64 * l));
                }
            }

            /// Prefetches the cache line `AHEAD` bytes past `p` into L2.
            #[target_feature(enable = $features)]
            #[inline]
            fn prefetch_at<const AHEAD: usize>(p: *const u8) {
                // A prefetch reads nothing and never faults, whatever the address.
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(AHEAD).cast());
            }

            /// A kernel: one weight row of `blocks` blocks against a tile of `T` rows.
            type Kernel<const T: usize> = unsafe fn(*const u8, usize, &Act<T>) -> [f32; T];

            /// Rows `start..start + rows` of `w` (`row_bytes` each, whole blocks of `ty`)
            /// against the `t` activation rows of `acts`, into `dst` (`[rows, t]`), `bias`
            /// (indexed by row) added.
            ///
            /// # Safety
            ///
            /// The CPU must have the features this module is compiled for.
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
                dst: &mut [f32],
            ) {
                let (bb, be) = (ty.type_size() as usize, ty.block_size() as usize);
                let blocks = row_bytes / bb;
                assert!(
                    row_bytes % bb == 0
                        && w.len() >= (start + rows) * row_bytes
                        && dst.len() == rows * t
                        && bias.is_none_or(|b| b.len() >= start + rows)
                        && acts.inp() == blocks * be
                        && acts.rows() == t,
                    "block rows, activations and output disagree on their sizes"
                );
                // With one tile, each call runs the whole slab; with more, one row at a time
                // through every tile, so the row's bytes stay in L1 for the later tiles.
                let step = if t <= TILE_T { rows } else { 1 };
                let mut o = 0;
                while o < rows {
                    let n = step.min(rows - o);
                    let mut t0 = 0;
                    while t0 < t {
                        let tile = acts.tile(t0);
                        let tt = tile.rows;
                        let job = Job {
                            w: w.as_ptr().wrapping_add((start + o) * row_bytes),
                            row_bytes,
                            blocks,
                            rows: n,
                            bias: bias.map(|b| &b[start + o..start + o + n]),
                            dst: &mut dst[o * t..(o + n) * t],
                            t,
                            t0,
                        };
                        macro_rules! by_t {
                            ($k:ident) => {
                                // SAFETY: the assertion above: rows `start + o..start + o + n`
                                // of `w` hold `blocks` blocks each, and every activation row
                                // `blocks * be` values with their scales and sums.
                                unsafe {
                                    match tt {
                                        1 => job.run::<1>($k::<1>, &Act::new(&tile, acts, t0)),
                                        2 => job.run::<2>($k::<2>, &Act::new(&tile, acts, t0)),
                                        3 => job.run::<3>($k::<3>, &Act::new(&tile, acts, t0)),
                                        4 => job.run::<4>($k::<4>, &Act::new(&tile, acts, t0)),
                                        5 => job.run::<5>($k::<5>, &Act::new(&tile, acts, t0)),
                                        6 => job.run::<6>($k::<6>, &Act::new(&tile, acts, t0)),
                                        7 => job.run::<7>($k::<7>, &Act::new(&tile, acts, t0)),
                                        8 => job.run::<8>($k::<8>, &Act::new(&tile, acts, t0)),
                                        _ => unreachable!("tiles hold 1..={TILE_T} rows"),
                                    }
                                }
                            };
                        }
                        // SAFETY (the two pair arms): as `by_t!`'s.
                        match ty {
                            GgmlType::Q8_0 if tt == 1 => unsafe {
                                job.run_pairs(q8_0_pair, q8_0::<1>, &Act::new(&tile, acts, t0))
                            },
                            GgmlType::Q5_0 if tt == 1 => unsafe {
                                job.run_pairs(q5_0_pair, q5_0::<1>, &Act::new(&tile, acts, t0))
                            },
                            GgmlType::Q8_0 => by_t!(q8_0),
                            GgmlType::Q5_0 => by_t!(q5_0),
                            GgmlType::Q4_K => by_t!(q4_k),
                            GgmlType::Q6_K => by_t!(q6_k),
                            other => unreachable!(
                                "BlockLayout admits no product for {}",
                                other.name()
                            ),
                        }
                        t0 += tt;
                    }
                    o += n;
                }
            }

            /// Consecutive weight rows against one tile, into columns `t0..` of `dst`.
            struct Job<'a> {
                w: *const u8,
                row_bytes: usize,
                blocks: usize,
                rows: usize,
                bias: Option<&'a [f32]>,
                /// `[rows, t]`.
                dst: &'a mut [f32],
                t: usize,
                t0: usize,
            }

            impl Job<'_> {
                /// # Safety
                /// The CPU has this module's features; `w` holds `rows` rows of `blocks`
                /// blocks, `row_bytes` apart; `a` a tile of rows of `blocks` blocks.
                #[target_feature(enable = $features)]
                unsafe fn run<const T: usize>(self, k: Kernel<T>, a: &Act<T>) {
                    for o in 0..self.rows {
                        // SAFETY: the caller's contract.
                        let res = unsafe { k(self.w.add(o * self.row_bytes), self.blocks, a) };
                        let b = self.bias.map_or(0.0, |b| b[o]);
                        let out = &mut self.dst[o * self.t + self.t0..][..T];
                        for (y, r) in out.iter_mut().zip(res) {
                            *y = r + b;
                        }
                    }
                }
            }

            /// A pair kernel: two consecutive weight rows (`stride` bytes apart) of `blocks`
            /// blocks against one activation row.
            type Pair = unsafe fn(*const u8, usize, usize, &Act<1>) -> [f32; 2];

            impl Job<'_> {
                /// [`Job::run`] for one activation row (a decode step), two weight rows at a
                /// time through `pair`: each activation block is loaded once for both rows,
                /// and the rows' sums are two independent chains. An odd last row runs `one`.
                ///
                /// # Safety
                /// As [`Job::run`].
                #[target_feature(enable = $features)]
                unsafe fn run_pairs(self, pair: Pair, one: Kernel<1>, a: &Act<1>) {
                    let mut o = 0;
                    while o < self.rows {
                        let n = (self.rows - o).min(2);
                        let w = self.w.wrapping_add(o * self.row_bytes);
                        // The next rows' lines, while this pair runs.
                        let mut l = 0;
                        while l < n * self.row_bytes {
                            prefetch_at::<PAIR_AHEAD>(w.wrapping_add(l));
                            l += 64;
                        }
                        // SAFETY: the caller's contract: rows `o..o + n` are within `w`.
                        let res = unsafe {
                            if n == 2 {
                                pair(w, self.row_bytes, self.blocks, a)
                            } else {
                                [one(w, self.blocks, a)[0], 0.0]
                            }
                        };
                        for (i, r) in res.into_iter().take(n).enumerate() {
                            let b = self.bias.map_or(0.0, |b| b[o + i]);
                            self.dst[(o + i) * self.t + self.t0] = r + b;
                        }
                        o += n;
                    }
                }
            }

            /// The sums of a pair kernel's two accumulator sets, per weight row.
            #[target_feature(enable = $features)]
            #[inline]
            fn finish_pair(acc: [[__m256; 2]; 2]) -> [f32; 2] {
                [
                    hsum(_mm256_add_ps(acc[0][0], acc[1][0])),
                    hsum(_mm256_add_ps(acc[0][1], acc[1][1])),
                ]
            }

            /// [`q8_0`] for two weight rows against one activation row ([`Pair`]).
            ///
            /// # Safety
            /// `w` holds two rows of `blocks` blocks, `stride` bytes apart; `a`'s row as many.
            #[target_feature(enable = $features)]
            unsafe fn q8_0_pair(w: *const u8, stride: usize, blocks: usize, a: &Act<1>) -> [f32; 2] {
                const ONE: usize = 1;
                let mut acc = [[_mm256_setzero_ps(); 2]; 2];
                two_sets!(blocks, ONE, |b, h| {
                    // SAFETY: block `b` of both weight rows and of the activation row.
                    unsafe {
                        let av = load(a.q.add(ACT_BLOCK * b));
                        let init = q8_init(a.off128.add(b));
                        let da = _mm256_set1_ps(*a.d.add(b));
                        for r in 0..2 {
                            let p = w.add(r * stride + 34 * b);
                            let wv = load(p.add(2));
                            let s = _mm256_cvtepi32_ps(dot(init, q8_u(wv), q8_a(av, wv)));
                            let c = _mm256_mul_ps(f16x8(p), da);
                            acc[h][r] = _mm256_fmadd_ps(s, c, acc[h][r]);
                        }
                    }
                });
                finish_pair(acc)
            }

            /// [`q5_0`] for two weight rows against one activation row ([`Pair`]).
            ///
            /// # Safety
            /// As [`q8_0_pair`].
            #[target_feature(enable = $features)]
            unsafe fn q5_0_pair(w: *const u8, stride: usize, blocks: usize, a: &Act<1>) -> [f32; 2] {
                const ONE: usize = 1;
                let mut acc = [[_mm256_setzero_ps(); 2]; 2];
                two_sets!(blocks, ONE, |b, h| {
                    // SAFETY: block `b` of both weight rows and of the activation row.
                    unsafe {
                        let av = load(a.q.add(ACT_BLOCK * b));
                        let init = lane0(*a.off16.add(b));
                        let da = _mm256_set1_ps(*a.d.add(b));
                        for r in 0..2 {
                            let p = w.add(r * stride + 22 * b);
                            let s = _mm256_cvtepi32_ps(dot(init, q5_0_u(p), av));
                            let c = _mm256_mul_ps(f16x8(p), da);
                            acc[h][r] = _mm256_fmadd_ps(s, c, acc[h][r]);
                        }
                    }
                });
                finish_pair(acc)
            }

            /// Q8_0: signed values, made unsigned by [`q8_u`] against [`q8_a`]'s activations,
            /// the dot starting at [`q8_init`].
            ///
            /// # Safety
            /// `w` holds `blocks` blocks; every row of `a` as many values with their scales
            /// and sums.
            #[target_feature(enable = $features)]
            unsafe fn q8_0<const T: usize>(w: *const u8, blocks: usize, a: &Act<T>) -> [f32; T] {
                let mut acc = [[_mm256_setzero_ps(); T]; 2];
                two_sets!(blocks, T, |b, h| {
                    // SAFETY: block `b` of the weight row and of every activation row.
                    unsafe {
                        let p = w.add(34 * b);
                        let d = f16x8(p);
                        let wv = load(p.add(2));
                        let u = q8_u(wv);
                        for j in 0..T {
                            let at = b * T + j;
                            let av = q8_a(load(a.q.add(ACT_BLOCK * at)), wv);
                            let s = _mm256_cvtepi32_ps(dot(q8_init(a.off128.add(at)), u, av));
                            let c = _mm256_mul_ps(d, _mm256_set1_ps(*a.d.add(at)));
                            acc[h][j] = _mm256_fmadd_ps(s, c, acc[h][j]);
                        }
                    }
                });
                finish(acc)
            }

            /// Q5_0: 5-bit unsigned values (nibble plus a bit of `qh`, [`q5_0_u`]), offset
            /// 16: the dot starts at `-16 * sum(a)`.
            ///
            /// # Safety
            /// As [`q8_0`].
            #[target_feature(enable = $features)]
            unsafe fn q5_0<const T: usize>(w: *const u8, blocks: usize, a: &Act<T>) -> [f32; T] {
                let mut acc = [[_mm256_setzero_ps(); T]; 2];
                two_sets!(blocks, T, |b, h| {
                    // SAFETY: block `b` of the weight row and of every activation row.
                    unsafe {
                        let p = w.add(22 * b);
                        let d = f16x8(p);
                        let u = q5_0_u(p);
                        for j in 0..T {
                            let at = b * T + j;
                            let init = lane0(*a.off16.add(at));
                            let s = _mm256_cvtepi32_ps(dot(init, u, load(a.q.add(ACT_BLOCK * at))));
                            let c = _mm256_mul_ps(d, _mm256_set1_ps(*a.d.add(at)));
                            acc[h][j] = _mm256_fmadd_ps(s, c, acc[h][j]);
                        }
                    }
                });
                finish(acc)
            }

            /// Q4_K's eight 6-bit scales and minima of the 12 bytes at `p`, as f32:
            /// sub-blocks 0-3 take the low 6 bits of bytes 0-3 (scales) and 4-7 (minima);
            /// 4-7 a nibble of bytes 8-11 below the top 2 bits of bytes 0-3 (scales) and 4-7
            /// (minima).
            ///
            /// # Safety
            /// `p` points to 16 readable bytes.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn q4_k_scales(p: *const u8) -> (__m256, __m256) {
                // SAFETY: the caller's contract.
                let x = unsafe { _mm_loadu_si128(p.cast()) };
                // Words a, b, c (bytes 0-3, 4-7, 8-11) as [a, c, b, c >> 4] and [a, a, b, b].
                let low = _mm_srlv_epi32(_mm_shuffle_epi32::<0x98>(x), _mm_setr_epi32(0, 0, 0, 4));
                let low = _mm_and_si128(
                    low,
                    _mm_setr_epi32(0x3F3F_3F3F, 0x0F0F_0F0F, 0x3F3F_3F3F, 0x0F0F_0F0F),
                );
                let top = _mm_srli_epi32::<2>(_mm_shuffle_epi32::<0x50>(x));
                let top = _mm_and_si128(top, _mm_setr_epi32(0, 0x3030_3030, 0, 0x3030_3030));
                // Bytes 0-7 the scales, 8-15 the minima.
                let v = _mm_or_si128(low, top);
                (
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v))),
                )
            }

            /// Q4_K: eight sub-blocks of 32 nibbles, each with a 6-bit scale and minimum.
            ///
            /// # Safety
            /// As [`q8_0`].
            #[target_feature(enable = $features)]
            unsafe fn q4_k<const T: usize>(w: *const u8, blocks: usize, a: &Act<T>) -> [f32; T] {
                let mut acc = [[_mm256_setzero_ps(); T]; 2];
                let low4 = _mm256_set1_epi8(0x0F);
                for sb in 0..blocks {
                    // SAFETY: super-block `sb` of `w` (144 bytes), blocks `8sb..8sb + 8` of
                    // every activation row.
                    unsafe {
                        let p = w.add(144 * sb);
                        prefetch_ahead::<3>(p);
                        // [d, dmin] repeated, then each in every lane.
                        let dd = _mm256_cvtph_ps(_mm_set1_epi32(p.cast::<i32>().read_unaligned()));
                        let (sc, m) = q4_k_scales(p.add(4));
                        let scd = _mm256_mul_ps(sc, _mm256_moveldup_ps(dd));
                        let md = _mm256_mul_ps(m, _mm256_movehdup_ps(dd));
                        for j in 0..T {
                            let ds = _mm256_loadu_ps(a.ds32[j].add(8 * sb));
                            acc[0][j] = _mm256_fnmadd_ps(md, ds, acc[0][j]);
                        }
                        // Each sub-block's `d * scale * d_a`, per activation row: one multiply
                        // per 256 values, kept in memory (`black_box`) so that each FMA below
                        // takes its coefficient as a broadcast operand, not a lane shuffle and
                        // a multiply of its own.
                        let mut coef = [[0f32; 8]; T];
                        for j in 0..T {
                            let da = _mm256_loadu_ps(a.dr[j].add(8 * sb));
                            _mm256_storeu_ps(coef[j].as_mut_ptr(), _mm256_mul_ps(scd, da));
                        }
                        let coef = std::hint::black_box(&coef);
                        for g in 0..4 {
                            let qv = load(p.add(16 + 32 * g));
                            let us = [
                                _mm256_and_si256(qv, low4),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(qv), low4),
                            ];
                            for (k, u) in us.into_iter().enumerate() {
                                let c = 2 * g + k;
                                for j in 0..T {
                                    let at = (8 * sb + c) * T + j;
                                    let s = _mm256_cvtepi32_ps(dot0(u, load(a.q.add(ACT_BLOCK * at))));
                                    let cf = _mm256_broadcast_ss(&coef[j][c]);
                                    let h = set::<T>(k);
                                    acc[h][j] = _mm256_fmadd_ps(s, cf, acc[h][j]);
                                }
                            }
                        }
                    }
                }
                finish(acc)
            }

            /// Q6_K: 6-bit unsigned values offset by 32, a signed 8-bit scale per 16.
            ///
            /// # Safety
            /// As [`q8_0`].
            #[target_feature(enable = $features)]
            unsafe fn q6_k<const T: usize>(w: *const u8, blocks: usize, a: &Act<T>) -> [f32; T] {
                let mut acc = [[_mm256_setzero_ps(); T]; 2];
                let low4 = _mm256_set1_epi8(0x0F);
                // Lanes `2k` (four times) then `2k + 1`: chunk `k`'s two scales per 16.
                let mut pick = [_mm256_setzero_si256(); 4];
                for (k, p) in pick.iter_mut().enumerate() {
                    let i = 2 * k as i32;
                    *p = _mm256_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1);
                }
                for sb in 0..blocks {
                    // SAFETY: super-block `sb` of `w` (210 bytes), blocks `8sb..8sb + 8` of
                    // every activation row.
                    unsafe {
                        let p = w.add(210 * sb);
                        prefetch_ahead::<4>(p);
                        let d = f16x8(p.add(208));
                        let sc = _mm_loadu_si128(p.add(192).cast());
                        // Scales of sub-blocks 0-7 and 8-15, times `d`.
                        let s16 = [
                            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))),
                            _mm256_mul_ps(
                                d,
                                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc))),
                            ),
                        ];
                        // The offset, 32, times each scale per 16 and the activation sums.
                        let thirty_two = _mm256_set1_ps(32.0);
                        let off = [_mm256_mul_ps(s16[0], thirty_two), _mm256_mul_ps(s16[1], thirty_two)];
                        for j in 0..T {
                            let ds = a.ds16[j].add(ACT_BLOCK / SUM_SPAN * 8 * sb);
                            acc[0][j] = _mm256_fnmadd_ps(off[0], _mm256_loadu_ps(ds), acc[0][j]);
                            acc[1][j] =
                                _mm256_fnmadd_ps(off[1], _mm256_loadu_ps(ds.add(8)), acc[1][j]);
                        }
                        for half in 0..2 {
                            let ql0 = load(p.add(64 * half));
                            let ql1 = load(p.add(64 * half + 32));
                            let qh = load(p.add(128 + 32 * half));
                            let vals = [
                                q6_k_merge(_mm256_and_si256(ql0, low4), _mm256_slli_epi16::<4>(qh)),
                                q6_k_merge(_mm256_and_si256(ql1, low4), _mm256_slli_epi16::<2>(qh)),
                                q6_k_merge(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4),
                                    qh,
                                ),
                                q6_k_merge(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                                    _mm256_srli_epi16::<2>(qh),
                                ),
                            ];
                            for (k, u) in vals.into_iter().enumerate() {
                                let sc = _mm256_permutevar8x32_ps(s16[half], pick[k]);
                                for j in 0..T {
                                    let at = (8 * sb + 4 * half + k) * T + j;
                                    let s = _mm256_cvtepi32_ps(dot0(u, load(a.q.add(ACT_BLOCK * at))));
                                    let cf = _mm256_mul_ps(sc, _mm256_set1_ps(*a.d.add(at)));
                                    let h = set::<T>(k);
                                    acc[h][j] = _mm256_fmadd_ps(s, cf, acc[h][j]);
                                }
                            }
                        }
                    }
                }
                finish(acc)
            }
        }
    };
}

kernels!(avx2, "avx2,fma,f16c", 2, 2, {
    /// `init + ` eight i32 sums of four `u[i] * a[i]` each (`u` at most 128, or the 16-bit
    /// pair sums could saturate).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn dot(init: __m256i, u: __m256i, a: __m256i) -> __m256i {
        _mm256_add_epi32(init, dot0(u, a))
    }

    /// Eight i32 sums of four `u[i] * a[i]` each (`u` at most 128).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn dot0(u: __m256i, a: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1))
    }

    /// Q8_0's values as the dot's unsigned operand: their magnitudes (at most 128).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn q8_u(w: __m256i) -> __m256i {
        _mm256_sign_epi8(w, w)
    }

    /// The activations against [`q8_u`]: with the weights' signs.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn q8_a(a: __m256i, w: __m256i) -> __m256i {
        _mm256_sign_epi8(a, w)
    }

    /// Where Q8_0's dot starts: at zero.
    ///
    /// # Safety
    /// None: `_off128` is not read.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn q8_init(_off128: *const i32) -> __m256i {
        _mm256_setzero_si256()
    }

    /// Q5_0's 32 unsigned 5-bit values of the block at `p`: the low nibbles of its 16
    /// bytes, then the high ones, each with bit 4 from `qh` (bit `i` for value `i`).
    ///
    /// # Safety
    /// `p` points to a Q5_0 block (22 bytes).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn q5_0_u(p: *const u8) -> __m256i {
        // SAFETY: the caller's contract: bytes 2-5 are `qh`, 6-21 the nibbles.
        let (qh, qs) = unsafe {
            (
                p.add(2).cast::<i32>().read_unaligned(),
                _mm_loadu_si128(p.add(6).cast()),
            )
        };
        let both = _mm256_srlv_epi64(
            _mm256_broadcastsi128_si256(qs),
            _mm256_setr_epi64x(0, 0, 4, 4),
        );
        let nib = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
        // Byte `i` of `qh` to bytes 8i..8i + 8, then bit `i % 8` of each.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
    }

    /// Q6_K's 6-bit values: the nibbles `low` (high half clear) with bits 4-5 of `high`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn q6_k_merge(low: __m256i, high: __m256i) -> __m256i {
        _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(0x30)))
    }

    /// Q8_0's values as the wide kernels keep them: as they are (the dot needs their signs).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn wide_q8_store(w: __m256i) -> __m256i {
        w
    }

    /// `acc + ` the dot of Q8_0 values `w` (kept by [`wide_q8_store`]) with `a`: their
    /// magnitudes against the activations with the values' signs.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn wide_q8_dot(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        dot(acc, q8_u(w), q8_a(a, w))
    }

    /// Where a wide Q8_0 dot starts, from minus the activations' sums: at zero.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn wide_q8_init(_neg_sum: __m256i) -> __m256i {
        _mm256_setzero_si256()
    }
});

kernels!(
    vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    4,
    2,
    {
        /// `init + ` eight i32 sums of four `u[i] * a[i]` each.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn dot(init: __m256i, u: __m256i, a: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(init, u, a)
        }

        /// Eight i32 sums of four `u[i] * a[i]` each.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn dot0(u: __m256i, a: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a)
        }

        /// Q8_0's values as the dot's unsigned operand: plus 128 (the sign bit flipped).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn q8_u(w: __m256i) -> __m256i {
            _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN))
        }

        /// The activations against [`q8_u`]: as they are.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn q8_a(a: __m256i, _w: __m256i) -> __m256i {
            a
        }

        /// Where Q8_0's dot starts: at `-128 * sum(a)` (read from `off128`), for the 128 that
        /// [`q8_u`] adds to every value.
        ///
        /// # Safety
        /// `off128` points to an i32.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn q8_init(off128: *const i32) -> __m256i {
            // SAFETY: the caller's contract.
            lane0(unsafe { *off128 })
        }

        /// Q5_0's 32 unsigned 5-bit values of the block at `p`: the low nibbles of its 16
        /// bytes, then the high ones, plus 16 where bit `i` of `qh` is set (`qh` is the mask).
        ///
        /// # Safety
        /// `p` points to a Q5_0 block (22 bytes).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn q5_0_u(p: *const u8) -> __m256i {
            // SAFETY: the caller's contract: bytes 2-5 are `qh`, 6-21 the nibbles.
            let (qh, qs) = unsafe {
                (
                    p.add(2).cast::<u32>().read_unaligned(),
                    _mm_loadu_si128(p.add(6).cast()),
                )
            };
            let both = _mm256_srlv_epi64(
                _mm256_broadcastsi128_si256(qs),
                _mm256_setr_epi64x(0, 0, 4, 4),
            );
            let high = _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10));
            // (both & 0x0F) | high
            _mm256_ternarylogic_epi32::<0xEA>(both, _mm256_set1_epi8(0x0F), high)
        }

        /// Q6_K's 6-bit values: the nibbles `low` (high half clear) with bits 4-5 of `high`, in
        /// one ternary logic instruction.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn q6_k_merge(low: __m256i, high: __m256i) -> __m256i {
            // low | (high & 0x30)
            _mm256_ternarylogic_epi32::<0xF8>(low, high, _mm256_set1_epi8(0x30))
        }

        /// Q8_0's values as the wide kernels keep them: plus 128 ([`q8_u`]).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn wide_q8_store(w: __m256i) -> __m256i {
            q8_u(w)
        }

        /// `acc + ` the dot of Q8_0 values kept by [`wide_q8_store`] with `a`.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn wide_q8_dot(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(acc, w, a)
        }

        /// Where a wide Q8_0 dot starts, from minus the activations' sums: at `-128 * sum`,
        /// for the 128 that [`wide_q8_store`] adds to every value.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn wide_q8_init(neg_sum: __m256i) -> __m256i {
            _mm256_slli_epi32::<7>(neg_sum)
        }
    }
);
