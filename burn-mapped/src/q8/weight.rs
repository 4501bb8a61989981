//! [`Q8Weight`]: the two tensors of a q8 matrix, checked once so the op can trust them.

use burn::tensor::{DType, Device, Int, Tensor};

use super::error::Q8Error;
use super::tuning::{CubeLaunch, Tuning};
use crate::placement::is_cube;

/// A q8 matrix on a device: int8 values `[out, in]` (dtype I8) and one f16 scale per output
/// row (`[out]`, dtype F16).
///
/// Borrowed by [`q8_linear`](super::q8_linear), never consumed or written: on Flex the
/// tensors are typically read-only file mappings.
#[derive(Debug, Clone)]
pub struct Q8Weight {
    values: Tensor<2, Int>,
    scales: Tensor<1>,
    tuning: Tuning,
}

impl Q8Weight {
    /// Pairs int8 values with their scales after checking dtypes, shapes and devices.
    ///
    /// # Errors
    ///
    /// [`Q8Error::DType`] unless `values` is I8 and `scales` F16, [`Q8Error::Shape`] unless
    /// `scales` has one element per row of `values`, [`Q8Error::Device`] if they live on
    /// different devices, and [`Q8Error::GpuPacking`] on a CubeCL device when `in` is not a
    /// multiple of 4 (the GPU kernel reads four int8 per 32-bit word).
    pub fn new(values: Tensor<2, Int>, scales: Tensor<1>) -> Result<Self, Q8Error> {
        if values.dtype() != DType::I8 {
            return Err(Q8Error::DType {
                what: "q8 values",
                found: values.dtype(),
                expected: "I8",
            });
        }
        if scales.dtype() != DType::F16 {
            return Err(Q8Error::DType {
                what: "q8 scales",
                found: scales.dtype(),
                expected: "F16",
            });
        }
        let [out, inp] = values.dims();
        if scales.dims() != [out] {
            return Err(Q8Error::Shape {
                what: "q8 scales",
                found: scales.dims().to_vec(),
                expected: format!("[{out}] (one per row of the [{out}, {inp}] values)"),
            });
        }
        if values.device() != scales.device() {
            return Err(Q8Error::Device {
                what: "q8 scales",
                found: format!("{:?}", scales.device()),
                expected: format!("{:?}", values.device()),
            });
        }
        if is_cube(&values.device()) && !inp.is_multiple_of(4) {
            return Err(Q8Error::GpuPacking { out, inp });
        }
        Ok(Self {
            values,
            scales,
            tuning: Tuning::default(),
        })
    }

    /// The same weight with products launched as `tuning` says instead of by the per-`T`
    /// defaults (benchmarks and tests).
    ///
    /// # Errors
    ///
    /// [`Q8Error::Tuning`] for a launch shape the kernels cannot run.
    #[doc(hidden)]
    pub fn with_tuning(self, tuning: Tuning) -> Result<Self, Q8Error> {
        tuning.check()?;
        Ok(Self { tuning, ..self })
    }

    /// What its products launch with: [`Tuning::default`] unless
    /// [`with_tuning`](Self::with_tuning) set one.
    pub(crate) fn tuning(&self) -> Tuning {
        self.tuning
    }

    /// The kernel and launch shape a product of `t` activation rows takes on this weight, every
    /// condition applied (the tuning, the device's native dot product, the row width); `None`
    /// off CubeCL devices. Benchmarks label their arms with it, tests pick the reference.
    #[doc(hidden)]
    pub fn planned_launch(&self, t: usize) -> Option<CubeLaunch> {
        planned_launch(
            &self.values.device(),
            t,
            self.in_features(),
            self.tuning.cube,
        )
    }

    /// The int8 values, `[out, in]`.
    pub fn values(&self) -> &Tensor<2, Int> {
        &self.values
    }

    /// The f16 scales, `[out]`.
    pub fn scales(&self) -> &Tensor<1> {
        &self.scales
    }

    /// Rows of the matrix (`out`).
    pub fn out_features(&self) -> usize {
        self.values.dims()[0]
    }

    /// Columns of the matrix (`in`).
    pub fn in_features(&self) -> usize {
        self.values.dims()[1]
    }

    /// Bytes the op reads from the weight per pass: `out * in` values plus `2 * out` scales.
    pub fn bytes(&self) -> usize {
        self.out_features() * (self.in_features() + 2)
    }

    /// Splits into the two tensors.
    pub fn into_parts(self) -> (Tensor<2, Int>, Tensor<1>) {
        (self.values, self.scales)
    }
}

/// What a product of `t` rows of `inp` values launches on `device` given the requested
/// `cube` launch; `None` off CubeCL devices.
pub(super) fn planned_launch(
    device: &Device,
    t: usize,
    inp: usize,
    cube: Option<CubeLaunch>,
) -> Option<CubeLaunch> {
    match device.as_dispatch() {
        #[cfg(feature = "cubecl")]
        burn::backend::DispatchDevice::Cube(d) => {
            Some(super::cube::launch_on(&d.client(), t, inp, cube))
        }
        _ => {
            let _ = (t, inp, cube);
            None
        }
    }
}
