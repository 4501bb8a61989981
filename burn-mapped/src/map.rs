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
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};

use crate::error::StoreError;
use crate::manifest::TensorEntry;

/// One tensor file, mapped `PROT_READ` + `MAP_SHARED`, with its shared lock held.
pub struct MappedFile {
    // Declared before `map` so the range is unregistered before it is unmapped.
    _fault: crate::fault::Registration,
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
        let path = dir.join(entry.file());
        let opened = crate::untrusted::open_regular(&path, crate::untrusted::Links::Refuse);
        let (file, path) = check_opened(opened, path, entry)?;
        Self::map_checked(file, path, entry)
    }

    /// Maps a file [`check_opened`] has checked for `entry`.
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
            // and the shared lock taken in `check_opened`.
            let map = unsafe { MmapOptions::new().len(padded).map(&file) }.map_err(|source| {
                StoreError::Io {
                    tensor: entry.name().to_string(),
                    file: path.clone(),
                    source,
                }
            })?;
            advise_huge(&map);
            Some(map)
        };
        Ok(Self {
            _fault: crate::fault::register(mapped_range(map.as_ref()), &path),
            map,
            len: entry.len() as usize,
            path,
            name: Arc::from(entry.name()),
            _file: file,
        })
    }

    /// A whole input file (a checkpoint being converted or read in place), opened from
    /// `path` as `file`: locked shared as store files are (a cooperating rewriter is refused
    /// while it is mapped), mapped read-only and shared with `advice` for read-ahead, and
    /// registered with the fault handler as an input, so a truncation ends the process with a
    /// message naming it (and removes a store writer's temporary directory).
    ///
    /// # Errors
    /// A file locked exclusively, larger than the address space, or that cannot be mapped.
    pub(crate) fn whole(file: File, path: &Path, advice: memmap2::Advice) -> std::io::Result<Self> {
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "larger than the address space",
            )
        })?;
        // SAFETY: flock only reads the descriptor, which `file` keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let map = if len == 0 {
            None
        } else {
            // SAFETY: read-only and shared, owned by this value, which hands out borrows only;
            // the file changing underneath is the documented hazard of this type, turned into
            // a clear exit by the registration below.
            let map = unsafe { MmapOptions::new().len(len).map(&file) }?;
            // Best effort: hints for read-ahead and, as for store files, for mapping the
            // file's large page-cache folios huge; failure changes nothing but speed.
            let _ = map.advise(advice);
            advise_huge(&map);
            Some(map)
        };
        let range = mapped_range(map.as_ref());
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(Self {
            _fault: crate::fault::register_as(range, path, crate::fault::Role::Source),
            map,
            len,
            path: path.to_path_buf(),
            name: Arc::from(name),
            _file: file,
        })
    }

    /// [`whole`](Self::whole) for a checkpoint read in place, opened at `path` as the user gave
    /// it (a link is followed) and checked to be a regular file.
    ///
    /// # Errors
    /// [`StoreError::Checkpoint`] naming the file.
    pub(crate) fn checkpoint(path: &Path) -> Result<Self, StoreError> {
        crate::untrusted::open_regular(path, crate::untrusted::Links::Follow)
            .and_then(|file| Self::whole(file, path, memmap2::Advice::Normal))
            .map_err(|source| StoreError::Checkpoint {
                file: path.to_path_buf(),
                source,
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

/// Checks a tensor file opened (or not) at `path` by [`crate::untrusted`]: present, at least
/// as long as its padded length, and not locked exclusively; takes a shared advisory lock.
pub(crate) fn check_opened(
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

/// Hints the kernel to map `map`'s large page-cache folios huge when it spans a huge page or
/// more (see `image`); the kernel places such a mapping on a huge-page boundary itself.
/// Failure changes nothing but speed.
fn advise_huge(map: &Mmap) {
    #[cfg(target_os = "linux")]
    if map.len() as u64 >= crate::layout::huge_page_size() {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

/// The addresses `map` covers (`0..0` without one): what the fault handler is told.
fn mapped_range(map: Option<&Mmap>) -> std::ops::Range<usize> {
    map.map_or(0..0, |m| {
        let start = m.as_ptr() as usize;
        start..start + m.len()
    })
}

/// Owner handed to `bytes::Bytes::from_owner`: keeps the mapping alive while any view of it
/// exists.
pub(crate) struct MapOwner(pub(crate) Arc<MappedFile>);

impl AsRef<[u8]> for MapOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}
