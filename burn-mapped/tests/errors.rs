//! Every kind of bad store is a typed error naming the tensor and file, found at open time,
//! before any tensor byte is read; none faults.

mod common;

use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device};
use burn_mapped::{MappedRecorder, MappedStore, StoreError, StoreWriter, TensorSpec};
use burn_mapped_tests::synthetic::edit_manifest;
use burn_mapped_tests::tempdir;
use common::*;

fn two_tensor_store() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempdir();
    let dir = tmp.path().join("store");
    let mut w = StoreWriter::create(&dir).unwrap();
    let a: Vec<u8> = (0..24u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    w.add(TensorSpec::new("a.weight", DType::F32, [4, 6]), &a)
        .unwrap();
    w.add(TensorSpec::new("b.bias", DType::F32, [2]), &a[..8])
        .unwrap();
    w.finish().unwrap();
    (tmp, dir)
}

fn open_err(dir: &std::path::Path) -> StoreError {
    MappedStore::open(dir).expect_err("store must be rejected")
}

fn file_of(dir: &std::path::Path, tensor: &str) -> std::path::PathBuf {
    let m = burn_mapped::Manifest::read(dir).unwrap();
    dir.join(m.get(tensor).unwrap().file())
}

#[test]
fn rejects_a_missing_file() {
    let (_t, dir) = two_tensor_store();
    std::fs::remove_file(file_of(&dir, "b.bias")).unwrap();
    match open_err(&dir) {
        StoreError::MissingFile { tensor, file } => {
            assert_eq!(tensor, "b.bias");
            assert!(file.to_string_lossy().ends_with(".tensor"));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn rejects_a_file_shorter_than_its_padded_length_without_faulting() {
    let (_t, dir) = two_tensor_store();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(file_of(&dir, "a.weight"))
        .unwrap();
    f.set_len(50).unwrap();
    match open_err(&dir) {
        StoreError::ShortFile {
            tensor,
            actual,
            expected,
            ..
        } => {
            assert_eq!((tensor.as_str(), actual, expected), ("a.weight", 50, 16384));
        }
        e => panic!("{e}"),
    }
    // The recorder path checks before mapping too.
    assert!(matches!(
        MappedRecorder::default().load(&dir),
        Err(StoreError::ShortFile { .. })
    ));
}

#[test]
fn rejects_a_length_that_does_not_match_shape_and_dtype() {
    let (_t, dir) = two_tensor_store();
    edit_manifest(&dir, |v| v["tensors"][0]["len"] = 95.into());
    match open_err(&dir) {
        StoreError::LengthMismatch {
            tensor, len, file, ..
        } => {
            assert_eq!((tensor.as_str(), len), ("a.weight", 95));
            assert!(file.ends_with(".tensor"));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn rejects_a_rank_past_the_limit_by_its_rank() {
    let (_t, dir) = two_tensor_store();
    // 24 elements as nine dimensions: the length still matches the shape.
    edit_manifest(&dir, |v| {
        v["tensors"][0]["shape"] = serde_json::json!([1, 1, 1, 1, 1, 1, 1, 4, 6]);
    });
    match open_err(&dir) {
        StoreError::RankTooHigh { tensor, rank, max } => {
            assert_eq!(
                (tensor.as_str(), rank, max),
                ("a.weight", 9, burn_mapped::manifest::MAX_RANK)
            );
        }
        e => panic!("{e}"),
    }
}

#[test]
fn rejects_an_unknown_dtype() {
    let (_t, dir) = two_tensor_store();
    edit_manifest(&dir, |v| v["tensors"][1]["dtype"] = "f8e4m3".into());
    match open_err(&dir) {
        StoreError::UnknownDType { tensor, dtype, .. } => {
            assert_eq!((tensor.as_str(), dtype.as_str()), ("b.bias", "f8e4m3"));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn rejects_file_names_that_escape_the_directory() {
    for bad in [
        "../x.tensor",
        "..",
        "/etc/passwd",
        "sub/x.tensor",
        "a\\b",
        "manifest.json",
    ] {
        let (_t, dir) = two_tensor_store();
        edit_manifest(&dir, |v| v["tensors"][0]["file"] = bad.into());
        match open_err(&dir) {
            StoreError::UnsafeFileName { tensor, .. } => assert_eq!(tensor, "a.weight", "{bad}"),
            e => panic!("{bad}: {e}"),
        }
    }
}

#[test]
fn rejects_duplicate_names() {
    let (_t, dir) = two_tensor_store();
    edit_manifest(&dir, |v| v["tensors"][1]["name"] = "a.weight".into());
    match open_err(&dir) {
        StoreError::DuplicateName { tensor } => assert_eq!(tensor, "a.weight"),
        e => panic!("{e}"),
    }
}

#[test]
fn rejects_two_tensors_sharing_a_file() {
    let (_t, dir) = two_tensor_store();
    edit_manifest(&dir, |v| {
        v["tensors"][1]["file"] = v["tensors"][0]["file"].clone()
    });
    assert!(matches!(open_err(&dir), StoreError::DuplicateFile { .. }));
}

#[test]
fn rejects_an_unsupported_format_version() {
    let (_t, dir) = two_tensor_store();
    edit_manifest(&dir, |v| v["version"] = 1.into());
    match open_err(&dir) {
        StoreError::UnsupportedVersion { version, path, .. } => {
            assert_eq!(version, 1);
            assert!(path.ends_with("manifest.json"));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn rejects_a_foreign_alignment() {
    let (_t, dir) = two_tensor_store();
    edit_manifest(&dir, |v| v["alignment"] = 256.into());
    assert!(matches!(
        open_err(&dir),
        StoreError::UnsupportedAlignment { found: 256, .. }
    ));
}

#[test]
fn rejects_malformed_json_with_its_position() {
    let (_t, dir) = two_tensor_store();
    std::fs::write(dir.join("manifest.json"), b"{\"format\": \"burn-mapped\", ").unwrap();
    assert!(matches!(open_err(&dir), StoreError::ManifestSyntax { .. }));
}

#[test]
fn rejects_a_symlinked_tensor_file() {
    let (t, dir) = two_tensor_store();
    let target = file_of(&dir, "b.bias");
    let outside = t.path().join("outside.tensor");
    std::fs::rename(&target, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &target).unwrap();
    match open_err(&dir) {
        StoreError::Io { tensor, .. } => assert_eq!(tensor, "b.bias"),
        e => panic!("{e}"),
    }
}

#[test]
fn verify_reports_a_checksum_mismatch_naming_tensor_and_file() {
    let (_t, dir) = two_tensor_store();
    let path = file_of(&dir, "a.weight");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let store = MappedStore::open(&dir).unwrap();
    let problems = store.verify();
    assert_eq!(problems.len(), 1);
    match &problems[0] {
        StoreError::ChecksumMismatch { tensor, file, .. } => {
            assert_eq!(tensor, "a.weight");
            assert_eq!(file, &path);
        }
        e => panic!("{e}"),
    }
}

#[test]
fn verify_reports_dirty_padding() {
    let (_t, dir) = two_tensor_store();
    let path = file_of(&dir, "b.bias");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] = 1;
    std::fs::write(&path, &bytes).unwrap();
    let problems = MappedStore::open(&dir).unwrap().verify();
    assert!(
        matches!(&problems[..], [StoreError::DirtyPadding { tensor, .. }] if tensor == "b.bias")
    );
}

#[test]
fn rejects_a_shape_mismatch_against_the_module() {
    let (_tmp, dir, _) = recorded_net();
    // Claim a different shape for one tensor, keeping len consistent with it.
    edit_manifest(&dir, |v| {
        let t = v["tensors"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|t| t["name"] == "row.weight")
            .unwrap();
        t["shape"] = serde_json::json!([OUT, HIDDEN]);
    });
    let mut net = Net::init(&Device::flex());
    let mut store = MappedStore::open(&dir).unwrap();
    match net.load_from(&mut store) {
        Err(StoreError::ShapeMismatch {
            tensor,
            expected,
            found,
            ..
        }) => {
            assert_eq!(tensor, "row.weight");
            assert_eq!(expected, vec![HIDDEN, OUT]);
            assert_eq!(found, vec![OUT, HIDDEN]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn writer_rejects_a_wrong_byte_count() {
    let tmp = tempdir();
    let mut w = StoreWriter::create(tmp.path().join("s")).unwrap();
    let err = w
        .add(TensorSpec::new("x", DType::F32, [3]), &[0u8; 8])
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::WrongByteCount {
            expected: 12,
            actual: 8,
            ..
        }
    ));
}

#[test]
fn an_abandoned_writer_leaves_nothing_behind() {
    let tmp = tempdir();
    {
        let mut w = StoreWriter::create(tmp.path().join("s")).unwrap();
        w.add(TensorSpec::new("x", DType::F32, [1]), &[0u8; 4])
            .unwrap();
    }
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}
