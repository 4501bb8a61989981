//! Converters: inputs are built in the test with the formats' own writers (the `safetensors`
//! crate's serializer, Burn's burnpack writer and `ModuleRecord::save`, burn-store's
//! `SafetensorsStore`). Stored bytes are compared with the input bytes; casts are compared with
//! a rounding reference written here from the IEEE 754 definition, in f64, and with
//! hand-computed bit patterns.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::module::{Module, Param};
use burn::store::burn_pack;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::{Device, Tensor};
use burn_mapped::convert::{
    BurnpackInput, CastTo, ConvertError, ConvertOptions, Progress, SafetensorsInput, from_burnpack,
    from_safetensors,
};
use burn_mapped::{Manifest, MappedRecorder, MappedStore};
use burn_mapped_tests::assert_matches;
use burn_mapped_tests::numeric::f32_le_bytes;
use burn_mapped_tests::params::{ParamProbe, probe_float_params};
use burn_mapped_tests::synthetic::{RawTensor, write_safetensors};
use burn_mapped_tests::tempdir;
use common::*;
use safetensors::Dtype;

// ---------------------------------------------------------------------------------------------
// Helpers

/// One input tensor: name, safetensors dtype, shape, bytes.
type Raw = RawTensor<&'static str>;

/// Deterministic bytes that are not a simple ramp.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 11) as u8
        })
        .collect()
}

fn f64_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn stored_bytes(dir: &Path, name: &str) -> Vec<u8> {
    let store = MappedStore::open(dir).unwrap();
    store.mapped(name).unwrap().bytes().to_vec()
}

fn convert_one(input: &[Raw], cast: Option<CastTo>) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempdir();
    let file = tmp.path().join("model.safetensors");
    write_safetensors(&file, input, None);
    let out = tmp.path().join("store");
    let mut options = ConvertOptions::default();
    if let Some(c) = cast {
        options = options.cast(c);
    }
    from_safetensors(&file, &out, &mut options).unwrap();
    (tmp, out)
}

/// Converting one `source` tensor of `bytes` to `target` is refused as out of range, naming the
/// tensor and the element, and leaves no store.
fn assert_refused(source: Dtype, bytes: Vec<u8>, target: CastTo, index: u64) {
    let tmp = tempdir();
    let file = tmp.path().join("model.safetensors");
    let n = bytes.len() * 8 / source.bitsize();
    write_safetensors(&file, &[("w", source, vec![n], bytes)], None);
    let out = tmp.path().join("store");
    let err = from_safetensors(&file, &out, &mut ConvertOptions::default().cast(target))
        .expect_err("an out-of-range value must be refused");
    match &err {
        ConvertError::Unrepresentable {
            tensor, index: at, ..
        } => {
            assert_eq!(tensor, "w");
            assert_eq!(*at, index, "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert!(!out.exists());
}

/// Whether `fmt` holds `x` without turning a finite value infinite.
fn representable(fmt: Format, x: f64) -> bool {
    !x.is_finite() || fmt.round(x).is_finite()
}

// ---------------------------------------------------------------------------------------------
// An IEEE 754 reference written from the definition, in f64, independent of `half`.

/// A binary floating-point format: fraction bits, minimum normal exponent, maximum exponent.
#[derive(Clone, Copy)]
struct Format {
    frac: i32,
    emin: i32,
    emax: i32,
}

const F16: Format = Format {
    frac: 10,
    emin: -14,
    emax: 15,
};
const BF16: Format = Format {
    frac: 7,
    emin: -126,
    emax: 127,
};
const F32: Format = Format {
    frac: 23,
    emin: -126,
    emax: 127,
};

impl Format {
    fn max_finite(self) -> f64 {
        (2.0 - 2f64.powi(-self.frac)) * 2f64.powi(self.emax)
    }

    /// `x` rounded to this format, to nearest with ties to even; overflow to infinity.
    fn round(self, x: f64) -> f64 {
        if !x.is_finite() || x == 0.0 {
            return x;
        }
        // Exponent of x from its f64 bits (exact), clamped to the subnormal range.
        let bits = x.abs().to_bits();
        let biased = (bits >> 52) as i32;
        let e = if biased == 0 { -1075 } else { biased - 1023 };
        let e = e.max(self.emin);
        let ulp = 2f64.powi(e - self.frac);
        // Dividing by a power of two is exact, so this rounds exactly once.
        let rounded = (x / ulp).round_ties_even() * ulp;
        // Overflow: values at or past max + ulp/2 (the tie rounds to the even, infinite, side).
        let limit = self.max_finite() + 2f64.powi(self.emax - self.frac - 1);
        if rounded.abs() > self.max_finite() || x.abs() >= limit {
            return f64::INFINITY.copysign(x);
        }
        rounded
    }

    /// Value of the bit pattern `bits` in a format with 1 sign bit, `ebits` exponent bits and
    /// `frac` fraction bits.
    fn decode(self, bits: u32) -> f64 {
        let ebits = (self.emax + 1).trailing_zeros() as i32 + 1; // emax = 2^(ebits-1) - 1
        let sign = if bits >> (ebits + self.frac) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let exp = ((bits >> self.frac) & ((1 << ebits) - 1)) as i32;
        let frac = (bits & ((1 << self.frac) - 1)) as f64;
        let scale = 2f64.powi(self.frac);
        if exp == (1 << ebits) - 1 {
            return if frac == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if exp == 0 {
            return sign * frac / scale * 2f64.powi(self.emin);
        }
        sign * (1.0 + frac / scale) * 2f64.powi(exp - (self.emax))
    }
}

fn assert_same_value(got: f64, want: f64, what: &str) {
    if want.is_nan() {
        assert!(got.is_nan(), "{what}: expected NaN, got {got}");
    } else {
        assert_eq!(got, want, "{what}");
        assert_eq!(
            got.is_sign_negative(),
            want.is_sign_negative(),
            "{what}: sign of {got}"
        );
    }
}

/// Inputs that probe every rounding path of a target format: exact values, ties (odd and even
/// lower neighbour), just-off-tie values, the overflow boundary and the subnormal range,
/// plus pseudo-random values spread over the exponent range.
fn probe_values(fmt: Format) -> Vec<f64> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.5,
        0.1,
        1.0 / 3.0,
        std::f64::consts::PI,
        -1e-3,
    ];
    let ulp1 = 2f64.powi(-fmt.frac);
    for k in 0..8 {
        let base = 1.0 + f64::from(k) * ulp1;
        v.push(base + ulp1 / 2.0); // tie
        v.push(-(base + ulp1 / 2.0));
        v.push(base + ulp1 / 2.0 + ulp1 / 1024.0); // just above the tie
        v.push(base + ulp1 / 2.0 - ulp1 / 1024.0); // just below
        // Above the tie by less than an f32 ulp: only a single rounding from f64 gets it.
        v.push(base + ulp1 / 2.0 + ulp1 * 2f64.powi(-30));
    }
    let max = fmt.max_finite();
    let top_ulp = 2f64.powi(fmt.emax - fmt.frac);
    v.extend([
        max,
        max + top_ulp / 4.0,
        max + top_ulp / 2.0,
        max + top_ulp,
        -max,
    ]);
    let tiny = 2f64.powi(fmt.emin - fmt.frac); // smallest subnormal
    v.extend([
        tiny,
        tiny / 2.0,
        tiny * 0.75,
        tiny * 1.5,
        tiny * 2.5,
        -tiny / 2.0,
    ]);
    v.push(2f64.powi(fmt.emin)); // smallest normal
    v.push(2f64.powi(fmt.emin) - tiny / 2.0); // tie between largest subnormal and smallest normal
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mantissa = 1.0 + (x >> 11) as f64 / 2f64.powi(53);
        let exp = (x % u64::from((fmt.emax - fmt.emin + 4) as u32)) as i32 + fmt.emin - 2;
        let sign = if x & 1 == 1 { -1.0 } else { 1.0 };
        v.push(sign * mantissa * 2f64.powi(exp));
    }
    v
}

// ---------------------------------------------------------------------------------------------
// safetensors

#[test]
fn every_supported_safetensors_dtype_is_stored_byte_for_byte() {
    let cases: Vec<(Raw, &str)> = vec![
        (("f64", Dtype::F64, vec![3, 5], pattern(120, 1)), "f64"),
        (("f32", Dtype::F32, vec![7, 3], pattern(84, 2)), "f32"),
        (("f16", Dtype::F16, vec![9], pattern(18, 3)), "f16"),
        (("bf16", Dtype::BF16, vec![2, 2, 3], pattern(24, 4)), "bf16"),
        (("i64", Dtype::I64, vec![4], pattern(32, 5)), "i64"),
        (("i32", Dtype::I32, vec![5], pattern(20, 6)), "i32"),
        (("i16", Dtype::I16, vec![6], pattern(12, 7)), "i16"),
        (("i8", Dtype::I8, vec![11], pattern(11, 8)), "i8"),
        (("u8", Dtype::U8, vec![13], pattern(13, 9)), "u8"),
        (("u16", Dtype::U16, vec![3], pattern(6, 10)), "u16"),
        (("u32", Dtype::U32, vec![3], pattern(12, 11)), "u32"),
        (("u64", Dtype::U64, vec![3], pattern(24, 12)), "u64"),
        (
            (
                "bool",
                Dtype::BOOL,
                vec![2, 4],
                vec![0, 1, 1, 0, 1, 1, 1, 0],
            ),
            "bool",
        ),
        (
            ("scalar", Dtype::F32, vec![], f32_le_bytes([2.5f32])),
            "f32",
        ),
        (("empty", Dtype::F32, vec![0, 4], vec![]), "f32"),
    ];
    let input: Vec<Raw> = cases.iter().map(|(raw, _)| raw.clone()).collect();
    let (_tmp, dir) = convert_one(&input, None);

    let store = MappedStore::open(&dir).unwrap();
    assert!(store.verify().is_empty());
    assert_eq!(store.manifest().tensors().len(), cases.len());
    for ((name, _, shape, data), dtype) in &cases {
        let entry = store.manifest().get(name).unwrap();
        assert_eq!(entry.dtype_name(), *dtype, "{name}");
        assert_eq!(entry.shape(), shape.as_slice(), "{name}");
        assert_eq!(
            store.mapped(name).unwrap().bytes(),
            data.as_slice(),
            "{name}"
        );
        assert_eq!(entry.param_id(), None);
        let on_disk = std::fs::metadata(dir.join(entry.file())).unwrap().len();
        assert_eq!(
            on_disk % burn_mapped::manifest::ALIGNMENT,
            0,
            "{name} padded"
        );
    }
    assert_eq!(
        store
            .manifest()
            .metadata()
            .get("convert.source")
            .map(String::as_str),
        Some("safetensors")
    );
}

#[test]
fn tensors_are_stored_in_file_order_and_header_metadata_is_kept() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    // Names deliberately not in alphabetical order of their offsets.
    let input: Vec<Raw> = vec![
        ("b", Dtype::F32, vec![4], pattern(16, 1)),
        ("a", Dtype::F32, vec![2], pattern(8, 2)),
        ("c", Dtype::F32, vec![1], pattern(4, 3)),
    ];
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(&file, &input, Some(meta));
    let opened = SafetensorsInput::open(&file).unwrap();
    // Independent view of the file order: the offsets in the JSON header.
    let bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut by_offset: Vec<(u64, String)> = header
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(k, v)| (v["data_offsets"][0].as_u64().unwrap(), k.clone()))
        .collect();
    by_offset.sort();
    let listed: Vec<String> = opened.tensors().into_iter().map(|t| t.name).collect();
    let expected: Vec<String> = by_offset.into_iter().map(|(_, k)| k).collect();
    assert_eq!(listed, expected);

    let out = tmp.path().join("store");
    let (manifest, _) = from_safetensors(&file, &out, &mut ConvertOptions::default()).unwrap();
    let names: Vec<&str> = manifest.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(
        names,
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(
        manifest
            .metadata()
            .get("safetensors.format")
            .map(String::as_str),
        Some("pt")
    );
}

/// [`write_sharded`] into a new directory `ckpt` under `dir`: that directory and the tensors.
fn sharded_checkpoint(dir: &Path) -> (PathBuf, Vec<Raw>) {
    let ckpt = dir.join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    let input = write_sharded(&ckpt);
    (ckpt, input)
}

fn write_sharded(dir: &Path) -> Vec<Raw> {
    let shard1: Vec<Raw> = vec![
        (
            "model.embed.weight",
            Dtype::BF16,
            vec![8, 4],
            pattern(64, 1),
        ),
        ("model.layers.0.w", Dtype::F32, vec![4, 4], pattern(64, 2)),
    ];
    let shard2: Vec<Raw> = vec![
        ("model.layers.1.w", Dtype::F32, vec![4, 4], pattern(64, 3)),
        ("lm_head.weight", Dtype::BF16, vec![8, 4], pattern(64, 4)),
    ];
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), &shard1, None);
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), &shard2, None);
    let mut weight_map = serde_json::Map::new();
    for (name, ..) in &shard1 {
        weight_map.insert(name.to_string(), "model-00001-of-00002.safetensors".into());
    }
    for (name, ..) in &shard2 {
        weight_map.insert(name.to_string(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {"total_size": 256}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    shard1.into_iter().chain(shard2).collect()
}

#[test]
fn a_sharded_checkpoint_converts_from_its_index_or_its_directory() {
    let tmp = tempdir();
    let (ckpt, input) = sharded_checkpoint(tmp.path());

    for (i, source) in [ckpt.join("model.safetensors.index.json"), ckpt.clone()]
        .iter()
        .enumerate()
    {
        let out = tmp.path().join(format!("store{i}"));
        let (manifest, summary) =
            from_safetensors(source, &out, &mut ConvertOptions::default()).unwrap();
        assert_eq!(summary.written, 4);
        assert_eq!(manifest.tensors().len(), 4);
        for (name, _, shape, data) in &input {
            assert_eq!(manifest.get(name).unwrap().shape(), shape.as_slice());
            assert_eq!(stored_bytes(&out, name), *data, "{name}");
        }
    }
}

#[test]
fn a_directory_of_shards_without_an_index_converts_every_shard() {
    let tmp = tempdir();
    let (ckpt, input) = sharded_checkpoint(tmp.path());
    std::fs::remove_file(ckpt.join("model.safetensors.index.json")).unwrap();
    let out = tmp.path().join("store");
    let (manifest, _) = from_safetensors(&ckpt, &out, &mut ConvertOptions::default()).unwrap();
    assert_eq!(manifest.tensors().len(), input.len());
}

#[test]
fn rejects_an_index_that_places_a_tensor_in_the_wrong_shard() {
    let tmp = tempdir();
    write_sharded(tmp.path());
    let index_path = tmp.path().join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors".into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();

    let err = from_safetensors(
        &index_path,
        tmp.path().join("s"),
        &mut ConvertOptions::default(),
    )
    .unwrap_err();
    match err {
        ConvertError::ShardMismatch { tensor, shard, .. } => {
            assert_eq!(tensor, "lm_head.weight");
            assert!(
                shard.ends_with("model-00001-of-00002.safetensors"),
                "{shard:?}"
            );
        }
        other => panic!("expected ShardMismatch, got {other}"),
    }
    assert!(!tmp.path().join("s").exists());
}

#[test]
fn rejects_an_index_whose_shard_is_outside_its_directory() {
    let tmp = tempdir();
    let index_path = tmp.path().join("m.safetensors.index.json");
    std::fs::write(
        &index_path,
        r#"{"weight_map": {"w": "../elsewhere.safetensors"}}"#,
    )
    .unwrap();
    let err = from_safetensors(
        &index_path,
        tmp.path().join("s"),
        &mut ConvertOptions::default(),
    )
    .unwrap_err();
    assert_matches!(
        &err,
        ConvertError::UnsafeShardName { shard, .. } if shard == "../elsewhere.safetensors"
    );
}

#[test]
fn the_rename_hook_renames_and_drops_tensors() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    let input: Vec<Raw> = vec![
        (
            "model.layers.0.q.weight",
            Dtype::F32,
            vec![2, 2],
            pattern(16, 1),
        ),
        ("model.norm.weight", Dtype::F32, vec![2], pattern(8, 2)),
        ("lm_head.weight", Dtype::F32, vec![3, 2], pattern(24, 3)),
    ];
    write_safetensors(&file, &input, None);
    let out = tmp.path().join("store");
    let mut options = ConvertOptions::default().rename(|name| {
        if name == "lm_head.weight" {
            None
        } else {
            Some(name.strip_prefix("model.").unwrap_or(name).to_string())
        }
    });
    let (manifest, summary) = from_safetensors(&file, &out, &mut options).unwrap();
    let mut names: Vec<&str> = manifest.tensors().iter().map(|t| t.name()).collect();
    names.sort();
    assert_eq!(names, ["layers.0.q.weight", "norm.weight"]);
    assert_eq!(summary.dropped, ["lm_head.weight"]);
    assert_eq!(summary.renamed, 2);
    assert_eq!(summary.written, 2);
    assert_eq!(stored_bytes(&out, "layers.0.q.weight"), input[0].3);
    assert_eq!(stored_bytes(&out, "norm.weight"), input[1].3);
}

#[test]
fn rejects_two_tensors_renamed_to_the_same_name() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    write_safetensors(
        &file,
        &[
            ("a.weight", Dtype::F32, vec![1], pattern(4, 1)),
            ("b.weight", Dtype::F32, vec![1], pattern(4, 2)),
        ],
        None,
    );
    let mut options = ConvertOptions::default().rename(|_| Some("same".to_string()));
    let err = from_safetensors(&file, tmp.path().join("s"), &mut options).unwrap_err();
    match err {
        ConvertError::DuplicateTensor {
            tensor,
            first,
            second,
            ..
        } => {
            assert_eq!(tensor, "same");
            assert_eq!((first.as_str(), second.as_str()), ("a.weight", "b.weight"));
        }
        other => panic!("expected DuplicateTensor, got {other}"),
    }
}

#[test]
fn rejects_an_unsupported_dtype_naming_the_tensor_and_file() {
    let tmp = tempdir();
    let file = tmp.path().join("fp8.safetensors");
    write_safetensors(
        &file,
        &[
            ("ok", Dtype::F32, vec![2], pattern(8, 1)),
            ("scales", Dtype::F8_E4M3, vec![4], pattern(4, 2)),
        ],
        None,
    );
    let out = tmp.path().join("store");
    let err = from_safetensors(&file, &out, &mut ConvertOptions::default()).unwrap_err();
    match &err {
        ConvertError::UnsupportedDType {
            file: f,
            tensor,
            dtype,
        } => {
            assert_eq!(f, &file);
            assert_eq!(tensor, "scales");
            assert_eq!(dtype, "F8_E4M3");
        }
        other => panic!("expected UnsupportedDType, got {other}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("fp8.safetensors") && message.contains("scales"),
        "{message}"
    );
    assert!(!out.exists(), "no store may be published");
    // Nothing left behind next to it either.
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "only the input remains");

    // Dropping the tensor with the hook makes the rest convertible.
    let mut options = ConvertOptions::default().rename(|n| (n != "scales").then(|| n.to_string()));
    let (manifest, summary) = from_safetensors(&file, &out, &mut options).unwrap();
    assert_eq!(manifest.tensors().len(), 1);
    assert_eq!(summary.dropped, ["scales"]);
}

#[test]
fn rejects_a_truncated_safetensors_file() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    write_safetensors(&file, &[("w", Dtype::F32, vec![64], pattern(256, 1))], None);
    let full = std::fs::read(&file).unwrap();
    let header_end = 8 + u64::from_le_bytes(full[..8].try_into().unwrap()) as usize;
    let out = tmp.path().join("store");

    // Cut in the data section.
    std::fs::write(&file, &full[..full.len() - 1]).unwrap();
    match from_safetensors(&file, &out, &mut ConvertOptions::default()).unwrap_err() {
        ConvertError::Truncated {
            file: f,
            expected,
            actual,
        } => {
            assert_eq!(f, file);
            assert_eq!(expected, full.len() as u64);
            assert_eq!(actual, full.len() as u64 - 1);
        }
        other => panic!("expected Truncated, got {other}"),
    }
    // Cut in the header.
    std::fs::write(&file, &full[..header_end - 3]).unwrap();
    match from_safetensors(&file, &out, &mut ConvertOptions::default()).unwrap_err() {
        ConvertError::Truncated { expected, .. } => assert_eq!(expected, header_end as u64),
        other => panic!("expected Truncated, got {other}"),
    }
    // Cut in the length prefix.
    std::fs::write(&file, &full[..5]).unwrap();
    assert!(matches!(
        from_safetensors(&file, &out, &mut ConvertOptions::default()).unwrap_err(),
        ConvertError::Truncated {
            expected: 8,
            actual: 5,
            ..
        }
    ));
    // Extra bytes after the data are an error too.
    let mut longer = full.clone();
    longer.extend_from_slice(&[0; 3]);
    std::fs::write(&file, &longer).unwrap();
    assert!(matches!(
        from_safetensors(&file, &out, &mut ConvertOptions::default()).unwrap_err(),
        ConvertError::TrailingBytes { .. }
    ));
    assert!(!out.exists());
}

#[test]
fn rejects_a_malformed_header_with_the_safetensors_error() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    let mut bytes = 6u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{oops}");
    std::fs::write(&file, &bytes).unwrap();
    let err =
        from_safetensors(&file, tmp.path().join("s"), &mut ConvertOptions::default()).unwrap_err();
    assert_matches!(err, ConvertError::Safetensors { .. });
}

// The fuzz seed `safetensors_header/data-length-overflow.safetensors`: eight u8 tensors of
// 2^61 - 1 bytes each tile offsets up to 2^64 - 8, so the header end plus the data length
// overflows `usize` inside `SafeTensors::read_metadata`: a panic in a build with overflow
// checks (this test's), a bogus "trailing bytes" length without them.
#[test]
fn rejects_a_header_whose_data_length_overflows() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    let n = (1u64 << 61) - 1;
    let tensors: Vec<String> = (0..8)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"U8","shape":[{n}],"data_offsets":[{},{}]}}"#,
                i * n,
                (i + 1) * n
            )
        })
        .collect();
    let header = format!("{{{}}}", tensors.join(","));
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let err =
        from_safetensors(&file, tmp.path().join("s"), &mut ConvertOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ConvertError::Safetensors {
                source: safetensors::SafeTensorError::ValidationOverflow,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_bool_bytes_other_than_zero_and_one() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    write_safetensors(
        &file,
        &[("mask", Dtype::BOOL, vec![4], vec![0, 1, 2, 1])],
        None,
    );
    let err =
        from_safetensors(&file, tmp.path().join("s"), &mut ConvertOptions::default()).unwrap_err();
    assert_matches!(
        &err,
        ConvertError::InvalidBool { tensor, index: 2, value: 2, .. } if tensor == "mask"
    );
}

#[test]
fn progress_reports_every_input_byte_in_order() {
    let tmp = tempdir();
    let file = tmp.path().join("m.safetensors");
    // One tensor larger than a chunk, so it is reported in several steps.
    let big = (burn_mapped::convert::CHUNK_BYTES + 4096) / 4;
    let input: Vec<Raw> = vec![
        ("big", Dtype::F32, vec![big], pattern(big * 4, 1)),
        ("small", Dtype::F32, vec![3], pattern(12, 2)),
        ("empty", Dtype::F32, vec![0], vec![]),
        ("dropped", Dtype::F32, vec![100], pattern(400, 3)),
    ];
    write_safetensors(&file, &input, None);
    let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::<(u64, u64, String)>::new()));
    let sink = log.clone();
    let mut options = ConvertOptions::default()
        .rename(|n| (n != "dropped").then(|| n.to_string()))
        .progress(move |p: &Progress<'_>| {
            sink.borrow_mut()
                .push((p.done_bytes, p.total_bytes, p.tensor.to_string()))
        });
    from_safetensors(&file, tmp.path().join("s"), &mut options).unwrap();
    let log = log.borrow();
    let total = (big * 4 + 12) as u64;
    assert!(log.iter().all(|(_, t, _)| *t == total));
    assert!(log.windows(2).all(|w| w[0].0 <= w[1].0), "monotonic");
    assert_eq!(log.last().unwrap().0, total);
    assert_eq!(log.iter().filter(|(_, _, n)| n == "big").count(), 2);
    assert!(log.iter().any(|(_, _, n)| n == "empty"));
    assert!(log.iter().all(|(_, _, n)| n != "dropped"));
}

// ---------------------------------------------------------------------------------------------
// Casting

#[test]
fn casting_f32_to_f16_rounds_hand_computed_cases_to_nearest_even() {
    // (input, expected f16 bits), worked out by hand from the f16 layout (1, 5, 10 bits).
    let cases: &[(f32, u16)] = &[
        (1.0, 0x3C00),
        (-2.0, 0xC000),
        (0.5, 0x3800),
        (65504.0, 0x7BFF),                        // largest finite
        (65519.0, 0x7BFF),                        // below max + ulp/2 = 65520
        (1.0 + 1.0 / 2048.0, 0x3C00),             // 1 + ulp/2: tie, 1.0 is even
        (1.0 + 3.0 / 2048.0, 0x3C02),             // tie between 0x3C01 and 0x3C02: even
        (1.0 + 1.0 / 2048.0 + 1.0 / 1e6, 0x3C01), // just above the tie
        (6.103_515_6e-5, 0x0400),                 // 2^-14, smallest normal
        (5.960_464_5e-8, 0x0001),                 // 2^-24, smallest subnormal
        (2.980_232_2e-8, 0x0000),                 // 2^-25: tie between 0 and 2^-24, 0 is even
        (4.470_348_4e-8, 0x0001),                 // 1.5 * 2^-25
        (-0.0, 0x8000),
        (f32::INFINITY, 0x7C00),
        (f32::NEG_INFINITY, 0xFC00),
    ];
    let values: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let (_tmp, dir) = convert_one(
        &[("w", Dtype::F32, vec![values.len()], f32_le_bytes(&values))],
        Some(CastTo::F16),
    );
    let manifest = Manifest::read(&dir).unwrap();
    assert_eq!(manifest.get("w").unwrap().dtype_name(), "f16");
    let got = u16s(&stored_bytes(&dir, "w"));
    for ((input, want), got) in cases.iter().zip(got) {
        assert_eq!(
            got, *want,
            "f16 of {input:e}: got {got:#06x}, want {want:#06x}"
        );
    }
    // max + ulp/2 = 65520 is a tie whose even side is infinity: not representable.
    assert_refused(Dtype::F32, f32_le_bytes([1.0f32, 65520.0]), CastTo::F16, 1);
    assert_refused(Dtype::F32, f32_le_bytes([-1e9f32]), CastTo::F16, 0);
}

#[test]
fn casting_f32_to_bf16_rounds_hand_computed_cases_to_nearest_even() {
    let cases: &[(f32, u16)] = &[
        (1.0, 0x3F80),
        (-1.0, 0xBF80),
        (1.0 + 1.0 / 256.0, 0x3F80),             // tie, 1.0 even
        (1.0 + 3.0 / 256.0, 0x3F82),             // tie, 0x3F82 even
        (1.0 + 1.0 / 256.0 + 1.0 / 1e6, 0x3F81), // above the tie
        (3.389_531_4e38, 0x7F7F),                // bf16's largest finite, exact
        (0.0, 0x0000),
    ];
    let values: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let (_tmp, dir) = convert_one(
        &[("w", Dtype::F32, vec![values.len()], f32_le_bytes(&values))],
        Some(CastTo::BF16),
    );
    let got = u16s(&stored_bytes(&dir, "w"));
    for ((input, want), got) in cases.iter().zip(got) {
        assert_eq!(
            got, *want,
            "bf16 of {input:e}: got {got:#06x}, want {want:#06x}"
        );
    }
    // Past bf16's max + ulp/2: not representable.
    assert_refused(Dtype::F32, f32_le_bytes([f32::MAX]), CastTo::BF16, 0);
}

#[test]
fn casting_f32_and_f64_to_half_types_matches_the_f64_rounding_reference() {
    for (target, fmt) in [(CastTo::F16, F16), (CastTo::BF16, BF16)] {
        let (values, overflowing): (Vec<f64>, Vec<f64>) = probe_values(fmt)
            .into_iter()
            .partition(|&x| representable(fmt, x) && representable(fmt, f64::from(x as f32)));
        assert!(!overflowing.is_empty());
        for x in overflowing {
            assert_refused(Dtype::F64, f64_bytes(&[x]), target, 0);
        }
        // f64 values that are exact in f32 go in as f32 too.
        let as_f32: Vec<f32> = values
            .iter()
            .map(|&v| v as f32)
            .filter(|&v| v.is_finite())
            .collect();
        let (_t1, d32) = convert_one(
            &[("w", Dtype::F32, vec![as_f32.len()], f32_le_bytes(&as_f32))],
            Some(target),
        );
        let (_t2, d64) = convert_one(
            &[("w", Dtype::F64, vec![values.len()], f64_bytes(&values))],
            Some(target),
        );
        for (inputs, dir) in [
            (
                as_f32.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
                &d32,
            ),
            (values.clone(), &d64),
        ] {
            let got = u16s(&stored_bytes(dir, "w"));
            assert_eq!(got.len(), inputs.len());
            for (x, bits) in inputs.iter().zip(got) {
                assert_same_value(
                    fmt.decode(u32::from(bits)),
                    fmt.round(*x),
                    &format!("{target} of {x:e} ({bits:#06x})"),
                );
            }
        }
    }
}

#[test]
fn casting_f64_to_f16_rounds_once_even_just_above_a_tie() {
    // 1 + 2^-11 is a tie between 1.0 and 1 + 2^-10; 2^-40 above it must round up. A converter
    // that looks only at the top 32 bits of the f64 (or goes through f32 with ordinary
    // rounding, which lands exactly on the tie) gets 1.0.
    let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-45); // the same for bf16
    let (_t, dir) = convert_one(
        &[("w", Dtype::F64, vec![1], f64_bytes(&[x]))],
        Some(CastTo::F16),
    );
    assert_eq!(u16s(&stored_bytes(&dir, "w")), [0x3C01]);
    let (_t, dir) = convert_one(
        &[("w", Dtype::F64, vec![1], f64_bytes(&[y]))],
        Some(CastTo::BF16),
    );
    assert_eq!(u16s(&stored_bytes(&dir, "w")), [0x3F81]);
}

#[test]
fn casting_f64_to_f32_matches_the_reference() {
    let (values, overflowing): (Vec<f64>, Vec<f64>) = probe_values(F32)
        .into_iter()
        .partition(|&x| representable(F32, x));
    for x in overflowing {
        assert_refused(Dtype::F64, f64_bytes(&[1.0, x]), CastTo::F32, 1);
    }
    let (_t, dir) = convert_one(
        &[("w", Dtype::F64, vec![values.len()], f64_bytes(&values))],
        Some(CastTo::F32),
    );
    let got = stored_bytes(&dir, "w");
    for (x, c) in values.iter().zip(got.chunks_exact(4)) {
        let v = f32::from_le_bytes(c.try_into().unwrap());
        assert_same_value(f64::from(v), F32.round(*x), &format!("f32 of {x:e}"));
    }
}

#[test]
fn widening_and_cross_casts_of_every_16_bit_pattern_are_exact_or_correctly_rounded() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let n = 1usize << 16;
    for (source, fmt, other_fmt) in [(Dtype::F16, F16, BF16), (Dtype::BF16, BF16, F16)] {
        // To f32: exact.
        let (_t, dir) = convert_one(&[("w", source, vec![n], all.clone())], Some(CastTo::F32));
        let got = stored_bytes(&dir, "w");
        for (bits, c) in (0..=u16::MAX).zip(got.chunks_exact(4)) {
            let v = f32::from_le_bytes(c.try_into().unwrap());
            assert_same_value(
                f64::from(v),
                fmt.decode(u32::from(bits)),
                &format!("{source:?} {bits:#06x} to f32"),
            );
        }
        // To the other 16-bit type: one correct rounding of the exact value.
        let target = if source == Dtype::F16 {
            CastTo::BF16
        } else {
            CastTo::F16
        };
        let (fits, past): (Vec<u16>, Vec<u16>) =
            (0..=u16::MAX).partition(|&bits| representable(other_fmt, fmt.decode(u32::from(bits))));
        if let Some(&bits) = past.first() {
            assert_refused(source, bits.to_le_bytes().to_vec(), target, 0);
        }
        let fitting: Vec<u8> = fits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let (_t, dir) = convert_one(&[("w", source, vec![fits.len()], fitting)], Some(target));
        let got = u16s(&stored_bytes(&dir, "w"));
        assert_eq!(got.len(), fits.len());
        for (&bits, out) in fits.iter().zip(got) {
            let exact = fmt.decode(u32::from(bits));
            assert_same_value(
                other_fmt.decode(u32::from(out)),
                other_fmt.round(exact),
                &format!("{source:?} {bits:#06x} to {target}"),
            );
        }
    }
}

#[test]
fn a_cast_keeps_integer_and_bool_tensors_and_same_type_floats_unchanged() {
    let ints = pattern(40, 1);
    let halves = pattern(16, 2);
    let (_t, dir) = convert_one(
        &[
            ("ids", Dtype::I64, vec![5], ints.clone()),
            ("mask", Dtype::BOOL, vec![3], vec![1, 0, 1]),
            ("h", Dtype::F16, vec![8], halves.clone()),
        ],
        Some(CastTo::F16),
    );
    let manifest = Manifest::read(&dir).unwrap();
    assert_eq!(manifest.get("ids").unwrap().dtype_name(), "i64");
    assert_eq!(manifest.get("mask").unwrap().dtype_name(), "bool");
    assert_eq!(stored_bytes(&dir, "ids"), ints);
    assert_eq!(stored_bytes(&dir, "mask"), [1, 0, 1]);
    assert_eq!(
        stored_bytes(&dir, "h"),
        halves,
        "f16 -> f16 is a plain copy, NaNs included"
    );
    assert_eq!(
        manifest.metadata().get("convert.cast").map(String::as_str),
        Some("f16")
    );
}

// ---------------------------------------------------------------------------------------------
// burnpack

fn pack_tensor(
    name: &str,
    dtype: burn::tensor::DType,
    shape: Vec<usize>,
    id: Option<u64>,
    data: Vec<u8>,
) -> burn_pack::Tensor {
    burn_pack::Tensor::new(
        name.to_string(),
        dtype,
        shape,
        id,
        burn::tensor::Bytes::from_bytes_vec(data),
    )
}

#[test]
fn a_burnpack_converts_with_names_dtypes_shapes_bytes_and_param_ids() {
    use burn::tensor::{BoolStore, DType};
    let tmp = tempdir();
    let path = tmp.path().join("model.bpk");
    let inputs = vec![
        (
            "z.first",
            DType::F32,
            vec![3, 4],
            Some(11u64),
            pattern(48, 1),
        ),
        ("a.second", DType::F16, vec![5], Some(22), pattern(10, 2)),
        ("m.ids", DType::I64, vec![2], None, pattern(16, 3)),
        (
            "m.mask",
            DType::Bool(BoolStore::Native),
            vec![3],
            Some(33),
            vec![0, 1, 1],
        ),
        ("b.bf", DType::BF16, vec![2, 2], Some(44), pattern(8, 4)),
    ];
    let tensors = inputs
        .iter()
        .map(|(n, d, s, id, data)| pack_tensor(n, *d, s.clone(), *id, data.clone()))
        .collect();
    burn_pack::Writer::new(tensors)
        .with_metadata("model", "tiny")
        .write_to_file(&path)
        .unwrap();

    let out = tmp.path().join("store");
    let (manifest, summary) = from_burnpack(&path, &out, &mut ConvertOptions::default()).unwrap();
    assert_eq!(summary.written, inputs.len());
    for (name, dtype, shape, id, data) in &inputs {
        let entry = manifest.get(name).unwrap();
        assert_eq!(entry.dtype(), *dtype, "{name}");
        assert_eq!(entry.shape(), shape.as_slice(), "{name}");
        assert_eq!(entry.param_id(), *id, "{name}");
        assert_eq!(stored_bytes(&out, name), *data, "{name}");
    }
    // File order, i.e. the order the writer was given, not alphabetical.
    let names: Vec<&str> = manifest.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(names, inputs.iter().map(|t| t.0).collect::<Vec<_>>());
    assert_eq!(
        manifest
            .metadata()
            .get("burnpack.model")
            .map(String::as_str),
        Some("tiny")
    );
    assert_eq!(
        manifest
            .metadata()
            .get("convert.source")
            .map(String::as_str),
        Some("burnpack")
    );
}

#[test]
fn a_burnpack_cast_to_bf16_rounds_and_keeps_param_ids() {
    use burn::tensor::DType;
    let tmp = tempdir();
    let path = tmp.path().join("model.bpk");
    let values = [1.0f32, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5];
    burn_pack::Writer::new(vec![pack_tensor(
        "w",
        DType::F32,
        vec![4],
        Some(7),
        f32_le_bytes(values),
    )])
    .write_to_file(&path)
    .unwrap();
    let out = tmp.path().join("store");
    let (manifest, summary) = from_burnpack(
        &path,
        &out,
        &mut ConvertOptions::default().cast(CastTo::BF16),
    )
    .unwrap();
    assert_eq!(summary.cast, 1);
    assert_eq!(manifest.get("w").unwrap().dtype(), DType::BF16);
    assert_eq!(manifest.get("w").unwrap().param_id(), Some(7));
    assert_eq!(
        u16s(&stored_bytes(&out, "w")),
        [0x3F80, 0x3F80, 0x3F82, 0xC020]
    );
}

#[test]
fn rejects_a_corrupt_burnpack() {
    let tmp = tempdir();
    let path = tmp.path().join("bad.bpk");
    std::fs::write(&path, b"NOPE-not-a-burnpack-file").unwrap();
    let err =
        from_burnpack(&path, tmp.path().join("s"), &mut ConvertOptions::default()).unwrap_err();
    assert_matches!(&err, ConvertError::Burnpack { file, .. } if file == &path);
    assert!(err.to_string().contains("bad.bpk"));
}

#[test]
fn rejects_a_truncated_burnpack() {
    use burn::tensor::DType;
    let tmp = tempdir();
    let path = tmp.path().join("m.bpk");
    burn_pack::Writer::new(vec![pack_tensor(
        "w",
        DType::F32,
        vec![64],
        None,
        pattern(256, 1),
    )])
    .write_to_file(&path)
    .unwrap();
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() - 10]).unwrap();
    let err =
        from_burnpack(&path, tmp.path().join("s"), &mut ConvertOptions::default()).unwrap_err();
    assert_matches!(err, ConvertError::Burnpack { .. });
}

/// Every float parameter's path and id, sorted by path.
fn param_ids<M: Module>(module: &M) -> Vec<(String, u64)> {
    struct Id;
    impl ParamProbe for Id {
        type Out = u64;
        fn probe<const D: usize>(&mut self, param: &Param<Tensor<D>>) -> u64 {
            param.id.val()
        }
    }
    let mut ids = probe_float_params(module, Id);
    ids.sort();
    ids
}

#[test]
fn a_module_saved_by_burn_converts_and_loads_back_with_the_same_forward_pass() {
    let device = Device::flex();
    let original = Net::init(&device);
    let expected = original.forward(tokens(&device)).into_data();
    let tmp = tempdir();

    // Burn's own burnpack file (`Module::save_file` path).
    let bpk = tmp.path().join("net.bpk");
    original.clone().into_record().save(&bpk).unwrap();
    let from_bpk = tmp.path().join("from-bpk");
    let (manifest, _) = from_burnpack(&bpk, &from_bpk, &mut ConvertOptions::default()).unwrap();
    let ids: Vec<(String, u64)> = {
        let mut v: Vec<_> = manifest
            .tensors()
            .iter()
            .map(|t| (t.name().to_string(), t.param_id().unwrap()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids, param_ids(&original), "param ids survive");

    // burn-store's safetensors writer.
    let st = tmp.path().join("net.safetensors");
    original
        .clone()
        .save_into(&mut SafetensorsStore::from_file(&st))
        .unwrap();
    let from_st = tmp.path().join("from-st");
    from_safetensors(&st, &from_st, &mut ConvertOptions::default()).unwrap();

    for dir in [&from_bpk, &from_st] {
        let record = MappedRecorder::default().load(dir).unwrap();
        let loaded = Net::init(&device).load_record(record);
        let got = loaded.forward(tokens(&device)).into_data();
        assert_eq!(got.as_bytes(), expected.as_bytes(), "{}", dir.display());
    }
    let opened = BurnpackInput::open(&bpk).unwrap();
    assert_eq!(opened.tensors().len(), manifest.tensors().len());
}
