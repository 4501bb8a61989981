//! Parsing and validating the GGUF header, metadata and tensor table.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

use super::error::GgufError;
use super::types::{Array, GgmlType, Value, ValueType};
use super::{
    DEFAULT_ALIGNMENT, MAX_ARRAY_LEN, MAX_DIMS, MAX_KEY_LEN, MAX_METADATA_ENTRIES, MAX_STRING_LEN,
    MAX_TENSOR_NAME_LEN, MAX_TENSORS,
};

const MAGIC: [u8; 4] = *b"GGUF";
const ALIGNMENT_KEY: &str = "general.alignment";

/// Smallest encoding of one metadata entry: key length, empty key, type id,
/// one-byte value.
const MIN_ENTRY_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor-table entry: name length, empty name,
/// `n_dims` = 0, type id, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One tensor of the tensor table, validated against the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    ggml_type: GgmlType,
    dims: Vec<u64>,
    offset: u64,
    byte_len: u64,
    n_elements: u64,
}

impl TensorInfo {
    /// The tensor name, e.g. `blk.0.attn_q.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Dimensions in GGUF order: `ne0`, the contiguous one, first.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Shape in row-major order, i.e. the dims reversed: a 2-D weight is
    /// `[ne1, ne0]` = `[out, in]`.
    pub fn shape_row_major(&self) -> Vec<usize> {
        // The parser checked that every dim fits usize.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Absolute byte offset of the tensor data in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length of the tensor data in bytes.
    pub fn byte_len(&self) -> u64 {
        self.byte_len
    }

    /// Number of elements (1 for a tensor with no dims).
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// Byte range of the tensor data in the file.
    pub fn byte_range(&self) -> Range<u64> {
        self.offset..self.offset + self.byte_len
    }
}

/// A parsed GGUF file: metadata and tensor table, checked against the file
/// length, without the tensor data.
///
/// It owns its metadata and borrows nothing, so it can outlive the buffer it
/// was parsed from; [`GgufFile::tensor_bytes`] takes that buffer back.
#[derive(Debug, Clone)]
pub struct GgufFile {
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
}

macro_rules! scalar_getters {
    ($($(#[$doc:meta])* $fn:ident -> $ty:ty, $variant:ident, $name:literal;)*) => {$(
        $(#[$doc])*
        ///
        /// # Errors
        ///
        /// [`GgufError::MissingKey`] or [`GgufError::WrongType`]; integer
        /// widths are not converted.
        pub fn $fn(&self, key: &str) -> Result<$ty, GgufError> {
            match self.require(key)? {
                Value::$variant(v) => Ok(*v),
                other => Err(GgufError::wrong_type(key, $name, other.type_description())),
            }
        }
    )*};
}

macro_rules! array_getters {
    ($($(#[$doc:meta])* $fn:ident -> $ty:ty, $variant:ident, $name:literal;)*) => {$(
        $(#[$doc])*
        ///
        /// # Errors
        ///
        /// [`GgufError::MissingKey`] or [`GgufError::WrongType`].
        pub fn $fn(&self, key: &str) -> Result<&[$ty], GgufError> {
            match self.require(key)? {
                Value::Array(Array::$variant(v)) => Ok(v),
                other => Err(GgufError::wrong_type(key, $name, other.type_description())),
            }
        }
    )*};
}

impl GgufFile {
    /// Parses and validates a whole GGUF file held in memory (or mapped).
    ///
    /// # Errors
    ///
    /// The first violation found, naming the key, tensor or field.
    pub fn parse(bytes: &[u8]) -> Result<Self, GgufError> {
        Parser::new(bytes).parse()
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata entries in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    scalar_getters! {
        /// The `u8` at `key`.
        get_u8 -> u8, U8, "u8";
        /// The `i8` at `key`.
        get_i8 -> i8, I8, "i8";
        /// The `u16` at `key`.
        get_u16 -> u16, U16, "u16";
        /// The `i16` at `key`.
        get_i16 -> i16, I16, "i16";
        /// The `u32` at `key`.
        get_u32 -> u32, U32, "u32";
        /// The `i32` at `key`.
        get_i32 -> i32, I32, "i32";
        /// The `u64` at `key`.
        get_u64 -> u64, U64, "u64";
        /// The `i64` at `key`.
        get_i64 -> i64, I64, "i64";
        /// The `f32` at `key`.
        get_f32 -> f32, F32, "f32";
        /// The `f64` at `key`.
        get_f64 -> f64, F64, "f64";
        /// The `bool` at `key`.
        get_bool -> bool, Bool, "bool";
    }

    array_getters! {
        /// The array of strings at `key`.
        get_str_array -> String, String, "array of string";
        /// The array of `i32` at `key`.
        get_i32_array -> i32, I32, "array of i32";
        /// The array of `u32` at `key`.
        get_u32_array -> u32, U32, "array of u32";
        /// The array of `f32` at `key`.
        get_f32_array -> f32, F32, "array of f32";
    }

    /// Removes the array of strings at `key` and hands over its strings, for a caller that
    /// would otherwise copy a large array (a vocabulary) only to drop this one.
    ///
    /// # Errors
    ///
    /// As [`GgufFile::get_str_array`]; on error nothing is removed.
    pub fn take_str_array(&mut self, key: &str) -> Result<Vec<String>, GgufError> {
        let index = *self
            .key_index
            .get(key)
            .ok_or_else(|| GgufError::MissingKey {
                key: key.to_owned(),
            })?;
        let strings = match &mut self.metadata[index].1 {
            Value::Array(Array::String(strings)) => std::mem::take(strings),
            other => {
                return Err(GgufError::wrong_type(
                    key,
                    "array of string",
                    other.type_description(),
                ));
            }
        };
        self.metadata.remove(index);
        self.key_index.remove(key);
        for later in self.key_index.values_mut() {
            if *later > index {
                *later -= 1;
            }
        }
        Ok(strings)
    }

    /// The string at `key`.
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingKey`] or [`GgufError::WrongType`].
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(GgufError::wrong_type(
                key,
                "string",
                other.type_description(),
            )),
        }
    }

    /// `general.architecture`, e.g. `"qwen2"`.
    ///
    /// # Errors
    ///
    /// As [`GgufFile::get_str`].
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Alignment of the data section and of every tensor offset in it.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Length of the file that was parsed.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The bytes of `info` within `data`, which must be the buffer that was
    /// parsed. Borrows; never copies.
    ///
    /// # Errors
    ///
    /// [`GgufError::BufferMismatch`] when `data` has another length than the
    /// parsed file or does not contain the tensor's range.
    pub fn tensor_bytes<'d>(
        &self,
        data: &'d [u8],
        info: &TensorInfo,
    ) -> Result<&'d [u8], GgufError> {
        let mismatch = || GgufError::BufferMismatch {
            tensor: info.name.clone(),
            expected: self.file_len,
            found: data.len() as u64,
        };
        if data.len() as u64 != self.file_len {
            return Err(mismatch());
        }
        let start = usize::try_from(info.offset).map_err(|_| mismatch())?;
        let len = usize::try_from(info.byte_len).map_err(|_| mismatch())?;
        start
            .checked_add(len)
            .and_then(|end| data.get(start..end))
            .ok_or_else(mismatch)
    }
}

/// Rounds `pos` up to a multiple of `alignment`, a nonzero power of two.
fn align_up(pos: u64, alignment: u64) -> Option<u64> {
    debug_assert!(alignment.is_power_of_two());
    pos.checked_add(alignment - 1).map(|p| p & !(alignment - 1))
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// Metadata in file order, and the position of each key in it.
type MetadataTable = (Vec<(String, Value)>, HashMap<String, usize>);

/// A tensor-table entry before the data section start is known.
struct RawTensor {
    name: String,
    type_id: u32,
    dims: Vec<u64>,
    rel_offset: u64,
}

impl<'a> Parser<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Parser { bytes, pos: 0 }
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                field: field(),
                offset: self.pos as u64,
                needed: n,
                available,
            });
        }
        // n <= remaining, which fits usize.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn fixed<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.fixed(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.fixed(field).map(u64::from_le_bytes)
    }

    /// Reads a u64-length-prefixed UTF-8 string of at most `max` bytes.
    fn string(&mut self, max: u64, field: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("length of {}", field()))?;
        if len > max {
            return Err(GgufError::StringTooLong {
                field: field(),
                len,
                max,
            });
        }
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { field: field() })
    }

    fn parse(mut self) -> Result<GgufFile, GgufError> {
        let magic: [u8; 4] = self.fixed(&|| "magic".to_owned())?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = self.u32(&|| "version".to_owned())?;
        if !matches!(version, 2 | 3) {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let n_tensors = self.u64(&|| "tensor count".to_owned())?;
        let n_entries = self.u64(&|| "metadata entry count".to_owned())?;
        check_cap("tensors", n_tensors, MAX_TENSORS)?;
        check_cap("metadata entries", n_entries, MAX_METADATA_ENTRIES)?;

        let (metadata, key_index) = self.metadata(n_entries)?;
        let alignment = match key_index.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) => u64::from(*a),
            // ggml reads the key with gguf_get_val_u32, which requires u32.
            Some(other) => {
                return Err(GgufError::wrong_type(
                    ALIGNMENT_KEY,
                    "u32",
                    other.type_description(),
                ));
            }
        };
        if !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment { alignment });
        }

        let raw = self.tensor_table(n_tensors)?;
        let file_len = self.bytes.len() as u64;
        // pos <= file_len and alignment <= u32::MAX, so this does not
        // overflow for any buffer that fits in memory.
        let data_offset =
            align_up(self.pos as u64, alignment).ok_or(GgufError::DataSectionOutOfBounds {
                data_offset: u64::MAX,
                file_len,
            })?;
        if !raw.is_empty() && data_offset > file_len {
            return Err(GgufError::DataSectionOutOfBounds {
                data_offset,
                file_len,
            });
        }
        let tensors = raw
            .into_iter()
            .map(|t| validate_tensor(t, alignment, data_offset, file_len))
            .collect::<Result<Vec<_>, _>>()?;
        check_overlaps(&tensors)?;
        let tensor_index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();

        Ok(GgufFile {
            version,
            metadata,
            key_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
            file_len,
        })
    }

    /// Reads the metadata entries, returning them in file order plus an index
    /// by key.
    fn metadata(&mut self, n_entries: u64) -> Result<MetadataTable, GgufError> {
        self.check_count(|| "metadata".to_owned(), n_entries, MIN_ENTRY_BYTES)?;
        let mut entries = Vec::with_capacity(n_entries as usize);
        let mut index = HashMap::with_capacity(n_entries as usize);
        for i in 0..n_entries {
            let key = self.string(MAX_KEY_LEN, &|| format!("key of metadata entry {i}"))?;
            let type_id = self.u32(&|| format!("value type of key {key}"))?;
            let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                key: key.clone(),
                type_id,
            })?;
            let value = self.value(ty, &key)?;
            match index.entry(key.clone()) {
                Entry::Occupied(_) => return Err(GgufError::DuplicateKey { key }),
                Entry::Vacant(slot) => {
                    slot.insert(entries.len());
                }
            }
            entries.push((key, value));
        }
        Ok((entries, index))
    }

    fn check_count(
        &self,
        what: impl FnOnce() -> String,
        count: u64,
        min_item_bytes: u64,
    ) -> Result<(), GgufError> {
        let available = self.remaining();
        if count > available / min_item_bytes {
            return Err(GgufError::CountExceedsFile {
                what: what(),
                count,
                min_item_bytes,
                available,
            });
        }
        Ok(())
    }

    fn value(&mut self, ty: ValueType, key: &str) -> Result<Value, GgufError> {
        let field = || format!("value of key {key}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.fixed(&field).map(u8::from_le_bytes)?),
            ValueType::I8 => Value::I8(self.fixed(&field).map(i8::from_le_bytes)?),
            ValueType::U16 => Value::U16(self.fixed(&field).map(u16::from_le_bytes)?),
            ValueType::I16 => Value::I16(self.fixed(&field).map(i16::from_le_bytes)?),
            ValueType::U32 => Value::U32(self.fixed(&field).map(u32::from_le_bytes)?),
            ValueType::I32 => Value::I32(self.fixed(&field).map(i32::from_le_bytes)?),
            ValueType::F32 => Value::F32(self.fixed(&field).map(f32::from_le_bytes)?),
            ValueType::U64 => Value::U64(self.fixed(&field).map(u64::from_le_bytes)?),
            ValueType::I64 => Value::I64(self.fixed(&field).map(i64::from_le_bytes)?),
            ValueType::F64 => Value::F64(self.fixed(&field).map(f64::from_le_bytes)?),
            ValueType::Bool => {
                let [byte] = self.fixed(&field)?;
                Value::Bool(parse_bool(byte, key)?)
            }
            ValueType::String => Value::String(self.string(MAX_STRING_LEN, &field)?),
            ValueType::Array => Value::Array(self.array(key)?),
        })
    }

    fn array(&mut self, key: &str) -> Result<Array, GgufError> {
        let type_id = self.u32(&|| format!("element type of array {key}"))?;
        let elem = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            type_id,
        })?;
        if elem == ValueType::Array {
            return Err(GgufError::NestedArray {
                key: key.to_owned(),
            });
        }
        let len = self.u64(&|| format!("length of array {key}"))?;
        if len > MAX_ARRAY_LEN {
            return Err(GgufError::ArrayTooLong {
                key: key.to_owned(),
                len,
                max: MAX_ARRAY_LEN,
            });
        }
        self.check_count(|| format!("array {key}"), len, elem.min_encoded_len())?;
        let field = || format!("elements of array {key}");

        /// Reads `len` fixed-width little-endian elements in one slice.
        macro_rules! fixed_array {
            ($variant:ident, $ty:ty) => {{
                const W: usize = std::mem::size_of::<$ty>();
                // len * W <= remaining, checked above.
                let bytes = self.take(len * W as u64, &field)?;
                Array::$variant(
                    bytes
                        .chunks_exact(W)
                        .map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunk of W bytes")))
                        .collect(),
                )
            }};
        }

        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(len, &field)?.to_vec()),
            ValueType::I8 => fixed_array!(I8, i8),
            ValueType::U16 => fixed_array!(U16, u16),
            ValueType::I16 => fixed_array!(I16, i16),
            ValueType::U32 => fixed_array!(U32, u32),
            ValueType::I32 => fixed_array!(I32, i32),
            ValueType::F32 => fixed_array!(F32, f32),
            ValueType::U64 => fixed_array!(U64, u64),
            ValueType::I64 => fixed_array!(I64, i64),
            ValueType::F64 => fixed_array!(F64, f64),
            ValueType::Bool => Array::Bool(
                self.take(len, &field)?
                    .iter()
                    .map(|&b| parse_bool(b, key))
                    .collect::<Result<_, _>>()?,
            ),
            ValueType::String => {
                let mut out = Vec::with_capacity(len as usize);
                for i in 0..len {
                    out.push(
                        self.string(MAX_STRING_LEN, &|| format!("element {i} of array {key}"))?,
                    );
                }
                Array::String(out)
            }
            ValueType::Array => unreachable!("rejected above"),
        })
    }

    fn tensor_table(&mut self, n_tensors: u64) -> Result<Vec<RawTensor>, GgufError> {
        self.check_count(
            || "tensor table".to_owned(),
            n_tensors,
            MIN_TENSOR_INFO_BYTES,
        )?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut names = HashSet::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = self.string(MAX_TENSOR_NAME_LEN, &|| format!("name of tensor {i}"))?;
            let n_dims = self.u32(&|| format!("n_dims of tensor {name}"))?;
            if n_dims > MAX_DIMS {
                return Err(GgufError::TooManyDims {
                    tensor: name,
                    n_dims,
                    max: MAX_DIMS,
                });
            }
            let dims = (0..n_dims)
                .map(|d| self.u64(&|| format!("dimension {d} of tensor {name}")))
                .collect::<Result<Vec<_>, _>>()?;
            let type_id = self.u32(&|| format!("type of tensor {name}"))?;
            let rel_offset = self.u64(&|| format!("offset of tensor {name}"))?;
            if !names.insert(name.clone()) {
                return Err(GgufError::DuplicateTensor { tensor: name });
            }
            tensors.push(RawTensor {
                name,
                type_id,
                dims,
                rel_offset,
            });
        }
        Ok(tensors)
    }
}

fn check_cap(what: &'static str, count: u64, max: u64) -> Result<(), GgufError> {
    if count > max {
        return Err(GgufError::TooMany { what, count, max });
    }
    Ok(())
}

fn parse_bool(byte: u8, key: &str) -> Result<bool, GgufError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::InvalidBool {
            key: key.to_owned(),
            byte,
        }),
    }
}

fn validate_tensor(
    raw: RawTensor,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<TensorInfo, GgufError> {
    let RawTensor {
        name,
        type_id,
        dims,
        rel_offset,
    } = raw;
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownGgmlType {
            tensor: name,
            type_id,
        });
    };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| {
            // ggml stores dims as int64_t; shapes are handed out as usize.
            if d > i64::MAX as u64 || usize::try_from(d).is_err() {
                None
            } else {
                acc.checked_mul(d)
            }
        })
        .filter(|&n| n <= i64::MAX as u64 && usize::try_from(n).is_ok());
    let Some(n_elements) = n_elements else {
        return Err(GgufError::ShapeOverflow { tensor: name, dims });
    };
    let ne0 = dims.first().copied().unwrap_or(1);
    let block_size = ggml_type.block_size();
    if ne0 % block_size != 0 {
        return Err(GgufError::RowNotBlockAligned {
            tensor: name,
            ggml_type,
            ne0,
            block_size,
        });
    }
    // ne0 is a whole number of blocks, so n_elements is too.
    let Some(byte_len) = (n_elements / block_size).checked_mul(ggml_type.type_size()) else {
        return Err(GgufError::ShapeOverflow { tensor: name, dims });
    };
    if rel_offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor {
            tensor: name,
            offset: rel_offset,
            alignment,
        });
    }
    // Three u64 terms cannot overflow u128.
    let start = u128::from(data_offset) + u128::from(rel_offset);
    let end = start + u128::from(byte_len);
    if end > u128::from(file_len) {
        return Err(GgufError::TensorOutOfBounds {
            tensor: name,
            start,
            end,
            file_len,
        });
    }
    Ok(TensorInfo {
        name,
        ggml_type,
        dims,
        // start <= end <= file_len.
        offset: start as u64,
        byte_len,
        n_elements,
    })
}

/// Rejects any two tensors whose byte ranges intersect. Empty tensors occupy
/// no bytes and cannot overlap.
fn check_overlaps(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.byte_len > 0).collect();
    order.sort_by_key(|t| t.offset);
    // After sorting by start, an overlap exists iff some tensor starts before
    // the end of its predecessor.
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.offset < a.offset + a.byte_len {
            return Err(GgufError::TensorOverlap {
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a.offset + a.byte_len,
                second: b.name.clone(),
                second_start: b.offset,
                second_end: b.offset + b.byte_len,
            });
        }
    }
    Ok(())
}
