//! The Qwen2.5 arms: inputs prepared once outside the repository, and the child that loads,
//! answers a fixed prompt and decodes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::MappedRecorder;
use burn_mapped::convert::{CastTo, WeightFormat};
use burn_mapped::manifest::TensorFormat;
use burn_mapped_models::qwen2::{KvCache, Qwen2Config, Qwen2ForCausalLM, argmax};
use burn_mapped_models::tokenizer::{Qwen2Tokenizer, chat_prompt};
use burn_mapped_tools::qwen::{self as tq, ModelPaths};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::arms::{self, Arm, ArmFiles};
use crate::measure::{Mem, bits_hash, ms};

/// Which store of the checkpoint the Qwen arms load.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum QwenModel {
    /// Every tensor f32.
    #[default]
    F32,
    /// Projections and LM head int8 with one f16 scale per row (`Q8Linear`), the rest f32.
    Q8,
}

impl QwenModel {
    /// Every model, in the order the harness runs them.
    pub const ALL: [QwenModel; 2] = [QwenModel::F32, QwenModel::Q8];

    /// Short name used in JSON, file names and on the command line.
    pub fn tag(self) -> &'static str {
        match self {
            QwenModel::F32 => "f32",
            QwenModel::Q8 => "q8",
        }
    }

    /// What the store holds, for headings.
    pub fn label(self) -> &'static str {
        match self {
            QwenModel::F32 => "f32",
            QwenModel::Q8 => {
                "q8 store (projections and LM head int8 with one f16 scale per row; embedding, \
                 norms and biases f32)"
            }
        }
    }

    /// File-name prefix of the model's figures (`qwen-` keeps the f32 names of earlier runs).
    pub fn figure_prefix(self) -> &'static str {
        match self {
            QwenModel::F32 => "qwen-",
            QwenModel::Q8 => "qwen-q8-",
        }
    }

    /// The weight format of the store the arms load (Burn's own formats hold these two).
    pub fn format(self) -> WeightFormat {
        match self {
            QwenModel::F32 => WeightFormat::Float(CastTo::F32),
            QwenModel::Q8 => WeightFormat::Q8,
        }
    }
}

impl std::fmt::Display for QwenModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.tag())
    }
}

/// Where the Qwen inputs are.
#[derive(Debug, Clone)]
pub struct QwenSetup {
    pub model: QwenModel,
    pub paths: ModelPaths,
    pub files: ArmFiles,
    /// The model configuration, as JSON every arm reads the same way.
    pub config_path: PathBuf,
    /// For a store with q8 projections: the JSON list of their module paths, which every arm
    /// reads (like the config) to build `Q8Linear`s there. `None`: every projection is float.
    pub layout_path: Option<PathBuf>,
    pub config: Qwen2Config,
    /// Logical bytes of every weight (no padding).
    pub weight_bytes: u64,
}

/// Fetches and converts the checkpoint on first use (as `burn-mapped generate` does), then
/// writes the same weights as burnpack and safetensors into `bench_dir` once.
pub fn prepare(cache_dir: &Path, bench_dir: &Path, model: QwenModel) -> Result<QwenSetup> {
    let paths = tq::resolve(tq::QWEN25_CODER_05B, Some(model.format()), cache_dir, None)
        .with_context(|| {
            format!(
                "fetching or converting Qwen2.5-Coder-0.5B ({})",
                model.tag()
            )
        })?;
    let dir = bench_dir.join(format!("qwen2.5-coder-0.5b-{}", model.tag()));
    std::fs::create_dir_all(&dir)?;
    let store_dir = paths.weights_path().to_path_buf();
    let manifest = burn_mapped::Manifest::read(&store_dir)?;
    let weight_bytes = manifest.tensors().iter().map(|t| t.len()).sum();
    let q8_paths = q8_projections(&manifest);
    let config = burn_mapped_models::qwen2::config_from_manifest(&manifest)?;
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
    let layout_path = if q8_paths.is_empty() {
        None
    } else {
        let path = dir.join("q8_projections.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&q8_paths)?)?;
        Some(path)
    };
    let files = ArmFiles {
        store: store_dir.clone(),
        burnpack: dir.join("model.bpk"),
        safetensors: dir.join("model.safetensors"),
    };
    if !files.burnpack.is_file() || !files.safetensors.is_file() {
        eprintln!(
            "writing the burnpack and safetensors copies into {}",
            dir.display()
        );
        let device = Device::flex();
        let model = init(&config, layout_path.as_deref(), &device)?
            .try_load_record(MappedRecorder::default().load(&store_dir)?)?;
        arms::write_formats(&model, &files)?;
    }
    Ok(QwenSetup {
        model,
        paths,
        files,
        config_path,
        layout_path,
        config,
        weight_bytes,
    })
}

/// Module paths of the projections the store holds as q8 (`lm_head`,
/// `model.layers.0.mlp.up_proj`, ...), sorted.
pub fn q8_projections(manifest: &burn_mapped::Manifest) -> Vec<String> {
    let mut paths: Vec<String> = manifest
        .tensors()
        .iter()
        .filter(|t| {
            t.quant()
                .is_some_and(|q| q.scheme == burn_mapped::manifest::Q8_ROW_F16)
        })
        .filter_map(|t| t.name().strip_suffix(".weight").map(str::to_string))
        .collect();
    paths.sort();
    paths
}

/// The lazy module: projections listed in the `layout` file are q8, the rest float.
fn init(config: &Qwen2Config, layout: Option<&Path>, device: &Device) -> Result<Qwen2ForCausalLM> {
    let q8: HashSet<String> = match layout {
        Some(path) => serde_json::from_slice(
            &std::fs::read(path).with_context(|| path.display().to_string())?,
        )
        .with_context(|| format!("parsing {}", path.display()))?,
        None => HashSet::new(),
    };
    Ok(config.try_init_with(device, |p| {
        if q8.contains(p) {
            TensorFormat::Q8
        } else {
            TensorFormat::Float
        }
    })?)
}

/// The tokenizer of the checkpoint.
pub fn tokenizer(setup: &QwenSetup) -> Result<Qwen2Tokenizer> {
    Ok(tq::load_tokenizer(&setup.paths)?)
}

/// The prompt text (chat-templated when `chat`) and its ids.
pub fn prompt_ids(tok: &Qwen2Tokenizer, prompt: &str, chat: bool) -> Result<(String, Vec<u32>)> {
    let text = if chat {
        chat_prompt(None, prompt)
    } else {
        prompt.to_string()
    };
    let ids = tok.encode(&text)?;
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    Ok((text, ids))
}

/// Logits of the last position after feeding `input` to `cache`.
pub fn step(
    model: &Qwen2ForCausalLM,
    cache: &mut KvCache,
    input: &[u32],
    device: &Device,
) -> Result<Vec<f32>> {
    let tokens = Tensor::<2, Int>::from_data(
        TensorData::new(
            input.iter().map(|&t| i64::from(t)).collect(),
            [1, input.len()],
        ),
        device,
    );
    model
        .forward_last(tokens, cache)?
        .try_into_vec_as::<f32>()
        .map_err(|e| anyhow::anyhow!("reading logits back: {e}"))
}

/// What the child of one Qwen arm reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QwenSample {
    pub arm: Arm,
    pub round: usize,
    /// `warm` or `cold`.
    pub cache: String,
    /// Fraction of the arm's file bytes in the page cache just before the child started.
    pub residency_before: f64,
    pub construct_ms: f64,
    /// Module construction + load: the model can run.
    pub model_ready_ms: f64,
    /// Start to the first generated token (prefill of the prompt included).
    pub ttft_ms: f64,
    pub decode_tokens: usize,
    pub decode_ms: f64,
    pub decode_tok_s: f64,
    pub mem_after_load: Mem,
    pub mem_after_decode: Mem,
    /// First token then `decode_tokens` more, greedy.
    pub tokens: Vec<u32>,
    /// xxh3 of the bit patterns of the first position's logits.
    pub first_logits_xxh3: String,
    /// xxh3 over every step's logits.
    pub all_logits_xxh3: String,
    /// Spawn to exit, timed by the parent.
    pub process_ms: f64,
}

/// A loaded model and the times it took.
pub struct Loaded {
    pub model: Qwen2ForCausalLM,
    pub start: Instant,
    pub construct_ms: f64,
    pub model_ready_ms: f64,
}

/// Reads the config (and the q8 layout, if any), constructs the lazy module and loads it
/// through `arm`.
pub fn load(
    arm: Arm,
    files: &ArmFiles,
    config_path: &Path,
    layout: Option<&Path>,
    device: &Device,
) -> Result<Loaded> {
    let start = Instant::now();
    let config: Qwen2Config = serde_json::from_slice(
        &std::fs::read(config_path).with_context(|| config_path.display().to_string())?,
    )?;
    let fresh = init(&config, layout, device)?;
    let construct_ms = ms(start);
    let model = arms::load(arm, fresh, files)?;
    Ok(Loaded {
        model,
        start,
        construct_ms,
        model_ready_ms: ms(start),
    })
}

/// Loads, answers `prompt` and decodes `decode_tokens` more greedy tokens, then calls
/// `hold` with the sample while the model and its cache are still alive.
pub fn run(
    arm: Arm,
    files: &ArmFiles,
    config_path: &Path,
    layout: Option<&Path>,
    prompt: &[u32],
    decode_tokens: usize,
    hold: impl FnOnce(&QwenSample) -> Result<()>,
) -> Result<QwenSample> {
    let device = Device::flex();
    let loaded = load(arm, files, config_path, layout, &device)?;
    let mem_after_load = Mem::now()?;
    let model = &loaded.model;
    let mut cache = model.new_cache(1, prompt.len() + decode_tokens);
    let logits = step(model, &mut cache, prompt, &device)?;
    let mut all = Xxh3::new();
    all.update(&bits_hash(&logits).to_le_bytes());
    let first_hash = bits_hash(&logits);
    let mut tokens = vec![argmax(&logits)?];
    let ttft_ms = ms(loaded.start);
    let t = Instant::now();
    for _ in 0..decode_tokens {
        let last = *tokens.last().expect("one token at least");
        let logits = step(model, &mut cache, &[last], &device)?;
        all.update(&bits_hash(&logits).to_le_bytes());
        tokens.push(argmax(&logits)?);
    }
    let decode_ms = ms(t);
    let mem_after_decode = Mem::now()?;
    let sample = QwenSample {
        arm,
        round: 0,
        cache: String::new(),
        residency_before: 0.0,
        construct_ms: loaded.construct_ms,
        model_ready_ms: loaded.model_ready_ms,
        ttft_ms,
        decode_tokens,
        decode_ms,
        decode_tok_s: if decode_tokens > 0 {
            decode_tokens as f64 / (decode_ms / 1e3)
        } else {
            0.0
        },
        mem_after_load,
        mem_after_decode,
        tokens,
        first_logits_xxh3: format!("{first_hash:016x}"),
        all_logits_xxh3: format!("{:016x}", all.digest()),
        process_ms: 0.0,
    };
    hold(&sample)?;
    drop(cache);
    Ok(sample)
}
