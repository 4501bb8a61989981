//! `burn-mapped verify`: re-hash every tensor file of a store.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn_mapped::{Manifest, StoreError};

use super::progress::bytes_bar;

/// Re-hash every tensor file and check the store's structure.
#[derive(Clone, Debug, clap::Args)]
pub struct VerifyArgs {
    /// Store directory.
    pub store: PathBuf,
    /// Draw no progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// What `verify` found.
#[derive(Debug)]
pub struct Outcome {
    /// Tensors in the manifest.
    pub tensors: usize,
    /// Every problem, in manifest order.
    pub problems: Vec<StoreError>,
}

/// Checks the store at `dir` and returns every problem (missing or short files, checksum
/// mismatches, dirty padding), drawing a progress bar over the padded bytes unless `quiet`.
///
/// # Errors
/// When the manifest itself cannot be read or is invalid.
pub fn check(dir: &Path, quiet: bool) -> anyhow::Result<Outcome> {
    let manifest = Manifest::read(dir).with_context(|| format!("verifying {}", dir.display()))?;
    let total = manifest.padded_bytes();
    let bar = bytes_bar(total, "verifying", quiet);
    let problems = burn_mapped::verify_dir(dir, |entry, _| {
        bar.inc(entry.padded_len());
        bar.set_message(crate::text::printable(entry.name()).into_owned());
    })
    .with_context(|| format!("verifying {}", dir.display()))?;
    bar.finish_and_clear();
    Ok(Outcome {
        tensors: manifest.tensors().len(),
        problems,
    })
}

/// Runs `verify`: prints each problem on its own line (tensor, file and, for a checksum
/// mismatch, expected and actual values) and fails if there is any.
///
/// # Errors
/// When the store has any problem, or its manifest cannot be read.
pub fn run(args: &VerifyArgs) -> anyhow::Result<()> {
    let Outcome {
        tensors: count,
        problems,
    } = check(&args.store, args.quiet)?;
    if problems.is_empty() {
        say!("{}: all {count} tensors intact", args.store.display());
        return Ok(());
    }
    for problem in &problems {
        say!("FAIL {problem}");
    }
    bail!(
        "{}: {} of {count} tensors failed verification",
        args.store.display(),
        problems.len()
    )
}
