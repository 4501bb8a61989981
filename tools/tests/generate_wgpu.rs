//! `burn-mapped generate --device wgpu` on the real checkpoint, read in place (its GGUF blocks
//! uploaded as they are) and converted with `--dtype q8`, where Burn's wgpu backend compiles
//! to WGSL: no 8-bit type (the kernels read int8 weights and blocks as 32-bit words) and, on
//! Mesa's lavapipe, bindings of at most 128 MiB (the q8 store's 545 MB f32 embedding and 136 MB
//! int8 LM head load as row blocks). The first greedy tokens of a reference prompt through the
//! device step equal the float64 reference's.
//!
//! Needs this crate's `wgpu` feature, a wgpu adapter and the checkpoint: without the adapter
//! or the checkpoint it says so and passes, unless `BURN_MAPPED_REQUIRE_GPU=1` or
//! `BURN_MAPPED_REQUIRE_REAL=1` (both set by CI, which installs lavapipe).
#![cfg(feature = "gpu-tests")]

use std::process::Command;

use burn_mapped_tests::real::{RealPrompt, STEP_LOGIT_BOUND, real_reference};

/// Decoded tokens: lavapipe runs this model at well under a token per second.
const TOKENS: usize = 3;

/// The summary `generate --json` prints for `prompt` on the wgpu device, `extra` arguments added.
fn generate(gguf: &std::path::Path, prompt: &RealPrompt, extra: &[&str]) -> serde_json::Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_burn-mapped"));
    command
        .args(["generate", "--model"])
        .arg(gguf)
        .args(["--device", "wgpu", "--placement", "resident"])
        .args([
            "--max-tokens",
            &TOKENS.to_string(),
            "--ignore-eos",
            "--json",
        ])
        .args(extra)
        .arg("--prompt");
    match &prompt.user_message {
        Some(message) => command.arg(message).arg("--chat"),
        None => command.arg(&prompt.text),
    };
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "generate failed:\n{stderr}");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("generate --json printed no JSON ({e}):\n{stderr}"))
}

fn ids(summary: &serde_json::Value, key: &str) -> Vec<u32> {
    summary[key]
        .as_array()
        .unwrap_or_else(|| panic!("no `{key}` in {summary}"))
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// The first tokens through the device step, recorded, on the reference's shortest prompts: the
/// GGUF's own blocks read in place (the default), its prompt through the tiled products; and
/// the q8 store with a cache of the prompt
/// and the new tokens (one attention cube a head) and with a cache of 300 positions, whose
/// attention spreads each head over cubes and combines them (a sixth launch a layer).
#[test]
fn generate_on_wgpu_gives_the_reference_tokens_from_blocks_and_the_q8_store() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    let Some(device) = burn_mapped_tests::gpu::wgpu_device() else {
        return;
    };
    let reference = real_reference();
    // The shortest prompt: lavapipe's prefill is slow too. Over blocks, the shortest whose
    // prefill runs the tiled products (eight positions or more) and whose reference tokens are
    // no near-ties (a margin past twice the step bound).
    let shortest = |min: usize| {
        reference
            .iter()
            .filter(|p| {
                p.prompt_ids.len() >= min
                    && p.margins[..TOKENS]
                        .iter()
                        .all(|&m| m > 2.0 * STEP_LOGIT_BOUND)
            })
            .min_by_key(|p| p.prompt_ids.len())
            .expect("the reference has such a prompt")
    };
    let mut launches = Vec::new();
    let runs: [&[&str]; 3] = [&[], &["--dtype", "q8"], &["--dtype", "q8", "--ctx", "300"]];
    for extra in runs {
        let prompt = shortest(if extra.is_empty() { 8 } else { 1 });
        let summary = generate(&gguf, prompt, extra);
        assert_eq!(
            ids(&summary, "prompt_ids"),
            prompt.prompt_ids,
            "the reference's prompt"
        );
        assert_eq!(
            ids(&summary, "generated_ids"),
            prompt.generated_ids[..TOKENS],
            "greedy tokens on {} ({:?}), {extra:?}",
            summary["device"],
            device.identity().map(|id| id.name),
        );
        assert_eq!(
            summary["decode_path"], "device step (recorded)",
            "{extra:?}"
        );
        assert_eq!(summary["in_place"], extra.is_empty(), "{extra:?}");
        // The layers' matrices (over 256 MiB as blocks or q8) came through burn-mapped's
        // staging ring.
        let uploaded = summary["uploaded_bytes"].as_u64().unwrap_or(0);
        assert!(uploaded > 256 << 20, "{extra:?}: uploaded {uploaded} bytes");
        // The device step opened the GPU itself, and says how long that took.
        assert!(
            summary["device_open_ms"]
                .as_f64()
                .is_some_and(|ms| ms > 0.0),
            "{extra:?}: device_open_ms {}",
            summary["device_open_ms"]
        );
        launches.push(summary["launches_per_token"].as_u64().unwrap());
        eprintln!(
            "wgpu adapter {:?}: largest binding {:?} bytes; {TOKENS} tokens after {} equal the \
             reference's ({extra:?}); model-ready {} ms, decode {} tok/s",
            device.identity().map(|id| id.name),
            burn_mapped::placement::max_binding(&device),
            prompt.prompt_ids.len(),
            summary["model_ready_ms"],
            summary["decode_tokens_per_s"],
        );
    }
    // The split attention's combining launch, once in each of the 24 layers.
    assert_eq!(
        launches[2],
        launches[1] + 24,
        "launches per token: {launches:?}"
    );
}
