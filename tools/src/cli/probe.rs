//! `burn-mapped probe`: measure the three endpoints over a store's tensor files, then apply the rule.

use std::fmt::Write as _;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn_mapped::Placement;

use crate::cli::select::render_verdict;
use crate::device::{DeviceArg, parse_device};
use crate::probe::burn_device::{BurnProbeConfig, probe_device};
use crate::probe::{ArmReport, CpuProbeConfig, ProbeReport, Residency, probe_cpu, tensor_files_in};
use crate::select::{ArmRate, DEFAULT_THETA, Verdict, select};

/// Probe a store: every regular file in the directory except `manifest.json` is part of W
/// (or the single file given).
#[derive(Clone, Debug, clap::Args)]
pub struct ProbeArgs {
    /// Store directory (or one file) whose tensor files make up the working set W.
    pub store_or_dir: PathBuf,
    /// Device whose endpoints are probed: cpu (host memory, multi-threaded reads), wgpu or
    /// vulkan (Burn's own upload and sum kernel; needs the cargo feature). CUDA has its own
    /// binary, `cuda_probe`.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceArg,
    /// Measured passes per arm (the rate is the median).
    #[arg(long, default_value_t = 5)]
    pub passes: usize,
    /// Discarded warm-up passes per arm (at least 1; the first is the coexistence pass).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Reader threads (default: available parallelism), 1 to `burn_mapped::host::MAX_THREADS`.
    #[arg(long, value_parser = parse_threads)]
    pub threads: Option<NonZeroUsize>,
    /// Tie band for the verdict.
    #[arg(long, default_value_t = DEFAULT_THETA)]
    pub theta: f64,
    /// Print the probe report and the verdict as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write a bar chart of the three rates to this SVG file.
    #[arg(long, value_name = "SVG")]
    pub plot: Option<PathBuf>,
}

/// Runs the probe, applies the rule and prints both (a table, or JSON with `--json`).
///
/// # Errors
/// Unreadable store, probe failures, the rule's refusals, and a plot that cannot be written.
pub fn run(args: &ProbeArgs) -> anyhow::Result<()> {
    let files = if args.store_or_dir.is_dir() {
        tensor_files_in(&args.store_or_dir)?
    } else {
        vec![args.store_or_dir.clone()]
    };
    if files.is_empty() {
        bail!(
            "{} holds no tensor files to probe",
            args.store_or_dir.display()
        );
    }
    let report = match args.device {
        DeviceArg::Cpu => {
            let mut config = CpuProbeConfig {
                passes: args.passes,
                warmup_passes: args.warmup,
                ..CpuProbeConfig::default()
            };
            if let Some(threads) = args.threads {
                config.threads = threads;
            }
            probe_cpu(&files, &config)
                .with_context(|| format!("probing {}", args.store_or_dir.display()))?
        }
        device => {
            let config = BurnProbeConfig {
                passes: args.passes,
                warmup_passes: args.warmup,
            };
            probe_device(device, &files, &config)
                .with_context(|| format!("probing {} on {device}", args.store_or_dir.display()))?
        }
    };
    let verdict = select(&report.select_input(), args.theta)?;
    if let Some(path) = &args.plot {
        plot(path, &report, &verdict).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        let both = serde_json::json!({ "probe": report, "verdict": verdict });
        println!("{}", serde_json::to_string_pretty(&both)?);
    } else {
        say_text!("{}", render_report(&report));
        say_text!("{}", render_verdict(&verdict));
    }
    Ok(())
}

/// A short table of the probe's measurements.
pub fn render_report(r: &ProbeReport) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{} probe: {} files, W = {:.3} GB, {} threads, {} warm-up + {} measured passes, {} B chunks",
        r.device,
        r.file_count,
        r.working_set_bytes as f64 / 1e9,
        r.threads,
        r.warmup_passes,
        r.passes,
        r.chunk_bytes
    );
    for endpoint in Placement::ALL {
        let arm = r.arm(endpoint);
        let line = match &arm.rate {
            ArmRate::Measured { gbps } => format!(
                "{gbps:8.2} GB/s  (passes: {})",
                arm.pass_seconds
                    .iter()
                    .map(|s| format!("{s:.4}s"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            ArmRate::Unavailable { reason } => format!("unavailable: {reason}"),
        };
        let _ = writeln!(out, "  {:<13} {line}", endpoint.label());
    }
    if let Some(seconds) = r.resident_copy_seconds {
        let _ = writeln!(out, "  one-time resident copy: {seconds:.3} s");
    }
    let pct = |res: &Residency| format!("{:.2}%", res.fraction() * 100.0);
    let _ = writeln!(
        out,
        "  mapping residency: start {}, after one pass of each arm {}, end {}; resident coexists: {}",
        pct(&r.residency_at_start),
        pct(&r.residency_after_one_pass_each),
        pct(&r.residency_at_end),
        r.resident_coexists
    );
    out
}

fn plot(path: &Path, report: &ProbeReport, verdict: &Verdict) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let arms: [(Placement, &ArmReport); 3] = Placement::ALL.map(|p| (p, report.arm(p)));
    let rate = |arm: &ArmReport| match arm.rate {
        ArmRate::Measured { gbps } => Some(gbps),
        ArmRate::Unavailable { .. } => None,
    };
    let top = arms
        .iter()
        .filter_map(|(_, arm)| rate(arm))
        .fold(1.0f64, f64::max)
        * 1.15;

    let root = SVGBackend::new(path, (640, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{} endpoints over W = {:.2} GB: {}",
                report.device,
                report.working_set_bytes as f64 / 1e9,
                verdict.chosen
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d((0u32..3u32).into_segmented(), 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("GB/s")
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => {
                arms.get(*i as usize)
                    .map_or_else(String::new, |(e, arm)| match rate(arm) {
                        Some(_) => e.label().to_owned(),
                        None => format!("{} (unavailable)", e.label()),
                    })
            }
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(arms.iter().zip(0u32..).filter_map(|((endpoint, arm), i)| {
        let gbps = rate(arm)?;
        let color = if *endpoint == verdict.chosen {
            GREEN.mix(0.8)
        } else {
            BLUE.mix(0.6)
        };
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), gbps),
            ],
            color.filled(),
        );
        bar.set_margin(0, 0, 30, 30);
        Some(bar)
    }))?;
    root.present()?;
    Ok(())
}

/// A thread count from 1 to [`burn_mapped::host::MAX_THREADS`].
fn parse_threads(text: &str) -> Result<NonZeroUsize, String> {
    text.parse::<NonZeroUsize>()
        .ok()
        .filter(|n| n.get() <= burn_mapped::host::MAX_THREADS)
        .ok_or_else(|| {
            format!(
                "expected a thread count from 1 to {}",
                burn_mapped::host::MAX_THREADS
            )
        })
}
