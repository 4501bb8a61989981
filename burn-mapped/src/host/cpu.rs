//! Which CPU kernels run: the best tier this CPU has, or the one `BURN_MAPPED_CPU` pins, so
//! that one machine can measure and test every tier it can run (an AVX-512 server its AVX2
//! loops, any machine the scalar ones).

use std::sync::OnceLock;

/// The variable that pins the tier: `scalar`, `avx2` or `avx512vnni`.
pub const CPU_VAR: &str = "BURN_MAPPED_CPU";

/// A family of CPU kernels, from the plain Rust loops up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuTier {
    /// Plain Rust, on any CPU.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// As `Avx2`, plus AVX-512 F, BW, VL and VNNI (the block products' `vpdpbusd`).
    Avx512Vnni,
}

impl CpuTier {
    /// Every tier, lowest first.
    pub const ALL: [CpuTier; 3] = [CpuTier::Scalar, CpuTier::Avx2, CpuTier::Avx512Vnni];

    /// The name `BURN_MAPPED_CPU` takes and reports print.
    pub fn name(self) -> &'static str {
        match self {
            CpuTier::Scalar => "scalar",
            CpuTier::Avx2 => "avx2",
            CpuTier::Avx512Vnni => "avx512vnni",
        }
    }

    /// The tier called `name` (ASCII case ignored).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether this CPU runs the tier's instructions (run-time detection).
    pub fn supported(self) -> bool {
        match self {
            CpuTier::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            CpuTier::Avx2 => {
                use std::arch::is_x86_feature_detected as has;
                has!("avx2") && has!("fma") && has!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            CpuTier::Avx512Vnni => {
                use std::arch::is_x86_feature_detected as has;
                CpuTier::Avx2.supported()
                    && has!("avx512f")
                    && has!("avx512bw")
                    && has!("avx512vl")
                    && has!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The best tier this CPU runs.
    pub fn detected() -> Self {
        Self::ALL
            .into_iter()
            .rev()
            .find(|t| t.supported())
            .unwrap_or(CpuTier::Scalar)
    }
}

impl std::fmt::Display for CpuTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `BURN_MAPPED_CPU` names no tier, or one this CPU cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuTierError {
    /// Not a tier's name.
    #[error("{CPU_VAR}={value:?} is not a CPU tier (scalar, avx2 or avx512vnni)")]
    Unknown {
        /// The variable's value.
        value: String,
    },
    /// A tier this CPU lacks the instructions for.
    #[error("{CPU_VAR}={asked} asks for instructions this CPU lacks (its best tier is {best})")]
    Unsupported {
        /// The tier asked for.
        asked: CpuTier,
        /// The best one this CPU runs.
        best: CpuTier,
    },
}

/// The tier `BURN_MAPPED_CPU` pins, `None` when it is not set; a program can call this first
/// to refuse a bad value instead of running with the detected tier.
///
/// # Errors
/// [`CpuTierError`] for a value that names no tier or one this CPU cannot run.
pub fn cpu_tier_from_env() -> Result<Option<CpuTier>, CpuTierError> {
    let Some(value) = std::env::var_os(CPU_VAR) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    let asked = CpuTier::parse(&value).ok_or(CpuTierError::Unknown { value })?;
    if !asked.supported() {
        return Err(CpuTierError::Unsupported {
            asked,
            best: CpuTier::detected(),
        });
    }
    Ok(Some(asked))
}

/// The tier the CPU kernels run, decided once per process: `BURN_MAPPED_CPU` where it names
/// a tier this CPU runs, else the best detected (a bad value is logged and ignored).
pub fn cpu_tier() -> CpuTier {
    static TIER: OnceLock<CpuTier> = OnceLock::new();
    *TIER.get_or_init(|| match cpu_tier_from_env() {
        Ok(Some(tier)) => tier,
        Ok(None) => CpuTier::detected(),
        Err(e) => {
            let best = CpuTier::detected();
            log::warn!("{e}; using {best}");
            best
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_scalar_tier_always_runs() {
        for tier in CpuTier::ALL {
            assert_eq!(CpuTier::parse(tier.name()), Some(tier));
        }
        assert_eq!(CpuTier::parse(" AVX2 "), Some(CpuTier::Avx2));
        assert_eq!(CpuTier::parse("sse2"), None);
        assert!(CpuTier::Scalar.supported());
        assert!(CpuTier::detected().supported());
        // Tiers nest: whatever runs, every lower tier runs too.
        let best = CpuTier::detected();
        assert!(CpuTier::ALL.iter().all(|t| t.supported() == (*t <= best)));
    }
}
