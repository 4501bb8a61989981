//! The Burn-device probe: the three endpoints as this project's loader placements reach them on
//! one Burn device, with one of Burn's own kernels (an integer `sum`) as the reader.
//!
//! Each file becomes a Flex tensor that adopts its read-only mapping (`I32` over the file's whole
//! 4-byte words). Then:
//! - **map** sums the adopted tensors in place. Only Flex can: Burn's CubeCL backends copy every
//!   `from_data` into their own buffers, so on wgpu/vulkan the arm is unavailable, with that reason;
//! - **resident** stages each tensor once onto the device with [`Stager`] (the resident load) and
//!   sums the copies every pass;
//! - **per-use copy** stages each tensor onto the device every pass (host staging copy and upload
//!   on a GPU), sums it and drops it.
//!
//! Warm-up rounds are discarded, the rate is `W` over the median pass, arms rotate their order
//! per round, and every pass of every arm must produce the same checksum.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::{AllocationProperty, Bytes, DType, Device, Int, Tensor, TensorData};
use burn_mapped::{Placement, Stager, placement::is_flex};
use memmap2::Mmap;

use super::{ArmReport, Passes, ProbeError, ProbeReport, Residency, file_residency, median};
use crate::device::DeviceArg;
use crate::select::ArmRate;

/// How the Burn-device probe runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BurnProbeConfig {
    /// Discarded rounds, at least 1 (the first is also the coexistence pass).
    pub warmup_passes: usize,
    /// Measured rounds, at least 1.
    pub passes: usize,
}

impl Default for BurnProbeConfig {
    fn default() -> Self {
        Self {
            warmup_passes: 1,
            passes: 5,
        }
    }
}

/// Probes `files` on the Burn device named by `device`.
///
/// # Errors
/// As [`probe_on`].
pub fn probe_device(
    device: DeviceArg,
    files: &[PathBuf],
    config: &BurnProbeConfig,
) -> Result<ProbeReport, ProbeError> {
    probe_on(&device.device(), device.name(), files, config)
}

/// Probes `files` on `device`, reported under `name`.
///
/// # Errors
/// Invalid configuration, files that cannot be opened or mapped, no 4-byte word to read, and a
/// checksum that changes between passes.
pub fn probe_on(
    device: &Device,
    name: &str,
    files: &[PathBuf],
    config: &BurnProbeConfig,
) -> Result<ProbeReport, ProbeError> {
    super::check_passes(config.warmup_passes, config.passes)?;
    let (sources, file_count) = adopt(files, burn_mapped::placement::max_binding(device))?;
    let w: u64 = sources
        .iter()
        .map(|t| t.shape().num_elements() as u64 * 4)
        .sum();
    if w == 0 {
        return Err(ProbeError::EmptyWorkingSet { count: files.len() });
    }
    let residency_at_start = file_residency(files)?;
    let stager = Stager::new(device.clone());
    let map_available = is_flex(device);

    let start = Instant::now();
    let resident: Vec<Tensor<1, Int>> = sources.iter().map(|t| stager.stage(t.clone())).collect();
    let resident_checksum = read_all(name, &resident)?;
    let resident_copy_seconds = start.elapsed().as_secs_f64();

    let mut passes = Passes {
        checksum: Some(resident_checksum),
        ..Passes::default()
    };
    let mut residency_after_one_pass_each = Residency::default();
    for round in 0..config.warmup_passes + config.passes {
        for k in 0..Placement::ALL.len() {
            let arm = Placement::ALL[(round + k) % Placement::ALL.len()];
            let start = Instant::now();
            let sum = match arm {
                Placement::Map if !map_available => continue,
                Placement::Map => read_all(name, &sources)?,
                Placement::Resident => read_all(name, &resident)?,
                Placement::PerUseCopy => sources.iter().try_fold(0u64, |acc, t| {
                    Ok::<_, ProbeError>(acc.wrapping_add(read(name, stager.stage(t.clone()))?))
                })?,
            };
            let elapsed = start.elapsed().as_secs_f64();
            passes.record(arm, round, config.warmup_passes, sum, elapsed)?;
        }
        if round == 0 {
            residency_after_one_pass_each = file_residency(files)?;
        }
    }
    let residency_at_end = file_residency(files)?;
    drop(resident);

    let [map_s, resident_s, copy_s] = passes.seconds;
    let measured = |pass_seconds: Vec<f64>| ArmReport {
        rate: ArmRate::measured(w as f64 / 1e9 / median(&pass_seconds)),
        pass_seconds,
    };
    let map = if map_available {
        measured(map_s)
    } else {
        ArmReport {
            rate: ArmRate::unavailable(format!(
                "Burn's {name} backend cannot adopt host memory: `from_data` always copies into \
                 its own device buffers, so a kernel cannot read the mapped pages in place"
            )),
            pass_seconds: Vec::new(),
        }
    };
    Ok(ProbeReport {
        device: format!("{name} (burn)"),
        cpu_tier: None,
        file_count,
        working_set_bytes: w,
        threads: 1,
        warmup_passes: config.warmup_passes,
        passes: config.passes,
        chunk_bytes: 0,
        map,
        resident: measured(resident_s),
        per_use_copy: measured(copy_s),
        resident_copy_seconds: Some(resident_copy_seconds),
        residency_at_start,
        residency_after_one_pass_each,
        residency_at_end,
        resident_coexists: residency_after_one_pass_each.is_full(),
        mem_available_bytes: None,
        checksum: passes.checksum.unwrap_or_default(),
    })
}

/// Flex `I32` tensors adopting each non-empty file's read-only shared mapping, in pieces of at
/// most `max_bytes` (a device's largest binding: a 491 MB GGUF is one tensor nowhere on
/// lavapipe, whose bindings hold 128 MiB), and how many files they hold.
fn adopt(
    files: &[PathBuf],
    max_bytes: Option<u64>,
) -> Result<(Vec<Tensor<1, Int>>, usize), ProbeError> {
    let flex = Device::flex();
    let mut tensors = Vec::with_capacity(files.len());
    let mut read = 0;
    for path in files {
        let file = super::open_probed(path)?;
        // SAFETY: a read-only shared mapping this process never writes; another process
        // truncating the file is the hazard documented on `probe_cpu`, and rewriting it shows up
        // as a checksum mismatch.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| ProbeError::Map {
            path: path.clone(),
            source,
        })?;
        let words = map.len() / 4;
        if words == 0 {
            continue;
        }
        read += 1;
        let shared = bytes::Bytes::from_owner(map);
        let piece = max_bytes.map_or(words, |b| (b / 4).max(1) as usize);
        for first in (0..words).step_by(piece) {
            let n = piece.min(words - first);
            let data = TensorData::from_bytes(
                Bytes::from_shared(
                    shared.slice(4 * first..4 * (first + n)),
                    AllocationProperty::File,
                ),
                [n],
                DType::I32,
            );
            tensors.push(Tensor::from_data(data, &flex));
        }
    }
    Ok((tensors, read))
}

/// Sums one tensor on its device and reads the scalar back (which waits for the kernel); a
/// device that fails it (lavapipe's binding limits, a lost device) is an error naming it.
fn read(name: &str, t: Tensor<1, Int>) -> Result<u64, ProbeError> {
    t.sum()
        .try_into_scalar::<i64>()
        .map(|sum| sum as u64)
        .map_err(|e| ProbeError::Device {
            device: name.to_string(),
            message: e.to_string(),
        })
}

fn read_all(name: &str, tensors: &[Tensor<1, Int>]) -> Result<u64, ProbeError> {
    tensors
        .iter()
        .try_fold(0u64, |acc, t| Ok(acc.wrapping_add(read(name, t.clone())?)))
}
