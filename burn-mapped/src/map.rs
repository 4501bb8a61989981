//! Read-only shared mappings of tensor files.
//!
//! # Safety hazard
//!
//! A mapping reflects the file: if another process truncates a mapped file, touching the
//! lost pages raises `SIGBUS`; if it writes the file in place, tensors change under the
//! program. This crate never does either (its writer always creates new files and swaps
//! directories atomically, so live mappings keep the old inodes), checks every size before
//! mapping so a short file is an error rather than a fault, and holds a shared advisory lock
//! (`flock(LOCK_SH)`) on each file while it is mapped: a tool that must rewrite a store in
//! place can take `LOCK_EX` and will be refused while any process maps it. Advisory locks bind
//! only cooperating programs; nothing in Linux can stop `truncate(1)` run by the file's owner.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};

use crate::error::StoreError;
use crate::manifest::TensorEntry;

/// One tensor file, mapped `PROT_READ` + `MAP_SHARED`, with its shared lock held.
pub struct MappedFile {
    map: Option<Mmap>,
    len: usize,
    path: PathBuf,
    name: Arc<str>,
    // Keeps the descriptor, and with it the advisory lock, alive while mapped.
    _file: File,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("tensor", &self.name)
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl MappedFile {
    /// Opens, checks and maps the file of `entry` inside `dir`.
    ///
    /// # Errors
    ///
    /// [`StoreError::MissingFile`], [`StoreError::ShortFile`] (checked before mapping, so a
    /// short file never faults), [`StoreError::Io`] for anything else, including a file that
    /// is a symbolic link or not a regular file, or one locked exclusively by a rewriter.
    pub fn open(dir: &Path, entry: &TensorEntry) -> Result<Self, StoreError> {
        let (file, path) = open_checked(dir, entry)?;
        Self::map_checked(file, path, entry)
    }

    /// Maps a file [`open_checked`] has opened and checked for `entry`.
    pub(crate) fn map_checked(
        file: File,
        path: PathBuf,
        entry: &TensorEntry,
    ) -> Result<Self, StoreError> {
        let padded = entry.padded_len() as usize;
        let map = if padded == 0 {
            None
        } else {
            // SAFETY: the mapping is read-only and shared; the type-level hazard (the file
            // changing under the map) is documented above and mitigated by the size check
            // and the shared lock taken in `open_checked`.
            let map = unsafe { MmapOptions::new().len(padded).map(&file) }.map_err(|source| {
                StoreError::Io {
                    tensor: entry.name().to_string(),
                    file: path.clone(),
                    source,
                }
            })?;
            #[cfg(target_os = "linux")]
            if padded as u64 >= crate::layout::huge_page_size() {
                // A hint (see `image`): lets the kernel map the file's large folios huge. The
                // kernel places a mapping this large on a huge-page boundary itself.
                let _ = map.advise(memmap2::Advice::HugePage);
            }
            Some(map)
        };
        Ok(Self {
            map,
            len: entry.len() as usize,
            path,
            name: Arc::from(entry.name()),
            _file: file,
        })
    }

    /// The tensor's logical bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.map {
            Some(map) => &map[..self.len],
            None => &[],
        }
    }

    /// The whole mapping, padding included.
    pub fn padded_bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The tensor's name.
    pub fn tensor(&self) -> &str {
        &self.name
    }

    pub(crate) fn name_arc(&self) -> Arc<str> {
        Arc::clone(&self.name)
    }

    /// Path of the mapped file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Address range of the mapping (padding included), for identity checks.
    pub fn address_range(&self) -> std::ops::Range<usize> {
        let bytes = self.padded_bytes();
        let start = bytes.as_ptr() as usize;
        start..start + bytes.len()
    }
}

/// [`open_checked`] for every entry, in manifest order, so the first bad entry is the error.
/// Each file is opened relative to the directory, opened once: the kernel then looks up one
/// name per file instead of walking the whole path again (opening is most of a load's system
/// time with hundreds of tensors). Spreading the opens over a thread pool was measured slower
/// on a 2-core machine; the calls contend in the kernel.
pub(crate) fn open_all(
    dir: &Path,
    entries: &[TensorEntry],
) -> Result<Vec<(File, PathBuf)>, StoreError> {
    #[cfg(target_os = "linux")]
    const DIR_FLAGS: libc::c_int = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    const DIR_FLAGS: libc::c_int = libc::O_DIRECTORY | libc::O_CLOEXEC;
    let Ok(dir_file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(DIR_FLAGS)
        .open(dir)
    else {
        // Let the per-file path report what is wrong, naming the tensor.
        return entries.iter().map(|e| open_checked(dir, e)).collect();
    };
    entries
        .iter()
        .map(|entry| {
            let path = dir.join(entry.file());
            check_opened(open_at(&dir_file, entry.file()), path, entry)
        })
        .collect()
}

/// `openat(dir, name)`, read-only, not following a final symbolic link.
fn open_at(dir: &File, name: &str) -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    let name = std::ffi::CString::new(name).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "file name contains NUL")
    })?;
    // SAFETY: `dir` is an open descriptor for the call's duration and `name` is NUL-terminated.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `openat` and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens a tensor file without following links, checks it is a regular file at least as long
/// as its padded length, and takes a shared advisory lock on it.
pub(crate) fn open_checked(dir: &Path, entry: &TensorEntry) -> Result<(File, PathBuf), StoreError> {
    let path = dir.join(entry.file());
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path);
    check_opened(opened, path, entry)
}

/// The checks of [`open_checked`] on a file already opened (or not) at `path`.
fn check_opened(
    opened: std::io::Result<File>,
    path: PathBuf,
    entry: &TensorEntry,
) -> Result<(File, PathBuf), StoreError> {
    let io = |source| StoreError::Io {
        tensor: entry.name().to_string(),
        file: path.clone(),
        source,
    };
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::MissingFile {
                tensor: entry.name().to_string(),
                file: path,
            });
        }
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    if meta.len() < entry.padded_len() {
        return Err(StoreError::ShortFile {
            tensor: entry.name().to_string(),
            file: path,
            actual: meta.len(),
            expected: entry.padded_len(),
        });
    }
    // SAFETY: flock only reads the descriptor, which `file` keeps open.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    Ok((file, path))
}

/// Owner handed to `bytes::Bytes::from_owner`: keeps the mapping alive while any view of it
/// exists.
pub(crate) struct MapOwner(pub(crate) Arc<MappedFile>);

impl AsRef<[u8]> for MapOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}
