//! What a run reports: a Markdown table and a summary line on standard output, and the JSON
//! results (to `--json` or standard output).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::timing::ArmResult;

/// The results of one run.
#[derive(Serialize)]
pub struct Report {
    pub protocol: &'static str,
    pub device: String,
    pub out: usize,
    pub inp: usize,
    pub matrices: usize,
    pub matrix_mb: f64,
    pub host_threads: usize,
    pub host_kernel: &'static str,
    pub flex_matmul_threads: Option<&'static str>,
    pub check_q8_vs_f32_max_rel_err: Option<f64>,
    /// For `q8graph`: whether the replayed outputs equal a fresh eager product, per `T`.
    pub graph_checks: Vec<String>,
    pub skipped: Vec<String>,
    pub arms: Vec<ArmResult>,
}

/// The protocol every run follows, as the results state it.
pub const PROTOCOL: &str = "one pass = one product per matrix + one sync; warm-up passes discarded; median and min/max over timed passes; GB/s counts weight bytes once";

impl Report {
    /// Prints the table and the summary line, then writes the JSON to `json` (or prints it).
    pub fn emit(&self, json: Option<&Path>) -> Result<()> {
        println!(
            "| arm    | T  | matrices | MB/pass | median ms | min ms | max ms | GB/s (median) | GB/s (best) | enqueue ms | device ms | per sync | tuning |"
        );
        println!(
            "|--------|----|----------|---------|-----------|--------|--------|---------------|-------------|------------|-----------|----------|--------|"
        );
        for r in &self.arms {
            println!(
                "| {:<6} | {:<2} | {:<8} | {:>7.1} | {:>9.3} | {:>6.3} | {:>6.3} | {:>13.2} | {:>11.2} | {:>10.3} | {:>9} | {:>8} | {} |",
                r.arm,
                r.t,
                r.matrices,
                r.bytes_per_pass as f64 / 1e6,
                r.median_ms,
                r.min_ms,
                r.max_ms,
                r.gbps_median,
                r.gbps_best,
                r.enqueue_ms,
                r.device_ms
                    .map(|d| format!("{d:.3}"))
                    .unwrap_or_else(|| "-".into()),
                r.passes_per_sync,
                r.tuning.as_deref().unwrap_or("-")
            );
        }
        println!(
            "device {}, host threads {} ({}), q8 vs f32 max rel err {:?}, skipped {:?}",
            self.device,
            self.host_threads,
            self.host_kernel,
            self.check_q8_vs_f32_max_rel_err,
            self.skipped
        );
        let text = serde_json::to_string_pretty(self)?;
        match json {
            Some(path) => {
                std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?
            }
            None => println!("{text}"),
        }
        Ok(())
    }
}
