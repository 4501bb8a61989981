//! The `q8_linear` op as a Burn backend extension: a host kernel for Flex and, with the
//! `wgpu` feature, a CubeCL kernel enqueued on the stream of the activations.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::{DType, Shape, Tensor};

use super::error::Q8Error;
use super::split::{SPLIT_BLOCK, SPLIT_WORDS};
use super::weight::Q8Weight;

/// Output shape `[T, out]` from `x: [T, in]` and `values: [out, in]`.
/// Output dtype of `q8_read`, whatever the input's.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
fn read_dtype(_values: DType) -> DType {
    DType::U32
}

/// Output shape of `q8_read`, whatever the input's.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
fn read_shape(_values: &Shape) -> Shape {
    Shape::new([READ_PARTIALS])
}

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
fn split_shape(x: &Shape) -> Shape {
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
/// Callers go through [`q8_linear`], which checks shapes and dtypes first: these methods
/// assume them (a mismatch panics inside the backend).
#[backend_extension(Flex, Cube: cfg(feature = "wgpu"), Fusion: cfg(feature = "fusion"))]
pub trait Q8Backend: Backend {
    /// `y[t, o] = scales[o] * sum_i x[t, i] * values[o, i]`.
    #[fusion(dtype = x, shape = output_shape(x, values))]
    fn q8_matmul(
        x: FloatTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// Reads every byte of `values` once and returns [`READ_PARTIALS`] XOR checksums (U32):
    /// the bandwidth ceiling `q8_matmul` is measured against, over the same bytes.
    #[fusion(dtype = read_dtype(values), shape = read_shape(values))]
    fn q8_read(values: IntTensor<Self>) -> IntTensor<Self>;

    /// Splits `x` (f32 `[T, in]`, `T > 0`, `in % 16 == 0`) into the dp4a kernel's activation
    /// format ([`super::split`]), U32 `[T, 9 * in / 16]`, for any number of
    /// [`q8_matmul_split`](Self::q8_matmul_split) over it.
    #[fusion(dtype = split_dtype(x), shape = split_shape(x))]
    fn q8_split(x: FloatTensor<Self>) -> IntTensor<Self>;

    /// [`q8_matmul`](Self::q8_matmul) on activations [`q8_split`](Self::q8_split) from
    /// `x`: the same rounding as the dp4a kernel wherever it runs.
    #[fusion(dtype = f32_dtype(split), shape = output_shape(split, values))]
    fn q8_matmul_split(
        split: IntTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// As [`q8_matmul_split`](Self::q8_matmul_split) plus `bias[o]`.
    #[fusion(dtype = f32_dtype(split), shape = output_shape(split, values))]
    fn q8_matmul_split_bias(
        split: IntTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// As [`q8_matmul`](Self::q8_matmul) plus `bias[o]`, added in the same pass.
    #[fusion(dtype = x, shape = output_shape(x, values))]
    fn q8_matmul_bias(
        x: FloatTensor<Self>,
        values: IntTensor<Self>,
        scales: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// Length of the checksum tensor [`read_weight`] returns.
pub const READ_PARTIALS: usize = 1024;

/// Reads every byte of the weight's int8 values once, with the same threads (host) or on the
/// same stream (GPU) as [`q8_linear`], and returns `[READ_PARTIALS]` U32 partial checksums
/// whose XOR is the XOR of the bytes as little-endian u32 words (the last zero-padded). It
/// does no arithmetic on the values: its rate is the read ceiling for the product. Benchmark
/// use.
pub fn read_weight(w: &Q8Weight) -> Tensor<1, burn::tensor::Int> {
    let values = w.values().clone().into_dispatch();
    Tensor::from_dispatch(Dispatch::q8_read(values))
}

/// `y = x W^T * scale + bias` for a q8 weight: `x` is `[T, in]`, the result `[T, out]`.
///
/// One pass over the weights serves every activation row: the host kernel runs all `T`
/// rows against each cached block of weight rows (in tiles of 4 columns); the GPU kernel
/// takes up to 8 columns per pass and launches `ceil(T / 8)` passes in one dispatch for
/// larger `T`. Accumulation is f32. A non-f32 `x` (or `bias`) is cast to f32 and the
/// result cast back.
///
/// # Errors
///
/// [`Q8Error::Shape`] if `x` is not `[T, in]` or `bias` not `[out]`, [`Q8Error::Device`]
/// if `x` or `bias` is not on the weight's device, [`Q8Error::DType`] for a non-float
/// bias.
pub fn q8_linear(
    x: Tensor<2>,
    w: &Q8Weight,
    bias: Option<Tensor<1>>,
) -> Result<Tensor<2>, Q8Error> {
    let [t, _] = x.dims();
    check_operands(x.dims(), &x.device(), w, bias.as_ref())?;
    let dtype = x.dtype();
    if let Some(y) = empty_product(t, w, bias.as_ref(), dtype) {
        return Ok(y);
    }
    let x = to_f32(x);
    let values = w.values().clone().into_dispatch();
    let scales = w.scales().clone().into_dispatch();
    let y = match bias {
        None => Dispatch::q8_matmul(x.into_dispatch(), values, &scales),
        Some(b) => Dispatch::q8_matmul_bias(
            x.into_dispatch(),
            values,
            &scales,
            &to_f32(b).into_dispatch(),
        ),
    };
    Ok(cast_to(Tensor::<2>::from_dispatch(y), dtype))
}

/// `v` as f32, cast only if it is not.
pub(super) fn to_f32<const D: usize>(v: Tensor<D>) -> Tensor<D> {
    if v.dtype() == DType::F32 {
        v
    } else {
        v.cast(DType::F32)
    }
}

/// `y` (f32) as `dtype`, cast only if that differs.
pub(super) fn cast_to(y: Tensor<2>, dtype: DType) -> Tensor<2> {
    if dtype == DType::F32 {
        y
    } else {
        y.cast(dtype)
    }
}

/// The checks of [`q8_linear`] on activations of shape `x` on `device`.
pub(super) fn check_operands(
    x: [usize; 2],
    device: &burn::tensor::Device,
    w: &Q8Weight,
    bias: Option<&Tensor<1>>,
) -> Result<(), Q8Error> {
    let (out, inp) = (w.out_features(), w.in_features());
    let [t, x_in] = x;
    if x_in != inp {
        return Err(Q8Error::Shape {
            what: "q8_linear input",
            found: vec![t, x_in],
            expected: format!("[T, {inp}] for a [{out}, {inp}] weight"),
        });
    }
    let w_device = w.values().device();
    if *device != w_device {
        return Err(Q8Error::Device {
            what: "q8_linear input",
            found: format!("{device:?}"),
            expected: format!("{w_device:?}"),
        });
    }
    if let Some(b) = bias {
        if b.dims() != [out] {
            return Err(Q8Error::Shape {
                what: "q8_linear bias",
                found: b.dims().to_vec(),
                expected: format!("[{out}]"),
            });
        }
        if b.device() != w_device {
            return Err(Q8Error::Device {
                what: "q8_linear bias",
                found: format!("{:?}", b.device()),
                expected: format!("{w_device:?}"),
            });
        }
    }
    Ok(())
}

/// With no products to accumulate, the result: the bias (or zero) on every row. The kernels
/// are never launched on empty operands.
pub(super) fn empty_product(
    t: usize,
    w: &Q8Weight,
    bias: Option<&Tensor<1>>,
    dtype: DType,
) -> Option<Tensor<2>> {
    let out = w.out_features();
    if t > 0 && out > 0 && w.in_features() > 0 {
        return None;
    }
    let y = Tensor::<2>::zeros([t, out], (&w.values().device(), dtype));
    Some(match bias {
        Some(b) if t > 0 && out > 0 => y + b.clone().cast(dtype).unsqueeze::<2>(),
        _ => y,
    })
}

mod flex {
    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::tensor::{DType, TensorData, f16};

    use super::{Q8Backend, READ_PARTIALS};
    use crate::q8::cpu::{Gemm, Isa, cpu_threads, gemm, read_xor};
    use crate::q8::split::{self, SPLIT_BLOCK, SPLIT_WORDS};

    /// A contiguous typed view of `t`, copying only if its layout is strided (never the case
    /// for adopted store tensors).
    fn contiguous(t: &FlexTensor) -> std::borrow::Cow<'_, FlexTensor> {
        if t.layout().contiguous_offsets().is_some() {
            std::borrow::Cow::Borrowed(t)
        } else {
            std::borrow::Cow::Owned(t.to_contiguous())
        }
    }

    fn run(
        x: FlexTensor,
        values: &FlexTensor,
        scales: &FlexTensor,
        bias: Option<&FlexTensor>,
    ) -> FlexTensor {
        assert_eq!(x.dtype(), DType::F32, "q8_matmul: x must be f32");
        let [t, inp] = x.layout().shape().dims::<2>();
        let [out, w_in] = values.layout().shape().dims::<2>();
        assert_eq!(
            inp, w_in,
            "q8_matmul: x is [{t}, {inp}], weight [{out}, {w_in}]"
        );
        let (x, values, scales) = (contiguous(&x), contiguous(values), contiguous(scales));
        let bias = bias.map(contiguous);
        let args = Gemm {
            x: x.as_slice::<f32>().expect("contiguous f32"),
            w: values
                .as_slice::<i8>()
                .expect("q8_matmul: values must be contiguous I8"),
            scales: scales
                .as_slice::<f16>()
                .expect("q8_matmul: scales must be contiguous F16"),
            bias: bias
                .as_ref()
                .map(|b| b.as_slice::<f32>().expect("q8_matmul: bias must be f32")),
            t,
            out,
            inp,
        };
        let y = gemm(args, Isa::detect(), cpu_threads());
        FlexTensor::from_data(TensorData::new(y, [t, out]))
    }

    fn run_split(
        split: &FlexTensor,
        values: &FlexTensor,
        scales: &FlexTensor,
        bias: Option<&FlexTensor>,
    ) -> FlexTensor {
        let [t, words] = split.layout().shape().dims::<2>();
        let [out, inp] = values.layout().shape().dims::<2>();
        assert!(
            t > 0 && inp.is_multiple_of(SPLIT_BLOCK) && words == SPLIT_WORDS * inp / SPLIT_BLOCK,
            "q8_matmul_split: split [{t}, {words}] does not fit a [{out}, {inp}] weight"
        );
        let (split, values, scales) = (contiguous(split), contiguous(values), contiguous(scales));
        let bias = bias.map(contiguous);
        let y = split::gemm(
            split
                .as_slice::<u32>()
                .expect("q8_matmul_split: split must be U32"),
            t,
            values
                .as_slice::<i8>()
                .expect("q8_matmul_split: values must be contiguous I8"),
            scales
                .as_slice::<f16>()
                .expect("q8_matmul_split: scales must be contiguous F16"),
            bias.as_ref().map(|b| {
                b.as_slice::<f32>()
                    .expect("q8_matmul_split: bias must be f32")
            }),
            inp,
        );
        FlexTensor::from_data(TensorData::new(y, [t, out]))
    }

    impl Q8Backend for Flex {
        fn q8_matmul(x: FlexTensor, values: FlexTensor, scales: &FlexTensor) -> FlexTensor {
            run(x, &values, scales, None)
        }

        fn q8_matmul_bias(
            x: FlexTensor,
            values: FlexTensor,
            scales: &FlexTensor,
            bias: &FlexTensor,
        ) -> FlexTensor {
            run(x, &values, scales, Some(bias))
        }

        fn q8_split(x: FlexTensor) -> FlexTensor {
            assert_eq!(x.dtype(), DType::F32, "q8_split: x must be f32");
            let [t, inp] = x.layout().shape().dims::<2>();
            assert!(
                t > 0 && inp > 0 && inp.is_multiple_of(SPLIT_BLOCK),
                "q8_split: x is [{t}, {inp}]; needs T > 0 and `in` a positive multiple of 16"
            );
            let x = contiguous(&x);
            let words = split::split(x.as_slice::<f32>().expect("contiguous f32"), t, inp);
            FlexTensor::from_data(TensorData::new(words, [t, SPLIT_WORDS * inp / SPLIT_BLOCK]))
        }

        fn q8_matmul_split(
            split: FlexTensor,
            values: FlexTensor,
            scales: &FlexTensor,
        ) -> FlexTensor {
            run_split(&split, &values, scales, None)
        }

        fn q8_matmul_split_bias(
            split: FlexTensor,
            values: FlexTensor,
            scales: &FlexTensor,
            bias: &FlexTensor,
        ) -> FlexTensor {
            run_split(&split, &values, scales, Some(bias))
        }

        fn q8_read(values: FlexTensor) -> FlexTensor {
            let values = contiguous(&values);
            let bytes = values.as_slice::<i8>().expect("q8_read: values must be I8");
            // SAFETY: i8 and u8 share size, alignment and validity; same lifetime.
            let bytes: &[u8] =
                unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len()) };
            let mut partials = read_xor(bytes, cpu_threads());
            partials.resize(READ_PARTIALS, 0);
            FlexTensor::from_data(TensorData::new(partials, [READ_PARTIALS]))
        }
    }
}
