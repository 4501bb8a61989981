//! The results file (`results/<name>.json`): raw samples of every phase, the identity checks
//! and the targets. Its layout is read back by `harness doc`, so fields only grow
//! (with `#[serde(default)]`); [`summary`](crate::summary), [`targets`](crate::targets) and
//! [`markdown`](crate::markdown) derive everything else from it.

use serde::{Deserialize, Serialize};

use crate::arms::Arm;
use crate::evict::EvictReport;
use crate::qwen::{QwenModel, QwenSample};
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
