//! The real Qwen2.5-Coder-0.5B-Instruct checkpoint: where its GGUF is, whether its absence
//! skips a test or fails it, and the independent float64 reference of it
//! (`models/tests/fixtures/qwen25_real`, written by `make_reference.py`).

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::convert::WeightFormat;
use burn_mapped_models::qwen2::{KvCache, Qwen2ForCausalLM, argmax};
use burn_mapped_models::tokenizer::chat_prompt;
use burn_mapped_tools::fetch::{QWEN25_CODER_05B, default_cache_dir};
use burn_mapped_tools::qwen::{self, ModelPaths};
use serde_json::Value;

use crate::json::{f64s, u32s, usizes};
use crate::numeric::read_f32s;

/// The fixture folder of the float64 reference.
pub const REAL_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../models/tests/fixtures/qwen25_real"
);

/// How many of the reference's greedy tokens the decode tests generate and compare: their
/// contract is that the first this many equal the reference's. The reference holds more
/// (`generated_ids`, `margins`), so that where a float32 implementation parts from it later,
/// the reference's margin there can be read off.
pub const COMPARED_TOKENS: usize = 32;

/// The real Qwen2.5-Coder-0.5B-Instruct GGUF: `$BURN_MAPPED_GGUF`, else the fetch cache's copy.
///
/// Returns `None` (after saying so on stderr) when it is absent, so a test can pass without it;
/// with `BURN_MAPPED_REQUIRE_REAL=1` (set by CI) its absence panics instead.
pub fn real_gguf() -> Option<PathBuf> {
    let path = std::env::var_os("BURN_MAPPED_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| default_cache_dir().join(QWEN25_CODER_05B.file_name));
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("BURN_MAPPED_REQUIRE_REAL").as_deref() == Ok("1") {
        panic!(
            "{} is missing; run `burn-mapped fetch qwen2.5-coder-0.5b`",
            path.display()
        );
    }
    eprintln!(
        "note: {} absent; real-checkpoint test not run",
        path.display()
    );
    None
}

/// One prompt of the float64 reference.
pub struct RealPrompt {
    /// The prompt as fed to the model (chat-templated where the reference used the template).
    pub text: String,
    /// What the chat template was applied to, for chat prompts.
    pub user_message: Option<String>,
    pub prompt_ids: Vec<u32>,
    /// The reference's greedy continuation, all of it (at least [`COMPARED_TOKENS`]).
    pub generated_ids: Vec<u32>,
    /// Top-1 over top-2 logit gap at each position of the continuation.
    pub margins: Vec<f64>,
    /// Smallest top-1 over top-2 logit gap along the whole continuation.
    pub min_margin: f64,
    pub first: FirstLogits,
    /// The reference's largest logits at each position of the continuation.
    pub steps: Vec<StepTop>,
}

/// The reference's largest logits at one generated position, largest first.
pub struct StepTop {
    pub ids: Vec<u32>,
    pub logits: Vec<f64>,
}

impl StepTop {
    /// The reference's logit of `id`, where it is among the stored ones.
    pub fn logit(&self, id: u32) -> Option<f64> {
        let i = self.ids.iter().position(|&t| t == id)?;
        Some(self.logits[i])
    }
}

impl RealPrompt {
    /// The first [`COMPARED_TOKENS`] tokens of the continuation: what a decode test compares.
    pub fn compared_ids(&self) -> &[u32] {
        &self.generated_ids[..COMPARED_TOKENS]
    }

    /// Smallest top-1 over top-2 logit gap over the first [`COMPARED_TOKENS`] positions.
    pub fn compared_min_margin(&self) -> f64 {
        self.margins[..COMPARED_TOKENS]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    /// The prompt text built the way the CLI builds it: the chat template applied to the user
    /// message, or the raw text.
    pub fn built_text(&self) -> String {
        match &self.user_message {
            Some(message) => chat_prompt(None, message),
            None => self.text.clone(),
        }
    }
}

/// The reference's logits at the first generated position.
pub struct FirstLogits {
    pub argmax: u32,
    /// The largest logits, indices and values, largest first.
    pub top_indices: Vec<usize>,
    pub top_values: Vec<f64>,
    /// `max |logit|` over the whole vocabulary.
    pub max_abs: f64,
}

impl FirstLogits {
    /// `max |got - ref| / max |ref|` over the reference's stored top logits.
    pub fn top_error(&self, got: &[f32]) -> f64 {
        self.top_indices
            .iter()
            .zip(&self.top_values)
            .map(|(&i, &v)| (f64::from(got[i]) - v).abs())
            .fold(0f64, f64::max)
            / self.max_abs
    }

    /// Gap between the reference's two largest logits.
    pub fn margin(&self) -> f64 {
        self.top_values[0] - self.top_values[1]
    }
}

/// Every prompt of the float64 reference, in order.
pub fn real_reference() -> Vec<RealPrompt> {
    reference_prompts("prompts")
}

/// The float64 reference's long prompts (600-700 tokens, plain text, 32 tokens each): what a
/// prompt's products and attention over hundreds of positions are held to.
pub fn real_long_reference() -> Vec<RealPrompt> {
    reference_prompts("long_prompts")
}

/// The prompts under `key` of the reference.
fn reference_prompts(key: &str) -> Vec<RealPrompt> {
    let path = format!("{REAL_FIXTURE}/reference.json");
    let reference: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    reference[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let first = &p["first_logits"];
            RealPrompt {
                text: p["text"].as_str().unwrap().to_owned(),
                user_message: p["is_chat"]
                    .as_bool()
                    .unwrap()
                    .then(|| p["user_message"].as_str().unwrap().to_owned()),
                prompt_ids: u32s(&p["prompt_ids"]),
                generated_ids: u32s(&p["generated_ids"]),
                margins: f64s(&p["margins"]),
                min_margin: p["min_margin"].as_f64().unwrap(),
                first: FirstLogits {
                    argmax: first["argmax"].as_u64().unwrap() as u32,
                    top_indices: usizes(&first["top_indices"]),
                    top_values: f64s(&first["top_values_f32"]),
                    max_abs: first["max_abs"].as_f64().unwrap(),
                },
                steps: p["step_top_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .zip(p["step_top_logits"].as_array().unwrap())
                    .map(|(ids, logits)| StepTop {
                        ids: u32s(ids),
                        logits: f64s(logits),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Every first-position logit of prompt 0 (`first_logits_prompt0.f32`).
pub fn real_first_logits_prompt0() -> Vec<f32> {
    read_f32s(format!("{REAL_FIXTURE}/first_logits_prompt0.f32"))
}

/// The weights of the GGUF at `gguf` as `dtype` (`None`: the GGUF read in place), resolved as
/// the CLI resolves them: a store in the fetch cache, converted on first use.
pub fn resolve(gguf: &Path, dtype: Option<WeightFormat>) -> ModelPaths {
    qwen::resolve(gguf.to_str().unwrap(), dtype, &default_cache_dir(), None)
        .unwrap_or_else(|e| panic!("resolving {} as {dtype:?}: {e}", gguf.display()))
}

/// The logits after prefilling `prompt` in a fresh cache: what the reference's
/// `first_logits` hold.
pub fn first_logits(model: &Qwen2ForCausalLM, prompt: &[u32], device: &Device) -> Vec<f32> {
    logits_after(
        model,
        prompt,
        &mut model.new_cache(1, prompt.len() + 1),
        device,
    )
}

/// The last position's logits after feeding `ids` into `cache`.
fn logits_after(
    model: &Qwen2ForCausalLM,
    ids: &[u32],
    cache: &mut KvCache,
    device: &Device,
) -> Vec<f32> {
    let input: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(input, [1, ids.len()]), device);
    let logits = model.forward_last(tokens, cache).unwrap();
    logits.into_data().convert::<f32>().try_to_vec().unwrap()
}

/// Largest difference, in logits, allowed between the model's logit of a token and the
/// reference's at any position of a continuation, over the reference's largest logits there
/// ([`StepTop`]). The model's only approximation of the reference's arithmetic is the 8-bit
/// quantization of its activations (a scale per 32 values): over the reference's prompts, at
/// every position and on every CPU tier (scalar, AVX2, AVX-512 VNNI) it moved them by at most
/// 0.28 (prompt 0 on the AVX2 tier; `qwen_real_blocks` and `cpu_tiers_real` print each
/// prompt's largest). A misread block or a wrong kernel moves them by whole logits.
pub const STEP_LOGIT_BOUND: f64 = 0.4;

/// The model's logits at one position of the reference's continuation, given the reference's
/// tokens before it, against the reference's largest ones there.
#[derive(Debug, Clone, PartialEq)]
pub struct Forced {
    /// Position in the continuation.
    pub at: usize,
    /// The model's top-1 there.
    pub ours: u32,
    /// `max |model - reference|` over the reference's stored logits there.
    pub error: f64,
}

/// Feeds `prompt` and then the reference's continuation (its first `tokens`) back one token at
/// a time (teacher forcing) and compares each position's logits with the reference's. Each
/// position is judged on its own: an early near-tie does not hide what comes after it, as it
/// would when the model's own tokens are fed back.
pub fn teacher_forced(
    model: &Qwen2ForCausalLM,
    reference: &RealPrompt,
    tokens: usize,
    device: &Device,
) -> Vec<Forced> {
    let want = &reference.generated_ids[..tokens];
    let mut cache = model.new_cache(1, reference.prompt_ids.len() + want.len());
    let mut logits = logits_after(model, &reference.prompt_ids, &mut cache, device);
    let mut positions = Vec::with_capacity(want.len());
    for (at, &token) in want.iter().enumerate() {
        let top = &reference.steps[at];
        let error = top
            .ids
            .iter()
            .zip(&top.logits)
            .map(|(&id, &v)| (f64::from(logits[id as usize]) - v).abs())
            .fold(0f64, f64::max);
        positions.push(Forced {
            at,
            ours: argmax(&logits).unwrap(),
            error,
        });
        if at + 1 < want.len() {
            logits = logits_after(model, &[token], &mut cache, device);
        }
    }
    positions
}

/// What is wrong with teacher-forced `positions` of `reference`: a position whose logits are
/// further than [`STEP_LOGIT_BOUND`] from the reference's, or whose top-1 is not the
/// reference's token and not among the reference's largest logits there. A top-1 that differs
/// within the bound is a near-tie the bound explains: the reference's gap between the two
/// tokens is at most twice the bound.
pub fn forced_failures(reference: &RealPrompt, positions: &[Forced]) -> Vec<String> {
    let mut failures = Vec::new();
    for f in positions {
        let want = reference.generated_ids[f.at];
        if f.error > STEP_LOGIT_BOUND {
            failures.push(format!(
                "position {}: logits {:.3} from the reference's (bound {STEP_LOGIT_BOUND})",
                f.at, f.error
            ));
        } else if f.ours != want && reference.steps[f.at].logit(f.ours).is_none() {
            failures.push(format!(
                "position {}: top-1 {} is not among the reference's largest logits (its {want})",
                f.at, f.ours
            ));
        }
    }
    failures
}

/// Positions of teacher-forced `positions` whose top-1 is not `reference`'s token, and the
/// largest logit error among them all: what the tests print per prompt.
pub fn forced_summary(reference: &RealPrompt, positions: &[Forced]) -> (Vec<usize>, f64) {
    let flips = positions
        .iter()
        .filter(|f| f.ours != reference.generated_ids[f.at])
        .map(|f| f.at)
        .collect();
    let worst = positions.iter().map(|f| f.error).fold(0f64, f64::max);
    (flips, worst)
}

/// A greedy difference from the reference that [`STEP_LOGIT_BOUND`] does not explain.
#[derive(Debug, Clone, PartialEq)]
pub struct Unexplained {
    /// Position in the continuation.
    pub at: usize,
    /// What differs there, and by how much.
    pub message: String,
}

impl std::fmt::Display for Unexplained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where greedy tokens `got` first differ from the reference's, and whether that difference
/// is one [`STEP_LOGIT_BOUND`] explains: `Ok(None)` if equal, `Ok(Some(at))` for a difference
/// at a position where the reference's logit of our token is within twice the bound of its
/// own choice's, `Err` otherwise. The tokens before `at` are the reference's, so the model's
/// state at `at` is the teacher-forced one, which [`forced_failures`] holds to the bound.
pub fn greedy_difference(
    reference: &RealPrompt,
    got: &[u32],
) -> Result<Option<usize>, Unexplained> {
    let want = &reference.generated_ids[..got.len().min(reference.generated_ids.len())];
    let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) else {
        return Ok(None);
    };
    let top = &reference.steps[at];
    let gap = top.logit(got[at]).map(|ours| top.logits[0] - ours);
    match gap {
        Some(gap) if gap <= 2.0 * STEP_LOGIT_BOUND => Ok(Some(at)),
        _ => Err(Unexplained {
            at,
            message: format!(
                "token {at} is {}, the reference's {} (reference gap {})",
                got[at],
                want[at],
                gap.map_or("beyond its stored logits".into(), |g| format!("{g:.3}"))
            ),
        }),
    }
}

/// The model at `paths` loaded on `device` as the CLI loads it, its weights adopted (`map`) in
/// strict mode, so a test that would write a mapped page fails instead.
pub fn load(
    paths: &ModelPaths,
    device: &burn::tensor::Device,
) -> burn_mapped_models::qwen2::load::Loaded {
    burn_mapped_models::qwen2::load::load(
        paths.weights(),
        device,
        burn_mapped::MappedStore::options().strict(true),
        burn_mapped::Placement::Map,
    )
    .unwrap_or_else(|e| panic!("loading {}: {e}", paths.weights_path().display()))
}
