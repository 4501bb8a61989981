//! GGUF to store: each tensor is dequantized once and relaid into its own page-aligned file,
//! so loading afterwards is a mapping, not a decode.

use std::io::Write;
use std::path::Path;

use burn::tensor::DType;

use super::{GgufError, MappedGguf, Value, dequantize};
use crate::error::StoreError;
use crate::manifest::Manifest;
use crate::writer::{StoreWriter, TensorSpec};

/// Errors converting a GGUF file into a store.
#[derive(Debug, thiserror::Error)]
pub enum GgufConvertError {
    /// Reading or dequantizing the GGUF failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A tensor could not be dequantized.
    #[error("GGUF tensor `{tensor}`: {source}")]
    Dequantize {
        /// GGUF tensor name.
        tensor: String,
        /// What went wrong.
        source: GgufError,
    },
    /// Writing the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The requested output dtype is not a float type the converter writes.
    #[error("cannot convert GGUF tensors to {dtype:?}: choose f32, f16 or bf16")]
    UnsupportedDType {
        /// The dtype asked for.
        dtype: DType,
    },
    /// Two GGUF tensors were renamed to the same store name.
    #[error("GGUF tensors `{first}` and `{second}` both map to `{name}`")]
    RenameCollision {
        /// First GGUF name.
        first: String,
        /// Second GGUF name.
        second: String,
        /// The store name.
        name: String,
    },
}

/// Progress callback: (bytes written so far, total bytes, tensor name).
pub type Progress<'p> = dyn FnMut(u64, u64, &str) + 'p;

/// How to convert: the name map (module paths usually differ from GGUF's names; `None` drops a
/// tensor), the output float dtype, and an optional progress callback.
pub struct GgufConvert<'r, 'p> {
    /// GGUF tensor name to store tensor name.
    pub rename: &'r dyn Fn(&str) -> Option<String>,
    /// Output dtype: `F32`, `F16` or `BF16`.
    pub dtype: DType,
    /// Called after each tensor with (bytes written so far, total bytes, tensor name).
    pub progress: Option<&'p mut Progress<'p>>,
}

/// Metadata key holding the source file's path.
pub const SOURCE_KEY: &str = "source.gguf";

/// Converts `gguf` into a new store at `dir`.
///
/// Scalar and string metadata is copied into the manifest under `gguf.<key>` (arrays such as
/// the vocabulary are not: they stay in the GGUF, named by [`SOURCE_KEY`]).
pub fn gguf_to_store(
    gguf: &MappedGguf,
    dir: &Path,
    mut options: GgufConvert<'_, '_>,
) -> Result<Manifest, GgufConvertError> {
    let elem = match options.dtype {
        DType::F32 => 4u64,
        DType::F16 | DType::BF16 => 2,
        dtype => return Err(GgufConvertError::UnsupportedDType { dtype }),
    };
    let file = gguf.gguf();
    let mut seen = std::collections::HashMap::new();
    let plan: Vec<_> = file
        .tensors()
        .iter()
        .filter_map(|info| (options.rename)(info.name()).map(|name| (info, name)))
        .collect();
    for (info, name) in &plan {
        if let Some(first) = seen.insert(name.clone(), info.name().to_string()) {
            return Err(GgufConvertError::RenameCollision {
                first,
                second: info.name().to_string(),
                name: name.clone(),
            });
        }
    }
    let total: u64 = plan.iter().map(|(info, _)| info.n_elements() * elem).sum();

    let mut writer = StoreWriter::create(dir)?;
    writer.metadata(SOURCE_KEY, gguf.path().display().to_string());
    for (key, value) in file.metadata() {
        if let Some(text) = scalar_text(value) {
            writer.metadata(format!("gguf.{key}"), text);
        }
    }
    let mut done = 0u64;
    let mut values = Vec::new();
    for (info, name) in plan {
        let bytes = gguf.tensor_data(info)?;
        values.resize(info.n_elements() as usize, 0.0f32);
        dequantize(info.ggml_type(), bytes, &mut values).map_err(|source| {
            GgufConvertError::Dequantize {
                tensor: info.name().to_string(),
                source,
            }
        })?;
        let spec = TensorSpec::new(name.clone(), options.dtype, info.shape_row_major());
        let dtype = options.dtype;
        writer.add_with(spec, |sink| write_as(&values, dtype, sink))?;
        done += info.n_elements() * elem;
        if let Some(progress) = options.progress.as_mut() {
            progress(done, total, &name);
        }
    }
    Ok(writer.finish()?)
}

fn write_as(values: &[f32], dtype: DType, sink: &mut impl Write) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64 * 1024);
    for chunk in values.chunks(16 * 1024) {
        buf.clear();
        match dtype {
            DType::F16 => chunk
                .iter()
                .for_each(|&v| buf.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())),
            DType::BF16 => chunk
                .iter()
                .for_each(|&v| buf.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
            _ => chunk
                .iter()
                .for_each(|&v| buf.extend_from_slice(&v.to_le_bytes())),
        }
        sink.write_all(&buf)?;
    }
    Ok(())
}

fn scalar_text(value: &Value) -> Option<String> {
    Some(match value {
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
