//! The probe cache: what a probe result is valid for ([`ProbeKey`]: device, driver, store
//! bytes and protocol) and probes kept on disk under that key ([`ProbeCache`]), so that the
//! auto placement measures a store on a device once, not on every run.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use burn_mapped::untrusted::{Links, read_regular};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::device::DeviceArg;
use crate::probe::burn_device::BurnProbeConfig;
use crate::probe::{CpuProbeConfig, ProbeError, ProbeReport};

/// What a probe cache entry is valid for: the same device, driver, store bytes and protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeKey {
    /// Who the device is (CPU model, logical CPUs and installed memory, or the adapter).
    pub device: String,
    /// Kernel release for the CPU; the adapter's driver for an accelerator.
    pub driver: String,
    /// [`store_fingerprint`] of the probed files.
    pub store: String,
    /// The probe protocol (passes, threads, chunk size): a different protocol is a new probe.
    pub protocol: String,
}

impl ProbeKey {
    /// The key for probing `files` on the host CPU with `config`.
    ///
    /// # Errors
    /// Files whose metadata cannot be read.
    pub fn cpu(files: &[PathBuf], config: &CpuProbeConfig) -> Result<Self, ProbeError> {
        Ok(ProbeKey {
            device: cpu_identity(),
            driver: kernel_release(),
            store: store_fingerprint(files)?,
            protocol: format!(
                "cpu-probe v1 threads={} warmup={} passes={} chunk={} margin={}",
                config.threads,
                config.warmup_passes,
                config.passes,
                config.chunk_bytes,
                config.memory_margin_bytes
            ),
        })
    }

    /// The key for probing `files` on the Burn device named by `device` with the default
    /// [`BurnProbeConfig`] (the one the auto placement runs).
    ///
    /// # Errors
    /// Files whose metadata cannot be read.
    pub fn burn(device: DeviceArg, files: &[PathBuf]) -> Result<Self, ProbeError> {
        let config = BurnProbeConfig::default();
        Ok(ProbeKey {
            device: format!("{device}: {:?}", device.device()),
            // Burn does not report the adapter's driver; the kernel release at least changes
            // with driver modules built for it.
            driver: kernel_release(),
            store: store_fingerprint(files)?,
            protocol: format!(
                "burn-probe v1 warmup={} passes={}",
                config.warmup_passes, config.passes
            ),
        })
    }
}

/// A content fingerprint of the probed files: SHA-256 over each file's name and length, plus the
/// bytes of a `manifest.json` beside them when there is one (a store's manifest carries every
/// tensor's xxh3, so the fingerprint follows the tensor bytes); without a manifest, each file's
/// modification time stands in for its content.
///
/// # Errors
/// Files whose metadata cannot be read.
pub fn store_fingerprint(files: &[PathBuf]) -> Result<String, ProbeError> {
    let mut hash = Sha256::new();
    let mut sorted: Vec<&PathBuf> = files.iter().collect();
    sorted.sort();
    let manifest = sorted
        .first()
        .and_then(|f| f.parent())
        .map(|dir| dir.join(burn_mapped::manifest::MANIFEST_FILE))
        .and_then(|path| {
            read_regular(
                &path,
                Links::Refuse,
                burn_mapped::manifest::MAX_MANIFEST_BYTES,
            )
            .ok()
        });
    for path in &sorted {
        let meta = std::fs::metadata(path).map_err(|source| ProbeError::Open {
            path: (*path).clone(),
            source,
        })?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        hash.update(name.unwrap_or_default().as_bytes());
        hash.update([0]);
        hash.update(meta.len().to_le_bytes());
        if manifest.is_none() {
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            hash.update(mtime.to_le_bytes());
        }
    }
    if let Some(manifest) = &manifest {
        hash.update(b"manifest\0");
        hash.update(manifest);
    }
    Ok(hex(&hash.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `model name` from `/proc/cpuinfo`, the logical CPU count and `MemTotal`.
fn cpu_identity() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown cpu", |(_, name)| name.trim());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .map_or("unknown", str::trim);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("cpu: {model}; {cpus} logical CPUs; MemTotal {mem}")
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("linux {}", s.trim()))
        .unwrap_or_else(|_| std::env::consts::OS.to_owned())
}

/// One cached probe on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct CacheEntry {
    format: String,
    version: u32,
    key: ProbeKey,
    created_unix_ms: u64,
    report: ProbeReport,
}

const CACHE_FORMAT: &str = "burn-mapped-probe";
/// Largest cache entry read (an entry is a few KiB of JSON).
const MAX_ENTRY_BYTES: u64 = 1 << 20;
const CACHE_VERSION: u32 = 1;

/// Probes cached on disk, one JSON file per [`ProbeKey`], valid for `max_age`.
#[derive(Clone, Debug)]
pub struct ProbeCache {
    dir: PathBuf,
    max_age: Duration,
}

/// How long a cached probe stays valid unless told otherwise: long enough to skip re-probing on
/// every run, short enough that a changed machine state (memory pressure, firmware) is re-measured.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The answer of [`ProbeCache::get`].
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// A valid probe for this key.
    Hit {
        report: Box<ProbeReport>,
        age: Duration,
        path: PathBuf,
    },
    /// Nothing cached for this key.
    Miss,
    /// A probe for this key older than the cache's `max_age` (or dated in the future).
    Expired { age: Duration, path: PathBuf },
    /// A file under this key's name that is not a valid entry for it (damaged, other format, or
    /// a hash collision); it will be overwritten.
    Invalid { path: PathBuf, reason: String },
}

/// Cache I/O failures (a missing entry is a [`Lookup::Miss`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot read probe cache entry {}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write probe cache entry {}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

impl ProbeCache {
    /// A cache in `dir` (created on first write) whose entries expire after `max_age`.
    pub fn new(dir: impl Into<PathBuf>, max_age: Duration) -> Self {
        Self {
            dir: dir.into(),
            max_age,
        }
    }

    /// `~/.cache/burn-mapped/probes` (or under `$XDG_CACHE_HOME`).
    pub fn default_dir() -> PathBuf {
        crate::fetch::default_cache_dir().join("probes")
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds `key`'s probe.
    pub fn path_for(&self, key: &ProbeKey) -> PathBuf {
        let json = serde_json::to_vec(key).expect("a key of strings always serializes");
        let digest = Sha256::digest(&json);
        self.dir.join(format!("{}.json", &hex(&digest)[..32]))
    }

    /// The cached probe for `key`, judged at time `now`.
    ///
    /// # Errors
    /// An entry file that exists but cannot be read.
    pub fn get(&self, key: &ProbeKey, now: SystemTime) -> Result<Lookup, CacheError> {
        let path = self.path_for(key);
        let text = match read_regular(&path, Links::Refuse, MAX_ENTRY_BYTES) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Lookup::Miss),
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        let entry: CacheEntry = match serde_json::from_slice(&text) {
            Ok(entry) => entry,
            Err(e) => {
                return Ok(Lookup::Invalid {
                    path,
                    reason: format!("not a probe cache entry: {e}"),
                });
            }
        };
        if entry.format != CACHE_FORMAT || entry.version != CACHE_VERSION {
            return Ok(Lookup::Invalid {
                path,
                reason: format!("format {} version {}", entry.format, entry.version),
            });
        }
        if entry.key != *key {
            return Ok(Lookup::Invalid {
                path,
                reason: "the entry was written for another key".to_owned(),
            });
        }
        let created = UNIX_EPOCH + Duration::from_millis(entry.created_unix_ms);
        match now.duration_since(created) {
            Ok(age) if age <= self.max_age => Ok(Lookup::Hit {
                report: Box::new(entry.report),
                age,
                path,
            }),
            Ok(age) => Ok(Lookup::Expired { age, path }),
            // Dated after `now`: the clock moved; do not trust it.
            Err(_) => Ok(Lookup::Expired {
                age: Duration::ZERO,
                path,
            }),
        }
    }

    /// Stores `report` under `key`, dated `now`, replacing any previous entry atomically.
    ///
    /// # Errors
    /// The directory or file cannot be written.
    pub fn put(
        &self,
        key: &ProbeKey,
        report: &ProbeReport,
        now: SystemTime,
    ) -> Result<PathBuf, CacheError> {
        let path = self.path_for(key);
        let write_err = |source| CacheError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(write_err)?;
        let entry = CacheEntry {
            format: CACHE_FORMAT.to_owned(),
            version: CACHE_VERSION,
            key: key.clone(),
            created_unix_ms: now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            report: report.clone(),
        };
        let json = serde_json::to_vec_pretty(&entry).expect("a probe report always serializes");
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(write_err)?;
        tmp.write_all(&json).map_err(write_err)?;
        tmp.persist(&path).map_err(|e| write_err(e.error))?;
        Ok(path)
    }
}
