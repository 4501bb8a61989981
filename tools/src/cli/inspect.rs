//! `burn-mapped inspect`: what a store holds, as a table or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use burn_mapped::{ALIGNMENT, FORMAT, FORMAT_VERSION, Manifest};
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
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
}

/// A quantization link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct QuantRow {
    /// Scheme name.
    pub scheme: String,
    /// Scale tensor.
    pub scale: String,
}

/// Everything `inspect` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
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
    /// Tensors in manifest order.
    pub tensors: Vec<TensorRow>,
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
        on_disk_bytes: tensors.iter().map(|t| t.padded_bytes).sum(),
        metadata: manifest.metadata().clone(),
        tensors,
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
    let quant = |t: &TensorRow| {
        t.quant.as_ref().map_or_else(
            || "-".to_string(),
            |q| format!("{} -> {}", q.scheme, q.scale),
        )
    };
    let header = ["name", "dtype", "shape", "bytes", "padded", "file", "quant"];
    let rows: Vec<[String; 7]> = report
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
            if i == 3 || i == 4 {
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
    if !report.metadata.is_empty() {
        out.push_str("metadata:\n");
        for (k, v) in &report.metadata {
            let _ = writeln!(out, "  {k} = {v}");
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
        print!("{}", render_table(&report));
    }
    Ok(())
}
