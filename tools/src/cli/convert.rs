//! `burn-mapped convert`: turn a checkpoint into a store.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn_mapped::convert::WeightFormat;
use burn_mapped::convert::{ConvertOptions, ConvertSummary, Progress};
use burn_mapped::q8::is_projection_weight;
use burn_mapped::{Existing, Manifest};
use indicatif::HumanBytes;

use super::inspect::{quant_error_line, quant_error_summary};
use super::progress::bytes_bar;

/// Convert a checkpoint into a burn-mapped store.
#[derive(Clone, Debug, clap::Args)]
pub struct ConvertArgs {
    /// A `.safetensors` file, a sharded checkpoint's `*.safetensors.index.json` or its
    /// directory, or a burnpack `.bpk` file.
    pub input: PathBuf,
    /// Store directory to create. Anything already there that is not a burn-mapped store is
    /// refused; an existing store is replaced (atomically) only with `--force`.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing store at `--out`.
    #[arg(long)]
    pub force: bool,
    /// Store every float tensor as this type (f32, f16, bf16; rounding to nearest even);
    /// integer and bool tensors are kept. `q8`: 2-D projection weights and the LM head
    /// become int8 with one f16 scale per row (GGUF is dequantized first), every other
    /// float tensor (embeddings, norms, biases) f32; the rule is
    /// `burn_mapped::q8::is_projection_weight`. `blocks` (GGUF only): the same matrices keep
    /// the GGUF's quantized blocks byte for byte, the rest f32.
    #[arg(long)]
    pub dtype: Option<WeightFormat>,
    /// Draw no progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The input formats `convert` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// Hugging Face safetensors (a file, an index, or a directory of shards).
    Safetensors,
    /// Burn's burnpack.
    Burnpack,
    /// GGUF (llama.cpp).
    Gguf,
}

const BURNPACK_MAGIC: [u8; 4] = burn::store::burn_pack::MAGIC_NUMBER.to_le_bytes();

/// Tells the format of `path` from its first bytes, falling back on its extension; a
/// directory is taken as a sharded safetensors checkpoint.
///
/// # Errors
/// When the file cannot be read, or neither its content nor its name says what it is.
pub fn detect(path: &Path) -> anyhow::Result<InputKind> {
    if path.is_dir() {
        return Ok(InputKind::Safetensors);
    }
    let mut head = [0u8; 9];
    let mut file =
        burn_mapped::untrusted::open_regular(path, burn_mapped::untrusted::Links::Follow)
            .with_context(|| format!("opening {}", path.display()))?;
    let mut filled = 0;
    while filled < head.len() {
        let n = file
            .read(&mut head[filled..])
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    let head = &head[..filled];
    if head.starts_with(b"GGUF") {
        return Ok(InputKind::Gguf);
    }
    if head.starts_with(&BURNPACK_MAGIC) {
        return Ok(InputKind::Burnpack);
    }
    // safetensors: an 8-byte little-endian header length, then the JSON header.
    if head.len() == 9 && head[8] == b'{' {
        return Ok(InputKind::Safetensors);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json") {
        Ok(InputKind::Safetensors)
    } else if name.ends_with(".bpk") {
        Ok(InputKind::Burnpack)
    } else if name.ends_with(".gguf") {
        Ok(InputKind::Gguf)
    } else {
        bail!(
            "{}: cannot tell the format (expected safetensors, a safetensors index, burnpack or GGUF)",
            path.display()
        )
    }
}

/// Runs `convert`: detects the input, converts it with a progress bar over the input bytes,
/// and prints what was written.
///
/// # Errors
/// Any conversion error (it names the input file and tensor).
pub fn run(args: &ConvertArgs) -> anyhow::Result<()> {
    let kind = detect(&args.input)?;
    check_out_apart(&args.input, &args.out)?;
    let existing = if args.force {
        Existing::Replace
    } else {
        Existing::Refuse
    };
    let bar = bytes_bar(0, "converting", args.quiet);
    let progress_bar = bar.clone();
    let mut options =
        ConvertOptions::default()
            .existing(existing)
            .progress(move |p: &Progress<'_>| {
                progress_bar.set_length(p.total_bytes);
                progress_bar.set_position(p.done_bytes);
                progress_bar.set_message(crate::text::printable(p.tensor).into_owned());
            });
    if let Some(format) = args.dtype {
        if format == WeightFormat::Blocks && kind != InputKind::Gguf {
            bail!("--dtype blocks keeps a GGUF's quantized blocks; the input is not a GGUF")
        }
        options = options.format(format, is_projection_weight);
    }
    let result = match kind {
        InputKind::Safetensors => {
            burn_mapped::convert::from_safetensors(&args.input, &args.out, &mut options)
        }
        InputKind::Burnpack => {
            burn_mapped::convert::from_burnpack(&args.input, &args.out, &mut options)
        }
        InputKind::Gguf => {
            let manifest = crate::qwen::convert(&args.input, &args.out, options)
                .with_context(|| format!("converting {}", args.input.display()))?;
            bar.finish_and_clear();
            let on_disk = manifest.padded_bytes();
            say!(
                "wrote {} tensors to {}: {} logical, {} on disk ({})",
                manifest.tensors().len(),
                args.out.display(),
                HumanBytes(manifest.total_bytes()),
                HumanBytes(on_disk),
                if args.dtype == Some(WeightFormat::Blocks) {
                    "projections as GGUF blocks, the rest dequantized"
                } else {
                    "dequantized from GGUF"
                }
            );
            print_quant_errors(&manifest);
            return Ok(());
        }
    };
    bar.finish_and_clear();
    let (manifest, summary) = result.with_context(|| {
        format!(
            "converting {} into {}",
            args.input.display(),
            args.out.display()
        )
    })?;
    let on_disk = manifest.padded_bytes();
    say!("{}", summary_line(&summary, &args.out, on_disk));
    print_quant_errors(&manifest);
    Ok(())
}

/// Refuses an output that is the input, lies inside it, or contains it: converting must never
/// replace or write into what it reads.
///
/// # Errors
/// When the two overlap, or the input cannot be resolved.
pub fn check_out_apart(input: &Path, out: &Path) -> anyhow::Result<()> {
    if out.file_name().is_none()
        || matches!(
            out.components().next_back(),
            Some(std::path::Component::CurDir | std::path::Component::ParentDir)
        )
    {
        bail!(
            "--out {} names no new directory; give the store a directory of its own (for example --out ./store)",
            out.display()
        );
    }
    let input = input
        .canonicalize()
        .with_context(|| format!("resolving {}", input.display()))?;
    // The output may not exist yet: resolve its nearest existing ancestor and re-attach the rest.
    let mut existing = out.to_path_buf();
    let mut rest = Vec::new();
    let resolved = loop {
        match existing.canonicalize() {
            Ok(path) => break path,
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = if parent.as_os_str().is_empty() {
                        PathBuf::from(".")
                    } else {
                        parent.to_path_buf()
                    };
                }
                _ => bail!("cannot resolve --out {}", out.display()),
            },
        }
    };
    let out_resolved = rest.iter().rev().fold(resolved, |p, n| p.join(n));
    if out_resolved.starts_with(&input) || input.starts_with(&out_resolved) {
        bail!(
            "--out {} overlaps the input {}: choose a directory outside it",
            out.display(),
            input.display()
        );
    }
    Ok(())
}

fn print_quant_errors(manifest: &Manifest) {
    if let Some(summary) = quant_error_summary(manifest) {
        say!("{}", quant_error_line(&summary));
    }
}

fn summary_line(summary: &ConvertSummary, out: &Path, on_disk: u64) -> String {
    let mut line = format!(
        "wrote {} tensors to {}: {} logical, {} on disk",
        summary.written,
        out.display(),
        HumanBytes(summary.stored_bytes),
        HumanBytes(on_disk)
    );
    if summary.quantized > 0 {
        line += &format!(", {} quantized to q8", summary.quantized);
    }
    if summary.cast > 0 {
        line += &format!(", {} cast", summary.cast);
    }
    if summary.renamed > 0 {
        line += &format!(", {} renamed", summary.renamed);
    }
    if !summary.dropped.is_empty() {
        line += &format!(", {} dropped", summary.dropped.len());
    }
    line
}
