//! The Burn-device probe on Flex (and on the wgpu adapter, with `gpu-tests`): every arm runs
//! over all of W and reads what a plain word-by-word sum says the files hold. No timing is
//! asserted.

use std::path::PathBuf;

use burn::tensor::Device;
use burn_mapped_tests::synthetic::{pattern, write_file};
use burn_mapped_tools::probe::burn_device::{BurnProbeConfig, probe_on};
use burn_mapped_tools::select::ArmRate;

/// Each file's little-endian i32 words summed with wrap-around (Burn's integer sum keeps the
/// input's 32 bits), sign-extended, then added across files with wrap-around.
fn reference(files: &[Vec<u8>]) -> u64 {
    files.iter().fold(0u64, |acc, bytes| {
        let sum = bytes
            .chunks_exact(4)
            .map(|w| i32::from_le_bytes(w.try_into().unwrap()))
            .fold(0i32, i32::wrapping_add);
        acc.wrapping_add(i64::from(sum) as u64)
    })
}

/// An arm that ran and read at a positive rate.
fn assert_measured(name: &str, rate: &ArmRate) {
    assert!(
        matches!(rate, ArmRate::Measured { gbps } if *gbps > 0.0),
        "{name}: {rate:?}"
    );
}

#[test]
fn every_arm_reads_all_words_of_every_file_on_flex() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // A 3-byte tail that is not a whole word, and an empty file that adds nothing.
    let contents = [
        pattern(256 << 10, 1),
        pattern((64 << 10) + 3, 2),
        Vec::new(),
    ];
    let paths: Vec<PathBuf> = contents
        .iter()
        .enumerate()
        .map(|(i, c)| write_file(tmp.path(), &format!("{i}.tensor"), c))
        .collect();
    let config = BurnProbeConfig {
        warmup_passes: 1,
        passes: 3,
    };
    let report = probe_on(&Device::flex(), "cpu", &paths, &config).unwrap();

    assert_eq!(report.file_count, 2);
    assert_eq!(report.working_set_bytes, (256 << 10) + (64 << 10));
    let whole_words: Vec<Vec<u8>> = contents
        .iter()
        .map(|c| c[..c.len() / 4 * 4].to_vec())
        .collect();
    assert_eq!(report.checksum, reference(&whole_words));
    for (name, arm) in [
        ("map", &report.map),
        ("resident", &report.resident),
        ("per-use copy", &report.per_use_copy),
    ] {
        assert_measured(name, &arm.rate);
        assert_eq!(arm.pass_seconds.len(), 3, "{name}");
    }
    assert!(report.residency_at_end.is_full());
    assert!(report.resident_coexists);
}

#[test]
fn rejects_zero_passes_and_wordless_files() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let tiny = write_file(tmp.path(), "tiny", &[1, 2, 3]);
    let zero = BurnProbeConfig {
        warmup_passes: 1,
        passes: 0,
    };
    assert!(matches!(
        probe_on(&Device::flex(), "cpu", std::slice::from_ref(&tiny), &zero),
        Err(burn_mapped_tools::probe::ProbeError::Config { .. })
    ));
    assert!(matches!(
        probe_on(&Device::flex(), "cpu", &[tiny], &BurnProbeConfig::default()),
        Err(burn_mapped_tools::probe::ProbeError::EmptyWorkingSet { count: 1 })
    ));
}

/// On the wgpu adapter (lavapipe in CI, whose bindings hold 128 MiB), a file wider than the
/// device's largest binding: the probe reads it in pieces that each bind, and every arm sums
/// every word (each piece's 32-bit sum sign-extended, as the probe adds them), where reading
/// the whole file as one tensor failed the device.
#[cfg(feature = "gpu-tests")]
#[test]
fn a_file_wider_than_the_devices_binding_is_read_in_pieces() {
    let Some(device) = burn_mapped_tests::gpu::wgpu_device() else {
        return;
    };
    let Some(binding) = burn_mapped::placement::max_binding(&device) else {
        panic!("a wgpu device reports its largest binding");
    };
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let bytes = pattern(binding as usize + (4 << 10) + 3, 7);
    let path = write_file(tmp.path(), "wide.tensor", &bytes);
    let config = BurnProbeConfig {
        warmup_passes: 1,
        passes: 1,
    };
    let report = probe_on(&device, "wgpu", &[path], &config).expect("the probe reads in pieces");
    assert_eq!(report.file_count, 1);
    assert_eq!(report.working_set_bytes, bytes.len() as u64 / 4 * 4);
    let pieces: Vec<Vec<u8>> = bytes[..bytes.len() / 4 * 4]
        .chunks(binding as usize)
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(pieces.len(), 2);
    assert_eq!(report.checksum, reference(&pieces));
    assert_measured("resident", &report.resident.rate);
    assert_measured("per-use copy", &report.per_use_copy.rate);
}
