//! `manifest.json`: the store's table of contents, parsed once into a type that can only exist
//! valid. Everything a mapping relies on (names, files, lengths, dtypes) is checked here, before
//! any tensor file is opened.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn_std::DType;
use serde::{Deserialize, Serialize};

pub use crate::dtype::{dtype_name, parse_dtype};
use crate::error::{ExpectedLen, StoreError};
use crate::gguf::format::{BlockLayout, GgmlType};
pub use crate::layout::{ALIGNMENT, padded_len};

/// The manifest's file name inside a store directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The format tag written in every manifest.
pub const FORMAT: &str = "burn-mapped";
/// The store format version this build reads and writes. Version 2 added the manifest's
/// `digest`; version 1 stores are refused (convert them again).
pub const FORMAT_VERSION: u32 = 2;
/// Largest manifest accepted (a manifest is a few hundred bytes per tensor).
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// Most tensors one store may hold.
pub const MAX_TENSORS: usize = 1 << 20;
/// Longest tensor name, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// Longest file name, in bytes (the common file-system limit).
pub const MAX_FILE_NAME_BYTES: usize = 255;
/// Highest tensor rank.
pub const MAX_RANK: usize = 8;
/// Largest store, padded files summed: 2^46 bytes (64 TiB), below the 47-bit user address
/// space of x86-64 and AArch64 Linux, so a whole store can be reserved as one range and no sum
/// over its sizes (or the image's huge-page-aligned slots) can wrap.
pub const MAX_STORE_BYTES: u64 = 1 << 46;

/// The quantization scheme of the packed int8 format: int8 `[out, in]` values with one f16
/// scale per output row.
pub const Q8_ROW_F16: &str = "q8-row-f16";

/// How one stored tensor is held, and so which product reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorFormat {
    /// Plain elements of the entry's dtype.
    Float,
    /// A q8 matrix: int8 values linked to an f16 scale per row.
    Q8,
    /// GGUF blocks, as the checkpoint holds them.
    Blocks(BlockLayout),
}

/// Links a quantized weight to the tensor holding its scales.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantLink {
    /// The scheme; only [`Q8_ROW_F16`] exists today.
    pub scheme: String,
    /// Name of the scale tensor.
    pub scale: String,
    /// Quantization error `||W - dequant||_F / ||W||_F` against the source values, when the
    /// converter knew them. Optional, so manifests written without it still read. An f32:
    /// seven digits are plenty for an error, and unlike an f64 it survives a JSON round trip
    /// bit for bit with serde_json's default float parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rel_error: Option<f32>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBlocks {
    #[serde(rename = "type")]
    ty: String,
    cols: u64,
}

impl From<BlockLayout> for RawBlocks {
    fn from(layout: BlockLayout) -> Self {
        RawBlocks {
            ty: layout.ty().name().to_string(),
            cols: layout.cols() as u64,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    format: String,
    version: u32,
    alignment: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
    tensors: Vec<RawEntry>,
    /// `xxh3:<16 hex digits>` over the metadata and entries ([`Manifest::digest`]). Read
    /// with a default so that a manifest without one is refused by its version first.
    #[serde(default)]
    digest: String,
}

/// What the manifest's digest covers, serialized compactly in this order.
#[derive(Serialize)]
struct Digested<'a> {
    metadata: &'a BTreeMap<String, String>,
    tensors: &'a [RawEntry],
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    file: String,
    len: u64,
    xxh3: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    param_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quant: Option<QuantLink>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    blocks: Option<RawBlocks>,
}

/// One validated tensor entry: of a store (its own file, from offset 0, with a checksum) or
/// of a view of a checkpoint file (at an offset in a file shared with other tensors, with no
/// checksum of its own; see [`Manifest::is_view`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    file: String,
    offset: u64,
    len: u64,
    padded_len: u64,
    xxh3: Option<u64>,
    param_id: Option<u64>,
    quant: Option<QuantLink>,
    blocks: Option<BlockLayout>,
}

/// What an entry may say about a tensor besides its bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Annotations {
    pub param_id: Option<u64>,
    pub quant: Option<QuantLink>,
    pub blocks: Option<BlockLayout>,
}

impl TensorEntry {
    /// Builds an entry, applying the same checks as the manifest parser.
    pub(crate) fn new(
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        file: String,
        xxh3: u64,
        annotations: Annotations,
    ) -> Result<Self, StoreError> {
        let Annotations {
            param_id,
            quant,
            blocks,
        } = annotations;
        let dtype_str = dtype_name(dtype).ok_or_else(|| StoreError::UnsupportedDType {
            tensor: name.clone(),
            dtype: format!("{dtype:?}"),
        })?;
        let len = match shape_bytes(&shape.iter().map(|&d| d as u64).collect::<Vec<_>>(), dtype) {
            ExpectedLen::Bytes(n) => n,
            ExpectedLen::Overflow => {
                return Err(StoreError::LengthMismatch {
                    tensor: name,
                    file,
                    len: 0,
                    shape: shape.iter().map(|&d| d as u64).collect(),
                    dtype: dtype_str.to_string(),
                    expected: ExpectedLen::Overflow,
                });
            }
        };
        let raw = RawEntry {
            name,
            dtype: dtype_str.to_string(),
            shape: shape.iter().map(|&d| d as u64).collect(),
            file,
            len,
            xxh3: format!("{xxh3:016x}"),
            param_id,
            quant,
            blocks: blocks.map(RawBlocks::from),
        };
        validate_entry(raw)
    }

    /// An entry of a view: `name` of `dtype` and `shape` at `offset` in the checkpoint file
    /// `file`, optionally holding GGUF blocks. Name, rank, length and block layout are checked
    /// as for a store entry.
    pub(crate) fn in_file(
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        file: String,
        offset: u64,
        blocks: Option<BlockLayout>,
    ) -> Result<Self, StoreError> {
        let mut entry = Self::new(
            name,
            dtype,
            shape,
            file,
            0,
            Annotations {
                blocks,
                ..Annotations::default()
            },
        )?;
        entry.offset = offset;
        entry.padded_len = entry.len;
        entry.xxh3 = None;
        Ok(entry)
    }

    /// Module path of the tensor (`layers.0.attn.q_proj.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape, row-major.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// File name relative to the store directory.
    pub fn file(&self) -> &str {
        &self.file
    }
    /// Logical byte length (shape x element size).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the tensor holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// On-disk length: `len` rounded up to [`ALIGNMENT`] in a store; `len` in a view.
    pub fn padded_len(&self) -> u64 {
        self.padded_len
    }
    /// Where the tensor's bytes start in its file: 0 in a store, the tensor's offset in a
    /// view.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// xxh3-64 of the logical bytes; `None` in a view (a checkpoint records no per-tensor
    /// checksum).
    pub fn xxh3(&self) -> Option<u64> {
        self.xxh3
    }
    /// Burn parameter id recorded with the tensor, if any.
    pub fn param_id(&self) -> Option<u64> {
        self.param_id
    }
    /// Quantization link, if this is a quantized weight.
    pub fn quant(&self) -> Option<&QuantLink> {
        self.quant.as_ref()
    }

    /// Block layout, if this tensor holds quantized GGUF blocks.
    pub fn blocks(&self) -> Option<BlockLayout> {
        self.blocks
    }

    /// What the tensor holds, and so which product reads it: blocks when it records a block
    /// layout, q8 when it links a `q8-row-f16` scale, plain elements otherwise.
    pub fn format(&self) -> TensorFormat {
        if let Some(layout) = self.blocks {
            TensorFormat::Blocks(layout)
        } else if self
            .quant
            .as_ref()
            .is_some_and(|link| link.scheme == Q8_ROW_F16)
        {
            TensorFormat::Q8
        } else {
            TensorFormat::Float
        }
    }
    /// Manifest spelling of the dtype.
    pub fn dtype_name(&self) -> &'static str {
        dtype_name(self.dtype).expect("validated at construction")
    }
}

/// A parsed and validated manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    metadata: BTreeMap<String, String>,
    tensors: Vec<TensorEntry>,
    index: HashMap<String, usize>,
    padded_total: u64,
    view: bool,
}

impl Manifest {
    /// Parses and validates manifest bytes; `path` is only used in error messages.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self, StoreError> {
        let too_many = |what, found: usize, max: usize| StoreError::LimitExceeded {
            path: path.to_path_buf(),
            what,
            found: found as u64,
            max: max as u64,
        };
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(StoreError::ManifestTooLarge {
                path: path.to_path_buf(),
                len: bytes.len() as u64,
                max: MAX_MANIFEST_BYTES,
            });
        }
        let raw: RawManifest =
            serde_json::from_slice(bytes).map_err(|source| StoreError::ManifestSyntax {
                path: path.to_path_buf(),
                source,
            })?;
        if raw.format != FORMAT || raw.version != FORMAT_VERSION {
            return Err(StoreError::UnsupportedVersion {
                path: path.to_path_buf(),
                format: raw.format,
                version: raw.version,
                supported: FORMAT_VERSION,
            });
        }
        if raw.alignment != ALIGNMENT {
            return Err(StoreError::UnsupportedAlignment {
                path: path.to_path_buf(),
                found: raw.alignment,
                expected: ALIGNMENT,
            });
        }
        if raw.tensors.len() > MAX_TENSORS {
            return Err(too_many("tensor count", raw.tensors.len(), MAX_TENSORS));
        }
        let tensors = raw
            .tensors
            .into_iter()
            .map(validate_entry)
            .collect::<Result<Vec<_>, _>>()?;
        let manifest = Self::from_entries(tensors, raw.metadata)?;
        // Last, so an entry that is wrong in itself is reported as such.
        let computed = manifest.digest();
        if raw.digest != computed {
            return Err(StoreError::ManifestDigest {
                path: path.to_path_buf(),
                recorded: raw.digest.escape_debug().to_string(),
                computed,
            });
        }
        Ok(manifest)
    }

    /// `xxh3:<16 hex digits>` of the metadata and the entries, in order: binds each tensor's
    /// name to its file, shape and checksum, so entries edited or exchanged after writing are
    /// refused when the store is opened. (A check against accidents and naive edits, not a
    /// signature: whoever rewrites the manifest can recompute it.)
    pub fn digest(&self) -> String {
        let entries = self.raw_entries();
        let bytes = serde_json::to_vec(&Digested {
            metadata: &self.metadata,
            tensors: &entries,
        })
        .expect("manifest types always serialize");
        format!("xxh3:{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
    }

    fn raw_entries(&self) -> Vec<RawEntry> {
        self.tensors
            .iter()
            .map(|t| RawEntry {
                name: t.name.clone(),
                dtype: t.dtype_name().to_string(),
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                file: t.file.clone(),
                len: t.len,
                xxh3: t.xxh3.map_or_else(String::new, |h| format!("{h:016x}")),
                param_id: t.param_id,
                quant: t.quant.clone(),
                blocks: t.blocks.map(RawBlocks::from),
            })
            .collect()
    }

    /// Assembles a manifest from entries, checking uniqueness and quantization links.
    pub(crate) fn from_entries(
        tensors: Vec<TensorEntry>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Self, StoreError> {
        Self::assemble(tensors, metadata, false)
    }

    /// The table of a checkpoint file read in place: entries made by [`TensorEntry::in_file`],
    /// which share their file (the view checks their ranges against it).
    pub(crate) fn view(
        tensors: Vec<TensorEntry>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Self, StoreError> {
        Self::assemble(tensors, metadata, true)
    }

    fn assemble(
        tensors: Vec<TensorEntry>,
        metadata: BTreeMap<String, String>,
        view: bool,
    ) -> Result<Self, StoreError> {
        let mut index = HashMap::with_capacity(tensors.len());
        let mut files: HashMap<&str, &str> = HashMap::with_capacity(tensors.len());
        let mut padded_total = 0u64;
        for (i, entry) in tensors.iter().enumerate() {
            // Every sum over entries (totals, image slots) stays below this, so none can wrap.
            padded_total = padded_total
                .checked_add(entry.padded_len)
                .filter(|&t| t <= MAX_STORE_BYTES)
                .ok_or_else(|| StoreError::StoreTooLarge {
                    tensor: entry.name.clone(),
                    max: MAX_STORE_BYTES,
                })?;
            if index.insert(entry.name.clone(), i).is_some() {
                return Err(StoreError::DuplicateName {
                    tensor: entry.name.clone(),
                });
            }
            if let Some(other) = files.insert(&entry.file, &entry.name)
                && !view
            {
                return Err(StoreError::DuplicateFile {
                    tensor: entry.name.clone(),
                    other: other.to_string(),
                    file: entry.file.clone(),
                });
            }
        }
        let manifest = Self {
            metadata,
            tensors,
            index,
            padded_total,
            view,
        };
        for entry in &manifest.tensors {
            if let Some(link) = &entry.quant {
                manifest.check_quant_link(entry, link)?;
            }
        }
        Ok(manifest)
    }

    fn check_quant_link(&self, entry: &TensorEntry, link: &QuantLink) -> Result<(), StoreError> {
        let bad = |reason| StoreError::BadQuantLink {
            tensor: entry.name.clone(),
            scale: link.scale.clone(),
            reason,
        };
        if link.scheme != Q8_ROW_F16 {
            return Err(bad("unknown quantization scheme"));
        }
        if link.rel_error.is_some_and(|e| !(e.is_finite() && e >= 0.0)) {
            return Err(bad("relative error must be finite and not negative"));
        }
        if entry.dtype != DType::I8 || entry.shape.len() != 2 {
            return Err(bad("a q8 weight must be a 2-D i8 tensor"));
        }
        let scale = self.get(&link.scale).ok_or_else(|| bad("no such tensor"))?;
        if scale.name == entry.name {
            return Err(bad("a tensor cannot be its own scale"));
        }
        if scale.dtype != DType::F16 || scale.shape != [entry.shape[0]] {
            return Err(bad("scales must be f16 with one value per output row"));
        }
        Ok(())
    }

    /// Whether this is the table of a checkpoint file read in place (GGUF, safetensors)
    /// rather than of a store: its entries share their file, at offsets, without checksums.
    pub fn is_view(&self) -> bool {
        self.view
    }

    /// All entries, in manifest order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.position(name).map(|i| &self.tensors[i])
    }

    /// Index of the entry named `name` in [`tensors`](Self::tensors).
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Free-form string metadata (model configuration, provenance).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Sum of logical tensor bytes.
    pub fn total_bytes(&self) -> u64 {
        // Each len is at most its padded len, whose sum was checked at construction.
        self.tensors.iter().map(|t| t.len).sum()
    }

    /// Sum of on-disk (padded) tensor bytes, at most [`MAX_STORE_BYTES`].
    pub fn padded_bytes(&self) -> u64 {
        self.padded_total
    }

    /// Serializes to pretty JSON.
    pub fn to_json(&self) -> String {
        let raw = RawManifest {
            format: FORMAT.to_string(),
            version: FORMAT_VERSION,
            alignment: ALIGNMENT,
            metadata: self.metadata.clone(),
            tensors: self.raw_entries(),
            digest: self.digest(),
        };
        serde_json::to_string_pretty(&raw).expect("manifest types always serialize")
    }

    /// Full path of an entry's file inside `dir`.
    pub fn file_path(dir: &Path, entry: &TensorEntry) -> PathBuf {
        dir.join(&entry.file)
    }
}

fn shape_bytes(shape: &[u64], dtype: DType) -> ExpectedLen {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .map_or(ExpectedLen::Overflow, ExpectedLen::Bytes)
}

fn validate_entry(raw: RawEntry) -> Result<TensorEntry, StoreError> {
    validate_name(&raw.name)?;
    validate_file_name(&raw.name, &raw.file)?;
    let dtype = parse_dtype(&raw.dtype).ok_or_else(|| StoreError::UnknownDType {
        tensor: raw.name.clone(),
        file: raw.file.clone(),
        dtype: raw.dtype.clone(),
    })?;
    let mismatch = |expected| StoreError::LengthMismatch {
        tensor: raw.name.clone(),
        file: raw.file.clone(),
        len: raw.len,
        shape: raw.shape.clone(),
        dtype: raw.dtype.clone(),
        expected,
    };
    if raw.shape.len() > MAX_RANK {
        return Err(StoreError::RankTooHigh {
            tensor: raw.name.clone(),
            rank: raw.shape.len(),
            max: MAX_RANK,
        });
    }
    let expected = shape_bytes(&raw.shape, dtype);
    if expected != ExpectedLen::Bytes(raw.len) {
        return Err(mismatch(expected));
    }
    let shape = raw
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| mismatch(ExpectedLen::Overflow))?;
    let padded = padded_len(raw.len)
        .filter(|&p| usize::try_from(p).is_ok())
        .ok_or_else(|| mismatch(ExpectedLen::Overflow))?;
    let xxh3 = parse_hex64(&raw.xxh3).ok_or_else(|| StoreError::BadChecksum {
        tensor: raw.name.clone(),
        file: raw.file.clone(),
        found: raw.xxh3.clone(),
    })?;
    let blocks = raw
        .blocks
        .as_ref()
        .map(|b| validate_blocks(&raw.name, b, dtype, &shape))
        .transpose()?;
    Ok(TensorEntry {
        name: raw.name,
        dtype,
        shape,
        file: raw.file,
        offset: 0,
        len: raw.len,
        padded_len: padded,
        xxh3: Some(xxh3),
        param_id: raw.param_id,
        quant: raw.quant,
        blocks,
    })
}

/// A block tensor is a 2-D `u8` tensor whose rows are exactly the layout's row bytes.
fn validate_blocks(
    tensor: &str,
    raw: &RawBlocks,
    dtype: DType,
    shape: &[usize],
) -> Result<BlockLayout, StoreError> {
    let bad = |reason: &str| StoreError::BadBlocks {
        tensor: tensor.to_string(),
        reason: reason.to_string(),
    };
    let ty = GgmlType::ALL
        .iter()
        .copied()
        .find(|t| t.name() == raw.ty)
        .ok_or_else(|| bad(&format!("unknown block type `{}`", raw.ty.escape_debug())))?;
    let cols = usize::try_from(raw.cols).map_err(|_| bad("too many columns"))?;
    let layout = BlockLayout::new(ty, cols).map_err(bad)?;
    if dtype != DType::U8 || shape.len() != 2 {
        return Err(bad("block tensors are 2-D u8"));
    }
    if shape[1] != layout.row_bytes() {
        return Err(bad(&format!(
            "rows of {} bytes, but {cols} values of {} take {}",
            shape[1],
            ty.name(),
            layout.row_bytes()
        )));
    }
    Ok(layout)
}

fn parse_hex64(s: &str) -> Option<u64> {
    if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

fn validate_name(name: &str) -> Result<(), StoreError> {
    let bad = |reason| StoreError::InvalidName {
        tensor: name.escape_debug().to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(bad("longer than MAX_NAME_BYTES"));
    }
    if name.chars().any(char::is_control) {
        return Err(bad("contains control characters"));
    }
    Ok(())
}

/// A file name must name a regular file directly inside the store directory: no separators,
/// no `.`/`..`, no NUL, and not the manifest itself.
fn validate_file_name(tensor: &str, file: &str) -> Result<(), StoreError> {
    let bad = |reason| StoreError::UnsafeFileName {
        tensor: tensor.to_string(),
        file: file.escape_debug().to_string(),
        reason,
    };
    if file.is_empty() {
        return Err(bad("empty"));
    }
    if file.len() > MAX_FILE_NAME_BYTES {
        return Err(bad("too long"));
    }
    if file == "." || file == ".." {
        return Err(bad("names a directory"));
    }
    if file.contains(['/', '\\', '\0']) {
        return Err(bad("contains a path separator or NUL"));
    }
    if file.chars().any(char::is_control) {
        return Err(bad("contains control characters"));
    }
    if file == MANIFEST_FILE {
        return Err(bad("is the manifest"));
    }
    Ok(())
}

/// The file name the writer gives tensor number `index`: readable, unique, always valid.
pub(crate) fn file_name_for(index: usize, name: &str) -> String {
    let mut stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    stem = stem.trim_matches('.').to_string();
    format!("{index:05}-{stem}.tensor")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_file_names_are_always_valid() {
        for (i, name) in ["a.b", "../../etc/passwd", "/abs", "x\\y", "..", "ü.ß", ""]
            .iter()
            .enumerate()
        {
            let file = file_name_for(i, name);
            validate_file_name(name, &file).unwrap();
        }
    }
}
