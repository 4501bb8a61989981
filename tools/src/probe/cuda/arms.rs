//! The three arms on the device, their passes, and the rotation that times them: map reads the
//! registered mapping across the bus, resident reads one device copy, per-use copy stages every
//! chunk through pinned memory each pass.

use std::time::Instant;

use cudarc::driver::{result, sys};

use super::config::{CudaCapabilities, CudaProbeConfig};
use super::driver::{Cuda, DeviceBuffers, PinnedBuffers, Registered, driver_error};
use super::register::{pick_flags, register};
use crate::probe::{ArmReport, MappedFile, ProbeError, ProbeReport, mapped_residency, median};
use crate::select::ArmRate;

pub(super) enum RunError {
    /// CUDA could not be brought up at all.
    Setup(String),
    /// A probe failure that stops the run (checksum disagreement).
    Probe(ProbeError),
}

pub(super) fn unavailable_arm(reason: &str) -> ArmReport {
    ArmReport {
        rate: ArmRate::unavailable(reason),
        pass_seconds: Vec::new(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Arm {
    Map,
    Resident,
    PerUseCopy,
}

pub(super) fn run_arms(
    files: &[MappedFile],
    regions: &[&[u8]],
    expected: u64,
    config: &CudaProbeConfig,
    report: &mut ProbeReport,
    caps: &mut CudaCapabilities,
) -> Result<(), RunError> {
    let cuda = Cuda::open(config, caps).map_err(RunError::Setup)?;
    report.device = format!(
        "cuda:{} {} (driver {}, cc {})",
        config.device,
        caps.name.as_deref().unwrap_or("?"),
        caps.driver_version.map_or_else(
            || "?".to_owned(),
            |v| format!("{}.{}", v / 1000, v % 1000 / 10)
        ),
        caps.compute_capability
            .map_or_else(|| "?".to_owned(), |(a, b)| format!("{a}.{b}"))
    );
    let w: u64 = report.working_set_bytes;
    let chunk = config.chunk_bytes;

    // Resident first, so its one-time copy reads the plain (unregistered) mapping as a loader
    // would. It must fit beside the staging buffers and a margin.
    let mut reasons: [Option<String>; 3] = Default::default();
    let free = result::mem_get_info().map_or(0, |(free, _)| free as u64);
    let need = w + 2 * chunk as u64 + config.device_margin_bytes;
    let resident = if need > free {
        reasons[Arm::Resident as usize] = Some(format!(
            "does not fit: W = {w} B plus {} B of staging and a {} B margin exceeds the {free} B \
             of free device memory",
            2 * chunk,
            config.device_margin_bytes
        ));
        DeviceBuffers(Vec::new())
    } else {
        let mut buffers = DeviceBuffers(Vec::with_capacity(regions.len()));
        let start = Instant::now();
        let mut failed = None;
        for region in regions {
            // SAFETY: a fresh device allocation of the region's size, freed by `buffers`.
            match unsafe { result::malloc_sync(region.len()) } {
                Ok(ptr) => {
                    buffers.0.push(ptr);
                    // SAFETY: `ptr` holds `region.len()` bytes; `region` is a live mapping.
                    if let Err(e) = unsafe { result::memcpy_htod_sync(ptr, region) } {
                        failed = Some(driver_error("copying to the resident buffer", e));
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(driver_error("allocating the resident copy", e));
                    break;
                }
            }
        }
        match failed {
            Some(reason) => {
                reasons[Arm::Resident as usize] = Some(reason);
                DeviceBuffers(Vec::new())
            }
            None => {
                report.resident_copy_seconds = Some(start.elapsed().as_secs_f64());
                buffers
            }
        }
    };

    // Map: registration flags are tested on the first file, then every file is registered.
    let mut registered = Registered(Vec::new());
    match pick_flags(regions[0], caps) {
        None => {
            reasons[Arm::Map as usize] = Some(format!(
                "cuMemHostRegister refused the read-only file mapping with every flag set: {}",
                caps.registration
                    .iter()
                    .map(|a| format!("{} -> {}", a.flags, a.result))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        Some(flags) => {
            for region in regions {
                match register(region, flags) {
                    Ok(r) => registered.0.push(r),
                    Err(e) => {
                        reasons[Arm::Map as usize] = Some(e);
                        registered = Registered(Vec::new());
                        break;
                    }
                }
            }
        }
    }

    // Per-use copy: two pinned staging slots and two device chunk buffers.
    let mut pinned = PinnedBuffers(Vec::new());
    let mut device_chunks = DeviceBuffers(Vec::new());
    let mut events: Vec<sys::CUevent> = Vec::new();
    for _ in 0..2 {
        // SAFETY: fresh allocations of `chunk` bytes, freed by their owners.
        let setup = unsafe {
            result::malloc_host(chunk, 0)
                .map(|p| pinned.0.push((p.cast(), chunk)))
                .and_then(|()| result::malloc_sync(chunk).map(|p| device_chunks.0.push(p)))
                .and_then(|()| {
                    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                        .map(|e| events.push(e))
                })
        };
        if let Err(e) = setup {
            reasons[Arm::PerUseCopy as usize] =
                Some(driver_error("allocating the staging buffers", e));
            break;
        }
    }

    let arms = [Arm::Map, Arm::Resident, Arm::PerUseCopy];
    let mut seconds: [Vec<f64>; 3] = Default::default();
    for round in 0..config.warmup_passes + config.passes {
        for k in 0..arms.len() {
            let arm = arms[(round + k) % arms.len()];
            if reasons[arm as usize].is_some() {
                continue;
            }
            let start = Instant::now();
            let pass = match arm {
                Arm::Map => read_pass(&cuda, registered.0.iter().map(|r| r.1), regions),
                Arm::Resident => read_pass(&cuda, resident.0.iter().copied(), regions),
                Arm::PerUseCopy => copy_pass(
                    &cuda,
                    regions,
                    &pinned,
                    &device_chunks,
                    &events,
                    config.threads,
                ),
            };
            let elapsed = start.elapsed().as_secs_f64();
            match pass {
                Ok(sum) if sum == expected => {
                    if round >= config.warmup_passes {
                        seconds[arm as usize].push(elapsed);
                    }
                }
                Ok(sum) => {
                    return Err(RunError::Probe(ProbeError::ChecksumMismatch {
                        arm: ["map", "resident", "per-use copy"][arm as usize],
                        pass: round,
                        expected,
                        found: sum,
                    }));
                }
                Err(reason) => reasons[arm as usize] = Some(reason),
            }
        }
        if round == 0 {
            report.residency_after_one_pass_each =
                mapped_residency(files).map_err(RunError::Probe)?;
        }
    }
    for event in events {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = result::event::destroy(event);
        }
    }

    let [map_s, resident_s, copy_s] = seconds;
    let arm_report = |reason: &Option<String>, pass_seconds: Vec<f64>| match reason {
        Some(reason) => unavailable_arm(reason),
        None => ArmReport {
            rate: ArmRate::measured(w as f64 / 1e9 / median(&pass_seconds)),
            pass_seconds,
        },
    };
    report.map = arm_report(&reasons[0], map_s);
    report.resident = arm_report(&reasons[1], resident_s);
    report.per_use_copy = arm_report(&reasons[2], copy_s);
    report.resident_coexists =
        reasons[1].is_none() && report.residency_after_one_pass_each.is_full();
    drop(registered);
    drop(resident);
    Ok(())
}

/// One pass of the kernel over device-readable copies (or registrations) of every region.
fn read_pass(
    cuda: &Cuda,
    pointers: impl Iterator<Item = sys::CUdeviceptr>,
    regions: &[&[u8]],
) -> Result<u64, String> {
    cuda.reset()?;
    for (ptr, region) in pointers.zip(regions) {
        cuda.launch(ptr, region.len())?;
    }
    cuda.finish()
}

/// One pass staging every chunk through pinned memory to the device, then reading it there.
fn copy_pass(
    cuda: &Cuda,
    regions: &[&[u8]],
    pinned: &PinnedBuffers,
    device: &DeviceBuffers,
    events: &[sys::CUevent],
    threads: usize,
) -> Result<u64, String> {
    cuda.reset()?;
    let chunks = regions.iter().flat_map(|r| r.chunks(pinned.0[0].1));
    for (k, src) in chunks.enumerate() {
        let slot = k % 2;
        let (host, _) = pinned.0[slot];
        // SAFETY: the event was recorded after the last copy out of this slot (or never).
        unsafe { result::event::synchronize(events[slot]) }
            .map_err(|e| driver_error("waiting for a staging slot", e))?;
        // SAFETY: `host` is a pinned buffer of at least `src.len()` bytes that no copy in
        // flight reads (waited above), and `src` is a live mapping.
        let dst = unsafe { std::slice::from_raw_parts_mut(host, src.len()) };
        parallel_copy(dst, src, threads);
        // SAFETY: copies `src.len()` bytes from the pinned slot into the device slot, both
        // large enough; the slot is not reused before its event completes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(device.0[slot], host.cast(), src.len(), cuda.stream)
                .result()
                .map_err(|e| driver_error("staging a chunk to the device", e))?;
        }
        cuda.launch(device.0[slot], src.len())?;
        // SAFETY: records on the probe's stream after the copy and the kernel of this slot.
        unsafe { result::event::record(events[slot], cuda.stream) }
            .map_err(|e| driver_error("recording a staging event", e))?;
    }
    cuda.finish()
}

/// `dst.copy_from_slice(src)` split over `threads` threads.
fn parallel_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let piece = src
        .len()
        .div_ceil(threads.max(1))
        .next_multiple_of(4096)
        .max(4096);
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_copy_copies_every_byte() {
        let src: Vec<u8> = (0..100_003u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        parallel_copy(&mut dst, &src, 3);
        assert_eq!(dst, src);
    }
}
