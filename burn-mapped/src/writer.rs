//! Writing a store: one zero-padded file per tensor, then the manifest, published atomically.
//!
//! Everything is written into a sibling temporary directory, fsynced, and swapped into place
//! with one `renameat2(RENAME_EXCHANGE)` (or a plain rename when the target is new). Processes
//! that map the old store keep its inodes; new openers see the whole new store or the whole old
//! one, never a mix.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::DType;
use xxhash_rust::xxh3::Xxh3Default;

use crate::error::StoreError;
use crate::layout::padded_len;
use crate::manifest::{MANIFEST_FILE, Manifest, QuantLink, TensorEntry, file_name_for};

/// What the writer needs to know about a tensor besides its bytes.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    param_id: Option<u64>,
    quant: Option<QuantLink>,
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

/// Builds a store directory.
#[derive(Debug)]
pub struct StoreWriter {
    dir: PathBuf,
    tmp: PathBuf,
    entries: Vec<TensorEntry>,
    metadata: BTreeMap<String, String>,
    finished: bool,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl StoreWriter {
    /// Starts a store that will appear at `dir` when [`finish`](Self::finish) succeeds.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let leaf = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "store".to_string());
        let tmp = parent.join(format!(
            ".{leaf}.tmp-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&parent)
            .and_then(|()| std::fs::create_dir(&tmp))
            .map_err(|source| StoreError::DirIo {
                dir: tmp.clone(),
                source,
            })?;
        Ok(Self {
            dir,
            tmp,
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
            spec.param_id,
            spec.quant,
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
        sync_dir(&self.tmp).map_err(dir_io(&self.tmp))?;
        publish(&self.tmp, &self.dir).map_err(dir_io(&self.dir))?;
        self.finished = true;
        Ok(manifest)
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        if !self.finished {
            // Best effort: an abandoned write leaves nothing behind but cannot report errors.
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Moves `tmp` to `dir`, atomically replacing an existing store.
fn publish(tmp: &Path, dir: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(dir).is_ok() {
        exchange(tmp, dir)?;
        // `tmp` now holds the old store; its files live on for any process still mapping them.
        std::fs::remove_dir_all(tmp)?;
    } else {
        std::fs::rename(tmp, dir)?;
    }
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => sync_dir(Path::new(".")),
    }
}

fn exchange(a: &Path, b: &Path) -> io::Result<()> {
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
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
