//! `generate --model X.gguf` on the CPU runs from the GGUF itself: nothing is converted and
//! nothing is written but the probe cache, the file is never changed, and the answer is the
//! one a store converted from the same file gives.

mod common;

use std::path::Path;
use std::process::Command;

use burn_mapped_tests::gguf::{TinyDims, tiny_qwen2};
use common::success_json;

/// Every file under `dir`, relative, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<_> = dir
        .is_dir()
        .then(|| dir.to_path_buf())
        .into_iter()
        .collect();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

fn generate(model: &Path, cache: &Path, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_burn-mapped"))
        .args(["generate", "--model"])
        .arg(model)
        .args([
            "--prompt",
            "hello there",
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--json",
        ])
        .arg("--cache-dir")
        .arg(cache)
        .arg("--probe-cache-dir")
        .arg(cache.join("probes"))
        .args(extra)
        .output()
        .unwrap();
    success_json(&out, "generate")
}

#[test]
fn a_gguf_runs_in_place_writing_nothing_but_the_probe_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("model.gguf");
    std::fs::write(&gguf, tiny_qwen2(TinyDims::default(), 9).build()).unwrap();
    let before = std::fs::read(&gguf).unwrap();
    let cache = tmp.path().join("cache");

    let in_place = generate(&gguf, &cache, &[]);
    assert_eq!(in_place["in_place"], true);
    assert_eq!(in_place["copied_tensors"], 0);
    assert_eq!(
        in_place["store"],
        gguf.canonicalize().unwrap().display().to_string()
    );
    // The auto placement's probe verdict is the only thing written.
    let written = files_under(&cache);
    assert!(
        written.iter().all(|f| f.starts_with("probes/")),
        "{written:?}"
    );
    assert_eq!(std::fs::read(&gguf).unwrap(), before);

    // A store converted from the same file decodes the same tokens.
    let stored = generate(&gguf, &cache, &["--dtype", "f32", "--placement", "map"]);
    assert_eq!(stored["in_place"], false);
    assert_eq!(stored["generated_ids"], in_place["generated_ids"]);
}

#[test]
fn ctrl_c_ends_a_generation_with_its_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("model.gguf");
    let dims = TinyDims {
        context: 1 << 16,
        ..TinyDims::default()
    };
    std::fs::write(&gguf, tiny_qwen2(dims, 10).build()).unwrap();
    let cache = tmp.path().join("cache");
    let child = Command::new(env!("CARGO_BIN_EXE_burn-mapped"))
        .args(["generate", "--model"])
        .arg(&gguf)
        .args([
            "--prompt",
            "hi",
            "--max-tokens",
            "65000",
            "--ignore-eos",
            "--json",
        ])
        .args(["--placement", "map", "--cache-dir"])
        .arg(&cache)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    // SAFETY: kill sends a signal to the child this test started.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let out = child.wait_with_output().unwrap();
    let json = success_json(&out, "interrupted generate");
    assert_eq!(json["interrupted"], true, "{json}");
    let generated = json["generated_ids"].as_array().unwrap().len();
    assert!(generated > 0 && generated < 65000, "{generated}");
}
