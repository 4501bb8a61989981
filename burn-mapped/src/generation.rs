//! One generation of a store: its directory opened once, and the manifest and every tensor
//! file opened relative to that handle, so a load never mixes an old manifest with new files.
//!
//! # Locking protocol
//!
//! A store is replaced by exchanging directories ([`crate::StoreWriter`]); the old directory's
//! files are then unlinked. Readers and the writer agree on an advisory `flock` on the store
//! directory itself:
//!
//! - a reader opens the directory, takes `LOCK_SH`, checks that the handle is still the
//!   directory at the path (else a writer replaced it meanwhile: it starts over), then opens
//!   the manifest and the tensor files, and drops the lock (the open descriptors keep the
//!   files alive, and each file's own `LOCK_SH` marks it mapped);
//! - the writer takes `LOCK_EX` on the directory it replaces before the exchange and keeps it
//!   until the old files are unlinked.
//!
//! What this promises: a reader that follows it sees one generation whole, never a mix and
//! never a file unlinked under it. What it does not: `flock` binds only programs that take
//! it. A program that rewrites or truncates tensor files in place, or renames files by hand,
//! is not stopped (a truncated mapped file ends the process, see [`crate::fault`]); checksums
//! ([`crate::OpenOptions::verify`]) catch changed bytes at load, not later.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::manifest::{MANIFEST_FILE, MAX_MANIFEST_BYTES, Manifest, TensorEntry};
use crate::untrusted::{open_regular_at, read_capped};

/// How long a reader waits for a writer's exclusive lock: a writer holds it only to exchange
/// two directories and unlink the old files.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// How often a reader starts over because the store was replaced while it opened it.
const MAX_REOPENS: usize = 64;
/// Descriptors left free beside a store's tensor files, for the rest of the process (standard
/// streams, a GPU driver's files, the tokenizer's source).
const SPARE_FILES: u64 = 256;

/// An open store directory, locked shared until dropped.
pub(crate) struct Generation {
    dir: File,
    path: PathBuf,
}

impl Generation {
    /// Opens the store directory at `path` and locks it shared (see the module docs).
    pub(crate) fn open(path: &Path) -> Result<Self, StoreError> {
        let dir_io = |source| StoreError::DirIo {
            dir: path.to_path_buf(),
            source,
        };
        for _ in 0..MAX_REOPENS {
            let dir = open_dir(path).map_err(dir_io)?;
            lock(&dir, libc::LOCK_SH).map_err(dir_io)?;
            if still_at(&dir, path).map_err(dir_io)? {
                return Ok(Self {
                    dir,
                    path: path.to_path_buf(),
                });
            }
        }
        Err(dir_io(io::Error::new(
            io::ErrorKind::ResourceBusy,
            "the store kept being replaced while it was opened",
        )))
    }

    /// Reads and validates this generation's manifest.
    pub(crate) fn manifest(&self) -> Result<Manifest, StoreError> {
        let path = self.path.join(MANIFEST_FILE);
        let bytes = open_regular_at(&self.dir, MANIFEST_FILE)
            .and_then(|file| read_capped(file, MAX_MANIFEST_BYTES))
            .map_err(|source| match source.kind() {
                io::ErrorKind::FileTooLarge => StoreError::ManifestTooLarge {
                    path: path.clone(),
                    len: MAX_MANIFEST_BYTES + 1,
                    max: MAX_MANIFEST_BYTES,
                },
                _ => StoreError::ManifestIo {
                    path: path.clone(),
                    source,
                },
            })?;
        Manifest::parse(&bytes, &path)
    }

    /// Opens and checks the file of `entry` in this generation.
    pub(crate) fn open_tensor(&self, entry: &TensorEntry) -> Result<(File, PathBuf), StoreError> {
        let path = self.path.join(entry.file());
        crate::map::check_opened(open_regular_at(&self.dir, entry.file()), path, entry)
    }

    /// [`open_tensor`](Self::open_tensor) for every entry, in manifest order, so the first bad
    /// entry is the error. Relative opens let the kernel look up one name per file instead of
    /// walking the whole path again (opening is most of a load's system time).
    pub(crate) fn open_all(
        &self,
        entries: &[TensorEntry],
    ) -> Result<Vec<(File, PathBuf)>, StoreError> {
        self.make_room(entries.len())?;
        entries.iter().map(|e| self.open_tensor(e)).collect()
    }

    /// Makes sure `files` more descriptors can be opened (each mapped tensor keeps its file,
    /// and with it its shared lock, open): raises the soft open-file limit towards the hard one
    /// when the store needs it, as Go's runtime does for every program. Stores of more than
    /// ~1000 tensors (models above a few billion parameters) pass the common soft limit of 1024.
    ///
    /// # Errors
    /// [`StoreError::TooManyFiles`] when even the hard limit leaves too few.
    pub(crate) fn make_room(&self, files: usize) -> Result<(), StoreError> {
        let open_now = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        let needed = open_now + files as u64 + SPARE_FILES;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into `limit`.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return Ok(()); // Unknown: let the opens report what they meet.
        }
        if limit.rlim_cur >= needed {
            return Ok(());
        }
        let raised = libc::rlimit {
            rlim_cur: needed.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit; a soft limit up to the hard one is always allowed.
        let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0;
        let now = if set { raised.rlim_cur } else { limit.rlim_cur };
        if now < needed {
            return Err(StoreError::TooManyFiles {
                dir: self.path.clone(),
                needed,
                limit: now,
                hard: limit.rlim_max,
            });
        }
        log::debug!(
            target: "burn_mapped",
            "raised the open-file limit from {} to {now} for {}",
            limit.rlim_cur,
            self.path.display()
        );
        Ok(())
    }
}

impl Manifest {
    /// Reads and validates `<dir>/manifest.json`, opened without following a link, without
    /// blocking on a FIFO and read through a bounded reader.
    pub fn read(dir: &Path) -> Result<Self, StoreError> {
        Generation::open(dir)?.manifest()
    }
}

/// Opens a directory for locking (`O_PATH` descriptors cannot be locked).
pub(crate) fn open_dir(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
}

/// Takes `op` (`LOCK_SH` or `LOCK_EX`) on `file`, waiting at most [`LOCK_WAIT`]. A file
/// system without `flock` leaves the protocol out rather than failing the load.
pub(crate) fn lock(file: &File, op: libc::c_int) -> io::Result<()> {
    let deadline = Instant::now() + LOCK_WAIT;
    let mut pause = Duration::from_micros(100);
    loop {
        // SAFETY: flock only reads the descriptor, which `file` keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EWOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Some(libc::EWOULDBLOCK) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("locked by another process for over {LOCK_WAIT:?}"),
                ));
            }
            Some(libc::EINTR) => {}
            Some(libc::ENOLCK | libc::EOPNOTSUPP) => return Ok(()),
            _ => return Err(err),
        }
    }
}

/// Whether `dir` is still the directory found at `path`.
pub(crate) fn still_at(dir: &File, path: &Path) -> io::Result<bool> {
    let held = dir.metadata()?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}
