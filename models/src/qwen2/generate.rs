//! The decoding loop: prompt in, tokens out, through the device step where the model takes
//! it (the one place that decides), else through the model's forward pass.

use std::ops::ControlFlow;

use burn::tensor::{Int, Tensor, TensorData};

use super::model::{ForwardError, Qwen2ForCausalLM};
use super::sampling::{Sampler, SamplingError};

/// Why generation stopped early.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("prompt is empty")]
    EmptyPrompt,
    #[error(transparent)]
    Forward(#[from] ForwardError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("cannot read logits back from the device: {0}")]
    ReadLogits(String),
    #[error(
        "a cache for {positions} positions needs {} MiB of keys and values, more than this machine's {} MiB of memory; ask for fewer tokens",
        bytes >> 20,
        memory >> 20
    )]
    CacheTooLarge {
        positions: usize,
        bytes: u64,
        memory: u64,
    },
    #[cfg(feature = "cubecl")]
    #[error(transparent)]
    Device(#[from] super::DeviceStepError),
}

impl Qwen2ForCausalLM {
    /// Bytes of the f32 keys and values for `positions` positions of one sequence; saturates
    /// rather than wrapping.
    pub fn kv_cache_bytes(&self, positions: usize) -> u64 {
        let per_position: u64 = self
            .model
            .layers
            .iter()
            .map(|l| 2 * (l.self_attn.num_kv_heads() * l.self_attn.head_dim()) as u64 * 4)
            .sum();
        per_position.saturating_mul(positions as u64)
    }

    /// Refuses a cache of `positions` positions larger than the machine's memory, before
    /// anything is allocated (an allocation that fails aborts the process).
    ///
    /// # Errors
    /// [`GenerateError::CacheTooLarge`].
    pub fn check_cache(&self, positions: usize) -> Result<(), GenerateError> {
        let bytes = self.kv_cache_bytes(positions);
        match burn_mapped::host::memstat::physical_memory() {
            Ok(memory) if bytes > memory => Err(GenerateError::CacheTooLarge {
                positions,
                bytes,
                memory,
            }),
            _ => Ok(()),
        }
    }

    /// Continue `prompt` by up to `max_new_tokens` tokens, calling `on_token` with each new
    /// id as soon as it is chosen. Stops after emitting any id in `stop_tokens` (that id is
    /// included). Returns the new ids.
    pub fn generate_with(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        stop_tokens: &[u32],
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, GenerateError> {
        self.generate_until(prompt, max_new_tokens, sampler, stop_tokens, |id| {
            on_token(id);
            ControlFlow::Continue(())
        })
    }

    /// [`generate_with`](Self::generate_with) whose callback can end the generation early
    /// (an interrupted run keeps the tokens chosen so far): returning `Break` stops after
    /// that token.
    pub fn generate_until(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        stop_tokens: &[u32],
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if max_new_tokens == 0 {
            return Ok(Vec::new());
        }
        self.check_cache(prompt.len().saturating_add(max_new_tokens - 1))?;
        let mut generated = Vec::with_capacity(max_new_tokens.min(1 << 16));
        #[cfg(feature = "cubecl")]
        if self.device_step() {
            let capacity = prompt.len() + max_new_tokens - 1;
            if let Some(mut decoder) = super::DeviceDecoder::new(self, capacity) {
                return Ok(decoder.generate_until(
                    prompt,
                    max_new_tokens,
                    sampler,
                    stop_tokens,
                    on_token,
                )?);
            }
        }
        let device = self.model.embed_tokens.weight.lazy_device();
        // The last chosen token is never fed back, hence `- 1`.
        let mut cache = self.new_cache(1, prompt.len() + max_new_tokens - 1);
        let mut input = prompt.to_vec();
        loop {
            let len = input.len();
            let tokens = Tensor::<2, Int>::from_data(
                TensorData::new(input.iter().map(|&t| t as i64).collect(), [1, len]),
                &device,
            );
            let logits = self
                .forward_last(tokens, &mut cache)?
                .try_into_vec_as::<f32>()
                .map_err(|e| GenerateError::ReadLogits(e.to_string()))?;
            let next = sampler.sample(&logits)?;
            generated.push(next);
            let flow = on_token(next);
            if generated.len() == max_new_tokens || stop_tokens.contains(&next) || flow.is_break() {
                return Ok(generated);
            }
            input.clear();
            input.push(next);
        }
    }

    /// [`generate_with`](Self::generate_with) without a callback.
    pub fn generate(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        stop_tokens: &[u32],
    ) -> Result<Vec<u32>, GenerateError> {
        self.generate_with(prompt, max_new_tokens, sampler, stop_tokens, |_| {})
    }
}
