//! `burn-mapped inspect`: what a store holds, as a table or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use burn_mapped::{Manifest, manifest::ALIGNMENT, manifest::FORMAT, manifest::FORMAT_VERSION};

use crate::text::printable;
use indicatif::HumanBytes;
use serde::Serialize;

/// Show a store's tensors, sizes and metadata.
#[derive(Clone, Debug, clap::Args)]
pub struct InspectArgs {
    /// Store directory.
    pub store: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One tensor as `inspect` reports it.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct TensorRow {
    /// Module path.
    pub name: String,
    /// Manifest dtype.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Logical bytes.
    pub bytes: u64,
    /// Bytes on disk (padded to the alignment).
    pub padded_bytes: u64,
    /// File name inside the store.
    pub file: String,
    /// Burn parameter id.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub param_id: Option<u64>,
    /// Quantization scheme and scale tensor, when quantized.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quant: Option<QuantRow>,
    /// GGUF block type and values per row, when the tensor holds quantized blocks.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub blocks: Option<BlockRow>,
}

/// A tensor of GGUF blocks.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct BlockRow {
    /// ggml's name of the block type (`Q4_K`).
    #[serde(rename = "type")]
    pub ty: String,
    /// Values per row.
    pub cols: usize,
}

/// A quantization link.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct QuantRow {
    /// Scheme name.
    pub scheme: String,
    /// Scale tensor.
    pub scale: String,
    /// `||W - dequant||_F / ||W||_F` recorded at conversion, if recorded.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rel_error: Option<f64>,
}

/// The recorded quantization errors of a store's matrices, summed up.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct QuantErrorSummary {
    /// Quantized matrices with a recorded error.
    pub matrices: usize,
    /// Quantized matrices without one (written before errors were recorded).
    pub unrecorded: usize,
    /// Arithmetic mean of the per-matrix relative errors.
    pub mean: f64,
    /// The largest per-matrix relative error.
    pub worst: f64,
    /// The matrix with the largest error.
    pub worst_tensor: String,
}

/// Sums up the per-matrix errors recorded in `manifest`, or `None` when it quantizes nothing.
pub fn quant_error_summary(manifest: &Manifest) -> Option<QuantErrorSummary> {
    let links: Vec<_> = manifest
        .tensors()
        .iter()
        .filter_map(|t| t.quant().map(|q| (t.name(), q.rel_error.map(f64::from))))
        .collect();
    if links.is_empty() {
        return None;
    }
    let recorded: Vec<(&str, f64)> = links
        .iter()
        .filter_map(|&(name, e)| e.map(|e| (name, e)))
        .collect();
    let (worst_tensor, worst) =
        recorded.iter().copied().fold(
            ("", 0f64),
            |best, cur| if cur.1 > best.1 { cur } else { best },
        );
    Some(QuantErrorSummary {
        matrices: recorded.len(),
        unrecorded: links.len() - recorded.len(),
        mean: if recorded.is_empty() {
            0.0
        } else {
            recorded.iter().map(|&(_, e)| e).sum::<f64>() / recorded.len() as f64
        },
        worst,
        worst_tensor: worst_tensor.to_string(),
    })
}

/// One line about a store's quantization errors (`-` fields when none were recorded).
pub fn quant_error_line(summary: &QuantErrorSummary) -> String {
    let mut line = format!("q8: {} matrices", summary.matrices + summary.unrecorded);
    if summary.matrices > 0 {
        line += &format!(
            ", relative error ||W - deq(Q)||/||W||: mean {:.3e}, worst {:.3e} ({})",
            summary.mean, summary.worst, summary.worst_tensor
        );
    }
    if summary.unrecorded > 0 {
        line += &format!(", {} without a recorded error", summary.unrecorded);
    }
    line
}

/// Everything `inspect` reports.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct InspectReport {
    /// Store directory.
    pub store: PathBuf,
    /// Format tag.
    pub format: String,
    /// Format version.
    pub version: u32,
    /// Per-file alignment in bytes.
    pub alignment: u64,
    /// Number of tensors.
    pub tensor_count: usize,
    /// Sum of logical bytes.
    pub total_bytes: u64,
    /// Sum of padded bytes (the tensor files' size on disk).
    pub on_disk_bytes: u64,
    /// Manifest metadata.
    pub metadata: BTreeMap<String, String>,
    /// Quantization errors over every q8 matrix; absent when nothing is quantized.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quant_error: Option<QuantErrorSummary>,
    /// Tensors in manifest order.
    pub tensors: Vec<TensorRow>,
    /// The CPU kernels' tier this process would run the store's products with (the best this
    /// CPU runs, or `BURN_MAPPED_CPU`'s).
    pub cpu_tier: String,
}

/// Reads and validates the manifest of the store at `dir` (tensor files are not opened).
///
/// # Errors
/// When the manifest is missing or invalid.
pub fn report(dir: &Path) -> anyhow::Result<InspectReport> {
    let manifest = Manifest::read(dir).with_context(|| format!("inspecting {}", dir.display()))?;
    let tensors: Vec<TensorRow> = manifest
        .tensors()
        .iter()
        .map(|t| TensorRow {
            name: t.name().to_string(),
            dtype: t.dtype_name().to_string(),
            shape: t.shape().to_vec(),
            bytes: t.len(),
            padded_bytes: t.padded_len(),
            file: t.file().to_string(),
            param_id: t.param_id(),
            quant: t.quant().map(|q| QuantRow {
                scheme: q.scheme.clone(),
                scale: q.scale.clone(),
                rel_error: q.rel_error.map(f64::from),
            }),
            blocks: t.blocks().map(|b| BlockRow {
                ty: b.ty().name().to_string(),
                cols: b.cols(),
            }),
        })
        .collect();
    Ok(InspectReport {
        store: dir.to_path_buf(),
        format: FORMAT.to_string(),
        version: FORMAT_VERSION,
        alignment: ALIGNMENT,
        tensor_count: tensors.len(),
        total_bytes: manifest.total_bytes(),
        on_disk_bytes: manifest.padded_bytes(),
        metadata: manifest.metadata().clone(),
        quant_error: quant_error_summary(&manifest),
        tensors,
        cpu_tier: burn_mapped::host::cpu_tier().name().to_string(),
    })
}

/// The human-readable table.
pub fn render_table(report: &InspectReport) -> String {
    let shape = |s: &[usize]| {
        format!(
            "[{}]",
            s.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let quant = |t: &TensorRow| match (&t.quant, &t.blocks) {
        (Some(q), _) => format!("{} -> {}", q.scheme, q.scale),
        (None, Some(b)) => format!("{} blocks, {} per row", b.ty, b.cols),
        (None, None) => "-".to_string(),
    };
    let rel_error = |t: &TensorRow| match t.quant.as_ref().map(|q| q.rel_error) {
        Some(Some(e)) => format!("{e:.3e}"),
        Some(None) => "?".to_string(),
        None => "-".to_string(),
    };
    let header = [
        "name", "dtype", "shape", "bytes", "padded", "file", "quant", "q8 err",
    ];
    let rows: Vec<[String; 8]> = report
        .tensors
        .iter()
        .map(|t| {
            [
                t.name.clone(),
                t.dtype.clone(),
                shape(&t.shape),
                t.bytes.to_string(),
                t.padded_bytes.to_string(),
                t.file.clone(),
                quant(t),
                rel_error(t),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            // Numbers right-aligned, text left-aligned.
            if i == 3 || i == 4 || i == 7 {
                let _ = write!(text, "{cell:>w$}  ");
            } else {
                let _ = write!(text, "{cell:<w$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let _ = writeln!(
        out,
        "\n{} tensors, {} logical ({} bytes), {} on disk ({} bytes), alignment {} bytes, format {} v{}",
        report.tensor_count,
        HumanBytes(report.total_bytes),
        report.total_bytes,
        HumanBytes(report.on_disk_bytes),
        report.on_disk_bytes,
        report.alignment,
        report.format,
        report.version
    );
    if let Some(summary) = &report.quant_error {
        let _ = writeln!(out, "{}", quant_error_line(summary));
    }
    let _ = writeln!(
        out,
        "CPU kernels: {} ({} pins a tier)",
        report.cpu_tier,
        burn_mapped::host::CPU_VAR
    );
    if !report.metadata.is_empty() {
        out.push_str("metadata:\n");
        for (k, v) in &report.metadata {
            let _ = writeln!(out, "  {} = {}", printable(k), printable(v));
        }
    }
    out
}

/// Runs `inspect`: prints the table, or the report as JSON with `--json`.
///
/// # Errors
/// When the manifest is missing or invalid.
pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let report = report(&args.store)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        say_text!("{}", render_table(&report));
    }
    Ok(())
}
