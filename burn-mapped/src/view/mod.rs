//! Checkpoint files read in place: a GGUF or safetensors file as a [`MappedStore`], with no
//! conversion and no copy.
//!
//! The whole file is mapped once, read-only and shared ([`MappedFile::whole`]), after its
//! header has been parsed and every tensor's range checked to lie inside the file and share no
//! byte with another. Each tensor is then a window onto the mapping at its offset, adopted by
//! Flex as it lies, exactly as a store's tensor file is. A tensor that cannot be adopted where
//! it lies (a safetensors offset that does not suit its dtype's alignment, a GGUF tensor of a
//! type no kernel reads as blocks) is copied once, logged (target `burn_mapped`) and listed by
//! [`MappedStore::copied`]; never silently.
//!
//! The user's file is never written. It is locked shared while mapped, as store files are, and
//! registered with the fault handler: a truncation while mapped ends the process with a
//! message naming it. Tensor bytes are not hashed on open: a checkpoint carries no per-tensor
//! checksums, and reading every byte is the cost that in-place loading removes.

pub(crate) mod gguf;
pub(crate) mod plan;
pub(crate) mod safetensors;

pub use plan::FORMAT_KEY;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::DType;

use crate::error::StoreError;
use crate::manifest::{Manifest, TensorEntry};
use crate::map::MappedFile;
use crate::store::{MappedStore, OpenOptions};

/// A module path for each tensor name of a checkpoint, `None` to leave the tensor out.
pub type Rename<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The entries of a view as they are gathered: each tensor placed in its file, or copied.
#[derive(Default)]
pub(crate) struct ViewBuilder {
    entries: Vec<TensorEntry>,
    files: Vec<Arc<MappedFile>>,
    copies: BTreeMap<usize, bytes::Bytes>,
    metadata: BTreeMap<String, String>,
}

impl ViewBuilder {
    /// Adds a tensor adopted where `entry` places it in `file`, or, when that offset does not
    /// suit `dtype`'s alignment, copied from there into aligned memory.
    pub(crate) fn place(&mut self, entry: TensorEntry, file: &Arc<MappedFile>, dtype: DType) {
        if entry.offset().is_multiple_of(dtype.size() as u64) {
            self.entries.push(entry);
            self.files.push(Arc::clone(file));
            return;
        }
        let start = entry.offset() as usize;
        let copy = file
            .bytes()
            .get(start..start + entry.len() as usize)
            .map(bytes::Bytes::copy_from_slice);
        match copy {
            Some(copy) => self.copy(entry, file, copy),
            // Past the end: kept as placed, for `finish` to refuse by name.
            None => {
                self.entries.push(entry);
                self.files.push(Arc::clone(file));
            }
        }
    }

    /// Adds a tensor of `file` held by `bytes`, a copy made at open.
    pub(crate) fn copy(&mut self, entry: TensorEntry, file: &Arc<MappedFile>, bytes: bytes::Bytes) {
        self.copies.insert(self.entries.len(), bytes);
        self.entries.push(entry);
        self.files.push(Arc::clone(file));
    }

    /// Records a metadata string.
    pub(crate) fn metadata(&mut self, key: String, value: String) {
        self.metadata.insert(key, value);
    }

    /// The store, once every placed tensor is checked to lie inside its file and to share no
    /// byte with another ([`plan::check_ranges`]).
    pub(crate) fn finish(
        self,
        path: &Path,
        options: OpenOptions,
    ) -> Result<MappedStore, StoreError> {
        // A file is told by its mapping's address.
        let key = |i: usize| Arc::as_ptr(&self.files[i]) as usize;
        let by_key: std::collections::HashMap<usize, &MappedFile> = (0..self.files.len())
            .map(|i| (key(i), &*self.files[i]))
            .collect();
        plan::check_ranges(
            self.entries
                .iter()
                .enumerate()
                .filter(|(i, _)| !self.copies.contains_key(i))
                .map(|(i, e)| (key(i), e.offset(), e.len(), e.name())),
            |k| by_key[&k].bytes().len() as u64,
            |k| by_key[&k].path().to_path_buf(),
        )?;
        let manifest = Manifest::view(self.entries, self.metadata)?;
        Ok(MappedStore::from_view(
            path,
            manifest,
            self.files,
            self.copies,
            options,
        ))
    }
}

/// Opening a checkpoint in place, beside [`OpenOptions::open`] for a store.
impl OpenOptions {
    /// Opens the GGUF file at `path` in place (see [`MappedStore::open_gguf`]), naming each
    /// tensor `rename(gguf_name)` and leaving out those it maps to `None`.
    ///
    /// # Errors
    /// As [`MappedStore::open_gguf`].
    pub fn open_gguf(
        self,
        path: impl AsRef<Path>,
        rename: &dyn Fn(&str) -> Option<String>,
    ) -> Result<MappedStore, StoreError> {
        Ok(self.open_gguf_with_header(path, rename)?.0)
    }

    /// [`open_gguf`](Self::open_gguf), also returning the parsed header: its vocabulary and
    /// chat template, for a caller that builds a tokenizer without parsing the file again.
    ///
    /// # Errors
    /// As [`MappedStore::open_gguf`].
    pub fn open_gguf_with_header(
        self,
        path: impl AsRef<Path>,
        rename: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(MappedStore, crate::gguf::GgufFile), StoreError> {
        gguf::open(path.as_ref(), self, rename)
    }

    /// Opens a safetensors checkpoint in place (see [`MappedStore::open_safetensors`]), naming
    /// each tensor `rename(name)` and leaving out those it maps to `None`.
    ///
    /// # Errors
    /// As [`MappedStore::open_safetensors`].
    pub fn open_safetensors(
        self,
        path: impl AsRef<Path>,
        rename: &dyn Fn(&str) -> Option<String>,
    ) -> Result<MappedStore, StoreError> {
        safetensors::open(path.as_ref(), self, rename)
    }
}
