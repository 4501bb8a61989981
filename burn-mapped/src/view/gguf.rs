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

use super::plan::{Planned, plan_gguf};
use super::{Rename, ViewBuilder};
use crate::error::StoreError;
use crate::gguf::GgufFile;
use crate::gguf::format::dequantize;
use crate::map::MappedFile;
use crate::store::{MappedStore, OpenOptions};

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
    let (planned, metadata) = plan_gguf(&gguf, path, file.tensor(), rename)?;
    let mut view = ViewBuilder::default();
    for (key, value) in metadata {
        view.metadata(key, value);
    }
    for tensor in planned {
        match tensor {
            Planned::InFile(entry) => {
                let dtype = entry.dtype();
                view.place(entry, &file, dtype);
            }
            Planned::Dequantized { entry, source } => {
                let info = &gguf.tensors()[source];
                let bytes = gguf.tensor_bytes(file.bytes(), info).map_err(in_file)?;
                let mut values = vec![0f32; info.n_elements() as usize];
                dequantize(info.ggml_type(), bytes, &mut values).map_err(in_file)?;
                let copy: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                view.copy(entry, &file, copy.into());
            }
        }
    }
    Ok((view.finish(path, options)?, gguf))
}
