//! The checkpoint from its home, the Hugging Face Hub: one HTTPS GET of the file, resumed with a
//! `Range` request when an earlier download left part of it, checked against the pinned size
//! and SHA-256 before it is renamed into place. The HTTP client is `ureq`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::artifact::{HubFile, SplitArtifact};
use super::error::{FetchError, io_err};

/// The Hub's address; `HF_ENDPOINT` (the Hub's own tools read it too) replaces it, for a mirror
/// of the Hub or a test server.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How long resolving the Hub's name, and then connecting to it, may each take before it counts
/// as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the Hub may take to answer a request, once connected.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint to use: `HF_ENDPOINT` when set, else [`DEFAULT_ENDPOINT`].
pub fn endpoint() -> String {
    std::env::var("HF_ENDPOINT").unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string())
}

/// The partial download of `artifact` in `cache_dir`, kept between runs so the next resumes it.
pub(super) fn partial_path(artifact: &SplitArtifact, cache_dir: &Path) -> PathBuf {
    cache_dir.join(format!(".{}.hub-partial", artifact.file_name))
}

/// Downloads `file` from `endpoint` into `artifact`'s partial file in `cache_dir`, resuming
/// what an earlier run left there, and returns the partial file's path once its size and
/// SHA-256 are the artifact's (the caller renames it into place). A partial file that turns
/// out wrong is removed, so the next run starts over.
///
/// # Errors
/// [`FetchError::Unreachable`] when no connection to the endpoint can be made (the caller can
/// fall back to the mirror), [`FetchError::Http`] for a refusal or a broken transfer, and the
/// size and hash errors of a file that is not the pinned one.
pub(super) fn download(
    file: &HubFile,
    artifact: &SplitArtifact,
    cache_dir: &Path,
    endpoint: &str,
    progress: bool,
) -> Result<PathBuf, FetchError> {
    let url = file.url(endpoint);
    let partial = partial_path(artifact, cache_dir);
    let mut have = fs::metadata(&partial).map_or(0, |m| m.len());
    if have > artifact.size {
        // Longer than the file: not a prefix of it.
        fs::remove_file(&partial).map_err(io_err("cannot remove", &partial))?;
        have = 0;
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_resolve(Some(CONNECT_TIMEOUT))
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_recv_response(Some(ANSWER_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent.get(&url);
    if have > 0 {
        request = request.header("Range", &format!("bytes={have}-"));
    }
    let response = request.call().map_err(|e| transport_error(&url, e))?;
    let status = response.status().as_u16();
    let append = match status {
        206 if have > 0 => true,
        200 => false,
        // The range starts at the end: the partial file is whole.
        416 if have == artifact.size => true,
        _ => {
            return Err(FetchError::Http {
                url,
                reason: format!("status {status}"),
            });
        }
    };
    if progress {
        if append && have > 0 {
            tell!("resuming {url} at {have} of {} bytes", artifact.size);
        } else {
            tell!("downloading {url}");
        }
    }
    let mut out = OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&partial)
        .map_err(io_err("cannot open", &partial))?;
    if status != 416 {
        let limit = artifact.size - if append { have } else { 0 };
        // One byte past what is missing, so a longer body is caught without reading it all.
        let mut body = response.into_body().into_reader().take(limit + 1);
        copy(&mut body, &mut out, &url, &partial)?;
    }
    out.sync_all().map_err(io_err("cannot fsync", &partial))?;
    drop(out);
    match verify(artifact, &partial) {
        Ok(()) => Ok(partial),
        Err(e) => {
            // Not the pinned file: nothing here is worth resuming.
            let _ = fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Copies the body into the partial file.
fn copy(body: &mut impl Read, out: &mut File, url: &str, partial: &Path) -> Result<(), FetchError> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // What arrived stays in the partial file, for the next run to resume.
            Err(e) => {
                return Err(FetchError::Http {
                    url: url.to_string(),
                    reason: format!("the transfer broke off: {e}"),
                });
            }
        };
        out.write_all(&buf[..n])
            .map_err(io_err("cannot write", partial))?;
    }
}

/// The partial file's size and SHA-256 against the artifact's.
fn verify(artifact: &SplitArtifact, partial: &Path) -> Result<(), FetchError> {
    let found = fs::metadata(partial)
        .map_err(io_err("cannot stat", partial))?
        .len();
    super::verify::check_size(artifact, partial, found)?;
    let mut file = File::open(partial).map_err(io_err("cannot open", partial))?;
    let mut hash = Sha256::new();
    io::copy(&mut file, &mut hash).map_err(io_err("cannot read", partial))?;
    super::verify::check_hash(artifact, partial, &hash.finalize())
}

/// A transport error: no connection at all is [`FetchError::Unreachable`].
fn transport_error(url: &str, e: ureq::Error) -> FetchError {
    match e {
        ureq::Error::HostNotFound
        | ureq::Error::ConnectionFailed
        | ureq::Error::Timeout(_)
        | ureq::Error::Io(_) => FetchError::Unreachable {
            url: url.to_string(),
            reason: e.to_string(),
        },
        other => FetchError::Http {
            url: url.to_string(),
            reason: other.to_string(),
        },
    }
}
