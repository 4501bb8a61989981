//! The real Qwen2.5-Coder-0.5B-Instruct checkpoint read in place: the GGUF file itself is the
//! model's storage (no store, no conversion). Its projections and LM head are the file's own
//! blocks read by the same kernels as the `blocks` store's, and its Q5_0 embedding is decoded
//! row by row where the store holds it dequantized; both are the same function of the same
//! bytes, so the logits and the greedy tokens must equal the `blocks` store's bit for bit
//! (that store's own test holds it to the float64 reference), and the first-position logits
//! stay within that test's bound of the reference. Every block weight's storage lies inside
//! the GGUF's mapping, and loading adds almost no anonymous memory.
//!
//! Needs the GGUF (`burn-mapped fetch qwen2.5-coder-0.5b`). Without it the test says so and
//! passes, unless `BURN_MAPPED_REQUIRE_REAL=1` (set by CI), where it fails.

use burn::tensor::Device;
use burn_mapped::convert::WeightFormat;
use burn_mapped::host::memstat::rss_self;
use burn_mapped_models::qwen2::{Projection, Sampler, argmax};
use burn_mapped_models::tokenizer::Qwen2Tokenizer;
use burn_mapped_tests::flex::flex_storage;
use burn_mapped_tests::maps::{inside_a_mapping, mapped_ranges};
use burn_mapped_tests::real::{COMPARED_TOKENS, first_logits, real_reference, resolve};
use burn_mapped_tools::qwen::WeightsPath;

/// The `blocks` store test's bound on the first-position logit error against the reference.
const LOGIT_BOUND: f64 = 2e-2;

#[test]
fn the_gguf_read_in_place_decodes_as_the_blocks_store_does_from_its_own_pages() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let reference = real_reference();
    let in_place = resolve(&gguf, None);
    assert!(
        matches!(&in_place.weights, WeightsPath::Gguf(p) if *p == gguf.canonicalize().unwrap())
    );
    let blocks = resolve(&gguf, Some(WeightFormat::Blocks));
    let device = Device::flex();

    let anon_before = rss_self().unwrap().anon;
    let mut loaded = burn_mapped_tests::real::load(&in_place, &device);
    let anon_grown = rss_self().unwrap().anon.saturating_sub(anon_before);
    let file_len = std::fs::metadata(&gguf).unwrap().len();
    let header_len = loaded.header.as_ref().unwrap().data_offset();
    println!(
        "loading in place grew anonymous memory by {anon_grown} bytes \
         ({file_len}-byte file, {header_len}-byte header)"
    );
    // The parsed header (its vocabulary and merges as strings) is the one thing a load in place
    // builds in memory: at most 4 bytes per header byte, and 1 % of the file beside it. A copy
    // of the embedding alone (over 100 MB) or of the projections fails this.
    assert!(
        anon_grown <= 4 * header_len + file_len / 100,
        "{anon_grown} bytes"
    );
    assert!(
        loaded.store.copied().is_empty(),
        "{:?}",
        loaded.store.copied()
    );
    let tokenizer = Qwen2Tokenizer::from_gguf(loaded.header.take().unwrap()).unwrap();
    let store = burn_mapped_tests::real::load(&blocks, &device);

    // Zero copy: the head's and every layer's block weights are the GGUF's own pages.
    let maps = mapped_ranges(&gguf);
    let mut weights = vec![loaded.model.lm_head.as_ref().unwrap()];
    for layer in &loaded.model.model.layers {
        let (a, m) = (&layer.self_attn, &layer.mlp);
        weights.extend([&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]);
        weights.extend([&m.gate_proj, &m.up_proj, &m.down_proj]);
    }
    for projection in weights {
        let Projection::Blocks(b) = projection else {
            panic!("a projection read in place is not a block layer");
        };
        let range = flex_storage(b.weight.val());
        assert!(inside_a_mapping(&range, &maps), "{range:x?} is a copy");
    }

    for (i, p) in reference.iter().enumerate() {
        let prompt = tokenizer.encode(&p.built_text()).unwrap();
        assert_eq!(prompt, p.prompt_ids, "prompt {i} tokenization");
        let ours = first_logits(&loaded.model, &prompt, &device);
        let theirs = first_logits(&store.model, &prompt, &device);
        assert!(
            ours == theirs,
            "prompt {i}: first logits differ from the blocks store's"
        );
        let err = p.first.top_error(&ours);
        assert!(err < LOGIT_BOUND, "prompt {i}: logit error {err:.3e}");
        println!(
            "prompt {i}: logit error {err:.3e}, top-1 {}",
            if argmax(&ours).ok() == Some(p.first.argmax) {
                "same as the reference"
            } else {
                "DIFFERS from the reference"
            }
        );
        let generate = |model: &burn_mapped_models::qwen2::Qwen2ForCausalLM| {
            model
                .generate(&prompt, COMPARED_TOKENS, &mut Sampler::greedy(), &[])
                .unwrap()
        };
        assert_eq!(
            generate(&loaded.model),
            generate(&store.model),
            "prompt {i}: greedy tokens"
        );
    }
}
