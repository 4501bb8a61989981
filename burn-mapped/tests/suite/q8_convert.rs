//! Converting to q8: which tensors are quantized, what lands in the store, and the recorded
//! per-matrix error. Every check recomputes from the input values with code written here (f16
//! and bf16 decoded from their bit layouts, error sums in f64), never from the converter's own
//! numbers; the GGUF case takes its source values from the Python `gguf` package's
//! dequantization (`fixtures/gguf/tiny.json`).

use crate::q8_common;

use std::path::Path;

use burn::tensor::DType;
use burn_mapped::convert::{CastTo, ConvertError, ConvertOptions, from_burnpack, from_safetensors};
use burn_mapped::gguf::{GgufConvertError, MappedGguf, gguf_to_store};
use burn_mapped::q8::{Q8Error, is_projection_weight, scale_name};
use burn_mapped::{Manifest, MappedStore, StoreError, manifest::Q8_ROW_F16};
use burn_mapped_tests::json::{u32s, usizes};
use burn_mapped_tests::numeric::f16_value;
use burn_mapped_tests::synthetic::{RawTensor, write_safetensors};
use q8_common::Rng;
use safetensors::Dtype;
use serde_json::Value as Json;

const TINY_GGUF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gguf/tiny.gguf");
const TINY_JSON: &str = include_str!("../fixtures/gguf/tiny.json");

// ---------------------------------------------------------------------------------------------
// Reference decoding and checks, written from the format definitions.

/// bfloat16 is the top half of an f32.
fn bf16_value(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

/// The source values of a little-endian tensor, exactly, in f64.
fn exact_values(dtype: Dtype, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16_value(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16_value(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        other => panic!("not a float: {other:?}"),
    }
}

/// Reads a q8 matrix back from the store and checks it against the exact source `w`
/// (`[out, in]`): the link, the scale rule, the rounding of every value, and the recorded
/// error against `||W - s q||_F / ||W||_F` summed here in f64. Returns that error.
fn check_q8(dir: &Path, name: &str, w: &[f64], out: usize, inp: usize) -> f64 {
    let store = MappedStore::open(dir).unwrap();
    let entry = store.manifest().get(name).unwrap();
    assert_eq!(entry.dtype(), DType::I8, "{name}");
    assert_eq!(entry.shape(), [out, inp], "{name}");
    let link = entry
        .quant()
        .unwrap_or_else(|| panic!("{name}: no q8 link"));
    assert_eq!(link.scheme, Q8_ROW_F16);
    assert_eq!(link.scale, format!("{name}_scale"));
    let scale_entry = store.manifest().get(&link.scale).unwrap();
    assert_eq!(scale_entry.dtype(), DType::F16);
    assert_eq!(scale_entry.shape(), [out]);
    let q: Vec<i8> = store
        .mapped(name)
        .unwrap()
        .bytes()
        .iter()
        .map(|&b| b as i8)
        .collect();
    let s: Vec<f64> = store
        .mapped(&link.scale)
        .unwrap()
        .bytes()
        .chunks_exact(2)
        .map(|c| f16_value(u16::from_le_bytes([c[0], c[1]])))
        .collect();

    let (mut diff, mut norm) = (0f64, 0f64);
    for o in 0..out {
        let row = &w[o * inp..(o + 1) * inp];
        // Quantization sees the values as f32 (exact for f32/f16/bf16 inputs).
        let absmax = row
            .iter()
            .fold(0f64, |m, &v| m.max(f64::from(v as f32).abs()));
        let target = absmax / 127.0;
        // The scale is f16(absmax / 127): within half an f16 step (2^-11 relative for
        // normals, 2^-25 absolute for subnormals) of the exact quotient.
        assert!(
            (s[o] - target).abs() <= target * 2f64.powi(-11) * 1.0001 + 2f64.powi(-25),
            "{name} row {o}: scale {} for absmax {absmax}",
            s[o]
        );
        for (i, &v) in row.iter().enumerate() {
            let qv = q[o * inp + i];
            assert!(qv != i8::MIN, "{name} [{o}, {i}]: -128 is never produced");
            let v32 = f64::from(v as f32);
            if s[o] == 0.0 {
                assert_eq!(qv, 0, "{name} [{o}, {i}]");
            } else if qv.unsigned_abs() < 127 || v32.abs() < 127.0 * s[o] {
                // Rounded to nearest: no farther than half a step from the value.
                assert!(
                    (v32 - s[o] * f64::from(qv)).abs() <= s[o] * (0.5 + 1e-9),
                    "{name} [{o}, {i}]: {v32} -> {qv} * {}",
                    s[o]
                );
            }
            let d = v - s[o] * f64::from(qv);
            diff += d * d;
            norm += v * v;
        }
    }
    let want = (diff / norm).sqrt();
    // Recorded as an f32: equal to the f64 error rounded once.
    let got = f64::from(link.rel_error.unwrap_or_else(|| panic!("{name}: no error")));
    assert!(
        (got - want).abs() <= 1e-7 * want,
        "{name}: recorded {got}, recomputed {want}"
    );
    got
}

type Raw = RawTensor<String>;

fn encode(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F64 => values
            .iter()
            // Extra low bits so the f64 values are not f32 values.
            .flat_map(|&v| (f64::from(v) * (1.0 + 1e-12)).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| burn::tensor::f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|&v| burn::tensor::bf16::from_f32(v).to_le_bytes())
            .collect(),
        other => panic!("{other:?}"),
    }
}

fn raw(rng: &mut Rng, name: &str, dtype: Dtype, shape: &[usize]) -> Raw {
    let n = shape.iter().product();
    // Rows of different magnitudes so every row gets its own scale.
    let cols = *shape.last().unwrap_or(&1);
    let values: Vec<f32> = rng
        .vec_nonzero(n)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (0.01 + (i / cols.max(1) % 7) as f32))
        .collect();
    (
        name.to_string(),
        dtype,
        shape.to_vec(),
        encode(dtype, &values),
    )
}

fn q8_options() -> ConvertOptions<'static> {
    ConvertOptions::default()
        .cast(CastTo::F32)
        .q8(is_projection_weight)
}

// ---------------------------------------------------------------------------------------------
// The rule.

#[test]
fn the_rule_picks_qwen_projections_and_the_head_but_not_embeddings_norms_or_biases() {
    let yes = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.23.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.4.mlp.gate_proj.weight",
        "model.layers.4.mlp.up_proj.weight",
        "model.layers.4.mlp.down_proj.weight",
        "lm_head.weight",
        "blk.0.attn_q.weight",
        "blk.0.ffn_down.weight",
        "output.weight",
    ];
    for name in yes {
        assert!(is_projection_weight(name, &[64, 32]), "{name}");
    }
    let no = [
        ("model.embed_tokens.weight", vec![64, 32]),
        ("token_embd.weight", vec![64, 32]),
        ("transformer.wte.weight", vec![64, 32]),
        ("transformer.wpe.weight", vec![64, 32]),
        ("model.layers.0.input_layernorm.weight", vec![32]),
        ("model.norm.weight", vec![32]),
        ("model.layers.0.self_attn.q_proj.bias", vec![32]),
        ("model.layers.0.self_attn.q_proj.bias", vec![2, 16]),
        ("conv.weight", vec![8, 3, 3, 3]),
        ("rope_freqs", vec![64, 32]),
    ];
    for (name, shape) in no {
        assert!(!is_projection_weight(name, &shape), "{name} {shape:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors and burnpack.

#[test]
fn a_safetensors_checkpoint_converts_to_q8_with_each_error_recorded_exactly() {
    let mut rng = Rng::fresh();
    let tmp = burn_mapped_tests::tempdir();
    let input = tmp.path().join("model.safetensors");
    let tensors = vec![
        raw(
            &mut rng,
            "model.embed_tokens.weight",
            Dtype::BF16,
            &[50, 24],
        ),
        raw(
            &mut rng,
            "model.layers.0.self_attn.q_proj.weight",
            Dtype::BF16,
            &[37, 53],
        ),
        raw(
            &mut rng,
            "model.layers.0.self_attn.q_proj.bias",
            Dtype::BF16,
            &[37],
        ),
        raw(
            &mut rng,
            "model.layers.0.mlp.down_proj.weight",
            Dtype::F16,
            &[19, 45],
        ),
        raw(
            &mut rng,
            "model.layers.0.mlp.up_proj.weight",
            Dtype::F64,
            &[45, 19],
        ),
        raw(
            &mut rng,
            "model.layers.0.input_layernorm.weight",
            Dtype::F32,
            &[24],
        ),
        // Over CHUNK_BYTES (8 MiB) of f32: quantized in several row blocks.
        raw(&mut rng, "lm_head.weight", Dtype::F32, &[700, 3001]),
        (
            "model.position_ids".to_string(),
            Dtype::I32,
            vec![2, 3],
            (0..6i32).flat_map(|v| v.to_le_bytes()).collect(),
        ),
    ];
    write_safetensors(&input, &tensors, None);
    let out = tmp.path().join("store");
    let (manifest, summary) = from_safetensors(&input, &out, &mut q8_options()).unwrap();
    assert_eq!(summary.written, tensors.len());
    assert_eq!(summary.quantized, 4);
    assert_eq!(manifest.tensors().len(), tensors.len() + 4);
    assert_eq!(
        manifest.metadata().get("convert.q8").map(String::as_str),
        Some(Q8_ROW_F16)
    );

    for (name, dtype, shape, bytes) in &tensors {
        let entry = manifest.get(name).unwrap();
        if *dtype == Dtype::I32 {
            assert_eq!(entry.dtype(), DType::I32);
            assert!(entry.quant().is_none());
        } else if is_projection_weight(name, shape) {
            let err = check_q8(&out, name, &exact_values(*dtype, bytes), shape[0], shape[1]);
            assert!(err > 0.0 && err < 0.01, "{name}: {err}");
        } else {
            // Embedding, bias and norm: f32, value for value.
            assert_eq!(entry.dtype(), DType::F32, "{name}");
            assert!(entry.quant().is_none(), "{name}");
            assert!(manifest.get(&scale_name(name)).is_none(), "{name}");
            let store = MappedStore::open(&out).unwrap();
            let stored: Vec<f64> = exact_values(Dtype::F32, store.mapped(name).unwrap().bytes());
            assert_eq!(stored, exact_values(*dtype, bytes), "{name}");
        }
    }
    // The manifest as read back carries the same errors, bit for bit.
    assert_eq!(Manifest::read(&out).unwrap(), manifest);
}

#[test]
fn a_burnpack_converts_to_q8_like_safetensors() {
    use burn::store::burn_pack;
    let mut rng = Rng::fresh();
    let tmp = burn_mapped_tests::tempdir();
    let path = tmp.path().join("model.bpk");
    let w = rng.vec_nonzero(33 * 17);
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let emb: Vec<u8> = rng
        .vec_nonzero(10 * 17)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let tensor = |name: &str, shape: Vec<usize>, data: Vec<u8>| {
        burn_pack::Tensor::new(
            name.to_string(),
            DType::F32,
            shape,
            Some(7),
            burn::tensor::Bytes::from_bytes_vec(data),
        )
    };
    burn_pack::Writer::new(vec![
        tensor("layer.linear.weight", vec![33, 17], bytes.clone()),
        tensor("embed.weight", vec![10, 17], emb.clone()),
    ])
    .write_to_file(&path)
    .unwrap();
    let out = tmp.path().join("store");
    let (manifest, summary) = from_burnpack(&path, &out, &mut q8_options()).unwrap();
    assert_eq!(summary.quantized, 1);
    check_q8(
        &out,
        "layer.linear.weight",
        &exact_values(Dtype::F32, &bytes),
        33,
        17,
    );
    let embed = manifest.get("embed.weight").unwrap();
    assert_eq!((embed.dtype(), embed.param_id()), (DType::F32, Some(7)));
}

#[test]
fn rejects_a_non_finite_weight_naming_the_tensor_and_its_row_in_a_later_block() {
    let mut rng = Rng::fresh();
    let tmp = burn_mapped_tests::tempdir();
    let input = tmp.path().join("model.safetensors");
    let (out_rows, inp) = (700, 3001);
    let mut w = rng.vec_nonzero(out_rows * inp);
    // Row 699 is past the first 8 MiB block (698 rows of 3001 f32).
    w[699 * inp + 9] = f32::INFINITY;
    let bytes = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors: [Raw; 1] = [("a.weight".into(), Dtype::F32, vec![out_rows, inp], bytes)];
    write_safetensors(&input, &tensors, None);
    let out = tmp.path().join("store");
    let err = from_safetensors(&input, &out, &mut q8_options()).unwrap_err();
    match err {
        ConvertError::Quantize { tensor, source, .. } => {
            assert_eq!(tensor, "a.weight");
            assert!(
                matches!(
                    *source,
                    Q8Error::NonFinite {
                        row: 699,
                        col: 9,
                        ..
                    }
                ),
                "{source:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!out.exists(), "a failed conversion publishes nothing");
}

#[test]
fn rejects_an_input_tensor_that_takes_a_scale_name() {
    let tmp = burn_mapped_tests::tempdir();
    let input = tmp.path().join("model.safetensors");
    let tensors: [Raw; 2] = [
        (
            "a.weight".into(),
            Dtype::F32,
            vec![2, 2],
            encode(Dtype::F32, &[1.0, 2.0, 3.0, 4.0]),
        ),
        (
            "a.weight_scale".into(),
            Dtype::F32,
            vec![2],
            encode(Dtype::F32, &[1.0, 2.0]),
        ),
    ];
    write_safetensors(&input, &tensors, None);
    let err = from_safetensors(&input, tmp.path().join("store"), &mut q8_options()).unwrap_err();
    assert!(
        matches!(&err, ConvertError::ScaleNameTaken { tensor, scale, other, .. }
            if tensor == "a.weight" && scale == "a.weight_scale" && other == "a.weight_scale"),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// GGUF.

/// Each tensor of tiny.gguf: name, row-major shape, values as the `gguf` package dequantizes them.
fn tiny_tensors() -> Vec<(String, [usize; 2], Vec<f64>)> {
    let json: Json = serde_json::from_str(TINY_JSON).unwrap();
    json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let dims = usizes(&t["dims"]);
            let values = u32s(&t["f32_bits"])
                .into_iter()
                .map(|b| f64::from(f32::from_bits(b)))
                .collect();
            (
                t["name"].as_str().unwrap().to_string(),
                [dims[1], dims[0]],
                values,
            )
        })
        .collect()
}

/// tiny.gguf converted into a store at `out`, floats as f32, its tensors renamed by `rename` and
/// those `q8` picks quantized: [`gguf_to_store`]'s own result, error included.
#[allow(clippy::result_large_err)]
fn convert_tiny(
    out: &Path,
    rename: &dyn Fn(&str) -> Option<String>,
    q8: &dyn Fn(&str, &[usize]) -> bool,
) -> Result<Manifest, GgufConvertError> {
    let gguf = MappedGguf::open(TINY_GGUF).unwrap();
    gguf_to_store(&gguf, out, ConvertOptions::default().rename(rename).q8(q8))
}

/// tiny.gguf's own names.
fn same_name(name: &str) -> Option<String> {
    Some(name.to_string())
}

#[test]
fn a_gguf_requantizes_every_picked_matrix_against_the_gguf_packages_values() {
    let tmp = burn_mapped_tests::tempdir();
    let out = tmp.path().join("store");
    let manifest = convert_tiny(&out, &same_name, &|_, _| true).unwrap();
    let tensors = tiny_tensors();
    assert!(tensors.iter().any(|t| t.0 == "t.q8_0"));
    for (name, [out_rows, inp], values) in &tensors {
        check_q8(&out, name, values, *out_rows, *inp);
    }
    assert_eq!(manifest.tensors().len(), 2 * tensors.len());
}

#[test]
fn a_gguf_with_no_picked_matrix_stays_float() {
    let tmp = burn_mapped_tests::tempdir();
    let out = tmp.path().join("store");
    // tiny.gguf's names (`t.f32`, ...) do not end in `weight`: the rule picks none.
    let manifest = convert_tiny(&out, &same_name, &is_projection_weight).unwrap();
    for (name, _, values) in tiny_tensors() {
        let entry = manifest.get(&name).unwrap();
        assert_eq!(entry.dtype(), DType::F32);
        let store = MappedStore::open(&out).unwrap();
        assert_eq!(
            exact_values(Dtype::F32, store.mapped(&name).unwrap().bytes()),
            values
        );
    }
}

#[test]
fn rejects_a_gguf_rename_onto_a_scale_name() {
    let tmp = burn_mapped_tests::tempdir();
    let rename = |name: &str| {
        Some(match name {
            "t.f32" => "w".to_string(),
            "t.f16" => "w_scale".to_string(),
            other => other.to_string(),
        })
    };
    let only_w = |name: &str, _: &[usize]| name == "w";
    let err = convert_tiny(&tmp.path().join("store"), &rename, &only_w).unwrap_err();
    assert!(
        matches!(&err, GgufConvertError::ScaleNameTaken { tensor, scale, other }
            if tensor == "t.f32" && scale == "w_scale" && other == "t.f16"),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The manifest field.

fn manifest_with_link(link: &str) -> String {
    burn_mapped_tests::synthetic::sealed_manifest(&format!(
        r#"{{"format":"burn-mapped","version":2,"alignment":16384,"tensors":[
        {{"name":"w","dtype":"i8","shape":[2,3],"file":"00000-w.tensor","len":6,
          "xxh3":"0000000000000000","quant":{link}}},
        {{"name":"w_scale","dtype":"f16","shape":[2],"file":"00001-w_scale.tensor","len":4,
          "xxh3":"0000000000000000"}}]}}"#
    ))
}

#[test]
fn a_manifest_link_without_an_error_still_reads() {
    let text = manifest_with_link(r#"{"scheme":"q8-row-f16","scale":"w_scale"}"#);
    let manifest = Manifest::parse(text.as_bytes(), Path::new("manifest.json")).unwrap();
    assert_eq!(manifest.get("w").unwrap().quant().unwrap().rel_error, None);
    assert!(!manifest.to_json().contains("rel_error"));
    let text =
        manifest_with_link(r#"{"scheme":"q8-row-f16","scale":"w_scale","rel_error":0.0125}"#);
    let manifest = Manifest::parse(text.as_bytes(), Path::new("manifest.json")).unwrap();
    assert_eq!(
        manifest.get("w").unwrap().quant().unwrap().rel_error,
        Some(0.0125f32)
    );
}

#[test]
fn rejects_a_negative_recorded_error() {
    let text = manifest_with_link(r#"{"scheme":"q8-row-f16","scale":"w_scale","rel_error":-0.5}"#);
    let err = Manifest::parse(text.as_bytes(), Path::new("manifest.json")).unwrap_err();
    assert!(
        matches!(&err, StoreError::BadQuantLink { tensor, .. } if tensor == "w"),
        "{err:?}"
    );
}
