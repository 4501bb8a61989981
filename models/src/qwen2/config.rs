//! Model dimensions and how they are read from a Hugging Face `config.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Dimensions and constants of a Qwen2 / Qwen2.5 decoder.
///
/// Fields are public so other front ends (GGUF metadata, tests) can build one directly;
/// [`validate`](Self::validate) states what a usable config must satisfy and
/// [`try_init`](Self::try_init) / [`from_hf_json`](Self::from_hf_json) call it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen2Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head width; Qwen2 derives it as `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    /// When true the LM head reuses `model.embed_tokens.weight` and no `lm_head` is created.
    pub tie_word_embeddings: bool,
}

/// Most decoder layers a configuration may ask for (the largest published models have ~130).
/// Each bound below is far above every published Qwen2 size, is checked before anything is
/// sized by the field, and keeps every product of fields (a KV cache's bytes among them) well
/// inside `u64`.
pub const MAX_LAYERS: usize = 1024;
/// Widest hidden size.
pub const MAX_HIDDEN: usize = 1 << 17;
/// Widest MLP.
pub const MAX_INTERMEDIATE: usize = 1 << 20;
/// Most attention heads.
pub const MAX_HEADS: usize = 1024;
/// Largest vocabulary.
pub const MAX_VOCAB: usize = 1 << 24;
/// Longest context, in positions.
pub const MAX_CONTEXT: usize = 1 << 24;

/// Why a configuration could not be read or used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path} is not valid JSON for a Qwen2 config: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("config field `{field}` is required but absent")]
    MissingField { field: &'static str },
    #[error("config field `{field}` = {value} is invalid: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error(
        "config field `{field}` = {value} asks for something this implementation does not support"
    )]
    Unsupported { field: &'static str, value: String },
    #[error("config field `{field}` = {value} is over this implementation's limit of {max}")]
    TooLarge {
        field: &'static str,
        value: usize,
        max: usize,
    },
    #[error("config field `{field}` = {value}, but the weights hold {found} (tensors of {what})")]
    Disagrees {
        field: &'static str,
        value: usize,
        found: usize,
        what: &'static str,
    },
}

/// Hugging Face `config.json` as written by transformers 4.x and 5.x (the latter moves
/// `rope_theta` into `rope_parameters`). Unknown keys are ignored.
#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
}

// Defaults below are those of transformers' `Qwen2Config`, so a file that omits a key
// means what it means to transformers.
const HF_DEFAULT_RMS_NORM_EPS: f64 = 1e-6;
const HF_DEFAULT_ROPE_THETA: f64 = 10_000.0;
const HF_DEFAULT_MAX_POSITION_EMBEDDINGS: usize = 32_768;

impl Qwen2Config {
    /// Read a Hugging Face `config.json` and validate it.
    pub fn from_hf_json(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let hf: HfConfig = serde_json::from_str(&text).map_err(|source| ConfigError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_hf(hf)
    }

    /// Parse the text of a Hugging Face `config.json` (as [`from_hf_json`](Self::from_hf_json)
    /// without the file).
    pub fn from_hf_str(text: &str) -> Result<Self, ConfigError> {
        let hf: HfConfig = serde_json::from_str(text).map_err(|source| ConfigError::Json {
            path: PathBuf::from("<string>"),
            source,
        })?;
        Self::from_hf(hf)
    }

    fn from_hf(hf: HfConfig) -> Result<Self, ConfigError> {
        if let Some(model_type) = &hf.model_type
            && model_type != "qwen2"
        {
            return Err(ConfigError::Unsupported {
                field: "model_type",
                value: model_type.clone(),
            });
        }
        if let Some(act) = &hf.hidden_act
            && act != "silu"
        {
            return Err(ConfigError::Unsupported {
                field: "hidden_act",
                value: act.clone(),
            });
        }
        if hf.use_sliding_window == Some(true) {
            return Err(ConfigError::Unsupported {
                field: "use_sliding_window",
                value: "true".into(),
            });
        }
        if let Some(scaling) = &hf.rope_scaling
            && !scaling.is_null()
        {
            check_default_rope("rope_scaling", scaling)?;
        }
        let mut rope_theta = hf.rope_theta;
        if let Some(params) = &hf.rope_parameters
            && !params.is_null()
        {
            check_default_rope("rope_parameters", params)?;
            if let Some(theta) = params.get("rope_theta") {
                let theta = theta.as_f64().ok_or_else(|| ConfigError::Invalid {
                    field: "rope_parameters.rope_theta",
                    value: theta.to_string(),
                    reason: "must be a number",
                })?;
                rope_theta = Some(theta);
            }
        }

        let num_attention_heads = required(hf.num_attention_heads, "num_attention_heads")?;
        let hidden_size = required(hf.hidden_size, "hidden_size")?;
        let head_dim = match hf.head_dim {
            Some(d) => d,
            None if num_attention_heads == 0 => 0, // rejected by validate()
            None => hidden_size / num_attention_heads,
        };
        let config = Self {
            vocab_size: required(hf.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: required(hf.intermediate_size, "intermediate_size")?,
            num_hidden_layers: required(hf.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            // transformers: absent means plain multi-head attention.
            num_key_value_heads: hf.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(HF_DEFAULT_RMS_NORM_EPS),
            rope_theta: rope_theta.unwrap_or(HF_DEFAULT_ROPE_THETA),
            max_position_embeddings: hf
                .max_position_embeddings
                .unwrap_or(HF_DEFAULT_MAX_POSITION_EMBEDDINGS),
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }

    /// Check the invariants the model relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(invalid(field, value, "must be positive"));
            }
        }
        let bounded = [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, MAX_HIDDEN),
            (
                "intermediate_size",
                self.intermediate_size,
                MAX_INTERMEDIATE,
            ),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_key_value_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HIDDEN),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_CONTEXT,
            ),
        ];
        for (field, value, max) in bounded {
            if value > max {
                return Err(ConfigError::TooLarge { field, value, max });
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(invalid(
                "num_key_value_heads",
                self.num_key_value_heads,
                "must divide num_attention_heads",
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(invalid(
                "head_dim",
                self.head_dim,
                "rotary embedding needs an even head_dim",
            ));
        }
        if self.head_dim * self.num_attention_heads != self.hidden_size {
            return Err(invalid(
                "head_dim",
                self.head_dim,
                "head_dim * num_attention_heads must equal hidden_size",
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                self.rms_norm_eps,
                "must be finite and positive",
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(invalid(
                "rope_theta",
                self.rope_theta,
                "must be finite and greater than 1",
            ));
        }
        Ok(())
    }
}

fn required(value: Option<usize>, field: &'static str) -> Result<usize, ConfigError> {
    value.ok_or(ConfigError::MissingField { field })
}

fn invalid(field: &'static str, value: impl ToString, reason: &'static str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.to_string(),
        reason,
    }
}

/// Only plain RoPE is implemented; YaRN, linear, dynamic scaling etc. are refused rather
/// than silently computed wrong.
fn check_default_rope(field: &'static str, value: &serde_json::Value) -> Result<(), ConfigError> {
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(|v| v.as_str());
    match kind {
        None | Some("default") => Ok(()),
        Some(_) => Err(ConfigError::Unsupported {
            field,
            value: value.to_string(),
        }),
    }
}
