//! Where a store converted from a GGUF came from: recorded in the store's metadata so that the
//! store can find the file again (its vocabulary and chat template stay there) and so that a
//! file replaced or edited since the conversion is noticed instead of silently paired with the
//! old weights.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::{GgufError, MappedGguf};

/// Metadata key holding the source file's absolute path, when it is UTF-8.
pub const SOURCE_KEY: &str = "source.gguf";
/// Metadata key holding the source file's absolute path as hex bytes, when it is not UTF-8
/// (so the path is recorded exactly, never lossily).
pub const SOURCE_HEX_KEY: &str = "source.gguf.path-hex";
const SIZE_KEY: &str = "source.gguf.size";
const MTIME_KEY: &str = "source.gguf.mtime-ns";
const CTIME_KEY: &str = "source.gguf.ctime-ns";
const DEV_KEY: &str = "source.gguf.dev";
const INO_KEY: &str = "source.gguf.ino";
const XXH3_KEY: &str = "source.gguf.xxh3";

/// A GGUF file's identity (where it is, which inode, how long, when modified, when its inode
/// last changed: a time no user can set back) and content (xxh3-64 of every byte).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    /// Absolute path with every link resolved.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Inode change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
    /// Device of the file system holding it.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// xxh3-64 of the whole file.
    pub xxh3: u64,
}

/// What [`SourceRecord::check`] found at the recorded path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceState {
    /// The same file, or a file with the same bytes.
    Same,
    /// A file whose bytes differ from the recorded ones.
    Changed {
        /// What differs first: `size` or `content`.
        what: &'static str,
    },
}

/// Errors reading or checking a recorded source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The metadata has no source, or a malformed one.
    #[error("the store records no usable source GGUF (metadata `{key}`: {reason})")]
    Unrecorded {
        /// The key at fault.
        key: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The recorded file cannot be examined.
    #[error("the store's source GGUF {}: {source}", path.display())]
    Io {
        /// The recorded path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The recorded file could not be read as GGUF.
    #[error(transparent)]
    Gguf(Box<GgufError>),
}

impl SourceRecord {
    /// The record of the open file `gguf`: its resolved path, its metadata and the hash of its
    /// mapped bytes (which reads the whole file, as a conversion does anyway).
    ///
    /// # Errors
    /// When the path cannot be resolved or the file examined.
    pub fn of(gguf: &MappedGguf) -> Result<Self, SourceError> {
        let io = |source| SourceError::Io {
            path: gguf.path().to_path_buf(),
            source,
        };
        let path = std::fs::canonicalize(gguf.path()).map_err(io)?;
        let meta = std::fs::metadata(&path).map_err(io)?;
        Ok(Self {
            path,
            size: meta.size(),
            mtime_ns: mtime_ns(&meta),
            ctime_ns: ctime_ns(&meta),
            dev: meta.dev(),
            ino: meta.ino(),
            xxh3: xxhash_rust::xxh3::xxh3_64(gguf.bytes()),
        })
    }

    /// The record as metadata entries (key, value).
    pub fn to_metadata(&self) -> Vec<(&'static str, String)> {
        let path = match self.path.to_str() {
            Some(text) => (SOURCE_KEY, text.to_string()),
            None => (
                SOURCE_HEX_KEY,
                self.path
                    .as_os_str()
                    .as_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
            ),
        };
        vec![
            path,
            (SIZE_KEY, self.size.to_string()),
            (MTIME_KEY, self.mtime_ns.to_string()),
            (CTIME_KEY, self.ctime_ns.to_string()),
            (DEV_KEY, self.dev.to_string()),
            (INO_KEY, self.ino.to_string()),
            (XXH3_KEY, format!("{:016x}", self.xxh3)),
        ]
    }

    /// Reads the record a conversion wrote into `metadata`.
    ///
    /// # Errors
    /// [`SourceError::Unrecorded`] when a key is missing or malformed.
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Self, SourceError> {
        let get = |key: &'static str| {
            metadata.get(key).ok_or(SourceError::Unrecorded {
                key,
                reason: "missing",
            })
        };
        let number = |key: &'static str| -> Result<i128, SourceError> {
            get(key)?.parse().map_err(|_| SourceError::Unrecorded {
                key,
                reason: "not a number",
            })
        };
        let unsigned = |key| {
            u64::try_from(number(key)?).map_err(|_| SourceError::Unrecorded {
                key,
                reason: "out of range",
            })
        };
        let path = match (metadata.get(SOURCE_KEY), metadata.get(SOURCE_HEX_KEY)) {
            (Some(text), _) => PathBuf::from(text),
            (None, Some(hex)) => PathBuf::from(std::ffi::OsStr::from_bytes(
                &parse_hex(hex).ok_or(SourceError::Unrecorded {
                    key: SOURCE_HEX_KEY,
                    reason: "not hex bytes",
                })?,
            )),
            (None, None) => {
                return Err(SourceError::Unrecorded {
                    key: SOURCE_KEY,
                    reason: "missing",
                });
            }
        };
        if !path.is_absolute() {
            return Err(SourceError::Unrecorded {
                key: SOURCE_KEY,
                reason: "not an absolute path",
            });
        }
        let xxh3 = get(XXH3_KEY)?;
        let xxh3 = u64::from_str_radix(xxh3, 16)
            .ok()
            .filter(|_| xxh3.len() == 16)
            .ok_or(SourceError::Unrecorded {
                key: XXH3_KEY,
                reason: "not 16 hex digits",
            })?;
        Ok(Self {
            path,
            size: unsigned(SIZE_KEY)?,
            mtime_ns: number(MTIME_KEY)?,
            ctime_ns: number(CTIME_KEY)?,
            dev: unsigned(DEV_KEY)?,
            ino: unsigned(INO_KEY)?,
            xxh3,
        })
    }

    /// Whether the file now at the recorded path is the one converted: the same inode, size,
    /// modification and change times, or else the same bytes (hashed only then, so a file
    /// copied or touched costs one read, and an untouched one none).
    ///
    /// # Errors
    /// When the file is gone or cannot be read.
    pub fn check(&self) -> Result<SourceState, SourceError> {
        let io = |source| SourceError::Io {
            path: self.path.clone(),
            source,
        };
        let meta = std::fs::metadata(&self.path).map_err(io)?;
        if meta.size() != self.size {
            return Ok(SourceState::Changed { what: "size" });
        }
        if meta.dev() == self.dev
            && meta.ino() == self.ino
            && mtime_ns(&meta) == self.mtime_ns
            && ctime_ns(&meta) == self.ctime_ns
        {
            return Ok(SourceState::Same);
        }
        let file = MappedGguf::open(&self.path).map_err(|e| SourceError::Gguf(Box::new(e)))?;
        Ok(if xxhash_rust::xxh3::xxh3_64(file.bytes()) == self.xxh3 {
            SourceState::Same
        } else {
            SourceState::Changed { what: "content" }
        })
    }
}

fn mtime_ns(meta: &std::fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

fn ctime_ns(meta: &std::fs::Metadata) -> i128 {
    i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec())
}

fn parse_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.is_empty() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_utf8_path_round_trips_exactly() {
        let record = SourceRecord {
            path: PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/m\xffodel.gguf")),
            size: 1,
            mtime_ns: -5,
            ctime_ns: 7,
            dev: 2,
            ino: 3,
            xxh3: 0xdead_beef,
        };
        let metadata: BTreeMap<String, String> = record
            .to_metadata()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert!(!metadata.contains_key(SOURCE_KEY));
        assert_eq!(SourceRecord::from_metadata(&metadata).unwrap(), record);
    }

    #[test]
    fn a_relative_path_is_not_accepted() {
        let metadata: BTreeMap<String, String> = [
            (SOURCE_KEY, "model.gguf"),
            (SIZE_KEY, "1"),
            (MTIME_KEY, "1"),
            (CTIME_KEY, "1"),
            (DEV_KEY, "1"),
            (INO_KEY, "1"),
            (XXH3_KEY, "0000000000000001"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert!(matches!(
            SourceRecord::from_metadata(&metadata),
            Err(SourceError::Unrecorded { .. })
        ));
    }
}
