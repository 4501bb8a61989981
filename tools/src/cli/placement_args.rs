//! `--device`, `--placement` and the auto placement's probe-cache options, shared by the
//! commands that load a model.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::auto::{AutoOptions, Decision, PlacementChoice, decide, describe};
use crate::device::{DeviceArg, parse_device};
use crate::probe_cache::{DEFAULT_MAX_AGE, ProbeCache};
use crate::select::DEFAULT_THETA;

/// Where the model runs and how its weights are placed.
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Device: cpu (Flex), wgpu or vulkan (the last two need their cargo feature).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceArg,
    /// map | resident | per-use-copy | auto (probe the store on the device, apply the rule).
    #[arg(long, default_value = "auto")]
    pub placement: PlacementChoice,
    /// Auto: probe again even if a valid cached probe exists.
    #[arg(long)]
    pub reprobe: bool,
    /// Auto: neither read nor write the probe cache.
    #[arg(long)]
    pub no_probe_cache: bool,
    /// Auto: probe cache directory (default ~/.cache/burn-mapped/probes).
    #[arg(long, value_name = "DIR")]
    pub probe_cache_dir: Option<PathBuf>,
    /// Auto: seconds after which a cached probe is re-measured.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_MAX_AGE.as_secs())]
    pub probe_max_age: u64,
    /// Auto: the rule's tie band.
    #[arg(long, default_value_t = DEFAULT_THETA)]
    pub theta: f64,
}

impl PlacementArgs {
    /// The auto placement's settings described by these arguments.
    pub fn auto_options(&self) -> AutoOptions {
        AutoOptions {
            cache: (!self.no_probe_cache).then(|| {
                ProbeCache::new(
                    self.probe_cache_dir
                        .clone()
                        .unwrap_or_else(ProbeCache::default_dir),
                    Duration::from_secs(self.probe_max_age),
                )
            }),
            refresh: self.reprobe,
            theta: self.theta,
            ..AutoOptions::default()
        }
    }

    /// The placement to load `store` with; for `auto`, the decision (logged to stderr with its
    /// figures unless `quiet`).
    ///
    /// # Errors
    /// Probe, rule and cache failures of [`decide`].
    pub fn resolve(
        &self,
        store: &Path,
        quiet: bool,
    ) -> anyhow::Result<(burn_mapped::Placement, Option<Decision>)> {
        if let Some(fixed) = self.placement.fixed() {
            return Ok((fixed, None));
        }
        let decision = decide(store, self.device, &self.auto_options(), SystemTime::now())?;
        if !quiet {
            tell!("[{}]", describe(&decision));
            if let Some(warning) = &decision.warning {
                tell!("[warning: {warning}]");
            }
        }
        Ok((decision.placement, Some(decision)))
    }
}
