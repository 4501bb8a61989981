//! Shared by the CLI crate's integration tests: where they write scratch files, the probe they
//! run small, and the JSON a `--json` run of the binary prints.
#![allow(dead_code)]

use std::num::NonZeroUsize;
use std::process::Output;

use burn_mapped_tools::probe::CpuProbeConfig;

/// A temp dir on the target directory's file system (a real disk in CI, unlike a tmpfs /tmp).
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A CPU probe quick on small files: two threads, one warm-up pass and `passes` timed ones, in
/// 64 KiB chunks.
pub fn small_probe_config(passes: usize) -> CpuProbeConfig {
    CpuProbeConfig {
        threads: NonZeroUsize::new(2).unwrap(),
        warmup_passes: 1,
        passes,
        chunk_bytes: 64 << 10,
        ..CpuProbeConfig::default()
    }
}

/// What a run of the binary printed on stdout as JSON; the run must have succeeded (its stderr,
/// after `what`, otherwise).
pub fn success_json(out: &Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
