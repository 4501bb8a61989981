//! [`Q8Weight`]: the two tensors of a q8 matrix, checked once so the op can trust them.

use burn::tensor::{DType, Int, Tensor};

use super::error::Q8Error;

/// A q8 matrix on a device: int8 values `[out, in]` (dtype I8) and one f16 scale per output
/// row (`[out]`, dtype F16).
///
/// Borrowed by [`q8_linear`](super::q8_linear), never consumed or written: on Flex the
/// tensors are typically read-only file mappings.
#[derive(Debug, Clone)]
pub struct Q8Weight {
    values: Tensor<2, Int>,
    scales: Tensor<1>,
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
        if super::on_cube(&values.device()) && !inp.is_multiple_of(4) {
            return Err(Q8Error::GpuPacking { out, inp });
        }
        Ok(Self { values, scales })
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
