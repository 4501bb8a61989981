//! The GGUF format itself: header and tensor-table parsing, value and tensor types, block
//! dequantization, and the caps that bound all of it.
//!
//! Nothing here uses Burn or any other module of the crate: the fuzz crate
//! (`burn-mapped/fuzz`) compiles this directory on its own by path, and CI builds it.

mod dequant;
mod error;
mod layout;
mod reader;
mod types;

pub use dequant::{can_dequantize, dequantize, dequantize_to_vec, scale_offsets};
pub(crate) use dequant::{f16_at, q4_k_scale_min};
pub use error::GgufError;
pub use layout::BlockLayout;
pub use reader::{GgufFile, TensorInfo};
pub use types::{Array, GgmlType, Value, ValueType};

/// Tensor dimensions at most, ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Tensors per file at most. Large mixture-of-experts models have a few
/// thousand; the cap only bounds work on hostile input.
pub const MAX_TENSORS: u64 = 1 << 16;
/// Metadata entries per file at most; real files have tens.
pub const MAX_METADATA_ENTRIES: u64 = 1 << 16;
/// Key length at most, as the GGUF specification states (65535 bytes).
pub const MAX_KEY_LEN: u64 = 65_535;
/// Tensor name length at most: ggml keeps names in a `GGML_MAX_NAME` (64)
/// byte buffer including the terminating NUL and rejects longer ones.
pub const MAX_TENSOR_NAME_LEN: u64 = 63;
/// String value length at most (16 MiB); chat templates run to tens of KiB.
pub const MAX_STRING_LEN: u64 = 1 << 24;
/// Metadata array length at most (16 Mi elements); vocabularies have a few
/// hundred thousand entries.
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
