//! Activations prepared once for several q8 products: the projections of one layer that read
//! the same rows (query, key and value; gate and up).

use burn::backend::Dispatch;
use burn::tensor::{DType, Int, Tensor};

use super::error::Q8Error;
use super::ops::{Q8Backend, cast_to, check_operands, empty_product, to_f32};
use super::weight::Q8Weight;

/// `x` (`[T, in]`) ready for any number of [`q8_linear_input`] products.
///
/// Where the product takes the dp4a kernel (see [`planned_launch`](super::planned_launch)),
/// its activations must first be split into 16-bit integers per block of 16 values, one
/// launch of its own; an input made once carries that split, so each product sharing it is
/// one launch instead of two (on the H200 a replayed 12-matrix pass falls from 24 launches to
/// 13). Elsewhere it holds `x` as f32 and every product is the plain [`q8_linear`](super::q8_linear).
/// The split is a tensor computed on `x`'s stream when the input is made, like any op's
/// result: made inside a captured graph, it is part of the graph.
#[derive(Debug, Clone)]
pub struct Q8Input {
    x: Tensor<2>,
    /// The caller's dtype, which the products return.
    dtype: DType,
    split: Option<Tensor<2, Int>>,
}

impl Q8Input {
    /// Prepares `x` (`[T, in]`, any float dtype; cast to f32 once here).
    pub fn new(x: Tensor<2>) -> Self {
        let dtype = x.dtype();
        let x = to_f32(x);
        let split = splits(&x).then(|| {
            Tensor::<2, Int>::from_dispatch(Dispatch::q8_split(x.clone().into_dispatch()))
        });
        Q8Input { x, dtype, split }
    }

    /// `[T, in]`.
    pub fn dims(&self) -> [usize; 2] {
        self.x.dims()
    }

    /// Whether the products on this input read a shared split (the dp4a kernel).
    pub fn is_split(&self) -> bool {
        self.split.is_some()
    }
}

/// Whether products on `x` take the dp4a kernel now, so a shared split serves them.
fn splits(x: &Tensor<2>) -> bool {
    let [t, inp] = x.dims();
    if t == 0 || inp == 0 {
        return false;
    }
    #[cfg(feature = "wgpu")]
    {
        matches!(
            super::planned_launch(&x.device(), t, inp),
            Some(super::CubeLaunch::Dot(_))
        )
    }
    #[cfg(not(feature = "wgpu"))]
    {
        false
    }
}

/// [`q8_linear`](super::q8_linear) on a prepared input: `y = x W^T * scale + bias`, `[T, out]`
/// in the input's dtype. With a split input it is the dp4a kernel's product over that split
/// (its shape from [`set_dot_tuning`](super::set_dot_tuning) if set, else the tile's
/// default), whatever was overridden since the input was made.
///
/// # Errors
///
/// As [`q8_linear`](super::q8_linear): [`Q8Error::Shape`] for an input whose width is not
/// the weight's or a bias not `[out]`, [`Q8Error::Device`] for operands off the weight's
/// device.
pub fn q8_linear_input(
    input: &Q8Input,
    w: &Q8Weight,
    bias: Option<Tensor<1>>,
) -> Result<Tensor<2>, Q8Error> {
    let Some(split) = &input.split else {
        return super::q8_linear(input.x.clone(), w, bias).map(|y| cast_to(y, input.dtype));
    };
    let [t, _] = input.dims();
    check_operands(input.dims(), &input.x.device(), w, bias.as_ref())?;
    if let Some(y) = empty_product(t, w, bias.as_ref(), input.dtype) {
        return Ok(y);
    }
    let split = split.clone().into_dispatch();
    let values = w.values().clone().into_dispatch();
    let scales = w.scales().clone().into_dispatch();
    let y = match bias {
        None => Dispatch::q8_matmul_split(split, values, &scales),
        Some(b) => {
            Dispatch::q8_matmul_split_bias(split, values, &scales, &to_f32(b).into_dispatch())
        }
    };
    Ok(cast_to(Tensor::<2>::from_dispatch(y), input.dtype))
}
