//! The q8 product as a CubeCL kernel: compiled to WGSL on Burn's wgpu backend, and to SPIR-V
//! on its vulkan backend (feature `vulkan`; the same `CubeBackend`, whose wgpu runtime picks
//! the compiler per adapter when the device is opened).
//!
//! WGSL has no 8-bit storage, so the kernel binds the int8 tensor's buffer as 32-bit words:
//! the same bytes, four int8 values per word, little-endian (value `4k + b` of a row is byte
//! `b` of word `k`). Rows start on word boundaries only if `in % 4 == 0`, which
//! [`Q8Weight::new`](super::Q8Weight::new) requires on CubeCL devices. The f16 scales are
//! bound as words too (two per word) and decoded in the kernel, so no f16 shader support is
//! needed; WebGPU binds buffers in multiples of 4 bytes, which covers an odd row count.
//!
//! Layout ([`CubeTuning`]): a cube is `lanes x groups` threads. Each group of `lanes` threads
//! owns `rows` output rows; its lanes stride along those rows together, so each load
//! instruction reads consecutive words of one row, and `unroll` strides are loaded before
//! any arithmetic. Every lane keeps `rows x tile` f32 accumulators and reads each activation
//! value once for all of its rows. A load reads `vector` (1, 2 or 4) consecutive words of a
//! row, `4 * vector` weights, so neighbouring lanes need activations `vector` vec4 apart: wide
//! weight loads scatter a warp's activation loads over `vector` times the bytes they use. That
//! costs nothing measurable at `T = 1`, where the weights' bytes bound the kernel; from
//! `T = 4` on, where arithmetic and activation loads do, narrower loads and more rows per
//! thread win, hence a launch shape per tile ([`CubeTuning::default_for`]). A cube column
//! (`CUBE_POS_Y`) handles one tile of at most [`TILE`] activation rows; `T > TILE` runs
//! `ceil(T / TILE)` tiles in one dispatch, each a pass over the weights. The lanes' partial
//! sums are added through shared memory at the end.
//!
//! The same word layout serves SPIR-V, which could bind bytes but need not (8-bit storage is
//! an optional Vulkan feature). The kernel is launched on the activation tensor's client, so it
//! is ordered on Burn's stream after whatever produced `x`, with no host synchronization, on
//! either compiler.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::dot::{self, DotTuning};
use super::mma::{self, MmaTuning};
use super::ops::Q8Backend;
use super::split::{SPLIT_BLOCK, SPLIT_WORDS};

/// Activation rows per pass over the weights.
pub const TILE: usize = 8;

/// Launch shape of the CubeCL kernels. Every field is a compile-time constant of the kernel,
/// so each distinct tuning compiles (once) its own shader; the benchmark sweeps them to pick
/// the per-tile defaults ([`CubeTuning::default_for`]) per the measured figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubeTuning {
    /// Threads that share one output row (they stride along it together); at least
    /// [`TILE`].
    pub lanes: usize,
    /// Row groups per cube (`lanes * groups` threads per cube, at most 256).
    pub groups: usize,
    /// Output rows per thread (independent loads in flight per step).
    pub rows: usize,
    /// Strides along the row loaded before any arithmetic (more loads in flight).
    pub unroll: usize,
    /// Loads in flight per thread in the read-ceiling kernel.
    pub read_unroll: usize,
    /// Words per weight load (1, 2 or 4); rows whose length does not divide into such
    /// loads use the widest that does.
    pub vector: usize,
}

impl CubeTuning {
    /// The shape for one or two activation rows where the FMA kernel is the default (no native
    /// dot product, or `in % 16 != 0`; see [`cube_launch`]) unless [`set_cube_tuning`] says
    /// otherwise: on an H200 (Vulkan, SPIR-V), ranked by the device's own clock
    /// (`benches/results/h200/fusion/`): within 1 % of the fastest T = 1 product among 18
    /// shapes (0.345 ms per 12 x 88 MB, 81 % of the read kernel; 0.375 ms with the earlier
    /// 32.4.4.2.2), and T = 2 as fast as any (0.427 ms, `h200/tsweep2/`).
    pub const DEFAULT: CubeTuning = CubeTuning {
        lanes: 32,
        groups: 4,
        rows: 4,
        unroll: 4,
        read_unroll: 4,
        vector: 4,
    };

    /// Three or more activation rows (tiles of up to [`TILE`]): eight output rows per thread
    /// reuse each loaded activation twice as often as [`Self::DEFAULT`], and 2-word loads keep
    /// a warp's activation loads half as scattered (H200, `benches/results/h200/wide/`: T = 4
    /// 0.556 ms against 0.67, T = 8 0.779 against 1.49; T = 3 and 5-7 were not measured and
    /// take this shape by interpolation). Twelve output rows ran T = 8 1.3 % faster, but its
    /// first T = 8 launch spent 7-11 s compiling the shader (arm spans, compile included)
    /// against ~1 s for this one.
    pub const WIDE: CubeTuning = CubeTuning {
        lanes: 32,
        groups: 4,
        rows: 8,
        unroll: 2,
        read_unroll: 4,
        vector: 2,
    };

    /// The shape a product with `tile` activation rows per pass launches with where it takes
    /// the FMA kernel, unless [`set_cube_tuning`] overrides it. Chosen per tile because the
    /// kernel is bound by memory at one or two rows and by arithmetic and activation loads at
    /// eight, where more rows per thread reuse each loaded activation more.
    pub const fn default_for(tile: usize) -> CubeTuning {
        match tile {
            0..=2 => CubeTuning::DEFAULT,
            _ => CubeTuning::WIDE,
        }
    }

    fn valid(&self) -> bool {
        let small = |v: usize| (1..=16).contains(&v);
        // The final reduction has lane `j` write activation row `j` of the tile.
        self.lanes >= TILE
            && self.groups >= 1
            && self.lanes * self.groups <= 256
            && small(self.rows)
            && small(self.unroll)
            && small(self.read_unroll)
            && matches!(self.vector, 1 | 2 | 4)
    }
}

/// `lanes.groups.rows.unroll.read_unroll.vector`: the form the benchmark's `--tunings` reads,
/// so a shape printed in a result can be passed back.
impl std::fmt::Display for CubeTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}.{}.{}.{}.{}",
            self.lanes, self.groups, self.rows, self.unroll, self.read_unroll, self.vector
        )
    }
}

/// Which kernel a product launches, and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CubeLaunch {
    /// The FMA kernel (every CubeCL device).
    Fma(CubeTuning),
    /// The tensor-core kernel (devices with f16 cooperative matrices; see [`MmaTuning`]).
    Mma(MmaTuning),
    /// The dp4a kernel (every CubeCL device, native on SPIR-V; see [`DotTuning`]).
    Dot(DotTuning),
}

/// The shape's own form (`lanes.groups.rows.unroll.read_unroll.vector` or
/// `mma.blocks.splits.chunk` or `dot.lanes.groups.rows.unroll`), which the benchmark's
/// `--tunings` reads back.
impl std::fmt::Display for CubeLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CubeLaunch::Fma(t) => t.fmt(f),
            CubeLaunch::Mma(t) => t.fmt(f),
            CubeLaunch::Dot(t) => t.fmt(f),
        }
    }
}

/// The launch set by [`set_cube_tuning`] or [`set_mma_tuning`] for every product, or `None`
/// for the per-tile defaults.
static OVERRIDE: std::sync::RwLock<Option<CubeLaunch>> = std::sync::RwLock::new(None);

fn set_override(launch: Option<CubeLaunch>) {
    *OVERRIDE.write().unwrap_or_else(|e| e.into_inner()) = launch;
}

fn get_override() -> Option<CubeLaunch> {
    *OVERRIDE.read().unwrap_or_else(|e| e.into_inner())
}

/// Sets the FMA kernel and its launch shape for later q8 launches in this process, for every
/// `T`, tensor cores or not; returns `false` (and changes nothing) for a shape the kernels
/// cannot run: fewer than [`TILE`] lanes, `lanes * groups` over 256 threads, `rows`, `unroll`
/// or `read_unroll` outside 1..=16, or `vector` not 1, 2 or 4.
pub fn set_cube_tuning(tuning: CubeTuning) -> bool {
    if !tuning.valid() {
        return false;
    }
    set_override(Some(CubeLaunch::Fma(tuning)));
    true
}

/// Opts later q8 launches in this process into the tensor-core kernel with this shape, for
/// every `T`, where it runs (f16 cooperative matrices, planes of 32, `in % 16 == 0`, the
/// shape's shared memory within the device's; other products keep their per-tile FMA
/// defaults); returns `false` (and changes nothing) for a shape outside [`MmaTuning`]'s
/// ranges or over 48 KiB of shared memory. Slower than the FMA kernel on the H200: see
/// [`MmaTuning`].
pub fn set_mma_tuning(tuning: MmaTuning) -> bool {
    if !tuning.valid() {
        return false;
    }
    set_override(Some(CubeLaunch::Mma(tuning)));
    true
}

/// Sets the dp4a kernel with this shape for later q8 launches in this process, for every
/// `T` whose row width it runs (`in % 16 == 0`; others keep their per-tile FMA defaults);
/// returns `false` (and changes nothing) for a shape outside [`DotTuning`]'s ranges.
pub fn set_dot_tuning(tuning: DotTuning) -> bool {
    if !tuning.valid() {
        return false;
    }
    set_override(Some(CubeLaunch::Dot(tuning)));
    true
}

/// Returns later launches to the per-tile defaults ([`cube_launch`]).
pub fn reset_cube_tuning() {
    set_override(None);
}

/// The FMA launch shape a product with `t` activation rows uses now, where it takes the FMA
/// kernel (the read kernel uses that of `t = 1`).
pub fn cube_tuning(t: usize) -> CubeTuning {
    match get_override() {
        Some(CubeLaunch::Fma(tuning)) => tuning,
        _ => CubeTuning::default_for(t.clamp(1, TILE)),
    }
}

/// What a product with `t` activation rows of a width both the tensor-core and the dp4a
/// kernels run (`in % 16 == 0`) launches now, given whether the device has the fragments
/// (`tensor_cores`: see [`set_mma_tuning`]) and a native packed int8 dot product
/// (`native_dot`): the override if one is set and applies, else the tile's default, the dp4a
/// kernel where the dot product is native (faster than the FMA kernel at every measured `T`
/// on the H200, see [`DotTuning`]) and the FMA kernel elsewhere (CubeCL expands `dp4a` into
/// shifts and multiplies on WGSL).
pub fn cube_launch(t: usize, tensor_cores: bool, native_dot: bool) -> CubeLaunch {
    let tile = t.clamp(1, TILE);
    match get_override() {
        Some(CubeLaunch::Mma(m)) if tensor_cores => CubeLaunch::Mma(m),
        Some(CubeLaunch::Fma(f)) => CubeLaunch::Fma(f),
        Some(CubeLaunch::Dot(d)) => CubeLaunch::Dot(d),
        _ if native_dot => CubeLaunch::Dot(DotTuning::default_for(tile)),
        _ => CubeLaunch::Fma(CubeTuning::default_for(tile)),
    }
}

/// Whether `client` compiles `dp4a` to the device's own instruction: CubeCL's SPIR-V
/// compiler does where Vulkan offers `shaderIntegerDotProduct` (core in Vulkan 1.3); its WGSL
/// compiler always expands it.
fn native_dot(client: &mma::Client) -> bool {
    client.name() == "wgpu<spirv>"
}

/// Whether `device` is a CubeCL device whose client offers the tensor-core kernel's
/// fragments (16x16x16, f16 inputs, f32 accumulator, planes of 32).
pub fn tensor_cores(device: &burn::tensor::Device) -> bool {
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(d) => mma::available(&d.client()),
        _ => false,
    }
}

/// What a product with `t` activation rows of `inp` values launches now on `device`, every
/// condition applied (fragments, `inp % 16`, the shape's shared memory); `None` off CubeCL
/// devices. Benchmarks label their arms with it.
pub fn planned_launch(device: &burn::tensor::Device, t: usize, inp: usize) -> Option<CubeLaunch> {
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(d) => Some(launch_on(&d.client(), t, inp)),
        _ => None,
    }
}

/// The one launch decision: the tensor-core or dp4a kernel where it is asked for (or the
/// default) and runs, else the FMA kernel (the override's shape or the tile's default).
fn launch_on(client: &mma::Client, t: usize, inp: usize) -> CubeLaunch {
    let tile = t.clamp(1, TILE);
    let wide = mma::fits(inp) && dot::fits(inp);
    let tensor_cores = wide && mma::available(client);
    match cube_launch(tile, tensor_cores, wide && native_dot(client)) {
        CubeLaunch::Mma(m) if !mma::fits_shared(client, &m) => {
            CubeLaunch::Fma(CubeTuning::default_for(tile))
        }
        CubeLaunch::Dot(_) if !wide => CubeLaunch::Fma(CubeTuning::default_for(tile)),
        launch => launch,
    }
}

/// f16 bits (low 16 bits of `h`) to f32, exactly, including subnormals, infinities and NaN.
#[cube]
fn f16_bits_to_f32(h: u32) -> f32 {
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

/// Adds one stride of `rows` weight vectors (`wv[first..first + rows]`, starting at
/// activation vector `xi0` of each row) times the tile's activations into `acc`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate<N: Size>(
    wv: &Array<Vector<u32, N>>,
    first: usize,
    x: &[Vector<f32, Const<4>>],
    x_base: &Array<usize>,
    xi0: usize,
    acc: &mut Array<f32>,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
) {
    #[unroll]
    for v in 0..N::value() {
        // Unpack four int8 per row without an int-to-float conversion (a quarter-rate
        // instruction on common GPUs): flipping the sign bits turns each byte into
        // `u = value + 128`, and the bits `0x4B00_0000 | u` are the f32 `2^23 + u`, so
        // subtracting `2^23 + 128` leaves `value`, exactly.
        let mut wf = Array::<f32>::new(rows * 4);
        #[unroll]
        for r in 0..rows {
            let word = wv[first + r].extract(v) ^ 0x8080_8080u32;
            #[unroll]
            for b in 0..4 {
                let bits = ((word >> (8 * b as u32)) & 255u32) | 0x4B00_0000u32;
                wf[r * 4 + b] = f32::reinterpret(bits) - 8_388_736.0;
            }
        }
        let xi = xi0 + v;
        #[unroll]
        for j in 0..tile {
            let xv = x[x_base[j] + xi];
            #[unroll]
            for r in 0..rows {
                let mut a = acc[r * tile + j];
                #[unroll]
                for b in 0..4 {
                    a += wf[r * 4 + b] * xv.extract(b);
                }
                acc[r * tile + j] = a;
            }
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn q8_gemm_kernel<N: Size>(
    x: &[Vector<f32, Const<4>>],
    w: &[Vector<u32, N>],
    scales: &[u32],
    bias: &[f32],
    y: &mut [f32],
    t_total: usize,
    out: usize,
    words: usize,
    #[comptime] tile: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] unroll: usize,
    #[comptime] has_bias: bool,
) {
    let lane = UNIT_POS_X as usize;
    let group = UNIT_POS_Y as usize;
    let row0 = (CUBE_POS_X as usize * groups + group) * rows;
    let t0 = CUBE_POS_Y as usize * tile;
    let n = N::value();
    // Vec4 activations per row: in / 4.
    let x_row = words * n;

    let mut acc = zeros(rows * tile);
    let row_base = clamped_bases(row0, out, words, rows);
    let x_base = clamped_bases(t0, t_total, x_row, tile);

    let mut k = lane;
    // Main loop: `unroll` strides of every row are loaded before any arithmetic, so
    // `rows * unroll` loads are in flight per thread.
    while k + (unroll - 1) * lanes < words {
        let mut wv = Array::<Vector<u32, N>>::new(rows * unroll);
        #[unroll]
        for u in 0..unroll {
            #[unroll]
            for r in 0..rows {
                wv[u * rows + r] = w[row_base[r] + k + u * lanes];
            }
        }
        #[unroll]
        for u in 0..unroll {
            accumulate::<N>(
                &wv,
                u * rows,
                x,
                &x_base,
                (k + u * lanes) * n,
                &mut acc,
                tile,
                rows,
            );
        }
        k += unroll * lanes;
    }
    // The strides left over (fewer than `unroll`), one at a time.
    while k < words {
        let mut wv = Array::<Vector<u32, N>>::new(rows);
        #[unroll]
        for r in 0..rows {
            wv[r] = w[row_base[r] + k];
        }
        accumulate::<N>(&wv, 0, x, &x_base, k * n, &mut acc, tile, rows);
        k += lanes;
    }

    write_rows(
        &acc, scales, bias, y, t_total, out, row0, t0, tile, rows, lanes, groups, has_bias,
    );
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
/// per lane of the first `tile`) through shared memory, scales them by the row's scale, adds
/// the bias and writes them: the common end of the FMA and dp4a kernels.
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
    #[comptime] has_bias: bool,
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
                let mut value = sum * row_scale(scales, row);
                if comptime!(has_bias) {
                    value += bias[row];
                }
                y[t * out + row] = value;
            }
        }
        sync_cube();
    }
}

/// Threads per cube of the read kernel (the tree below is written for 256).
const READ_THREADS: usize = 256;

/// XOR of all words; one result per cube, reduced through shared memory.
#[cube(launch_unchecked)]
fn read_kernel<N: Size>(
    w: &[Vector<u32, N>],
    partial: &mut [u32],
    len: usize,
    #[comptime] unroll: usize,
) {
    let mut acc = Vector::<u32, N>::new(0u32);
    let stride = CUBE_COUNT_X as usize * READ_THREADS;
    let mut i = CUBE_POS_X as usize * READ_THREADS + UNIT_POS_X as usize;
    // `unroll` independent loads per step, then the strides left over one at a time.
    while i + (unroll - 1) * stride < len {
        let mut v = Array::<Vector<u32, N>>::new(unroll);
        #[unroll]
        for u in 0..unroll {
            v[u] = w[i + u * stride];
        }
        #[unroll]
        for u in 0..unroll {
            acc ^= v[u];
        }
        i += unroll * stride;
    }
    while i < len {
        acc ^= w[i];
        i += stride;
    }
    let mut x = 0u32;
    #[unroll]
    for v in 0..N::value() {
        x ^= acc.extract(v);
    }
    let u = UNIT_POS_X as usize;
    let mut shared = Shared::<[u32]>::new_slice(READ_THREADS);
    shared[u] = x;
    sync_cube();
    if u < 128 {
        shared[u] ^= shared[u + 128];
    }
    sync_cube();
    if u < 64 {
        shared[u] ^= shared[u + 64];
    }
    sync_cube();
    if u < 32 {
        shared[u] ^= shared[u + 32];
    }
    sync_cube();
    if u < 16 {
        shared[u] ^= shared[u + 16];
    }
    sync_cube();
    if u < 8 {
        shared[u] ^= shared[u + 8];
    }
    sync_cube();
    if u < 4 {
        shared[u] ^= shared[u + 4];
    }
    sync_cube();
    if u < 2 {
        shared[u] ^= shared[u + 2];
    }
    sync_cube();
    if u == 0 {
        partial[CUBE_POS_X as usize] = shared[0] ^ shared[1];
    }
}

fn read(values: &CubeTensor) -> CubeTensor {
    use super::ops::READ_PARTIALS;
    assert_eq!(values.dtype, DType::I8, "q8_read: values must be I8");
    let values = contiguous(values);
    let bytes = values.meta.shape().num_elements();
    assert_eq!(bytes % 4, 0, "q8_read: the GPU kernel needs `in` % 4 == 0");
    let words = bytes / 4;
    let n = if words.is_multiple_of(4) { 4 } else { 1 };
    let client = values.client.clone();
    if words == 0 {
        let out = client.create_from_slice(u32::as_bytes(&[0u32; READ_PARTIALS]));
        return CubeTensor::new_contiguous(
            client,
            values.device.clone(),
            Shape::new([READ_PARTIALS]),
            out,
            DType::U32,
        );
    }
    // Every cube writes its one partial, so the output needs no initial upload (an upload is
    // a queue write, which makes the stream submit the work recorded so far).
    let out = client.empty(READ_PARTIALS * size_of::<u32>());
    // SAFETY: `values` holds `words / n` vectors of `n` u32 (the int8 bytes viewed as
    // words); `out` holds READ_PARTIALS u32, one per cube. Reads are bounded by `len`.
    unsafe {
        read_kernel::launch_unchecked(
            &client,
            CubeCount::Static(READ_PARTIALS as u32, 1, 1),
            CubeDim::new_1d(READ_THREADS as u32),
            n,
            BufferArg::from_raw_parts(values.handle.clone(), words / n),
            BufferArg::from_raw_parts(out.clone(), READ_PARTIALS),
            words / n,
            cube_tuning(1).read_unroll,
        );
    }
    CubeTensor::new_contiguous(
        client,
        values.device.clone(),
        Shape::new([READ_PARTIALS]),
        out,
        DType::U32,
    )
}

fn contiguous(t: &CubeTensor) -> CubeTensor {
    if t.is_contiguous() {
        t.clone()
    } else {
        into_contiguous(t.clone())
    }
}

fn run(
    x: CubeTensor,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
) -> CubeTensor {
    assert_eq!(x.dtype, DType::F32, "q8_matmul: x must be f32");
    assert_eq!(values.dtype, DType::I8, "q8_matmul: values must be I8");
    assert_eq!(scales.dtype, DType::F16, "q8_matmul: scales must be F16");
    let [t, inp] = x.meta.shape().dims::<2>();
    let [out, w_in] = values.meta.shape().dims::<2>();
    assert_eq!(
        inp, w_in,
        "q8_matmul: x is [{t}, {inp}], weight [{out}, {w_in}]"
    );
    assert_eq!(inp % 4, 0, "q8_matmul: the GPU kernel needs `in` % 4 == 0");
    let x = contiguous(&x);
    let values = contiguous(values);
    let scales = contiguous(scales);
    let bias = bias.map(contiguous);
    if let Some(b) = &bias {
        assert_eq!(b.dtype, DType::F32, "q8_matmul: bias must be f32");
    }
    let client = x.client.clone();
    let device = x.device.clone();
    assert!(
        t > 0 && out > 0 && inp > 0,
        "q8_matmul: empty operands are handled by q8_linear"
    );
    let y = output(&client, t, out);
    let tile = t.min(TILE);
    let tuning = match launch_on(&client, t, inp) {
        CubeLaunch::Mma(m) => {
            mma::run(&x, &values, &scales, bias.as_ref(), &y, m);
            return CubeTensor::new_contiguous(client, device, Shape::new([t, out]), y, DType::F32);
        }
        CubeLaunch::Dot(d) => {
            dot::run_split(&dot::split(&x), &values, &scales, bias.as_ref(), &y, d);
            return CubeTensor::new_contiguous(client, device, Shape::new([t, out]), y, DType::F32);
        }
        CubeLaunch::Fma(tuning) => tuning,
    };
    let n = if tuning.vector >= 4 && inp.is_multiple_of(16) {
        4
    } else if tuning.vector >= 2 && inp.is_multiple_of(8) {
        2
    } else {
        1
    };
    let words = inp / (4 * n);
    let rows_per_cube = tuning.groups * tuning.rows;
    let count = CubeCount::Static(
        out.div_ceil(rows_per_cube) as u32,
        t.div_ceil(tile) as u32,
        1,
    );
    let dim = CubeDim::new_2d(tuning.lanes as u32, tuning.groups as u32);
    let bias_arg = bias.as_ref().unwrap_or(&scales);
    let bias_len = if bias.is_some() { out } else { 1 };
    // SAFETY: every length below is the number of elements of the stated type that the
    // buffer holds: `x` is `[t, inp]` f32 (`t * inp / 4` vec4), `values` `[out, inp]` bytes
    // (`out * words` vectors of `n` words), `scales` `out` f16 rounded up to whole words
    // (WebGPU binds in 4-byte multiples), `bias` `out` f32 (or one word of the scales, never
    // read without a bias), `y` `t * out` f32. The kernel clamps every row and column index
    // to these bounds and writes each `y` element at most once.
    unsafe {
        q8_gemm_kernel::launch_unchecked(
            &client,
            count,
            dim,
            n,
            BufferArg::from_raw_parts(x.handle.clone(), t * inp / 4),
            BufferArg::from_raw_parts(values.handle.clone(), out * words),
            BufferArg::from_raw_parts(scales.handle.clone(), out.div_ceil(2)),
            BufferArg::from_raw_parts(bias_arg.handle.clone(), bias_len),
            BufferArg::from_raw_parts(y.clone(), t * out),
            t,
            out,
            words,
            tile,
            tuning.rows,
            tuning.lanes,
            tuning.groups,
            tuning.unroll,
            bias.is_some(),
        );
    }
    CubeTensor::new_contiguous(client, device, Shape::new([t, out]), y, DType::F32)
}

/// The product's output `[t, out]` f32: uninitialized, or NaN when outputs are poisoned.
fn output(client: &mma::Client, t: usize, out: usize) -> cubecl::server::Handle {
    if super::poison_outputs() {
        client.create_from_slice(f32::as_bytes(&vec![f32::NAN; t * out]))
    } else {
        client.empty(t * out * size_of::<f32>())
    }
}

fn split(x: CubeTensor) -> CubeTensor {
    assert_eq!(x.dtype, DType::F32, "q8_split: x must be f32");
    let [t, inp] = x.meta.shape().dims::<2>();
    assert!(
        t > 0 && dot::fits(inp),
        "q8_split: x is [{t}, {inp}]; needs T > 0 and `in` a positive multiple of 16"
    );
    dot::split(&contiguous(&x))
}

/// The dp4a product on a split made by [`split`]: the override's dp4a shape if one is set,
/// else the tile's dp4a default (an FMA or tensor-core override does not apply: the
/// activations are already split for this kernel).
fn run_split(
    split: CubeTensor,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
) -> CubeTensor {
    assert_eq!(
        split.dtype,
        DType::U32,
        "q8_matmul_split: split must be U32"
    );
    assert_eq!(
        values.dtype,
        DType::I8,
        "q8_matmul_split: values must be I8"
    );
    assert_eq!(
        scales.dtype,
        DType::F16,
        "q8_matmul_split: scales must be F16"
    );
    let [t, words] = split.meta.shape().dims::<2>();
    let [out, inp] = values.meta.shape().dims::<2>();
    assert!(
        t > 0 && out > 0 && dot::fits(inp) && words == SPLIT_WORDS * inp / SPLIT_BLOCK,
        "q8_matmul_split: split [{t}, {words}] does not fit a [{out}, {inp}] weight"
    );
    let (split, values, scales) = (contiguous(&split), contiguous(values), contiguous(scales));
    let bias = bias.map(contiguous);
    if let Some(b) = &bias {
        assert_eq!(b.dtype, DType::F32, "q8_matmul_split: bias must be f32");
    }
    let client = split.client.clone();
    let y = output(&client, t, out);
    let tuning = match get_override() {
        Some(CubeLaunch::Dot(d)) => d,
        _ => DotTuning::default_for(t.clamp(1, TILE)),
    };
    dot::run_split(&split, &values, &scales, bias.as_ref(), &y, tuning);
    CubeTensor::new_contiguous(
        client,
        split.device.clone(),
        Shape::new([t, out]),
        y,
        DType::F32,
    )
}

impl Q8Backend for CubeBackend {
    fn q8_matmul(x: CubeTensor, values: CubeTensor, scales: &CubeTensor) -> CubeTensor {
        run(x, &values, scales, None)
    }

    fn q8_matmul_bias(
        x: CubeTensor,
        values: CubeTensor,
        scales: &CubeTensor,
        bias: &CubeTensor,
    ) -> CubeTensor {
        run(x, &values, scales, Some(bias))
    }

    fn q8_read(values: CubeTensor) -> CubeTensor {
        read(&values)
    }

    fn q8_split(x: CubeTensor) -> CubeTensor {
        split(x)
    }

    fn q8_matmul_split(split: CubeTensor, values: CubeTensor, scales: &CubeTensor) -> CubeTensor {
        run_split(split, &values, scales, None)
    }

    fn q8_matmul_split_bias(
        split: CubeTensor,
        values: CubeTensor,
        scales: &CubeTensor,
        bias: &CubeTensor,
    ) -> CubeTensor {
        run_split(split, &values, scales, Some(bias))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_shape_is_one_the_kernels_run() {
        for tile in 0..=TILE + 1 {
            assert!(CubeTuning::default_for(tile).valid(), "tile {tile}");
        }
        assert!(MmaTuning::DEFAULT.valid());
        for tile in 0..=TILE + 1 {
            assert!(DotTuning::default_for(tile).valid(), "tile {tile}");
        }
    }

    /// The only test in this binary that touches the process-wide shape; no unit test
    /// launches a kernel.
    #[test]
    fn an_override_applies_to_every_t_and_reset_restores_the_per_tile_defaults() {
        let narrow = [1, 2].map(|t| (t, CubeTuning::DEFAULT));
        let wide = [3, 8, 100].map(|t| (t, CubeTuning::WIDE));
        for (t, want) in narrow.into_iter().chain(wide) {
            assert_eq!(cube_tuning(t), want, "T = {t}");
            // The tensor-core kernel is opt-in: no default takes it; the dp4a kernel is the
            // default where the dot product is native.
            let dot = CubeLaunch::Dot(DotTuning::default_for(t.clamp(1, TILE)));
            for cores in [false, true] {
                assert_eq!(
                    cube_launch(t, cores, false),
                    CubeLaunch::Fma(want),
                    "T = {t}"
                );
                assert_eq!(cube_launch(t, cores, true), dot, "T = {t}");
            }
        }
        let other = CubeTuning {
            lanes: 16,
            ..CubeTuning::DEFAULT
        };
        assert!(set_cube_tuning(other));
        for t in [1, 2, 3, 8, 100] {
            assert_eq!(cube_tuning(t), other, "T = {t}");
            assert_eq!(
                cube_launch(t, true, true),
                CubeLaunch::Fma(other),
                "T = {t}"
            );
        }
        let mma = MmaTuning {
            blocks: 1,
            ..MmaTuning::DEFAULT
        };
        assert!(set_mma_tuning(mma));
        assert!(!set_mma_tuning(MmaTuning { chunk: 9, ..mma }));
        assert!(!set_mma_tuning(MmaTuning { chunk: 1, ..mma }));
        assert!(!set_mma_tuning(MmaTuning {
            blocks: 2,
            splits: 8,
            chunk: 8
        }));
        for t in [1, 2, 3, 8, 100] {
            assert_eq!(cube_launch(t, true, false), CubeLaunch::Mma(mma), "T = {t}");
            let fma = CubeTuning::default_for(t.clamp(1, TILE));
            assert_eq!(
                cube_launch(t, false, false),
                CubeLaunch::Fma(fma),
                "T = {t}"
            );
            assert_eq!(cube_tuning(t), fma, "T = {t}");
        }
        let dot = DotTuning {
            rows: 2,
            ..DotTuning::MANY
        };
        assert!(set_dot_tuning(dot));
        assert!(!set_dot_tuning(DotTuning { lanes: 4, ..dot }));
        assert!(!set_dot_tuning(DotTuning { groups: 16, ..dot }));
        assert!(!set_dot_tuning(DotTuning { rows: 17, ..dot }));
        for t in [1, 2, 3, 8, 100] {
            for cores in [false, true] {
                assert_eq!(
                    cube_launch(t, cores, false),
                    CubeLaunch::Dot(dot),
                    "T = {t}"
                );
            }
        }
        reset_cube_tuning();
        assert_eq!(cube_tuning(1), CubeTuning::DEFAULT);
        assert_eq!(cube_tuning(8), CubeTuning::WIDE);
        assert_eq!(
            cube_launch(8, true, false),
            CubeLaunch::Fma(CubeTuning::WIDE)
        );
    }
}
