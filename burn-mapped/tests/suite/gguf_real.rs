//! The real Qwen2.5-Coder-0.5B-Instruct Q4_K_M checkpoint, checked against
//! what the Python `gguf` package reads from it (`fixtures/gguf/real_file.json`,
//! written by `make_fixture.py`).
//!
//! Runs only when the checkpoint is there (`burn-mapped fetch` puts it in the
//! cache, `$BURN_MAPPED_GGUF` names another copy); without it the test prints a
//! note and passes, unless `BURN_MAPPED_REQUIRE_REAL=1` (set by CI).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use burn_mapped::gguf::{GgufFile, Value, can_dequantize, dequantize};
use burn_mapped_tests::gguf::assert_table_like_gguf_py;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

const REAL_FILE: &str = include_str!("../fixtures/gguf/real_file.json");

#[test]
fn the_real_checkpoint_reads_like_gguf_py_reads_it() {
    let Some(path) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let expected: Json = serde_json::from_str(REAL_FILE).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let gguf = file.gguf();

    // The header and the tensor table, entry by entry.
    assert_table_like_gguf_py(gguf, &expected);
    assert_eq!(gguf.tensors().len(), 291);
    assert_eq!(gguf.architecture().unwrap(), "qwen2");

    // Scalar and string metadata, and the ends of the arrays.
    for (key, want) in expected["metadata"].as_object().unwrap() {
        let got = gguf.get(key).unwrap_or_else(|| panic!("{key} missing"));
        match want["type"].as_str().unwrap() {
            "string" => assert_eq!(gguf.get_str(key).unwrap(), want["value"].as_str().unwrap()),
            "UINT32" => assert_eq!(
                u64::from(gguf.get_u32(key).unwrap()),
                want["value"].as_u64().unwrap(),
                "{key}"
            ),
            "FLOAT32" => assert_eq!(
                u64::from(gguf.get_f32(key).unwrap().to_bits()),
                want["bits"].as_u64().unwrap(),
                "{key}"
            ),
            "BOOL" => assert_eq!(
                gguf.get_bool(key).unwrap(),
                want["value"].as_bool().unwrap()
            ),
            "array" => {
                let (len, first, last): (usize, Vec<Json>, Vec<Json>) = match got {
                    Value::Array(_) if want["element_type"] == "STRING" => {
                        let v = gguf.get_str_array(key).unwrap();
                        let j = |s: &String| Json::from(s.as_str());
                        (
                            v.len(),
                            v[..3].iter().map(j).collect(),
                            vec![j(&v[v.len() - 1])],
                        )
                    }
                    Value::Array(_) if want["element_type"] == "INT32" => {
                        let v = gguf.get_i32_array(key).unwrap();
                        let j = |x: &i32| Json::from(*x);
                        (
                            v.len(),
                            v[..3].iter().map(j).collect(),
                            vec![j(&v[v.len() - 1])],
                        )
                    }
                    other => panic!("{key}: unexpected {}", other.type_description()),
                };
                assert_eq!(len as u64, want["len"].as_u64().unwrap(), "{key}");
                assert_eq!(first, *want["first"].as_array().unwrap(), "{key}");
                assert_eq!(last, *want["last"].as_array().unwrap(), "{key}");
            }
            other => panic!("{key}: fixture type {other} not handled"),
        }
    }

    let tensors = expected["tensors"].as_array().unwrap();
    let mut type_counts = BTreeMap::new();
    for info in gguf.tensors() {
        *type_counts.entry(info.ggml_type().name()).or_insert(0) += 1;
    }
    let counts: Vec<_> = type_counts.into_iter().collect();
    assert_eq!(
        counts,
        [
            ("F32", 121),
            ("Q4_K", 12),
            ("Q5_0", 133),
            ("Q6_K", 12),
            ("Q8_0", 13)
        ]
    );
    let embd = gguf.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.shape_row_major(), [151_936, 896]);

    // Whole tensors dequantized, hashed as little-endian f32 like the
    // fixture. All of them in release builds; one per type otherwise.
    let mut seen_types = BTreeSet::new();
    let mut buf = Vec::new();
    let mut bytes = Vec::new();
    let mut checked = 0;
    let (mut dequant_time, mut elements) = (Duration::ZERO, 0usize);
    for (info, want) in gguf.tensors().iter().zip(tensors) {
        assert!(can_dequantize(info.ggml_type()), "{}", info.name());
        if cfg!(debug_assertions) && !seen_types.insert(info.ggml_type().id()) {
            continue;
        }
        buf.resize(info.n_elements() as usize, 0.0);
        let start = Instant::now();
        dequantize(info.ggml_type(), file.tensor_data(info).unwrap(), &mut buf).unwrap();
        dequant_time += start.elapsed();
        elements += buf.len();
        let mut hasher = Sha256::new();
        for chunk in buf.chunks(1 << 14) {
            bytes.clear();
            bytes.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
            hasher.update(&bytes);
        }
        let got: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            got,
            want["f32_sha256"].as_str().unwrap(),
            "dequantized {} ({}) differs from gguf-py",
            info.name(),
            info.ggml_type()
        );
        checked += 1;
    }
    eprintln!(
        "{checked} whole tensors match gguf-py's dequantization \
         ({elements} elements dequantized in {dequant_time:.2?})"
    );
}
