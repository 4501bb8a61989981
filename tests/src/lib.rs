//! Support shared by the workspace-level tests in `tests/`: where the real checkpoint is, and
//! whether its absence skips a test or fails it.

use std::path::PathBuf;

use burn_mapped_tools::fetch::default_cache_dir;

/// The real Qwen2.5-Coder-0.5B-Instruct GGUF: `$BURN_MAPPED_GGUF`, else the fetch cache's copy.
///
/// Returns `None` (after saying so on stderr) when it is absent, so a test can pass without it;
/// with `BURN_MAPPED_REQUIRE_REAL=1` (set by CI) its absence panics instead.
pub fn real_gguf() -> Option<PathBuf> {
    let path = std::env::var_os("BURN_MAPPED_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| default_cache_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"));
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("BURN_MAPPED_REQUIRE_REAL").as_deref() == Ok("1") {
        panic!(
            "{} is missing; run `burn-mapped fetch qwen2.5-coder-0.5b`",
            path.display()
        );
    }
    eprintln!(
        "note: {} absent; real-checkpoint test not run",
        path.display()
    );
    None
}
