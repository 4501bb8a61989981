//! The real Qwen2.5-Coder-0.5B-Instruct checkpoint converted to a q8 store (every projection and
//! the LM head int8, embedding and norms f32), decoded in strict mode and compared with the f32
//! store and with the independent float64 numpy reference
//! (models/tests/fixtures/qwen25_real/make_reference.py).
//!
//! Prints, per fixture prompt: the first-position logit error of q8 (and of f32) against the
//! reference, and how many of the reference's greedy tokens q8 decodes before it first differs
//! (the f32 store's tokens are `qwen_real`'s to check). Asserts what q8 must keep: the
//! first-position logit error below [`LOGIT_BOUND`], the reference's top-1 wherever its margin
//! exceeds what that bound allows to move, and greedy tokens equal to the reference's or first
//! differing where the step bound explains it.
//!
//! Needs the GGUF (`burn-mapped fetch qwen2.5-coder-0.5b`); converts it to
//! `~/.cache/burn-mapped/stores/<stem>-q8` (and `-f32`) on first use. Without the GGUF the
//! test says so and passes, unless `BURN_MAPPED_REQUIRE_REAL=1` (set by CI), where it fails.

use std::time::Instant;

use burn::tensor::{DType, Device};
use burn_mapped::convert::{CastTo, WeightFormat};
use burn_mapped_models::qwen2::{Sampler, argmax};
use burn_mapped_tests::real::{
    first_logits, greedy_difference, real_first_logits_prompt0, real_reference, resolve,
};
use burn_mapped_tools::qwen;

/// Largest first-position logit error of the q8 store allowed, as `max |q8 - ref| / max |ref|`
/// over the reference's 2048 largest logits (and over all logits for prompt 0). Measured on
/// this checkpoint with the AVX2 kernel: 1.29e-2 to 2.60e-2 over the four prompts (prompt 0:
/// 2.60e-2 over all 151936 logits, also 2.60e-2 as an L2 ratio), against ~1e-6 for the f32
/// store. The bound is about twice the worst measured value: room for another kernel's
/// summation order, while a wrong scale, a float path mixed up with q8 or a broken projection
/// gives errors of order 1.
const LOGIT_BOUND: f64 = 5e-2;

#[test]
fn a_q8_store_decodes_close_to_the_f32_store_and_the_float64_reference() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let start = Instant::now();
    let q8_paths = resolve(&gguf, Some(WeightFormat::Q8));
    let f32_paths = resolve(&gguf, Some(WeightFormat::Float(CastTo::F32)));
    eprintln!("stores ready in {:.1} s", start.elapsed().as_secs_f64());
    let name = q8_paths
        .weights_path()
        .file_name()
        .unwrap()
        .to_string_lossy();
    assert!(
        name.starts_with("qwen2.5-coder-0.5b-instruct-q4_k_m-") && name.ends_with("-q8"),
        "{name}"
    );

    // What the q8 store holds: 7 projections x 24 layers + the head, each with an error.
    let manifest = burn_mapped::Manifest::read(q8_paths.weights_path()).unwrap();
    let links: Vec<f64> = manifest
        .tensors()
        .iter()
        .filter_map(|t| t.quant().map(|q| f64::from(q.rel_error.unwrap())))
        .collect();
    assert_eq!(links.len(), 24 * 7 + 1);
    assert!(manifest.get("lm_head.weight").unwrap().quant().is_some());
    let embed = manifest.get("model.embed_tokens.weight").unwrap();
    assert_eq!((embed.dtype(), embed.quant()), (DType::F32, None));
    let worst = links.iter().copied().fold(0f64, f64::max);
    let mean = links.iter().sum::<f64>() / links.len() as f64;
    println!(
        "q8 store: {} matrices, weight rel err mean {mean:.3e}, worst {worst:.3e}",
        links.len()
    );

    let device = Device::flex();
    let tokenizer = qwen::load_tokenizer(&q8_paths).unwrap();
    let q8 = burn_mapped_tests::real::load(&q8_paths, &device);
    let f32 = burn_mapped_tests::real::load(&f32_paths, &device);
    assert!(q8.model.lm_head.as_ref().unwrap().is_q8());
    assert!(
        q8.model
            .model
            .layers
            .iter()
            .all(|l| l.mlp.down_proj.is_q8() && l.self_attn.q_proj.is_q8())
    );
    assert!(!f32.model.lm_head.as_ref().unwrap().is_q8());

    let mut table = vec![format!(
        "{:<7} {:>11} {:>11} {:>9} {:>10} {:>9}",
        "prompt", "q8 logit", "f32 logit", "top-1", "ref margin", "vs ref"
    )];
    let mut logits0 = Vec::new();
    let mut failures = Vec::new();
    for (i, p) in real_reference().iter().enumerate() {
        let prompt = tokenizer.encode(&p.built_text()).unwrap();
        assert_eq!(prompt, p.prompt_ids, "prompt {i} tokenization");

        let q8_logits = first_logits(&q8.model, &prompt, &device);
        let f32_logits = first_logits(&f32.model, &prompt, &device);
        let q8_err = p.first.top_error(&q8_logits);
        let f32_err = p.first.top_error(&f32_logits);
        let margin = p.first.margin();
        let max_abs = p.first.max_abs;
        let q8_top1 = argmax(&q8_logits).unwrap();
        let ref_top1 = p.first.argmax;
        if q8_err >= LOGIT_BOUND {
            failures.push(format!(
                "prompt {i}: q8 first-position logit error {q8_err:.3e}"
            ));
        }
        // Within the bound no logit moves more than LOGIT_BOUND * max_abs, so a gap of twice
        // that cannot close: the top-1 must stay.
        if margin > 2.0 * LOGIT_BOUND * max_abs && q8_top1 != ref_top1 {
            failures.push(format!(
                "prompt {i}: q8 top-1 {q8_top1}, reference {ref_top1} with margin {margin:.3}"
            ));
        }
        if i == 0 {
            logits0 = q8_logits;
        }

        let want = p.compared_ids();
        let q8_ids = q8
            .model
            .generate(&prompt, want.len(), &mut Sampler::greedy(), &[])
            .unwrap();
        assert_eq!(q8_ids.len(), want.len());
        if let Err(e) = greedy_difference(p, &q8_ids) {
            failures.push(format!("prompt {i}: q8 greedy tokens: {e}"));
        }
        let vs_ref = q8_ids.iter().zip(want).take_while(|(a, b)| a == b).count();
        table.push(format!(
            "{i:<7} {q8_err:>11.3e} {f32_err:>11.3e} {:>9} {margin:>10.3} {:>9}",
            if q8_top1 == ref_top1 {
                "same"
            } else {
                "differs"
            },
            format!("{vs_ref}/{}", want.len()),
        ));
        println!(
            "prompt {i} q8 text: {:?}",
            tokenizer.decode(&q8_ids).unwrap_or_default()
        );
    }
    println!(
        "q8 and f32 stores against the float64 reference (logit errors: max |diff| / max |ref| over the top 2048):"
    );
    for line in &table {
        println!("{line}");
    }

    let full = real_first_logits_prompt0();
    assert_eq!(full.len(), logits0.len());
    let max_abs = full.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let (mut diff2, mut norm2, mut worst_abs) = (0f64, 0f64, 0f64);
    for (r, g) in full.iter().zip(&logits0) {
        let d = f64::from(*g) - f64::from(*r);
        diff2 += d * d;
        norm2 += f64::from(*r) * f64::from(*r);
        worst_abs = worst_abs.max(d.abs());
    }
    let full_max = worst_abs / max_abs;
    println!(
        "prompt 0, all {} logits: max |diff| / max |ref| {full_max:.3e}, ||diff|| / ||ref|| {:.3e}",
        full.len(),
        (diff2 / norm2).sqrt()
    );
    if full_max >= LOGIT_BOUND {
        failures.push(format!("prompt 0: full-logit error {full_max:.3e}"));
    }
    assert!(failures.is_empty(), "{failures:#?}");
    for (name, loaded) in [("q8", &q8), ("f32", &f32)] {
        let changed = loaded.store.verify();
        assert!(changed.is_empty(), "{name} store changed: {changed:?}");
    }
}
