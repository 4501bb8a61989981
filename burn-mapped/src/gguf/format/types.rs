//! Value and tensor element types of the GGUF format.

use std::fmt;

/// Declares [`GgmlType`] with its GGUF id, block size and block byte size.
///
/// The numbers are those of ggml's `type_traits` table (mirrored in the
/// Python `gguf` package as `GGML_QUANT_SIZES`); ids that ggml has retired
/// (4, 5, 31-33, 36-38) are unknown here on purpose.
macro_rules! ggml_types {
    ($($(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $block:literal, $bytes:expr;)*) => {
        /// Element type of a tensor, as stored in the GGUF tensor table.
        ///
        /// Variants keep ggml's spelling (`Q4_K`), the names users search for.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum GgmlType {
            $($(#[$doc])* $variant,)*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &[GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type with GGUF id `id`, if ggml currently defines one.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// The GGUF id stored in the tensor table.
            pub fn id(self) -> u32 {
                match self { $(GgmlType::$variant => $id,)* }
            }

            /// ggml's name for the type, e.g. `"Q4_K"`.
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// Number of elements in one block.
            pub fn block_size(self) -> u64 {
                match self { $(GgmlType::$variant => $block,)* }
            }

            /// Number of bytes in one block.
            pub fn type_size(self) -> u64 {
                match self { $(GgmlType::$variant => $bytes,)* }
            }
        }
    };
}

/// Elements per super-block of the k-quants.
const QK_K: u64 = 256;

ggml_types! {
    /// IEEE 754 binary32.
    F32 = 0, "F32", 1, 4;
    /// IEEE 754 binary16.
    F16 = 1, "F16", 1, 2;
    /// 4-bit, one f16 scale per 32.
    Q4_0 = 2, "Q4_0", 32, 2 + 16;
    /// 4-bit, f16 scale and min per 32.
    Q4_1 = 3, "Q4_1", 32, 2 + 2 + 16;
    /// 5-bit, one f16 scale per 32.
    Q5_0 = 6, "Q5_0", 32, 2 + 4 + 16;
    /// 5-bit, f16 scale and min per 32.
    Q5_1 = 7, "Q5_1", 32, 2 + 2 + 4 + 16;
    /// 8-bit, one f16 scale per 32.
    Q8_0 = 8, "Q8_0", 32, 2 + 32;
    /// 8-bit with f32 scale and sum, used for activations.
    Q8_1 = 9, "Q8_1", 32, 4 + 4 + 32;
    /// 2-bit k-quant.
    Q2_K = 10, "Q2_K", 256, 2 + 2 + QK_K / 16 + QK_K / 4;
    /// 3-bit k-quant.
    Q3_K = 11, "Q3_K", 256, 2 + QK_K / 4 + QK_K / 8 + 12;
    /// 4-bit k-quant: eight 32-element sub-blocks with 6-bit scales and mins.
    Q4_K = 12, "Q4_K", 256, 2 + 2 + QK_K / 2 + 12;
    /// 5-bit k-quant.
    Q5_K = 13, "Q5_K", 256, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    /// 6-bit k-quant: sixteen 16-element sub-blocks with 8-bit scales.
    Q6_K = 14, "Q6_K", 256, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    /// 8-bit k-quant, used for activations.
    Q8_K = 15, "Q8_K", 256, 4 + QK_K + QK_K / 8;
    /// i-quant.
    IQ2_XXS = 16, "IQ2_XXS", 256, 2 + QK_K / 4;
    /// i-quant.
    IQ2_XS = 17, "IQ2_XS", 256, 2 + QK_K / 4 + QK_K / 32;
    /// i-quant.
    IQ3_XXS = 18, "IQ3_XXS", 256, 2 + QK_K / 4 + QK_K / 8;
    /// i-quant.
    IQ1_S = 19, "IQ1_S", 256, 2 + QK_K / 8 + QK_K / 16;
    /// i-quant, non-linear 4-bit.
    IQ4_NL = 20, "IQ4_NL", 32, 2 + 16;
    /// i-quant.
    IQ3_S = 21, "IQ3_S", 256, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    /// i-quant.
    IQ2_S = 22, "IQ2_S", 256, 2 + QK_K / 4 + QK_K / 16;
    /// i-quant.
    IQ4_XS = 23, "IQ4_XS", 256, 2 + 2 + QK_K / 2 + QK_K / 64;
    /// Signed 8-bit integer.
    I8 = 24, "I8", 1, 1;
    /// Signed 16-bit integer.
    I16 = 25, "I16", 1, 2;
    /// Signed 32-bit integer.
    I32 = 26, "I32", 1, 4;
    /// Signed 64-bit integer.
    I64 = 27, "I64", 1, 8;
    /// IEEE 754 binary64.
    F64 = 28, "F64", 1, 8;
    /// i-quant.
    IQ1_M = 29, "IQ1_M", 256, QK_K / 8 + QK_K / 16 + QK_K / 32;
    /// bfloat16: the upper half of an f32.
    BF16 = 30, "BF16", 1, 2;
    /// Ternary quant.
    TQ1_0 = 34, "TQ1_0", 256, 2 + 4 * 13;
    /// Ternary quant.
    TQ2_0 = 35, "TQ2_0", 256, 2 + 64;
    /// Microscaling FP4.
    MXFP4 = 39, "MXFP4", 32, 1 + 16;
    /// NVIDIA FP4.
    NVFP4 = 40, "NVFP4", 64, 4 + 32;
    /// 1-bit quant.
    Q1_0 = 41, "Q1_0", 128, 2 + 16;
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Type tag of a metadata value, with GGUF's numeric ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8`
    U8 = 0,
    /// `i8`
    I8 = 1,
    /// `u16`
    U16 = 2,
    /// `i16`
    I16 = 3,
    /// `u32`
    U32 = 4,
    /// `i32`
    I32 = 5,
    /// `f32`
    F32 = 6,
    /// one byte, 0 or 1
    Bool = 7,
    /// u64 length + UTF-8 bytes
    String = 8,
    /// element type + u64 length + elements
    Array = 9,
    /// `u64`
    U64 = 10,
    /// `i64`
    I64 = 11,
    /// `f64`
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lowercase name used in error messages, e.g. `"u32"`.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Smallest encoding of one value of this type, used to bound declared
    /// counts by the bytes that remain before anything is allocated.
    pub(crate) fn min_encoded_len(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            // element type + length
            Array => 4 + 8,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `u8`
    U8(u8),
    /// `i8`
    I8(i8),
    /// `u16`
    U16(u16),
    /// `i16`
    I16(i16),
    /// `u32`
    U32(u32),
    /// `i32`
    I32(i32),
    /// `f32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// UTF-8 string
    String(String),
    /// Homogeneous array
    Array(Array),
    /// `u64`
    U64(u64),
    /// `i64`
    I64(i64),
    /// `f64`
    F64(f64),
}

impl Value {
    /// A scalar or a string as text, as a store's metadata records it (`None` for an array).
    pub fn scalar_text(&self) -> Option<String> {
        Some(match self {
            Value::U8(v) => v.to_string(),
            Value::I8(v) => v.to_string(),
            Value::U16(v) => v.to_string(),
            Value::I16(v) => v.to_string(),
            Value::U32(v) => v.to_string(),
            Value::I32(v) => v.to_string(),
            Value::U64(v) => v.to_string(),
            Value::I64(v) => v.to_string(),
            Value::F32(v) => v.to_string(),
            Value::F64(v) => v.to_string(),
            Value::Bool(v) => v.to_string(),
            Value::String(v) => v.clone(),
            Value::Array(_) => return None,
        })
    }

    /// The GGUF type tag of this value.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Short description for error messages: the type, plus the element type
    /// for arrays (`"array of string"`).
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.element_type()),
            other => other.value_type().name().to_owned(),
        }
    }
}

/// A homogeneous metadata array, stored unboxed per element type so a large
/// array costs about what it does in the file.
///
/// Arrays of arrays are rejected by the parser, as in ggml's `gguf.cpp`.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `u8` elements
    U8(Vec<u8>),
    /// `i8` elements
    I8(Vec<i8>),
    /// `u16` elements
    U16(Vec<u16>),
    /// `i16` elements
    I16(Vec<i16>),
    /// `u32` elements
    U32(Vec<u32>),
    /// `i32` elements
    I32(Vec<i32>),
    /// `f32` elements
    F32(Vec<f32>),
    /// `bool` elements
    Bool(Vec<bool>),
    /// string elements
    String(Vec<String>),
    /// `u64` elements
    U64(Vec<u64>),
    /// `i64` elements
    I64(Vec<i64>),
    /// `f64` elements
    F64(Vec<f64>),
}

impl Array {
    /// The type of every element.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
