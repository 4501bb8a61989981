//! The q8 product on CubeCL: compiled to WGSL on Burn's wgpu backend, and to SPIR-V on its
//! vulkan backend (feature `vulkan`; the same `CubeBackend`, whose wgpu runtime picks the
//! compiler per adapter when the device is opened). Two kernels: the FMA kernel ([`fma`]),
//! which runs every product, and the dp4a kernel ([`dot`]) on packed int8 dot products,
//! which runs rows of whole blocks of 16 and is the default where `dp4a` is native. The dp4a
//! kernel also runs [`fused`] products, whose cubes compute their own input (for the direct
//! launches of [`direct`]).
//!
//! WGSL has no 8-bit storage, so the kernels bind the int8 tensor's buffer as 32-bit words:
//! the same bytes, four int8 values per word, little-endian (value `4k + b` of a row is byte
//! `b` of word `k`). Rows start on word boundaries only if `in % 4 == 0`, which
//! [`Q8Weight::new`](crate::q8::Q8Weight::new) requires on CubeCL devices. The f16 scales
//! are bound as words too (two per word) and decoded in the kernel ([`common`]), so no f16
//! shader support is needed; WebGPU binds buffers in multiples of 4 bytes, which covers an
//! odd row count.
//!
//! The same word layout serves SPIR-V, which could bind bytes but need not (8-bit storage is
//! an optional Vulkan feature). The kernels are launched on the activation tensor's client,
//! so they are ordered on Burn's stream after whatever produced `x`, with no host
//! synchronization, on either compiler.

mod blocks;
mod common;
pub mod direct;
mod dot;
mod fma;
mod fused;
mod matrix;
mod paired;

#[cfg(any(test, feature = "gpu-tests"))]
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
#[cfg(any(test, feature = "gpu-tests"))]
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::backend::Q8Backend;
use super::split::{SPLIT_BLOCK, SPLIT_WORDS};
use super::tuning::{CubeLaunch, CubeTuning, DotTuning, TILE, Tuning};

#[cfg(any(test, feature = "gpu-tests"))]
static POISON: AtomicBool = AtomicBool::new(false);

/// Makes the GPU kernels fill their output with NaN before writing it, so an element a
/// kernel misses reads as NaN instead of stale memory. Costs one upload per call; tests only.
/// (The host kernel always starts from NaN: its buffer is fresh anyway.)
#[cfg(any(test, feature = "gpu-tests"))]
pub fn set_poison_outputs(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

/// The one launch decision, for a product of `t` activation rows of `inp` values on
/// `client`: a requested launch (`cube`) where it runs (the dp4a kernel needs whole blocks of
/// 16), else the tile's default: the dp4a kernel where the dot product is native and the row
/// fits, the FMA kernel elsewhere (CubeCL expands `dp4a` into shifts and multiplies on WGSL).
pub(super) fn launch_on(
    client: &Client,
    t: usize,
    inp: usize,
    cube: Option<CubeLaunch>,
) -> CubeLaunch {
    let tile = t.clamp(1, TILE);
    let blocks = dot::fits(inp);
    match cube {
        Some(CubeLaunch::Fma(f)) => CubeLaunch::Fma(f),
        Some(CubeLaunch::Dot(d)) if blocks => CubeLaunch::Dot(d),
        None if blocks && native_dot(client) => CubeLaunch::Dot(DotTuning::default_for(tile)),
        _ => CubeLaunch::Fma(CubeTuning::default_for(tile)),
    }
}

/// Whether `client` compiles `dp4a` to the device's own instruction: CubeCL's SPIR-V
/// compiler does where Vulkan offers `shaderIntegerDotProduct` (core in Vulkan 1.3); its WGSL
/// compiler always expands it.
fn native_dot(client: &Client) -> bool {
    client.name() == "wgpu<spirv>"
}

fn contiguous(t: &CubeTensor) -> CubeTensor {
    if t.is_contiguous() {
        t.clone()
    } else {
        into_contiguous(t.clone())
    }
}

/// The product's output `[t, out]` f32: uninitialized, or NaN when outputs are poisoned.
fn output(client: &Client, t: usize, out: usize) -> Handle {
    #[cfg(any(test, feature = "gpu-tests"))]
    if POISON.load(Ordering::Relaxed) {
        return client.create_from_slice(f32::as_bytes(&vec![f32::NAN; t * out]));
    }
    client.empty(t * out * size_of::<f32>())
}

fn run(
    x: CubeTensor,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
    tuning: Tuning,
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
    assert!(
        t > 0 && out > 0 && inp > 0,
        "q8_matmul: empty operands are handled by q8_linear"
    );
    let client = x.client.clone();
    let y = output(&client, t, out);
    match launch_on(&client, t, inp, tuning.cube) {
        CubeLaunch::Dot(d) => {
            dot::run_split(&dot::split(&x), &values, &scales, bias.as_ref(), &y, d);
        }
        CubeLaunch::Fma(f) => fma::run(&x, &values, &scales, bias.as_ref(), &y, f),
    }
    CubeTensor::new_contiguous(
        client,
        x.device.clone(),
        Shape::new([t, out]),
        y,
        DType::F32,
    )
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

/// The dp4a product with `shape` on a split made by [`split`].
fn run_split(
    split: CubeTensor,
    values: &CubeTensor,
    scales: &CubeTensor,
    bias: Option<&CubeTensor>,
    shape: DotTuning,
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
    dot::run_split(&split, &values, &scales, bias.as_ref(), &y, shape);
    CubeTensor::new_contiguous(
        client,
        split.device.clone(),
        Shape::new([t, out]),
        y,
        DType::F32,
    )
}

impl Q8Backend for CubeBackend {
    fn q8_matmul(
        x: CubeTensor,
        values: CubeTensor,
        scales: &CubeTensor,
        tuning: Tuning,
    ) -> CubeTensor {
        run(x, &values, scales, None, tuning)
    }

    fn q8_matmul_bias(
        x: CubeTensor,
        values: CubeTensor,
        scales: &CubeTensor,
        bias: &CubeTensor,
        tuning: Tuning,
    ) -> CubeTensor {
        run(x, &values, scales, Some(bias), tuning)
    }

    fn q8_split(x: CubeTensor) -> CubeTensor {
        split(x)
    }

    fn q8_matmul_split(
        split: CubeTensor,
        values: CubeTensor,
        scales: &CubeTensor,
        shape: DotTuning,
    ) -> CubeTensor {
        run_split(split, &values, scales, None, shape)
    }

    fn q8_matmul_split_bias(
        split: CubeTensor,
        values: CubeTensor,
        scales: &CubeTensor,
        bias: &CubeTensor,
        shape: DotTuning,
    ) -> CubeTensor {
        run_split(split, &values, scales, Some(bias), shape)
    }
}
