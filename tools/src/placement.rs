//! Load-time placement: the policy half.
//!
//! [`Placement::Auto`] decides per device from measurements, not from a flag: it probes the
//! store's working set on the device (or reuses a cached probe, see [`ProbeCache`]), applies the
//! rule of [`crate::select`], and loads with the chosen [`burn_mapped::Placement`]. The other
//! variants force an endpoint (to measure a rejected one end to end, for example).

use std::fmt;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use burn_mapped::untrusted::{Links, read_regular};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::device::DeviceArg;
use crate::probe::{CpuProbeConfig, ProbeError, ProbeReport, probe_cpu, tensor_files_in};
use crate::select::{DEFAULT_THETA, Endpoint, SelectError, Verdict, select};

/// How the loader places the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Adopt the mapped pages.
    Map,
    /// Copy once into device-owned storage.
    Resident,
    /// Keep the mapping and copy into fresh device storage before every use.
    PerUseCopy,
    /// Probe (or reuse a cached probe), apply the rule, load accordingly.
    #[default]
    Auto,
}

impl Placement {
    /// The forced placement, or `None` for `Auto`.
    pub fn fixed(self) -> Option<burn_mapped::Placement> {
        match self {
            Placement::Map => Some(burn_mapped::Placement::Map),
            Placement::Resident => Some(burn_mapped::Placement::Resident),
            Placement::PerUseCopy => Some(burn_mapped::Placement::PerUseCopy),
            Placement::Auto => None,
        }
    }

    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Auto => "auto",
            other => other.fixed().map_or("auto", burn_mapped::Placement::name),
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--placement` value that is none of the four.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement `{0}`: expected map, resident, per-use-copy or auto")]
pub struct UnknownPlacement(pub String);

impl FromStr for Placement {
    type Err = UnknownPlacement;

    fn from_str(s: &str) -> Result<Self, UnknownPlacement> {
        match s.to_ascii_lowercase().as_str() {
            "map" => Ok(Placement::Map),
            "resident" => Ok(Placement::Resident),
            "per-use-copy" | "per_use_copy" | "copy" => Ok(Placement::PerUseCopy),
            "auto" => Ok(Placement::Auto),
            _ => Err(UnknownPlacement(s.to_owned())),
        }
    }
}

/// The loader placement that serves an endpoint chosen by the rule.
pub fn placement_for(endpoint: Endpoint) -> burn_mapped::Placement {
    match endpoint {
        Endpoint::Map => burn_mapped::Placement::Map,
        Endpoint::Resident => burn_mapped::Placement::Resident,
        Endpoint::PerUseCopy => burn_mapped::Placement::PerUseCopy,
    }
}

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
        .map(|dir| dir.join(burn_mapped::MANIFEST_FILE))
        .and_then(|path| read_regular(&path, Links::Refuse, burn_mapped::MAX_MANIFEST_BYTES).ok());
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

/// Settings of [`decide`].
#[derive(Clone, Debug)]
pub struct AutoOptions {
    /// Where probes are cached; `None` probes every time and caches nothing.
    pub cache: Option<ProbeCache>,
    /// Probe even when a valid cached probe exists (the new probe replaces it).
    pub refresh: bool,
    /// The rule's tie band.
    pub theta: f64,
    /// The CPU probe's protocol.
    pub cpu: CpuProbeConfig,
}

impl Default for AutoOptions {
    fn default() -> Self {
        Self {
            cache: Some(ProbeCache::new(ProbeCache::default_dir(), DEFAULT_MAX_AGE)),
            refresh: false,
            theta: DEFAULT_THETA,
            cpu: CpuProbeConfig::default(),
        }
    }
}

/// Where the probe behind a decision came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProbeOrigin {
    /// Probed now; `cached_at` is where it was stored (if caching is on and the write worked).
    Fresh {
        seconds: f64,
        cached_at: Option<PathBuf>,
        /// Why a cached probe was not used, if one was looked up.
        cache: String,
    },
    /// Reused from the cache.
    Cached { age_seconds: f64, path: PathBuf },
}

/// The auto placement's decision and its evidence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// What the loader will do.
    #[serde(serialize_with = "ser_placement")]
    pub placement: burn_mapped::Placement,
    pub verdict: Verdict,
    pub report: ProbeReport,
    pub origin: ProbeOrigin,
    /// Set when the rule chose map only because the mapping is not cached (storage-bound).
    pub warning: Option<String>,
}

fn ser_placement<S: serde::Serializer>(
    p: &burn_mapped::Placement,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// Why the auto placement could not decide.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("{} holds no tensor files to probe", .0.display())]
    NoFiles(PathBuf),
}

/// Probes `store_dir`'s tensor files on `device` (or reuses a valid cached probe), applies the
/// rule, and returns the placement to load with. `now` dates the cache lookup and entry.
///
/// # Errors
/// Probe failures, a rule that finds no endpoint, cache I/O errors.
pub fn decide(
    store_dir: &Path,
    device: DeviceArg,
    options: &AutoOptions,
    now: SystemTime,
) -> Result<Decision, DecideError> {
    let files = tensor_files_in(store_dir)?;
    if files.is_empty() {
        return Err(DecideError::NoFiles(store_dir.to_path_buf()));
    }
    let key = match device {
        DeviceArg::Cpu => ProbeKey::cpu(&files, &options.cpu)?,
        other => crate::probe::burn_device::probe_key(other, &files)?,
    };
    // A cache that cannot be read or written, or holds an entry the rule refuses, costs a
    // fresh probe and a warning, never the run.
    let mut warnings = Vec::new();
    let lookup = match (&options.cache, options.refresh) {
        (Some(cache), false) => cache.get(&key, now).unwrap_or_else(|e| {
            let reason = format!(
                "{e}: {}",
                std::error::Error::source(&e).map_or_else(String::new, ToString::to_string)
            );
            warnings.push(format!("{reason}; probing again"));
            Lookup::Invalid {
                path: cache.path_for(&key),
                reason,
            }
        }),
        (Some(_), true) => Lookup::Invalid {
            path: PathBuf::new(),
            reason: "refresh requested".to_owned(),
        },
        (None, _) => Lookup::Miss,
    };
    let lookup = match lookup {
        Lookup::Hit { report, path, .. }
            if select(&report.select_input(), options.theta).is_err() =>
        {
            let reason = format!(
                "cached probe {} is damaged (the rule refuses its rates)",
                path.display()
            );
            warnings.push(format!("{reason}; probing again"));
            Lookup::Invalid { path, reason }
        }
        other => other,
    };
    let (report, origin) = match lookup {
        Lookup::Hit { report, age, path } => (
            *report,
            ProbeOrigin::Cached {
                age_seconds: age.as_secs_f64(),
                path,
            },
        ),
        other => {
            let why = match (&options.cache, other) {
                (None, _) => "caching off".to_owned(),
                (Some(_), Lookup::Miss) => {
                    "no cached probe for this device, driver and store".to_owned()
                }
                (Some(_), Lookup::Expired { age, .. }) => {
                    format!("cached probe expired ({:.0} s old)", age.as_secs_f64())
                }
                (Some(_), Lookup::Invalid { reason, .. }) => reason,
                (Some(_), Lookup::Hit { .. }) => unreachable!("handled above"),
            };
            let start = Instant::now();
            let report = match device {
                DeviceArg::Cpu => probe_cpu(&files, &options.cpu)?,
                other => crate::probe::burn_device::probe_device(
                    other,
                    &files,
                    &crate::probe::burn_device::BurnProbeConfig::default(),
                )?,
            };
            let seconds = start.elapsed().as_secs_f64();
            let cached_at = match &options.cache {
                Some(cache) => match cache.put(&key, &report, now) {
                    Ok(path) => Some(path),
                    Err(e) => {
                        warnings.push(format!("{e}; the probe is not cached"));
                        None
                    }
                },
                None => None,
            };
            (
                report,
                ProbeOrigin::Fresh {
                    seconds,
                    cached_at,
                    cache: why,
                },
            )
        }
    };
    let verdict = select(&report.select_input(), options.theta)?;
    if matches!(verdict.basis, crate::select::Basis::StorageBound) {
        warnings.push(
            "the mapping does not stay in the page cache: every placement reads at storage \
             speed; mapping anyway"
                .to_owned(),
        );
    }
    let warning = (!warnings.is_empty()).then(|| warnings.join("; "));
    Ok(Decision {
        placement: placement_for(verdict.chosen),
        verdict,
        report,
        origin,
        warning,
    })
}

/// One line for logs: the decision, the rates and where the probe came from.
pub fn describe(decision: &Decision) -> String {
    let rate = |arm: &crate::probe::ArmReport| match &arm.rate {
        crate::select::ArmRate::Measured { gbps } => format!("{gbps:.2} GB/s"),
        crate::select::ArmRate::Unavailable { .. } => "unavailable".to_owned(),
    };
    let r = &decision.report;
    let origin = match &decision.origin {
        ProbeOrigin::Fresh { seconds, cache, .. } => {
            format!("probed now in {seconds:.1} s ({cache})")
        }
        ProbeOrigin::Cached { age_seconds, path } => format!(
            "cached probe, {:.0} s old ({})",
            age_seconds,
            path.display()
        ),
    };
    format!(
        "placement auto on {}: {} | W = {:.3} GB | map {}, resident {}, per-use copy {} | {} | {}",
        r.device,
        decision.placement,
        r.working_set_bytes as f64 / 1e9,
        rate(&r.map),
        rate(&r.resident),
        rate(&r.per_use_copy),
        decision.verdict.explanation,
        origin
    )
}
