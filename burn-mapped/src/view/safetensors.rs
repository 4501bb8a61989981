//! A safetensors checkpoint (one file, a sharded index, or a directory of shards) read in
//! place: every tensor adopted at its offset when that offset suits its dtype's alignment,
//! copied once and reported otherwise. The files' `__metadata__` becomes `safetensors.<key>`
//! strings, as a conversion records it.

use std::path::Path;

use super::plan::FORMAT_KEY;
use super::{Rename, ViewBuilder};
use crate::convert::{SafetensorsInput, SourceDType};
use crate::error::StoreError;
use crate::manifest::TensorEntry;
use crate::store::{MappedStore, OpenOptions};

/// Opens `path` as a view, naming tensors by `rename`.
///
/// Errors of the safetensors reader (a malformed header, an index that disagrees with its
/// shards) come as [`StoreError::Checkpoint`] whose I/O error carries the reader's
/// [`ConvertError`](crate::convert::ConvertError) (`get_ref()` and `downcast_ref`).
pub(crate) fn open(
    path: &Path,
    options: OpenOptions,
    rename: Rename<'_>,
) -> Result<MappedStore, StoreError> {
    let input = SafetensorsInput::open(path).map_err(|e| StoreError::Checkpoint {
        file: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    let mut view = ViewBuilder::default();
    view.metadata(FORMAT_KEY.into(), "safetensors".into());
    for (key, value) in input.metadata() {
        view.metadata(key, value);
    }
    for (file, offset, tensor) in input.placed() {
        let Some(name) = rename(&tensor.name) else {
            continue;
        };
        let dtype = match tensor.dtype {
            SourceDType::Known(dtype) => dtype,
            SourceDType::Unsupported(spelled) => {
                return Err(StoreError::UnsupportedDType {
                    tensor: name,
                    dtype: spelled,
                });
            }
        };
        let file_name = tensor
            .file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let entry =
            TensorEntry::in_file(name, dtype, tensor.shape, file_name, offset as u64, None)?;
        view.place(entry, file, dtype);
    }
    view.finish(path, options)
}
