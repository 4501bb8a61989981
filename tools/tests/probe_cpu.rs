//! The CPU probe on small files: it runs, reads every byte (checksum against an independent byte-wise
//! reference), and reports page-cache residency. No timing is asserted.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};

use burn_mapped_tests::synthetic::{pattern, write_file};
use burn_mapped_tools::probe::cpu::sum_words;
use burn_mapped_tools::probe::{
    CpuProbeConfig, ProbeError, file_residency, probe_cpu, tensor_files_in,
};
use burn_mapped_tools::select::ArmRate;
use common::{scratch, small_probe_config};

/// Wrapping sum of little-endian u64 words, computed byte by byte: byte `i` contributes `b << 8 (i % 8)`,
/// and within a word those contributions never carry into each other, so this equals the word sum.
fn reference_sum(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0u64, |total, (i, &b)| {
        total.wrapping_add(u64::from(b) << (8 * (i % 8)))
    })
}

fn small_config() -> CpuProbeConfig {
    small_probe_config(3)
}

#[test]
fn sum_words_matches_the_bytewise_reference_at_every_length() {
    let bytes = pattern(4096 + 77, 1);
    for len in (0..300).chain([4095, 4096, 4096 + 77]) {
        assert_eq!(
            sum_words(&bytes[..len]),
            reference_sum(&bytes[..len]),
            "len {len}"
        );
    }
}

#[test]
fn probe_reads_every_byte_of_every_file_through_all_three_arms() {
    let dir = scratch();
    let contents = [
        pattern((1 << 20) + 5, 2),
        pattern(64 << 10, 3),
        Vec::new(),
        pattern(123_457, 4),
    ];
    let paths: Vec<PathBuf> = contents
        .iter()
        .enumerate()
        .map(|(i, c)| write_file(dir.path(), &format!("t{i}.bin"), c))
        .collect();

    let report = probe_cpu(&paths, &small_config()).unwrap();

    let w: usize = contents.iter().map(Vec::len).sum();
    assert_eq!(report.working_set_bytes, w as u64);
    assert_eq!(report.file_count, 3, "the empty file adds nothing");
    let expected = contents
        .iter()
        .fold(0u64, |acc, c| acc.wrapping_add(reference_sum(c)));
    assert_eq!(report.checksum, expected);
    for (name, arm) in [
        ("map", &report.map),
        ("resident", &report.resident),
        ("copy", &report.per_use_copy),
    ] {
        let ArmRate::Measured { gbps } = arm.rate else {
            panic!("{name} did not run: {:?}", arm.rate);
        };
        assert!(gbps.is_finite() && gbps > 0.0, "{name}: {gbps}");
        assert_eq!(arm.pass_seconds.len(), 3, "{name}");
    }
    // Freshly written files are in the page cache from the start and stay there.
    assert!(report.residency_at_start.is_full(), "{report:?}");
    assert!(report.residency_at_end.is_full());
    assert!(report.resident_coexists);
    let input = report.select_input();
    assert!(input.mapping_stays_resident && input.resident_coexists);
    assert_eq!(input.working_set_bytes, w as u64);

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["map"]["rate"]["status"], "measured");
}

#[cfg(target_os = "linux")]
fn is_tmpfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statfs is a plain C struct of integers, for which all-zero bytes are a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and stat is a valid, writable statfs.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    rc == 0 && stat.f_type as i64 == TMPFS_MAGIC
}

#[cfg(target_os = "linux")]
#[test]
fn an_evicted_file_shows_partial_residency_until_the_probe_reads_it() {
    use std::os::fd::AsRawFd;

    let dir = scratch();
    let path = write_file(dir.path(), "cold.bin", &pattern(4 << 20, 5));
    let file = File::open(&path).unwrap();
    file.sync_all().unwrap(); // dirty pages cannot be dropped
    // SAFETY: the descriptor is open for the whole call; fadvise only gives the kernel a hint.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);

    let before = file_residency(std::slice::from_ref(&path)).unwrap();
    if before.is_full() && is_tmpfs(dir.path()) {
        eprintln!("skipped: tmpfs ignores POSIX_FADV_DONTNEED, so nothing could be evicted");
        return;
    }
    assert!(before.fraction() < 1.0, "eviction left {before:?}");

    let report = probe_cpu(std::slice::from_ref(&path), &small_config()).unwrap();
    assert!(!report.residency_at_start.is_full(), "{report:?}");
    assert!(report.residency_at_end.is_full());
}

#[test]
fn tensor_files_are_a_stores_own_files_or_a_directorys_regular_files() {
    // A directory that is not a store: its regular files.
    let dir = scratch();
    let b = write_file(dir.path(), "b.bin", b"b");
    let a = write_file(dir.path(), "a.bin", b"a");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    assert_eq!(tensor_files_in(dir.path()).unwrap(), vec![a, b]);
    // A store: exactly the files its manifest names, whatever else the directory holds.
    let store = dir.path().join("store");
    let mut writer = burn_mapped::StoreWriter::create(&store).unwrap();
    for name in ["x", "y"] {
        writer
            .add(
                burn_mapped::TensorSpec::new(name, burn::tensor::DType::U8, [3]),
                &[1, 2, 3],
            )
            .unwrap();
    }
    let manifest = writer.finish().unwrap();
    write_file(&store, "stray.bin", b"not part of it");
    let expected: Vec<PathBuf> = manifest
        .tensors()
        .iter()
        .map(|t| store.join(t.file()))
        .collect();
    assert_eq!(tensor_files_in(&store).unwrap(), expected);
}

#[test]
fn rejects_an_empty_file_set() {
    assert!(matches!(
        probe_cpu(&[], &small_config()),
        Err(ProbeError::NoFiles)
    ));
    let dir = scratch();
    let empty = write_file(dir.path(), "empty.bin", b"");
    assert!(matches!(
        probe_cpu(&[empty], &small_config()),
        Err(ProbeError::EmptyWorkingSet { count: 1 })
    ));
}

#[test]
fn rejects_a_missing_file_naming_it() {
    let missing = PathBuf::from("/nonexistent/burn-mapped/w.bin");
    match probe_cpu(std::slice::from_ref(&missing), &small_config()) {
        Err(ProbeError::Open { path, .. }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rejects_invalid_settings() {
    let dir = scratch();
    let path = write_file(dir.path(), "x.bin", &pattern(100, 6));
    let paths = [path];
    let cases = [
        (
            CpuProbeConfig {
                passes: 0,
                ..small_config()
            },
            "passes",
        ),
        (
            CpuProbeConfig {
                warmup_passes: 0,
                ..small_config()
            },
            "warmup_passes",
        ),
        (
            CpuProbeConfig {
                chunk_bytes: 12,
                ..small_config()
            },
            "chunk_bytes",
        ),
    ];
    for (config, expected) in cases {
        match probe_cpu(&paths, &config) {
            Err(ProbeError::Config { field, .. }) => assert_eq!(field, expected),
            other => panic!("{expected}: {other:?}"),
        }
    }
}
