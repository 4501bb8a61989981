//! [`MappedStore`]: an open store whose tensor files are all mapped, ready to adopt.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::TensorData;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::StoreError;
use crate::generation::Generation;
use crate::manifest::{Manifest, TensorEntry};
use crate::map::{MapOwner, MappedFile};
use crate::placement::{Placement, shared_owned_copy};
use crate::readonly::{MappedController, StrictMode};

/// Options for opening a store.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    strict: StrictMode,
    placement: Placement,
    verify: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            strict: StrictMode::from_env(),
            placement: Placement::default(),
            verify: false,
        }
    }
}

impl OpenOptions {
    /// Refuse (rather than copy-on-write) any mutable access to mapped bytes. Defaults to the
    /// `BURN_MAPPED_STRICT` environment variable.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = if strict {
            StrictMode::Strict
        } else {
            StrictMode::CopyOnWrite
        };
        self
    }

    /// What the tensors handed to a module are: the mapped pages (`Map`, and `PerUseCopy`,
    /// whose module stages them before each use) or one owned copy each (`Resident`).
    /// Defaults to `Map`.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Check every tensor's xxh3 (and zero padding) while opening, failing with the first
    /// mismatch. Off by default: it reads every byte of the store once, which is what adoption
    /// otherwise avoids until a kernel needs the bytes (about 0.05 s per GB from the page
    /// cache, storage speed from disk). Opening always checks names, sizes and file types;
    /// [`verify_dir`] checks a store without opening it.
    pub fn verify(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }

    /// Opens the store at `dir`.
    pub fn open(self, dir: impl AsRef<Path>) -> Result<MappedStore, StoreError> {
        MappedStore::open_with(dir.as_ref(), self)
    }
}

/// An open store: a validated manifest and one read-only shared mapping per tensor file.
///
/// Opening checks every file (presence, type, size) before mapping any, and maps without
/// reading: no tensor byte is touched until a kernel reads it.
#[derive(Debug)]
pub struct MappedStore {
    dir: PathBuf,
    manifest: Manifest,
    files: Vec<Arc<MappedFile>>,
    strict: StrictMode,
    placement: Placement,
    // Burn-store wants references into a map it owns; built on first use.
    pack_cache: Option<BTreeMap<String, burn::store::burn_pack::Tensor>>,
}

impl MappedStore {
    /// Opens the store at `dir` with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        OpenOptions::default().open(dir)
    }

    /// Options builder.
    pub fn options() -> OpenOptions {
        OpenOptions::default()
    }

    fn open_with(dir: &Path, options: OpenOptions) -> Result<Self, StoreError> {
        let generation = Generation::open(dir)?;
        let manifest = generation.manifest()?;
        // Check every file before mapping any, so a bad store fails whole and early.
        let checked = generation.open_all(manifest.tensors())?;
        drop(generation);
        let files = manifest
            .tensors()
            .iter()
            .zip(checked)
            .map(|(entry, (file, path))| MappedFile::map_checked(file, path, entry).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        if options.verify {
            for (entry, file) in manifest.tensors().iter().zip(&files) {
                verify_one(entry, file)?;
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
            files,
            strict: options.strict,
            placement: options.placement,
            pack_cache: None,
        })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The validated manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Whether mutable access to mapped bytes is refused.
    pub fn strict(&self) -> StrictMode {
        self.strict
    }

    /// The placement the store was opened with.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    fn index(&self, name: &str) -> Result<usize, StoreError> {
        self.manifest
            .position(name)
            .ok_or_else(|| StoreError::TensorNotFound {
                tensor: name.to_string(),
                dir: self.dir.clone(),
            })
    }

    /// The mapping of one tensor.
    pub fn mapped(&self, name: &str) -> Result<&Arc<MappedFile>, StoreError> {
        Ok(&self.files[self.index(name)?])
    }

    /// Every entry with its mapping, in manifest order.
    pub fn iter(&self) -> impl Iterator<Item = (&TensorEntry, &Arc<MappedFile>)> {
        self.manifest.tensors().iter().zip(&self.files)
    }

    /// Burn [`TensorData`] whose bytes are the file's mapped pages (no copy), or, for a store
    /// opened with [`Placement::Resident`], an owned copy of them.
    ///
    /// A Burn CPU backend that keeps host bytes as storage (Flex) adopts them as they are; a
    /// GPU backend's `from_data` copies them once into device memory (the resident placement).
    pub fn tensor_data(&self, name: &str) -> Result<TensorData, StoreError> {
        let i = self.index(name)?;
        Ok(self.data_at(i))
    }

    /// Rows `rows` of a tensor (its first dimension), as [`tensor_data`](Self::tensor_data)
    /// gives the whole: the mapped pages of just those rows, no copy (an owned copy of them
    /// for a store opened resident). For devices that bind a buffer only up to some size
    /// ([`max_binding`](crate::max_binding)), a large matrix loads as blocks of rows.
    ///
    /// # Errors
    ///
    /// [`StoreError::TensorNotFound`], or [`StoreError::RowsOutOfRange`] when the range is
    /// empty, reversed or past the tensor's rows.
    pub fn tensor_rows(&self, name: &str, rows: Range<usize>) -> Result<TensorData, StoreError> {
        let i = self.index(name)?;
        let entry = &self.manifest.tensors()[i];
        let shape = entry.shape();
        let total = shape.first().copied().unwrap_or(0);
        if rows.start >= rows.end || rows.end > total {
            return Err(StoreError::RowsOutOfRange {
                tensor: name.to_string(),
                dir: self.dir.clone(),
                start: rows.start,
                end: rows.end,
                rows: total,
            });
        }
        // The manifest checked `len` against the shape and dtype, so rows divide it evenly.
        let row_bytes = (entry.len() / total as u64) as usize;
        let bytes = rows.start * row_bytes..rows.end * row_bytes;
        let mut block_shape = shape.to_vec();
        block_shape[0] = rows.len();
        Ok(TensorData::from_bytes(
            self.burn_bytes_range(&self.files[i], bytes),
            block_shape,
            entry.dtype(),
        ))
    }

    fn data_at(&self, i: usize) -> TensorData {
        let entry = &self.manifest.tensors()[i];
        TensorData::from_bytes(
            self.burn_bytes(&self.files[i]),
            entry.shape().to_vec(),
            entry.dtype(),
        )
    }

    pub(crate) fn burn_bytes(&self, file: &Arc<MappedFile>) -> burn::tensor::Bytes {
        self.burn_bytes_range(file, 0..file.bytes().len())
    }

    /// [`burn_bytes`](Self::burn_bytes) of `range` of the file's bytes.
    fn burn_bytes_range(&self, file: &Arc<MappedFile>, range: Range<usize>) -> burn::tensor::Bytes {
        if self.placement.copies_at_load() {
            return shared_owned_copy(&file.bytes()[range]);
        }
        let shared = bytes::Bytes::from_owner(MapOwner(Arc::clone(file))).slice(range);
        MappedController::new(shared, file.name_arc(), self.strict).into_burn_bytes()
    }

    /// Explicit request for write access to a tensor's bytes: always refused.
    ///
    /// Exists so that code holding a store can ask, and get a typed answer, instead of
    /// reaching for the pages through a raw pointer (which would fault: they are `PROT_READ`).
    pub fn bytes_mut(&mut self, name: &str) -> Result<&mut [u8], StoreError> {
        self.index(name)?;
        Err(StoreError::ReadOnly {
            tensor: name.to_string(),
        })
    }

    /// Re-hashes every tensor file; returns every problem found (empty when the store is
    /// intact). Checks the logical bytes against the manifest's xxh3 and that the padding is
    /// zero.
    pub fn verify(&self) -> Vec<StoreError> {
        self.iter()
            .filter_map(|(entry, file)| verify_one(entry, file).err())
            .collect()
    }

    pub(crate) fn pack_tensors(&mut self) -> &BTreeMap<String, burn::store::burn_pack::Tensor> {
        if self.pack_cache.is_none() {
            let map = (0..self.files.len())
                .map(|i| {
                    let entry = &self.manifest.tensors()[i];
                    let tensor = burn::store::burn_pack::Tensor::new(
                        entry.name().to_string(),
                        entry.dtype(),
                        entry.shape().to_vec(),
                        entry.param_id(),
                        self.burn_bytes(&self.files[i]),
                    );
                    (entry.name().to_string(), tensor)
                })
                .collect();
            self.pack_cache = Some(map);
        }
        self.pack_cache.as_ref().expect("filled above")
    }
}

/// Checks the store at `dir` tensor by tensor without opening it as a whole, so that one
/// missing or short file does not hide the others: each file is opened, mapped, hashed and
/// unmapped in turn. `each` is called after every tensor with its outcome.
///
/// Returns every problem found (empty when the store is intact): missing, short or unreadable
/// files, checksum mismatches and dirty padding.
///
/// # Errors
///
/// Only when the manifest itself cannot be read or is invalid.
pub fn verify_dir(
    dir: impl AsRef<Path>,
    mut each: impl FnMut(&TensorEntry, Option<&StoreError>),
) -> Result<Vec<StoreError>, StoreError> {
    let generation = Generation::open(dir.as_ref())?;
    let manifest = generation.manifest()?;
    // Open every file of this generation first, then let writers go on while hashing.
    let opened: Vec<_> = manifest
        .tensors()
        .iter()
        .map(|entry| generation.open_tensor(entry))
        .collect();
    drop(generation);
    let mut problems = Vec::new();
    for (entry, opened) in manifest.tensors().iter().zip(opened) {
        let outcome = opened
            .and_then(|(file, path)| MappedFile::map_checked(file, path, entry))
            .and_then(|file| verify_one(entry, &file));
        each(entry, outcome.as_ref().err());
        problems.extend(outcome.err());
    }
    Ok(problems)
}

/// Hashes one mapped file and checks its padding.
pub(crate) fn verify_one(entry: &TensorEntry, file: &MappedFile) -> Result<(), StoreError> {
    let actual = xxh3_64(file.bytes());
    if actual != entry.xxh3() {
        return Err(StoreError::ChecksumMismatch {
            tensor: entry.name().to_string(),
            file: file.path().to_path_buf(),
            expected: entry.xxh3(),
            actual,
        });
    }
    if file.padded_bytes()[file.bytes().len()..]
        .iter()
        .any(|&b| b != 0)
    {
        return Err(StoreError::DirtyPadding {
            tensor: entry.name().to_string(),
            file: file.path().to_path_buf(),
        });
    }
    Ok(())
}
