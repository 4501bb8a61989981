//! The q8 product on tensor cores, through CubeCL's cooperative matrices (`cmma`), for devices
//! that offer 16x16x16 f16 x f16 -> f32 fragments (Vulkan's `VK_KHR_cooperative_matrix` on
//! SPIR-V; WGSL has none, so the wgpu backend never takes this path).
//!
//! Why: from three or so activation rows on, the FMA kernel ([`super::cube`]) is bound by
//! arithmetic (eight f32 FMAs per weight at `T = 8`) rather than by the weights' bytes. Here
//! each int8 weight is widened to f16 once, in registers, and tensor cores do the products.
//!
//! Exactness: an int8 value is exact in f16. Each activation row is scaled by a power of two
//! (its largest magnitude lands in `[2^14, 2^15)`, so f16 cannot overflow) and split into a
//! high f16 part and the f16 rounding of the remainder: together they carry ~22 significant
//! bits, and the products are accumulated in f32. The B operand's 16 columns hold the tile's
//! 8 high halves and then its 8 low halves, so one fragment product yields both and the
//! kernel adds them at the end: `T <= 8` costs one tensor-core product per 16x16 block of
//! weights.
//!
//! Opt-in ([`super::set_mma_tuning`]): on the H200 it matches the f64 reference at every
//! tested shape but is slower than the FMA and dp4a kernels at every `T` (see
//! [`MmaTuning`]), so no product takes it by default.
//!
//! Two launches per product: [`split_kernel`] (activations to the B layout, a few hundred KB
//! at most) and [`mma_kernel`], both on the activation tensor's client, so both are ordered
//! on Burn's stream with no host synchronization.
//!
//! Widening: with the sign bits flipped a byte is `u = value + 128`; the f16 bits
//! `0x6400 | u` are `1024 + u`, so subtracting 1152 leaves `value`, exactly. Masking a word
//! with `0x00FF_00FF` widens its even bytes into an f16 pair, shifting it first its odd ones;
//! done on a 16-byte load at once, that gives the 16 weights' even positions as one 16-byte
//! store and the odd ones as another. So within each group of 16 the f16 tile holds the
//! weights in the order 0, 2, .., 14, 1, 3, .., 15, and [`split_kernel`] lays the activations
//! out in that same order. The kernel needs `in % 16 == 0` (16-byte loads); other widths
//! take the FMA kernel.

use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
pub(super) use cubecl::client::Client;
use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use cubecl::server::Handle;
use half::f16;

use super::cube::{TILE, row_scale};

/// Columns of the B operand per tile: the high halves, then the low halves.
const COLS: usize = 2 * TILE;

/// Edge of a fragment (M = N = K = 16).
const FRAG: usize = 16;

/// Threads per cube of the split kernel (the reduction below is written for 256).
const SPLIT_THREADS: usize = 256;

/// Shared memory a cube may use (Vulkan guarantees 16 KiB; NVIDIA's drivers give 48 KiB).
const SHARED_BYTES: usize = 48 * 1024;

/// Launch shape of the tensor-core kernel; every field is a compile-time constant.
///
/// Opt-in ([`set_mma_tuning`](super::set_mma_tuning)). Measured on the H200 (Vulkan, device
/// clock, 12 protocol GEMVs of 12288 x 7168): the best shape, `mma.2.8.2`, takes 1.25 ms at
/// every `T` against the FMA kernel's 0.34 ms at `T = 1` and 0.78 ms at `T = 8` (the dp4a
/// kernel's, [`DotTuning`](super::DotTuning), 0.33 and 0.57 ms). Probes that
/// dropped parts of the kernel put the cost in latency, not arithmetic: with no fragment work
/// at all the loads and widening alone took 0.89 ms, and loading B once instead of per step
/// saved 0.57 ms; too few warps are in flight per SM (one cube per 32 rows of 12288) to hide
/// either. `benches/scripts/h200_mma.sh` measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaTuning {
    /// Blocks of 16 output rows per plane (1 to 4): each B fragment serves this many.
    pub blocks: usize,
    /// Planes per cube, each summing its own share of the row's length (1 to 8).
    pub splits: usize,
    /// 16-wide steps along the row per load round (1 to 8): 16 bytes per row per step.
    pub chunk: usize,
}

impl MmaTuning {
    /// The fastest of the shapes measured on the H200 (36 KiB of shared memory, 2 x 16 rows
    /// per plane, 8 planes per cube, 32 bytes per row per load round).
    pub const DEFAULT: MmaTuning = MmaTuning {
        blocks: 2,
        splits: 8,
        chunk: 2,
    };

    pub(super) fn valid(&self) -> bool {
        (1..=4).contains(&self.blocks)
            && (1..=8).contains(&self.splits)
            && (1..=8).contains(&self.chunk)
            // A plane's 16-byte loads of a chunk divide evenly over its 32 lanes.
            && (self.blocks * self.chunk).is_multiple_of(2)
            && self.shared_bytes() <= SHARED_BYTES
    }

    /// 16-byte units (eight f16) per row of a plane's widened tile: a chunk plus one of
    /// padding, so the rows a fragment load reads do not all start in the same bank.
    fn row_units(&self) -> usize {
        2 * self.chunk + 1
    }

    fn shared_bytes(&self) -> usize {
        let a = self.splits * self.blocks * FRAG * self.row_units() * 16;
        let c = self.splits * self.blocks * FRAG * FRAG * 4;
        a + c
    }
}

/// `mma.blocks.splits.chunk`: the form the benchmark's `--tunings` reads.
impl std::fmt::Display for MmaTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mma.{}.{}.{}", self.blocks, self.splits, self.chunk)
    }
}

/// Whether the tensor-core kernel runs a row of `inp` values (16-byte loads).
pub(super) fn fits(inp: usize) -> bool {
    inp.is_multiple_of(FRAG)
}

/// Whether `client` offers the 16x16x16 f16 fragments with an f32 accumulator, in planes of
/// 32 (a cube's row of 32 units is one plane in the kernel's layout).
pub(super) fn available(client: &Client) -> bool {
    let f16 = ElemType::Float(FloatKind::F16);
    let hardware = &client.properties().hardware;
    hardware.plane_size_min == 32
        && hardware.plane_size_max == 32
        && client.features().matmul.cmma.contains(&MmaConfig {
            a_type: f16,
            b_type: f16,
            cd_type: ElemType::Float(FloatKind::F32),
            m: FRAG as u32,
            n: FRAG as u32,
            k: FRAG as u32,
        })
}

/// Whether `tuning`'s shared memory fits `client`'s cubes.
pub(super) fn fits_shared(client: &Client, tuning: &MmaTuning) -> bool {
    tuning.shared_bytes() <= client.properties().hardware.max_shared_memory_size
}

/// Scales each activation row by a power of two and writes its high and low f16 parts as
/// the B operand: `xp[tile][column][k]`, column `j` the high part of row `tile * 8 + j`,
/// column `8 + j` its low part, `k` in the widened tile's order and zero past `in` (and for
/// rows past `T`). `inv[t]` is the factor that undoes the scaling. One cube per row.
#[cube(launch_unchecked)]
fn split_kernel(
    x: &[f32],
    xp: &mut [f16],
    inv: &mut [f32],
    t_total: usize,
    inp: usize,
    in_pad: usize,
) {
    let j = CUBE_POS_X as usize;
    let tile = CUBE_POS_Y as usize;
    let t = tile * TILE + j;
    let u = UNIT_POS_X as usize;
    let valid = t < t_total;

    let mut m = 0.0f32;
    if valid {
        let mut k = u;
        while k < inp {
            let v = x[t * inp + k];
            m = f32::max(m, f32::abs(v));
            k += SPLIT_THREADS;
        }
    }
    let mut shared = Shared::<[f32]>::new_slice(SPLIT_THREADS);
    shared[u] = m;
    sync_cube();
    // Unrolled: a mutable that starts from a constant and changes in a loop does not
    // compile in CubeCL 0.11.3 (its IR verifier wants a pointer where it finds an index).
    #[unroll]
    for i in 0..8 {
        let half = (SPLIT_THREADS / 2) >> i;
        if u < half {
            let a = shared[u];
            let b = shared[u + half];
            shared[u] = f32::max(a, b);
        }
        sync_cube();
    }
    // The biased exponent of the row's largest magnitude (255 for inf or NaN, which then
    // propagate), at least 15 so both factors stay normal: `scale = 2^(141 - e)` puts the
    // largest magnitude in [2^14, 2^15), `2^(e - 141)` undoes it, both exact.
    let max = shared[0];
    let e = u32::max((u32::reinterpret(max) >> 23) & 255u32, 15u32);
    let scale = f32::reinterpret((268u32 - e) << 23);
    if u == 0 {
        inv[t] = f32::reinterpret((e - 14u32) << 23);
    }

    let hi_base = (tile * COLS + j) * in_pad;
    let lo_base = (tile * COLS + TILE + j) * in_pad;
    let mut k = u;
    while k < in_pad {
        // Position 16g + p holds element 16g + 2p for p < 8, 16g + 2(p - 8) + 1 after.
        let p = k & 15;
        let src = k - p + (((p & 7) << 1) | (p >> 3));
        let mut v = 0.0f32;
        if valid && src < inp {
            v = x[t * inp + src] * scale;
        }
        // The high part is rounded to f16's 11 significant bits on the f32 bits: NVIDIA's
        // Vulkan compiler folds `f32(f16(v))` back into `v`, which left the low part zero.
        let high = f32::reinterpret((u32::reinterpret(v) + 0x1000u32) & 0xFFFF_E000u32);
        xp[hi_base + k] = f16::cast_from(high);
        xp[lo_base + k] = f16::cast_from(v - high);
        k += SPLIT_THREADS;
    }
}

/// 16 int8 weights.
type Word4 = Vector<u32, Const<4>>;

/// Eight f16.
type Half8 = Vector<f16, Const<8>>;

/// Loads this lane's share of one chunk of a plane's rows: `rows` rows of `chunk` 16-byte
/// vectors each, lane-consecutive along a row. Rows past the end read the last one and
/// vectors past the row's end the next row (or, past the buffer, its last vector): the
/// activations are zero there, and results of rows past the end are never written.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_chunk(
    w: &[Word4],
    regs: &mut Array<Word4>,
    row0: usize,
    chunk_index: usize,
    out: usize,
    row_vectors: usize,
    total: usize,
    #[comptime] rows: usize,
    #[comptime] chunk: usize,
) {
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for i in 0..comptime!(rows * chunk / 32) {
        let f = lane + 32 * i;
        let row = usize::min(row0 + f / chunk, out - 1);
        let idx = row * row_vectors + chunk_index * chunk + f % chunk;
        regs[i] = w[usize::min(idx, total - 1)];
    }
}

/// A 16x16 f32 accumulator fragment at zero.
#[cube]
fn accumulator() -> cmma::Matrix<f32> {
    cmma::Matrix::<f32>::from_value(
        cmma::MatrixIdent::Accumulator,
        FRAG,
        FRAG,
        FRAG,
        cmma::MatrixLayout::Undefined,
        0.0,
    )
}

/// Loads block `i` (rows `16 i ..`) of a plane's widened tile into `a`.
#[cube]
fn load_block(
    widened: &Shared<[Half8]>,
    a: &mut cmma::Matrix<f16>,
    a0: usize,
    #[comptime] i: usize,
    #[comptime] units: usize,
    stride: u32,
) {
    let at = a0 + comptime!(i * FRAG * units);
    cmma::load(a, widened.slice(at, at + comptime!(FRAG * units)), stride);
}

/// A 16x16 block's sums into shared memory from `at`, row-major.
#[cube]
fn store_block(sums: &mut Shared<[f32]>, acc: &cmma::Matrix<f32>, at: usize) {
    cmma::store(
        sums.slice_mut(at, at + FRAG * FRAG),
        acc,
        FRAG as u32,
        cmma::MatrixLayout::RowMajor,
    );
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn mma_kernel(
    xp: &[f16],
    inv: &[f32],
    w: &[Word4],
    scales: &[u32],
    bias: &[f32],
    y: &mut [f32],
    t_total: usize,
    out: usize,
    words: usize,
    in_pad: usize,
    chunks: usize,
    #[comptime] blocks: usize,
    #[comptime] splits: usize,
    #[comptime] chunk: usize,
    #[comptime] has_bias: bool,
) {
    let lane = UNIT_POS_X as usize;
    let split = UNIT_POS_Y as usize;
    let rows = comptime!(blocks * FRAG);
    let per_lane = comptime!(rows * chunk / 32);
    let units = comptime!(2 * chunk + 1);
    let stride = comptime!((8 * (2 * chunk + 1)) as u32);
    let row0 = CUBE_POS_X as usize * rows;
    let tile = CUBE_POS_Y as usize;
    let row_vectors = words / 4;
    let total = out * row_vectors;

    let mut widened = Shared::<[Half8]>::new_slice(splits * rows * units);
    let base = split * rows * units;
    let flip = Word4::new(0x8080_8080u32);
    let mask = Word4::new(0x00FF_00FFu32);
    let magic = Word4::new(0x6400_6400u32);
    let offset = Half8::new(f16::new(1152.0));

    let acc0 = accumulator();
    let acc1 = accumulator();
    let acc2 = accumulator();
    let acc3 = accumulator();
    // SAFETY: both fragments are loaded before each use.
    let mut a = unsafe {
        cmma::Matrix::<f16>::uninitialized(
            cmma::MatrixIdent::A,
            FRAG,
            FRAG,
            FRAG,
            cmma::MatrixLayout::RowMajor,
        )
    };
    // SAFETY: as above.
    let mut b = unsafe {
        cmma::Matrix::<f16>::uninitialized(
            cmma::MatrixIdent::B,
            FRAG,
            FRAG,
            FRAG,
            cmma::MatrixLayout::ColMajor,
        )
    };

    let first = split * chunks;
    let mut regs = Array::<Word4>::new(per_lane);
    load_chunk(
        w,
        &mut regs,
        row0,
        first,
        out,
        row_vectors,
        total,
        rows,
        chunk,
    );
    let x_base = tile * COLS * in_pad;
    for c in 0..chunks {
        let chunk_index = first + c;
        #[unroll]
        for i in 0..per_lane {
            let f = lane + 32 * i;
            let at = base + (f / chunk) * units + (f % chunk) * 2;
            let v = regs[i] ^ flip;
            let even = (v & mask) | magic;
            let odd = ((v >> Word4::new(8u32)) & mask) | magic;
            widened[at] = Half8::reinterpret(even) - offset;
            widened[at + 1] = Half8::reinterpret(odd) - offset;
        }
        // Each plane reads only its own rows of the widened tile: a plane barrier is enough,
        // and lets planes run ahead of each other (measured 20-25% faster on the H200 than
        // a cube barrier).
        sync_plane();
        // The next chunk's loads are in flight while the tensor cores work on this one.
        if c + 1 < chunks {
            load_chunk(
                w,
                &mut regs,
                row0,
                chunk_index + 1,
                out,
                row_vectors,
                total,
                rows,
                chunk,
            );
        }
        #[unroll]
        for s in 0..chunk {
            let k = chunk_index * comptime!(chunk * FRAG) + s * FRAG;
            let xs = x_base + k;
            cmma::load(
                &mut b,
                xp.slice(xs, xs + (COLS - 1) * in_pad + FRAG),
                in_pad as u32,
            );
            let a0 = base + s * 2;
            load_block(&widened, &mut a, a0, 0usize, units, stride);
            cmma::execute(&a, &b, &acc0, &acc0);
            if comptime!(blocks >= 2) {
                load_block(&widened, &mut a, a0, 1usize, units, stride);
                cmma::execute(&a, &b, &acc1, &acc1);
            }
            if comptime!(blocks >= 3) {
                load_block(&widened, &mut a, a0, 2usize, units, stride);
                cmma::execute(&a, &b, &acc2, &acc2);
            }
            if comptime!(blocks >= 4) {
                load_block(&widened, &mut a, a0, 3usize, units, stride);
                cmma::execute(&a, &b, &acc3, &acc3);
            }
        }
        sync_plane();
    }

    let mut sums = Shared::<[f32]>::new_slice(splits * blocks * FRAG * FRAG);
    let c0 = split * comptime!(blocks * FRAG * FRAG);
    store_block(&mut sums, &acc0, c0);
    if comptime!(blocks >= 2) {
        store_block(&mut sums, &acc1, c0 + FRAG * FRAG);
    }
    if comptime!(blocks >= 3) {
        store_block(&mut sums, &acc2, c0 + 2 * FRAG * FRAG);
    }
    if comptime!(blocks >= 4) {
        store_block(&mut sums, &acc3, c0 + 3 * FRAG * FRAG);
    }
    sync_cube();

    let mut o = split * 32 + lane;
    while o < comptime!(rows * TILE) {
        let r = o / TILE;
        let j = o % TILE;
        let mut sum = 0.0f32;
        #[unroll]
        for p in 0..splits {
            let at = p * comptime!(blocks * FRAG * FRAG) + r * FRAG + j;
            sum += sums[at] + sums[at + TILE];
        }
        let row = row0 + r;
        let t = tile * TILE + j;
        if row < out && t < t_total {
            let mut value = sum * inv[t] * row_scale(scales, row);
            if comptime!(has_bias) {
                value += bias[row];
            }
            y[t * out + row] = value;
        }
        o += comptime!(32 * splits);
    }
}

/// The tensor-core product `y = x W^T * scale (+ bias)`, on `x`'s client. `x`, `values`,
/// `scales` and `bias` are contiguous and checked by the caller; `y` is the caller's output
/// (`[t, out]` f32).
pub(super) fn run(
    x: &CubeTensor,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
    y: &Handle,
    tuning: MmaTuning,
) {
    let [t, inp] = x.meta.shape().dims::<2>();
    let out = values.meta.shape().dims::<2>()[0];
    let client = x.client.clone();
    let rows = tuning.blocks * FRAG;
    let words = inp / 4;
    let tiles = t.div_ceil(TILE);
    // Every plane runs the same number of chunks (they meet at barriers), so the row is
    // padded to `splits * chunks` chunks: the activations are zero there.
    let step = tuning.chunk * FRAG;
    let chunks = inp.div_ceil(step).div_ceil(tuning.splits);
    let in_pad = tuning.splits * chunks * step;
    let xp = client.empty(tiles * COLS * in_pad * size_of::<f16>());
    let inv = client.empty(tiles * TILE * size_of::<f32>());
    // SAFETY: `x` is `[t, inp]` f32; `xp` holds `tiles * COLS * in_pad` f16 and `inv`
    // `tiles * TILE` f32, and the kernel writes exactly those, one cube per activation row
    // of each tile (`t` rows or past them, read as zero).
    unsafe {
        split_kernel::launch_unchecked(
            &client,
            CubeCount::Static(TILE as u32, tiles as u32, 1),
            CubeDim::new_1d(SPLIT_THREADS as u32),
            BufferArg::from_raw_parts(x.handle.clone(), t * inp),
            BufferArg::from_raw_parts(xp.clone(), tiles * COLS * in_pad),
            BufferArg::from_raw_parts(inv.clone(), tiles * TILE),
            t,
            inp,
            in_pad,
        );
    }
    let bias_arg = bias.unwrap_or(scales);
    let bias_len = if bias.is_some() { out } else { 1 };
    // SAFETY: lengths are in elements of the bound type: `xp` and `inv` as written above,
    // `values` `out * inp` bytes as `out * inp / 16` vectors of four words (`inp % 16 == 0`,
    // checked by the caller through `fits`), `scales` `out`
    // f16 rounded up to words, `bias` `out` f32 (or one word of the scales, never read
    // without a bias), `y` `t * out` f32. Fragment loads read `xp` inside one tile's
    // `COLS * in_pad` block (chunks stop at `in_pad`); weight loads clamp rows and indices
    // to the buffer; `y` is written once per (row < out, t < T).
    unsafe {
        mma_kernel::launch_unchecked(
            &client,
            CubeCount::Static(out.div_ceil(rows) as u32, tiles as u32, 1),
            CubeDim::new_2d(32, tuning.splits as u32),
            BufferArg::from_raw_parts(xp, tiles * COLS * in_pad),
            BufferArg::from_raw_parts(inv, tiles * TILE),
            BufferArg::from_raw_parts(values.handle.clone(), out * words / 4),
            BufferArg::from_raw_parts(scales.handle.clone(), out.div_ceil(2)),
            BufferArg::from_raw_parts(bias_arg.handle.clone(), bias_len),
            BufferArg::from_raw_parts(y.clone(), t * out),
            t,
            out,
            words,
            in_pad,
            chunks,
            tuning.blocks,
            tuning.splits,
            tuning.chunk,
            bias.is_some(),
        );
    }
}

/// Run on whatever CubeCL adapter the machine has (lavapipe in CI, which has no cooperative
/// matrices): the split kernel against its definition in f64, and the tensor-core kernel's
/// expansion, which on such an adapter must get as far as the device's refusal of its
/// fragments. The products themselves are checked in `tests/q8_wgpu.rs` where fragments exist.
#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, DeviceType};

    /// The first CubeCL adapter's client, or `None` (skip) unless `BURN_MAPPED_REQUIRE_GPU=1`.
    fn client() -> Option<Client> {
        let device = Device::enumerate(DeviceType::Wgpu).first().cloned();
        let client = device.and_then(|d| match d.as_dispatch() {
            burn::backend::DispatchDevice::Cube(d) => Some(d.client()),
            _ => None,
        });
        if client.is_none() && std::env::var("BURN_MAPPED_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            panic!("BURN_MAPPED_REQUIRE_GPU=1 but no wgpu adapter");
        }
        client
    }

    /// A fresh, never-zero stream of values in roughly [-1, 1].
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                if u < 0.5 {
                    u - 0.5 - 1e-3
                } else {
                    u - 0.5 + 1e-3
                }
            })
            .collect()
    }

    #[test]
    fn split_rows_carry_the_activations_to_22_bits_in_the_widened_order() {
        let Some(client) = client() else { return };
        if !client
            .properties()
            .supports_type(ElemType::Float(FloatKind::F16))
        {
            eprintln!("no f16 on this adapter: split kernel not run");
            return;
        }
        // Two tiles (T = 11), a row past f16's range, one below its normal range, one zero;
        // `in_pad` past `in` (zero padding).
        let (t, inp, in_pad) = (11usize, 48usize, 80usize);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64);
        eprintln!("seed {seed}");
        let mut x = values(t * inp, seed);
        for (row, factor) in [(1, 3e6f32), (2, 1e-9), (3, 0.0)] {
            x[row * inp..(row + 1) * inp]
                .iter_mut()
                .for_each(|v| *v *= factor);
        }
        let tiles = t.div_ceil(TILE);
        let xp = client.empty(tiles * COLS * in_pad * 2);
        let inv = client.empty(tiles * TILE * 4);
        let xh = client.create_from_slice(f32::as_bytes(&x));
        // SAFETY: `x` holds `t * inp` f32, `xp` `tiles * COLS * in_pad` f16 and `inv`
        // `tiles * TILE` f32, which one cube per row of each tile writes.
        unsafe {
            split_kernel::launch_unchecked(
                &client,
                CubeCount::Static(TILE as u32, tiles as u32, 1),
                CubeDim::new_1d(SPLIT_THREADS as u32),
                BufferArg::from_raw_parts(xh, t * inp),
                BufferArg::from_raw_parts(xp.clone(), tiles * COLS * in_pad),
                BufferArg::from_raw_parts(inv.clone(), tiles * TILE),
                t,
                inp,
                in_pad,
            );
        }
        let xp = client.read_one(xp).unwrap();
        let xp: Vec<f16> = bytes_as(&xp, |b| f16::from_le_bytes([b[0], b[1]]));
        let inv = client.read_one(inv).unwrap();
        let inv: Vec<f32> = bytes_as(&inv, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        for tile in 0..tiles {
            for j in 0..TILE {
                let row = tile * TILE + j;
                let f = f64::from(inv[row]);
                assert!(
                    f > 0.0 && (f.log2().fract() == 0.0),
                    "row {row}: factor {f}"
                );
                let max = if row < t {
                    x[row * inp..(row + 1) * inp]
                        .iter()
                        .fold(0f32, |m, v| m.max(v.abs()))
                } else {
                    0.0
                };
                for k in 0..in_pad {
                    let hi = xp[(tile * COLS + j) * in_pad + k].to_f64();
                    let lo = xp[(tile * COLS + TILE + j) * in_pad + k].to_f64();
                    // Scaled below 2^15, a value within f16's last step of it rounds to 2^15.
                    assert!(
                        hi.abs() <= 32768.0,
                        "row {row} k {k}: high part {hi} not scaled"
                    );
                    // Position 16g + p holds element 16g + 2p (p < 8), 16g + 2(p - 8) + 1.
                    let p = k % 16;
                    let src = k - p + if p < 8 { 2 * p } else { 2 * (p - 8) + 1 };
                    let want = if row < t && src < inp {
                        f64::from(x[row * inp + src])
                    } else {
                        0.0
                    };
                    let got = (hi + lo) * f;
                    // 22 bits of each value, or f16's subnormal step 2^-24 (scaled back).
                    let bound = (want.abs() * 2f64.powi(-21)).max(f * 2f64.powi(-24));
                    assert!(
                        (got - want).abs() <= bound,
                        "row {row} k {k}: {got} vs {want} (row max {max})"
                    );
                }
                if max > 0.0 {
                    let scaled = f64::from(max) / f;
                    assert!(
                        (16384.0..32768.0).contains(&scaled),
                        "row {row}: max scaled to {scaled}"
                    );
                }
            }
        }
    }

    fn bytes_as<T>(bytes: &[u8], f: impl Fn(&[u8]) -> T) -> Vec<T> {
        bytes.chunks_exact(size_of::<T>()).map(f).collect()
    }

    /// Without fragments the kernel cannot run, but its whole expansion happens before the
    /// compiler is asked: the launch must fail on the fragments alone, every shape.
    #[test]
    fn without_fragments_the_kernel_expands_and_only_its_fragments_are_refused() {
        let Some(client) = client() else { return };
        if available(&client) {
            eprintln!("this adapter has fragments: tests/q8_wgpu.rs runs the kernel");
            return;
        }
        for tuning in [
            MmaTuning::DEFAULT,
            MmaTuning {
                blocks: 1,
                splits: 1,
                chunk: 2,
            },
        ] {
            let (t, out, inp) = (3usize, 40usize, 64usize);
            let rows = tuning.blocks * FRAG;
            let in_pad = 256;
            let words = vec![0u32; out * inp / 4];
            let w = client.create_from_slice(u32::as_bytes(&words));
            let xp = client.empty(COLS * in_pad * 2);
            let inv = client.empty(TILE * 4);
            let scales = client.empty(out.div_ceil(2) * 4);
            let y = client.empty(t * out * 4);
            // SAFETY: every buffer holds the elements stated; the launch is refused before
            // anything runs (and bounded as in `run` if it were not).
            unsafe {
                mma_kernel::launch_unchecked(
                    &client,
                    CubeCount::Static(out.div_ceil(rows) as u32, 1, 1),
                    CubeDim::new_2d(32, tuning.splits as u32),
                    BufferArg::from_raw_parts(xp, COLS * in_pad),
                    BufferArg::from_raw_parts(inv, TILE),
                    BufferArg::from_raw_parts(w, out * inp / 16),
                    BufferArg::from_raw_parts(scales.clone(), out.div_ceil(2)),
                    BufferArg::from_raw_parts(scales, 1),
                    BufferArg::from_raw_parts(y.clone(), t * out),
                    t,
                    out,
                    inp / 4,
                    in_pad,
                    in_pad / (tuning.chunk * FRAG * tuning.splits),
                    tuning.blocks,
                    tuning.splits,
                    tuning.chunk,
                    false,
                );
            }
            let err = client.read_one(y).expect_err("launched without fragments");
            let msg = format!("{err:?}");
            // The validation errors, one per line after the compiler's own words: the four
            // accumulators and the A and B fragments, nothing else.
            let refused = msg
                .lines()
                .filter(|l| l.contains("cooperative matrix fragment"))
                .count();
            let errors = msg
                .lines()
                .filter(|l| l.contains("the device doesn't"))
                .count();
            assert!(refused == 6 && errors == 6, "{tuning}: {msg}");
        }
    }
}
