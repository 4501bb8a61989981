//! The error type of the GGUF reader and dequantizers.

use std::io;
use std::path::PathBuf;

use super::types::GgmlType;

/// Everything that can go wrong reading a GGUF file or dequantizing a tensor.
///
/// Parse errors name the key, tensor or field and the numbers involved.
/// [`GgufError::InFile`] wraps a parse error with the path it came from; use
/// [`GgufError::innermost`] to match on the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, inspected or mapped.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done: "open", "stat" or "map".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error, kept whole.
        #[source]
        source: io::Error,
    },
    /// A parse error in the file at `path`.
    #[error("invalid GGUF file {path}")]
    InFile {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        #[source]
        source: Box<GgufError>,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A version other than 2 or 3 (v1 used 32-bit counts; a big-endian file
    /// shows up here with its version byte-swapped).
    #[error("unsupported GGUF version {version} (supported: 2 and 3, little-endian)")]
    UnsupportedVersion {
        /// The version read as little-endian.
        version: u32,
    },
    /// The file ends inside `field`.
    #[error("truncated: {field} needs {needed} bytes at offset {offset}, only {available} remain")]
    Truncated {
        /// What was being read.
        field: String,
        /// Where it starts in the file.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A declared count is above its cap.
    #[error("{what} count {count} exceeds the limit of {max}")]
    TooMany {
        /// "tensors" or "metadata entries".
        what: &'static str,
        /// The declared count.
        count: u64,
        /// The cap (`MAX_TENSORS` or `MAX_METADATA_ENTRIES`).
        max: u64,
    },
    /// A declared count cannot fit in the rest of the file even at the
    /// smallest encoding of each item.
    #[error(
        "{what} declares {count} items of at least {min_item_bytes} bytes each, \
         but only {available} bytes remain"
    )]
    CountExceedsFile {
        /// What was counted, naming the key for arrays.
        what: String,
        /// The declared count.
        count: u64,
        /// Smallest possible encoding of one item.
        min_item_bytes: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A string length is above its cap.
    #[error("{field} is {len} bytes long, the limit is {max}")]
    StringTooLong {
        /// Which string.
        field: String,
        /// The declared length.
        len: u64,
        /// The cap that applies.
        max: u64,
    },
    /// A string is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        field: String,
    },
    /// A metadata array is longer than `MAX_ARRAY_LEN`.
    #[error("array {key} has {len} elements, the limit is {max}")]
    ArrayTooLong {
        /// The key holding the array.
        key: String,
        /// The declared length.
        len: u64,
        /// `MAX_ARRAY_LEN`.
        max: u64,
    },
    /// A metadata value type id outside 0..=12.
    #[error("key {key} has unknown value type id {type_id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The id found.
        type_id: u32,
    },
    /// An array whose elements are arrays (ggml rejects these too).
    #[error("key {key} is an array of arrays, which GGUF readers do not accept")]
    NestedArray {
        /// The key.
        key: String,
    },
    /// A bool byte other than 0 or 1.
    #[error("key {key} holds bool byte {byte}, expected 0 or 1")]
    InvalidBool {
        /// The key.
        key: String,
        /// The byte found.
        byte: u8,
    },
    /// The same metadata key twice.
    #[error("metadata key {key} appears more than once")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// The same tensor name twice.
    #[error("tensor {tensor} appears more than once")]
    DuplicateTensor {
        /// The tensor name.
        tensor: String,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment is {alignment}, expected a nonzero power of two")]
    BadAlignment {
        /// The value found.
        alignment: u64,
    },
    /// More than `MAX_DIMS` dimensions.
    #[error("tensor {tensor} has {n_dims} dimensions, the limit is {max}")]
    TooManyDims {
        /// The tensor name.
        tensor: String,
        /// The declared count.
        n_dims: u32,
        /// `MAX_DIMS`.
        max: u32,
    },
    /// A tensor type id that ggml does not define.
    #[error("tensor {tensor} has unknown ggml type id {type_id}")]
    UnknownGgmlType {
        /// The tensor name.
        tensor: String,
        /// The id found.
        type_id: u32,
    },
    /// The element count or byte size of a tensor overflows, or a dimension
    /// is above `i64::MAX` (ggml stores dimensions as `int64_t`).
    #[error("tensor {tensor} with dims {dims:?} is too large")]
    ShapeOverflow {
        /// The tensor name.
        tensor: String,
        /// Its dimensions, innermost first.
        dims: Vec<u64>,
    },
    /// The innermost dimension is not a whole number of blocks.
    #[error(
        "tensor {tensor}: ne0 = {ne0} is not a multiple of the {ggml_type} block size {block_size}"
    )]
    RowNotBlockAligned {
        /// The tensor name.
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
        /// Its innermost dimension.
        ne0: u64,
        /// Elements per block of the type.
        block_size: u64,
    },
    /// The data section would start past the end of the file.
    #[error("data section starts at {data_offset}, past the end of the {file_len}-byte file")]
    DataSectionOutOfBounds {
        /// Aligned end of the tensor table.
        data_offset: u64,
        /// File length.
        file_len: u64,
    },
    /// A tensor offset (relative to the data section) is not aligned.
    #[error("tensor {tensor} has offset {offset}, not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor name.
        tensor: String,
        /// Offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's bytes extend past the end of the file. Positions are
    /// `u128` so that the report is exact even when `u64` would overflow.
    #[error("tensor {tensor} spans bytes {start}..{end}, past the end of the {file_len}-byte file")]
    TensorOutOfBounds {
        /// The tensor name.
        tensor: String,
        /// Absolute start.
        start: u128,
        /// Absolute end (exclusive).
        end: u128,
        /// File length.
        file_len: u64,
    },
    /// Two tensors share bytes.
    #[error(
        "tensors {first} ({first_start}..{first_end}) and {second} ({second_start}..{second_end}) overlap"
    )]
    TensorOverlap {
        /// The tensor that starts first.
        first: String,
        /// Its absolute start.
        first_start: u64,
        /// Its absolute end.
        first_end: u64,
        /// The tensor that starts inside it.
        second: String,
        /// Its absolute start.
        second_start: u64,
        /// Its absolute end.
        second_end: u64,
    },
    /// A metadata key asked for by a typed getter is absent.
    #[error("metadata key {key} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata key has another type than the getter expects.
    #[error("metadata key {key} is {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The type the getter wanted.
        expected: &'static str,
        /// The type in the file.
        found: String,
    },
    /// [`GgufFile::tensor_bytes`](super::GgufFile::tensor_bytes) was given a
    /// buffer that is not the one parsed.
    #[error(
        "tensor {tensor}: buffer of {found} bytes is not the {expected}-byte file that was parsed"
    )]
    BufferMismatch {
        /// The tensor asked for.
        tensor: String,
        /// Length of the parsed file.
        expected: u64,
        /// Length of the buffer given.
        found: u64,
    },
    /// No dequantizer for this type.
    #[error("dequantizing {ggml_type} is not supported")]
    UnsupportedDequant {
        /// The type.
        ggml_type: GgmlType,
    },
    /// The source of a dequantization is not a whole number of blocks.
    #[error("{ggml_type}: {src_len} source bytes are not a multiple of the {type_size}-byte block")]
    PartialBlock {
        /// The type.
        ggml_type: GgmlType,
        /// Source length in bytes.
        src_len: usize,
        /// Bytes per block.
        type_size: u64,
    },
    /// The destination of a dequantization has the wrong length.
    #[error("{ggml_type}: source holds {expected} elements, destination has room for {found}")]
    DestinationLength {
        /// The type.
        ggml_type: GgmlType,
        /// Elements encoded in the source.
        expected: usize,
        /// Length of the destination.
        found: usize,
    },
}

impl GgufError {
    /// The error with any [`GgufError::InFile`] wrappers removed.
    pub fn innermost(&self) -> &GgufError {
        match self {
            GgufError::InFile { source, .. } => source.innermost(),
            other => other,
        }
    }

    /// The type of a value, for [`GgufError::WrongType`].
    pub(crate) fn wrong_type(key: &str, expected: &'static str, found: String) -> Self {
        GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found,
        }
    }
}
