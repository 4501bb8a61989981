//! The real Qwen2.5-Coder-0.5B-Instruct checkpoint, decoded from an adopted f32 store in strict
//! mode, against an independent float64 numpy forward pass over the same dequantized weights
//! (models/tests/fixtures/qwen25_real/make_reference.py).
//!
//! Needs the GGUF (`burn-mapped fetch qwen2.5-coder-0.5b`). Without it the test says so and
//! passes, unless `BURN_MAPPED_REQUIRE_REAL=1` (set by CI), where it fails.

use burn::tensor::Device;
use burn_mapped::convert::{CastTo, WeightFormat};
use burn_mapped_models::qwen2::{Sampler, argmax};
use burn_mapped_tests::real::{
    COMPARED_TOKENS, first_logits, real_first_logits_prompt0, real_reference, resolve,
};
use burn_mapped_tools::qwen;

#[test]
fn greedy_tokens_and_first_logits_match_the_float64_reference() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let reference = real_reference();
    let paths = resolve(&gguf, Some(WeightFormat::Float(CastTo::F32)));
    let before = burn_mapped::MappedStore::open(paths.weights_path())
        .unwrap()
        .verify();
    assert!(before.is_empty(), "{before:?}");
    let tokenizer = qwen::load_tokenizer(&paths).unwrap();
    let device = Device::flex();
    let loaded = burn_mapped_tests::real::load(&paths, &device);

    let mut table = Vec::new();
    let mut logits0 = Vec::new();
    for (i, p) in reference.iter().enumerate() {
        let text = p.built_text();
        assert_eq!(text, p.text, "prompt {i} text");
        let prompt_ids = tokenizer.encode(&text).unwrap();
        assert_eq!(prompt_ids, p.prompt_ids, "prompt {i} tokenization");

        // First-position logits after prefill.
        let logits = first_logits(&loaded.model, &prompt_ids, &device);
        let worst = p.first.top_error(&logits);
        assert_eq!(argmax(&logits).unwrap(), p.first.argmax);
        if i == 0 {
            logits0 = logits.clone();
        }
        assert!(
            worst < 1e-4,
            "prompt {i}: first-position logits rel err {worst:e}"
        );

        // The first COMPARED_TOKENS greedy tokens.
        let generated = loaded
            .model
            .generate(&prompt_ids, COMPARED_TOKENS, &mut Sampler::greedy(), &[])
            .unwrap();
        let want = p.compared_ids();
        let agree = generated
            .iter()
            .zip(want)
            .take_while(|(a, b)| a == b)
            .count();
        table.push(format!(
            "prompt {i}: {agree}/{COMPARED_TOKENS} tokens agree, first-logit rel err {worst:.2e}, \
             min margin {:.3}",
            p.compared_min_margin()
        ));
        assert_eq!(generated, want, "prompt {i}: greedy tokens");
    }
    for line in table {
        println!("{line}");
    }
    // Full first-position logits of prompt 0.
    let full = real_first_logits_prompt0();
    assert_eq!(full.len(), logits0.len());
    let max_abs = full.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let worst = full
        .iter()
        .zip(&logits0)
        .map(|(a, b)| (*a as f64 - *b as f64).abs() / max_abs)
        .fold(0f64, f64::max);
    println!("prompt 0: full first-position logits rel err {worst:.2e}");
    assert!(worst < 1e-4, "full logits rel err {worst:e}");
    let after = loaded.store.verify();
    assert!(after.is_empty(), "store changed: {after:?}");
}
