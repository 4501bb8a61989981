//! The parent side: prepares the inputs, runs every child, checks identity, and writes the
//! results file, the figures and (optionally) the section of `docs/PERFORMANCE.md`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn_mapped::memstat;

use crate::arms::{Arm, ArmFiles};
use crate::child::ChildSpec;
use crate::evict::{EvictReport, EvictSpec};
use crate::qwen::QwenModel;
use crate::qwen::{self, QwenSample};
use crate::report::{
    Identity, LlamaCpp, Machine, Phase, QwenIdentity, QwenReport, Report, SCHEMA, Settings,
    ShareCell, ShareProcess, SynthReport,
};
use crate::synth::{self, SynthSample};
use crate::{doc, llama, plot, report, sys};

/// Everything `harness run` takes.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub name: String,
    pub rounds: usize,
    pub cold_rounds: usize,
    pub decode_tokens: usize,
    pub share: Vec<usize>,
    pub share_tokens: usize,
    pub synthetic_layers: usize,
    pub synthetic_dim: usize,
    pub synthetic_rounds: usize,
    pub evict: bool,
    pub llama_cpp: bool,
    pub qwen: bool,
    /// The Qwen stores to measure, in order.
    pub models: Vec<QwenModel>,
    pub prompt: String,
    pub chat: bool,
    pub cache_dir: PathBuf,
    pub results_dir: PathBuf,
    pub doc: Option<PathBuf>,
    pub command: String,
}

fn exe() -> Result<PathBuf> {
    Ok(std::env::current_exe()?)
}

/// Runs one child to completion; returns its last stdout line and its wall time in ms.
fn run_child(spec: &ChildSpec) -> Result<(String, f64)> {
    let t = Instant::now();
    let out = Command::new(exe()?)
        .arg("child")
        .arg(serde_json::to_string(spec)?)
        .stdin(Stdio::null())
        .output()
        .context("spawning a child")?;
    let wall = t.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!(
            "child {} failed ({}): {}",
            serde_json::to_string(spec)?
                .chars()
                .take(120)
                .collect::<String>(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().context("child printed nothing")?;
    Ok((line.to_string(), wall))
}

/// Memory the arm's child needs beyond the page cache, as a guard against starving the
/// machine (it has no swap): owned copies need the weights once more, mapped arms little.
fn needed(arm: Arm, weight_bytes: u64, processes: usize) -> u64 {
    let per = if arm.is_mapped() {
        512 << 20
    } else {
        weight_bytes + weight_bytes / 8 + (512 << 20)
    };
    per * processes as u64 + (1 << 30)
}

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

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|r| r.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// `harness run`.
pub fn run(cfg: &RunConfig) -> Result<Report> {
    if cfg.rounds == 0 {
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
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cpu_model: cpu_model(),
    };
    let settings = Settings {
        rounds: cfg.rounds,
        cold_rounds: cfg.cold_rounds,
        decode_tokens: cfg.decode_tokens,
        share: cfg.share.clone(),
        share_tokens: cfg.share_tokens,
        synthetic_layers: cfg.synthetic_layers,
        synthetic_dim: cfg.synthetic_dim,
        synthetic_rounds: cfg.synthetic_rounds,
        prompt: cfg.prompt.clone(),
        chat: cfg.chat,
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

    let synthetic = if cfg.synthetic_layers > 0 && cfg.synthetic_rounds > 0 {
        let clock = PhaseClock::start("prepare synthetic".into());
        let (layers, dim) = (cfg.synthetic_layers, cfg.synthetic_dim);
        let files = synth::files(&bench_dir, layers, dim);
        synth::prepare(&files, layers, dim)?;
        let weight_bytes = (layers * (dim * dim + dim) * 4) as u64;
        clock.end(&mut phases);
        let clock = PhaseClock::start("synthetic warm".into());
        evict_inputs(&files)?;
        let mut samples = Vec::new();
        for round in 0..cfg.synthetic_rounds {
            for arm in Arm::order(round) {
                let need = needed(arm, weight_bytes, 1);
                let avail = sys::mem_available()?;
                if need > avail {
                    bail!(
                        "synthetic {}: needs about {:.1} GiB, MemAvailable {:.1} GiB; lower --synthetic-layers",
                        arm.name(),
                        need as f64 / (1u64 << 30) as f64,
                        avail as f64 / (1u64 << 30) as f64
                    );
                }
                let inputs = sys::files_of(arm.input(&files))?;
                sys::warm(&inputs)?;
                let residency = sys::residency(&inputs)?;
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
                    s.mem_after_load.anon as f64 / (1u64 << 20) as f64
                );
                samples.push(s);
            }
        }
        clock.end(&mut phases);
        let first = samples.first().map(|s| s.output_xxh3.clone());
        let same = samples
            .iter()
            .all(|s| Some(&s.output_xxh3) == first.as_ref());
        if !same {
            identity
                .mismatches
                .push("synthetic: outputs differ across arms".into());
        }
        identity.synthetic_outputs_identical = Some(same);
        let mut file_bytes = Vec::new();
        for arm in [Arm::Mapped, Arm::LoadFile, Arm::Safetensors] {
            file_bytes.push((arm, sys::total_len(&sys::files_of(arm.input(&files))?)?));
        }
        Some(SynthReport {
            layers,
            dim,
            weight_bytes,
            file_bytes,
            samples,
        })
    } else {
        None
    };

    let mut rep = Report {
        schema: SCHEMA,
        name: cfg.name.clone(),
        command: cfg.command.clone(),
        machine,
        settings,
        qwen: qwen_f32,
        qwen_q8,
        synthetic,
        llama_cpp,
        phases,
        identity,
        targets: Vec::new(),
        notes,
    };
    rep.targets = report::targets(&rep);
    write_outputs(&rep, &cfg.results_dir, cfg.doc.as_deref())?;
    Ok(rep)
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
    let tag = model.tag();
    let clock = PhaseClock::start(format!("prepare qwen {tag}"));
    let setup = qwen::prepare(&cfg.cache_dir, bench_dir, model)?;
    let tok = qwen::tokenizer(&setup)?;
    let (_, prompt_ids) = qwen::prompt_ids(&tok, &cfg.prompt, cfg.chat)?;
    clock.end(phases);
    let files = &setup.files;
    let mut file_bytes = Vec::new();
    for arm in [Arm::Mapped, Arm::LoadFile, Arm::Safetensors] {
        file_bytes.push((arm, sys::total_len(&sys::files_of(arm.input(files))?)?));
    }
    let spec = |arm, decode_tokens, hold| ChildSpec::Qwen {
        arm,
        files: files.clone(),
        config: setup.config_path.clone(),
        layout: setup.layout_path.clone(),
        prompt: prompt_ids.clone(),
        decode_tokens,
        hold,
    };
    let guard = |arm: Arm, n: usize| -> Result<Option<String>> {
        let (need, avail) = (needed(arm, setup.weight_bytes, n), sys::mem_available()?);
        Ok((need > avail).then(|| {
            format!(
                "needs about {:.1} GiB, MemAvailable {:.1} GiB",
                need as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            )
        }))
    };

    // Warm start-up, first token, decode and memory. Every input is evicted once first, so
    // each is then cached by the same mapped warm-up (huge folios where the kernel can),
    // whatever read it before.
    let clock = PhaseClock::start(format!("qwen {tag} warm"));
    evict_inputs(files)?;
    let mut warm = Vec::new();
    for round in 0..cfg.rounds {
        for arm in Arm::order(round) {
            if let Some(why) = guard(arm, 1)? {
                bail!("{tag} {}: {why}; free memory or lower the load", arm.name());
            }
            let inputs = sys::files_of(arm.input(files))?;
            sys::warm(&inputs)?;
            let residency = sys::residency(&inputs)?;
            let (line, wall) = run_child(&spec(arm, cfg.decode_tokens, false))
                .with_context(|| format!("qwen {tag} {}", arm.name()))?;
            let mut s: QwenSample = serde_json::from_str(&line)?;
            s.round = round;
            s.cache = "warm".into();
            s.residency_before = residency;
            s.process_ms = wall;
            eprintln!(
                "  {tag} round {round} {:<12} ready {:8.1} ms  first token {:8.1} ms  decode {:5.2} tok/s  anon {:6.0} MiB",
                arm.name(),
                s.model_ready_ms,
                s.ttft_ms,
                s.decode_tok_s,
                s.mem_after_load.anon as f64 / (1u64 << 20) as f64
            );
            warm.push(s);
        }
    }
    clock.end(phases);

    // Cold: the arm's files evicted, confirmed with mincore.
    let clock = PhaseClock::start(format!("qwen {tag} cold"));
    let mut cold = Vec::new();
    for round in 0..cfg.cold_rounds {
        for arm in Arm::order(round) {
            let inputs = sys::files_of(arm.input(files))?;
            sys::evict(&inputs)?;
            let residency = sys::residency(&inputs)?;
            if residency > 0.01 {
                notes.push(format!(
                    "qwen {tag} cold round {round}, {}: {:.1} % of the files stayed resident after eviction (another process maps them?)",
                    arm.name(),
                    100.0 * residency
                ));
            }
            let (line, wall) = run_child(&spec(arm, 0, false))?;
            let mut s: QwenSample = serde_json::from_str(&line)?;
            s.round = round;
            s.cache = "cold".into();
            s.residency_before = residency;
            s.process_ms = wall;
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
    clock.end(phases);

    // Sharing.
    let clock = PhaseClock::start(format!("qwen {tag} sharing"));
    let mut share = Vec::new();
    for &n in &cfg.share {
        for arm in Arm::ALL {
            if let Some(why) = guard(arm, n)? {
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
            sys::warm(&sys::files_of(arm.input(files))?)?;
            let cell = share_cell(&spec(arm, cfg.share_tokens, true), arm, n)?;
            eprintln!(
                "  {tag} share {:<12} x{n}: total PSS {:6.0} MiB  anonymous {:6.0} MiB",
                arm.name(),
                cell.total_pss as f64 / (1u64 << 20) as f64,
                cell.total_anonymous as f64 / (1u64 << 20) as f64
            );
            share.push(cell);
        }
    }
    clock.end(phases);

    // Eviction and refault.
    let evict = if cfg.evict {
        let clock = PhaseClock::start(format!("qwen {tag} eviction"));
        sys::warm(&sys::files_of(&files.store)?)?;
        let steps = cfg.decode_tokens.max(16);
        let spec = ChildSpec::Evict {
            files: files.clone(),
            config: setup.config_path.clone(),
            layout: setup.layout_path.clone(),
            prompt: prompt_ids.clone(),
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
            "  {tag} evicted {:.1} % -> {:.1} %, refault step {:.0} ms vs {:.0} ms, logits identical {}, verify failures {}",
            100.0 * e.residency_before,
            100.0 * e.residency_after_evict,
            e.refault_step_ms,
            e.steady_step_ms,
            e.logits_identical,
            e.verify_failures.len()
        );
        clock.end(phases);
        Some(e)
    } else {
        None
    };

    // llama.cpp runs the GGUF itself, the same for every store: measured once, beside f32.
    if cfg.llama_cpp && model == QwenModel::F32 {
        let clock = PhaseClock::start("llama.cpp reference".into());
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let l = llama::measure(&setup.paths.gguf, &prompt_ids, cfg.decode_tokens, threads)?;
        eprintln!("  {}: {:.2} tok/s", l.status, l.decode_tok_s);
        *llama_cpp = Some(l);
        clock.end(phases);
    }

    // Identity.
    let id = check_qwen_identity(tag, &warm, &cold, &share, evict.as_ref());
    let generated_text = warm
        .first()
        .map(|s| tok.decode(&s.tokens))
        .transpose()?
        .unwrap_or_default();
    Ok((
        QwenReport {
            model,
            store: setup.paths.store.display().to_string(),
            weight_bytes: setup.weight_bytes,
            file_bytes,
            prompt_ids,
            generated_text,
            warm,
            cold,
            share,
            evict,
        },
        id,
    ))
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
        update_doc(rep, path, results_dir)?;
    }
    Ok(())
}

/// Rewrites the generated section of the page at `path` (`docs/PERFORMANCE.md`) from `rep`,
/// linking the results and figures relative to the page.
pub fn update_doc(rep: &Report, path: &Path, results_dir: &Path) -> Result<()> {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let folder = std::fs::canonicalize(folder)?;
    let results = std::fs::canonicalize(results_dir)?;
    let rel = doc::relative_path(&folder, &results).display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    std::fs::write(path, doc::splice(&text, &doc::section(rep, &rel))?)?;
    eprintln!("updated {}", path.display());
    Ok(())
}

/// Tokens and logits of every sample of one store against its first warm sample.
fn check_qwen_identity(
    tag: &str,
    warm: &[QwenSample],
    cold: &[QwenSample],
    share: &[ShareCell],
    evict: Option<&EvictReport>,
) -> QwenIdentity {
    let mut id = QwenIdentity::default();
    if let Some(first) = warm.first() {
        let mut tokens_ok = true;
        let mut logits_ok = true;
        for s in warm {
            if s.tokens != first.tokens {
                tokens_ok = false;
                id.mismatches.push(format!(
                    "qwen {tag} warm round {} {}: tokens {:?} differ from {:?}",
                    s.round,
                    s.arm.name(),
                    s.tokens,
                    first.tokens
                ));
            }
            if s.first_logits_xxh3 != first.first_logits_xxh3
                || s.all_logits_xxh3 != first.all_logits_xxh3
            {
                logits_ok = false;
                id.mismatches.push(format!(
                    "qwen {tag} warm round {} {}: logits hash {}/{} differs from {}/{}",
                    s.round,
                    s.arm.name(),
                    s.first_logits_xxh3,
                    s.all_logits_xxh3,
                    first.first_logits_xxh3,
                    first.all_logits_xxh3
                ));
            }
        }
        for s in cold {
            if s.tokens.first() != first.tokens.first()
                || s.first_logits_xxh3 != first.first_logits_xxh3
            {
                tokens_ok = false;
                id.mismatches.push(format!(
                    "qwen {tag} cold round {} {}: first token or logits differ",
                    s.round,
                    s.arm.name()
                ));
            }
        }
        id.tokens_identical = Some(tokens_ok);
        id.logits_identical = Some(logits_ok);
        let mut share_ok = None;
        for c in share.iter().filter(|c| c.skipped.is_none()) {
            let ok = c
                .tokens
                .iter()
                .all(|t| first.tokens.starts_with(t) || t.starts_with(&first.tokens));
            if !ok {
                id.mismatches.push(format!(
                    "qwen {tag} sharing {} x{}: tokens differ",
                    c.arm.name(),
                    c.processes
                ));
            }
            share_ok = Some(share_ok.unwrap_or(true) && ok);
        }
        id.share_tokens_identical = share_ok;
        if let Some(e) = evict {
            let ok = e.logits_identical && e.tokens_identical && e.verify_failures.is_empty();
            let prefix_ok =
                first.tokens.starts_with(&e.tokens) || e.tokens.starts_with(&first.tokens);
            if !ok || !prefix_ok {
                id.mismatches.push(format!(
                    "qwen {tag} eviction: logits identical {}, tokens identical {}, verify failures {}, matches the arms' tokens {}",
                    e.logits_identical,
                    e.tokens_identical,
                    e.verify_failures.len(),
                    prefix_ok
                ));
            }
            id.evict_logits_identical = Some(ok && prefix_ok);
        }
    }
    id
}

/// `n` concurrent holding children of one arm, measured while all are alive.
fn share_cell(spec: &ChildSpec, arm: Arm, n: usize) -> Result<ShareCell> {
    let t = Instant::now();
    let json = serde_json::to_string(spec)?;
    let mut children = Vec::new();
    for _ in 0..n {
        children.push(
            Command::new(exe()?)
                .arg("child")
                .arg(&json)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("spawning a sharing child")?,
        );
    }
    let mut samples = Vec::new();
    let mut result: Result<()> = Ok(());
    for child in &mut children {
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        if let Err(e) = BufReader::new(stdout).read_line(&mut line) {
            result = Err(e.into());
            break;
        }
        match serde_json::from_str::<QwenSample>(line.trim()) {
            Ok(s) => samples.push(s),
            Err(e) => {
                result = Err(anyhow::anyhow!(
                    "sharing child printed `{}`: {e}",
                    line.trim()
                ));
                break;
            }
        }
    }
    let mut per_process = Vec::new();
    if result.is_ok() {
        for (child, s) in children.iter().zip(&samples) {
            let pid = child.id().to_string();
            match (memstat::pss_of(&pid), memstat::rss_of(&pid)) {
                (Ok((pss, anonymous)), Ok(rss)) => per_process.push(ShareProcess {
                    pss,
                    anonymous,
                    rss_anon: rss.anon,
                    rss_file: rss.file,
                    model_ready_ms: s.model_ready_ms,
                    decode_tok_s: s.decode_tok_s,
                }),
                (Err(e), _) | (_, Err(e)) => {
                    result = Err(e.into());
                    break;
                }
            }
        }
    }
    // Release everyone (closing stdin ends their wait), then reap.
    for child in &mut children {
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.flush();
        }
    }
    for mut child in children {
        let status = child.wait()?;
        if result.is_ok() && !status.success() {
            result = Err(anyhow::anyhow!(
                "a sharing child of {} exited with {status}",
                arm.name()
            ));
        }
    }
    result?;
    Ok(ShareCell {
        arm,
        processes: n,
        skipped: None,
        total_pss: per_process.iter().map(|p| p.pss).sum(),
        total_anonymous: per_process.iter().map(|p| p.anonymous).sum(),
        total_rss_anon: per_process.iter().map(|p| p.rss_anon).sum(),
        total_rss_file: per_process.iter().map(|p| p.rss_file).sum(),
        per_process,
        tokens: samples.into_iter().map(|s| s.tokens).collect(),
        wall_ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

/// Drops every arm's input from the page cache (see [`sys::warm`]).
fn evict_inputs(files: &ArmFiles) -> Result<()> {
    for arm in Arm::ALL {
        sys::evict(&sys::files_of(arm.input(files))?)?;
    }
    Ok(())
}
