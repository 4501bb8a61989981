//! SVG figures of a [`Report`], drawn with `plotters`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use plotters::prelude::*;

use crate::arms::Arm;
use crate::evict::EvictReport;
use crate::report::{QwenReport, Report};
use crate::stats::Stats;
use crate::summary::{QwenArmSummary, summarize_qwen, summarize_synth};

/// The legend box every figure draws.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()?;
    Ok(())
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

fn short(arm: Arm) -> &'static str {
    match arm {
        Arm::Mapped => "mapped",
        Arm::LoadFile => "load_file",
        Arm::Safetensors => "safetensors",
        Arm::Copy => "copy ctrl",
        Arm::PackMapped => "bpk mapped",
    }
}

/// Groups of bars (one group per arm, one bar per series) with min–max whiskers.
fn bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    log: bool,
    arms: &[Arm],
    series: &[(&str, Vec<Option<Stats>>)],
) -> Result<()> {
    let values = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().map(|s| s.max));
    let top = values.fold(1.0f64, f64::max) * if log { 2.0 } else { 1.15 };
    let bottom = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().map(|s| s.min))
        .fold(top, f64::min)
        .max(1e-3)
        / 2.0;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = arms.len() as f64;
    let k = series.len() as f64;
    let width = 0.8 / k;
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-9 && i >= 0.0 && (i as usize) < arms.len() {
            short(arms[i as usize]).to_string()
        } else {
            String::new()
        }
    };
    macro_rules! draw {
        ($y:expr, $base:expr) => {{
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(-0.5..n - 0.5, $y)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(arms.len() * 2 + 1)
                .x_label_formatter(&|x| label(x))
                .y_desc(y_desc)
                .draw()?;
            for (j, (name, stats)) in series.iter().enumerate() {
                let color = COLORS[j % COLORS.len()];
                let x0 = |i: usize| i as f64 - 0.4 + j as f64 * width;
                chart
                    .draw_series(stats.iter().enumerate().filter_map(|(i, s)| {
                        let s = (*s)?;
                        Some(Rectangle::new(
                            [(x0(i), $base), (x0(i) + width * 0.9, s.median)],
                            color.filled(),
                        ))
                    }))?
                    .label(*name)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                    });
                chart.draw_series(stats.iter().enumerate().filter_map(|(i, s)| {
                    let s = (*s)?;
                    let x = x0(i) + width * 0.45;
                    Some(PathElement::new(
                        vec![(x, s.min), (x, s.max)],
                        BLACK.stroke_width(1),
                    ))
                }))?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        }};
    }
    if log {
        draw!((bottom..top).log_scale(), bottom);
    } else {
        draw!(0.0..top, 0.0);
    }
    root.present()?;
    Ok(())
}

/// Writes every figure the report has data for; returns the paths.
pub fn write_all(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let path = |name: &str| dir.join(format!("{}-{name}", report.name));
    for q in [&report.qwen, &report.qwen_q8].into_iter().flatten() {
        let (fig, tag) = (q.model.figure_prefix(), q.model.tag());
        let warm = summarize_qwen(&q.warm);
        let cold = summarize_qwen(&q.cold);
        let arms: Vec<Arm> = warm.iter().map(|s| s.arm).collect();
        let cold_of = |arm: Arm, f: fn(&QwenArmSummary) -> Option<Stats>| {
            cold.iter().find(|s| s.arm == arm).and_then(f)
        };
        let mut series = vec![
            (
                "model-ready, warm",
                warm.iter().map(|s| s.model_ready_ms).collect(),
            ),
            (
                "first token, warm",
                warm.iter().map(|s| s.ttft_ms).collect(),
            ),
        ];
        if !cold.is_empty() {
            series.push((
                "model-ready, cold",
                arms.iter()
                    .map(|&a| cold_of(a, |s| s.model_ready_ms))
                    .collect(),
            ));
            series.push((
                "first token, cold",
                arms.iter().map(|&a| cold_of(a, |s| s.ttft_ms)).collect(),
            ));
        }
        let p = path(&format!("{fig}startup.svg"));
        bars(
            &p,
            &format!("Qwen2.5-0.5B {tag}: start-up (ms, log scale; median, min–max)"),
            "ms",
            true,
            &arms,
            &series,
        )?;
        out.push(p);

        let mib = |s: Option<Stats>| {
            s.map(|s| Stats {
                median: s.median / (1u64 << 20) as f64,
                min: s.min / (1u64 << 20) as f64,
                max: s.max / (1u64 << 20) as f64,
                n: s.n,
            })
        };
        let series = vec![
            (
                "RssAnon after load",
                warm.iter().map(|s| mib(s.anon_after_load)).collect(),
            ),
            (
                "RssFile after load",
                warm.iter().map(|s| mib(s.file_after_load)).collect(),
            ),
            (
                "RssAnon after decode",
                warm.iter().map(|s| mib(s.anon_after_decode)).collect(),
            ),
            (
                "RssFile after decode",
                warm.iter().map(|s| mib(s.file_after_decode)).collect(),
            ),
        ];
        let p = path(&format!("{fig}memory.svg"));
        bars(
            &p,
            &format!("Qwen2.5-0.5B {tag}: resident memory per process (MiB)"),
            "MiB",
            false,
            &arms,
            &series,
        )?;
        out.push(p);

        if q.share.iter().any(|c| c.skipped.is_none()) {
            let p = path(&format!("{fig}sharing.svg"));
            sharing(&p, q)?;
            out.push(p);
        }
        if let Some(e) = &q.evict {
            let p = path(&format!("{fig}evict.svg"));
            evict(&p, e)?;
            out.push(p);
        }
    }
    if let Some(s) = &report.synthetic {
        let sum = summarize_synth(&s.samples);
        let arms: Vec<Arm> = sum.iter().map(|s| s.arm).collect();
        let series = vec![
            ("load", sum.iter().map(|s| s.load_ms).collect()),
            (
                "ready (load + one token)",
                sum.iter().map(|s| s.ready_ms).collect(),
            ),
        ];
        let p = path("synthetic-startup.svg");
        let title = format!(
            "Synthetic {}x[{d},{d}] f32 ({:.1} GiB): start-up (ms, log scale)",
            s.layers,
            s.weight_bytes as f64 / (1u64 << 30) as f64,
            d = s.dim
        );
        bars(&p, &title, "ms", true, &arms, &series)?;
        out.push(p);
    }
    Ok(out)
}

fn sharing(path: &Path, q: &QwenReport) -> Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let weights = gib(q.weight_bytes);
    let max_n = q.share.iter().map(|c| c.processes).max().unwrap_or(1) as f64;
    let top = q
        .share
        .iter()
        .filter(|c| c.skipped.is_none())
        .map(|c| gib(c.total_pss))
        .fold(weights, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Qwen2.5-0.5B {}, concurrent decoders: total PSS (GiB) against process count",
                q.model.tag()
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..max_n + 0.5, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("processes")
        .y_desc("GiB")
        .draw()?;
    let palette = [
        COLORS[0],
        COLORS[1],
        COLORS[2],
        COLORS[3],
        RGBColor(148, 103, 189),
    ];
    for (i, arm) in Arm::ALL.into_iter().enumerate() {
        let points: Vec<(f64, f64)> = q
            .share
            .iter()
            .filter(|c| c.arm == arm && c.skipped.is_none())
            .map(|c| (c.processes as f64, gib(c.total_pss)))
            .collect();
        if points.is_empty() {
            continue;
        }
        let color = palette[i % palette.len()];
        chart
            .draw_series(std::iter::once(PathElement::new(
                points.clone(),
                color.stroke_width(2),
            )))?
            .label(short(arm))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.5, weights), (max_n + 0.5, weights)],
            BLACK.stroke_width(1),
        )))?
        .label("one copy of the weights")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(1)));
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

fn evict(path: &Path, e: &EvictReport) -> Result<()> {
    let steps = e.run_b_step_ms.len();
    let top = e
        .run_a_step_ms
        .iter()
        .chain(&e.run_b_step_ms)
        .skip(1)
        .cloned()
        .fold(1.0f64, f64::max)
        * 1.3;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Mapped decoder under eviction: time per decode step (ms)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(1.0..steps as f64, (1.0..top).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("decode step")
        .y_desc("ms")
        .draw()?;
    let line = |v: &[f64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .skip(1)
            .map(|(i, &t)| (i as f64, t))
            .collect()
    };
    let pressure = e.spec.pressure.clone();
    chart.draw_series(std::iter::once(Rectangle::new(
        [(pressure.start as f64, 1.0), (pressure.end as f64, top)],
        RGBColor(255, 200, 200).mix(0.4).filled(),
    )))?;
    for (steps_ms, color, label) in [
        (&e.run_a_step_ms, COLORS[0], "run A (no eviction)"),
        (
            &e.run_b_step_ms,
            COLORS[3],
            "run B (all pages reclaimed before the marked step; shaded: reclaimed repeatedly)",
        ),
    ] {
        chart
            .draw_series(std::iter::once(PathElement::new(
                line(steps_ms),
                color.stroke_width(2),
            )))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
            });
    }
    let at = e.spec.evict_at as f64;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(at, 1.0), (at, top)],
        BLACK.stroke_width(1),
    )))?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}
