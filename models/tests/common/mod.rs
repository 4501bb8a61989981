//! Fixture access shared by the integration tests.
#![allow(dead_code)]

pub mod gguf_meta;

use std::path::PathBuf;

use burn::store::{ModuleStore, SafetensorsStore};
use burn::tensor::{Int, Tensor, TensorData};
use burn_mapped_models::qwen2::{Qwen2Config, Qwen2ForCausalLM, argmax};

/// `tests/fixtures/tiny_qwen2/<variant>`, written by `fixtures/make_tiny_qwen2.py`.
pub fn fixture(variant: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny_qwen2")
        .join(variant)
}

/// What transformers produced for the fixture prompt.
pub struct Reference {
    pub prompt: Vec<u32>,
    /// Greedy tokens: the choice after the prompt, then after each decode step.
    pub generated: Vec<u32>,
    pub vocab_size: usize,
    /// One row per prompt position, then one per cached decode step.
    pub logits: Vec<Vec<f32>>,
}

pub fn reference(variant: &str) -> Reference {
    let dir = fixture(variant);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids = |key: &str| -> Vec<u32> {
        meta[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let vocab_size = meta["vocab_size"].as_u64().unwrap() as usize;
    let rows =
        (meta["prefill_rows"].as_u64().unwrap() + meta["decode_rows"].as_u64().unwrap()) as usize;
    let bytes = std::fs::read(dir.join("logits.f32")).unwrap();
    assert_eq!(bytes.len(), rows * vocab_size * 4, "logits.f32 size");
    let flat: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Reference {
        prompt: ids("prompt"),
        generated: ids("generated"),
        vocab_size,
        logits: flat.chunks(vocab_size).map(<[f32]>::to_vec).collect(),
    }
}

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
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            (k, shape)
        })
        .collect();
    out.sort();
    out
}

/// `max |a - b| / max |b|`: error relative to the reference row's scale.
pub fn relative_error(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference
        .iter()
        .fold(0.0f64, |m, &b| m.max((b as f64).abs()));
    let diff = ours
        .iter()
        .zip(reference)
        .fold(0.0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
    diff / scale
}

/// Bound on `max |ours - hf| / max |hf|` per logits row. Both sides are f32 with different
/// summation orders; observed errors are near 1e-6.
pub const MAX_RELATIVE_ERROR: f64 = 1e-4;

pub fn tokens(ids: &[u32]) -> Tensor<2, Int> {
    Tensor::from_data(
        TensorData::new(ids.iter().map(|&t| t as i64).collect(), [1, ids.len()]),
        &burn::tensor::Device::flex(),
    )
}

/// Rows of `[batch, seq, vocab]` logits, batch-major.
pub fn rows(logits: Tensor<3>) -> Vec<Vec<f32>> {
    let [batch, seq, vocab] = logits.dims();
    let flat = logits.try_into_vec_as::<f32>().unwrap();
    assert_eq!(flat.len(), batch * seq * vocab);
    flat.chunks(vocab).map(<[f32]>::to_vec).collect()
}

pub fn check_row(what: &str, ours: &[f32], hf: &[f32]) -> f64 {
    let err = relative_error(ours, hf);
    eprintln!("{what}: relative error {err:.3e}");
    assert!(
        err < MAX_RELATIVE_ERROR,
        "{what}: relative error {err:.3e} exceeds {MAX_RELATIVE_ERROR:e}"
    );
    err
}

/// Prefill the prompt, then 8 cached single-token steps, each fed our own greedy choice.
pub fn prefill_then_cached_decode(model: &Qwen2ForCausalLM, r: &Reference, variant: &str) {
    let steps = r.generated.len() - 1;
    let prompt_len = r.prompt.len();
    let mut cache = model.new_cache(1, prompt_len + steps);

    let prefill = rows(model.forward(tokens(&r.prompt), &mut cache).unwrap());
    assert_eq!(prefill.len(), prompt_len);
    let mut worst: f64 = 0.0;
    for (pos, row) in prefill.iter().enumerate() {
        worst = worst.max(check_row(
            &format!("{variant} prefill position {pos}"),
            row,
            &r.logits[pos],
        ));
    }
    let mut token = argmax(prefill.last().unwrap()).unwrap();
    let mut chosen = vec![token];
    for step in 0..steps {
        let row = rows(model.forward(tokens(&[token]), &mut cache).unwrap()).remove(0);
        worst = worst.max(check_row(
            &format!("{variant} decode step {step}"),
            &row,
            &r.logits[prompt_len + step],
        ));
        token = argmax(&row).unwrap();
        chosen.push(token);
    }
    assert_eq!(cache.len(), prompt_len + steps);
    eprintln!("{variant}: worst relative error {worst:.3e}, tokens {chosen:?}");
    assert_eq!(
        chosen, r.generated,
        "greedy tokens differ from transformers"
    );
}
