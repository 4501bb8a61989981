//! The CUDA endpoint probe, on the `cudarc` driver bindings with `libcuda` loaded at run time
//! (so it builds without CUDA and reports, rather than panics, where there is no driver).
//!
//! - **map**: every file's read-only shared mapping is registered with `cuMemHostRegister`
//!   (the flags are tried, not assumed: a `PROT_READ` file mapping can only be registered with
//!   `CU_MEMHOSTREGISTER_READ_ONLY`, and some drivers refuse file-backed memory altogether) and
//!   a kernel reads it in place through its device pointer, across the bus;
//! - **resident**: one device allocation per file, filled once with `cuMemcpyHtoD` from the
//!   mapping (timed separately), then read by the kernel every pass;
//! - **per-use copy**: every pass stages every chunk of the mapping into a pinned host buffer
//!   (parallel `memcpy`), copies it to a device chunk buffer and reads it there; two slots
//!   alternate so that the host copy of one chunk overlaps the device work of the previous one.
//!
//! The kernel ([`SUM_WORDS_PTX`], hand-written PTX JIT-compiled by the driver, so no NVRTC is
//! needed) sums 64-bit words; every pass of every arm must reproduce the host's own
//! [`sum_words`] of the files. Warm-up rounds are discarded, the rate is `W` (counted once) over
//! the median pass, and the arm order rotates per round.
//!
//! Here: [`probe_cuda`] and the host's reference checksum. `config.rs` holds what the probe
//! takes and reports, `driver.rs` the context, kernel and memory owners, `register.rs` the host
//! registration of the mappings, `arms.rs` the passes and their timing.

mod arms;
mod config;
mod driver;
mod register;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use cudarc::driver::sys;

use super::cpu::sum_words;
use super::{ProbeError, ProbeReport, map_files, mapped_residency};
use crate::select::ArmRate;
use arms::{RunError, run_arms, unavailable_arm};
pub use config::{CudaCapabilities, CudaProbe, CudaProbeConfig, RegistrationAttempt};
pub use driver::SUM_WORDS_PTX;

/// Runs the CUDA probe over `paths`.
///
/// Missing `libcuda`, a driver that fails to initialise, or any CUDA failure inside an arm is
/// reported in the result (the arm or every arm unavailable, with the reason), never as a panic.
///
/// # Errors
/// Invalid configuration, files that cannot be opened or mapped, and a checksum that disagrees
/// with the host's own sum (wrong kernel or files changed).
pub fn probe_cuda(paths: &[PathBuf], config: &CudaProbeConfig) -> Result<CudaProbe, ProbeError> {
    crate::probe::check_passes(config.warmup_passes, config.passes)?;
    if config.chunk_bytes == 0 || !config.chunk_bytes.is_multiple_of(16) {
        return Err(ProbeError::Config {
            field: "chunk_bytes",
            problem: "must be a positive multiple of 16".to_owned(),
        });
    }
    let files = map_files(paths)?;
    let regions: Vec<&[u8]> = files
        .iter()
        .map(|f| &f.map[..f.map.len() / 8 * 8])
        .collect();
    let w: u64 = regions.iter().map(|r| r.len() as u64).sum();
    if w == 0 {
        return Err(ProbeError::EmptyWorkingSet { count: paths.len() });
    }
    let residency_at_start = mapped_residency(&files)?;
    let expected = host_checksum(&regions, config.threads.max(1));

    let mut report = ProbeReport {
        device: format!("cuda:{}", config.device),
        cpu_tier: None,
        file_count: files.len(),
        working_set_bytes: w,
        threads: config.threads,
        warmup_passes: config.warmup_passes,
        passes: config.passes,
        chunk_bytes: config.chunk_bytes,
        map: unavailable_arm("not run"),
        resident: unavailable_arm("not run"),
        per_use_copy: unavailable_arm("not run"),
        resident_copy_seconds: None,
        residency_at_start,
        residency_after_one_pass_each: residency_at_start,
        residency_at_end: residency_at_start,
        resident_coexists: false,
        mem_available_bytes: None,
        checksum: expected,
    };
    let mut caps = CudaCapabilities::default();

    // SAFETY: `is_culib_present` only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        let reason = "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver";
        mark_all(&mut report, reason);
        return Ok(CudaProbe {
            probe: report,
            cuda: caps,
            cuda_unavailable: Some(reason.to_owned()),
        });
    }
    let run = catch_unwind(AssertUnwindSafe(|| {
        run_arms(&files, &regions, expected, config, &mut report, &mut caps)
    }));
    let cuda_unavailable = match run {
        Ok(Ok(())) => None,
        Ok(Err(RunError::Setup(reason))) => {
            mark_all(&mut report, &reason);
            Some(reason)
        }
        Ok(Err(RunError::Probe(e))) => return Err(e),
        Err(panic) => {
            let reason = format!("the CUDA bindings panicked: {}", panic_message(&*panic));
            mark_all(&mut report, &reason);
            Some(reason)
        }
    };
    report.residency_at_end = mapped_residency(&files)?;
    Ok(CudaProbe {
        probe: report,
        cuda: caps,
        cuda_unavailable,
    })
}

fn mark_all(report: &mut ProbeReport, reason: &str) {
    for arm in [
        &mut report.map,
        &mut report.resident,
        &mut report.per_use_copy,
    ] {
        if !matches!(arm.rate, ArmRate::Measured { .. }) {
            *arm = unavailable_arm(reason);
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// The host's own checksum of whole 8-byte words, in `threads` threads.
fn host_checksum(regions: &[&[u8]], threads: usize) -> u64 {
    const PIECE: usize = 16 << 20;
    let pieces: Vec<&[u8]> = regions.iter().flat_map(|r| r.chunks(PIECE)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut acc = 0u64;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(piece) = pieces.get(i) else {
                            return acc;
                        };
                        acc = acc.wrapping_add(sum_words(piece));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .fold(0u64, u64::wrapping_add)
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use super::*;

    #[test]
    fn the_shipped_kernel_is_the_one_the_probe_loads() {
        assert!(SUM_WORDS_PTX.contains(".visible .entry sum_words("));
        assert!(CString::new(SUM_WORDS_PTX).is_ok(), "no NUL inside the PTX");
    }
}
