//! Inputs the forward pass refuses with a typed error instead of panicking.

use crate::common;

use burn::tensor::{Int, Tensor, TensorData};
use burn_mapped_models::qwen2::{ForwardError, GenerateError, KvCache, Qwen2ForCausalLM, Sampler};
use common::load;

fn tokens(ids: &[i64], batch: usize) -> Tensor<2, Int> {
    Tensor::from_data(
        TensorData::new(ids.to_vec(), [batch, ids.len() / batch]),
        &burn::tensor::Device::flex(),
    )
}

/// The untied fixture model and a fresh cache for one sequence of `capacity` positions.
fn untied(capacity: usize) -> (Qwen2ForCausalLM, KvCache) {
    let model = load("untied");
    let cache = model.new_cache(1, capacity);
    (model, cache)
}

#[test]
fn rejects_a_token_outside_the_vocabulary() {
    let (model, mut cache) = untied(8);
    let err = model
        .forward(tokens(&[1, 2, 256], 1), &mut cache)
        .unwrap_err();
    assert_eq!(
        err,
        ForwardError::TokenOutOfRange {
            token: 256,
            batch: 0,
            position: 2,
            vocab_size: 256
        }
    );
    let err = model.forward(tokens(&[-1], 1), &mut cache).unwrap_err();
    assert!(matches!(
        err,
        ForwardError::TokenOutOfRange { token: -1, .. }
    ));
    assert!(
        cache.is_empty(),
        "a refused call must not advance the cache"
    );
}

#[test]
fn rejects_more_positions_than_the_cache_holds() {
    let (model, mut cache) = untied(4);
    model.forward(tokens(&[1, 2, 3], 1), &mut cache).unwrap();
    let err = model.forward(tokens(&[4, 5], 1), &mut cache).unwrap_err();
    assert_eq!(
        err,
        ForwardError::CacheFull {
            cached: 3,
            requested: 2,
            capacity: 4
        }
    );
    assert_eq!(cache.len(), 3);
    model.forward(tokens(&[4], 1), &mut cache).unwrap();
    assert_eq!(cache.len(), 4);
}

#[test]
fn rejects_a_batch_the_cache_was_not_made_for() {
    let (model, mut cache) = untied(8);
    let err = model
        .forward(tokens(&[1, 2, 3, 4], 2), &mut cache)
        .unwrap_err();
    assert_eq!(
        err,
        ForwardError::BatchMismatch {
            expected: 1,
            found: 2
        }
    );
}

#[test]
fn rejects_an_empty_input() {
    let (model, mut cache) = untied(8);
    let empty = Tensor::<2, Int>::from_data(
        TensorData::new(Vec::<i64>::new(), [1, 0]),
        &burn::tensor::Device::flex(),
    );
    assert_eq!(
        model.forward(empty, &mut cache).unwrap_err(),
        ForwardError::EmptyInput { batch: 1, seq: 0 }
    );
}

#[test]
fn generate_rejects_an_empty_prompt_and_bad_tokens() {
    let model = load("tied");
    assert!(matches!(
        model.generate(&[], 4, &mut Sampler::greedy(), &[]),
        Err(GenerateError::EmptyPrompt)
    ));
    assert!(matches!(
        model.generate(&[1, 999], 4, &mut Sampler::greedy(), &[]),
        Err(GenerateError::Forward(ForwardError::TokenOutOfRange {
            token: 999,
            ..
        }))
    ));
    assert_eq!(
        model
            .generate(&[1, 2], 0, &mut Sampler::greedy(), &[])
            .unwrap(),
        Vec::<u32>::new()
    );
}

#[test]
fn reset_makes_the_cache_reusable() {
    let (model, mut cache) = untied(3);
    let logits = |cache: &mut KvCache| {
        model
            .forward(tokens(&[5, 6, 7], 1), cache)
            .unwrap()
            .try_into_vec_as::<f32>()
            .unwrap()
    };
    let first = logits(&mut cache);
    cache.reset();
    assert_eq!(first, logits(&mut cache));
}
