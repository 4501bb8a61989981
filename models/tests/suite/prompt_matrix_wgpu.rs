//! The real checkpoint's prompt through the device step's f16 matrix products (the path a GPU
//! with matrix units takes for every prompt pass of eight positions or more), read in place on
//! the first wgpu adapter, against the float64 reference: the first token's logits and the
//! first greedy tokens, the prompt in one pass and in passes of 8; and (ignored by default:
//! minutes on lavapipe) the first token of a 600-token prompt in passes of 256.
//!
//! Needs this crate's `gpu-tests` feature, a wgpu adapter and the checkpoint: without the
//! adapter or the checkpoint it says so and passes, unless `BURN_MAPPED_REQUIRE_GPU=1` or
//! `BURN_MAPPED_REQUIRE_REAL=1` (both set by CI, which installs lavapipe, whose matrix
//! products run on the cores).
#![cfg(feature = "gpu-tests")]

use burn_mapped::OpenOptions;
use burn_mapped::placement::Placement;
use burn_mapped_models::qwen2::load::{Loaded, Weights, load};
use burn_mapped_models::qwen2::{DeviceDecoder, Sampler};
use burn_mapped_tests::real::{RealPrompt, STEP_LOGIT_BOUND, real_long_reference, real_reference};

/// Decoded tokens: lavapipe runs this model at well under a token per second.
const TOKENS: usize = 3;

/// The checkpoint read in place on the tests' wgpu adapter, or `None` where either is absent.
fn loaded() -> Option<Loaded> {
    let gguf = burn_mapped_tests::real_gguf()?;
    let device = burn_mapped_tests::gpu::wgpu_device()?;
    let options = OpenOptions::default();
    Some(load(Weights::Gguf(&gguf), &device, options, Placement::Resident).expect("it loads"))
}

/// Runs `prompt` through `decoder` for its first token alone (the prompt's passes, whose logits
/// are that token's) and holds the token and the reference's largest logits to the reference.
fn assert_first_token(decoder: &mut DeviceDecoder, prompt: &RealPrompt, what: &str) {
    let first = decoder
        .generate(&prompt.prompt_ids, 1, &mut Sampler::greedy(), &[], |_| {})
        .expect("prefill");
    assert_eq!(first, [prompt.first.argmax], "first token, {what}");
    let logits = decoder.logits().expect("logits");
    for (&id, &want) in prompt
        .first
        .top_indices
        .iter()
        .zip(&prompt.first.top_values)
    {
        let err = (f64::from(logits[id]) - want).abs();
        assert!(
            err <= STEP_LOGIT_BOUND,
            "logit of {id}, {what}: {} against {want}",
            logits[id]
        );
    }
}

#[test]
fn a_prompt_through_f16_matrix_products_gives_the_reference_logits_and_tokens() {
    let Some(loaded) = loaded() else { return };
    let reference = real_reference();
    // The shortest prompt with two passes of 8 and whose tokens are no near-ties.
    let prompt = reference
        .iter()
        .filter(|p| {
            p.prompt_ids.len() >= 16
                && p.margins[..TOKENS]
                    .iter()
                    .all(|&m| m > 2.0 * STEP_LOGIT_BOUND)
        })
        .min_by_key(|p| p.prompt_ids.len())
        .expect("the reference has such a prompt");
    let n = prompt.prompt_ids.len();
    for rows in [n, 8] {
        let mut decoder = DeviceDecoder::try_new(&loaded.model, n + TOKENS)
            .expect("the device step takes the checkpoint")
            .with_matrix_products(true)
            .with_prefill_rows(rows);
        assert_first_token(&mut decoder, prompt, &format!("passes of {rows}"));
        let tokens = decoder
            .generate(
                &prompt.prompt_ids,
                TOKENS,
                &mut Sampler::greedy(),
                &[],
                |_| {},
            )
            .expect("generate");
        assert_eq!(
            tokens,
            prompt.generated_ids[..TOKENS],
            "greedy tokens after {n} prompt positions, passes of {rows}"
        );
    }
}

/// Minutes on lavapipe, whose f16 products run on two CPU cores: run it where the matrix units
/// are (`-- --ignored`); CI's two cores hold the short prompt above.
#[test]
#[ignore = "minutes on lavapipe; run on a GPU with -- --ignored"]
fn a_long_prompt_in_passes_through_f16_matrix_products_gives_the_reference_first_token() {
    let Some(loaded) = loaded() else { return };
    let reference = real_long_reference();
    let prompt = reference
        .iter()
        .min_by_key(|p| p.prompt_ids.len())
        .expect("the reference has long prompts");
    let n = prompt.prompt_ids.len();
    let mut decoder = DeviceDecoder::try_new(&loaded.model, n + 1)
        .expect("the device step takes the checkpoint")
        .with_matrix_products(true)
        .with_prefill_rows(256);
    assert_first_token(
        &mut decoder,
        prompt,
        &format!("{n} positions in passes of 256"),
    );
}
