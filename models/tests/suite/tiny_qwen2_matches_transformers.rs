//! The tiny Qwen2 fixtures against Hugging Face transformers' own outputs
//! (`fixtures/make_tiny_qwen2.py`, float32, eager attention, CPU).

use crate::common;

use burn::tensor::{Int, Tensor, TensorData};
use burn_mapped_models::qwen2::Sampler;
use burn_mapped_tests::tiny_qwen2::{
    check_row, decode_like_transformers, reference, relative_error, rows, tokens,
};
use common::load;

/// Whether the host step runs: one sequence on Flex takes it by default, and tensor ops are
/// the other path; each is held to transformers on its own.
const HOST_STEP: [bool; 2] = [true, false];

#[test]
fn untied_prefill_and_cached_decode_match_transformers() {
    let r = reference("untied");
    for host in HOST_STEP {
        let model = load("untied").with_host_step(host);
        assert!(model.lm_head.is_some());
        let cache = decode_like_transformers(&model, &r, &format!("untied, host {host}"), |_| {});
        assert_eq!(cache.on_host(), host);
    }
}

#[test]
fn tied_prefill_and_cached_decode_match_transformers() {
    let r = reference("tied");
    for host in HOST_STEP {
        let model = load("tied").with_host_step(host);
        assert!(
            model.lm_head.is_none(),
            "tied config must not create lm_head"
        );
        let cache = decode_like_transformers(&model, &r, &format!("tied, host {host}"), |_| {});
        assert_eq!(cache.on_host(), host);
    }
}

#[test]
fn greedy_generate_reproduces_the_transformers_tokens() {
    for variant in ["untied", "tied"] {
        let r = reference(variant);
        for host in HOST_STEP {
            let model = load(variant).with_host_step(host);
            let out = model
                .generate(&r.prompt, r.generated.len(), &mut Sampler::greedy(), &[])
                .unwrap();
            assert_eq!(out, r.generated, "{variant}, host {host}");
        }
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
    for host in HOST_STEP {
        let model = load("untied").with_host_step(host);
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
        assert_eq!(cache.on_host(), host);
        for (pos, row) in ours.iter().enumerate() {
            check_row(
                &format!("chunked prefill position {pos}, host {host}"),
                row,
                &r.logits[pos],
            );
        }
    }
}

/// A cache keeps the path that filled it: the host step's positions are not continued by
/// tensor ops (which could not see them) when the batch would allow either, and a cache
/// reset may change path.
#[test]
fn a_cache_continues_on_the_path_that_filled_it() {
    let r = reference("untied");
    let model = load("untied");
    let mut cache = model.new_cache(1, r.prompt.len() + 1);
    model.forward(tokens(&r.prompt), &mut cache).unwrap();
    assert!(cache.on_host());
    let model = model.with_host_step(false);
    let next = rows(
        model
            .forward(tokens(&[r.generated[0]]), &mut cache)
            .unwrap(),
    );
    assert!(cache.on_host(), "continued where its positions are");
    check_row(
        "decode after switching off",
        &next[0],
        &r.logits[r.prompt.len()],
    );
    cache.reset();
    model.forward(tokens(&r.prompt), &mut cache).unwrap();
    assert!(!cache.on_host(), "an emptied cache takes the model's path");
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
