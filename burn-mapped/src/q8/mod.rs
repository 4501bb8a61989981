//! Packed int8 weights ("q8") and the `q8_linear` op.
//!
//! # Format
//!
//! A q8 matrix `W` (`[out, in]`, a 2-D projection weight) is two store tensors:
//!
//! ```text
//! X.weight        i8  [out, in]  row-major, q[o, i] in [-127, 127]
//!                     manifest: "quant": { "scheme": "q8-row-f16", "scale": "X.weight_scale",
//!                                          "rel_error": 0.0061 }
//! X.weight_scale  f16 [out]      scale[o] = f16(absmax(W[o, :]) / 127); 0 for an all-zero row
//! ```
//!
//! so `W[o, i] ≈ scale[o] * q[o, i]`. The scale tensor is always the weight's name plus
//! [`SCALE_SUFFIX`]. `rel_error` (optional) is `||W - dequant||_F / ||W||_F` in f64 against
//! the values the converter read (after GGUF dequantization); `burn-mapped inspect` shows it.
//!
//! Converters ([`crate::convert`], [`crate::gguf::gguf_to_store`]) quantize the tensors a
//! predicate picks, [`is_projection_weight`] being the rule the CLI uses; embeddings, norms
//! and biases stay float. [`write_q8`] writes one matrix.
//!
//! # The op
//!
//! [`q8_linear`]`(x, &weight, bias)` computes `y[t, o] = scale[o] * sum_i x[t, i] * q[o, i]
//! + bias[o]` for `x: [T, in]`, borrowing the weight. It is a Burn backend extension
//! ([`Q8Backend`]):
//!
//! - **Flex** (CPU): reads the int8 bytes in place (for a store, the mapped file pages),
//!   multi-threaded by output rows, AVX2+FMA when the CPU has them (run-time detection) and a
//!   portable vectorizable loop otherwise. Every `T` is one pass over the weights in memory.
//! - **CubeCL** (feature `wgpu`; `vulkan` for Burn's Vulkan backend, which compiles the same
//!   kernel to SPIR-V instead of WGSL): a `#[cube]` kernel launched on the activation's stream.
//!   The int8 buffer is read as 32-bit words, four values each, so `in` must be a multiple of
//!   4 on a GPU ([`Q8Error::GpuPacking`] otherwise). Up to 8 activation rows share a pass;
//!   more take `ceil(T / 8)` passes in one dispatch. With the `fusion` feature the op is a
//!   custom operation in Burn's fusion stream. Where `dp4a` is native (SPIR-V) and `in % 16
//!   == 0`, the product takes a second kernel on packed int8 dot products instead, with the
//!   activations split per block of 16 into 16-bit integers ([`DotTuning`]; faster on the
//!   H200 at every `T`); [`Q8Input`] shares that split among the products over the same
//!   activations ([`q8_linear_input`]). A third, on tensor cores (f16 cooperative matrices, SPIR-V), is
//!   opt-in through [`set_mma_tuning`]: slower on the H200 ([`MmaTuning`]).

mod cpu;
#[cfg(feature = "wgpu")]
mod cube;
#[cfg(feature = "wgpu")]
mod dot;
mod error;
mod input;
#[cfg(feature = "wgpu")]
mod mma;
mod ops;
mod quantize;
mod split;
mod store;
mod weight;

use std::sync::atomic::{AtomicBool, Ordering};

pub use cpu::{TILE_T as CPU_TILE_T, cpu_kernel_name, cpu_threads, set_cpu_threads};
#[cfg(feature = "wgpu")]
pub use cube::{
    CubeLaunch, CubeTuning, TILE as GPU_TILE_T, cube_launch, cube_tuning, planned_launch,
    reset_cube_tuning, set_cube_tuning, set_dot_tuning, set_mma_tuning, tensor_cores,
};
#[cfg(feature = "wgpu")]
pub use dot::DotTuning;
pub use error::Q8Error;
pub use input::{Q8Input, q8_linear_input};
#[cfg(feature = "wgpu")]
pub use mma::MmaTuning;
pub use ops::{Q8Backend, READ_PARTIALS, q8_linear, read_weight};
pub use quantize::{Q8_MAX, Q8Builder, Q8Rows, dequantize_rows, quantize_rows, relative_error};
pub use split::{SPLIT_BLOCK, SPLIT_Q_MAX, SPLIT_WORDS};
pub(crate) use store::add_q8;
pub use store::{
    Q8Written, SCALE_SUFFIX, is_projection_weight, scale_name, write_q8, write_q8_rows,
};
pub use weight::Q8Weight;

static POISON: AtomicBool = AtomicBool::new(false);

/// Makes the GPU kernel fill its output with NaN before writing it, so an element the
/// kernel misses reads as NaN instead of stale memory. Costs one upload per call; for tests
/// and debugging. (The host kernel always starts from NaN: its buffer is fresh anyway.)
pub fn set_poison_outputs(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

#[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
fn poison_outputs() -> bool {
    POISON.load(Ordering::Relaxed)
}

/// Whether `device` runs on the CubeCL backend (where the word-packing rule applies).
fn on_cube(device: &burn::tensor::Device) -> bool {
    #[cfg(feature = "wgpu")]
    {
        matches!(device.as_dispatch(), burn::backend::DispatchDevice::Cube(_))
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = device;
        false
    }
}
