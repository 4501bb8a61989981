//! Endpoint selection: which of three byte paths should serve a model's weights on one device.
//!
//! A device can reach the working set `W` (every weight byte read per token) through three endpoints:
//! **map** reads the mapped file pages in place, **resident** copies them once into device-owned storage
//! and reads that copy, and **per-use copy** stages the bytes into device storage before every use.
//! [`select`] applies the paper's Algorithm 2 (§8.1) to measured endpoint rates:
//!
//! 1. If the mapping does not stay resident in the page cache over a pass, stop: every path runs at
//!    storage speed and no in-memory endpoint helps ([`Basis::StorageBound`]; the loader maps and warns).
//! 2. Drop resident if it does not fit (`capacity < W`) or did not coexist with the fully cached mapping
//!    after one pass of every arm (accelerator allocation can be deferred until work runs, so only a
//!    post-execution check is trustworthy).
//! 3. Path time is `W / rate` for every remaining endpoint; the shortest wins.
//! 4. If map is within `theta` of the winner (`t_map <= (1 + theta) * t_best`), choose map anyway: it keeps
//!    one evictable, shareable file-backed representation instead of a second owned copy. The band breaks
//!    ties between point estimates; it is not a statistical equivalence test.
//!
//! The function is pure: no I/O, no clock. Probes (see [`crate::probe`]) or the command line supply rates.

use std::fmt;

use burn_mapped::Placement;
use serde::{Deserialize, Serialize};

/// The paper's tie band: map is preferred when its path time is within 5% of the fastest endpoint.
pub const DEFAULT_THETA: f64 = 0.05;

/// Bytes per gigabyte in the GB/s rates (decimal, as the paper reports them).
const BYTES_PER_GB: f64 = 1e9;

/// What a probe learned about one endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ArmRate {
    /// The arm ran over the whole working set at this rate (decimal GB/s, `W` counted once per pass).
    Measured { gbps: f64 },
    /// The arm could not run; the reason is carried into the verdict.
    Unavailable { reason: String },
}

impl ArmRate {
    /// Shorthand for [`ArmRate::Measured`].
    pub fn measured(gbps: f64) -> Self {
        ArmRate::Measured { gbps }
    }

    /// Shorthand for [`ArmRate::Unavailable`].
    pub fn unavailable(reason: impl Into<String>) -> Self {
        ArmRate::Unavailable {
            reason: reason.into(),
        }
    }

    fn gbps(&self) -> Option<f64> {
        match self {
            ArmRate::Measured { gbps } => Some(*gbps),
            ArmRate::Unavailable { .. } => None,
        }
    }
}

/// Everything the rule needs about one device and one working set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelectInput {
    /// `W`: weight bytes read per token.
    pub working_set_bytes: u64,
    pub map: ArmRate,
    pub resident: ArmRate,
    pub per_use_copy: ArmRate,
    /// Bytes of device storage the resident copy may occupy; `None` when the probe established the fit
    /// itself (then an arm that did not fit is already [`ArmRate::Unavailable`]).
    pub resident_capacity_bytes: Option<u64>,
    /// Whether, after one pass of every arm, the mapping was still fully cached while the resident copy
    /// existed. `false` drops the resident arm.
    pub resident_coexists: bool,
    /// Whether the mapping stayed resident in the page cache over a pass. `false` is the storage-bound stop.
    pub mapping_stays_resident: bool,
}

impl SelectInput {
    fn arm(&self, endpoint: Placement) -> &ArmRate {
        match endpoint {
            Placement::Map => &self.map,
            Placement::Resident => &self.resident,
            Placement::PerUseCopy => &self.per_use_copy,
        }
    }
}

/// Why an endpoint took no part in the final comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DropReason {
    /// The arm could not run.
    Unavailable { reason: String },
    /// The resident copy needs more bytes than the device can hold.
    DoesNotFit {
        working_set_bytes: u64,
        capacity_bytes: u64,
    },
    /// The resident copy and the cached mapping did not coexist after one pass of every arm.
    NoCoexistence,
    /// The mapping did not stay cached, so no in-memory endpoint was compared.
    StorageBound,
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DropReason::Unavailable { reason } => write!(f, "unavailable: {reason}"),
            DropReason::DoesNotFit {
                working_set_bytes,
                capacity_bytes,
            } => write!(
                f,
                "does not fit: W = {working_set_bytes} B exceeds resident capacity {capacity_bytes} B"
            ),
            DropReason::NoCoexistence => f.write_str(
                "did not coexist with the fully cached mapping after one pass of every arm",
            ),
            DropReason::StorageBound => f.write_str(
                "not compared: the mapping does not stay cached, every path runs at storage speed",
            ),
        }
    }
}

/// The rule's per-endpoint findings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArmVerdict {
    pub endpoint: Placement,
    /// Measured rate, if the arm ran.
    pub gbps: Option<f64>,
    /// `W / rate` in seconds, if the arm ran.
    pub path_seconds: Option<f64>,
    /// Why the arm was not compared; `None` for arms that took part.
    pub dropped: Option<DropReason>,
}

/// Which step of the rule decided.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Basis {
    /// Step 1: the mapping does not stay cached; no in-memory endpoint helps. The loader maps and warns.
    StorageBound,
    /// Step 3: the chosen endpoint has the shortest path time (map was not within the band of it, or
    /// map is itself the fastest).
    Fastest,
    /// Step 4: map was chosen although `fastest` was quicker, by the relative path-time `gap`
    /// (`t_map / t_fastest - 1`), because `gap <= theta`.
    TieBand { fastest: Placement, gap: f64 },
}

/// The rule's result: the chosen endpoint and the evidence behind it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub chosen: Placement,
    pub basis: Basis,
    pub theta: f64,
    pub working_set_bytes: u64,
    /// One entry per endpoint, in [`Placement::ALL`] order.
    pub arms: Vec<ArmVerdict>,
    /// One-paragraph account for people.
    pub explanation: String,
}

impl Verdict {
    /// The findings for one endpoint (`None` only for a hand-edited verdict that omits it).
    pub fn arm(&self, endpoint: Placement) -> Option<&ArmVerdict> {
        self.arms.iter().find(|a| a.endpoint == endpoint)
    }
}

/// Inputs the rule refuses.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SelectError {
    #[error("the working set is 0 bytes; the rule needs the weight bytes read per token")]
    EmptyWorkingSet,
    #[error("the {endpoint} rate {gbps} GB/s is not a finite number above 0")]
    InvalidRate { endpoint: Placement, gbps: f64 },
    #[error("theta {theta} is not a finite number >= 0")]
    InvalidTheta { theta: f64 },
    #[error("no endpoint remains to serve the weights: {}", describe_drops(.dropped))]
    NoEndpointRemains {
        dropped: Vec<(Placement, DropReason)>,
    },
}

fn describe_drops(dropped: &[(Placement, DropReason)]) -> String {
    dropped
        .iter()
        .map(|(e, r)| format!("{e} ({r})"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Applies Algorithm 2 to `input` with tie band `theta` (e.g. [`DEFAULT_THETA`]).
///
/// # Errors
/// Rejects a zero working set, a measured rate that is not finite and positive, a negative or non-finite
/// `theta`, and inputs where every endpoint is dropped.
pub fn select(input: &SelectInput, theta: f64) -> Result<Verdict, SelectError> {
    if input.working_set_bytes == 0 {
        return Err(SelectError::EmptyWorkingSet);
    }
    if !theta.is_finite() || theta < 0.0 {
        return Err(SelectError::InvalidTheta { theta });
    }
    for endpoint in Placement::ALL {
        if let Some(gbps) = input.arm(endpoint).gbps()
            && !(gbps.is_finite() && gbps > 0.0)
        {
            return Err(SelectError::InvalidRate { endpoint, gbps });
        }
    }

    let w = input.working_set_bytes;
    let mut arms: Vec<ArmVerdict> = Placement::ALL
        .iter()
        .map(|&endpoint| {
            let gbps = input.arm(endpoint).gbps();
            ArmVerdict {
                endpoint,
                gbps,
                path_seconds: gbps.map(|g| w as f64 / (g * BYTES_PER_GB)),
                dropped: drop_reason(input, endpoint),
            }
        })
        .collect();

    // Step 1: the storage-bound stop comes before any comparison.
    if !input.mapping_stays_resident {
        for arm in arms.iter_mut().filter(|a| a.endpoint != Placement::Map) {
            arm.dropped.get_or_insert(DropReason::StorageBound);
        }
        let explanation = format!(
            "storage-bound: the mapping does not stay resident in the page cache over a pass, so every \
             endpoint reads at storage speed and no in-memory endpoint helps; map the files and warn \
             (W = {w} B).{}",
            describe_dropped_arms(&arms)
        );
        return Ok(Verdict {
            chosen: Placement::Map,
            basis: Basis::StorageBound,
            theta,
            working_set_bytes: w,
            arms,
            explanation,
        });
    }

    // Step 3: fastest remaining endpoint; `min_by` keeps the first of equals, i.e. the fewest copies.
    let remaining = || {
        arms.iter()
            .filter(|a| a.dropped.is_none())
            .filter_map(|a| a.path_seconds.map(|t| (a.endpoint, t)))
    };
    let Some((fastest, t_best)) = remaining().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Err(SelectError::NoEndpointRemains {
            dropped: dropped_arms(&arms),
        });
    };
    let t_map = remaining()
        .find(|(e, _)| *e == Placement::Map)
        .map(|(_, t)| t);

    // Step 4: the tie band, stated on path times exactly as the paper does.
    let pct = |x: f64| format!("{:.2}%", x * 100.0);
    let (chosen, basis, head) = match t_map {
        Some(t_map) if fastest != Placement::Map && t_map <= (1.0 + theta) * t_best => {
            let gap = t_map / t_best - 1.0;
            let head = format!(
                "map: {fastest} is faster by {}, inside the tie band theta = {}; map keeps one \
                 evictable, shareable file-backed copy instead of a second owned one.",
                pct(gap),
                pct(theta)
            );
            (Placement::Map, Basis::TieBand { fastest, gap }, head)
        }
        _ => {
            let mut head = format!("{fastest}: shortest path time, {t_best:.4} s per pass over W.");
            if let Some(t_map) = t_map.filter(|_| fastest != Placement::Map) {
                head.push_str(&format!(
                    " Map is slower by {}, outside the tie band theta = {}.",
                    pct(t_map / t_best - 1.0),
                    pct(theta)
                ));
            }
            (fastest, Basis::Fastest, head)
        }
    };

    let explanation = head + &describe_dropped_arms(&arms);
    Ok(Verdict {
        chosen,
        basis,
        theta,
        working_set_bytes: w,
        arms,
        explanation,
    })
}

/// Step 2 plus arms that could not run; the first applicable reason wins.
fn drop_reason(input: &SelectInput, endpoint: Placement) -> Option<DropReason> {
    if let ArmRate::Unavailable { reason } = input.arm(endpoint) {
        return Some(DropReason::Unavailable {
            reason: reason.clone(),
        });
    }
    if endpoint != Placement::Resident {
        return None;
    }
    match input.resident_capacity_bytes {
        Some(capacity) if capacity < input.working_set_bytes => Some(DropReason::DoesNotFit {
            working_set_bytes: input.working_set_bytes,
            capacity_bytes: capacity,
        }),
        _ if !input.resident_coexists => Some(DropReason::NoCoexistence),
        _ => None,
    }
}

fn dropped_arms(arms: &[ArmVerdict]) -> Vec<(Placement, DropReason)> {
    arms.iter()
        .filter_map(|a| a.dropped.clone().map(|r| (a.endpoint, r)))
        .collect()
}

fn describe_dropped_arms(arms: &[ArmVerdict]) -> String {
    let dropped = dropped_arms(arms);
    if dropped.is_empty() {
        String::new()
    } else {
        format!(" Dropped: {}.", describe_drops(&dropped))
    }
}
