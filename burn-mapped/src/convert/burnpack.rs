//! Burn's burnpack (`.bpk`) input, read with Burn's own
//! [`Reader`](burn::store::burn_pack::Reader) over a read-only mapping, so every tensor is a
//! window into the file and parameter ids are kept.
//!
//! The reading itself is in [`parse`], which the fuzz crate compiles on its own.

mod parse;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::{AllocationProperty, Bytes, DType};
use memmap2::Advice;

use super::{
    ConvertError, ConvertOptions, ConvertSummary, SourceDType, SourceTensor, convert_into,
};
use crate::manifest::Manifest;
use crate::map::MappedFile;
use parse::{PackTensor, read_pack};

/// An opened burnpack file: header and metadata validated by Burn's reader, tensors listed in
/// file order.
pub struct BurnpackInput {
    path: PathBuf,
    tensors: Vec<PackTensor>,
    metadata: BTreeMap<String, String>,
}

impl std::fmt::Debug for BurnpackInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnpackInput")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Keeps the mapping alive for as long as any tensor window into it exists.
struct MapOwner(MappedFile);

impl AsRef<[u8]> for MapOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl BurnpackInput {
    /// Opens and validates the burnpack at `path` (the exact path; no extension is guessed).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ConvertError> {
        let path = path.as_ref();
        let io = |source| ConvertError::Open {
            file: path.to_path_buf(),
            source,
        };
        let file =
            crate::untrusted::open_regular(path, crate::untrusted::Links::Follow).map_err(io)?;
        // Burn's reader bounds-checks every tensor range against the mapping's length before
        // windowing into it.
        let map = MappedFile::whole(file, path, Advice::Sequential).map_err(io)?;
        let shared = bytes::Bytes::from_owner(MapOwner(map));
        let bytes = Bytes::from_shared(shared, AllocationProperty::File);
        let pack = read_pack(bytes).map_err(|source| ConvertError::Burnpack {
            file: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            tensors: pack.tensors,
            metadata: pack.metadata,
        })
    }

    /// Every tensor, in file order, with its parameter id.
    pub fn tensors(&self) -> Vec<SourceTensor<'_>> {
        self.tensors
            .iter()
            .map(|t| SourceTensor {
                file: &self.path,
                name: t.name.clone(),
                dtype: match t.dtype {
                    // Burn's packed quantized layout has no store equivalent.
                    DType::QFloat(_) => SourceDType::Unsupported(format!("{:?}", t.dtype)),
                    d => SourceDType::Known(d),
                },
                shape: t.shape.clone(),
                param_id: t.param_id,
                data: &t.bytes,
            })
            .collect()
    }

    /// The pack's key/value metadata as `burnpack.<key>`, and its typed scalars as
    /// `burnpack.scalar.<key>` holding the scalar's JSON (`{"Int":3}`).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
}

/// Converts the burnpack at `input` into a new store at `out`, keeping parameter ids.
///
/// The store's metadata records `convert.source = burnpack`, the cast target if any, and the
/// pack's metadata (see [`BurnpackInput::metadata`]).
pub fn from_burnpack(
    input: impl AsRef<Path>,
    out: impl AsRef<Path>,
    options: &mut ConvertOptions,
) -> Result<(Manifest, ConvertSummary), ConvertError> {
    let input = BurnpackInput::open(input)?;
    let mut metadata = input.metadata().clone();
    metadata.insert("convert.source".into(), "burnpack".into());
    convert_into(out.as_ref(), input.tensors(), metadata, options)
}
