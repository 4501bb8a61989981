//! The parent side of `harness run`: prepares the inputs, runs every phase's children in
//! order ([`spawn`](crate::spawn)), checks identity ([`identity`](crate::identity)), and writes
//! the results file, the figures and (optionally) the section of `docs/PERFORMANCE.md`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::arms::{Arm, ArmFiles};
use crate::child::ChildSpec;
use crate::evict::{EvictReport, EvictSpec};
use crate::identity::{qwen_identity, synthetic_outputs_identical};
use crate::qwen::{self, QwenModel, QwenSample, QwenSetup};
use crate::report::{
    Identity, LlamaCpp, Machine, Phase, QwenIdentity, QwenReport, Report, SCHEMA, Settings,
    ShareCell, SynthReport,
};
use crate::spawn::{run_child, share_cell};
use crate::synth::{self, SynthSample};
use crate::{doc, llama, plot, sys, targets};

/// Everything `harness run` takes.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub name: String,
    /// Rounds, token counts, the synthetic stack and the prompt: recorded in the results.
    pub settings: Settings,
    pub evict: bool,
    pub llama_cpp: bool,
    pub qwen: bool,
    /// The Qwen stores to measure, in order.
    pub models: Vec<QwenModel>,
    pub cache_dir: PathBuf,
    pub results_dir: PathBuf,
    pub doc: Option<PathBuf>,
    pub command: String,
}

/// `harness run`.
pub fn run(cfg: &RunConfig) -> Result<Report> {
    if cfg.settings.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let bench_dir = cfg.cache_dir.join("bench");
    std::fs::create_dir_all(&bench_dir)?;
    std::fs::create_dir_all(&cfg.results_dir)?;
    let mut phases = Vec::new();
    let mut notes = Vec::new();
    let machine = Machine {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        mem_total: sys::mem_total()?,
        mem_available_start: sys::mem_available()?,
        kernel: sys::kernel_release(),
        cpu_model: sys::cpu_model(),
    };
    let mut identity = Identity::default();
    let mut llama_cpp = None;

    let mut qwen_f32 = None;
    let mut qwen_q8 = None;
    if cfg.qwen {
        for &model in &cfg.models {
            let (q, id) = run_qwen(
                cfg,
                model,
                &bench_dir,
                &mut phases,
                &mut notes,
                &mut llama_cpp,
            )?;
            identity.mismatches.extend(id.mismatches.iter().cloned());
            match model {
                QwenModel::F32 => {
                    identity.qwen_tokens_identical = id.tokens_identical;
                    identity.qwen_logits_identical = id.logits_identical;
                    identity.share_tokens_identical = id.share_tokens_identical;
                    identity.evict_logits_identical = id.evict_logits_identical;
                    qwen_f32 = Some(q);
                }
                QwenModel::Q8 => {
                    identity.qwen_q8 = Some(id);
                    qwen_q8 = Some(q);
                }
            }
        }
    }

    let s = &cfg.settings;
    let synthetic = if s.synthetic_layers > 0 && s.synthetic_rounds > 0 {
        let report = run_synthetic(s, &bench_dir, &mut phases)?;
        let same = synthetic_outputs_identical(&report.samples);
        if !same {
            identity
                .mismatches
                .push("synthetic: outputs differ across arms".into());
        }
        identity.synthetic_outputs_identical = Some(same);
        Some(report)
    } else {
        None
    };

    let mut rep = Report {
        schema: SCHEMA,
        name: cfg.name.clone(),
        command: cfg.command.clone(),
        machine,
        settings: cfg.settings.clone(),
        qwen: qwen_f32,
        qwen_q8,
        synthetic,
        llama_cpp,
        phases,
        identity,
        targets: Vec::new(),
        notes,
    };
    rep.targets = targets::targets(&rep);
    write_outputs(&rep, &cfg.results_dir, cfg.doc.as_deref())?;
    Ok(rep)
}

/// Writes `<name>.json`, the SVGs and, when `doc` is given, that page's generated section.
pub fn write_outputs(rep: &Report, results_dir: &Path, doc_path: Option<&Path>) -> Result<()> {
    let json = results_dir.join(format!("{}.json", rep.name));
    std::fs::write(&json, serde_json::to_string_pretty(rep)?)
        .with_context(|| json.display().to_string())?;
    eprintln!("wrote {}", json.display());
    for p in plot::write_all(rep, results_dir)? {
        eprintln!("wrote {}", p.display());
    }
    if let Some(path) = doc_path {
        doc::update(rep, path, results_dir)?;
    }
    Ok(())
}

/// A phase's wall time and the machine's load at its start and end (other work shows there).
struct PhaseClock {
    name: String,
    start: Instant,
    load: f64,
}

impl PhaseClock {
    fn start(name: String) -> Self {
        eprintln!("== {name}");
        PhaseClock {
            name,
            start: Instant::now(),
            load: sys::loadavg(),
        }
    }
    fn end(self, phases: &mut Vec<Phase>) {
        phases.push(Phase {
            name: self.name,
            wall_s: self.start.elapsed().as_secs_f64(),
            load_start: self.load,
            load_end: sys::loadavg(),
        });
    }
}

/// Why `processes` children of `arm` would starve the machine (it has no swap), if they would:
/// owned copies need the weights once more beyond the page cache, mapped arms little.
fn memory_short(arm: Arm, weight_bytes: u64, processes: usize) -> Result<Option<String>> {
    let per = if arm.is_mapped() {
        512 << 20
    } else {
        weight_bytes + weight_bytes / 8 + (512 << 20)
    };
    let need = per * processes as u64 + (1 << 30);
    let avail = sys::mem_available()?;
    Ok((need > avail).then(|| {
        format!(
            "needs about {:.1} GiB, MemAvailable {:.1} GiB",
            need as f64 / (1u64 << 30) as f64,
            avail as f64 / (1u64 << 30) as f64
        )
    }))
}

/// Bytes on disk of the three formats of `files`.
fn file_bytes(files: &ArmFiles) -> Result<Vec<(Arm, u64)>> {
    [Arm::Mapped, Arm::LoadFile, Arm::Safetensors]
        .into_iter()
        .map(|arm| Ok((arm, sys::total_len(&sys::files_of(arm.input(files))?)?)))
        .collect()
}

/// Warms `arm`'s input the way a mapped loader would, then returns the fraction resident.
fn warm_input(arm: Arm, files: &ArmFiles) -> Result<f64> {
    let inputs = sys::files_of(arm.input(files))?;
    sys::warm(&inputs)?;
    Ok(sys::residency(&inputs)?)
}

/// Drops every arm's input from the page cache (see [`sys::warm`]).
fn evict_inputs(files: &ArmFiles) -> Result<()> {
    for arm in Arm::ALL {
        sys::evict(&sys::files_of(arm.input(files))?)?;
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// The synthetic stack, prepared once, then every arm each round from a warm page cache.
fn run_synthetic(s: &Settings, bench_dir: &Path, phases: &mut Vec<Phase>) -> Result<SynthReport> {
    let clock = PhaseClock::start("prepare synthetic".into());
    let (layers, dim) = (s.synthetic_layers, s.synthetic_dim);
    let files = synth::files(bench_dir, layers, dim);
    synth::prepare(&files, layers, dim)?;
    let weight_bytes = (layers * (dim * dim + dim) * 4) as u64;
    clock.end(phases);
    let clock = PhaseClock::start("synthetic warm".into());
    evict_inputs(&files)?;
    let mut samples = Vec::new();
    for round in 0..s.synthetic_rounds {
        for arm in Arm::order(round) {
            if let Some(why) = memory_short(arm, weight_bytes, 1)? {
                bail!("synthetic {}: {why}; lower --synthetic-layers", arm.name());
            }
            let residency = warm_input(arm, &files)?;
            let (line, wall) = run_child(&ChildSpec::Synthetic {
                arm,
                files: files.clone(),
                layers,
                dim,
            })?;
            let mut s: SynthSample = serde_json::from_str(&line)?;
            s.round = round;
            s.residency_before = residency;
            s.process_ms = wall;
            eprintln!(
                "  round {round} {:<12} resident {:5.1} %  load {:8.1} ms  ready {:8.1} ms  anon {:6.0} MiB",
                arm.name(),
                100.0 * residency,
                s.load_ms,
                s.ready_ms,
                mib(s.mem_after_load.anon)
            );
            samples.push(s);
        }
    }
    clock.end(phases);
    Ok(SynthReport {
        layers,
        dim,
        weight_bytes,
        file_bytes: file_bytes(&files)?,
        samples,
    })
}

/// One Qwen store's inputs, as each of its phases hands them to children.
struct QwenInputs {
    tag: &'static str,
    setup: QwenSetup,
    prompt: Vec<u32>,
}

impl QwenInputs {
    fn spec(&self, arm: Arm, decode_tokens: usize, hold: bool) -> ChildSpec {
        ChildSpec::Qwen {
            arm,
            files: self.setup.files.clone(),
            config: self.setup.config_path.clone(),
            layout: self.setup.layout_path.clone(),
            prompt: self.prompt.clone(),
            decode_tokens,
            hold,
        }
    }

    fn memory_short(&self, arm: Arm, processes: usize) -> Result<Option<String>> {
        memory_short(arm, self.setup.weight_bytes, processes)
    }

    /// One child of `arm` to completion, its sample stamped with what the parent knows.
    fn sample(
        &self,
        arm: Arm,
        round: usize,
        cache: &str,
        residency: f64,
        decode_tokens: usize,
    ) -> Result<QwenSample> {
        let (line, wall) = run_child(&self.spec(arm, decode_tokens, false))
            .with_context(|| format!("qwen {} {}", self.tag, arm.name()))?;
        let mut s: QwenSample = serde_json::from_str(&line)?;
        s.round = round;
        s.cache = cache.into();
        s.residency_before = residency;
        s.process_ms = wall;
        Ok(s)
    }
}

/// Every Qwen phase on one store; the identity checks of its samples come back beside it.
fn run_qwen(
    cfg: &RunConfig,
    model: QwenModel,
    bench_dir: &Path,
    phases: &mut Vec<Phase>,
    notes: &mut Vec<String>,
    llama_cpp: &mut Option<LlamaCpp>,
) -> Result<(QwenReport, QwenIdentity)> {
    let s = &cfg.settings;
    let tag = model.tag();
    let clock = PhaseClock::start(format!("prepare qwen {tag}"));
    let setup = qwen::prepare(&cfg.cache_dir, bench_dir, model)?;
    let tok = qwen::tokenizer(&setup)?;
    let (_, prompt) = qwen::prompt_ids(&tok, &s.prompt, s.chat)?;
    clock.end(phases);
    let q = QwenInputs { tag, setup, prompt };

    // Warm start-up, first token, decode and memory. Every input is evicted once first, so
    // each is then cached by the same mapped warm-up (huge folios where the kernel can),
    // whatever read it before.
    let clock = PhaseClock::start(format!("qwen {tag} warm"));
    let warm = qwen_warm(s, &q)?;
    clock.end(phases);

    let clock = PhaseClock::start(format!("qwen {tag} cold"));
    let cold = qwen_cold(s, &q, notes)?;
    clock.end(phases);

    let clock = PhaseClock::start(format!("qwen {tag} sharing"));
    let share = qwen_sharing(s, &q)?;
    clock.end(phases);

    let evict = if cfg.evict {
        let clock = PhaseClock::start(format!("qwen {tag} eviction"));
        let e = qwen_eviction(s, &q)?;
        clock.end(phases);
        Some(e)
    } else {
        None
    };

    // llama.cpp runs the GGUF itself, the same for every store: measured once, beside f32.
    if cfg.llama_cpp && model == QwenModel::F32 {
        let clock = PhaseClock::start("llama.cpp reference".into());
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let l = llama::measure(&q.setup.paths.gguf, &q.prompt, s.decode_tokens, threads)?;
        eprintln!("  {}: {:.2} tok/s", l.status, l.decode_tok_s);
        *llama_cpp = Some(l);
        clock.end(phases);
    }

    let id = qwen_identity(tag, &warm, &cold, &share, evict.as_ref());
    let generated_text = warm
        .first()
        .map(|s| tok.decode(&s.tokens))
        .transpose()?
        .unwrap_or_default();
    Ok((
        QwenReport {
            model,
            store: q.setup.paths.weights_path().display().to_string(),
            weight_bytes: q.setup.weight_bytes,
            file_bytes: file_bytes(&q.setup.files)?,
            prompt_ids: q.prompt,
            generated_text,
            warm,
            cold,
            share,
            evict,
        },
        id,
    ))
}

/// Every arm each round from a warm page cache: start-up, first token, decode and memory.
fn qwen_warm(s: &Settings, q: &QwenInputs) -> Result<Vec<QwenSample>> {
    let tag = q.tag;
    evict_inputs(&q.setup.files)?;
    let mut warm = Vec::new();
    for round in 0..s.rounds {
        for arm in Arm::order(round) {
            if let Some(why) = q.memory_short(arm, 1)? {
                bail!("{tag} {}: {why}; free memory or lower the load", arm.name());
            }
            let residency = warm_input(arm, &q.setup.files)?;
            let s = q.sample(arm, round, "warm", residency, s.decode_tokens)?;
            eprintln!(
                "  {tag} round {round} {:<12} ready {:8.1} ms  first token {:8.1} ms  decode {:5.2} tok/s  anon {:6.0} MiB",
                arm.name(),
                s.model_ready_ms,
                s.ttft_ms,
                s.decode_tok_s,
                mib(s.mem_after_load.anon)
            );
            warm.push(s);
        }
    }
    Ok(warm)
}

/// Every arm each round with its files evicted (confirmed with `mincore`); no decode.
fn qwen_cold(s: &Settings, q: &QwenInputs, notes: &mut Vec<String>) -> Result<Vec<QwenSample>> {
    let tag = q.tag;
    let mut cold = Vec::new();
    for round in 0..s.cold_rounds {
        for arm in Arm::order(round) {
            let inputs = sys::files_of(arm.input(&q.setup.files))?;
            sys::evict(&inputs)?;
            let residency = sys::residency(&inputs)?;
            if residency > 0.01 {
                notes.push(format!(
                    "qwen {tag} cold round {round}, {}: {:.1} % of the files stayed resident after eviction (another process maps them?)",
                    arm.name(),
                    100.0 * residency
                ));
            }
            let s = q.sample(arm, round, "cold", residency, 0)?;
            eprintln!(
                "  {tag} cold {round} {:<12} resident {:5.2} %  ready {:8.1} ms  first token {:8.1} ms",
                arm.name(),
                100.0 * residency,
                s.model_ready_ms,
                s.ttft_ms
            );
            cold.push(s);
        }
    }
    Ok(cold)
}

/// N concurrent processes of each arm, measured together; a cell that would starve the
/// machine is recorded as skipped, with why.
fn qwen_sharing(s: &Settings, q: &QwenInputs) -> Result<Vec<ShareCell>> {
    let tag = q.tag;
    let mut share = Vec::new();
    for &n in &s.share {
        for arm in Arm::ALL {
            if let Some(why) = q.memory_short(arm, n)? {
                eprintln!("  {tag} share {:<12} x{n}: skipped ({why})", arm.name());
                share.push(ShareCell {
                    arm,
                    processes: n,
                    skipped: Some(why),
                    total_pss: 0,
                    total_anonymous: 0,
                    total_rss_anon: 0,
                    total_rss_file: 0,
                    per_process: Vec::new(),
                    tokens: Vec::new(),
                    wall_ms: 0.0,
                });
                continue;
            }
            sys::warm(&sys::files_of(arm.input(&q.setup.files))?)?;
            let cell = share_cell(&q.spec(arm, s.share_tokens, true), arm, n)?;
            eprintln!(
                "  {tag} share {:<12} x{n}: total PSS {:6.0} MiB  anonymous {:6.0} MiB",
                arm.name(),
                mib(cell.total_pss),
                mib(cell.total_anonymous)
            );
            share.push(cell);
        }
    }
    Ok(share)
}

/// The eviction and refault child on the mapped arm.
fn qwen_eviction(s: &Settings, q: &QwenInputs) -> Result<EvictReport> {
    let files = &q.setup.files;
    sys::warm(&sys::files_of(&files.store)?)?;
    let steps = s.decode_tokens.max(16);
    let spec = ChildSpec::Evict {
        files: files.clone(),
        config: q.setup.config_path.clone(),
        layout: q.setup.layout_path.clone(),
        prompt: q.prompt.clone(),
        spec: EvictSpec {
            steps,
            evict_at: steps / 4,
            pressure: (steps / 2)..(steps / 2 + steps / 8),
            interval_ms: 300,
        },
    };
    let (line, _) = run_child(&spec)?;
    let e: EvictReport = serde_json::from_str(&line)?;
    eprintln!(
        "  {} evicted {:.1} % -> {:.1} %, refault step {:.0} ms vs {:.0} ms, logits identical {}, verify failures {}",
        q.tag,
        100.0 * e.residency_before,
        100.0 * e.residency_after_evict,
        e.refault_step_ms,
        e.steady_step_ms,
        e.logits_identical,
        e.verify_failures.len()
    );
    Ok(e)
}
