//! GGUF to store: each tensor is relaid into its own page-aligned file, so loading afterwards
//! is a mapping, not a decode. Matrices picked to keep their blocks are copied byte for byte
//! (see [`crate::blocks`]); those picked for q8 are dequantized, then requantized per row (see
//! [`crate::q8`]), their error measured against the dequantized values; the rest are
//! dequantized to the float dtype asked for.

use std::io::Write;
use std::path::Path;

use burn::tensor::DType;

use super::format::BlockLayout;
use super::format::{f16_at, scale_offsets};
use super::source::{SourceError, SourceRecord};
use super::{GgufError, MappedGguf, dequantize};
use crate::convert::{CastTo, ConvertOptions, Progress};
use crate::error::StoreError;
use crate::manifest::{Manifest, Q8_ROW_F16, TensorFormat};
use crate::q8::{Q8Builder, Q8Error, add_q8, scale_name};
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
    /// The source file could not be identified (its path resolved, its metadata read).
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A tensor picked for q8 cannot be quantized (a row whose scale exceeds f16, or a
    /// non-finite value after dequantization).
    #[error("GGUF tensor `{tensor}`: cannot quantize to q8: {source}")]
    Quantize {
        /// GGUF tensor name.
        tensor: String,
        /// What went wrong (boxed: it is large and rare).
        source: Box<Q8Error>,
    },
    /// A q8 matrix's scale tensor would take the store name of another tensor.
    #[error(
        "GGUF tensor `{tensor}` is quantized to q8, but its scale name `{scale}` is already the store name of `{other}`"
    )]
    ScaleNameTaken {
        /// GGUF name of the quantized tensor.
        tensor: String,
        /// Its scale tensor's name.
        scale: String,
        /// GGUF name of the tensor stored under that name.
        other: String,
    },
    /// A block of a tensor kept as blocks has a scale that is NaN or infinite.
    #[error("GGUF tensor `{tensor}`: block {block} has a non-finite scale ({value})")]
    BadBlock {
        /// GGUF tensor name.
        tensor: String,
        /// Index of the block in the tensor.
        block: u64,
        /// The scale.
        value: f32,
    },
    /// A dequantized value is past the range of the float dtype asked for: storing it would
    /// store an infinity instead.
    #[error(
        "GGUF tensor `{tensor}`: element {index} ({value:e}) is out of {dtype:?}'s range; convert to a wider dtype"
    )]
    Unrepresentable {
        /// GGUF tensor name.
        tensor: String,
        /// Element index.
        index: u64,
        /// The value.
        value: f32,
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

/// Converts `gguf` into a new store at `dir`, as `options` say: tensors renamed (a rename
/// returning `None` drops one), the matrices the blocks predicate picks kept as blocks (only
/// 2-D tensors of a block type with a product, [`BlockLayout::new`]; any other it picks is
/// treated as the q8 predicate and the cast say), those the q8 predicate picks requantized to
/// q8, the rest dequantized to the cast's float type (f32 without one).
///
/// Scalar and string metadata is copied into the manifest under `gguf.<key>` (arrays such as
/// the vocabulary are not: they stay in the GGUF, which the store names and identifies with a
/// [`SourceRecord`]).
pub fn gguf_to_store(
    gguf: &MappedGguf,
    dir: &Path,
    mut options: ConvertOptions<'_>,
) -> Result<Manifest, GgufConvertError> {
    let dtype = options.cast_target().unwrap_or(CastTo::F32).dtype();
    let elem = dtype.size() as u64;
    let file = gguf.gguf();
    let mut seen = std::collections::HashMap::new();
    let plan: Vec<_> = file
        .tensors()
        .iter()
        .filter_map(|info| {
            let name = options.store_name(info.name())?;
            let shape = info.shape_row_major();
            let layout = options
                .picks_blocks(&name, &shape)
                .then(|| BlockLayout::new(info.ggml_type(), shape[1]).ok())
                .flatten();
            let kind = match layout {
                Some(layout) => TensorFormat::Blocks(layout),
                None if options.picks_q8(&name, &shape) => TensorFormat::Q8,
                None => TensorFormat::Float,
            };
            Some((info, name, kind))
        })
        .collect();
    for (info, name, _) in &plan {
        if let Some(first) = seen.insert(name.clone(), info.name().to_string()) {
            return Err(GgufConvertError::RenameCollision {
                first,
                second: info.name().to_string(),
                name: name.clone(),
            });
        }
    }
    for (info, name, _) in plan.iter().filter(|(_, _, kind)| *kind == TensorFormat::Q8) {
        let scale = scale_name(name);
        if let Some(other) = seen.get(&scale) {
            return Err(GgufConvertError::ScaleNameTaken {
                tensor: info.name().to_string(),
                scale,
                other: other.clone(),
            });
        }
    }
    let stored = |info: &super::TensorInfo, kind: TensorFormat| match kind {
        TensorFormat::Blocks(_) => info.byte_len(),
        TensorFormat::Q8 => {
            let rows = info.shape_row_major()[0] as u64;
            info.n_elements() + rows * 2
        }
        TensorFormat::Float => info.n_elements() * elem,
    };
    let total: u64 = plan.iter().map(|(info, _, kind)| stored(info, *kind)).sum();

    let source = SourceRecord::of(gguf)?;
    let mut writer = StoreWriter::create_with(dir, options.existing_policy())?;
    for (key, value) in source.to_metadata() {
        writer.metadata(key, value);
    }
    let (q8, blocks) = options.quantizes();
    if q8 {
        writer.metadata("convert.q8", Q8_ROW_F16);
    }
    if blocks {
        writer.metadata("convert.blocks", "gguf");
    }
    for (key, value) in file.metadata() {
        if let Some(text) = value.scalar_text() {
            writer.metadata(format!("gguf.{key}"), text);
        }
    }
    let mut done = 0u64;
    let mut values = Vec::new();
    for (info, name, kind) in plan {
        let bytes = gguf.tensor_data(info)?;
        if let TensorFormat::Blocks(layout) = kind {
            check_blocks(info.name(), layout, bytes)?;
            let rows = bytes.len() / layout.row_bytes();
            let spec =
                TensorSpec::new(name.clone(), DType::U8, [rows, layout.row_bytes()]).blocks(layout);
            writer.add_with(spec, |sink| sink.write_all(bytes))?;
            done += stored(info, kind);
            options.report(&Progress {
                done_bytes: done,
                total_bytes: total,
                tensor: &name,
            });
            continue;
        }
        values.resize(info.n_elements() as usize, 0.0f32);
        dequantize(info.ggml_type(), bytes, &mut values).map_err(|source| {
            GgufConvertError::Dequantize {
                tensor: info.name().to_string(),
                source,
            }
        })?;
        let shape = info.shape_row_major();
        if kind == TensorFormat::Q8 {
            write_q8(
                &mut writer,
                info.name(),
                &name,
                &values,
                [shape[0], shape[1]],
            )?;
        } else {
            if let Some(index) = first_unrepresentable(&values, dtype) {
                return Err(GgufConvertError::Unrepresentable {
                    tensor: info.name().to_string(),
                    index: index as u64,
                    value: values[index],
                    dtype,
                });
            }
            let spec = TensorSpec::new(name.clone(), dtype, shape);
            writer.add_with(spec, |sink| write_as(&values, dtype, sink))?;
        }
        done += stored(info, kind);
        options.report(&Progress {
            done_bytes: done,
            total_bytes: total,
            tensor: &name,
        });
    }
    Ok(writer.finish()?)
}

/// Every block's f16 scale fields are finite: a NaN or infinite scale is refused here, at
/// conversion, rather than turning a product into NaN at run time.
fn check_blocks(tensor: &str, layout: BlockLayout, bytes: &[u8]) -> Result<(), GgufConvertError> {
    let ty = layout.ty();
    for (block, b) in bytes.chunks_exact(ty.type_size() as usize).enumerate() {
        for &at in scale_offsets(ty) {
            let value = f16_at(b, at);
            if !value.is_finite() {
                return Err(GgufConvertError::BadBlock {
                    tensor: tensor.to_string(),
                    block: block as u64,
                    value,
                });
            }
        }
    }
    Ok(())
}

/// Requantizes one dequantized matrix per row and adds the q8 pair.
fn write_q8(
    writer: &mut StoreWriter,
    tensor: &str,
    name: &str,
    values: &[f32],
    [out, inp]: [usize; 2],
) -> Result<(), GgufConvertError> {
    let quantize_error = |source| GgufConvertError::Quantize {
        tensor: tensor.to_string(),
        source: Box::new(source),
    };
    let mut builder = Q8Builder::new(out, inp);
    builder.push(values).map_err(quantize_error)?;
    let (rows, rel_error) = builder.finish().map_err(quantize_error)?;
    match add_q8(writer, name, &rows, out, inp, Some(rel_error)) {
        Ok(_) => Ok(()),
        Err(Q8Error::Store(e)) => Err(e.into()),
        Err(other) => Err(quantize_error(other)),
    }
}

/// The first finite value that `dtype` would store as an infinity.
fn first_unrepresentable(values: &[f32], dtype: DType) -> Option<usize> {
    let overflows = |v: f32| match dtype {
        DType::F16 => half::f16::from_f32(v).is_infinite(),
        DType::BF16 => half::bf16::from_f32(v).is_infinite(),
        _ => false,
    };
    values.iter().position(|&v| v.is_finite() && overflows(v))
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
