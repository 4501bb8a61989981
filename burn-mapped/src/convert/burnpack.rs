//! Burn's burnpack (`.bpk`) input, read with Burn's own [`Reader`] over a read-only mapping, so
//! every tensor is a window into the file and parameter ids are kept.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::store::burn_pack::Reader;
use burn::tensor::{AllocationProperty, Bytes, DType};
use memmap2::{Advice, Mmap};

use super::{
    ConvertError, ConvertOptions, ConvertSummary, SourceDType, SourceTensor, convert_into,
};
use crate::manifest::Manifest;

struct PackTensor {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    param_id: Option<u64>,
    bytes: Bytes,
}

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
struct MapOwner(Mmap);

impl AsRef<[u8]> for MapOwner {
    fn as_ref(&self) -> &[u8] {
        &self.0
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
        let file = File::open(path).map_err(io)?;
        // SAFETY: a read-only shared mapping; the hazard of the file changing underneath is
        // documented on the convert module. Burn's reader bounds-checks every tensor range
        // against the mapping's length before windowing into it.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        // Best effort: a hint for the kernel's read-ahead; failure changes nothing but speed.
        let _ = map.advise(Advice::Sequential);
        let base = map.as_ptr() as usize;
        let shared = bytes::Bytes::from_owner(MapOwner(map));
        let bytes = Bytes::from_shared(shared, AllocationProperty::File);
        let pack_err = |source| ConvertError::Burnpack {
            file: path.to_path_buf(),
            source,
        };
        let reader = Reader::from_bytes(bytes).map_err(pack_err)?;
        let mut metadata: BTreeMap<String, String> = reader
            .metadata()
            .iter()
            .map(|(k, v)| (format!("burnpack.{k}"), v.clone()))
            .collect();
        for (k, v) in reader.scalars() {
            let value = serde_json::to_string(v).expect("scalars always serialize");
            metadata.insert(format!("burnpack.scalar.{k}"), value);
        }
        let mut tensors = reader
            .into_tensors()
            .map_err(pack_err)?
            .into_iter()
            .map(|t| {
                let (name, dtype, shape, param_id, bytes) = t.into_parts().map_err(pack_err)?;
                Ok(PackTensor {
                    name,
                    dtype,
                    shape: shape.to_vec(),
                    param_id,
                    bytes,
                })
            })
            .collect::<Result<Vec<_>, ConvertError>>()?;
        // The reader lists names alphabetically; the file holds them in module order, which
        // is also the order that reads the input front to back. Every window points into the
        // one mapping, so its address is its file offset plus `base`.
        tensors.sort_by_key(|t| (t.bytes.as_ptr() as usize).wrapping_sub(base));
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
            metadata,
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
