//! Qwen2 / Qwen2.5 decoder-only language model (Hugging Face `Qwen2ForCausalLM`).

mod cache;
mod config;
#[cfg(feature = "cubecl")]
mod device_step;
mod generate;
mod gguf_names;
mod host_attention;
mod host_step;
pub mod load;
mod model;
mod projection;
mod rope;
mod sampling;
mod vocab;

pub use cache::KvCache;
pub use config::{
    ConfigError, MAX_CONTEXT, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB,
    Qwen2Config,
};
#[cfg(feature = "cubecl")]
pub use device_step::{DeviceBytes, DeviceDecoder, DeviceStepError, DeviceStepRefused};
pub use generate::GenerateError;
pub use gguf_names::{config_from_gguf, config_from_manifest, hf_name};
pub use model::{
    Attention, DecoderLayer, ForwardError, Mlp, Qwen2ForCausalLM, Qwen2Model, RmsNorm,
};
pub use projection::{BlockLinear, Projection, Q8Linear};
pub use sampling::{Sampler, Sampling, SamplingError, argmax};
pub use vocab::{VocabBlocks, VocabBlocksError, VocabEmbed};
