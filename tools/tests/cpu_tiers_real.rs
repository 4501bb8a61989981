//! Every CPU tier this machine runs (`BURN_MAPPED_CPU=scalar|avx2|avx512vnni`) decodes the
//! real Qwen2.5-Coder-0.5B-Instruct GGUF, read in place, as the float64 reference does on each
//! of its prompts. Each tier is its own process (the tier is decided once per process):
//!
//! - through the CLI a user runs, whose `--json` reports the tier that ran, the first 32 greedy
//!   tokens equal the reference's or first differ where the logit bound explains it (the
//!   scalar tier on the first prompt only);
//! - in a copy of this test binary, at every one of those positions given the reference's
//!   tokens before it, the reference's largest logits are within
//!   [`STEP_LOGIT_BOUND`](burn_mapped_tests::real::STEP_LOGIT_BOUND) of the model's, so a
//!   prompt whose greedy tokens part early is still checked to its end.
//!
//! The tiers differ only in how the block products sum the 8-bit activations.
//!
//! Needs the GGUF (`burn-mapped fetch qwen2.5-coder-0.5b`). Without it the test says so and
//! passes, unless `BURN_MAPPED_REQUIRE_REAL=1` (set by CI), where it fails.

mod common;

use std::process::Command;

use burn::tensor::Device;
use burn_mapped::host::CpuTier;
use burn_mapped_tests::json::u32s;
use burn_mapped_tests::real::{
    COMPARED_TOKENS, forced_failures, forced_summary, greedy_difference, real_reference, resolve,
    teacher_forced,
};
use common::success_json;

/// The test a tier's own process runs: [`forced_on_this_processs_tier`].
const FORCED_TEST: &str = "forced_on_this_processs_tier";

#[test]
fn every_cpu_tier_decodes_the_reference_tokens_from_the_gguf_in_place() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let reference = real_reference();
    let mut failures = Vec::new();
    for tier in CpuTier::ALL.into_iter().filter(|t| t.supported()) {
        // The scalar tier decodes a token in about twenty times the vector tiers' time: it
        // runs the CLI on the first prompt only (its report and its tokens), and every prompt
        // teacher-forced below.
        let through_cli = match tier {
            CpuTier::Scalar => &reference[..1],
            _ => &reference[..],
        };
        for (i, p) in through_cli.iter().enumerate() {
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
            assert_eq!(got.len(), COMPARED_TOKENS, "{tier}: prompt {i}");
            match greedy_difference(p, &got) {
                Ok(None) => {}
                Ok(Some(at)) => println!(
                    "{tier}: prompt {i} differs at token {at} (reference margin {:.3})",
                    p.margins[at]
                ),
                Err(e) => failures.push(format!("{tier}: prompt {i}: {e}")),
            }
        }

        // The same tier in a process of its own, teacher-forced.
        let out = Command::new(std::env::current_exe().unwrap())
            .env("BURN_MAPPED_CPU", tier.name())
            .args(["--exact", FORCED_TEST, "--include-ignored", "--nocapture"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        if !out.status.success() || !stdout.contains("1 passed") {
            failures.push(format!(
                "{tier}: teacher-forced run failed:\n{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        println!(
            "{tier}: {} prompts through the CLI, {} teacher-forced",
            through_cli.len(),
            reference.len()
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every prompt teacher-forced on the tier `BURN_MAPPED_CPU` picks for this process: what the
/// test above runs once per tier.
#[test]
#[ignore = "run by every_cpu_tier_decodes_the_reference_tokens_from_the_gguf_in_place, once per tier"]
fn forced_on_this_processs_tier() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let tier = burn_mapped::host::cpu_tier();
    let device = Device::flex();
    let loaded = burn_mapped_tests::real::load(&resolve(&gguf, None), &device);
    let mut failures = Vec::new();
    for (i, p) in real_reference().iter().enumerate() {
        let forced = teacher_forced(&loaded.model, p, COMPARED_TOKENS, &device);
        let (flips, worst) = forced_summary(p, &forced);
        println!(
            "{tier}: prompt {i} teacher-forced: largest logit error {worst:.3}, top-1 differs at {flips:?}"
        );
        failures.extend(
            forced_failures(p, &forced)
                .into_iter()
                .map(|f| format!("{tier}: prompt {i}: {f}")),
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
