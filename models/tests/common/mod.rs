//! Fixture access shared by this crate's integration tests: the tiny fixtures loaded through
//! burn-store. The fixtures' reference outputs and the check against them are the workspace's
//! shared test support (`burn_mapped_tests::tiny_qwen2`).
#![allow(dead_code)]

pub mod gguf_meta;

use burn::store::{ModuleStore, SafetensorsStore};
use burn_mapped_models::qwen2::{Qwen2Config, Qwen2ForCausalLM};
use burn_mapped_tests::tiny_qwen2::fixture;

/// The fixture model with its safetensors applied through burn-store, failing on any
/// missing, unused or mis-shaped tensor.
pub fn load(variant: &str) -> Qwen2ForCausalLM {
    let dir = fixture(variant);
    let config = Qwen2Config::from_hf_json(dir.join("config.json")).unwrap();
    let mut model = config.init(&burn::tensor::Device::flex());
    let result = SafetensorsStore::from_file(dir.join("model.safetensors"))
        .apply_to(&mut model)
        .unwrap();
    assert!(
        result.errors.is_empty() && result.missing.is_empty() && result.unused.is_empty(),
        "{result:?}"
    );
    model
}

/// Names and shapes of the tensors in a safetensors file, read from its JSON header.
pub fn safetensors_shapes(path: &std::path::Path) -> Vec<(String, Vec<usize>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut out: Vec<(String, Vec<usize>)> = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let shape = burn_mapped_tests::json::usizes(&v["shape"]);
            (k, shape)
        })
        .collect();
    out.sort();
    out
}
