//! Every kind of bad store is a typed error naming the tensor and file, found at open time,
//! before any tensor byte is read; none faults.

use crate::common;

use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device};
use burn_mapped::{MappedRecorder, MappedStore, StoreError, StoreWriter, TensorSpec};
use burn_mapped_tests::assert_matches;
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

/// Why a store whose manifest `edit` changed (and sealed again) is refused at open.
fn refused_after(edit: impl FnOnce(&mut serde_json::Value)) -> StoreError {
    let (_t, dir) = two_tensor_store();
    edit_manifest(&dir, edit);
    open_err(&dir)
}

#[test]
fn rejects_a_length_that_does_not_match_shape_and_dtype() {
    let err = refused_after(|v| v["tensors"][0]["len"] = 95.into());
    assert_matches!(
        err,
        StoreError::LengthMismatch { tensor, len: 95, file, .. }
            if tensor == "a.weight" && file.ends_with(".tensor")
    );
}

#[test]
fn rejects_a_rank_past_the_limit_by_its_rank() {
    // 24 elements as nine dimensions: the length still matches the shape.
    let err = refused_after(|v| {
        v["tensors"][0]["shape"] = serde_json::json!([1, 1, 1, 1, 1, 1, 1, 4, 6]);
    });
    assert_matches!(
        err,
        StoreError::RankTooHigh { tensor, rank: 9, max: burn_mapped::manifest::MAX_RANK }
            if tensor == "a.weight"
    );
}

#[test]
fn rejects_an_unknown_dtype() {
    let err = refused_after(|v| v["tensors"][1]["dtype"] = "f8e4m3".into());
    assert_matches!(
        err,
        StoreError::UnknownDType { tensor, dtype, .. } if tensor == "b.bias" && dtype == "f8e4m3"
    );
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
        let err = refused_after(|v| v["tensors"][0]["file"] = bad.into());
        assert_matches!(err, StoreError::UnsafeFileName { tensor, .. } if tensor == "a.weight");
    }
}

#[test]
fn rejects_duplicate_names() {
    let err = refused_after(|v| v["tensors"][1]["name"] = "a.weight".into());
    assert_matches!(err, StoreError::DuplicateName { tensor } if tensor == "a.weight");
}

#[test]
fn rejects_two_tensors_sharing_a_file() {
    let err = refused_after(|v| v["tensors"][1]["file"] = v["tensors"][0]["file"].clone());
    assert_matches!(err, StoreError::DuplicateFile { .. });
}

#[test]
fn rejects_an_unsupported_format_version() {
    let err = refused_after(|v| v["version"] = 1.into());
    assert_matches!(
        err,
        StoreError::UnsupportedVersion { version: 1, path, .. } if path.ends_with("manifest.json")
    );
}

#[test]
fn rejects_a_foreign_alignment() {
    let err = refused_after(|v| v["alignment"] = 256.into());
    assert_matches!(err, StoreError::UnsupportedAlignment { found: 256, .. });
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

/// What `verify` finds once `edit` has changed the bytes of `tensor`'s file, and that file.
fn verify_after_editing(
    tensor: &str,
    edit: impl FnOnce(&mut Vec<u8>),
) -> (Vec<StoreError>, std::path::PathBuf) {
    let (_t, dir) = two_tensor_store();
    let path = file_of(&dir, tensor);
    let mut bytes = std::fs::read(&path).unwrap();
    edit(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    (MappedStore::open(&dir).unwrap().verify(), path)
}

#[test]
fn verify_reports_a_checksum_mismatch_naming_tensor_and_file() {
    let (problems, path) = verify_after_editing("a.weight", |bytes| bytes[5] ^= 0x40);
    assert_matches!(
        &problems[..],
        [StoreError::ChecksumMismatch { tensor, file, .. }] if tensor == "a.weight" && *file == path
    );
}

#[test]
fn verify_reports_dirty_padding() {
    let (problems, _) = verify_after_editing("b.bias", |bytes| bytes[100] = 1);
    assert_matches!(
        &problems[..],
        [StoreError::DirtyPadding { tensor, .. }] if tensor == "b.bias"
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
