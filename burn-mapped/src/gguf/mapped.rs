//! A GGUF file mapped read-only into memory.

use std::io;
use std::path::{Path, PathBuf};

use super::{GgufError, GgufFile, TensorInfo};
use crate::map::MappedFile;

/// A GGUF file mapped read-only, parsed and validated.
///
/// # Hazard
///
/// The mapping shows the file as it is on disk. If another process rewrites the file while
/// it is mapped, reads see changed bytes; if it truncates it, a read past the new end ends the
/// process with a message naming the file (see `fault`). Only map files that are not modified
/// in place, such as the cache files `burn-mapped-tools` publishes by atomic rename.
#[derive(Debug)]
pub struct MappedGguf {
    path: PathBuf,
    map: MappedFile,
    gguf: GgufFile,
}

impl MappedGguf {
    /// Maps `path` read-only and parses it.
    ///
    /// # Errors
    ///
    /// [`GgufError::Io`] when the file cannot be opened or mapped, or
    /// [`GgufError::InFile`] wrapping the parse error.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| GgufError::Io {
                action,
                path,
                source,
            }
        };
        let file = crate::untrusted::open_regular(&path, crate::untrusted::Links::Follow)
            .map_err(io("open", &path))?;
        let len = file.metadata().map_err(io("stat", &path))?.len();
        let in_file = |source| GgufError::InFile {
            path: path.clone(),
            source: Box::new(source),
        };
        if usize::try_from(len).is_err() {
            return Err(io("map", &path)(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("{len} bytes do not fit in the address space"),
            )));
        }
        if len == 0 {
            // Mapping an empty file fails on some platforms; parsing the
            // empty buffer yields the proper "truncated" error instead.
            return Err(in_file(
                GgufFile::parse(&[]).expect_err("an empty buffer is never a valid GGUF file"),
            ));
        }
        // Tensor reads are random (a row at a time, a layer at a time), not sequential.
        let map =
            MappedFile::whole(file, &path, memmap2::Advice::Normal).map_err(io("map", &path))?;
        if map.bytes().len() as u64 != len {
            return Err(io("map", &path)(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "file changed size while mapping: {len} -> {} bytes",
                    map.bytes().len()
                ),
            )));
        }
        let gguf = GgufFile::parse(map.bytes()).map_err(in_file)?;
        Ok(MappedGguf { path, map, gguf })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }

    /// The parsed header without the mapping, for a caller done with the tensor data that
    /// wants to take values out of the metadata ([`GgufFile::take_str_array`]).
    pub fn into_gguf(self) -> GgufFile {
        self.gguf
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// The bytes of `info`, borrowed from the mapping.
    ///
    /// # Errors
    ///
    /// [`GgufError::BufferMismatch`] when `info` comes from another file and
    /// does not fit in this one.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8], GgufError> {
        self.gguf.tensor_bytes(self.map.bytes(), info)
    }
}

impl GgufFile {
    /// Maps `path` read-only and parses it; see [`MappedGguf`] for the
    /// hazard of mapping.
    ///
    /// # Errors
    ///
    /// As [`MappedGguf::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<MappedGguf, GgufError> {
        MappedGguf::open(path)
    }
}
