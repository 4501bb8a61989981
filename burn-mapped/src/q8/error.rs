//! Errors of the q8 format and of the `q8_linear` op.

use crate::error::StoreError;

/// Errors from quantizing, writing or using a q8 matrix. Each names the row, tensor or
/// dimension at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Q8Error {
    /// A buffer does not hold `out * in` elements.
    #[error("{what}: {len} elements, but [{out}, {inp}] needs {}", expected.map_or("more than usize::MAX".to_string(), |n| n.to_string()))]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        len: usize,
        /// Output rows.
        out: usize,
        /// Input columns.
        inp: usize,
        /// `out * in`, or `None` on overflow.
        expected: Option<usize>,
    },
    /// A weight is NaN or infinite; no finite scale represents it.
    #[error("row {row}, column {col}: weight {value} is not finite")]
    NonFinite {
        /// Output row.
        row: usize,
        /// Input column.
        col: usize,
        /// The value.
        value: f32,
    },
    /// `absmax / 127` of a row exceeds the largest f16.
    #[error("row {row}: absmax {absmax} needs a scale above the f16 range")]
    ScaleOverflow {
        /// Output row.
        row: usize,
        /// The row's largest magnitude.
        absmax: f32,
    },
    /// A tensor handed to [`Q8Weight::new`](super::Q8Weight::new) or
    /// [`q8_linear`](super::q8_linear) has the wrong dtype.
    #[error("{what}: dtype {found:?}, expected {expected}")]
    DType {
        /// Which tensor.
        what: &'static str,
        /// The dtype found.
        found: burn::tensor::DType,
        /// What is accepted.
        expected: &'static str,
    },
    /// Tensor shapes do not fit together.
    #[error("{what}: shape {found:?}, expected {expected}")]
    Shape {
        /// Which tensor.
        what: &'static str,
        /// The shape found.
        found: Vec<usize>,
        /// What was expected, in words.
        expected: String,
    },
    /// The weight's input width is not a multiple of 4, which the GPU kernel needs to read
    /// four int8 values per 32-bit word.
    #[error("q8 weight [{out}, {inp}]: the GPU kernel needs `in` to be a multiple of 4")]
    GpuPacking {
        /// Output rows.
        out: usize,
        /// Input columns.
        inp: usize,
    },
    /// Tensors live on different devices.
    #[error("{what} is on {found}, the weight on {expected}")]
    Device {
        /// Which tensor.
        what: &'static str,
        /// Its device.
        found: String,
        /// The weight's device.
        expected: String,
    },
    /// A [`Tuning`](super::Tuning) names a launch shape the kernels cannot run.
    #[doc(hidden)]
    #[error("q8 tuning {tuning}: not a launch shape the kernels run")]
    Tuning {
        /// The tuning, as `Debug` prints it.
        tuning: String,
    },
    /// A tensor named as a q8 weight has no q8 quantization link in the manifest.
    #[error("tensor `{tensor}` is not a q8 weight (no `q8-row-f16` quantization link)")]
    NotQuantized {
        /// The tensor.
        tensor: String,
    },
    /// Writing to or reading from a store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
