//! Errors of the block product.

use burn::tensor::DType;

use crate::error::StoreError;

/// Why a block weight or product was refused; each names the operand at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// An operand has the wrong dtype.
    #[error("{what}: dtype {found:?}, expected {expected}")]
    DType {
        /// Which operand.
        what: &'static str,
        /// Its dtype.
        found: DType,
        /// What the product takes.
        expected: &'static str,
    },
    /// An operand has the wrong shape.
    #[error("{what}: shape {found:?}, expected {expected}")]
    Shape {
        /// Which operand.
        what: &'static str,
        /// Its shape.
        found: Vec<usize>,
        /// What the product takes.
        expected: String,
    },
    /// The block products run on the host (Flex) only.
    #[error("{what} is on {device}; block products run on the Flex (CPU) device")]
    Device {
        /// Which operand.
        what: &'static str,
        /// Its device.
        device: String,
    },
    /// The tensor holds no GGUF blocks (its manifest entry has no block layout).
    #[error("tensor `{tensor}` holds no GGUF blocks")]
    NotBlocks {
        /// The tensor.
        tensor: String,
    },
    /// Reading the store failed.
    #[error(transparent)]
    Store(Box<StoreError>),
}
