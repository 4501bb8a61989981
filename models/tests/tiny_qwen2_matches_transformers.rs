//! The tiny Qwen2 fixtures against Hugging Face transformers' own outputs
//! (`fixtures/make_tiny_qwen2.py`, float32, eager attention, CPU).

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use burn_mapped_models::qwen2::{Qwen2ForCausalLM, Sampler, argmax};
use common::{Reference, load, reference, relative_error};

/// Bound on `max |ours - hf| / max |hf|` per logits row. Both sides are f32 with different
/// summation orders; observed errors are near 1e-6.
const MAX_RELATIVE_ERROR: f64 = 1e-4;

fn tokens(ids: &[u32]) -> Tensor<2, Int> {
    Tensor::from_data(
        TensorData::new(ids.iter().map(|&t| t as i64).collect(), [1, ids.len()]),
        &burn::tensor::Device::flex(),
    )
}

/// Rows of `[batch, seq, vocab]` logits, batch-major.
fn rows(logits: Tensor<3>) -> Vec<Vec<f32>> {
    let [batch, seq, vocab] = logits.dims();
    let flat = logits.try_into_vec_as::<f32>().unwrap();
    assert_eq!(flat.len(), batch * seq * vocab);
    flat.chunks(vocab).map(<[f32]>::to_vec).collect()
}

fn check_row(what: &str, ours: &[f32], hf: &[f32]) -> f64 {
    let err = relative_error(ours, hf);
    eprintln!("{what}: relative error {err:.3e}");
    assert!(
        err < MAX_RELATIVE_ERROR,
        "{what}: relative error {err:.3e} exceeds {MAX_RELATIVE_ERROR:e}"
    );
    err
}

/// Prefill the prompt, then 8 cached single-token steps, each fed our own greedy choice.
fn prefill_then_cached_decode(model: &Qwen2ForCausalLM, r: &Reference, variant: &str) {
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

#[test]
fn untied_prefill_and_cached_decode_match_transformers() {
    let r = reference("untied");
    let model = load("untied");
    assert!(model.lm_head.is_some());
    prefill_then_cached_decode(&model, &r, "untied");
}

#[test]
fn tied_prefill_and_cached_decode_match_transformers() {
    let r = reference("tied");
    let model = load("tied");
    assert!(
        model.lm_head.is_none(),
        "tied config must not create lm_head"
    );
    prefill_then_cached_decode(&model, &r, "tied");
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
