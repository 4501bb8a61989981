//! Dequantization checked bit for bit against the Python `gguf` package.
//!
//! The fixtures come from `fixtures/gguf/make_fixture.py`, which runs
//! `gguf.quants.dequantize` on real blocks of the Qwen2.5-Coder checkpoint and
//! on seeded random and special-value blocks.

use std::collections::BTreeSet;

use burn_mapped::gguf::{GgmlType, GgufError, can_dequantize, dequantize, dequantize_to_vec};
use serde_json::Value as Json;

const DEQUANT_BLOCKS: &str = include_str!("../fixtures/gguf/dequant_blocks.json");
const GGML_TYPES: &str = include_str!("../fixtures/gguf/ggml_types.json");

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn type_by_name(name: &str) -> GgmlType {
    *GgmlType::ALL
        .iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

#[test]
fn dequantization_matches_gguf_py_bit_for_bit() {
    let cases: Vec<Json> = serde_json::from_str(DEQUANT_BLOCKS).unwrap();
    let mut covered = BTreeSet::new();
    for case in &cases {
        let name = case["case"].as_str().unwrap();
        let ty = type_by_name(case["ggml_type"].as_str().unwrap());
        let raw = hex(case["raw_hex"].as_str().unwrap());
        let expected: Vec<u32> = case["expected_f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
            .collect();
        let mut out = vec![f32::from_bits(0xDEAD_BEEF); expected.len()];
        dequantize(ty, &raw, &mut out).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, (&got, &want)) in out.iter().zip(&expected).enumerate() {
            assert_eq!(
                got.to_bits(),
                want,
                "{name}: element {i} is {got:e} ({:#010x}), gguf-py gives {:e} ({want:#010x})",
                got.to_bits(),
                f32::from_bits(want)
            );
        }
        covered.insert(ty.name());
    }
    let supported: BTreeSet<_> = GgmlType::ALL
        .iter()
        .filter(|t| can_dequantize(**t))
        .map(|t| t.name())
        .collect();
    assert_eq!(covered, supported, "every supported type has fixture cases");
}

#[test]
fn ggml_type_table_matches_gguf_py() {
    let table: Vec<Json> = serde_json::from_str(GGML_TYPES).unwrap();
    let mut seen = BTreeSet::new();
    for entry in &table {
        let id = u32::try_from(entry["id"].as_u64().unwrap()).unwrap();
        let name = entry["name"].as_str().unwrap();
        let ty = GgmlType::from_id(id).unwrap_or_else(|| panic!("id {id} ({name}) unknown"));
        assert_eq!(ty.name(), name);
        assert_eq!(ty.id(), id);
        assert_eq!(
            ty.block_size(),
            entry["block_size"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            ty.type_size(),
            entry["type_size"].as_u64().unwrap(),
            "{name}"
        );
        seen.insert(id);
    }
    for ty in GgmlType::ALL {
        assert!(seen.contains(&ty.id()), "{ty} is not in gguf-py's table");
    }
    for retired in [4, 5, 31, 32, 33, 36, 37, 38] {
        assert_eq!(GgmlType::from_id(retired), None);
    }
}

#[test]
fn rejects_a_partial_block() {
    let err = dequantize(GgmlType::Q4_K, &[0; 145], &mut [0.0; 256]).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::PartialBlock {
                ggml_type: GgmlType::Q4_K,
                src_len: 145,
                type_size: 144
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_a_destination_of_the_wrong_length() {
    let mut dst = [7.0f32; 31];
    let err = dequantize(GgmlType::Q8_0, &[0; 34], &mut dst).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::DestinationLength {
                expected: 32,
                found: 31,
                ..
            }
        ),
        "{err}"
    );
    assert!(dst.iter().all(|&v| v == 7.0), "dst untouched on error");
}

#[test]
fn rejects_an_unsupported_type() {
    let err = dequantize_to_vec(GgmlType::IQ2_XXS, &[0; 66]).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::UnsupportedDequant {
                ggml_type: GgmlType::IQ2_XXS
            }
        ),
        "{err}"
    );
}

#[test]
fn empty_input_gives_empty_output() {
    for &ty in GgmlType::ALL.iter().filter(|t| can_dequantize(**t)) {
        assert_eq!(dequantize_to_vec(ty, &[]).unwrap(), Vec::<f32>::new());
    }
}
