//! Activations prepared once for several q8 products: the projections of one layer that read
//! the same rows (query, key and value; gate and up).

use burn::backend::Dispatch;
use burn::tensor::{DType, Int, Tensor};

use super::backend::Q8Backend;
use super::error::Q8Error;
use super::ops::{cast_to, check_operands, empty_product, to_f32};
use super::split::SPLIT_BLOCK;
use super::tuning::{CubeLaunch, DotTuning, Tuning};
use super::weight::{Q8Weight, planned_launch};

/// `x` (`[T, in]`) ready for any number of [`q8_linear_input`] products.
///
/// Where the product takes the dp4a kernel (by default: a CubeCL device compiling to SPIR-V,
/// whose `dp4a` is native, and `in % 16 == 0`), its activations must first be split into
/// 16-bit integers per block of 16 values, one launch of its own; an input made once carries
/// that split, so each product sharing it is one launch instead of two (12 products over one
/// input: 13 launches instead of 24). Elsewhere it holds `x` as f32 and every product is the
/// plain [`q8_linear`](super::q8_linear). The split is a tensor computed on `x`'s stream when
/// the input is made, like any op's result: made inside a captured graph, it is part of the
/// graph.
#[derive(Debug, Clone)]
pub struct Q8Input {
    x: Tensor<2>,
    /// The caller's dtype, which the products return.
    dtype: DType,
    /// The split and the dp4a shape its products launch with.
    split: Option<(Tensor<2, Int>, DotTuning)>,
}

impl Q8Input {
    /// Prepares `x` (`[T, in]`, any float dtype; cast to f32 once here).
    pub fn new(x: Tensor<2>) -> Self {
        Self::prepare(x, Tuning::default())
    }

    /// Prepares `x` for products launched as `tuning` says (benchmarks and tests): split
    /// where it resolves to the dp4a kernel, whose shape every product on the split then takes.
    /// On the host, whose kernel reads f32, an explicit dp4a launch splits too, in the same
    /// format computed by the host (the definition the GPU kernel is tested against).
    ///
    /// # Errors
    ///
    /// [`Q8Error::Tuning`] for a launch shape the kernels cannot run.
    #[doc(hidden)]
    pub fn with_tuning(x: Tensor<2>, tuning: Tuning) -> Result<Self, Q8Error> {
        tuning.check()?;
        Ok(Self::prepare(x, tuning))
    }

    fn prepare(x: Tensor<2>, tuning: Tuning) -> Self {
        let dtype = x.dtype();
        let x = to_f32(x);
        let split = dot_shape(&x, tuning).map(|shape| {
            let split = Dispatch::q8_split(x.clone().into_dispatch());
            (Tensor::<2, Int>::from_dispatch(split), shape)
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

/// The dp4a shape the products on `x` take under `tuning`, if they take that kernel, so a
/// shared split serves them.
fn dot_shape(x: &Tensor<2>, tuning: Tuning) -> Option<DotTuning> {
    let [t, inp] = x.dims();
    if t == 0 || inp == 0 {
        return None;
    }
    match planned_launch(&x.device(), t, inp, tuning.cube) {
        Some(CubeLaunch::Dot(shape)) => Some(shape),
        Some(CubeLaunch::Fma(_)) => None,
        None => match tuning.cube {
            Some(CubeLaunch::Dot(shape)) if inp.is_multiple_of(SPLIT_BLOCK) => Some(shape),
            _ => None,
        },
    }
}

/// [`q8_linear`](super::q8_linear) on a prepared input: `y = x W^T * scale + bias`, `[T, out]`
/// in the input's dtype. With a split input it is the dp4a kernel's product over that split,
/// in the shape the input was split for, whatever the weight's tuning.
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
    let Some((split, shape)) = &input.split else {
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
        None => Dispatch::q8_matmul_split(split, values, &scales, *shape),
        Some(b) => Dispatch::q8_matmul_split_bias(
            split,
            values,
            &scales,
            &to_f32(b).into_dispatch(),
            *shape,
        ),
    };
    Ok(cast_to(Tensor::<2>::from_dispatch(y), input.dtype))
}
