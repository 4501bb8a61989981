//! The CUDA probe where this machine has no NVIDIA driver (CI): every arm is reported
//! unavailable with the reason, the host checksum is still computed, and the rule refuses to
//! pick an endpoint instead of guessing. Where a driver is present, every arm must measure and
//! agree with the host's own sum.
#![cfg(feature = "cuda-probe")]

use std::io::Write;
use std::path::PathBuf;

use burn_mapped_tools::cli::select::parse_probe_report;
use burn_mapped_tools::probe::cpu::sum_words;
use burn_mapped_tools::probe::cuda::{CudaProbeConfig, probe_cuda};
use burn_mapped_tools::probe::vulkan::probe_vulkan;
use burn_mapped_tools::select::{ArmRate, SelectError, select};

fn files(dir: &std::path::Path) -> (Vec<PathBuf>, u64) {
    let mut paths = Vec::new();
    let mut sum = 0u64;
    for (i, len) in [256usize << 10, (64 << 10) + 8].into_iter().enumerate() {
        let bytes: Vec<u8> = (0..len)
            .map(|j| (j as u8).wrapping_mul(13) ^ i as u8)
            .collect();
        let path = dir.join(format!("{i}.tensor"));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        sum = sum.wrapping_add(sum_words(&bytes));
        paths.push(path);
    }
    (paths, sum)
}

fn config() -> CudaProbeConfig {
    CudaProbeConfig {
        passes: 2,
        chunk_bytes: 64 << 10,
        threads: 2,
        device_margin_bytes: 0,
        ..CudaProbeConfig::default()
    }
}

#[test]
fn reports_every_arm_with_a_rate_or_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let (paths, expected) = files(tmp.path());
    let result = probe_cuda(&paths, &config()).unwrap();
    let report = &result.probe;
    assert_eq!(report.working_set_bytes, (256 << 10) + (64 << 10) + 8);
    assert_eq!(report.checksum, expected, "the host reference checksum");
    let arms = [&report.map, &report.resident, &report.per_use_copy];
    match &result.cuda_unavailable {
        Some(reason) => {
            for arm in arms {
                assert_eq!(arm.rate, ArmRate::unavailable(reason.clone()));
            }
            let err = select(&report.select_input(), 0.05).unwrap_err();
            assert!(
                matches!(err, SelectError::NoEndpointRemains { .. }),
                "{err}"
            );
        }
        None => {
            for arm in [&report.resident, &report.per_use_copy] {
                assert!(
                    matches!(arm.rate, ArmRate::Measured { .. }),
                    "{:?}",
                    arm.rate
                );
            }
            assert!(!result.cuda.registration.is_empty());
        }
    }
    // What `cuda_probe` prints is what `select --from` reads.
    let json = serde_json::json!({ "probe": report, "cuda": result.cuda, "verdict": null });
    assert_eq!(&parse_probe_report(&json.to_string()).unwrap(), report);
}

#[test]
fn no_driver_means_unavailable_not_a_panic() {
    // SAFETY: only tries to dlopen the driver library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("libcuda is present here; the no-driver path is covered where it is absent");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (paths, _) = files(tmp.path());
    let result = probe_cuda(&paths, &config()).unwrap();
    let reason = result.cuda_unavailable.expect("no driver");
    assert!(reason.contains("libcuda"), "{reason}");
}

#[test]
fn vulkan_probe_reports_instead_of_failing() {
    let tmp = tempfile::tempdir().unwrap();
    let (paths, _) = files(tmp.path());
    let report = probe_vulkan(&paths).unwrap();
    eprintln!("{}", report.summary());
    match &report.unavailable {
        Some(reason) => assert!(report.devices.is_empty(), "{reason}"),
        None => {
            for d in &report.devices {
                if d.external_memory_host && d.import_not_tried.is_none() {
                    assert_eq!(d.mapping_imports_tried, paths.len(), "{d:?}");
                }
            }
        }
    }
}
