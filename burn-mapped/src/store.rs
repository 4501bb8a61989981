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
use crate::readahead::ReadAhead;
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

/// An open store: a validated manifest and one read-only shared mapping per tensor file; or
/// a checkpoint file read in place ([`MappedStore::open_gguf`], [`MappedStore::open_safetensors`]),
/// one mapping of the whole file whose tensors are windows at their offsets.
///
/// Opening checks every file (presence, type, size) before mapping any, and maps without
/// reading: no tensor byte is touched until a kernel reads it.
#[derive(Debug)]
pub struct MappedStore {
    /// The store directory, or the checkpoint file of a view.
    dir: PathBuf,
    manifest: Manifest,
    /// The mapping holding each entry (for a view, the same one for many entries).
    files: Vec<Arc<MappedFile>>,
    /// Owned copies of the entries a view could not adopt where they lie (see
    /// [`copied`](Self::copied)), by entry index.
    copies: BTreeMap<usize, bytes::Bytes>,
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

    /// Opens the GGUF file at `path` in place, with default options and GGUF's own tensor
    /// names: one read-only shared mapping of the file, every tensor a window onto it at its
    /// offset (see [`crate::view`]). `F32`/`F16`/`BF16` tensors keep their dtype; 2-D tensors
    /// of a block type the block kernels read keep their blocks as `u8` `[rows, row_bytes]`
    /// with a [`BlockLayout`](crate::gguf::BlockLayout) (see [`crate::blocks`]); other block tensors
    /// are dequantized to `f32` once and listed by [`copied`](Self::copied). The metadata's
    /// scalars are `gguf.<key>` strings in [`manifest`](Self::manifest)`.metadata()`.
    ///
    /// # Errors
    /// [`StoreError::Checkpoint`] (cannot open, lock or map), [`StoreError::Gguf`] (not valid
    /// GGUF: every offset and length is checked before a tensor is made),
    /// [`StoreError::GgufType`] (a type nothing here reads), [`StoreError::BadView`].
    pub fn open_gguf(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        OpenOptions::default().open_gguf(path, &|name| Some(name.to_string()))
    }

    /// Opens a safetensors checkpoint in place (one `.safetensors` file, a
    /// `*.safetensors.index.json`, or a directory of shards), with default options and its own
    /// tensor names: each file mapped once, read-only and shared, every tensor adopted at its
    /// offset, or, where the offset does not suit its dtype's alignment, copied once, logged
    /// and listed by [`copied`](Self::copied). A Burn module then loads from it with
    /// `module.load_from(&mut store)`, its parameters the file's pages.
    ///
    /// # Errors
    /// [`StoreError::Checkpoint`] (cannot open or map, or not valid safetensors: the reader's
    /// error is inside), [`StoreError::UnsupportedDType`], [`StoreError::BadView`].
    pub fn open_safetensors(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        OpenOptions::default().open_safetensors(path, &|name| Some(name.to_string()))
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
            copies: BTreeMap::new(),
            strict: options.strict,
            placement: options.placement,
            pack_cache: None,
        })
    }

    /// A view: `manifest` (made by [`Manifest::view`]) places each tensor in its file of
    /// `files`; the entries in `copies` (by index) were copied once, as `copies` holds them,
    /// instead of adopted.
    pub(crate) fn from_view(
        path: &Path,
        manifest: Manifest,
        files: Vec<Arc<MappedFile>>,
        copies: BTreeMap<usize, bytes::Bytes>,
        options: OpenOptions,
    ) -> Self {
        for (&i, bytes) in &copies {
            let entry = &manifest.tensors()[i];
            log::info!(
                target: "burn_mapped",
                "{}: tensor `{}` copied once ({} bytes): {}",
                path.display(),
                entry.name(),
                bytes.len(),
                "its bytes cannot be adopted where they lie"
            );
        }
        Self {
            dir: path.to_path_buf(),
            files,
            manifest,
            copies,
            strict: options.strict,
            placement: options.placement,
            pack_cache: None,
        }
    }

    /// The store directory, or the checkpoint file of a view.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tensors a view copied instead of adopting, with their byte counts: a safetensors
    /// tensor whose offset does not suit its dtype's alignment, a GGUF tensor of a type the
    /// block kernels do not read. Empty for a store.
    pub fn copied(&self) -> Vec<(&str, u64)> {
        self.copies
            .iter()
            .map(|(&i, b)| (self.manifest.tensors()[i].name(), b.len() as u64))
            .collect()
    }

    /// Tells the kernel that tensor `name` is read a few rows at a time, in no order (a token
    /// embedding): no read-ahead and no huge pages over its pages, so a lookup brings in its
    /// rows' pages alone. A hint: refused or unsupported, it changes nothing but memory use.
    /// Only the pages wholly inside the tensor are advised (its neighbours in a checkpoint
    /// keep theirs).
    ///
    /// # Errors
    /// [`StoreError::TensorNotFound`].
    pub fn advise_lookups(&self, name: &str) -> Result<(), StoreError> {
        let i = self.index(name)?;
        if self.copies.contains_key(&i) {
            return Ok(());
        }
        let bytes = self.bytes_at(i);
        let page = crate::layout::page_size();
        let start = (bytes.as_ptr() as usize).next_multiple_of(page);
        let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
        if start < end {
            for advice in [libc::MADV_RANDOM, libc::MADV_NOHUGEPAGE] {
                // SAFETY: [start, end) is whole pages inside a live mapping this store owns;
                // madvise with these advices changes no contents.
                unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
            }
        }
        Ok(())
    }

    /// Starts reading every tensor's pages from storage on background threads, in the
    /// order they lie in their files, except those of `skip` (tensors read a few rows at a
    /// time, such as a token embedding): a process starting on a cold page cache then finds
    /// its weights read ahead instead of faulting them in as each is first touched. A hint:
    /// it returns at once, and asks for nothing where the bytes exceed the memory the kernel
    /// reports available (reading them would push out the first ones before their use).
    /// Returns the bytes asked for.
    pub fn read_ahead(&self, skip: &[&str]) -> u64 {
        // (rank of the tensor's file among the files, the file, the tensor's bytes in it).
        let mut order: Vec<(usize, Arc<MappedFile>, Range<usize>)> = Vec::new();
        let mut first_of_file: Vec<*const MappedFile> = Vec::new();
        for (i, entry) in self.manifest.tensors().iter().enumerate() {
            if self.copies.contains_key(&i) || skip.contains(&entry.name()) || entry.is_empty() {
                continue;
            }
            let file = &self.files[i];
            let key = Arc::as_ptr(file);
            let rank = first_of_file
                .iter()
                .position(|&p| p == key)
                .unwrap_or_else(|| {
                    first_of_file.push(key);
                    first_of_file.len() - 1
                });
            order.push((rank, Arc::clone(file), self.range(i)));
        }
        order.sort_by_key(|(rank, _, range)| (*rank, range.start));
        let ahead = ReadAhead::new(order.into_iter().map(|(_, f, r)| (f, r)).collect());
        let bytes = ahead.bytes();
        match crate::host::memstat::available_memory() {
            Ok(available) if bytes <= available => {
                ahead.start();
                bytes
            }
            Ok(available) => {
                log::debug!("no read-ahead: {bytes} bytes of weights, {available} available");
                0
            }
            Err(e) => {
                log::debug!("no read-ahead: {e}");
                0
            }
        }
    }

    /// The bytes of tensor `name` as stored (the file's mapped pages, or a view's copy).
    ///
    /// # Errors
    /// [`StoreError::TensorNotFound`].
    pub fn bytes(&self, name: &str) -> Result<&[u8], StoreError> {
        Ok(self.bytes_at(self.index(name)?))
    }

    fn bytes_at(&self, i: usize) -> &[u8] {
        match self.copies.get(&i) {
            Some(copy) => copy,
            None => &self.files[i].bytes()[self.range(i)],
        }
    }

    /// Where entry `i`'s bytes lie in its mapping.
    fn range(&self, i: usize) -> Range<usize> {
        let entry = &self.manifest.tensors()[i];
        // Checked against the mapping's length when the view or store was opened.
        let start = entry.offset() as usize;
        start..start + entry.len() as usize
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

    /// The mapping holding one tensor: its own file in a store, the whole checkpoint in a view
    /// (the tensor's bytes are then at its entry's [`offset`](TensorEntry::offset); see
    /// [`bytes`](Self::bytes)).
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
    /// ([`max_binding`](crate::placement::max_binding)), a large matrix loads as blocks of rows.
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
            self.burn_bytes(i, bytes),
            block_shape,
            entry.dtype(),
        ))
    }

    fn data_at(&self, i: usize) -> TensorData {
        let entry = &self.manifest.tensors()[i];
        TensorData::from_bytes(
            self.burn_bytes(i, 0..entry.len() as usize),
            entry.shape().to_vec(),
            entry.dtype(),
        )
    }

    /// Burn bytes of `within` (a range of entry `i`'s bytes): a window onto the mapped pages
    /// (or a view's copy) behind the read-only controller, or an owned copy for a store opened
    /// resident.
    fn burn_bytes(&self, i: usize, within: Range<usize>) -> burn::tensor::Bytes {
        if self.placement.copies_at_load() {
            return shared_owned_copy(&self.bytes_at(i)[within]);
        }
        let file = &self.files[i];
        let shared = match self.copies.get(&i) {
            Some(copy) => copy.slice(within),
            None => {
                let start = self.range(i).start;
                bytes::Bytes::from_owner(MapOwner(Arc::clone(file)))
                    .slice(start + within.start..start + within.end)
            }
        };
        let name = Arc::from(self.manifest.tensors()[i].name());
        MappedController::new(shared, name, self.strict).into_burn_bytes()
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
    /// zero. A view has no checksums to check: it returns nothing (hash the checkpoint file
    /// itself to check it).
    pub fn verify(&self) -> Vec<StoreError> {
        self.iter()
            .filter(|(entry, _)| entry.xxh3().is_some())
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
                        self.burn_bytes(i, 0..entry.len() as usize),
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
    generation.make_room(manifest.tensors().len())?;
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

/// Hashes one mapped store file and checks its padding.
pub(crate) fn verify_one(entry: &TensorEntry, file: &MappedFile) -> Result<(), StoreError> {
    let actual = xxh3_64(file.bytes());
    let expected = entry.xxh3().unwrap_or_default();
    if actual != expected {
        return Err(StoreError::ChecksumMismatch {
            tensor: entry.name().to_string(),
            file: file.path().to_path_buf(),
            expected,
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
