//! The Markdown the harness prints (`harness table`) and `docs/PERFORMANCE.md` embeds
//! (through [`doc`](crate::doc)): one table per phase and store, then the identity checks, the
//! targets and the machine. Every figure comes from the results file, none is typed by hand.

use std::fmt::Write as _;

use crate::arms::Arm;
use crate::evict::EvictReport;
use crate::qwen::QwenSample;
use crate::report::{Identity, LlamaCpp, QwenReport, Report, SynthReport, Target};
use crate::stats::{Stats, gib, mib};
use crate::summary::{summarize_qwen, summarize_synth};

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
    let figures = Figures {
        dir: image_dir,
        run: &report.name,
    };
    let mut m = String::new();
    for q in [&report.qwen, &report.qwen_q8].into_iter().flatten() {
        qwen_warm(&mut m, report, q, &figures);
        if !q.cold.is_empty() {
            qwen_cold(&mut m, report, q);
        }
        if !q.share.is_empty() {
            sharing(&mut m, report, q, &figures);
        }
        if let Some(e) = &q.evict {
            eviction(&mut m, q, e, &figures);
        }
    }
    if let Some(s) = &report.synthetic {
        synthetic(&mut m, report, s, &figures);
    }
    if let Some(l) = &report.llama_cpp {
        llama_cpp(&mut m, report, l);
    }
    identity(&mut m, &report.identity);
    targets_table(&mut m, &report.targets);
    machine(&mut m, report);
    m
}

/// Where the figures of one run are linked from (`None`: the tables alone, for a terminal).
struct Figures<'a> {
    dir: Option<&'a str>,
    run: &'a str,
}

impl Figures<'_> {
    fn embed(&self, m: &mut String, file: &str, alt: &str) {
        if let Some(dir) = self.dir {
            let _ = writeln!(m, "![{alt}]({dir}/{}-{file})\n", self.run);
        }
    }
}

fn qwen_warm(m: &mut String, report: &Report, q: &QwenReport, figures: &Figures) {
    let fig = q.model.figure_prefix();
    let _ = writeln!(
        m,
        "**Qwen2.5-Coder-0.5B-Instruct, {}: {} of weights, CPU (Flex).** Warm page cache, {} rounds, one fresh process per arm per round, arm order rotated. \
         Medians (min–max); ×load_file is load_file's time over the arm's in the same round (higher is faster). \
         First token: prompt of {} tokens; decode: {} further greedy tokens. Memory in MiB from `/proc/self/status`.\n",
        q.model.label(),
        gib(q.weight_bytes as f64),
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
    figures.embed(m, &format!("{fig}startup.svg"), "Qwen2.5 start-up per arm");
    figures.embed(m, &format!("{fig}memory.svg"), "Qwen2.5 memory per arm");
}

fn qwen_cold(m: &mut String, report: &Report, q: &QwenReport) {
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

fn sharing(m: &mut String, report: &Report, q: &QwenReport, figures: &Figures) {
    let w = q.weight_bytes as f64;
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
    let fig = q.model.figure_prefix();
    figures.embed(
        m,
        &format!("{fig}sharing.svg"),
        "total PSS against process count",
    );
}

fn eviction(m: &mut String, q: &QwenReport, e: &EvictReport, figures: &Figures) {
    let w = q.weight_bytes as f64;
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
    let fig = q.model.figure_prefix();
    figures.embed(
        m,
        &format!("{fig}evict.svg"),
        "decode step time with eviction",
    );
}

fn synthetic(m: &mut String, report: &Report, s: &SynthReport, figures: &Figures) {
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
    figures.embed(m, "synthetic-startup.svg", "synthetic start-up per arm");
}

fn llama_cpp(m: &mut String, report: &Report, l: &LlamaCpp) {
    if l.status != "measured" {
        let _ = writeln!(m, "llama.cpp reference: {}.\n", l.status);
        return;
    }
    let agree = report
        .qwen
        .as_ref()
        .and_then(|q| q.warm.first())
        .map_or(0, |s| {
            s.tokens
                .iter()
                .zip(&l.tokens)
                .take_while(|(a, b)| a == b)
                .count()
        });
    let _ = writeln!(
        m,
        "For scale (different format and kernels, not a matched arm): llama.cpp (llama-cpp-python {}) on the Q4_K_M GGUF itself, {} threads, same prompt ids: load {:.0} ms, prompt {:.0} ms, decode {:.2} tok/s over {} tokens; its greedy tokens equal ours for the first {} of {}.\n",
        l.version.as_deref().unwrap_or("?"),
        l.threads,
        l.load_ms,
        l.prompt_ms,
        l.decode_tok_s,
        l.decode_tokens,
        agree,
        l.tokens.len()
    );
}

fn identity(m: &mut String, id: &Identity) {
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
}

fn targets_table(m: &mut String, targets: &[Target]) {
    m.push_str("| target (issue 6) | goal | measured | met |\n|---|---|---|---|\n");
    for t in targets {
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
}

/// The machine and each phase's wall time and load, then the run's notes.
fn machine(m: &mut String, report: &Report) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen::QwenModel;
    use crate::report::QwenIdentity;
    use crate::targets::targets;

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
