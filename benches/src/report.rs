//! The results file: raw samples of every phase, their summaries, the targets, and
//! the Markdown the harness prints and `docs/PERFORMANCE.md` embeds.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::arms::Arm;
use crate::evict::EvictReport;
use crate::qwen::{QwenModel, QwenSample};
use crate::stats::{Stats, paired};
use crate::synth::SynthSample;

/// Version of this file's layout.
pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: u32,
    pub name: String,
    /// The command that produced this file.
    pub command: String,
    pub machine: Machine,
    pub settings: Settings,
    /// The f32 store.
    pub qwen: Option<QwenReport>,
    /// The q8 store (absent in results written before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qwen_q8: Option<QwenReport>,
    pub synthetic: Option<SynthReport>,
    pub llama_cpp: Option<LlamaCpp>,
    /// Wall time of each phase, seconds.
    pub phases: Vec<Phase>,
    pub identity: Identity,
    pub targets: Vec<Target>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub mem_total: u64,
    pub mem_available_start: u64,
    pub kernel: String,
    pub cpu_model: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub wall_s: f64,
    /// 1-minute load average at the start and the end (work of others shows here).
    pub load_start: f64,
    pub load_end: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub rounds: usize,
    pub cold_rounds: usize,
    pub decode_tokens: usize,
    pub share: Vec<usize>,
    pub share_tokens: usize,
    pub synthetic_layers: usize,
    pub synthetic_dim: usize,
    pub synthetic_rounds: usize,
    pub prompt: String,
    pub chat: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QwenReport {
    /// Which store (results written before q8 was measured hold f32 only).
    #[serde(default)]
    pub model: QwenModel,
    pub store: String,
    pub weight_bytes: u64,
    /// Bytes on disk per format (store: with its 16 KiB padding).
    pub file_bytes: Vec<(Arm, u64)>,
    pub prompt_ids: Vec<u32>,
    pub generated_text: String,
    pub warm: Vec<QwenSample>,
    pub cold: Vec<QwenSample>,
    pub share: Vec<ShareCell>,
    pub evict: Option<EvictReport>,
}

/// `processes` concurrent decoders of one arm, measured while all are alive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShareCell {
    pub arm: Arm,
    pub processes: usize,
    /// Why the cell did not run (not enough memory), if it did not.
    pub skipped: Option<String>,
    /// Sum over processes of `Pss` and `Anonymous` from `/proc/PID/smaps_rollup`.
    pub total_pss: u64,
    pub total_anonymous: u64,
    /// Sum of `RssAnon` / `RssFile` from `/proc/PID/status`.
    pub total_rss_anon: u64,
    pub total_rss_file: u64,
    pub per_process: Vec<ShareProcess>,
    pub tokens: Vec<Vec<u32>>,
    pub wall_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShareProcess {
    pub pss: u64,
    pub anonymous: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub model_ready_ms: f64,
    pub decode_tok_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SynthReport {
    pub layers: usize,
    pub dim: usize,
    pub weight_bytes: u64,
    pub file_bytes: Vec<(Arm, u64)>,
    pub samples: Vec<SynthSample>,
}

/// llama.cpp (through `llama-cpp-python`) on the GGUF itself: a different format and kernel,
/// so a reference for scale, not a matched arm.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LlamaCpp {
    /// `measured`, or why not.
    pub status: String,
    pub version: Option<String>,
    pub threads: usize,
    pub load_ms: f64,
    pub prompt_ms: f64,
    pub decode_tokens: usize,
    pub decode_tok_s: f64,
    pub tokens: Vec<u32>,
}

/// Whether every arm produced the same tokens and logits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Identity {
    pub qwen_tokens_identical: Option<bool>,
    pub qwen_logits_identical: Option<bool>,
    pub share_tokens_identical: Option<bool>,
    pub synthetic_outputs_identical: Option<bool>,
    pub evict_logits_identical: Option<bool>,
    /// The same checks on the q8 store's samples (the fields above are the f32 store's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qwen_q8: Option<QwenIdentity>,
    pub mismatches: Vec<String>,
}

/// Identity checks of one Qwen store: every arm, round and phase against its first warm sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QwenIdentity {
    pub tokens_identical: Option<bool>,
    pub logits_identical: Option<bool>,
    pub share_tokens_identical: Option<bool>,
    pub evict_logits_identical: Option<bool>,
    /// Also copied into [`Identity::mismatches`].
    pub mismatches: Vec<String>,
}

impl Identity {
    pub fn all_ok(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// One target of the issue beside its measured value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    pub name: String,
    pub target: String,
    pub measured: String,
    /// `None` when the figure was not measured in this run.
    pub met: Option<bool>,
}

/// Per-arm summary of the Qwen samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QwenArmSummary {
    pub arm: Arm,
    pub model_ready_ms: Option<Stats>,
    pub ttft_ms: Option<Stats>,
    /// Per round: load_file's time over this arm's (how many times faster).
    pub ready_speedup_vs_load_file: Option<Stats>,
    pub ttft_speedup_vs_load_file: Option<Stats>,
    pub decode_tok_s: Option<Stats>,
    pub anon_after_load: Option<Stats>,
    pub file_after_load: Option<Stats>,
    pub peak_after_load: Option<Stats>,
    pub anon_after_decode: Option<Stats>,
    pub file_after_decode: Option<Stats>,
    pub peak_after_decode: Option<Stats>,
}

fn by_round<'a, T>(
    samples: &'a [T],
    arm: Arm,
    get: impl Fn(&T) -> (Arm, usize, f64) + 'a,
) -> Vec<(usize, f64)> {
    samples
        .iter()
        .map(get)
        .filter(|&(a, _, _)| a == arm)
        .map(|(_, r, v)| (r, v))
        .collect()
}

/// Summaries per arm, in [`Arm::ALL`] order, of arms that have samples.
pub fn summarize_qwen(samples: &[QwenSample]) -> Vec<QwenArmSummary> {
    let col = |arm: Arm, f: &dyn Fn(&QwenSample) -> f64| {
        Stats::of(samples.iter().filter(|s| s.arm == arm).map(f))
    };
    let rounds = |arm: Arm, f: fn(&QwenSample) -> f64| {
        by_round(samples, arm, move |s| (s.arm, s.round, f(s)))
    };
    Arm::ALL
        .into_iter()
        .filter(|&a| samples.iter().any(|s| s.arm == a))
        .map(|arm| {
            let decoded = samples.iter().any(|s| s.arm == arm && s.decode_tokens > 0);
            QwenArmSummary {
                arm,
                model_ready_ms: col(arm, &|s| s.model_ready_ms),
                ttft_ms: col(arm, &|s| s.ttft_ms),
                ready_speedup_vs_load_file: paired(
                    &rounds(Arm::LoadFile, |s| s.model_ready_ms),
                    &rounds(arm, |s| s.model_ready_ms),
                ),
                ttft_speedup_vs_load_file: paired(
                    &rounds(Arm::LoadFile, |s| s.ttft_ms),
                    &rounds(arm, |s| s.ttft_ms),
                ),
                decode_tok_s: if decoded {
                    col(arm, &|s| s.decode_tok_s)
                } else {
                    None
                },
                anon_after_load: col(arm, &|s| s.mem_after_load.anon as f64),
                file_after_load: col(arm, &|s| s.mem_after_load.file as f64),
                peak_after_load: col(arm, &|s| s.mem_after_load.peak as f64),
                anon_after_decode: col(arm, &|s| s.mem_after_decode.anon as f64),
                file_after_decode: col(arm, &|s| s.mem_after_decode.file as f64),
                peak_after_decode: col(arm, &|s| s.mem_after_decode.peak as f64),
            }
        })
        .collect()
}

/// Per-arm summary of the synthetic samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SynthArmSummary {
    pub arm: Arm,
    pub load_ms: Option<Stats>,
    pub ready_ms: Option<Stats>,
    pub ready_speedup_vs_load_file: Option<Stats>,
    pub anon_after_load: Option<Stats>,
    pub file_after_load: Option<Stats>,
    pub peak_after_forward: Option<Stats>,
    pub anon_after_forward: Option<Stats>,
}

pub fn summarize_synth(samples: &[SynthSample]) -> Vec<SynthArmSummary> {
    let col = |arm: Arm, f: &dyn Fn(&SynthSample) -> f64| {
        Stats::of(samples.iter().filter(|s| s.arm == arm).map(f))
    };
    let rounds = |arm: Arm| by_round(samples, arm, |s| (s.arm, s.round, s.ready_ms));
    Arm::ALL
        .into_iter()
        .filter(|&a| samples.iter().any(|s| s.arm == a))
        .map(|arm| SynthArmSummary {
            arm,
            load_ms: col(arm, &|s| s.load_ms),
            ready_ms: col(arm, &|s| s.ready_ms),
            ready_speedup_vs_load_file: paired(&rounds(Arm::LoadFile), &rounds(arm)),
            anon_after_load: col(arm, &|s| s.mem_after_load.anon as f64),
            file_after_load: col(arm, &|s| s.mem_after_load.file as f64),
            peak_after_forward: col(arm, &|s| s.mem_after_forward.peak as f64),
            anon_after_forward: col(arm, &|s| s.mem_after_forward.anon as f64),
        })
        .collect()
}

fn find<T>(v: &[T], arm: Arm, get: impl Fn(&T) -> Arm) -> Option<&T> {
    v.iter().find(|x| get(x) == arm)
}

/// The targets, measured.
pub fn targets(report: &Report) -> Vec<Target> {
    let mut out = Vec::new();
    let q = report.qwen.as_ref();
    let warm = q.map(|q| summarize_qwen(&q.warm)).unwrap_or_default();
    let weights = q.map_or(0, |q| q.weight_bytes) as f64;
    let mapped = find(&warm, Arm::Mapped, |s| s.arm);

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

    let ratio = q.and_then(|q| {
        let r = |arm| {
            q.warm
                .iter()
                .filter(|s| s.arm == arm && s.decode_tokens > 0)
                .map(|s| (s.round, s.decode_tok_s))
                .collect::<Vec<_>>()
        };
        paired(&r(Arm::Mapped), &r(Arm::Copy))
    });
    out.push(Target {
        name: "decode tokens/s, mapped vs copy control".into(),
        // The target bounds what mapping costs; decoding faster than the copy is no miss.
        target: "within 2 % (no more than 2 % slower)".into(),
        measured: ratio.map_or("not measured".into(), |r| {
            format!(
                "{:+.1} % (per-round paired median; {:+.1} to {:+.1} %)",
                100.0 * (r.median - 1.0),
                100.0 * (r.min - 1.0),
                100.0 * (r.max - 1.0)
            )
        }),
        met: ratio.map(|r| r.median >= 0.98),
    });

    let pack = find(&warm, Arm::PackMapped, |s| s.arm);
    let vs_pack = q.and_then(|q| {
        let r = |arm| {
            q.warm
                .iter()
                .filter(|s| s.arm == arm)
                .map(|s| (s.round, s.model_ready_ms))
                .collect::<Vec<_>>()
        };
        paired(&r(Arm::PackMapped), &r(Arm::Mapped))
    });
    out.push(Target {
        name: "mapped vs stock best (burnpack mapped), model-ready and RssAnon after load".into(),
        target: "at least as fast and as small".into(),
        measured: match (
            vs_pack,
            mapped.and_then(|m| m.anon_after_load),
            pack.and_then(|p| p.anon_after_load),
        ) {
            (Some(r), Some(a), Some(b)) => format!(
                "stock-best/mapped time {:.2}× (paired median; {:.2}–{:.2}×); RssAnon {} vs {}",
                r.median,
                r.min,
                r.max,
                mib(a.median),
                mib(b.median)
            ),
            _ => "not measured".into(),
        },
        met: match (
            vs_pack,
            mapped.and_then(|m| m.anon_after_load),
            pack.and_then(|p| p.anon_after_load),
        ) {
            (Some(r), Some(a), Some(b)) => Some(r.median >= 1.0 && a.median <= b.median),
            _ => None,
        },
    });

    // The targets are about the f32 store; the q8 store's figures are context.
    if let Some(q8) = &report.qwen_q8 {
        let warm = summarize_qwen(&q8.warm);
        let mapped = find(&warm, Arm::Mapped, |s| s.arm);
        let speedup = mapped.and_then(|m| m.ready_speedup_vs_load_file);
        out.push(Target {
            name: "context: time to model-ready vs `Module::load_file` (q8 store, warm)".into(),
            target: "(no target)".into(),
            measured: times_text(speedup),
            met: None,
        });
        let r = |arm| {
            q8.warm
                .iter()
                .filter(|s| s.arm == arm && s.decode_tokens > 0)
                .map(|s| (s.round, s.decode_tok_s))
                .collect::<Vec<_>>()
        };
        let ratio = paired(&r(Arm::Mapped), &r(Arm::Copy));
        out.push(Target {
            name: "context: decode tokens/s, mapped vs copy control (q8 store)".into(),
            target: "(no target)".into(),
            measured: ratio.map_or("not measured".into(), |r| {
                format!(
                    "{:+.1} % (per-round paired median; {:+.1} to {:+.1} %)",
                    100.0 * (r.median - 1.0),
                    100.0 * (r.min - 1.0),
                    100.0 * (r.max - 1.0)
                )
            }),
            met: None,
        });
    }
    out
}

pub fn mib(bytes: f64) -> String {
    format!("{:.0} MiB", bytes / (1u64 << 20) as f64)
}

pub fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

fn ms_cell(s: Option<Stats>) -> String {
    match s {
        Some(s) if s.median >= 100.0 => s.show(0),
        Some(s) => s.show(1),
        None => "–".into(),
    }
}

fn mib_cell(s: Option<Stats>) -> String {
    s.map_or("–".into(), |s| {
        format!("{:.0}", s.median / (1u64 << 20) as f64)
    })
}

fn x_cell(s: Option<Stats>) -> String {
    s.map_or("–".into(), |s| {
        let digits = if s.median >= 10.0 {
            0
        } else if s.median >= 0.1 {
            2
        } else {
            4
        };
        if s.n == 1 {
            return format!("{:.*}×", digits, s.median);
        }
        format!(
            "{:.*}× ({:.*}–{:.*})",
            digits, s.median, digits, s.min, digits, s.max
        )
    })
}

/// Burn 0.22.1's `load_file` reads lazily (file-backed tensor bytes, read on first use), so
/// its model-ready leaves the read for the first token; says so when the samples show it.
fn lazy_load_file_note(samples: &[QwenSample]) -> Option<String> {
    let lf: Vec<&QwenSample> = samples.iter().filter(|s| s.arm == Arm::LoadFile).collect();
    let after_load = Stats::of(lf.iter().map(|s| s.mem_after_load.anon as f64))?;
    let after_decode = Stats::of(lf.iter().map(|s| s.mem_after_decode.anon as f64))?;
    (after_decode.median > 4.0 * after_load.median.max(1.0)).then(|| {
        format!(
            "Burn 0.22.1's `Module::load_file` is lazy: the record's tensors are file-backed and read on first use, \
             so its model-ready excludes reading the weights (RssAnon {} after load, {} after the first token and decode); \
             compare first token for the full cost.",
            mib(after_load.median),
            mib(after_decode.median)
        )
    })
}

/// The Markdown tables of `report` (the generated section of `docs/PERFORMANCE.md` is this plus
/// a header).
pub fn markdown(report: &Report, image_dir: Option<&str>) -> String {
    let mut m = String::new();
    let img = |m: &mut String, file: &str, alt: &str| {
        if let Some(dir) = image_dir {
            let _ = writeln!(m, "![{alt}]({dir}/{}-{file})\n", report.name);
        }
    };
    for q in [&report.qwen, &report.qwen_q8].into_iter().flatten() {
        let w = q.weight_bytes as f64;
        let fig = q.model.figure_prefix();
        let _ = writeln!(
            m,
            "**Qwen2.5-Coder-0.5B-Instruct, {}: {} of weights, CPU (Flex).** Warm page cache, {} rounds, one fresh process per arm per round, arm order rotated. \
             Medians (min–max); ×load_file is load_file's time over the arm's in the same round (higher is faster). \
             First token: prompt of {} tokens; decode: {} further greedy tokens. Memory in MiB from `/proc/self/status`.\n",
            q.model.label(),
            gib(w),
            report.settings.rounds,
            q.prompt_ids.len(),
            report.settings.decode_tokens
        );
        m.push_str("| arm | model-ready ms | ×load_file | first token ms | ×load_file | decode tok/s | RssAnon load | RssFile load | peak RSS load | RssAnon decode | RssFile decode | peak RSS decode |\n");
        m.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for s in summarize_qwen(&q.warm) {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.arm.label(),
                ms_cell(s.model_ready_ms),
                x_cell(s.ready_speedup_vs_load_file),
                ms_cell(s.ttft_ms),
                x_cell(s.ttft_speedup_vs_load_file),
                s.decode_tok_s.map_or("–".into(), |d| d.show(2)),
                mib_cell(s.anon_after_load),
                mib_cell(s.file_after_load),
                mib_cell(s.peak_after_load),
                mib_cell(s.anon_after_decode),
                mib_cell(s.file_after_decode),
                mib_cell(s.peak_after_decode),
            );
        }
        m.push('\n');
        if let Some(note) = lazy_load_file_note(&q.warm) {
            let _ = writeln!(m, "{note}\n");
        }
        img(
            &mut m,
            &format!("{fig}startup.svg"),
            "Qwen2.5 start-up per arm",
        );
        img(
            &mut m,
            &format!("{fig}memory.svg"),
            "Qwen2.5 memory per arm",
        );
        if !q.cold.is_empty() {
            let res = Stats::of(q.cold.iter().map(|s| s.residency_before));
            let _ = writeln!(
                m,
                "Cold page cache ({} rounds): each arm's files evicted with `posix_fadvise(DONTNEED)` before its child; `mincore` found {} of their bytes resident at start (max {}).\n",
                report.settings.cold_rounds,
                res.map_or("–".into(), |r| format!("{:.2} %", 100.0 * r.median)),
                res.map_or("–".into(), |r| format!("{:.2} %", 100.0 * r.max)),
            );
            m.push_str("| arm | model-ready ms | ×load_file | first token ms | ×load_file |\n|---|---|---|---|---|\n");
            for s in summarize_qwen(&q.cold) {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} |",
                    s.arm.label(),
                    ms_cell(s.model_ready_ms),
                    x_cell(s.ready_speedup_vs_load_file),
                    ms_cell(s.ttft_ms),
                    x_cell(s.ttft_speedup_vs_load_file),
                );
            }
            m.push('\n');
        }
        if !q.share.is_empty() {
            let _ = writeln!(
                m,
                "Sharing: N concurrent processes of one arm, each loads, answers the prompt and decodes {} tokens, then all are measured while alive. Totals over the N processes from `/proc/PID/smaps_rollup` (PSS, Anonymous), ×weights = total PSS over {}.\n",
                report.settings.share_tokens,
                gib(w)
            );
            m.push_str("| arm | N | total PSS | ×weights | total anonymous | total RssFile |\n|---|---|---|---|---|---|\n");
            for c in &q.share {
                if let Some(why) = &c.skipped {
                    let _ = writeln!(
                        m,
                        "| {} | {} | skipped: {why} | | | |",
                        c.arm.label(),
                        c.processes
                    );
                    continue;
                }
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {:.2}× | {} | {} |",
                    c.arm.label(),
                    c.processes,
                    gib(c.total_pss as f64),
                    c.total_pss as f64 / w,
                    mib(c.total_anonymous as f64),
                    mib(c.total_rss_file as f64),
                );
            }
            m.push('\n');
            img(
                &mut m,
                &format!("{fig}sharing.svg"),
                "total PSS against process count",
            );
        }
        if let Some(e) = &q.evict {
            let _ = writeln!(
                m,
                "Eviction and refault (mapped arm, one process): before decode step {} every store page was reclaimed ({:?}, {:.0} ms): residency {:.1} % → {:.1} %, RssFile {} → {}. \
                 That step took {:.0} ms against a steady {:.0} ms per token (refault ≈ {:.0} ms, {:.2} GB/s for {}). During steps {}..{} a second thread reclaimed every {} ms ({} times, residency down to {:.1} %). \
                 Logits of all {} steps bitwise identical to the run before eviction: **{}**; tokens identical: **{}**; `verify` afterwards: **{}** ({:.0} ms).\n",
                e.spec.evict_at,
                e.method,
                e.evict_ms,
                100.0 * e.residency_before,
                100.0 * e.residency_after_evict,
                mib(e.rss_file_before as f64),
                mib(e.rss_file_after_evict as f64),
                e.refault_step_ms,
                e.steady_step_ms,
                e.refault_step_ms - e.steady_step_ms,
                w / ((e.refault_step_ms - e.steady_step_ms).max(1e-3) * 1e6),
                gib(w),
                e.spec.pressure.start,
                e.spec.pressure.end,
                e.spec.interval_ms,
                e.background_evictions,
                100.0 * e.background_min_residency,
                e.run_b_step_ms.len(),
                yes(e.logits_identical),
                yes(e.tokens_identical),
                if e.verify_failures.is_empty() {
                    "passed".to_string()
                } else {
                    format!("{} failures", e.verify_failures.len())
                },
                e.verify_ms,
            );
            if e.residency_after_evict > 0.05 {
                let _ = writeln!(
                    m,
                    "The eviction was partial: {:.1} % of the store stayed resident{}. The kernel does not reclaim pages another process maps, so the refault time above covers only the pages that left.\n",
                    100.0 * e.residency_after_evict,
                    match &e.other_mappers {
                        None => " (this run did not record which other processes mapped it; other helpers' tests use the same store)".to_string(),
                        Some(p) if p.is_empty() => " (no other process was seen mapping it)".to_string(),
                        Some(p) => format!(" while {} other process(es) mapped it", p.len()),
                    }
                );
            }
            img(
                &mut m,
                &format!("{fig}evict.svg"),
                "decode step time with eviction",
            );
        }
    }
    if let Some(s) = &report.synthetic {
        let _ = writeln!(
            m,
            "**Synthetic: {} linear layers of [{d}, {d}] f32 ({}).** Warm page cache, {} rounds. Load = construct + load; ready = load + one token through every layer (reads every weight).\n",
            s.layers,
            gib(s.weight_bytes as f64),
            report.settings.synthetic_rounds,
            d = s.dim
        );
        m.push_str("| arm | load ms | ready ms | ×load_file (ready) | RssAnon load | RssFile load | RssAnon ready | peak RSS |\n|---|---|---|---|---|---|---|---|\n");
        for a in summarize_synth(&s.samples) {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                a.arm.label(),
                ms_cell(a.load_ms),
                ms_cell(a.ready_ms),
                x_cell(a.ready_speedup_vs_load_file),
                mib_cell(a.anon_after_load),
                mib_cell(a.file_after_load),
                mib_cell(a.anon_after_forward),
                mib_cell(a.peak_after_forward),
            );
        }
        m.push('\n');
        img(
            &mut m,
            "synthetic-startup.svg",
            "synthetic start-up per arm",
        );
    }
    if let Some(l) = &report.llama_cpp {
        if l.status == "measured" {
            let _ = writeln!(
                m,
                "For scale (different format and kernels, not a matched arm): llama.cpp (llama-cpp-python {}) on the Q4_K_M GGUF itself, {} threads, same prompt ids: load {:.0} ms, prompt {:.0} ms, decode {:.2} tok/s over {} tokens; its greedy tokens equal ours for the first {} of {}.\n",
                l.version.as_deref().unwrap_or("?"),
                l.threads,
                l.load_ms,
                l.prompt_ms,
                l.decode_tok_s,
                l.decode_tokens,
                report
                    .qwen
                    .as_ref()
                    .and_then(|q| q.warm.first())
                    .map_or(0, |s| s
                        .tokens
                        .iter()
                        .zip(&l.tokens)
                        .take_while(|(a, b)| a == b)
                        .count()),
                l.tokens.len()
            );
        } else {
            let _ = writeln!(m, "llama.cpp reference: {}.\n", l.status);
        }
    }
    let id = &report.identity;
    let _ = writeln!(
        m,
        "Identity: Qwen tokens identical across arms and rounds: **{}**; first-step and all-step logits bitwise identical: **{}**; sharing tokens identical: **{}**; synthetic outputs identical: **{}**.\n",
        opt(id.qwen_tokens_identical),
        opt(id.qwen_logits_identical),
        opt(id.share_tokens_identical),
        opt(id.synthetic_outputs_identical),
    );
    if let Some(q8) = &id.qwen_q8 {
        let _ = writeln!(
            m,
            "Identity on the q8 store (its arms against each other): tokens identical across arms and rounds: **{}**; logits bitwise identical: **{}**; sharing tokens identical: **{}**.\n",
            opt(q8.tokens_identical),
            opt(q8.logits_identical),
            opt(q8.share_tokens_identical),
        );
    }
    m.push_str("| target (issue 6) | goal | measured | met |\n|---|---|---|---|\n");
    for t in &report.targets {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} |",
            t.name,
            t.target,
            t.measured,
            match t.met {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "–",
            }
        );
    }
    m.push('\n');
    let loads: Vec<String> = report
        .phases
        .iter()
        .map(|p| {
            format!(
                "{} {:.0} s (load {:.1}→{:.1})",
                p.name, p.wall_s, p.load_start, p.load_end
            )
        })
        .collect();
    let _ = writeln!(
        m,
        "Machine: {} CPUs ({}), {} RAM, Linux {}. Phases: {}.",
        report.machine.cpus,
        report.machine.cpu_model,
        gib(report.machine.mem_total as f64),
        report.machine.kernel,
        loads.join("; ")
    );
    for n in &report.notes {
        let _ = writeln!(m, "\nNote: {n}");
    }
    m
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

fn opt(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "not measured",
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn committed() -> Report {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/cpu.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// A results file as written before the q8 store existed: no `qwen_q8` anywhere.
    fn committed_without_q8() -> Report {
        let mut v: serde_json::Value = serde_json::to_value(committed()).unwrap();
        v.as_object_mut().unwrap().remove("qwen_q8");
        v["identity"].as_object_mut().unwrap().remove("qwen_q8");
        let mut rep: Report = serde_json::from_value(v).unwrap();
        // Such a file's targets were computed without a q8 store.
        rep.targets = targets(&rep);
        rep
    }

    #[test]
    fn results_written_before_q8_read_as_f32_only() {
        let rep = committed_without_q8();
        assert_eq!(rep.qwen.as_ref().unwrap().model, QwenModel::F32);
        assert!(rep.qwen_q8.is_none() && rep.identity.qwen_q8.is_none());
        assert!(!markdown(&rep, None).contains("q8 store"));
    }

    #[test]
    fn a_q8_store_gets_its_own_table_figures_and_identity_line() {
        let mut rep = committed();
        let mut q8 = rep.qwen.clone().unwrap();
        q8.model = QwenModel::Q8;
        for s in &mut q8.warm {
            s.model_ready_ms *= 2.0;
        }
        rep.qwen_q8 = Some(q8);
        rep.identity.qwen_q8 = Some(QwenIdentity {
            tokens_identical: Some(true),
            logits_identical: Some(false),
            ..QwenIdentity::default()
        });
        let m = markdown(&rep, Some("img"));
        let f32_at = m.find("Instruct, f32:").unwrap();
        let q8_at = m.find("Instruct, q8 store").unwrap();
        assert!(f32_at < q8_at);
        assert!(
            m.contains("img/cpu-qwen-startup.svg") && m.contains("img/cpu-qwen-q8-startup.svg")
        );
        assert!(m.contains("Identity on the q8 store"));
        assert!(m.contains("logits bitwise identical: **NO**"));
        // The q8 table carries the q8 samples (their model-ready doubled here), not f32's.
        let first_mapped_row = |from: usize| {
            m[from..]
                .lines()
                .find(|l| l.starts_with("| mapped store"))
                .unwrap()
        };
        assert_ne!(first_mapped_row(f32_at), first_mapped_row(q8_at));
        let targets = targets(&rep);
        assert!(
            targets
                .iter()
                .any(|t| t.name.contains("q8 store") && t.met.is_none())
        );
    }
}
