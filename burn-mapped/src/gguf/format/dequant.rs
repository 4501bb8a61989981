//! Dequantization of ggml block formats to `f32`.
//!
//! Each function reproduces the arithmetic of ggml's reference
//! `dequantize_row_*` (ggml-quants.c) operation for operation, in the same
//! order and in `f32`, so results are bit-identical to it. Rust never
//! contracts `a * b - c` into a fused multiply-add, so the two roundings of
//! the reference are kept.

use half::f16;

use super::error::GgufError;
use super::types::GgmlType;

/// Whether [`dequantize`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q5_0
            | GgmlType::Q4_K
            | GgmlType::Q6_K
    )
}

/// Decodes whole blocks of `ty` from `src` into `dst`.
///
/// `src` must be a whole number of blocks and `dst` exactly as long as the
/// number of elements they encode. Supported: F32, F16, BF16, Q8_0, Q5_0,
/// Q4_K, Q6_K.
///
/// # Errors
///
/// [`GgufError::UnsupportedDequant`], [`GgufError::PartialBlock`] or
/// [`GgufError::DestinationLength`]; `dst` is untouched on error.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    if !can_dequantize(ty) {
        return Err(GgufError::UnsupportedDequant { ggml_type: ty });
    }
    // Supported types have blocks of at most 256 elements and 210 bytes.
    let type_size = ty.type_size() as usize;
    let block_size = ty.block_size() as usize;
    if !src.len().is_multiple_of(type_size) {
        return Err(GgufError::PartialBlock {
            ggml_type: ty,
            src_len: src.len(),
            type_size: ty.type_size(),
        });
    }
    let expected = src.len() / type_size * block_size;
    if dst.len() != expected {
        return Err(GgufError::DestinationLength {
            ggml_type: ty,
            expected,
            found: dst.len(),
        });
    }
    match ty {
        GgmlType::F32 => f32_row(src, dst),
        GgmlType::F16 => f16_row(src, dst),
        GgmlType::BF16 => bf16_row(src, dst),
        GgmlType::Q8_0 => q8_0_row(src, dst),
        GgmlType::Q5_0 => q5_0_row(src, dst),
        GgmlType::Q4_K => q4_k_row(src, dst),
        GgmlType::Q6_K => q6_k_row(src, dst),
        _ => unreachable!("checked by can_dequantize"),
    }
    Ok(())
}

/// Like [`dequantize`], into a new vector.
///
/// # Errors
///
/// As [`dequantize`].
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>, GgufError> {
    if !can_dequantize(ty) {
        return Err(GgufError::UnsupportedDequant { ggml_type: ty });
    }
    let n = src.len() / ty.type_size() as usize * ty.block_size() as usize;
    let mut dst = vec![0.0; n];
    dequantize(ty, src, &mut dst)?;
    Ok(dst)
}

#[inline(always)]
/// Where a block of `ty` keeps its f16 scale fields (for Q4_K, the scale and the minimum):
/// the values a converter checks for NaN and infinity. Empty for types without blocks.
pub fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// The little-endian f16 at byte `at` of `bytes`, as f32.
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

fn f32_row(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

fn f16_row(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

/// bf16 is the upper half of an f32: a shift, as in ggml. `half::bf16::to_f32`
/// is not used because it sets the quiet bit of signalling NaNs.
fn bf16_row(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
    }
}

/// Q8_0 block (34 bytes): f16 scale `d`, then 32 `i8` quants; `y = q * d`.
fn q8_0_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[2..34]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

/// Q5_0 block (22 bytes): f16 scale `d`, 32 high bits `qh` (u32 LE), 16 bytes
/// of low nibbles. Element `j < 16` takes the low nibble of byte `j` and bit
/// `j` of `qh`; element `j + 16` the high nibble and bit `j + 16`. The 5-bit
/// value is offset by 16: `y = (q - 16) * d`.
fn q5_0_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            let x0 = ((u32::from(qs[j]) & 0x0F) | h0) as i32 - 16;
            let x1 = ((u32::from(qs[j]) >> 4) | h1) as i32 - 16;
            lo[j] = x0 as f32 * d;
            hi[j] = x1 as f32 * d;
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K block, packed
/// in 12 bytes: sub-blocks 0-3 use the low 6 bits of bytes 0-7; 4-7 combine
/// a nibble of bytes 8-11 with the top 2 bits of bytes 0-7.
#[inline(always)]
pub(crate) fn q4_k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K block (144 bytes): f16 `d`, f16 `dmin`, 12 bytes of packed scales and
/// mins, 128 bytes of nibbles. Each 64-element group uses 32 bytes: low
/// nibbles for the first 32 elements, high nibbles for the next 32;
/// `y = (d * sc) * q - (dmin * m)`.
fn q4_k_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        let qs = &b[16..144];
        for g in 0..4 {
            let q = &qs[32 * g..32 * g + 32];
            let (sc1, m1) = q4_k_scale_min(2 * g, scales);
            let (sc2, m2) = q4_k_scale_min(2 * g + 1, scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let (lo, hi) = y[64 * g..64 * g + 64].split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * f32::from(q[l] & 0x0F) - m1;
                hi[l] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    }
}

/// Q6_K block (210 bytes): 128 bytes of low nibbles `ql`, 64 bytes of 2-bit
/// high parts `qh`, 16 `i8` scales, f16 `d`. Each 128-element half uses 64
/// `ql`, 32 `qh` and 8 scales; element `l + 32k` (k = 0..4) takes a nibble of
/// `ql` and bits `2k..2k+2` of `qh[l]`, offset by 32, with scale
/// `l / 16 + 2k`: `y = (d * sc) * (q - 32)`.
fn q6_k_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b, 208);
        for half in 0..2 {
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..128 + 32 * half + 32];
            let sc = &b[192 + 8 * half..192 + 8 * half + 8];
            let y = &mut y[128 * half..128 * half + 128];
            for l in 0..32 {
                let is = l / 16;
                let h = qh[l];
                let q1 = ((ql[l] & 0x0F) | ((h & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                y[l] = d * f32::from(sc[is] as i8) * f32::from(q1);
                y[l + 32] = d * f32::from(sc[is + 2] as i8) * f32::from(q2);
                y[l + 64] = d * f32::from(sc[is + 4] as i8) * f32::from(q3);
                y[l + 96] = d * f32::from(sc[is + 6] as i8) * f32::from(q4);
            }
        }
    }
}
