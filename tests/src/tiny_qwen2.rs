//! The tiny Qwen2 fixtures (`models/tests/fixtures/tiny_qwen2/{tied,untied}`, written by
//! `make_tiny_qwen2.py`): transformers' own logits and greedy tokens for a fixed prompt, and the
//! check that a loaded model reproduces them, whichever crate loaded it.

use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped_models::qwen2::{KvCache, Qwen2ForCausalLM, argmax};

use crate::json::u32s;
use crate::numeric::read_f32s;

/// Bound on `max |ours - hf| / max |hf|` per logits row. Both sides are f32 with different
/// summation orders; observed errors are near 1e-6.
pub const MAX_RELATIVE_ERROR: f64 = 1e-4;

/// `models/tests/fixtures/tiny_qwen2/<variant>`.
pub fn fixture(variant: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/tests/fixtures/tiny_qwen2"
    ))
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
    let vocab_size = meta["vocab_size"].as_u64().unwrap() as usize;
    let rows =
        (meta["prefill_rows"].as_u64().unwrap() + meta["decode_rows"].as_u64().unwrap()) as usize;
    let flat = read_f32s(dir.join("logits.f32"));
    assert_eq!(flat.len(), rows * vocab_size, "logits.f32 size");
    Reference {
        prompt: u32s(&meta["prompt"]),
        generated: u32s(&meta["generated"]),
        vocab_size,
        logits: flat.chunks(vocab_size).map(<[f32]>::to_vec).collect(),
    }
}

/// `max |a - b| / max |b|`: error relative to the reference row's scale.
pub fn relative_error(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference
        .iter()
        .fold(0.0f64, |m, &b| m.max(f64::from(b).abs()));
    let diff = ours.iter().zip(reference).fold(0.0f64, |m, (&a, &b)| {
        m.max((f64::from(a) - f64::from(b)).abs())
    });
    diff / scale
}

/// `[1, n]` token ids on the default Flex device.
pub fn tokens(ids: &[u32]) -> Tensor<2, Int> {
    Tensor::from_data(
        TensorData::new(ids.iter().map(|&t| i64::from(t)).collect(), [1, ids.len()]),
        &Device::flex(),
    )
}

/// Rows of `[batch, seq, vocab]` logits, batch-major.
pub fn rows(logits: Tensor<3>) -> Vec<Vec<f32>> {
    let [batch, seq, vocab] = logits.dims();
    let flat = logits.try_into_vec_as::<f32>().unwrap();
    assert_eq!(flat.len(), batch * seq * vocab);
    flat.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// Asserts one logits row within [`MAX_RELATIVE_ERROR`] of transformers'; returns the error.
pub fn check_row(what: &str, ours: &[f32], hf: &[f32]) -> f64 {
    let err = relative_error(ours, hf);
    eprintln!("{what}: relative error {err:.3e}");
    assert!(
        err < MAX_RELATIVE_ERROR,
        "{what}: relative error {err:.3e} exceeds {MAX_RELATIVE_ERROR:e}"
    );
    err
}

/// Prefills the prompt, then runs one cached single-token step per further reference token,
/// each fed our own greedy choice: every row must match transformers' logits and the greedy
/// tokens its tokens. Calls `after_forward` with the number of forwards run so far.
pub fn decode_like_transformers(
    model: &Qwen2ForCausalLM,
    r: &Reference,
    what: &str,
    mut after_forward: impl FnMut(u64),
) -> KvCache {
    let steps = r.generated.len() - 1;
    let prompt_len = r.prompt.len();
    let mut cache = model.new_cache(1, prompt_len + steps);

    let prefill = rows(model.forward(tokens(&r.prompt), &mut cache).unwrap());
    after_forward(1);
    assert_eq!(prefill.len(), prompt_len);
    let mut worst: f64 = 0.0;
    for (pos, row) in prefill.iter().enumerate() {
        worst = worst.max(check_row(
            &format!("{what} prefill position {pos}"),
            row,
            &r.logits[pos],
        ));
    }
    let mut token = argmax(prefill.last().unwrap()).unwrap();
    let mut chosen = vec![token];
    for step in 0..steps {
        let row = rows(model.forward(tokens(&[token]), &mut cache).unwrap()).remove(0);
        after_forward(step as u64 + 2);
        worst = worst.max(check_row(
            &format!("{what} decode step {step}"),
            &row,
            &r.logits[prompt_len + step],
        ));
        token = argmax(&row).unwrap();
        chosen.push(token);
    }
    assert_eq!(cache.len(), prompt_len + steps);
    eprintln!("{what}: worst relative error {worst:.3e}, tokens {chosen:?}");
    assert_eq!(
        chosen, r.generated,
        "{what}: greedy tokens differ from transformers"
    );
    cache
}
