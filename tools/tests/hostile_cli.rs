//! The CLI against careless and hostile input: `convert` never removes what it did not
//! write, bad numbers are refused by name, metadata cannot drive the terminal, and the
//! strict-mode variable is honoured.

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use burn_mapped::{StoreWriter, TensorSpec, manifest::MANIFEST_FILE, readonly::StrictMode};
use burn_mapped_tests::synthetic::write_safetensors;
use burn_mapped_tools::cli::convert::{self, ConvertArgs};
use burn_mapped_tools::cli::generate::{check_context, sampler_for};
use burn_mapped_tools::cli::inspect;
use safetensors::Dtype;

fn checkpoint(path: &Path) {
    let bytes: Vec<u8> = (0..16u8).collect();
    write_safetensors(path, &[("w", Dtype::F32, vec![2, 2], bytes)], None);
}

fn args(input: &Path, out: &Path, force: bool) -> ConvertArgs {
    ConvertArgs {
        input: input.to_path_buf(),
        out: out.to_path_buf(),
        dtype: None,
        quiet: true,
        force,
    }
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("model.safetensors");
    checkpoint(&input);
    (tmp, input)
}

#[test]
fn convert_refuses_an_out_directory_that_is_not_a_store_and_keeps_its_files() {
    let (tmp, input) = setup();
    let out = tmp.path().join("documents");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("thesis.tex"), b"years of work").unwrap();
    let err = convert::run(&args(&input, &out, true)).unwrap_err();
    assert!(
        format!("{err:#}").contains("not a burn-mapped store"),
        "{err:#}"
    );
    assert_eq!(
        std::fs::read(out.join("thesis.tex")).unwrap(),
        b"years of work"
    );
}

#[test]
fn convert_replaces_an_existing_store_only_with_force() {
    let (tmp, input) = setup();
    let out = tmp.path().join("store");
    convert::run(&args(&input, &out, false)).unwrap();
    let err = convert::run(&args(&input, &out, false)).unwrap_err();
    assert!(format!("{err:#}").contains("existing store"), "{err:#}");
    convert::run(&args(&input, &out, true)).unwrap();
    assert!(out.join(MANIFEST_FILE).is_file());
}

#[test]
fn convert_refuses_an_out_that_overlaps_its_input() {
    let (tmp, input) = setup();
    // The input file itself.
    assert!(convert::run(&args(&input, &input, true)).is_err());
    assert!(input.is_file());
    // Inside a sharded checkpoint's directory, and a directory holding the input.
    let shards = tmp.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    checkpoint(&shards.join("model-00001-of-00001.safetensors"));
    let err = convert::run(&args(&shards, &shards.join("store"), true)).unwrap_err();
    assert!(format!("{err:#}").contains("overlaps the input"), "{err:#}");
    let err = convert::check_out_apart(&input, tmp.path()).unwrap_err();
    assert!(err.to_string().contains("overlaps the input"), "{err}");
}

#[test]
fn inspect_escapes_control_characters_in_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut writer = StoreWriter::create(&dir).unwrap();
    writer.metadata("gguf.general.name", "\u{1b}]0;owned\u{7}\u{1b}[2J");
    writer
        .add(TensorSpec::new("t", DType::U8, [1]), &[0])
        .unwrap();
    writer.finish().unwrap();
    let table = inspect::render_table(&inspect::report(&dir).unwrap());
    assert!(
        !table.chars().any(|c| c.is_control() && c != '\n'),
        "{table:?}"
    );
    assert!(table.contains("\\u{1b}]0;owned"), "{table}");
}

#[test]
fn nan_and_negative_temperatures_are_refused_and_zero_is_greedy() {
    for t in [f64::NAN, -0.5, f64::INFINITY] {
        assert!(sampler_for(t, 0.9, 0).is_err(), "temperature {t} accepted");
    }
    assert!(sampler_for(0.7, f64::NAN, 0).is_err());
    assert!(sampler_for(0.0, 0.9, 0).is_ok());
    assert!(sampler_for(0.7, 0.9, 0).is_ok());
}

#[test]
fn max_tokens_past_the_context_is_refused() {
    assert!(check_context(10, 32758, 32768).is_ok());
    let err = check_context(11, 32758, 32768).unwrap_err();
    assert!(err.to_string().contains("32768"), "{err}");
    assert!(check_context(5, usize::MAX, 32768).is_err());
}

/// `BURN_MAPPED_STRICT=1` applies to the CLI's loads when `--strict` is not given. Runs in a
/// child process (this test binary again), since the variable is process-wide.
#[test]
fn the_strict_variable_is_honoured_without_the_flag() {
    const CHILD: &str = "BURN_MAPPED_STRICT_CHILD";
    if let Ok(dir) = std::env::var(CHILD) {
        let store = burn_mapped_tools::qwen::open_options(false)
            .open(&dir)
            .unwrap();
        assert_eq!(store.strict(), StrictMode::Strict);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut writer = StoreWriter::create(&dir).unwrap();
    writer
        .add(TensorSpec::new("t", DType::U8, [1]), &[0])
        .unwrap();
    writer.finish().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_strict_variable_is_honoured_without_the_flag",
        ])
        .env(CHILD, &dir)
        .env(burn_mapped::readonly::STRICT_ENV, "1")
        .status()
        .unwrap();
    assert!(status.success());
}
