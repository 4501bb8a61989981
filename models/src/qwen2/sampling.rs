//! Choosing the next token from a row of logits, and the decoding loop.
//!
//! Sampling runs on the host over one `f32` row per step. Randomness comes from a
//! SplitMix64 generator owned by the [`Sampler`], so a seed gives the same tokens on every
//! platform and backend (given the same logits).

use std::ops::ControlFlow;

use burn::tensor::{Int, Tensor, TensorData};

use super::model::{ForwardError, Qwen2ForCausalLM};

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The highest logit; the lowest id among equal maxima.
    Greedy,
    /// Nucleus sampling: softmax of `logits / temperature`, restricted to the smallest set
    /// of most likely tokens whose probability reaches `top_p`, renormalized.
    TopP {
        temperature: f64,
        top_p: f64,
        seed: u64,
    },
}

/// Why a sampler could not be built or could not pick a token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature {0} must be finite and positive")]
    InvalidTemperature(f64),
    #[error("top_p {0} must be in (0, 1]")]
    InvalidTopP(f64),
    #[error("logits row is empty")]
    EmptyLogits,
    #[error("logit {value} at index {index} is not finite")]
    NonFiniteLogit { index: usize, value: f32 },
}

/// A [`Sampling`] rule plus the state it needs (the random generator).
#[derive(Debug, Clone)]
pub struct Sampler {
    rule: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    /// Validate `rule` and seed its generator.
    pub fn new(rule: Sampling) -> Result<Self, SamplingError> {
        let seed = match rule {
            Sampling::Greedy => 0,
            Sampling::TopP {
                temperature,
                top_p,
                seed,
            } => {
                if !(temperature.is_finite() && temperature > 0.0) {
                    return Err(SamplingError::InvalidTemperature(temperature));
                }
                if !(top_p > 0.0 && top_p <= 1.0) {
                    return Err(SamplingError::InvalidTopP(top_p));
                }
                seed
            }
        };
        Ok(Self {
            rule,
            rng: SplitMix64(seed),
        })
    }

    pub fn greedy() -> Self {
        Self {
            rule: Sampling::Greedy,
            rng: SplitMix64(0),
        }
    }

    pub fn rule(&self) -> Sampling {
        self.rule
    }

    /// Pick a token id from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        check_finite(logits)?;
        match self.rule {
            Sampling::Greedy => Ok(argmax_unchecked(logits)),
            Sampling::TopP {
                temperature, top_p, ..
            } => Ok(self.sample_top_p(logits, temperature, top_p)),
        }
    }

    fn sample_top_p(&mut self, logits: &[f32], temperature: f64, top_p: f64) -> u32 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        // Unnormalized probabilities; the largest is exactly 1.
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| ((l as f64 - max) / temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        // Descending weight, ties by lower id, so the first entry is the greedy choice.
        order.sort_unstable_by(|&a, &b| {
            weights[b as usize]
                .total_cmp(&weights[a as usize])
                .then(a.cmp(&b))
        });
        let threshold = top_p * total;
        let mut kept = 0.0;
        let mut nucleus = 0;
        for &id in &order {
            kept += weights[id as usize];
            nucleus += 1;
            if kept >= threshold {
                break;
            }
        }
        // The draw walks the nucleus in id order, as the device step's sampler does (it does
        // not sort): one seed then gives both paths the same tokens.
        let members = &mut order[..nucleus];
        members.sort_unstable();
        let mut target = self.rng.next_f64() * kept;
        for &id in members.iter() {
            target -= weights[id as usize];
            if target < 0.0 {
                return id;
            }
        }
        // Rounding left `target` at or just above zero: the last kept token.
        members[nucleus - 1]
    }

    /// The next draw in `[0, 1)` of this sampler's stream: what [`sample`](Self::sample)
    /// would use for its next token, for a sampler that runs elsewhere (the device step).
    #[cfg(feature = "wgpu")]
    pub(super) fn draw(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

/// Index of the largest logit, the lowest index among equal maxima (as `torch.argmax`).
pub fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    check_finite(logits)?;
    Ok(argmax_unchecked(logits))
}

fn argmax_unchecked(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn check_finite(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    match logits.iter().position(|l| !l.is_finite()) {
        Some(index) => Err(SamplingError::NonFiniteLogit {
            index,
            value: logits[index],
        }),
        None => Ok(()),
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, full-period, and fixed forever, unlike a
/// library generator whose stream could change with a version bump.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

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
    #[cfg(feature = "wgpu")]
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
        match burn_mapped::memstat::physical_memory() {
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
        #[cfg(feature = "wgpu")]
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

#[cfg(test)]
mod tests {
    // Unit tests here because the generator is private: pin its stream to the published
    // SplitMix64 reference values (seed 1234567), so a change to it cannot go unnoticed.
    use super::SplitMix64;

    #[test]
    fn splitmix64_matches_the_reference_stream() {
        let mut rng = SplitMix64(1234567);
        let got: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            got,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821
            ]
        );
    }
}
