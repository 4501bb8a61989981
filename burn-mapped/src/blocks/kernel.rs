//! The block products on the host: `y[t, o] = sum_i w[o, i] * a[t, i]` with `w` read block by
//! block from its (mapped) bytes and `a` the packed activations of [`super::act`].
//!
//! Work is split by output rows into slabs ([`Slabs`]), as the q8 kernel does, and each slab
//! goes to the inner loop whole. Each row is decoded once per tile of up to [`TILE_T`]
//! activation rows; with more rows the row's bytes (at most a few KiB) stay in L1 while the
//! next tile runs, so any `T` is one pass over the weights in memory. Per 32 values the
//! kernels take an integer dot product of the row's quantized values as unsigned bytes (Q8_0's
//! magnitudes with its signs moved onto the activations, or its values plus 128) with the
//! activation's int8 values, scale it by the block's coefficient in f32, and subtract the
//! block's offset or minimum times the activation sum (in the integer dot where the offset is
//! an integer).

use super::act::{ACT_BLOCK, Acts};
use crate::gguf::BlockLayout;
use crate::gguf::format::{GgmlType, f16_at, q4_k_scale_min};
use crate::slabs::{Slabs, transpose_into};

/// Smallest slab of weight bytes worth a task of its own.
const MIN_BYTES_PER_THREAD: usize = 256 * 1024;

/// Which inner loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    /// Plain Rust.
    Portable,
    /// AVX2 + FMA + F16C: `vpmaddubsw` then `vpmaddwd` per 32 values.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// As `Avx2`, with AVX-512 VNNI's `vpdpbusd` (on 256-bit registers) for the dot product
    /// and AVX-512 BW's byte masks.
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

impl Isa {
    /// The loop of the process's CPU tier ([`crate::host::cpu_tier`]: the best this CPU runs,
    /// or the one `BURN_MAPPED_CPU` pins).
    pub(super) fn detect() -> Self {
        Self::of(crate::host::cpu_tier())
    }

    /// The loop of `tier`.
    fn of(tier: crate::host::CpuTier) -> Self {
        use crate::host::CpuTier;
        match tier {
            CpuTier::Scalar => Isa::Portable,
            #[cfg(target_arch = "x86_64")]
            CpuTier::Avx2 => Isa::Avx2,
            #[cfg(target_arch = "x86_64")]
            CpuTier::Avx512Vnni => Isa::Vnni,
            #[cfg(not(target_arch = "x86_64"))]
            _ => Isa::Portable,
        }
    }

    /// Every loop this CPU can run, for tests that hold each to the definition.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Self> {
        crate::host::CpuTier::ALL
            .into_iter()
            .filter(|t| t.supported())
            .map(Self::of)
            .collect()
    }

    /// Name for reports.
    pub(super) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni => "avx512-vnni",
        }
    }
}

/// Operands of one product.
#[derive(Clone, Copy)]
pub(super) struct Product<'a> {
    /// `[out, layout.row_bytes()]` blocks.
    pub w: &'a [u8],
    pub layout: BlockLayout,
    pub out: usize,
    pub acts: &'a Acts<'a>,
    pub t: usize,
    /// `[out]`.
    pub bias: Option<&'a [f32]>,
}

/// Computes several products over the same activations, each into a new `[t, out]` buffer,
/// in one pass of the thread pool (see [`matmul_many_into`]).
pub(super) fn matmul_many(ps: &[Product<'_>], isa: Isa) -> Vec<Vec<f32>> {
    let mut ys: Vec<Vec<f32>> = ps.iter().map(|p| vec![f32::NAN; p.t * p.out]).collect();
    let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
    matmul_many_into(ps, isa, &mut outs);
    ys
}

/// Computes several products over the same activations into `outs[i]` (`[t, out_i]`,
/// row-major), in one pass of the thread pool: their rows are cut into slabs as if they were
/// one matrix, so the small ones (a layer's key and value) do not each wait for the pool.
pub(super) fn matmul_many_into(ps: &[Product<'_>], isa: Isa, outs: &mut [&mut [f32]]) {
    assert_eq!(
        ps.len(),
        outs.len(),
        "block products: one output per product"
    );
    let t = ps.first().map_or(0, |p| p.t);
    let mut starts = Vec::with_capacity(ps.len());
    let (mut total, mut bytes) = (0, 0);
    for (p, y) in ps.iter().zip(outs.iter()) {
        assert_eq!(p.t, t, "block products over one input: rows");
        assert_eq!(
            p.w.len(),
            p.out * p.layout.row_bytes(),
            "block product: weight length"
        );
        assert_eq!(y.len(), t * p.out, "block product: output length");
        if let Some(b) = p.bias {
            assert_eq!(b.len(), p.out, "block product: bias length");
        }
        starts.push(total);
        total += p.out;
        bytes += p.w.len();
    }
    let slabs = Slabs {
        row_bytes: bytes.div_ceil(total.max(1)),
        min_bytes: MIN_BYTES_PER_THREAD,
        threads: 0,
        row_multiple: 1,
    };
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable
        && let Some(first) = ps.first()
        && first.acts.lanes().is_some()
    {
        // A prompt: each slab writes its rows' columns of the `[t, out]` outputs itself.
        let cols: Vec<Cols> = outs
            .iter_mut()
            .zip(ps)
            .map(|(y, p)| Cols {
                base: y.as_mut_ptr(),
                stride: p.out,
            })
            .collect();
        let cols = SyncCols(cols);
        slabs.each(total, |start, rows| {
            for ((p, &first), &c) in ps.iter().zip(&starts).zip(cols.get()) {
                let lo = start.max(first);
                let hi = (start + rows).min(first + p.out);
                if lo < hi {
                    // SAFETY: `c` is product `p`'s `[t, out]` output, which `outs` holds
                    // mutably borrowed until `each` has returned; this slab writes its rows
                    // `lo - first..hi - first`, columns no other slab writes.
                    unsafe { wide_into(*p, isa, lo - first, hi - lo, c) };
                }
            }
        });
        return;
    }
    let yt = slabs.run_rows(total, t, |start, rows, dst| {
        // The products whose rows meet `start..start + rows`, each on its part of `dst`.
        for (p, &first) in ps.iter().zip(&starts) {
            let lo = start.max(first);
            let hi = (start + rows).min(first + p.out);
            if lo < hi {
                let piece = &mut dst[(lo - start) * t..(hi - start) * t];
                rows_into(*p, isa, lo - first, hi - lo, piece);
            }
        }
    });
    for ((p, &first), y) in ps.iter().zip(&starts).zip(outs.iter_mut()) {
        transpose_into(&yt[first * t..(first + p.out) * t], p.out, t, y);
    }
}

/// The `[t, stride]` row-major output of one product, as the wide kernels write it: element
/// `(row, col)` at `base + row * stride + col`.
#[derive(Clone, Copy)]
pub(super) struct Cols {
    pub base: *mut f32,
    pub stride: usize,
}

/// Each product's [`Cols`], shared by the slabs that write disjoint columns of them.
struct SyncCols(Vec<Cols>);

// SAFETY: the pointers are only written through by slabs whose columns never overlap (see
// `matmul_many_into`), while the outputs they point to stay borrowed; `f32` is `Send`.
unsafe impl Sync for SyncCols {}

impl SyncCols {
    /// The columns (a method, so closures capture `SyncCols` whole, which is `Sync`).
    fn get(&self) -> &[Cols] {
        &self.0
    }
}

/// Output rows `start..start + rows` of `p`, whose activations are in lane groups, into their
/// columns of `cols`.
///
/// # Safety
/// `cols` is `p`'s `[p.t, p.out]` output, writable, and no other thread reads or writes
/// columns `start..start + rows` of it meanwhile.
#[cfg(target_arch = "x86_64")]
unsafe fn wide_into(p: Product<'_>, isa: Isa, start: usize, rows: usize, cols: Cols) {
    let (ty, row_bytes) = (p.layout.ty(), p.layout.row_bytes());
    match isa {
        // SAFETY: `Isa::Avx2` comes only from a tier `CpuTier::supported` found; the
        // caller's contract for `cols`.
        Isa::Avx2 => unsafe {
            super::x86::avx2::wide::rows(ty, p.w, row_bytes, p.acts, p.t, start, rows, p.bias, cols)
        },
        // SAFETY: as above, for AVX-512 VNNI's features.
        Isa::Vnni => unsafe {
            super::x86::vnni::wide::rows(ty, p.w, row_bytes, p.acts, p.t, start, rows, p.bias, cols)
        },
        Isa::Portable => unreachable!("the portable loop reads rows, not lane groups"),
    }
}

/// Output rows `start..start + rows` of `p` into `dst` (`[rows, t]`).
fn rows_into(p: Product<'_>, isa: Isa, start: usize, rows: usize, dst: &mut [f32]) {
    let (ty, row_bytes) = (p.layout.ty(), p.layout.row_bytes());
    match isa {
        Isa::Portable => portable_rows(p, start, rows, dst),
        // SAFETY: `Isa::Avx2` comes only from a tier `CpuTier::supported` found: AVX2, FMA, F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            super::x86::avx2::rows(ty, p.w, row_bytes, p.acts, p.t, start, rows, p.bias, dst)
        },
        // SAFETY: `Isa::Vnni` comes only from a tier `CpuTier::supported` found: AVX2, FMA,
        // F16C, AVX-512 F, BW, VL and VNNI.
        #[cfg(target_arch = "x86_64")]
        Isa::Vnni => unsafe {
            super::x86::vnni::rows(ty, p.w, row_bytes, p.acts, p.t, start, rows, p.bias, dst)
        },
    }
}

/// [`rows_into`] in plain Rust: each weight row's chunks decoded once, then every activation
/// row summed against them in a register.
fn portable_rows(p: Product<'_>, start: usize, rows: usize, dst: &mut [f32]) {
    let (ty, row_bytes) = (p.layout.ty(), p.layout.row_bytes());
    let per_block = ty.block_size() as usize / ACT_BLOCK;
    let mut chunks = Vec::new();
    for o in start..start + rows {
        chunks.clear();
        for block in p.w[o * row_bytes..(o + 1) * row_bytes].chunks_exact(ty.type_size() as usize) {
            chunks.extend((0..per_block).map(|c| chunk(ty, block, c)));
        }
        let bias = p.bias.map_or(0.0, |b| b[o]);
        for t in 0..p.t {
            let (q, d, ds16) = (p.acts.q(t), p.acts.d(t), p.acts.ds16(t));
            let mut r = 0f32;
            for (ab, (ch, a)) in chunks.iter().zip(q.chunks_exact(ACT_BLOCK)).enumerate() {
                let half = |i: usize| {
                    let (v, a) = (&ch.v[16 * i..16 * i + 16], &a[16 * i..16 * i + 16]);
                    dot16(v.try_into().unwrap(), a.try_into().unwrap())
                };
                r += d[ab] * (ch.mul[0] * half(0) as f32 + ch.mul[1] * half(1) as f32)
                    - ch.sub[0] * ds16[2 * ab]
                    - ch.sub[1] * ds16[2 * ab + 1];
            }
            dst[(o - start) * p.t + t] = r + bias;
        }
    }
}

/// 32 values of a block as small integers, with the coefficients that turn them into weights:
/// `w[i] = mul[i / 16] * v[i] - sub[i / 16]`.
pub(super) struct Chunk {
    pub v: [i8; ACT_BLOCK],
    pub mul: [f32; 2],
    pub sub: [f32; 2],
}

/// Chunk `c` (32 values) of one block of `ty`.
pub(super) fn chunk(ty: GgmlType, b: &[u8], c: usize) -> Chunk {
    let mut v = [0i8; ACT_BLOCK];
    match ty {
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in v.iter_mut().zip(&b[2..34]) {
                *o = q as i8;
            }
            Chunk {
                v,
                mul: [d; 2],
                sub: [0.0; 2],
            }
        }
        GgmlType::Q5_0 => {
            let d = f16_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let q = b[6 + j];
                let h0 = (((qh >> j) & 1) << 4) as u8;
                let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                v[j] = ((q & 0x0F) | h0) as i8 - 16;
                v[j + 16] = ((q >> 4) | h1) as i8 - 16;
            }
            Chunk {
                v,
                mul: [d; 2],
                sub: [0.0; 2],
            }
        }
        GgmlType::Q4_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, m) = q4_k_scale_min(c, &b[4..16]);
            let q = &b[16 + 32 * (c / 2)..16 + 32 * (c / 2) + 32];
            for (o, &q) in v.iter_mut().zip(q) {
                *o = if c.is_multiple_of(2) {
                    q & 0x0F
                } else {
                    q >> 4
                } as i8;
            }
            let (mul, sub) = (d * f32::from(sc), dmin * f32::from(m));
            Chunk {
                v,
                mul: [mul; 2],
                sub: [sub; 2],
            }
        }
        GgmlType::Q6_K => {
            let d = f16_at(b, 208);
            let (half, k) = (c / 4, c % 4);
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..128 + 32 * half + 32];
            let sc = &b[192 + 8 * half..192 + 8 * half + 8];
            for l in 0..32 {
                let low = if k.is_multiple_of(2) {
                    ql[l]
                } else {
                    ql[l + 32]
                };
                let low = if k < 2 { low & 0x0F } else { low >> 4 };
                let high = (qh[l] >> (2 * k)) & 3;
                v[l] = (low | (high << 4)) as i8 - 32;
            }
            Chunk {
                v,
                mul: [
                    d * f32::from(sc[2 * k] as i8),
                    d * f32::from(sc[2 * k + 1] as i8),
                ],
                sub: [0.0; 2],
            }
        }
        other => unreachable!("BlockLayout admits no product for {}", other.name()),
    }
}

/// The dot product of 16 small integers with 16 activations, a chunk's half. Fixed lengths and
/// a function of its own, so the compiler vectorizes it for whatever SIMD the target has (SSE2's
/// `pmaddwd`, NEON); inlined into the tile loop, or as two halves of one loop, it stayed one
/// multiply per value.
#[inline(never)]
fn dot16(v: &[i8; 16], a: &[i8; 16]) -> i32 {
    v.iter()
        .zip(a)
        .map(|(&v, &a)| i32::from(v) * i32::from(a))
        .sum()
}
