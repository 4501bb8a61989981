//! Reading GGUF files: metadata, tensor table and dequantization to `f32`.
//!
//! # Layout (GGUF v3, little-endian; v2 is identical)
//!
//! ```text
//! "GGUF"  u32 version  u64 n_tensors  u64 n_kv
//! n_kv x      { string key, u32 value_type, value }
//! n_tensors x { string name, u32 n_dims, u64 dims[n_dims] (ne0 first),
//!               u32 ggml_type, u64 offset (relative to the data section) }
//! padding to general.alignment (default 32)
//! data section: tensor bytes at their offsets, each aligned
//! ```
//!
//! Strings are a `u64` byte length then UTF-8 bytes; arrays are a `u32`
//! element type, a `u64` length, then the elements.
//!
//! # Validation
//!
//! [`GgufFile::parse`] checks the whole header before returning: every
//! declared count and length against its `MAX_*` cap and against the bytes
//! that remain (before allocating), the alignment, each tensor's type, shape,
//! alignment and bounds with checked arithmetic, and that no two tensors or
//! keys share a name and no two tensors share bytes. A [`GgufFile`] therefore
//! only exists for a file whose tensor ranges are all inside it.
//!
//! # Example
//!
//! ```no_run
//! use burn_mapped::gguf::{GgufFile, dequantize_to_vec};
//!
//! let file = GgufFile::open("model.gguf")?;
//! let gguf = file.gguf();
//! assert_eq!(gguf.architecture()?, "qwen2");
//! let info = gguf.tensor("blk.0.attn_q.weight").expect("present");
//! let weights = dequantize_to_vec(info.ggml_type(), file.tensor_data(info)?)?;
//! assert_eq!(weights.len() as u64, info.n_elements());
//! # Ok::<(), burn_mapped::gguf::GgufError>(())
//! ```

// This module must not use anything else from the crate: the fuzz target
// (fuzz/fuzz_targets/gguf_parse.rs) compiles it on its own by path.

mod convert;
mod dequant;
mod error;
mod mapped;
mod reader;
mod types;

pub use convert::{GgufConvert, GgufConvertError, SOURCE_KEY, gguf_to_store};
pub use dequant::{can_dequantize, dequantize, dequantize_to_vec};
pub use error::GgufError;
pub use mapped::MappedGguf;
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
