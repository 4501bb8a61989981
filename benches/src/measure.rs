//! What every child measures about itself (Qwen, synthetic and eviction alike): its resident
//! set, elapsed milliseconds, and bit-pattern hashes of outputs that must agree across arms.
//! Kept apart from the children so that none of them depends on another.

use std::time::Instant;

use anyhow::Result;
use burn_mapped::host::memstat::{file_pmd_mapped, rss_self};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

/// Resident set of this process, in bytes (`/proc/self/status`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Mem {
    pub anon: u64,
    pub file: u64,
    /// `VmHWM`: the peak resident set so far.
    pub peak: u64,
    /// File pages mapped huge (`FilePmdMapped`); absent in results from before it was read.
    #[serde(default)]
    pub file_pmd: u64,
}

impl Mem {
    pub fn now() -> Result<Mem> {
        let r = rss_self()?;
        Ok(Mem {
            anon: r.anon,
            file: r.file,
            peak: r.peak,
            file_pmd: file_pmd_mapped("self")?,
        })
    }
}

/// Milliseconds since `since`.
pub fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// xxh3 of the bit patterns of `values` (logits, a layer's output): equal only when every
/// value is bitwise equal.
pub fn bits_hash(values: &[f32]) -> u64 {
    let mut h = Xxh3::new();
    for v in values {
        h.update(&v.to_bits().to_le_bytes());
    }
    h.digest()
}
