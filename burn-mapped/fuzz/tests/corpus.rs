//! Replays the committed corpus: every file under `corpus/` through every target, so an input
//! that once broke a parser stays fixed. This needs no fuzzer and no instrumentation; CI runs it
//! with `cargo test --release --manifest-path burn-mapped/fuzz/Cargo.toml`.

use std::fs;
use std::panic;
use std::path::{Path, PathBuf};

use burn_mapped_fuzz::TARGETS;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_has_seeds_and_an_entry_point() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in TARGETS {
        assert!(
            !files_in(&corpus_dir().join(name)).is_empty(),
            "corpus/{name} holds no seed"
        );
        let entry = root.join("fuzz_targets").join(format!("{name}.rs"));
        assert!(entry.is_file(), "{} is missing", entry.display());
    }
}

#[test]
fn every_corpus_file_passes_every_target() {
    let mut failures = Vec::new();
    let mut runs = 0;
    let dirs = fs::read_dir(corpus_dir()).unwrap();
    for dir in dirs
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.is_dir())
    {
        for file in files_in(&dir) {
            let data = fs::read(&file).unwrap();
            for (name, target) in TARGETS {
                runs += 1;
                // Each panic message is printed as it happens; the list names the pairs.
                if panic::catch_unwind(|| target(&data)).is_err() {
                    failures.push(format!("{name} <- {}", file.display()));
                }
            }
        }
    }
    assert!(runs > 0, "no corpus under {}", corpus_dir().display());
    assert!(
        failures.is_empty(),
        "{} of {runs} runs panicked:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
