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
//! [`q8_linear`]`(x, &weight, bias)` computes
//! `y[t, o] = scale[o] * sum_i x[t, i] * q[o, i] + bias[o]` for `x: [T, in]`, borrowing the weight. It is a Burn backend extension:
//!
//! - **Flex** (CPU): reads the int8 bytes in place (for a store, the mapped file pages),
//!   multi-threaded by output rows, AVX2+FMA when the CPU has them (run-time detection) and a
//!   portable vectorizable loop otherwise. Every `T` is one pass over the weights in memory.
//! - **CubeCL** (feature `wgpu`; `vulkan` for Burn's Vulkan backend, which compiles the same
//!   kernels to SPIR-V instead of WGSL): a `#[cube]` kernel launched on the activation's
//!   stream. The int8 buffer is read as 32-bit words, four values each, so `in` must be a
//!   multiple of 4 on a GPU ([`Q8Error::GpuPacking`] otherwise). Up to 8 activation rows share
//!   a pass; more take `ceil(T / 8)` passes in one dispatch. With the `fusion` feature the op
//!   is a custom operation in Burn's fusion stream. Where `dp4a` is native (SPIR-V) and `in %
//!   16 == 0`, the product takes a second kernel on packed int8 dot products instead, with the
//!   activations split per block of 16 into 16-bit integers ([`SPLIT_BLOCK`], [`SPLIT_Q_MAX`]);
//!   [`Q8Input`] shares that split among the products over the same activations
//!   ([`q8_linear_input`]).
//!
//! Each product picks its kernel and launch shape from `T`, the row width and the device; the
//! measurements behind those defaults are in `docs/GPU.md`.

mod backend;
mod cpu;
#[cfg(feature = "cubecl")]
mod cube;
mod error;
mod flex;
mod input;
mod ops;
mod quantize;
mod split;
mod store;
mod tuning;
mod weight;

/// The q8 product on buffers a caller owns, for decode steps recorded as one graph.
#[cfg(feature = "cubecl")]
pub use cube::direct;
pub use error::Q8Error;
pub use input::{Q8Input, q8_linear_input};
pub use ops::q8_linear;
pub use quantize::{Q8_MAX, Q8Builder, Q8Rows, dequantize_rows, quantize_rows, relative_error};
pub use split::{SPLIT_BLOCK, SPLIT_Q_MAX, SPLIT_WORDS};
pub(crate) use store::add_q8;
pub use store::{
    Q8Written, SCALE_SUFFIX, is_projection_weight, scale_name, write_q8, write_q8_rows,
};
pub use weight::Q8Weight;

// Knobs for benchmarks and tests, outside the documented API.
#[doc(hidden)]
pub use cpu::cpu_kernel_name;
#[cfg(all(feature = "cubecl", any(test, feature = "gpu-tests")))]
#[doc(hidden)]
pub use cube::set_poison_outputs;
#[doc(hidden)]
pub use tuning::{CubeLaunch, CubeTuning, DotTuning, Tuning};
