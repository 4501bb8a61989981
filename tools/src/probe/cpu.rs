//! The CPU endpoint probe: the three endpoints as a host process sees them.
//!
//! * **map** reads the read-only shared mappings of the files in place;
//! * **resident** copies the files once into anonymous memory owned by the process, then reads the copy;
//! * **per-use copy** copies each chunk into a per-thread staging buffer before reading it, on every
//!   pass, the way a loader that stages one tensor at a time would. A `W`-sized staging buffer would need
//!   the same capacity as the resident copy, which is exactly what per-use copy exists to avoid.
//!
//! Every pass of every arm reads all of `W` with the same multi-threaded kernel ([`sum_words`]), and all
//! of them must agree on the checksum. Protocol: map the files; note residency; test whether a resident
//! copy fits beside the cached mapping and make it; run one pass of every arm and test coexistence;
//! run the rest of the warm-up rounds; then `passes` measured rounds, rotating which arm goes first.
//! A rate is `W` (counted once) over the median pass time.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use burn_mapped::Placement;

use super::{ArmReport, Passes, ProbeError, ProbeReport, map_files, mapped_residency, median};
use crate::select::ArmRate;

/// Default size of one unit of work and of each thread's staging buffer.
pub const DEFAULT_CHUNK_BYTES: usize = 16 << 20;
/// Default memory kept free beyond the resident copy and the mapping's page cache.
pub const DEFAULT_MEMORY_MARGIN_BYTES: u64 = 1 << 30;

/// How the CPU probe runs.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuProbeConfig {
    /// Reader threads (default: available parallelism).
    pub threads: NonZeroUsize,
    /// Discarded rounds per arm, at least 1: the first one is also the coexistence pass.
    pub warmup_passes: usize,
    /// Measured rounds per arm, at least 1; the rate uses their median.
    pub passes: usize,
    /// Work unit and per-thread staging size; a positive multiple of 8 so words never straddle chunks.
    pub chunk_bytes: usize,
    /// Memory that must stay available after the resident copy and the mapping's page cache.
    pub memory_margin_bytes: u64,
}

impl Default for CpuProbeConfig {
    fn default() -> Self {
        CpuProbeConfig {
            threads: std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
            warmup_passes: 1,
            passes: 5,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            memory_margin_bytes: DEFAULT_MEMORY_MARGIN_BYTES,
        }
    }
}

impl CpuProbeConfig {
    fn validate(&self) -> Result<(), ProbeError> {
        let bad = |field, problem: &str| {
            Err(ProbeError::Config {
                field,
                problem: problem.to_owned(),
            })
        };
        super::check_passes(self.warmup_passes, self.passes)?;
        if self.chunk_bytes == 0 || !self.chunk_bytes.is_multiple_of(8) {
            return bad("chunk_bytes", "must be a positive multiple of 8");
        }
        if self.chunk_bytes.checked_mul(self.threads.get()).is_none() {
            return bad("chunk_bytes", "times threads overflows usize");
        }
        Ok(())
    }
}

/// Wrapping sum of the little-endian `u64` words of `bytes`; a final partial word is zero-padded.
///
/// Eight independent accumulators keep the adds off the critical path so that the loop is bound by
/// memory bandwidth; the caller checks the result, so the reads cannot be elided.
pub fn sum_words(bytes: &[u8]) -> u64 {
    const LANES: usize = 8;
    let mut acc = [0u64; LANES];
    let (blocks, rest) = bytes.as_chunks::<{ 8 * LANES }>();
    for block in blocks {
        let (words, _) = block.as_chunks::<8>();
        for (lane, word) in acc.iter_mut().zip(words) {
            *lane = lane.wrapping_add(u64::from_le_bytes(*word));
        }
    }
    let (words, tail) = rest.as_chunks::<8>();
    let mut last = [0u8; 8];
    last[..tail.len()].copy_from_slice(tail);
    acc.into_iter()
        .chain(words.iter().map(|w| u64::from_le_bytes(*w)))
        .chain([u64::from_le_bytes(last)])
        .fold(0u64, u64::wrapping_add)
}

/// Runs the CPU probe over `paths` (the store's tensor files; zero-length files add nothing to `W`).
///
/// The files are mapped read-only and shared; another process truncating one while the probe runs makes
/// the read fault, and rewriting one is reported as [`ProbeError::ChecksumMismatch`].
///
/// # Errors
/// Invalid configuration, an empty file set, open/map/`mincore` failures naming the file, and checksum
/// disagreement between passes. An arm that cannot be set up (no room for the resident copy or the
/// staging buffers) is not an error: it is reported unavailable with its reason.
pub fn probe_cpu(paths: &[PathBuf], config: &CpuProbeConfig) -> Result<ProbeReport, ProbeError> {
    config.validate()?;
    let files = map_files(paths)?;
    let regions: Vec<&[u8]> = files.iter().map(|f| &f.map[..]).collect();
    let w: u64 = regions.iter().map(|r| r.len() as u64).sum();
    let threads = config.threads.get();
    let chunk = config.chunk_bytes;
    let staging_bytes = (chunk * threads) as u64; // validated not to overflow

    let residency_at_start = mapped_residency(&files)?;
    let mem_available = mem_available_bytes();
    let resident = resident_fits(w, staging_bytes, mem_available, config.memory_margin_bytes)
        .and_then(|()| make_resident(&regions, chunk, threads));
    let resident_copy_seconds = resident.as_ref().ok().map(|(_, seconds)| *seconds);
    let resident = resident.map(|(copies, _)| copies);
    let resident_regions: Option<Vec<&[u8]>> = resident
        .as_ref()
        .ok()
        .map(|copies| copies.iter().map(Vec::as_slice).collect());
    let mut staging: Result<Vec<Vec<u8>>, String> = (0..threads)
        .map(|_| allocate(chunk, "per-use copy staging"))
        .collect();

    let mut passes = Passes::default();
    // Overwritten after round 0, which always runs (warmup_passes >= 1 is validated).
    let mut residency_after_one_pass_each = residency_at_start;
    for round in 0..config.warmup_passes + config.passes {
        for k in 0..Placement::ALL.len() {
            let arm = Placement::ALL[(round + k) % Placement::ALL.len()];
            let start = Instant::now();
            let sum = match (arm, &resident_regions, &mut staging) {
                (Placement::Map, _, _) => read_pass(&regions, chunk, threads),
                (Placement::Resident, Some(copies), _) => read_pass(copies, chunk, threads),
                (Placement::PerUseCopy, _, Ok(stages)) => copy_pass(&regions, chunk, stages),
                _ => continue, // unavailable arm
            };
            let elapsed = start.elapsed().as_secs_f64();
            passes.record(arm, round, config.warmup_passes, sum, elapsed)?;
        }
        if round == 0 {
            residency_after_one_pass_each = mapped_residency(&files)?;
        }
    }
    let residency_at_end = mapped_residency(&files)?;

    let [map_s, resident_s, copy_s] = passes.seconds;
    let arm_report = |unavailable: Option<&String>, pass_seconds: Vec<f64>| ArmReport {
        rate: match unavailable {
            Some(reason) => ArmRate::unavailable(reason.clone()),
            None => ArmRate::measured(w as f64 / 1e9 / median(&pass_seconds)),
        },
        pass_seconds,
    };
    Ok(ProbeReport {
        device: "cpu".to_owned(),
        cpu_tier: Some(burn_mapped::host::cpu_tier().name().to_owned()),
        file_count: files.len(),
        working_set_bytes: w,
        threads,
        warmup_passes: config.warmup_passes,
        passes: config.passes,
        chunk_bytes: chunk,
        map: arm_report(None, map_s),
        resident: arm_report(resident.as_ref().err(), resident_s),
        per_use_copy: arm_report(staging.as_ref().err(), copy_s),
        resident_copy_seconds,
        residency_at_start,
        residency_after_one_pass_each,
        residency_at_end,
        resident_coexists: resident.is_ok() && residency_after_one_pass_each.is_full(),
        mem_available_bytes: mem_available,
        checksum: passes.checksum.expect("the map arm always runs"),
    })
}

/// Whether a resident copy can sit beside the cached mapping.
///
/// The mapping's page cache needs `W` bytes too, and `MemAvailable` counts cached file pages as
/// available, so the copy coexists only if `2W + staging + margin <= MemAvailable`, whether or not the
/// files are cached yet. Without `/proc/meminfo` the coexistence pass alone decides.
fn resident_fits(
    w: u64,
    staging: u64,
    mem_available: Option<u64>,
    margin: u64,
) -> Result<(), String> {
    let Some(available) = mem_available else {
        return Ok(());
    };
    let need = w
        .saturating_mul(2)
        .saturating_add(staging)
        .saturating_add(margin);
    if need > available {
        return Err(format!(
            "does not fit: a resident copy of W = {w} B beside the mapping's {w} B of page cache, \
             {staging} B of staging and a {margin} B margin needs {need} B, but MemAvailable is \
             {available} B"
        ));
    }
    Ok(())
}

/// A zeroed buffer of `len` bytes, or why it could not be allocated.
fn allocate(len: usize, what: &str) -> Result<Vec<u8>, String> {
    let mut buffer = Vec::new();
    buffer
        .try_reserve_exact(len)
        .map_err(|e| format!("allocating {len} B of {what} failed: {e}"))?;
    buffer.resize(len, 0);
    Ok(buffer)
}

/// The one-time copy into owned memory, and its wall time (the copy only, not the allocation).
fn make_resident(
    regions: &[&[u8]],
    chunk: usize,
    threads: usize,
) -> Result<(Vec<Vec<u8>>, f64), String> {
    let mut copies = regions
        .iter()
        .map(|r| allocate(r.len(), "resident memory"))
        .collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    let pieces: Vec<(&[u8], &mut [u8])> = regions
        .iter()
        .zip(copies.iter_mut())
        .flat_map(|(src, dst)| src.chunks(chunk).zip(dst.chunks_mut(chunk)))
        .collect();
    parallel_sum(pieces, &mut vec![(); threads], &|(), (src, dst)| {
        dst.copy_from_slice(src);
        0
    });
    Ok((copies, start.elapsed().as_secs_f64()))
}

fn chunks<'a>(regions: &[&'a [u8]], chunk: usize) -> Vec<&'a [u8]> {
    regions.iter().flat_map(|r| r.chunks(chunk)).collect()
}

/// One pass reading every byte of `regions` in place.
fn read_pass(regions: &[&[u8]], chunk: usize, threads: usize) -> u64 {
    parallel_sum(chunks(regions, chunk), &mut vec![(); threads], &|(), c| {
        sum_words(c)
    })
}

/// One pass that stages every chunk into the reading thread's buffer, then reads the staged bytes.
fn copy_pass(regions: &[&[u8]], chunk: usize, stages: &mut [Vec<u8>]) -> u64 {
    parallel_sum(chunks(regions, chunk), stages, &|stage, src| {
        let staged = &mut stage[..src.len()];
        staged.copy_from_slice(src);
        sum_words(staged)
    })
}

/// Hands `items` to one scoped thread per state, first come first served, and returns the wrapping sum
/// of `work`'s results. A panic in `work` is re-raised here.
fn parallel_sum<T: Send, S: Send>(
    items: Vec<T>,
    states: &mut [S],
    work: &(impl Fn(&mut S, T) -> u64 + Sync),
) -> u64 {
    let queue = Mutex::new(items.into_iter());
    let queue = &queue;
    std::thread::scope(|scope| {
        let workers: Vec<_> = states
            .iter_mut()
            .map(|state| {
                scope.spawn(move || {
                    let mut acc = 0u64;
                    loop {
                        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                        let Some(item) = next else { return acc };
                        acc = acc.wrapping_add(work(state, item));
                    }
                })
            })
            .collect();
        workers.into_iter().fold(0u64, |acc, worker| {
            let sum = worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            acc.wrapping_add(sum)
        })
    })
}

/// `MemAvailable` in bytes, where the platform reports it.
fn mem_available_bytes() -> Option<u64> {
    if cfg!(target_os = "linux") {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| parse_mem_available(&text))
    } else {
        None
    }
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let rest = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let mut fields = rest.split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        _ => None,
    }
}

// Unit tests for private helpers; the public probe is tested in tests/probe_cpu.rs.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mem_available_in_kib() {
        let text = "MemTotal:       24542340 kB\nMemFree:        21834000 kB\n\
                    MemAvailable:   22839472 kB\nBuffers:            2048 kB\n";
        assert_eq!(parse_mem_available(text), Some(22_839_472 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 12 MB\n"), None);
    }

    #[test]
    fn resident_needs_room_for_both_representations() {
        let gib = 1u64 << 30;
        assert!(resident_fits(4 * gib, 0, Some(9 * gib), gib).is_ok());
        let err = resident_fits(4 * gib, 0, Some(9 * gib - 1), gib).unwrap_err();
        assert!(err.contains("MemAvailable"), "{err}");
        assert!(resident_fits(u64::MAX, 0, None, gib).is_ok());
    }

    #[test]
    fn every_item_is_worked_exactly_once_across_threads() {
        let items: Vec<u64> = (1..=1000).collect();
        let sum = parallel_sum(items, &mut [(), (), ()], &|(), x| x);
        assert_eq!(sum, 1000 * 1001 / 2);
    }
}
