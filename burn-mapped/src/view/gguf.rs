//! A GGUF file read in place.
//!
//! Tensors keep the GGUF's bytes where the file holds them: `F32`, `F16` and `BF16` tensors
//! as those dtypes; 2-D tensors of a block type the block kernels read (Q8_0, Q5_0, Q4_K,
//! Q6_K) as `u8` `[rows, row_bytes]` with their [`BlockLayout`], as a `blocks` store keeps
//! them. A block tensor of another rank is dequantized to `f32` once (a copy, reported); a
//! type nothing here reads is refused by name. The metadata's scalars and strings become
//! `gguf.<key>` strings, as a conversion records them.

use std::path::Path;
use std::sync::Arc;

use burn::tensor::DType;

use super::{Rename, ViewBuilder};
use crate::error::StoreError;
use crate::gguf::format::{GgmlType, can_dequantize, dequantize};
use crate::gguf::{GgufFile, scalar_text};
use crate::manifest::{BlockLayout, TensorEntry};
use crate::map::MappedFile;
use crate::store::{MappedStore, OpenOptions};

/// Metadata key naming the format a view was read from (`gguf`, `safetensors`).
pub const FORMAT_KEY: &str = "source.format";

/// Opens `path` as a view, naming tensors by `rename`; also returns the parsed header (for a
/// caller that builds a tokenizer from its vocabulary without parsing it again).
pub(crate) fn open(
    path: &Path,
    options: OpenOptions,
    rename: Rename<'_>,
) -> Result<(MappedStore, GgufFile), StoreError> {
    let file = Arc::new(MappedFile::checkpoint(path)?);
    let in_file = |source| StoreError::Gguf {
        file: path.to_path_buf(),
        source: Box::new(source),
    };
    let gguf = GgufFile::parse(file.bytes()).map_err(in_file)?;
    let file_name = file.tensor().to_string();
    let mut view = ViewBuilder::default();
    view.metadata(FORMAT_KEY.into(), "gguf".into());
    for (key, value) in gguf.metadata() {
        if let Some(text) = scalar_text(value) {
            view.metadata(format!("gguf.{key}"), text);
        }
    }
    for info in gguf.tensors() {
        let Some(name) = rename(info.name()) else {
            continue;
        };
        let shape = info.shape_row_major();
        let offset = info.offset();
        let ty = info.ggml_type();
        let entry = |dtype, shape, blocks| {
            TensorEntry::in_file(
                name.clone(),
                dtype,
                shape,
                file_name.clone(),
                offset,
                blocks,
            )
        };
        let plain = match ty {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::BF16 => Some(DType::BF16),
            _ => None,
        };
        if let Some(dtype) = plain {
            view.place(entry(dtype, shape, None)?, &file, dtype);
            continue;
        }
        if let [rows, cols] = shape[..]
            && let Ok(layout) = BlockLayout::new(ty, cols)
        {
            let entry = entry(DType::U8, vec![rows, layout.row_bytes()], Some(layout))?;
            view.place(entry, &file, DType::U8);
            continue;
        }
        if !can_dequantize(ty) {
            return Err(StoreError::GgufType {
                file: path.to_path_buf(),
                tensor: name,
                ty: ty.name(),
            });
        }
        // A block type the kernels read, in a shape they do not take: dequantized once.
        let bytes = gguf.tensor_bytes(file.bytes(), info).map_err(in_file)?;
        let mut values = vec![0f32; info.n_elements() as usize];
        dequantize(ty, bytes, &mut values).map_err(in_file)?;
        let copy: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        view.copy(entry(DType::F32, shape, None)?, &file, copy.into());
    }
    let store = view.finish(path, options)?;
    Ok((store, gguf))
}
