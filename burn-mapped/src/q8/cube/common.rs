//! `#[cube]` helpers shared by the FMA ([`super::fma`]) and dp4a ([`super::dot`]) kernels:
//! decoding the f16 scales bound as words, a thread's accumulators and clamped row offsets,
//! the reduction through shared memory that ends both kernels, and the launch arguments they
//! share.

use burn::tensor::DType;
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// f16 bits (low 16 bits of `h`) to f32, exactly, including subnormals, infinities and NaN.
#[cube]
pub(super) fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h >> 15) & 1;
    let exp = (h >> 10) & 31;
    let man = h & 1023;
    let mut mag = f32::reinterpret(((exp + 112) << 23) | (man << 13));
    if exp == 0 {
        // Subnormal or zero: man * 2^-24 (0x33800000 is 2^-24), exact in f32.
        mag = f32::cast_from(man) * f32::reinterpret(0x3380_0000u32);
    } else if exp == 31 {
        mag = f32::reinterpret(0x7F80_0000u32 | (man << 13));
    }
    if sign == 1 {
        mag = -mag;
    }
    mag
}

/// The f16 scale of `row`, from the scales bound as words (two per word, low half first).
#[cube]
pub(super) fn row_scale(scales: &[u32], row: usize) -> f32 {
    let half = (scales[row / 2] >> (16 * (row % 2) as u32)) & 0xFFFFu32;
    f16_bits_to_f32(half)
}

/// `n` zeros: a thread's accumulators.
#[cube]
pub(super) fn zeros(#[comptime] n: usize) -> Array<f32> {
    let mut a = Array::<f32>::new(n);
    #[unroll]
    for i in 0..n {
        a[i] = 0.0;
    }
    a
}

/// The offsets `(first + i) * stride` for `i < n`, an index past `count` clamped to the
/// last: rows and activation rows past the end read the last valid one (no divergence in
/// the loop), and their results are never written.
#[cube]
pub(super) fn clamped_bases(
    first: usize,
    count: usize,
    stride: usize,
    #[comptime] n: usize,
) -> Array<usize> {
    let mut base = Array::<usize>::new(n);
    #[unroll]
    for i in 0..n {
        let mut v = first + i;
        if v >= count {
            v = count - 1;
        }
        base[i] = v * stride;
    }
    base
}

/// Adds the lanes' partial sums of each of a group's `rows` output rows (one activation row
/// per lane of the first `tile`) through shared memory, scales them by the row's scale (with
/// `scaled`: the q8 kernels' f16 scale per row; block weights carry theirs within), adds
/// the bias (per output row, or with `bias_each` per output element: a residual stream of
/// `t_total` rows) and writes them: the common end of the FMA and dp4a kernels.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn write_rows(
    acc: &Array<f32>,
    scales: &[u32],
    bias: &[f32],
    y: &mut [f32],
    t_total: usize,
    out: usize,
    row0: usize,
    t0: usize,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] scaled: bool,
    #[comptime] has_bias: bool,
    #[comptime] bias_each: bool,
) {
    let lane = UNIT_POS_X as usize;
    let group = UNIT_POS_Y as usize;
    let mut partial = Shared::<[f32]>::new_slice(lanes * groups * tile);
    let slot = (group * lanes + lane) * tile;
    #[unroll]
    for r in 0..rows {
        #[unroll]
        for j in 0..tile {
            partial[slot + j] = acc[r * tile + j];
        }
        sync_cube();
        if lane < tile {
            let row = row0 + r;
            let t = t0 + lane;
            if row < out && t < t_total {
                let mut sum = 0.0f32;
                for l in 0..lanes {
                    sum += partial[(group * lanes + l) * tile + lane];
                }
                let mut value = sum;
                if comptime!(scaled) {
                    value *= row_scale(scales, row);
                }
                if comptime!(has_bias) {
                    if comptime!(bias_each) {
                        value += bias[t * out + row];
                    } else {
                        value += bias[row];
                    }
                }
                y[t * out + row] = value;
            }
        }
        sync_cube();
    }
}

/// The launch grid of a product over `out` rows and `t` activation rows, `tile` per pass: one
/// cube of `lanes x groups` threads per `groups * rows` output rows and tile.
pub(super) fn grid(
    out: usize,
    t: usize,
    tile: usize,
    lanes: usize,
    groups: usize,
    rows: usize,
) -> (CubeCount, CubeDim) {
    let count = CubeCount::Static(
        out.div_ceil(groups * rows) as u32,
        t.div_ceil(tile) as u32,
        1,
    );
    (count, CubeDim::new_2d(lanes as u32, groups as u32))
}

/// The scales and the bias of a product over `out` rows as both kernels bind them: the f16
/// scales as `ceil(out / 2)` words (two per word; WebGPU binds in 4-byte multiples), the bias
/// as `out` f32 or, without one, a stand-in of one word of the scales that a kernel launched
/// without `has_bias` never reads.
pub(super) fn scales_and_bias(
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
    out: usize,
) -> (BufferArg, BufferArg) {
    if let Some(b) = bias {
        assert!(
            b.dtype == DType::F32 && b.meta.shape().num_elements() == out,
            "q8: bias must be f32 [{out}]"
        );
    }
    // SAFETY: the bias was checked above to hold `out` f32.
    unsafe { scales_and_bias_buffers(scales, bias.map(|b| &b.handle), out, out) }
}

/// [`scales_and_bias`] with the bias as a bare buffer of `bias_len` f32 (`out`, or `t * out`
/// for an addend per element).
///
/// # Safety
///
/// `bias`, when given, holds at least `bias_len` f32.
pub(super) unsafe fn scales_and_bias_buffers(
    scales: &CubeTensor,
    bias: Option<&Handle>,
    out: usize,
    bias_len: usize,
) -> (BufferArg, BufferArg) {
    assert!(
        scales.dtype == DType::F16 && scales.meta.shape().num_elements() == out,
        "q8: scales must be F16 [{out}]"
    );
    let (bias, bias_len) = match bias {
        Some(b) => (b, bias_len),
        None => (&scales.handle, 1),
    };
    // SAFETY: checked above: the scales hold `out` f16, `ceil(out / 2)` words (the buffer is
    // allocated in whole words); the caller vouches for a bias of `bias_len` f32, and one word of
    // the scales stands in for a missing bias (`out > 0` where a kernel launches).
    unsafe {
        (
            BufferArg::from_raw_parts(scales.handle.clone(), out.div_ceil(2)),
            BufferArg::from_raw_parts(bias.clone(), bias_len),
        )
    }
}
