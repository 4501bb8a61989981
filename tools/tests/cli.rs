//! The `convert`, `inspect` and `verify` commands, driven through their `run` functions with
//! inputs written here by the formats' own writers.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use burn::store::burn_pack;
use burn::tensor::DType;
use burn_mapped::StoreError;
use burn_mapped::convert::CastTo;
use burn_mapped_tests::numeric::f32_le_bytes;
use burn_mapped_tests::synthetic::{RawTensor, write_safetensors};
use burn_mapped_tests::tempdir;
use burn_mapped_tools::cli::convert::{self, ConvertArgs, InputKind};
use burn_mapped_tools::cli::inspect::{self, InspectArgs};
use burn_mapped_tools::cli::verify::{self, VerifyArgs};
use safetensors::Dtype;

/// A small checkpoint: two f32 matrices, an i64 vector, a bool mask.
fn write_checkpoint(path: &Path) -> Vec<RawTensor<&'static str>> {
    let tensors = vec![
        (
            "layers.0.weight",
            Dtype::F32,
            vec![4, 3],
            f32_le_bytes((0..12).map(|i| i as f32 * 0.5)),
        ),
        (
            "layers.1.weight",
            Dtype::F32,
            vec![2, 4],
            f32_le_bytes((0..8).map(|i| 1.0 - i as f32)),
        ),
        (
            "positions",
            Dtype::I64,
            vec![3],
            [7i64, -1, 2].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        ("mask", Dtype::BOOL, vec![4], vec![1, 0, 0, 1]),
    ];
    write_safetensors(path, &tensors, None);
    tensors
}

fn convert_args(input: &Path, out: &Path, dtype: Option<CastTo>) -> ConvertArgs {
    ConvertArgs {
        input: input.to_path_buf(),
        out: out.to_path_buf(),
        dtype: dtype.map(Into::into),
        quiet: true,
        force: false,
    }
}

fn converted(tmp: &Path) -> PathBuf {
    let input = tmp.join("model.safetensors");
    write_checkpoint(&input);
    let out = tmp.join("store");
    convert::run(&convert_args(&input, &out, None)).unwrap();
    out
}

#[test]
fn convert_then_inspect_reports_every_tensor_with_its_sizes_and_file() {
    let tmp = tempdir();
    let input = tmp.path().join("model.safetensors");
    let tensors = write_checkpoint(&input);
    let out = tmp.path().join("store");
    convert::run(&convert_args(&input, &out, None)).unwrap();

    let report = inspect::report(&out).unwrap();
    assert_eq!(report.tensor_count, tensors.len());
    assert_eq!(report.alignment, 16 * 1024);
    for (name, _, shape, bytes) in &tensors {
        let row = report.tensors.iter().find(|r| r.name == *name).unwrap();
        assert_eq!(row.shape, *shape);
        assert_eq!(row.bytes, bytes.len() as u64);
        assert_eq!(
            row.padded_bytes,
            16 * 1024,
            "every tensor here fits in one 16 KiB block"
        );
        let on_disk = std::fs::read(out.join(&row.file)).unwrap();
        assert_eq!(on_disk.len() as u64, row.padded_bytes);
        assert_eq!(&on_disk[..bytes.len()], bytes.as_slice());
        assert_eq!(row.quant, None);
    }
    let dtype = |n: &str| {
        report
            .tensors
            .iter()
            .find(|r| r.name == n)
            .unwrap()
            .dtype
            .clone()
    };
    assert_eq!(dtype("mask"), "bool");
    assert_eq!(dtype("positions"), "i64");
    let logical: u64 = tensors.iter().map(|t| t.3.len() as u64).sum();
    assert_eq!(report.total_bytes, logical);
    assert_eq!(report.on_disk_bytes, 4 * 16 * 1024);
    assert_eq!(
        report.metadata.get("convert.source").map(String::as_str),
        Some("safetensors")
    );

    // The JSON form round-trips to the same report, and the table names every tensor.
    let json = serde_json::to_string(&report).unwrap();
    let back: inspect::InspectReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
    let table = inspect::render_table(&report);
    for (name, ..) in &tensors {
        assert!(table.contains(name), "{table}");
    }
    assert!(table.contains("convert.source = safetensors"), "{table}");
    inspect::run(&InspectArgs {
        store: out.clone(),
        json: true,
    })
    .unwrap();
    inspect::run(&InspectArgs {
        store: out,
        json: false,
    })
    .unwrap();
}

#[test]
fn convert_with_dtype_casts_floats_and_keeps_integers() {
    let tmp = tempdir();
    let input = tmp.path().join("model.safetensors");
    write_checkpoint(&input);
    let out = tmp.path().join("store");
    convert::run(&convert_args(&input, &out, Some(CastTo::BF16))).unwrap();
    let report = inspect::report(&out).unwrap();
    for row in &report.tensors {
        let want = match row.name.as_str() {
            "positions" => "i64",
            "mask" => "bool",
            _ => "bf16",
        };
        assert_eq!(row.dtype, want, "{}", row.name);
    }
    // 0.5 * i is exact in bf16: 0x3F00 is 0.5, 0x3F80 is 1.0.
    let row = report
        .tensors
        .iter()
        .find(|r| r.name == "layers.0.weight")
        .unwrap();
    let bytes = std::fs::read(out.join(&row.file)).unwrap();
    assert_eq!(row.bytes, 24);
    assert_eq!(&bytes[..6], &[0x00, 0x00, 0x00, 0x3F, 0x80, 0x3F]);
}

#[test]
fn convert_reads_a_burnpack_and_keeps_param_ids() {
    let tmp = tempdir();
    let input = tmp.path().join("model.bpk");
    let data = f32_le_bytes([1.0, 2.0, 3.0, 4.0]);
    burn_pack::Writer::new(vec![burn_pack::Tensor::new(
        "w".into(),
        DType::F32,
        vec![2, 2],
        Some(99),
        burn::tensor::Bytes::from_bytes_vec(data.clone()),
    )])
    .write_to_file(&input)
    .unwrap();
    assert_eq!(convert::detect(&input).unwrap(), InputKind::Burnpack);
    let out = tmp.path().join("store");
    convert::run(&convert_args(&input, &out, None)).unwrap();
    let report = inspect::report(&out).unwrap();
    assert_eq!(report.tensors[0].param_id, Some(99));
    assert_eq!(report.tensors[0].bytes, 16);
}

#[test]
fn inputs_are_detected_by_content_then_by_name() {
    let tmp = tempdir();
    let detect = |path: &Path| convert::detect(path).unwrap();
    let st = tmp.path().join("weights.bin");
    write_checkpoint(&st);
    assert_eq!(detect(&st), InputKind::Safetensors, "by content");
    let gguf = tmp.path().join("model.bin");
    std::fs::write(&gguf, b"GGUF\x03\x00\x00\x00").unwrap();
    assert_eq!(detect(&gguf), InputKind::Gguf);
    assert_eq!(detect(tmp.path()), InputKind::Safetensors, "a directory");
    let index = tmp.path().join("model.safetensors.index.json");
    std::fs::write(&index, br#"{"weight_map": {}}"#).unwrap();
    assert_eq!(detect(&index), InputKind::Safetensors, "by name");
    let unknown = tmp.path().join("notes.txt");
    std::fs::write(&unknown, b"hello").unwrap();
    let err = convert::detect(&unknown).unwrap_err().to_string();
    assert!(
        err.contains("notes.txt") && err.contains("cannot tell"),
        "{err}"
    );
}

#[test]
fn a_truncated_gguf_input_is_an_error_naming_the_file_and_writes_nothing() {
    let tmp = tempdir();
    let gguf = tmp.path().join("model.gguf");
    std::fs::write(&gguf, b"GGUF\x03\x00\x00\x00").unwrap();
    let out = tmp.path().join("store");
    let err = convert::run(&convert_args(&gguf, &out, None)).unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("model.gguf") && message.contains("truncated"),
        "{message}"
    );
    assert!(!out.exists());
}

#[test]
fn convert_errors_name_the_input_file_and_tensor() {
    let tmp = tempdir();
    let input = tmp.path().join("fp8.safetensors");
    write_safetensors(
        &input,
        &[("scales", Dtype::F8_E4M3, vec![4], vec![0u8; 4])],
        None,
    );
    let err = convert::run(&convert_args(&input, &tmp.path().join("s"), None)).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("fp8.safetensors") && text.contains("scales") && text.contains("F8_E4M3"),
        "{text}"
    );
}

#[test]
fn verify_passes_an_intact_store() {
    let tmp = tempdir();
    let out = converted(tmp.path());
    let outcome = verify::check(&out, true).unwrap();
    assert_eq!(outcome.tensors, 4);
    assert!(outcome.problems.is_empty(), "{:?}", outcome.problems);
    verify::run(&VerifyArgs {
        store: out,
        quiet: true,
    })
    .unwrap();
}

#[test]
fn verify_reports_a_changed_byte_with_expected_and_actual_checksums() {
    let tmp = tempdir();
    let out = converted(tmp.path());
    let report = inspect::report(&out).unwrap();
    let row = report
        .tensors
        .iter()
        .find(|r| r.name == "layers.1.weight")
        .unwrap();
    let path = out.join(&row.file);
    let mut bytes = std::fs::read(&path).unwrap();
    let original = xxhash_rust::xxh3::xxh3_64(&bytes[..row.bytes as usize]);
    bytes[5] ^= 0x40;
    let changed = xxhash_rust::xxh3::xxh3_64(&bytes[..row.bytes as usize]);
    std::fs::write(&path, &bytes).unwrap();

    let outcome = verify::check(&out, true).unwrap();
    assert_eq!(outcome.problems.len(), 1);
    match &outcome.problems[0] {
        StoreError::ChecksumMismatch {
            tensor,
            file,
            expected,
            actual,
        } => {
            assert_eq!(tensor, "layers.1.weight");
            assert_eq!(file, &path);
            assert_eq!((*expected, *actual), (original, changed));
        }
        other => panic!("expected ChecksumMismatch, got {other}"),
    }
    let err = verify::run(&VerifyArgs {
        store: out,
        quiet: true,
    })
    .unwrap_err();
    assert!(err.to_string().contains("1 of 4"), "{err}");
}

#[test]
fn verify_reports_every_structural_problem_not_just_the_first() {
    let tmp = tempdir();
    let out = converted(tmp.path());
    let report = inspect::report(&out).unwrap();
    let file_of =
        |name: &str| out.join(&report.tensors.iter().find(|r| r.name == name).unwrap().file);
    // Missing file, short file, and non-zero padding, in three different tensors.
    std::fs::remove_file(file_of("layers.0.weight")).unwrap();
    let short = std::fs::OpenOptions::new()
        .write(true)
        .open(file_of("positions"))
        .unwrap();
    short.set_len(100).unwrap();
    let mut dirty = std::fs::OpenOptions::new()
        .write(true)
        .open(file_of("mask"))
        .unwrap();
    dirty.seek(SeekFrom::Start(1000)).unwrap();
    dirty.write_all(&[7]).unwrap();
    drop((short, dirty));

    let outcome = verify::check(&out, true).unwrap();
    let mut kinds: Vec<(&'static str, String)> = outcome
        .problems
        .iter()
        .map(|p| match p {
            StoreError::MissingFile { tensor, .. } => ("missing", tensor.clone()),
            StoreError::ShortFile { tensor, actual, .. } => {
                assert_eq!(*actual, 100);
                ("short", tensor.clone())
            }
            StoreError::DirtyPadding { tensor, .. } => ("padding", tensor.clone()),
            other => panic!("unexpected {other}"),
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("missing", "layers.0.weight".to_string()),
            ("padding", "mask".to_string()),
            ("short", "positions".to_string()),
        ]
    );
    assert!(
        verify::run(&VerifyArgs {
            store: out,
            quiet: true
        })
        .is_err()
    );
}

#[test]
fn verify_and_inspect_fail_on_a_directory_without_a_manifest() {
    let tmp = tempdir();
    assert!(
        verify::run(&VerifyArgs {
            store: tmp.path().to_path_buf(),
            quiet: true
        })
        .is_err()
    );
    let err = inspect::report(tmp.path()).unwrap_err();
    assert!(format!("{err:#}").contains("manifest"), "{err:#}");
}
