//! The real Qwen2.5-Coder-0.5B-Instruct checkpoint converted with its GGUF blocks kept (Q5_0,
//! Q8_0, Q4_K and Q6_K projections byte for byte, embedding and norms f32), decoded in strict
//! mode against the independent float64 numpy reference over the same dequantized weights
//! (models/tests/fixtures/qwen25_real/make_reference.py).
//!
//! The weights are the reference's own, so the only approximation left is the 8-bit
//! quantization of the activations (a scale per 32 values): the first-position logits must be
//! closer than the q8 store's (which rounds the weights a second time); at every position,
//! given the reference's tokens before it, the reference's largest logits must be within
//! [`STEP_LOGIT_BOUND`] of the model's and its top-1 the reference's token or one of those
//! (each position judged on its own); and the greedy tokens must equal the reference's, or
//! first differ where that bound explains the difference.
//!
//! Needs the GGUF (`burn-mapped fetch qwen2.5-coder-0.5b`). Without it the test says so and
//! passes, unless `BURN_MAPPED_REQUIRE_REAL=1` (set by CI), where it fails.

use burn::tensor::Device;
use burn_mapped::convert::WeightFormat;
use burn_mapped::gguf::{GgmlType, GgufFile};
use burn_mapped_models::qwen2::{Projection, Sampler, argmax, hf_name};
use burn_mapped_tests::flex::flex_storage;
use burn_mapped_tests::maps::{inside_a_mapping, store_mappings};
use burn_mapped_tests::real::{
    COMPARED_TOKENS, STEP_LOGIT_BOUND, first_logits, forced_failures, forced_summary,
    greedy_difference, real_long_reference, real_reference, resolve, teacher_forced,
};
use burn_mapped_tools::qwen;

/// Largest first-position logit error allowed, `max |blocks - ref| / max |ref|` over the
/// reference's largest logits. Measured on the four prompts: 0.9e-2 to 1.6e-2, all of it the
/// 8-bit activations (the weights are the reference's), against 1.3e-2 to 2.6e-2 for the q8
/// store, which also rounds the weights again. Which activations round up or down depends on
/// the summation order of everything before them, so another kernel or step moves each
/// prompt's figure within that range; a misread block type or scale gives errors of order 1.
const LOGIT_BOUND: f64 = 2e-2;

#[test]
fn a_block_store_decodes_the_reference_tokens_from_the_checkpoints_own_bytes() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let reference = real_reference();
    let paths = resolve(&gguf, Some(WeightFormat::Blocks));
    let name = paths.weights_path().file_name().unwrap().to_string_lossy();
    assert!(
        name.starts_with("qwen2.5-coder-0.5b-instruct-q4_k_m-") && name.ends_with("-blocks"),
        "{name}"
    );

    // Every projection and the head keep the GGUF's block type; their bytes are the GGUF's.
    let file = GgufFile::open(&gguf).unwrap();
    let by_store_name: std::collections::HashMap<String, _> = file
        .gguf()
        .tensors()
        .iter()
        .filter_map(|info| Some((hf_name(info.name())?, info)))
        .collect();
    let store = burn_mapped::MappedStore::open(paths.weights_path()).unwrap();
    let manifest = store.manifest();
    let mut kinds = std::collections::BTreeMap::new();
    for entry in manifest.tensors() {
        let Some(layout) = entry.blocks() else {
            continue;
        };
        *kinds.entry(layout.ty().name()).or_insert(0) += 1;
        let info = by_store_name[entry.name()];
        assert_eq!(info.ggml_type(), layout.ty(), "{}", entry.name());
        let stored = store.tensor_data(entry.name()).unwrap();
        assert!(
            stored.as_bytes() == file.tensor_data(info).unwrap(),
            "{}: bytes differ from the GGUF's",
            entry.name()
        );
    }
    assert_eq!(kinds.values().sum::<usize>(), 24 * 7 + 1, "{kinds:?}");
    assert_eq!(kinds.get(GgmlType::Q6_K.name()), Some(&12));

    let device = Device::flex();
    let tokenizer = qwen::load_tokenizer(&paths).unwrap();
    let loaded = burn_mapped_tests::real::load(&paths, &device);

    // Zero copy: each block weight's storage is inside the store's file mappings.
    let maps = store_mappings(paths.weights_path());
    let head = loaded.model.lm_head.as_ref().unwrap();
    let mut weights = vec![head];
    for layer in &loaded.model.model.layers {
        weights.extend([&layer.self_attn.q_proj, &layer.mlp.down_proj]);
    }
    for projection in weights {
        let Projection::Blocks(b) = projection else {
            panic!("a projection of the block store is not a block layer");
        };
        let range = flex_storage(b.weight.val());
        assert!(inside_a_mapping(&range, &maps), "{range:x?} is a copy");
    }

    let mut table = vec![format!(
        "{:<7} {:>11} {:>7} {:>7} {:>32} {:>28}",
        "prompt",
        "logit err",
        "top-1",
        "equal",
        "first difference (ref margin)",
        "forced: flips, worst error"
    )];
    let mut failures = Vec::new();
    // The four short prompts, then the long one (681 tokens: the prompt kernels, and attention
    // over hundreds of positions).
    let long = real_long_reference();
    assert!(!long.is_empty(), "the reference has no long prompt");
    for (i, p) in reference.iter().chain(&long).enumerate() {
        let prompt = tokenizer.encode(&p.built_text()).unwrap();
        assert_eq!(prompt, p.prompt_ids, "prompt {i} tokenization");
        let logits = first_logits(&loaded.model, &prompt, &device);
        let err = p.first.top_error(&logits);
        let top1 = argmax(&logits).unwrap();
        if err >= LOGIT_BOUND {
            failures.push(format!("prompt {i}: first-position logit error {err:.3e}"));
        }

        let want = p.compared_ids();
        // Every position, each given the reference's tokens before it.
        let forced = teacher_forced(&loaded.model, p, COMPARED_TOKENS, &device);
        failures.extend(
            forced_failures(p, &forced)
                .into_iter()
                .map(|f| format!("prompt {i}, given the reference's tokens: {f}")),
        );
        let (flips, worst) = forced_summary(p, &forced);

        let ids = loaded
            .model
            .generate(&prompt, COMPARED_TOKENS, &mut Sampler::greedy(), &[])
            .unwrap();
        let first_difference = match greedy_difference(p, &ids) {
            Ok(at) => at,
            Err(e) => {
                failures.push(format!("prompt {i}: {e}"));
                Some(e.at)
            }
        };
        let note = first_difference.map_or("-".to_string(), |at| {
            format!("{at} (margin {:.3})", p.margins[at])
        });
        table.push(format!(
            "{i:<7} {err:>11.3e} {:>7} {:>7} {note:>32} {:>28}",
            if top1 == p.first.argmax {
                "same"
            } else {
                "DIFF"
            },
            format!("{}/{}", first_difference.unwrap_or(want.len()), want.len()),
            format!("{}, {worst:.3} (bound {STEP_LOGIT_BOUND})", flips.len()),
        ));
    }
    println!("{}", table.join("\n"));
    assert!(failures.is_empty(), "{failures:#?}");
}
