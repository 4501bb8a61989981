//! The tiny Qwen2 fixtures against Hugging Face transformers' own outputs
//! (`fixtures/make_tiny_qwen2.py`, float32, eager attention, CPU).

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use burn_mapped_models::qwen2::Sampler;
use burn_mapped_tests::tiny_qwen2::{
    check_row, decode_like_transformers, reference, relative_error, rows, tokens,
};
use common::load;

#[test]
fn untied_prefill_and_cached_decode_match_transformers() {
    let r = reference("untied");
    let model = load("untied");
    assert!(model.lm_head.is_some());
    decode_like_transformers(&model, &r, "untied", |_| {});
}

#[test]
fn tied_prefill_and_cached_decode_match_transformers() {
    let r = reference("tied");
    let model = load("tied");
    assert!(
        model.lm_head.is_none(),
        "tied config must not create lm_head"
    );
    decode_like_transformers(&model, &r, "tied", |_| {});
}

#[test]
fn greedy_generate_reproduces_the_transformers_tokens() {
    for variant in ["untied", "tied"] {
        let r = reference(variant);
        let model = load(variant);
        let out = model
            .generate(&r.prompt, r.generated.len(), &mut Sampler::greedy(), &[])
            .unwrap();
        assert_eq!(out, r.generated, "{variant}");
    }
}

#[test]
fn generate_stops_after_a_stop_token() {
    let r = reference("untied");
    let model = load("untied");
    let stop = r.generated[3];
    let out = model
        .generate(
            &r.prompt,
            r.generated.len(),
            &mut Sampler::greedy(),
            &[stop],
        )
        .unwrap();
    let first = r.generated.iter().position(|&t| t == stop).unwrap();
    assert_eq!(out, r.generated[..=first]);
}

/// A prompt fed in two chunks exercises the causal mask at a non-zero cache offset.
#[test]
fn chunked_prefill_matches_transformers() {
    let r = reference("untied");
    let model = load("untied");
    let mut cache = model.new_cache(1, r.prompt.len());
    let split = 4;
    let mut ours = rows(
        model
            .forward(tokens(&r.prompt[..split]), &mut cache)
            .unwrap(),
    );
    ours.extend(rows(
        model
            .forward(tokens(&r.prompt[split..]), &mut cache)
            .unwrap(),
    ));
    for (pos, row) in ours.iter().enumerate() {
        check_row(
            &format!("chunked prefill position {pos}"),
            row,
            &r.logits[pos],
        );
    }
}

#[test]
fn forward_last_gives_the_last_position_of_the_prompt() {
    let r = reference("tied");
    let model = load("tied");
    let mut cache = model.new_cache(1, r.prompt.len());
    let last = model
        .forward_last(tokens(&r.prompt), &mut cache)
        .unwrap()
        .try_into_vec_as::<f32>()
        .unwrap();
    check_row("forward_last", &last, &r.logits[r.prompt.len() - 1]);
}

/// Two different sequences in one batch: each matches the reference where its context is
/// the reference's, and a mix-up of batch rows would show in the last prompt position and
/// the decode step.
#[test]
fn a_batch_of_two_keeps_sequences_apart() {
    let r = reference("untied");
    let model = load("untied");
    let n = r.prompt.len();
    let mut other = r.prompt.clone();
    other[n - 1] = (other[n - 1] + 1) % r.vocab_size as u32;
    let ids: Vec<i64> = other.iter().chain(&r.prompt).map(|&t| t as i64).collect();
    let device = burn::tensor::Device::flex();
    let batch = Tensor::<2, Int>::from_data(TensorData::new(ids, [2, n]), &device);
    let mut cache = model.new_cache(2, n + 1);
    let logits = rows(model.forward(batch, &mut cache).unwrap());
    for (pos, (ours, hf)) in logits[..n - 1].iter().zip(&r.logits).enumerate() {
        check_row(&format!("sequence 0 position {pos}"), ours, hf);
    }
    assert!(relative_error(&logits[n - 1], &r.logits[n - 1]) > 1e-2);
    for pos in 0..n {
        check_row(
            &format!("sequence 1 position {pos}"),
            &logits[n + pos],
            &r.logits[pos],
        );
    }
    let step = Tensor::<2, Int>::from_data(
        TensorData::new(vec![0i64, r.generated[0] as i64], [2, 1]),
        &device,
    );
    let logits = rows(model.forward(step, &mut cache).unwrap());
    check_row("sequence 1 decode step 0", &logits[1], &r.logits[n]);
}
