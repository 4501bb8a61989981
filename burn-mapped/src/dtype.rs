//! The element types a store may hold, spelled as stable strings in the manifest.

use burn::tensor::DType;

/// Maps a manifest dtype string to Burn's [`DType`].
///
/// The manifest uses its own names rather than Burn's serde form so the format does not change
/// when Burn renames an enum variant.
pub fn parse_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "f64" => DType::F64,
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "i64" => DType::I64,
        "i32" => DType::I32,
        "i16" => DType::I16,
        "i8" => DType::I8,
        "u64" => DType::U64,
        "u32" => DType::U32,
        "u16" => DType::U16,
        "u8" => DType::U8,
        "bool" => DType::Bool(burn::tensor::BoolStore::Native),
        _ => return None,
    })
}

/// The manifest name of a Burn [`DType`], or `None` for types a store cannot hold
/// (Burn's packed quantized tensors; the store has its own int8 format).
pub fn dtype_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F64 => "f64",
        DType::F32 | DType::Flex32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::I16 => "i16",
        DType::I8 => "i8",
        DType::U64 => "u64",
        DType::U32 => "u32",
        DType::U16 => "u16",
        DType::U8 => "u8",
        DType::Bool(burn::tensor::BoolStore::Native | burn::tensor::BoolStore::U8) => "bool",
        DType::Bool(burn::tensor::BoolStore::U32) | DType::QFloat(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for name in [
            "f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool",
        ] {
            let dtype = parse_dtype(name).unwrap();
            assert_eq!(dtype_name(dtype), Some(name));
        }
        assert_eq!(parse_dtype("f8"), None);
    }
}
