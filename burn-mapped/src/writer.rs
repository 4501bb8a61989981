//! Writing a store: one zero-padded file per tensor, then the manifest, published atomically.
//!
//! Everything is written into a sibling temporary directory, fsynced, and swapped into place
//! with one `renameat2(RENAME_EXCHANGE)` (or `RENAME_NOREPLACE` when the target is new).
//! Processes that map the old store keep its inodes; new openers see the whole new store or
//! the whole old one, never a mix (see [`crate::generation`] for the lock that makes this
//! hold for a reader that is opening while the exchange happens).
//!
//! The writer removes only what it wrote: the target is replaced only when it is a
//! burn-mapped store (its `manifest.json` says so) holding nothing its manifest does not name,
//! or an empty directory; never a file, a link or a directory with anything else in it
//! ([`StoreError::NotAStore`], [`StoreError::ForeignFile`]). Of the replaced store it unlinks
//! the manifest and the files it names, nothing else. The temporary directory is named
//! `.<store>.tmp-<pid>-<n>-<random>` and holds a marker file from its first moment; one left
//! by a killed writer is cleared by the next writer into the same target only when its name
//! has exactly that form, it holds the marker, it belongs to the same user and its lock is
//! free (so its writer is dead). A writer killed by a fault in a mapped input
//! ([`crate::fault`]) removes its own.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::DType;
use xxhash_rust::xxh3::Xxh3Default;

use crate::error::StoreError;
use crate::generation::{lock, open_dir, still_at};
use crate::gguf::BlockLayout;
use crate::layout::padded_len;
use crate::manifest::{
    Annotations, FORMAT, MANIFEST_FILE, Manifest, QuantLink, TensorEntry, file_name_for,
};

/// What the writer needs to know about a tensor besides its bytes.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    param_id: Option<u64>,
    quant: Option<QuantLink>,
    blocks: Option<BlockLayout>,
}

impl TensorSpec {
    /// A tensor named `name` (its module path) of `dtype` and `shape`.
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.into(),
            param_id: None,
            quant: None,
            blocks: None,
        }
    }

    /// Records Burn's parameter id so a loaded module keeps it (optimizer state is keyed by it).
    pub fn param_id(mut self, id: u64) -> Self {
        self.param_id = Some(id);
        self
    }

    /// Marks this tensor as a quantized weight whose scales are in another tensor.
    pub fn quant(mut self, link: QuantLink) -> Self {
        self.quant = Some(link);
        self
    }

    /// Marks this `u8` `[rows, row_bytes]` tensor as quantized GGUF blocks laid out as `layout`.
    pub fn blocks(mut self, layout: BlockLayout) -> Self {
        self.blocks = Some(layout);
        self
    }

    /// Logical byte length, or `None` on overflow.
    pub fn byte_len(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.dtype.size() as u64, |acc, &d| {
                acc.checked_mul(d as u64)
            })
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Buffers a tensor file's bytes into whole chunks written at chunk-aligned offsets. The kernel
/// sizes the page-cache folios of a written file by its writes, and only an aligned write of a
/// huge page or more makes huge folios, which a mapping can then map with one TLB entry per
/// huge page (see `image`); a new store is usually read straight from the page cache.
struct ChunkWriter {
    file: File,
    buf: Vec<u8>,
    chunk: usize,
}

impl ChunkWriter {
    fn new(file: File) -> Self {
        let chunk = crate::layout::huge_page_size().max(4 << 20) as usize;
        Self {
            file,
            buf: Vec::new(),
            chunk,
        }
    }

    fn into_inner(mut self) -> io::Result<File> {
        self.flush()?;
        Ok(self.file)
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(self.chunk);
        }
        let n = (self.chunk - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.chunk {
            self.file.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.file.write_all(&self.buf)?;
            self.buf.clear();
        }
        self.file.flush()
    }
}

/// A streaming sink for one tensor's bytes: hashes and counts as it writes.
pub struct TensorSink<'a> {
    out: &'a mut ChunkWriter,
    hasher: Xxh3Default,
    written: u64,
}

impl Write for TensorSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// What a writer does with an existing store at its target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Existing {
    /// Replace it atomically.
    #[default]
    Replace,
    /// Refuse with [`StoreError::StoreExists`].
    Refuse,
}

/// Builds a store directory.
#[derive(Debug)]
pub struct StoreWriter {
    dir: PathBuf,
    tmp: PathBuf,
    existing: Existing,
    // Held (with `LOCK_EX`) while writing, so a later writer knows this one is alive.
    _tmp_lock: File,
    // Lets the fault handler remove `tmp` if a mapped input faults while writing.
    _on_fault: crate::fault::DirRegistration,
    entries: Vec<TensorEntry>,
    metadata: BTreeMap<String, String>,
    finished: bool,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl StoreWriter {
    /// Starts a store that will appear at `dir` when [`finish`](Self::finish) succeeds,
    /// replacing an existing store there.
    ///
    /// # Errors
    /// [`StoreError::NotAStore`] when `dir` exists and is neither a store nor an empty
    /// directory (checked here, and again when publishing); I/O errors.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::create_with(dir, Existing::Replace)
    }

    /// [`create`](Self::create), with what to do about an existing store at `dir`.
    pub fn create_with(dir: impl AsRef<Path>, existing: Existing) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        // `.`, `..` and `/` name no new entry that a finished store could be renamed to.
        let Some(leaf) = dir.file_name().filter(|_| !ends_in_dots(&dir)) else {
            return Err(StoreError::BadTarget {
                dir,
                reason: "a path that ends in `.`, `..` or `/` names no new directory; give the \
                         store a directory of its own (for example `--out ./store`)",
            });
        };
        let leaf = leaf.to_string_lossy().into_owned();
        check_target(&dir, existing)?;
        let parent = parent_of(&dir);
        let prefix = tmp_prefix(&leaf);
        let tmp = parent.join(format!(
            "{prefix}{}-{}-{:016x}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed),
            random_u64()
        ));
        let dir_io = |source| StoreError::DirIo {
            dir: tmp.clone(),
            source,
        };
        std::fs::create_dir_all(&parent).map_err(dir_io)?;
        clear_abandoned(&parent, &prefix);
        std::fs::create_dir(&tmp).map_err(dir_io)?;
        let on_fault = crate::fault::remove_on_fault(&tmp, is_writer_file);
        let lock = File::create_new(tmp.join(WRITER_MARKER))
            .and_then(|_| open_dir(&tmp))
            .and_then(|file| lock(&file, libc::LOCK_EX).map(|()| file));
        let lock = match lock {
            Ok(lock) => lock,
            Err(source) => {
                remove_written(&tmp);
                return Err(dir_io(source));
            }
        };
        Ok(Self {
            dir,
            tmp,
            existing,
            _tmp_lock: lock,
            _on_fault: on_fault,
            entries: Vec::new(),
            metadata: BTreeMap::new(),
            finished: false,
        })
    }

    /// Adds a string to the manifest's metadata (model configuration, provenance).
    pub fn metadata(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.metadata.insert(key.into(), value.into());
    }

    /// Adds a tensor from a byte slice.
    pub fn add(&mut self, spec: TensorSpec, data: &[u8]) -> Result<(), StoreError> {
        self.add_with(spec, |sink| sink.write_all(data))
    }

    /// Adds a tensor whose bytes `fill` streams into the sink (for converters that produce
    /// data piecewise). The sink must receive exactly the spec's byte length.
    pub fn add_with(
        &mut self,
        spec: TensorSpec,
        fill: impl FnOnce(&mut TensorSink<'_>) -> io::Result<()>,
    ) -> Result<(), StoreError> {
        let index = self.entries.len();
        let file_name = file_name_for(index, &spec.name);
        let path = self.tmp.join(&file_name);
        let io = |source| StoreError::Io {
            tensor: spec.name.clone(),
            file: path.clone(),
            source,
        };
        let expected = spec.byte_len().unwrap_or(u64::MAX);
        let file = File::create_new(&path).map_err(io)?;
        let mut out = ChunkWriter::new(file);
        let mut sink = TensorSink {
            out: &mut out,
            hasher: Xxh3Default::new(),
            written: 0,
        };
        fill(&mut sink).map_err(io)?;
        let (written, hash) = (sink.written, sink.hasher.digest());
        if written != expected {
            return Err(StoreError::WrongByteCount {
                tensor: spec.name,
                expected,
                actual: written,
            });
        }
        let padding = padded_len(written).expect("length checked against the spec") - written;
        io::copy(&mut io::repeat(0).take(padding), &mut out).map_err(io)?;
        let file = out.into_inner().map_err(io)?;
        file.sync_all().map_err(io)?;
        let entry = TensorEntry::new(
            spec.name,
            spec.dtype,
            spec.shape,
            file_name,
            hash,
            Annotations {
                param_id: spec.param_id,
                quant: spec.quant,
                blocks: spec.blocks,
            },
        )?;
        self.entries.push(entry);
        Ok(())
    }

    /// Validates the manifest, makes everything durable and publishes the directory.
    pub fn finish(mut self) -> Result<Manifest, StoreError> {
        let manifest = Manifest::from_entries(
            std::mem::take(&mut self.entries),
            std::mem::take(&mut self.metadata),
        )?;
        let dir_io = |dir: &Path| {
            let dir = dir.to_path_buf();
            move |source| StoreError::DirIo { dir, source }
        };
        let manifest_path = self.tmp.join(MANIFEST_FILE);
        let mut file = File::create_new(&manifest_path).map_err(dir_io(&self.tmp))?;
        file.write_all(manifest.to_json().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(dir_io(&self.tmp))?;
        // The marker only tells an abandoned temporary directory from a user's; the store
        // itself does not hold it.
        std::fs::remove_file(self.tmp.join(WRITER_MARKER)).map_err(dir_io(&self.tmp))?;
        sync_dir(&self.tmp).map_err(dir_io(&self.tmp))?;
        publish(&self.tmp, &self.dir, self.existing)?;
        self.finished = true;
        Ok(manifest)
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        if !self.finished {
            // Best effort: an abandoned write leaves nothing behind but cannot report errors.
            remove_written(&self.tmp);
        }
    }
}

/// Whether `dir` ends in a `.` or `..` component as written (`Path` drops a trailing `.`, the
/// system does not: `rename(2)` onto `store/.` fails).
pub(crate) fn ends_in_dots(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let bytes = dir.as_os_str().as_bytes();
    let bytes = bytes.strip_suffix(b"/").unwrap_or(bytes);
    let last = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
    last == b"." || last == b".."
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn parent_of(dir: &Path) -> PathBuf {
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Opens the directory at `dir` without following a link; `None` when nothing is there.
fn open_target(dir: &Path) -> Result<Option<File>, StoreError> {
    match open_dir_nofollow(dir) {
        Ok(handle) => Ok(Some(handle)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            Err(StoreError::NotAStore {
                dir: dir.to_path_buf(),
                reason: "not a directory (a file or a symbolic link)",
            })
        }
        Err(source) => Err(StoreError::DirIo {
            dir: dir.to_path_buf(),
            source,
        }),
    }
}

/// Checks what is at `dir` without changing anything: nothing, or something [`classify`]
/// lets this writer replace.
fn check_target(dir: &Path, existing: Existing) -> Result<(), StoreError> {
    match open_target(dir)? {
        Some(handle) => classify(dir, &handle, existing).map(drop),
        None => Ok(()),
    }
}

/// Whether the directory `handle` (at `dir`) may be replaced: an empty directory, or a store
/// when `existing` allows replacing one and the directory holds nothing but its manifest and
/// the files it names. Returns those names (what replacing it may unlink).
fn classify(
    dir: &Path,
    handle: &File,
    existing: Existing,
) -> Result<Vec<std::ffi::OsString>, StoreError> {
    let not_a_store = |reason| StoreError::NotAStore {
        dir: dir.to_path_buf(),
        reason,
    };
    let store_files = match crate::untrusted::open_regular_at(handle, MANIFEST_FILE) {
        Ok(file) => {
            let bytes = crate::untrusted::read_capped(file, crate::manifest::MAX_MANIFEST_BYTES)
                .map_err(|_| not_a_store("its manifest.json cannot be read"))?;
            // Any version of the format counts: replacing an old store is the point of
            // converting again. Only the tag and the file names are read.
            #[derive(serde::Deserialize)]
            struct Tag {
                format: String,
                #[serde(default)]
                tensors: Vec<Named>,
            }
            #[derive(serde::Deserialize)]
            struct Named {
                file: String,
            }
            serde_json::from_slice::<Tag>(&bytes)
                .ok()
                .filter(|t| t.format == FORMAT)
                .map(|t| t.tensors.into_iter().map(|n| n.file).collect::<Vec<_>>())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(_) => return Err(not_a_store("its manifest.json is not a regular file")),
    };
    let listing = || {
        std::fs::read_dir(dir).map_err(|source| StoreError::DirIo {
            dir: dir.to_path_buf(),
            source,
        })
    };
    let Some(files) = store_files else {
        if listing()?.next().is_some() {
            return Err(not_a_store(
                "a directory with other contents and no burn-mapped manifest",
            ));
        }
        return Ok(Vec::new());
    };
    if existing == Existing::Refuse {
        return Err(StoreError::StoreExists {
            dir: dir.to_path_buf(),
        });
    }
    // Only plain names can be entries of the directory; anything else (`../x`, `a/b`) names
    // nothing in it and must never be joined to it.
    let mut own: Vec<std::ffi::OsString> = files
        .into_iter()
        .filter(|f| !f.is_empty() && f != "." && f != ".." && !f.contains(['/', '\0']))
        .map(Into::into)
        .collect();
    own.push(MANIFEST_FILE.into());
    for entry in listing()? {
        let entry = entry.map_err(|source| StoreError::DirIo {
            dir: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let regular = entry.file_type().is_ok_and(|t| t.is_file());
        if !regular || !own.contains(&name) {
            return Err(StoreError::ForeignFile {
                dir: dir.to_path_buf(),
                file: name.to_string_lossy().into_owned(),
            });
        }
    }
    Ok(own)
}

fn open_dir_nofollow(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir)
}

/// Moves `tmp` to `dir`: a new name, or an exchange with what is there if [`check_target`]
/// allows it, decided under `dir`'s exclusive lock so readers see one generation whole.
fn publish(tmp: &Path, dir: &Path, existing: Existing) -> Result<(), StoreError> {
    let dir_io = |source| StoreError::DirIo {
        dir: dir.to_path_buf(),
        source,
    };
    // A rival writer can change the target between the look and the rename; each round looks
    // again, and the rename itself refuses what the look did not expect.
    for _ in 0..64 {
        let Some(handle) = open_target(dir)? else {
            match rename2(tmp, dir, libc::RENAME_NOREPLACE) {
                Ok(()) => return sync_dir(&parent_of(dir)).map_err(dir_io),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(dir_io(e)),
            }
        };
        lock(&handle, libc::LOCK_EX).map_err(dir_io)?;
        // Look under the lock: the directory must still be the one locked, and something this
        // writer may replace.
        if !still_at(&handle, dir).map_err(dir_io)? {
            continue;
        }
        let old_files = classify(dir, &handle, existing)?;
        rename2(tmp, dir, libc::RENAME_EXCHANGE).map_err(dir_io)?;
        // `tmp` now names the old store; its files live on for any process mapping them.
        // Unlink them while still holding the lock (see `generation`).
        for name in &old_files {
            let _ = std::fs::remove_file(tmp.join(name));
        }
        let _ = std::fs::remove_dir(tmp);
        drop(handle);
        return sync_dir(&parent_of(dir)).map_err(dir_io);
    }
    Err(dir_io(io::Error::new(
        io::ErrorKind::ResourceBusy,
        "the target kept changing while the store was published",
    )))
}

/// The file a writer puts in its temporary directory first: a directory without it was not
/// made by a writer, and is never cleared.
pub(crate) const WRITER_MARKER: &str = ".burn-mapped-writer";

/// Whether a writer names a file `name` in its temporary directory: the manifest, the marker,
/// or `NNNNN-<name>.tensor`.
pub(crate) fn is_writer_file(name: &[u8]) -> bool {
    if name == MANIFEST_FILE.as_bytes() || name == WRITER_MARKER.as_bytes() {
        return true;
    }
    name.len() > 12
        && name[..5].iter().all(u8::is_ascii_digit)
        && name[5] == b'-'
        && name.ends_with(b".tensor")
}

/// Unlinks what a writer writes from its temporary directory `dir`, then `dir` itself if that
/// left it empty; leaves anything else (and so the directory) in place.
fn remove_written(dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let regular = entry.file_type().is_ok_and(|t| t.is_file());
            if regular && is_writer_file(entry.file_name().as_bytes()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The name every temporary directory of a writer into `<parent>/<leaf>` starts with.
fn tmp_prefix(leaf: &str) -> String {
    format!(".{leaf}.tmp-")
}

/// Whether `rest` (a name after [`tmp_prefix`]) has exactly the form a writer gives it:
/// `<pid>-<n>-<16 hex digits>`.
fn is_tmp_suffix(rest: &str) -> bool {
    let mut parts = rest.split('-');
    let digits =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    digits(parts.next())
        && digits(parts.next())
        && parts
            .next()
            .is_some_and(|p| p.len() == 16 && p.bytes().all(|b| b.is_ascii_hexdigit()))
        && parts.next().is_none()
}

/// Clears the temporary directories that writers into the same target left when they were
/// killed. A directory is cleared only when its name has exactly a writer's form, it holds the
/// writer's marker, it belongs to this user, and its lock can be taken (no live writer holds
/// it); a user's directory that merely starts with the same prefix is never touched.
fn clear_abandoned(parent: &Path, prefix: &str) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let ours = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .is_some_and(is_tmp_suffix);
        if !ours {
            continue;
        }
        let path = entry.path();
        let Ok(handle) = open_dir_nofollow(&path) else {
            continue;
        };
        let owned = handle.metadata().is_ok_and(|m| m.uid() == me);
        let marked = crate::untrusted::open_regular_at(&handle, WRITER_MARKER).is_ok();
        // SAFETY: flock only reads the descriptor, which `handle` keeps open.
        if owned
            && marked
            && unsafe { libc::flock(handle.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0
        {
            remove_written(&path);
        }
    }
}

/// 64 random bits from the kernel (the clock's nanoseconds if that fails: the name must only
/// differ from a user's, and the marker and lock decide what is cleared).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into `bytes`.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n == bytes.len() as isize {
        u64::from_ne_bytes(bytes)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// `renameat2(a, b, flags)`.
fn rename2(a: &Path, b: &Path, flags: libc::c_uint) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let to_c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
    };
    let (a, b) = (to_c(a)?, to_c(b)?);
    // SAFETY: both arguments are valid NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
