//! The q8 product as a Burn backend extension: the host kernel on Flex ([`super::flex`]) and,
//! with the `wgpu` feature, the CubeCL kernels enqueued on the stream of the activations
//! (`super::cube`). Callers go through [`q8_linear`](super::q8_linear) and
//! [`q8_linear_input`](super::q8_linear_input).

use burn::backend::Backend;
use burn::backend::backend_extension;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape};

use super::split::{SPLIT_BLOCK, SPLIT_WORDS};
use super::tuning::{DotTuning, Tuning};

/// Output shape `[T, out]` from `x: [T, in]` (or its split) and `values: [out, in]`.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
fn output_shape(x: &Shape, values: &Shape) -> Shape {
    Shape::new([x[0], values[0]])
}

/// Output dtype of `q8_split` (words), whatever the input's.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
fn split_dtype(_x: DType) -> DType {
    DType::U32
}

/// Output shape of `q8_split`: [`SPLIT_WORDS`] words per block of [`SPLIT_BLOCK`] values.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
pub(super) fn split_shape(x: &Shape) -> Shape {
    Shape::new([x[0], x[1] / SPLIT_BLOCK * SPLIT_WORDS])
}

/// Output dtype of the products on a split: f32.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
fn f32_dtype(_split: DType) -> DType {
    DType::F32
}

/// Backends that run the q8 product. `x` is f32 `[T, in]`; `values` I8 `[out, in]`;
/// `scales` F16 `[out]`; `bias` f32 `[out]`. Weights are never written. `values` is taken as
/// an owned handle (a reference-counted clone of the caller's tensor: Burn's extension
/// macro borrows only float tensors); the caller's tensor keeps the storage alive.
///
/// The callers check shapes and dtypes first: these methods assume them (a mismatch panics
/// inside the backend).
#[backend_extension(Flex, Cube: cfg(feature = "cubecl"), Fusion: cfg(feature = "fusion"))]
pub(crate) trait Q8Backend: Backend {
    /// `y[t, o] = scales[o] * sum_i x[t, i] * values[o, i]`, launched as `tuning` says.
    #[fusion(dtype = x, shape = output_shape(x, values))]
    fn q8_matmul(
        x: FloatTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
        tuning: Tuning,
    ) -> FloatTensor<Self>;

    /// As [`q8_matmul`](Self::q8_matmul) plus `bias[o]`, added in the same pass.
    #[fusion(dtype = x, shape = output_shape(x, values))]
    fn q8_matmul_bias(
        x: FloatTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
        tuning: Tuning,
    ) -> FloatTensor<Self>;

    /// Splits `x` (f32 `[T, in]`, `T > 0`, `in % 16 == 0`) into the dp4a kernel's activation
    /// format ([`super::split`]), U32 `[T, 9 * in / 16]`, for any number of
    /// [`q8_matmul_split`](Self::q8_matmul_split) over it.
    #[fusion(dtype = split_dtype(x), shape = split_shape(x))]
    fn q8_split(x: FloatTensor<Self>) -> IntTensor<Self>;

    /// [`q8_matmul`](Self::q8_matmul) on activations [`q8_split`](Self::q8_split) from
    /// `x`: the same rounding as the dp4a kernel wherever it runs, which launches with `shape`
    /// on a CubeCL device.
    #[fusion(dtype = f32_dtype(split), shape = output_shape(split, values))]
    fn q8_matmul_split(
        split: IntTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
        shape: DotTuning,
    ) -> FloatTensor<Self>;

    /// As [`q8_matmul_split`](Self::q8_matmul_split) plus `bias[o]`.
    #[fusion(dtype = f32_dtype(split), shape = output_shape(split, values))]
    fn q8_matmul_split_bias(
        split: IntTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
        shape: DotTuning,
    ) -> FloatTensor<Self>;
}
