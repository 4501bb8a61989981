//! Every CPU tier this machine runs (`BURN_MAPPED_CPU=scalar|avx2|avx512vnni`) decodes the
//! real Qwen2.5-Coder-0.5B-Instruct GGUF, read in place, to the float64 reference's first 32
//! greedy tokens on each of its prompts, through the CLI a user runs. Each tier is its own
//! process (the tier is decided once per process), and `--json` reports the tier that ran.
//!
//! The tiers differ only in how the block products sum the 8-bit activations, so a tier's
//! first token that differs from the reference's is wrong unless the reference's own top-2
//! margin at that very position is below what that quantization moves a logit by: such a
//! difference is printed with its margin, and fails the test when the margin is larger.
//!
//! Needs the GGUF (`burn-mapped fetch qwen2.5-coder-0.5b`). Without it the test says so and
//! passes, unless `BURN_MAPPED_REQUIRE_REAL=1` (set by CI), where it fails.

mod common;

use std::process::Command;

use burn_mapped::host::CpuTier;
use burn_mapped_tests::json::u32s;
use burn_mapped_tests::real::{COMPARED_TOKENS, real_reference};
use common::success_json;

/// The largest top-2 margin, in logits, at which 8-bit activations were seen to flip the
/// reference's choice on these prompts (see tests/tests/qwen_real_blocks.rs).
const NEAR_TIE: f64 = 0.05;

#[test]
fn every_cpu_tier_decodes_the_reference_tokens_from_the_gguf_in_place() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let reference = real_reference();
    let mut failures = Vec::new();
    for tier in CpuTier::ALL.into_iter().filter(|t| t.supported()) {
        for (i, p) in reference.iter().enumerate() {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_burn-mapped"));
            cmd.env("BURN_MAPPED_CPU", tier.name())
                .args(["generate", "--model"])
                .arg(&gguf)
                .args(["--device", "cpu", "--max-tokens"])
                .arg(COMPARED_TOKENS.to_string())
                .args(["--ignore-eos", "--json", "--cache-dir"])
                .arg(cache.path());
            match &p.user_message {
                Some(message) => cmd.args(["--chat", "--prompt", message]),
                None => cmd.args(["--prompt", &p.text]),
            };
            let out = cmd.output().unwrap();
            let json = success_json(&out, tier.name());
            assert_eq!(json["cpu_tier"], tier.name());
            let prompt: Vec<u32> = u32s(&json["prompt_ids"]);
            assert_eq!(prompt, p.prompt_ids, "{tier}: prompt {i} tokenization");
            let got = u32s(&json["generated_ids"]);
            let want = p.compared_ids();
            match got.iter().zip(want).position(|(a, b)| a != b) {
                None => assert_eq!(got.len(), want.len(), "{tier}: prompt {i}"),
                Some(at) => {
                    let margin = p.margins[at];
                    println!("{tier}: prompt {i} differs at token {at} (margin {margin:.3})");
                    if margin >= NEAR_TIE {
                        failures.push(format!(
                            "{tier}: prompt {i}: token {at} is {}, the reference's {} (margin {margin:.3})",
                            got[at], want[at]
                        ));
                    }
                }
            }
        }
        println!("{tier}: {} prompts decoded", reference.len());
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
