//! [`q8_linear`] and the checks it shares with [`q8_linear_input`](super::q8_linear_input).

use burn::backend::Dispatch;
use burn::tensor::{DType, Tensor};

use super::backend::Q8Backend;
use super::error::Q8Error;
use super::weight::Q8Weight;

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
    let tuning = w.tuning();
    let y = match bias {
        None => Dispatch::q8_matmul(x.into_dispatch(), values, &scales, tuning),
        Some(b) => Dispatch::q8_matmul_bias(
            x.into_dispatch(),
            values,
            &scales,
            &to_f32(b).into_dispatch(),
            tuning,
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
