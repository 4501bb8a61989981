//! The `burn-mapped` binary against crafted GGUF files, stores and flags: every case exits 1 or
//! 2 with a message naming the file or flag (or works correctly), never a panic, an abort or a
//! wrong answer, and no file outside the store changes. Each test runs the binary itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn_mapped::Manifest;
use burn_mapped_tests::gguf::{TinyDims, tiny_qwen2};
use burn_mapped_tests::synthetic::{entry_names, sorted_entries};

fn bin() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_burn-mapped"));
    command.env_remove("BURN_MAPPED_THREADS");
    command
}

/// Runs `args` from `cwd`; returns the output after checking the exit code is `code`.
fn run_in(cwd: &Path, args: &[&str], code: i32) -> Output {
    let out = bin().current_dir(cwd).args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `generate --model MODEL --placement map --cache-dir CACHE` and `args`, expecting `code`.
fn generate(cwd: &Path, model: &str, cache: &Path, args: &[&str], code: i32) -> Output {
    let cache = cache.to_str().unwrap();
    let mut all = vec![
        "generate",
        "--model",
        model,
        "--placement",
        "map",
        "--cache-dir",
        cache,
    ];
    all.extend_from_slice(args);
    run_in(cwd, &all, code)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write_gguf(path: &Path, dims: TinyDims, seed: u64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, tiny_qwen2(dims, seed).build()).unwrap();
}

/// `generate` on `model` with greedy decoding; returns the generated ids.
fn generated_ids(cwd: &Path, cache: &Path, model: &str) -> Vec<u64> {
    let out = generate(
        cwd,
        model,
        cache,
        &[
            "--prompt",
            "hello",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--json",
            "--dtype",
            "f32",
        ],
        0,
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// Stores converted from `<cache>/stores`.
fn cached_stores(cache: &Path) -> Vec<PathBuf> {
    sorted_entries(&cache.join("stores"))
}

#[test]
fn two_ggufs_of_one_name_get_their_own_stores_and_a_replaced_one_is_converted_again() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    write_gguf(&a.join("model.gguf"), TinyDims::default(), 1);
    write_gguf(&b.join("model.gguf"), TinyDims::default(), 2);
    let from_a = generated_ids(&a, &cache, "model.gguf");
    let from_b = generated_ids(&b, &cache, "model.gguf");
    assert_eq!(cached_stores(&cache).len(), 2);
    // Each run after the first uses its own cached store and gives its own tokens.
    assert_eq!(generated_ids(&a, &cache, "model.gguf"), from_a);
    assert_eq!(generated_ids(&b, &cache, "model.gguf"), from_b);
    // Replaced in place (same size, same header, other weights): converted again.
    std::fs::copy(b.join("model.gguf"), a.join("model.gguf")).unwrap();
    assert_eq!(generated_ids(&a, &cache, "model.gguf"), from_b);
    assert_eq!(cached_stores(&cache).len(), 2);
}

#[test]
fn a_store_records_its_source_as_an_absolute_path_and_notices_when_it_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    write_gguf(&a.join("model.gguf"), TinyDims::default(), 1);
    write_gguf(&b.join("model.gguf"), TinyDims::default(), 2);
    convert_f32(&a, &[], 0);
    let store = a.join("store");
    let manifest = Manifest::read(&store).unwrap();
    let recorded = Path::new(&manifest.metadata()["source.gguf"]).to_path_buf();
    assert!(recorded.is_absolute(), "{}", recorded.display());
    assert_eq!(recorded, a.join("model.gguf").canonicalize().unwrap());
    // Run from another directory that holds another model.gguf: the store's own is used.
    let cache = tmp.path().join("cache");
    let store_arg = store.to_str().unwrap();
    let from_store = generated_ids(&b, &cache, store_arg);
    assert_eq!(from_store, generated_ids(&a, &cache, "model.gguf"));
    // The source replaced by another file: the store refuses, naming both.
    std::fs::copy(b.join("model.gguf"), a.join("model.gguf")).unwrap();
    let out = generate(&b, store_arg, &cache, &["--prompt", "x"], 1);
    let err = stderr(&out);
    assert!(err.contains("has changed since"), "{err}");
    assert!(err.contains(&*recorded.to_string_lossy()), "{err}");
}

#[test]
fn a_gguf_under_a_path_that_is_not_utf8_is_recorded_exactly() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(std::ffi::OsStr::from_bytes(b"mod\xffels"));
    let gguf = dir.join("model.gguf");
    write_gguf(&gguf, TinyDims::default(), 3);
    let out = bin()
        .current_dir(tmp.path())
        .arg("convert")
        .arg(&gguf)
        .args(["--out", "store", "--dtype", "f32", "--quiet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let manifest = Manifest::read(&tmp.path().join("store")).unwrap();
    let record = burn_mapped::gguf::SourceRecord::from_metadata(manifest.metadata()).unwrap();
    assert_eq!(record.path, gguf.canonicalize().unwrap());
}

#[test]
fn sizes_claimed_by_a_gguf_are_refused_before_they_size_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            TinyDims {
                layers_claimed: 100_000_000,
                ..TinyDims::default()
            },
            "num_hidden_layers",
        ),
        (
            TinyDims {
                layers_claimed: 30,
                ..TinyDims::default()
            },
            "the weights hold 2",
        ),
        (
            TinyDims {
                context: 1 << 62,
                ..TinyDims::default()
            },
            "max_position_embeddings",
        ),
    ];
    for (i, (dims, expected)) in cases.into_iter().enumerate() {
        let err = refused_generate(
            tmp.path(),
            &format!("m{i}.gguf"),
            dims,
            4,
            "4611686018427387904",
        );
        assert!(err.contains(expected), "{expected}: {err}");
    }
}

/// stderr of `generate --prompt x --max-tokens max_tokens` (cache `dir/cache`) on a tiny GGUF
/// of `dims` written as `dir/name`, which must be refused (exit 1).
fn refused_generate(dir: &Path, name: &str, dims: TinyDims, seed: u64, max_tokens: &str) -> String {
    let gguf = dir.join(name);
    write_gguf(&gguf, dims, seed);
    let out = generate(
        dir,
        gguf.to_str().unwrap(),
        &dir.join("cache"),
        &["--prompt", "x", "--max-tokens", max_tokens],
        1,
    );
    stderr(&out)
}

#[test]
fn a_cache_larger_than_the_machine_is_refused_not_attempted() {
    let tmp = tempfile::tempdir().unwrap();
    // 8 KiB of keys and values per position: 16M positions would need 128 GiB.
    let dims = TinyDims {
        hidden: 512,
        heads: 4,
        kv_heads: 4,
        context: 1 << 24,
        ..TinyDims::default()
    };
    let err = refused_generate(tmp.path(), "wide.gguf", dims, 5, "16000000");
    assert!(err.contains("more than this machine's"), "{err}");
}

#[test]
fn thread_counts_past_the_limit_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_in(
        tmp.path(),
        &["probe", tmp.path().to_str().unwrap(), "--threads", "100000"],
        2,
    );
    assert!(stderr(&out).contains("--threads"), "{}", stderr(&out));
    let err = usage_error(tmp.path(), "BURN_MAPPED_THREADS", "100000");
    assert!(err.contains("BURN_MAPPED_THREADS"), "{err}");
}

/// stderr of `inspect` with the variable `var` set to `value`, which must be a usage error
/// (exit 2) refused before any work.
fn usage_error(cwd: &Path, var: &str, value: &str) -> String {
    let out = bin()
        .current_dir(cwd)
        .env(var, value)
        .args(["inspect", "no-such-store"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    stderr(&out)
}

/// `BURN_MAPPED_CPU` pins the CPU kernels' tier: a name that is no tier is a usage error, and a
/// pinned tier is the one `generate` reports running (the scalar one runs everywhere).
#[test]
fn the_cpu_tier_is_pinned_by_name_or_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let err = usage_error(tmp.path(), "BURN_MAPPED_CPU", "sse9");
    assert!(
        err.contains("BURN_MAPPED_CPU=\"sse9\" is not a CPU tier"),
        "{err}"
    );
    let gguf = tmp.path().join("model.gguf");
    write_gguf(&gguf, TinyDims::default(), 8);
    let out = bin()
        .current_dir(tmp.path())
        .env("BURN_MAPPED_CPU", "scalar")
        .args([
            "generate",
            "--model",
            "model.gguf",
            "--prompt",
            "x",
            "--max-tokens",
            "2",
        ])
        .args(["--json", "--cache-dir", "cache"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["cpu_tier"], "scalar");
}

/// `convert model.gguf --out store --dtype f32 --quiet` and `args`, run in `dir`, expecting
/// `code`.
fn convert_f32(dir: &Path, args: &[&str], code: i32) -> Output {
    let mut all = vec![
        "convert",
        "model.gguf",
        "--out",
        "store",
        "--dtype",
        "f32",
        "--quiet",
    ];
    all.extend_from_slice(args);
    run_in(dir, &all, code)
}

/// A converted tiny store under `dir/store`.
fn tiny_store(dir: &Path) -> PathBuf {
    write_gguf(&dir.join("model.gguf"), TinyDims::default(), 6);
    convert_f32(dir, &[], 0);
    dir.join("store")
}

#[test]
fn the_probe_reads_only_what_the_manifest_names_at_the_size_it_says() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tiny_store(tmp.path());
    // A stray 1 TiB sparse file in the store directory is never read.
    std::fs::File::create(store.join("stray.bin"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let files = burn_mapped_tools::probe::tensor_files_in(&store).unwrap();
    let manifest = Manifest::read(&store).unwrap();
    assert_eq!(files.len(), manifest.tensors().len());
    assert!(!files.iter().any(|f| f.ends_with("stray.bin")));
    let out = run_in(
        tmp.path(),
        &["probe", "store", "--passes", "1", "--json"],
        0,
    );
    assert!(!out.stdout.is_empty());
    // A tensor file swollen past its entry is refused by name, not read.
    let first = store.join(manifest.tensors()[0].file());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let out = run_in(tmp.path(), &["probe", "store", "--passes", "1"], 1);
    let name = manifest.tensors()[0].file();
    assert!(stderr(&out).contains(name), "{}", stderr(&out));
}

#[test]
fn force_refuses_a_store_holding_a_users_file_and_moves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tiny_store(tmp.path());
    std::fs::write(store.join("notes.txt"), b"mine").unwrap();
    let out = convert_f32(tmp.path(), &["--force"], 1);
    assert!(stderr(&out).contains("notes.txt"), "{}", stderr(&out));
    assert_eq!(std::fs::read(store.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(entry_names(tmp.path()), ["model.gguf", "store"]);
}

#[test]
fn misleading_messages_now_say_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tiny_store(tmp.path());
    let cache = tmp.path().join("cache");
    // `--out .` names the current directory.
    let out = run_in(
        tmp.path(),
        &["convert", "model.gguf", "--out", ".", "--quiet"],
        1,
    );
    assert!(
        stderr(&out).contains("names no new directory"),
        "{}",
        stderr(&out)
    );
    // `--ctx` below the prompt is blamed on `--ctx`.
    let out = generate(
        tmp.path(),
        "store",
        &cache,
        &[
            "--prompt",
            "a longer prompt",
            "--ctx",
            "2",
            "--max-tokens",
            "4",
        ],
        1,
    );
    assert!(
        stderr(&out).contains("--ctx 2 cannot hold"),
        "{}",
        stderr(&out)
    );
    // A cache directory that is a file is named as such.
    // (A store format asks for the cache; a GGUF read in place needs none.)
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = generate(
        tmp.path(),
        "model.gguf",
        &file,
        &["--prompt", "x", "--dtype", "f32"],
        1,
    );
    assert!(
        stderr(&out).contains("cache directory") && stderr(&out).contains("not a directory"),
        "{}",
        stderr(&out)
    );
    // A tensor file replaced by a link is called a link.
    let manifest = Manifest::read(&store).unwrap();
    let first = store.join(manifest.tensors()[0].file());
    let moved = tmp.path().join("moved.tensor");
    std::fs::rename(&first, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &first).unwrap();
    let out = run_in(tmp.path(), &["verify", "store"], 1);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(text.contains("symbolic link"), "{text}");
    assert!(!text.contains("too many levels"), "{text}");
    // A GGUF without a vocabulary: the error names the file.
    let bare = tmp.path().join("bare.gguf");
    let mut dims_only =
        burn_mapped_tests::gguf::Builder::new().kv_str("general.architecture", "qwen2");
    dims_only = dims_only.kv_u64("qwen2.block_count", 0);
    std::fs::write(&bare, dims_only.build()).unwrap();
    let out = generate(tmp.path(), "bare.gguf", &cache, &["--prompt", "x"], 1);
    assert!(stderr(&out).contains("bare.gguf"), "{}", stderr(&out));
}

#[test]
fn control_characters_read_from_files_never_reach_the_terminal_raw() {
    let tmp = tempfile::tempdir().unwrap();
    let evil = "\u{1b}]0;owned\u{7}\u{1b}[2J";
    let path = tmp.path().join("model.gguf");
    let builder = tiny_qwen2(TinyDims::default(), 7)
        .kv_str("general.description", evil)
        .kv_str("general.license", evil);
    std::fs::write(&path, builder.build()).unwrap();
    let commands: [&[&str]; 3] = [
        &["convert", "model.gguf", "--out", "store", "--dtype", "f32"],
        &["inspect", "store"],
        &["verify", "store"],
    ];
    for args in commands {
        let out = run_in(tmp.path(), args, 0);
        for stream in [&out.stdout, &out.stderr] {
            assert!(
                !stream.contains(&0x1b),
                "{args:?}: {}",
                String::from_utf8_lossy(stream)
            );
        }
    }
    // An error that quotes a file name with an escape in it.
    let name = tmp.path().join("\u{1b}[2Jbad.gguf");
    std::fs::write(&name, b"GGUF").unwrap();
    let out = run_in(
        tmp.path(),
        &["convert", name.to_str().unwrap(), "--out", "x", "--quiet"],
        1,
    );
    assert!(!out.stderr.contains(&0x1b), "{}", stderr(&out));
    assert!(stderr(&out).contains("\\u{1b}"), "{}", stderr(&out));
}
