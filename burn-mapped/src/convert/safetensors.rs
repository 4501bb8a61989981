//! Hugging Face safetensors input: one file, a sharded checkpoint's index, or a directory of
//! shards.
//!
//! Each file is mapped read-only and its header validated by the `safetensors` crate
//! (`SafeTensors::read_metadata`: offsets contiguous from 0, sizes exact, data ending at end of
//! file). Tensors are listed in file order, shard by shard.
//!
//! The header and index parsing is in [`parse`], which the fuzz crate compiles on its own.

mod parse;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ::safetensors::Dtype;
use burn::tensor::{BoolStore, DType};
use memmap2::Advice;

use crate::map::MappedFile;

use super::{
    ConvertError, ConvertOptions, ConvertSummary, SourceDType, SourceTensor, convert_into,
};
use crate::manifest::Manifest;
use parse::{Header, HeaderError, is_plain_file_name, parse_index, read_header};

/// Suffix of a sharded checkpoint's index file.
const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// One opened, validated safetensors file.
struct Shard {
    path: PathBuf,
    map: std::sync::Arc<MappedFile>,
    header: Header,
}

/// An opened safetensors checkpoint: every file mapped and its header validated.
pub struct SafetensorsInput {
    shards: Vec<Shard>,
}

impl std::fmt::Debug for SafetensorsInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsInput")
            .field(
                "files",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl SafetensorsInput {
    /// Opens `path`: a `.safetensors` file, a `*.safetensors.index.json` (its shards are read
    /// from the same directory), or a directory holding either one index file or shards (all
    /// `*.safetensors` files, in name order).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ConvertError> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::open_dir(path);
        }
        if path.to_string_lossy().ends_with(".index.json") {
            return Self::open_index(path);
        }
        Ok(Self {
            shards: vec![open_shard(path)?],
        })
    }

    fn open_dir(dir: &Path) -> Result<Self, ConvertError> {
        let io = |source| ConvertError::Open {
            file: dir.to_path_buf(),
            source,
        };
        let mut indexes = Vec::new();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.ends_with(INDEX_SUFFIX) {
                indexes.push(path);
            } else if name.ends_with(".safetensors") && path.is_file() {
                files.push(path);
            }
        }
        match indexes.len() {
            0 => {}
            1 => return Self::open_index(&indexes[0]),
            _ => {
                indexes.sort();
                return Err(ConvertError::NoInput {
                    dir: dir.to_path_buf(),
                    reason: format!(
                        "several index files ({}); name the one to convert",
                        indexes
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
        }
        if files.is_empty() {
            return Err(ConvertError::NoInput {
                dir: dir.to_path_buf(),
                reason: "no .safetensors file or index in this directory".into(),
            });
        }
        files.sort();
        let shards = files
            .iter()
            .map(|p| open_shard(p))
            .collect::<Result<_, _>>()?;
        Ok(Self { shards })
    }

    fn open_index(index_path: &Path) -> Result<Self, ConvertError> {
        // An index lists names, a few hundred KiB for the largest checkpoints.
        const MAX_INDEX_BYTES: u64 = 64 << 20;
        let bytes = crate::untrusted::read_regular(
            index_path,
            crate::untrusted::Links::Follow,
            MAX_INDEX_BYTES,
        )
        .map_err(|source| ConvertError::Open {
            file: index_path.to_path_buf(),
            source,
        })?;
        // Shard name -> the tensors the index places in it.
        let by_shard: BTreeMap<String, BTreeSet<String>> =
            parse_index(&bytes).map_err(|source| ConvertError::IndexSyntax {
                file: index_path.to_path_buf(),
                source,
            })?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut shards = Vec::with_capacity(by_shard.len());
        for (name, listed) in &by_shard {
            if !is_plain_file_name(name) {
                return Err(ConvertError::UnsafeShardName {
                    file: index_path.to_path_buf(),
                    shard: name.escape_debug().to_string(),
                });
            }
            let shard = open_shard(&dir.join(name))?;
            let mismatch = |tensor: &str, reason| ConvertError::ShardMismatch {
                index: index_path.to_path_buf(),
                shard: shard.path.clone(),
                tensor: tensor.to_string(),
                reason,
            };
            for tensor in listed {
                if shard.header.metadata.info(tensor).is_none() {
                    return Err(mismatch(
                        tensor,
                        "the index places it in this shard, which lacks it",
                    ));
                }
            }
            for tensor in shard.header.metadata.offset_keys() {
                if !listed.contains(&tensor) {
                    return Err(mismatch(
                        &tensor,
                        "in the shard but not listed for it in the index",
                    ));
                }
            }
            shards.push(shard);
        }
        Ok(Self { shards })
    }

    /// The input files, in conversion order.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Every tensor, shard by shard in file order. Unsupported dtypes (F8, F4, C64, ...) are
    /// listed as [`SourceDType::Unsupported`].
    pub fn tensors(&self) -> Vec<SourceTensor<'_>> {
        self.placed().into_iter().map(|(_, _, t)| t).collect()
    }

    /// [`tensors`](Self::tensors), each with the mapping of its file and its offset there.
    pub(crate) fn placed(&self) -> Vec<(&std::sync::Arc<MappedFile>, usize, SourceTensor<'_>)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let bytes: &[u8] = shard.map.bytes();
            let metadata = &shard.header.metadata;
            for name in metadata.offset_keys() {
                let info = metadata.info(&name).expect("offset_keys lists known names");
                // In bounds: read_metadata checked that the offsets tile the data section,
                // which ends exactly at the end of the file.
                let range = shard.header.data_range(info);
                let offset = range.start;
                out.push((
                    &shard.map,
                    offset,
                    SourceTensor {
                        file: &shard.path,
                        name,
                        dtype: burn_dtype(info.dtype),
                        shape: info.shape.clone(),
                        param_id: None,
                        data: &bytes[range],
                    },
                ));
            }
        }
        out
    }

    /// The files' `__metadata__` entries, each key prefixed with `safetensors.`. When shards
    /// disagree on a key, the first shard's value is kept.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for shard in &self.shards {
            for (k, v) in shard.header.metadata.metadata().iter().flatten() {
                out.entry(format!("safetensors.{k}"))
                    .or_insert_with(|| v.clone());
            }
        }
        out
    }
}

/// Converts the safetensors checkpoint at `input` into a new store at `out`.
///
/// The store's metadata records `convert.source = safetensors`, the cast target if any, and
/// the input's `__metadata__` (see [`SafetensorsInput::metadata`]).
pub fn from_safetensors(
    input: impl AsRef<Path>,
    out: impl AsRef<Path>,
    options: &mut ConvertOptions,
) -> Result<(Manifest, ConvertSummary), ConvertError> {
    let input = SafetensorsInput::open(input)?;
    let mut metadata = input.metadata();
    metadata.insert("convert.source".into(), "safetensors".into());
    convert_into(out.as_ref(), input.tensors(), metadata, options)
}

pub(crate) fn burn_dtype(dtype: Dtype) -> SourceDType {
    SourceDType::Known(match dtype {
        Dtype::BOOL => DType::Bool(BoolStore::Native),
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::U16 => DType::U16,
        Dtype::I16 => DType::I16,
        Dtype::U32 => DType::U32,
        Dtype::I32 => DType::I32,
        Dtype::U64 => DType::U64,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        other => return SourceDType::Unsupported(format!("{other:?}")),
    })
}

fn open_shard(path: &Path) -> Result<Shard, ConvertError> {
    let io = |source| ConvertError::Open {
        file: path.to_path_buf(),
        source,
    };
    let file = crate::untrusted::open_regular(path, crate::untrusted::Links::Follow).map_err(io)?;
    // Every access goes through slices bounded by the validated header, which `read_header`
    // checked against the mapping's length.
    let map = std::sync::Arc::new(MappedFile::whole(file, path, Advice::Sequential).map_err(io)?);
    let file = path.to_path_buf();
    let header = read_header(map.bytes()).map_err(|error| match error {
        HeaderError::Truncated { expected, actual } => ConvertError::Truncated {
            file,
            expected,
            actual,
        },
        HeaderError::TrailingBytes { expected, actual } => ConvertError::TrailingBytes {
            file,
            expected,
            actual,
        },
        HeaderError::Safetensors(source) => ConvertError::Safetensors { file, source },
    })?;
    Ok(Shard {
        path: path.to_path_buf(),
        map,
        header,
    })
}
