//! A tensor file truncated by another program while `burn-mapped generate` decodes from it:
//! the process ends with `burn_mapped::readonly::SIGBUS_EXIT_CODE` and a line naming the file, not a
//! bare bus error. Runs on a private copy of the real checkpoint's q8 store (converted into the
//! cache on first use), so the cached store stays intact.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use burn_mapped::convert::WeightFormat;
use burn_mapped_tools::fetch::default_cache_dir;
use burn_mapped_tools::qwen;

/// The CLI binary, built beside this test by `cargo test --workspace`.
fn cli() -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    deps.parent().unwrap().parent().unwrap().join("burn-mapped")
}

#[test]
fn generate_ends_naming_the_file_when_a_mapped_tensor_file_is_truncated() {
    let Some(gguf) = burn_mapped_tests::real_gguf() else {
        return;
    };
    assert!(cli().is_file(), "{} not built", cli().display());
    let cache = default_cache_dir();
    let paths =
        qwen::resolve(gguf.to_str().unwrap(), Some(WeightFormat::Q8), &cache, None).unwrap();
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    for entry in std::fs::read_dir(paths.weights_path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), store.join(entry.file_name())).unwrap();
    }
    let manifest = burn_mapped::Manifest::read(&store).unwrap();
    let victim = manifest
        .tensors()
        .iter()
        .find(|t| t.name() == "model.layers.0.mlp.down_proj.weight")
        .map(|t| store.join(t.file()))
        .expect("the q8 store has layer 0's down projection");

    let mut child = Command::new(cli())
        .args(["generate", "--model"])
        .arg(&store)
        .args([
            "--prompt",
            "Write a long story about a lighthouse keeper.",
            "--chat",
            "--max-tokens",
            "1000",
            "--placement",
            "map",
            "--cache-dir",
        ])
        .arg(tmp.path().join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first streamed text: the model is loaded and decoding from the mapping.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    assert_eq!(
        stdout.read(&mut first).unwrap(),
        1,
        "generate printed nothing"
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_len(0)
        .unwrap();
    let drain = std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    drain.join().unwrap().unwrap();
    assert_eq!(
        status.code(),
        Some(burn_mapped::readonly::SIGBUS_EXIT_CODE),
        "{status:?}: {stderr}"
    );
    assert!(
        stderr.contains("became unreadable while mapped"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&*victim.to_string_lossy()),
        "stderr does not name {}: {stderr}",
        victim.display()
    );
}
