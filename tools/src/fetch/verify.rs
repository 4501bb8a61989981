//! Checking a file against the artifact table: size, SHA-256, and a marker beside a verified
//! file (keyed by its size and mtime) so that the next run need not hash it again.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use super::artifact::SplitArtifact;
use super::error::{FetchError, io_err};

/// Returns whether `path` already holds the artifact. A file of the right size
/// is hashed once; afterwards a marker keyed by size and mtime skips the hash.
pub(super) fn cached_file_is_valid(
    artifact: &SplitArtifact,
    path: &Path,
    progress: bool,
) -> Result<bool, FetchError> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err("cannot stat", path)(e)),
    };
    if meta.len() != artifact.size {
        if progress {
            tell!(
                "{} is {} bytes, expected {}; fetching again",
                path.display(),
                meta.len(),
                artifact.size
            );
        }
        return Ok(false);
    }
    if read_marker(path).as_deref() == Some(marker_contents(artifact, &meta).as_str()) {
        return Ok(true);
    }
    if progress {
        tell!("verifying {}", path.display());
    }
    let digest = hash_file(path)?;
    if hex(&digest) != artifact.sha256 {
        if progress {
            tell!("{} fails its sha256 check; fetching again", path.display());
        }
        return Ok(false);
    }
    write_marker(artifact, path)?;
    Ok(true)
}

pub(super) fn check_size(
    artifact: &SplitArtifact,
    path: &Path,
    found: u64,
) -> Result<(), FetchError> {
    if found != artifact.size {
        return Err(FetchError::Size {
            path: path.to_path_buf(),
            expected: artifact.size,
            found,
        });
    }
    Ok(())
}

pub(super) fn check_hash(
    artifact: &SplitArtifact,
    path: &Path,
    digest: &[u8],
) -> Result<(), FetchError> {
    let found = hex(digest);
    if found != artifact.sha256 {
        return Err(FetchError::Hash {
            path: path.to_path_buf(),
            expected: artifact.sha256.to_owned(),
            found,
        });
    }
    Ok(())
}

fn hash_file(path: &Path) -> Result<[u8; 32], FetchError> {
    let mut file =
        burn_mapped::untrusted::open_regular(path, burn_mapped::untrusted::Links::Follow)
            .map_err(io_err("cannot open", path))?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(io_err("cannot read", path))?;
    Ok(hasher.finalize().into())
}

pub(super) fn marker_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    path.with_file_name(name)
}

/// The marker records what was verified: the expected hash plus the size and
/// mtime the file had. Any rewrite of the file changes the mtime.
pub(super) fn marker_contents(artifact: &SplitArtifact, meta: &fs::Metadata) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| (d.as_secs(), d.subsec_nanos()));
    let mtime = match mtime {
        Some((s, ns)) => format!("{s}.{ns:09}"),
        None => "unknown".to_owned(),
    };
    // The inode and its change time too: a file replaced or rewritten and given its old
    // modification time back still gets a new change time, which no user can set.
    use std::os::unix::fs::MetadataExt;
    format!(
        "sha256={} size={} mtime={mtime} dev={} ino={} ctime={}.{:09}\n",
        artifact.sha256,
        meta.len(),
        meta.dev(),
        meta.ino(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

pub(super) fn read_marker(path: &Path) -> Option<String> {
    // A marker is one short line; anything else is not a marker.
    let bytes = burn_mapped::untrusted::read_regular(
        &marker_path(path),
        burn_mapped::untrusted::Links::Refuse,
        4096,
    )
    .ok()?;
    String::from_utf8(bytes).ok()
}

/// Writes the marker for the file as it is now. Losing the marker only costs a
/// re-hash, so it is written in place without a rename.
pub(super) fn write_marker(artifact: &SplitArtifact, path: &Path) -> Result<(), FetchError> {
    let meta = fs::metadata(path).map_err(io_err("cannot stat", path))?;
    let marker = marker_path(path);
    fs::write(&marker, marker_contents(artifact, &meta)).map_err(io_err("cannot write", &marker))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    struct Hex<'a>(&'a [u8]);
    impl fmt::Display for Hex<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
        }
    }
    Hex(bytes).to_string()
}
