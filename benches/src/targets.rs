//! The targets, each beside what the results measured. They are derived from the
//! samples (never stored alone), so a corrected definition shows without measuring again.

use crate::arms::Arm;
use crate::qwen::QwenSample;
use crate::report::{QwenReport, Report, Target};
use crate::stats::{Stats, paired};
use crate::stats::{gib, mib};
use crate::summary::{QwenArmSummary, summarize_qwen};

/// The targets, measured.
pub fn targets(report: &Report) -> Vec<Target> {
    let mut out = Vec::new();
    let q = report.qwen.as_ref();
    let warm = q.map(|q| summarize_qwen(&q.warm)).unwrap_or_default();
    let weights = q.map_or(0, |q| q.weight_bytes) as f64;
    let mapped = of_arm(&warm, Arm::Mapped);

    let speedup = mapped.and_then(|m| m.ready_speedup_vs_load_file);
    out.push(Target {
        name: "time to model-ready vs `Module::load_file` (Qwen2.5, warm)".into(),
        target: "≥ 20× faster".into(),
        measured: times_text(speedup),
        met: speedup.map(|s| s.median >= 20.0),
    });

    let ttft = mapped.and_then(|m| m.ttft_speedup_vs_load_file);
    out.push(Target {
        name: "context: time to first token vs `Module::load_file` (Qwen2.5, warm)".into(),
        target: "(no target; the full cost of a lazy loader shows here)".into(),
        measured: times_text(ttft),
        met: None,
    });

    let anon = mapped.and_then(|m| m.anon_after_load);
    out.push(Target {
        name: "RssAnon after load, mapped (whole process)".into(),
        target: "≤ 2 % of the weight bytes".into(),
        measured: anon.map_or("not measured".into(), |a| {
            format!(
                "{:.2} % ({} of {})",
                100.0 * a.median / weights,
                mib(a.median),
                gib(weights)
            )
        }),
        met: anon.map(|a| a.median <= 0.02 * weights),
    });

    let four = q.and_then(|q| {
        q.share
            .iter()
            .find(|c| c.arm == Arm::Mapped && c.processes == 4 && c.skipped.is_none())
    });
    out.push(Target {
        name: "4 concurrent mapped decoders, total PSS".into(),
        target: "≤ 1.1× the weight bytes".into(),
        measured: four.map_or("not measured".into(), |c| {
            format!(
                "{:.3}× ({} total PSS; {} total anonymous)",
                c.total_pss as f64 / weights,
                gib(c.total_pss as f64),
                mib(c.total_anonymous as f64)
            )
        }),
        met: four.map(|c| c.total_pss as f64 <= 1.1 * weights),
    });

    let ratio = q.and_then(decode_vs_copy);
    out.push(Target {
        name: "decode tokens/s, mapped vs copy control".into(),
        // The target bounds what mapping costs; decoding faster than the copy is no miss.
        target: "within 2 % (no more than 2 % slower)".into(),
        measured: percent_text(ratio),
        met: ratio.map(|r| r.median >= 0.98),
    });

    let pack = of_arm(&warm, Arm::PackMapped);
    let vs_pack = q.and_then(|q| {
        let ready = |arm| per_round(q, |s| (s.arm == arm).then_some(s.model_ready_ms));
        paired(&ready(Arm::PackMapped), &ready(Arm::Mapped))
    });
    let vs_pack = match (
        vs_pack,
        mapped.and_then(|m| m.anon_after_load),
        pack.and_then(|p| p.anon_after_load),
    ) {
        (Some(r), Some(a), Some(b)) => Some((r, a, b)),
        _ => None,
    };
    out.push(Target {
        name: "mapped vs stock best (burnpack mapped), model-ready and RssAnon after load".into(),
        target: "at least as fast and as small".into(),
        measured: vs_pack.map_or("not measured".into(), |(r, a, b)| {
            format!(
                "stock-best/mapped time {:.2}× (paired median; {:.2}–{:.2}×); RssAnon {} vs {}",
                r.median,
                r.min,
                r.max,
                mib(a.median),
                mib(b.median)
            )
        }),
        met: vs_pack.map(|(r, a, b)| r.median >= 1.0 && a.median <= b.median),
    });

    // The targets are about the f32 store; the q8 store's figures are context.
    if let Some(q8) = &report.qwen_q8 {
        let warm = summarize_qwen(&q8.warm);
        let speedup = of_arm(&warm, Arm::Mapped).and_then(|m| m.ready_speedup_vs_load_file);
        out.push(Target {
            name: "context: time to model-ready vs `Module::load_file` (q8 store, warm)".into(),
            target: "(no target)".into(),
            measured: times_text(speedup),
            met: None,
        });
        out.push(Target {
            name: "context: decode tokens/s, mapped vs copy control (q8 store)".into(),
            target: "(no target)".into(),
            measured: percent_text(decode_vs_copy(q8)),
            met: None,
        });
    }
    out
}

fn of_arm(summaries: &[QwenArmSummary], arm: Arm) -> Option<&QwenArmSummary> {
    summaries.iter().find(|s| s.arm == arm)
}

/// `(round, value)` of the warm samples `get` picks (it returns `None` to skip one).
fn per_round(q: &QwenReport, get: impl Fn(&QwenSample) -> Option<f64>) -> Vec<(usize, f64)> {
    q.warm
        .iter()
        .filter_map(|s| get(s).map(|v| (s.round, v)))
        .collect()
}

/// Per round, the mapped arm's decode rate over the copy control's.
fn decode_vs_copy(q: &QwenReport) -> Option<Stats> {
    let rate = |arm| {
        per_round(q, |s| {
            (s.arm == arm && s.decode_tokens > 0).then_some(s.decode_tok_s)
        })
    };
    paired(&rate(Arm::Mapped), &rate(Arm::Copy))
}

/// A paired ratio as the targets table prints it (`"not measured"` when absent).
fn times_text(s: Option<Stats>) -> String {
    s.map_or("not measured".into(), |s| {
        format!(
            "{:.2}× (per-round paired median; {:.2}–{:.2}×)",
            s.median, s.min, s.max
        )
    })
}

/// A paired ratio as a signed difference in percent (`"not measured"` when absent).
fn percent_text(r: Option<Stats>) -> String {
    r.map_or("not measured".into(), |r| {
        format!(
            "{:+.1} % (per-round paired median; {:+.1} to {:+.1} %)",
            100.0 * (r.median - 1.0),
            100.0 * (r.min - 1.0),
            100.0 * (r.max - 1.0)
        )
    })
}
