//! `burn-mapped fetch <name>`: download a known checkpoint into the cache; the verified path
//! is the last line printed.

use anyhow::bail;

use crate::fetch::{default_cache_dir, fetch_qwen25_coder_05b};

/// Arguments of `burn-mapped fetch`.
#[derive(clap::Args, Debug)]
pub struct FetchArgs {
    /// Checkpoint name; known: `qwen2.5-coder-0.5b`.
    pub name: String,
    /// Cache directory (default: `$XDG_CACHE_HOME/burn-mapped` or `~/.cache/burn-mapped`).
    #[arg(long)]
    pub cache_dir: Option<std::path::PathBuf>,
}

/// Names `fetch` knows.
pub const KNOWN: &[&str] = &["qwen2.5-coder-0.5b"];

/// Runs `fetch`.
pub fn run(args: &FetchArgs) -> anyhow::Result<()> {
    let cache = args.cache_dir.clone().unwrap_or_else(default_cache_dir);
    if !KNOWN.contains(&args.name.as_str()) {
        bail!(
            "unknown checkpoint `{}`; known: {}",
            args.name,
            KNOWN.join(", ")
        );
    }
    let path = fetch_qwen25_coder_05b(&cache, true)?;
    say!("{}", path.display());
    Ok(())
}
