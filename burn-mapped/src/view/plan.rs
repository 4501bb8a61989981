//! What a view of a GGUF file holds, decided from its parsed header alone: where each tensor
//! lies and as what, before anything is mapped or copied. No Burn and no other module of the
//! crate but the manifest and the GGUF format, so the fuzz crate compiles it (`gguf_view`).

use std::collections::BTreeMap;
use std::path::Path;

use burn_std::DType;

use crate::error::StoreError;
use crate::gguf::BlockLayout;
use crate::gguf::format::{GgmlType, GgufFile, can_dequantize};
use crate::manifest::TensorEntry;

/// Metadata key naming the format a view was read from (`gguf`, `safetensors`).
pub const FORMAT_KEY: &str = "source.format";

/// How one tensor of a view is held.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Planned {
    /// Adopted at its entry's offset in the file (or copied once if that offset does not suit
    /// the dtype's alignment).
    InFile(TensorEntry),
    /// Dequantized to `f32` once: a block type the kernels read, in a shape they do not take.
    /// `source` is the tensor's index in the header's table.
    Dequantized { entry: TensorEntry, source: usize },
}

/// Plans the view of the GGUF at `path` (named `file_name`), whose header is `gguf`, naming
/// tensors by `rename`; returns the tensors and the view's metadata (`gguf.<key>` strings).
///
/// `F32`, `F16` and `BF16` tensors keep their dtype; 2-D tensors of a block type with a
/// [`BlockLayout`] are `u8` `[rows, row_bytes]` with that layout; other tensors of a type
/// [`can_dequantize`] reads are dequantized; any other type is refused.
///
/// # Errors
/// [`StoreError::GgufType`] for a type nothing here reads; an entry's own checks (name, rank).
pub(crate) fn plan_gguf(
    gguf: &GgufFile,
    path: &Path,
    file_name: &str,
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<Planned>, BTreeMap<String, String>), StoreError> {
    let mut metadata = BTreeMap::from([(FORMAT_KEY.to_string(), "gguf".to_string())]);
    for (key, value) in gguf.metadata() {
        if let Some(text) = value.scalar_text() {
            metadata.insert(format!("gguf.{key}"), text);
        }
    }
    let mut planned = Vec::with_capacity(gguf.tensors().len());
    for (index, info) in gguf.tensors().iter().enumerate() {
        let Some(name) = rename(info.name()) else {
            continue;
        };
        let shape = info.shape_row_major();
        let ty = info.ggml_type();
        let entry = |dtype, shape, blocks| {
            TensorEntry::in_file(
                name.clone(),
                dtype,
                shape,
                file_name.to_string(),
                info.offset(),
                blocks,
            )
        };
        let plain = match ty {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::BF16 => Some(DType::BF16),
            _ => None,
        };
        let layout = match shape[..] {
            [_, cols] => BlockLayout::new(ty, cols).ok(),
            _ => None,
        };
        let tensor = if let Some(dtype) = plain {
            Planned::InFile(entry(dtype, shape, None)?)
        } else if let Some(layout) = layout {
            let rows = shape[0];
            Planned::InFile(entry(
                DType::U8,
                vec![rows, layout.row_bytes()],
                Some(layout),
            )?)
        } else if can_dequantize(ty) {
            Planned::Dequantized {
                entry: entry(DType::F32, shape, None)?,
                source: index,
            }
        } else {
            return Err(StoreError::GgufType {
                file: path.to_path_buf(),
                tensor: name,
                ty: ty.name(),
            });
        };
        planned.push(tensor);
    }
    Ok((planned, metadata))
}

/// Checks that the byte ranges `(file, offset, len, tensor)` of the tensors a view adopts lie
/// inside their files (`file_len(file)`) and that no two of one file share a byte: the format
/// readers check this too, and a view relies on it for every read, so it checks again.
///
/// # Errors
/// [`StoreError::BadView`] naming the first tensor at fault.
pub(crate) fn check_ranges<'a>(
    ranges: impl IntoIterator<Item = (usize, u64, u64, &'a str)>,
    file_len: impl Fn(usize) -> u64,
    path: impl Fn(usize) -> std::path::PathBuf,
) -> Result<(), StoreError> {
    let mut ranges: Vec<(usize, u64, u64, &str)> = ranges
        .into_iter()
        .map(|(file, offset, len, name)| (file, offset, offset.saturating_add(len), name))
        .collect();
    ranges.sort_unstable();
    let mut covered: Option<(usize, u64)> = None;
    for (file, start, end, name) in ranges {
        let bad = |reason| StoreError::BadView {
            file: path(file),
            tensor: name.to_string(),
            reason,
        };
        if end > file_len(file) {
            return Err(bad("its bytes run past the end of the file"));
        }
        if start < end {
            if covered.is_some_and(|(f, e)| f == file && start < e) {
                return Err(bad("its bytes overlap another tensor's"));
            }
            covered = Some((file, end));
        }
    }
    Ok(())
}
