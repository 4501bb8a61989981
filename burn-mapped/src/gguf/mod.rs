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

mod convert;
pub(crate) mod format;
mod mapped;
mod source;

pub use convert::{GgufConvertError, gguf_to_store};
pub use format::{
    Array, BlockLayout, DEFAULT_ALIGNMENT, GgmlType, GgufError, GgufFile, MAX_ARRAY_LEN, MAX_DIMS,
    MAX_KEY_LEN, MAX_METADATA_ENTRIES, MAX_STRING_LEN, MAX_TENSOR_NAME_LEN, MAX_TENSORS,
    TensorInfo, Value, ValueType, can_dequantize, dequantize, dequantize_to_vec, scale_offsets,
};
pub use mapped::MappedGguf;
pub use source::{SOURCE_HEX_KEY, SOURCE_KEY, SourceError, SourceRecord, SourceState};
