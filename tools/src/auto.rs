//! The auto placement: instead of a fixed [`Placement`], probe the store's working set on the
//! device (or reuse a cached probe, see [`ProbeCache`]), apply the rule of [`crate::select`],
//! and load with the placement it chose. A fixed placement remains for measuring a rejected
//! one end to end, for example.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Instant, SystemTime};

use burn_mapped::{Placement, placement::UnknownPlacement};
use serde::Serialize;

use crate::device::DeviceArg;
use crate::probe::burn_device::{BurnProbeConfig, probe_device};
use crate::probe::{CpuProbeConfig, ProbeError, ProbeReport, probe_cpu, tensor_files_in};
use crate::probe_cache::{CacheError, DEFAULT_MAX_AGE, Lookup, ProbeCache, ProbeKey};
use crate::select::{ArmRate, Basis, DEFAULT_THETA, SelectError, Verdict, select};

/// `--placement`: decide from measurements, or load with a given placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlacementChoice {
    /// Probe (or reuse a cached probe), apply the rule, load accordingly.
    #[default]
    Auto,
    /// Load with this placement whatever a probe would say.
    Fixed(Placement),
}

impl PlacementChoice {
    /// The given placement, or `None` for `Auto`.
    pub fn fixed(self) -> Option<Placement> {
        match self {
            PlacementChoice::Auto => None,
            PlacementChoice::Fixed(placement) => Some(placement),
        }
    }

    /// The command-line spelling: `auto` or the placement's [`name`](Placement::name).
    pub fn name(self) -> &'static str {
        self.fixed().map_or("auto", Placement::name)
    }
}

impl fmt::Display for PlacementChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--placement` value that is neither `auto` nor a placement.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}, or auto")]
pub struct UnknownChoice(#[from] pub UnknownPlacement);

impl FromStr for PlacementChoice {
    type Err = UnknownChoice;

    fn from_str(s: &str) -> Result<Self, UnknownChoice> {
        if s.eq_ignore_ascii_case("auto") {
            Ok(PlacementChoice::Auto)
        } else {
            Ok(PlacementChoice::Fixed(s.parse()?))
        }
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
    /// What the loader will do: the rule's choice (`verdict.chosen`).
    pub placement: Placement,
    pub verdict: Verdict,
    pub report: ProbeReport,
    pub origin: ProbeOrigin,
    /// Set when the rule chose map only because the mapping is not cached (storage-bound).
    pub warning: Option<String>,
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
        other => ProbeKey::burn(other, &files)?,
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
                other => probe_device(other, &files, &BurnProbeConfig::default())?,
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
    if matches!(verdict.basis, Basis::StorageBound) {
        warnings.push(
            "the mapping does not stay in the page cache: every placement reads at storage \
             speed; mapping anyway"
                .to_owned(),
        );
    }
    let warning = (!warnings.is_empty()).then(|| warnings.join("; "));
    Ok(Decision {
        placement: verdict.chosen,
        verdict,
        report,
        origin,
        warning,
    })
}

/// One line for logs: the decision, the rates and where the probe came from.
pub fn describe(decision: &Decision) -> String {
    let rate = |arm: &crate::probe::ArmReport| match &arm.rate {
        ArmRate::Measured { gbps } => format!("{gbps:.2} GB/s"),
        ArmRate::Unavailable { .. } => "unavailable".to_owned(),
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
        decision.placement.name(),
        r.working_set_bytes as f64 / 1e9,
        rate(&r.map),
        rate(&r.resident),
        rate(&r.per_use_copy),
        decision.verdict.explanation,
        origin
    )
}
