//! Endpoint probes: how fast can this device read the whole working set through each endpoint?
//!
//! A probe reads every byte of `W` (the store's tensor files, whatever their format) per pass through the
//! three endpoints of [`crate::select`], and watches page-cache residency of the mapping with `mincore`.
//! Rates are measured over the whole deployed working set, never a smaller buffer: a resident arm smaller
//! than `W` measures cache residency instead and overstates the endpoint (paper §6.1, §8.1).
//!
//! [`cpu::probe_cpu`] measures host memory; [`burn_device::probe_device`] measures what this project's
//! loader placements do on a Burn device (wgpu, vulkan); the CUDA probe is the separate
//! `cuda_probe` binary (cargo feature `cuda-probe`).

pub mod burn_device;
pub mod cpu;
#[cfg(feature = "cuda-probe")]
pub mod cuda;
#[cfg(feature = "vulkan-probe")]
pub mod vulkan;

use std::io;
use std::path::{Path, PathBuf};

use burn_mapped::Placement;
use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::select::{ArmRate, SelectInput};

pub use cpu::{CpuProbeConfig, probe_cpu};

/// Page-cache residency of a set of mappings, as counted by `mincore`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Residency {
    pub resident_pages: u64,
    pub total_pages: u64,
}

impl Residency {
    /// Fraction of pages resident; an empty set counts as fully resident.
    pub fn fraction(&self) -> f64 {
        if self.total_pages == 0 {
            1.0
        } else {
            self.resident_pages as f64 / self.total_pages as f64
        }
    }

    /// Every page is in the page cache.
    pub fn is_full(&self) -> bool {
        self.resident_pages == self.total_pages
    }

    fn add(self, other: Residency) -> Residency {
        Residency {
            resident_pages: self.resident_pages + other.resident_pages,
            total_pages: self.total_pages + other.total_pages,
        }
    }
}

/// One arm's measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArmReport {
    /// Median-pass rate over `W`, or why the arm could not run.
    pub rate: ArmRate,
    /// Seconds of each measured pass in run order; warm-up passes are not included.
    pub pass_seconds: Vec<f64>,
}

/// Everything one probe run measured; [`ProbeReport::select_input`] feeds the rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// The device probed, e.g. `"cpu"`.
    pub device: String,
    /// On the CPU, the tier of kernels this process runs (the best this CPU runs, or
    /// `BURN_MAPPED_CPU`'s); the probe itself reads bytes, the same on every tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_tier: Option<String>,
    pub file_count: usize,
    /// `W`: total bytes of the probed files, each counted once per pass.
    pub working_set_bytes: u64,
    pub threads: usize,
    pub warmup_passes: usize,
    pub passes: usize,
    /// Size of one unit of work; also the per-thread staging buffer of the per-use copy arm.
    pub chunk_bytes: usize,
    pub map: ArmReport,
    pub resident: ArmReport,
    pub per_use_copy: ArmReport,
    /// Wall time of the one-time copy into owned memory (excluded from the resident rate).
    pub resident_copy_seconds: Option<f64>,
    /// Residency of the mapping before the probe read anything (a cold cache shows here).
    pub residency_at_start: Residency,
    /// Residency after one pass of every arm, with the resident copy alive: the coexistence test.
    pub residency_after_one_pass_each: Residency,
    /// Residency after all measured passes.
    pub residency_at_end: Residency,
    /// The resident copy was allocated and the mapping was still fully cached after one pass of every arm.
    pub resident_coexists: bool,
    /// `MemAvailable` from `/proc/meminfo` before the resident copy was allocated, if readable.
    pub mem_available_bytes: Option<u64>,
    /// Wrapping sum of the working set's little-endian u64 words; every pass of every arm read it.
    pub checksum: u64,
}

impl ProbeReport {
    /// The measurement of one endpoint.
    pub fn arm(&self, endpoint: Placement) -> &ArmReport {
        match endpoint {
            Placement::Map => &self.map,
            Placement::Resident => &self.resident,
            Placement::PerUseCopy => &self.per_use_copy,
        }
    }

    /// The rule's input. Capacity is left to the probe's own fit test: a resident arm that did not fit is
    /// already unavailable with its reason.
    pub fn select_input(&self) -> SelectInput {
        SelectInput {
            working_set_bytes: self.working_set_bytes,
            map: self.map.rate.clone(),
            resident: self.resident.rate.clone(),
            per_use_copy: self.per_use_copy.rate.clone(),
            resident_capacity_bytes: None,
            resident_coexists: self.resident_coexists,
            mapping_stays_resident: self.residency_at_end.is_full(),
        }
    }
}

/// Opens one file of the working set: a regular file, not through a link, without blocking.
pub(crate) fn open_probed(path: &std::path::Path) -> Result<std::fs::File, ProbeError> {
    burn_mapped::untrusted::open_regular(path, burn_mapped::untrusted::Links::Refuse).map_err(
        |source| ProbeError::Open {
            path: path.to_path_buf(),
            source,
        },
    )
}

/// Most warm-up or measured passes per arm a probe takes: far past any useful median, and small
/// enough that pass counts and per-pass arrays can never overflow.
pub const MAX_PASSES: usize = 1000;

/// Checks a probe's pass counts: each between 1 and [`MAX_PASSES`] (the first warm-up pass is
/// also the coexistence pass).
///
/// # Errors
/// [`ProbeError::Config`] naming the count.
pub fn check_passes(warmup_passes: usize, passes: usize) -> Result<(), ProbeError> {
    for (field, n) in [("warmup_passes", warmup_passes), ("passes", passes)] {
        if !(1..=MAX_PASSES).contains(&n) {
            return Err(ProbeError::Config {
                field,
                problem: format!("is {n}, must be between 1 and {MAX_PASSES}"),
            });
        }
    }
    Ok(())
}

/// Probe failures that stop a whole run (an arm that merely cannot run is reported as unavailable).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no files to probe")]
    NoFiles,
    #[error("the {count} files to probe hold 0 bytes")]
    EmptyWorkingSet { count: usize },
    #[error("cannot open {}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot map {}", path.display())]
    Map { path: PathBuf, source: io::Error },
    #[error("cannot read the store manifest in {}", dir.display())]
    Manifest {
        dir: PathBuf,
        source: Box<burn_mapped::StoreError>,
    },
    #[error(
        "{} is {found} bytes, but the store's manifest gives it {expected}; run `burn-mapped verify`",
        path.display()
    )]
    Size {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("the {device} device failed the probe's read: {message}")]
    Device { device: String, message: String },
    #[error("mincore failed on the mapping of {}", path.display())]
    Residency { path: PathBuf, source: io::Error },
    #[error("probe setting `{field}` {problem}")]
    Config {
        field: &'static str,
        problem: String,
    },
    #[error(
        "{arm} pass {pass} read checksum {found:#018x}, expected {expected:#018x}: \
         the files changed during the probe"
    )]
    ChecksumMismatch {
        arm: &'static str,
        pass: usize,
        expected: u64,
        found: u64,
    },
}

/// What the timed passes have measured so far: each arm's seconds per pass past the warm-up
/// (indexed by the arm's discriminant: `Placement::ALL` is in declaration order), and the
/// checksum every pass of every arm must read.
#[derive(Default)]
pub(crate) struct Passes {
    pub(crate) seconds: [Vec<f64>; 3],
    /// The first read's checksum, or one known before the passes.
    pub(crate) checksum: Option<u64>,
}

impl Passes {
    /// Records `arm`'s read in pass `round`, `sum` in `elapsed` seconds: kept once `round` is past
    /// the `warmup` passes, an error where `sum` is not the checksum of the reads before.
    pub(crate) fn record(
        &mut self,
        arm: Placement,
        round: usize,
        warmup: usize,
        sum: u64,
        elapsed: f64,
    ) -> Result<(), ProbeError> {
        let expected = *self.checksum.get_or_insert(sum);
        if sum != expected {
            return Err(ProbeError::ChecksumMismatch {
                arm: arm.label(),
                pass: round,
                expected,
                found: sum,
            });
        }
        if round >= warmup {
            self.seconds[arm as usize].push(elapsed);
        }
        Ok(())
    }
}

/// One probed file: its path and a read-only shared mapping of all of it.
pub(crate) struct MappedFile {
    pub(crate) path: PathBuf,
    pub(crate) map: Mmap,
}

/// The length of `file`, opened from `path`.
fn probed_len(file: &std::fs::File, path: &Path) -> Result<u64, ProbeError> {
    let meta = file.metadata().map_err(|source| ProbeError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(meta.len())
}

/// Maps every non-empty file read-only and shared.
///
/// The mappings are only read. Another process truncating a file while it is mapped makes reads fault
/// (SIGBUS), and rewriting it changes what is read; the probe's checksum cross-check reports the latter.
pub(crate) fn map_files(paths: &[PathBuf]) -> Result<Vec<MappedFile>, ProbeError> {
    if paths.is_empty() {
        return Err(ProbeError::NoFiles);
    }
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let file = open_probed(path)?;
        let len = probed_len(&file, path)?;
        if len == 0 {
            continue; // contributes no bytes to W
        }
        // SAFETY: read-only shared mapping that this process never writes; concurrent modification by
        // others is the documented hazard of this function (see above), detected by the checksum.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| ProbeError::Map {
            path: path.clone(),
            source,
        })?;
        files.push(MappedFile {
            path: path.clone(),
            map,
        });
    }
    if files.is_empty() {
        return Err(ProbeError::EmptyWorkingSet { count: paths.len() });
    }
    Ok(files)
}

/// Residency of the page-cache pages behind `files`' mappings.
pub(crate) fn mapped_residency(files: &[MappedFile]) -> Result<Residency, ProbeError> {
    files.iter().try_fold(Residency::default(), |acc, f| {
        mapping_residency(&f.map)
            .map(|r| acc.add(r))
            .map_err(|source| ProbeError::Residency {
                path: f.path.clone(),
                source,
            })
    })
}

/// Residency of `paths` in the page cache, measured through fresh mappings without touching a page.
///
/// # Errors
/// Open, map and `mincore` failures, naming the file; an empty set of paths.
pub fn file_residency(paths: &[PathBuf]) -> Result<Residency, ProbeError> {
    mapped_residency(&map_files(paths)?)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; _SC_PAGESIZE is always supported.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// `mincore` over one whole mapping.
fn mapping_residency(map: &Mmap) -> io::Result<Residency> {
    let pages = map.len().div_ceil(page_size());
    let mut bits = vec![0u8; pages];
    // SAFETY: `map` is a live mapping starting on a page boundary (offset 0) and `map.len()` bytes long;
    // `bits` holds one byte per page of that range, as mincore requires. mincore only writes `bits`.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().cast_mut().cast(),
            map.len(),
            bits.as_mut_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Residency {
        resident_pages: bits.iter().filter(|&&b| b & 1 != 0).count() as u64,
        total_pages: pages as u64,
    })
}

/// The files to probe at `dir`: for a store (a directory with a `manifest.json`), exactly the
/// tensor files its manifest names, each checked to be as long as the manifest says (so a
/// stray or swollen file in the directory is never read); for any other directory, its regular
/// files; for a file (a checkpoint read in place), the file. Sorted.
///
/// # Errors
/// A directory that cannot be listed or a manifest that cannot be read; a store file of
/// another size than its manifest entry's.
pub fn tensor_files_in(dir: &Path) -> Result<Vec<PathBuf>, ProbeError> {
    let open_err = |source| ProbeError::Open {
        path: dir.to_path_buf(),
        source,
    };
    if dir.is_file() {
        // A checkpoint read in place: the file itself.
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut files = Vec::new();
    if dir.join(burn_mapped::manifest::MANIFEST_FILE).exists() {
        let manifest = burn_mapped::Manifest::read(dir).map_err(|source| ProbeError::Manifest {
            dir: dir.to_path_buf(),
            source: Box::new(source),
        })?;
        for entry in manifest.tensors() {
            let path = burn_mapped::Manifest::file_path(dir, entry);
            let found = probed_len(&open_probed(&path)?, &path)?;
            if found != entry.padded_len() {
                return Err(ProbeError::Size {
                    path,
                    found,
                    expected: entry.padded_len(),
                });
            }
            files.push(path);
        }
    } else {
        for entry in std::fs::read_dir(dir).map_err(open_err)? {
            let entry = entry.map_err(open_err)?;
            if entry.file_type().map_err(open_err)?.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Median of a non-empty sample (mean of the middle two for even sizes).
pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}
