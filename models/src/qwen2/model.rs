//! The Qwen2 decoder.
//!
//! Field names are chosen so Burn's module paths are the Hugging Face tensor names
//! (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`, ...): a record written from
//! HF safetensors loads with no key remapping. Every `Linear` uses
//! [`LinearLayout::Col`], so its stored parameter is `[out, in]` like the HF / GGUF tensor
//! and the `[in, out]` view the matmul wants is a zero-copy transpose.

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Initializer, LinearConfig, LinearLayout};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_mapped::manifest::TensorFormat;

use super::cache::KvCache;
use super::config::{ConfigError, Qwen2Config};
use super::projection::{BlockLinear, Projection, Q8Linear};
use super::rope::RopeTables;
use super::vocab::{VocabBlocks, VocabBlocksError, VocabEmbed};

/// Qwen2 decoder with its language-model head.
#[derive(Module, Debug)]
pub struct Qwen2ForCausalLM {
    pub model: Qwen2Model,
    /// Absent when the config ties the head to `model.embed_tokens`.
    pub lm_head: Option<Projection>,
}

/// Embedding, decoder layers and final norm (HF `Qwen2Model`).
#[derive(Module, Debug)]
pub struct Qwen2Model {
    pub embed_tokens: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    rope_theta: f64,
    /// When set, the embedding and head read these blocks, and `embed_tokens` (and a separate
    /// `lm_head`) are never read: see [`Qwen2ForCausalLM::with_vocab_blocks`].
    #[module(skip)]
    blocks: Option<VocabBlocks>,
    /// Whether a single sequence on Flex runs through [`host_step`] (on by default).
    host_step: bool,
    /// Whether greedy generation on a CubeCL device runs as the device step (on by default).
    device_step: bool,
}

/// One pre-norm transformer block.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub input_layernorm: RmsNorm,
    pub post_attention_layernorm: RmsNorm,
}

/// Grouped-query self-attention; q/k/v have biases, the output projection has none.
#[derive(Module, Debug)]
pub struct Attention {
    pub q_proj: Projection,
    pub k_proj: Projection,
    pub v_proj: Projection,
    pub o_proj: Projection,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp {
    pub gate_proj: Projection,
    pub up_proj: Projection,
    pub down_proj: Projection,
}

/// RMS normalization with its scale named `weight` (burn-nn's `RmsNorm` calls it `gamma`,
/// which would not match the HF tensor name).
#[derive(Module, Debug)]
pub struct RmsNorm {
    pub weight: Param<Tensor<1>>,
    eps: f64,
}

/// Why a forward pass was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("input has no tokens (shape [{batch}, {seq}])")]
    EmptyInput { batch: usize, seq: usize },
    #[error("input batch {found} does not match the cache's batch {expected}")]
    BatchMismatch { expected: usize, found: usize },
    #[error("cache holds {cached} positions of {capacity}; {requested} more do not fit")]
    CacheFull {
        cached: usize,
        requested: usize,
        capacity: usize,
    },
    #[error("cache was made for {cache_layers} layers, the model has {model_layers}")]
    CacheLayerMismatch {
        cache_layers: usize,
        model_layers: usize,
    },
    #[error("token id {token} at [{batch}, {position}] is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange {
        token: i64,
        batch: usize,
        position: usize,
        vocab_size: usize,
    },
    #[error("cannot read the token ids back from the device: {0}")]
    ReadTokens(String),
}

impl Qwen2Config {
    /// Build the model. Parameters are lazy: no initializer runs unless a parameter is read
    /// before a record is loaded over it.
    ///
    /// # Panics
    ///
    /// If [`validate`](Self::validate) fails; use [`try_init`](Self::try_init) to get the
    /// error instead.
    pub fn init(&self, device: &Device) -> Qwen2ForCausalLM {
        self.try_init(device)
            .unwrap_or_else(|e| panic!("invalid Qwen2Config: {e}"))
    }

    /// Build the model after validating the config; every projection is float.
    pub fn try_init(&self, device: &Device) -> Result<Qwen2ForCausalLM, ConfigError> {
        self.try_init_with(device, |_| TensorFormat::Float)
    }

    /// Build the model with each projection as its store holds it: a [`Q8Linear`] when the
    /// manifest's `<path>.weight` carries a `q8-row-f16` link (for example
    /// `model.layers.0.mlp.up_proj.weight`), a [`BlockLinear`] when it holds GGUF blocks, a
    /// float `Linear` otherwise.
    pub fn try_init_for_store(
        &self,
        device: &Device,
        manifest: &burn_mapped::Manifest,
    ) -> Result<Qwen2ForCausalLM, ConfigError> {
        self.try_init_with(device, |path| {
            manifest
                .get(&format!("{path}.weight"))
                .map_or(TensorFormat::Float, burn_mapped::TensorEntry::format)
        })
    }

    /// Build the model, asking `kind(path)` for each projection (`path` is its module path,
    /// `model.layers.3.self_attn.q_proj` or `lm_head`) how its weight is stored. Embeddings and
    /// norms are always float.
    pub fn try_init_with(
        &self,
        device: &Device,
        kind: impl Fn(&str) -> TensorFormat,
    ) -> Result<Qwen2ForCausalLM, ConfigError> {
        self.validate()?;
        let linear = |path: String, d_in: usize, d_out: usize, bias: bool| match kind(&path) {
            TensorFormat::Q8 => Projection::Q8(Q8Linear::new_lazy(d_in, d_out, bias, device)),
            TensorFormat::Blocks(layout) => {
                Projection::Blocks(BlockLinear::new_lazy(layout, d_out, bias, device))
            }
            TensorFormat::Float => Projection::Float(
                LinearConfig::new(d_in, d_out)
                    .with_bias(bias)
                    .with_layout(LinearLayout::Col)
                    .init(device),
            ),
        };
        let norm = |d: usize| RmsNorm {
            weight: Initializer::Ones.init([d], device),
            eps: self.rms_norm_eps,
        };
        let attn = |i: usize, name: &str| format!("model.layers.{i}.self_attn.{name}");
        let mlp = |i: usize, name: &str| format!("model.layers.{i}.mlp.{name}");
        let (h, kv, d) = (
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
        );
        let layers = (0..self.num_hidden_layers)
            .map(|i| DecoderLayer {
                self_attn: Attention {
                    q_proj: linear(attn(i, "q_proj"), self.hidden_size, h * d, true),
                    k_proj: linear(attn(i, "k_proj"), self.hidden_size, kv * d, true),
                    v_proj: linear(attn(i, "v_proj"), self.hidden_size, kv * d, true),
                    o_proj: linear(attn(i, "o_proj"), h * d, self.hidden_size, false),
                    num_heads: h,
                    num_kv_heads: kv,
                    head_dim: d,
                },
                mlp: Mlp {
                    gate_proj: linear(
                        mlp(i, "gate_proj"),
                        self.hidden_size,
                        self.intermediate_size,
                        false,
                    ),
                    up_proj: linear(
                        mlp(i, "up_proj"),
                        self.hidden_size,
                        self.intermediate_size,
                        false,
                    ),
                    down_proj: linear(
                        mlp(i, "down_proj"),
                        self.intermediate_size,
                        self.hidden_size,
                        false,
                    ),
                },
                input_layernorm: norm(self.hidden_size),
                post_attention_layernorm: norm(self.hidden_size),
            })
            .collect();
        Ok(Qwen2ForCausalLM {
            model: Qwen2Model {
                embed_tokens: EmbeddingConfig::new(self.vocab_size, self.hidden_size).init(device),
                layers,
                norm: norm(self.hidden_size),
                rope_theta: self.rope_theta,
                blocks: None,
                host_step: true,
                device_step: true,
            },
            lm_head: (!self.tie_word_embeddings).then(|| {
                linear(
                    "lm_head".to_string(),
                    self.hidden_size,
                    self.vocab_size,
                    false,
                )
            }),
        })
    }
}

impl Qwen2ForCausalLM {
    /// A cache for `batch` sequences of up to `capacity` positions.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> KvCache {
        KvCache::new(self.model.layers.len(), batch, capacity)
    }

    /// Whether a weight holds a GGUF's blocks: on the CPU the host products read them, on a
    /// GPU only the device step ([`DeviceDecoder`](super::DeviceDecoder)) does, so tensor ops
    /// cannot run such a model there.
    pub fn has_blocks(&self) -> bool {
        let embed = self
            .model
            .blocks
            .as_ref()
            .is_some_and(|b| matches!(b.embed, VocabEmbed::Quantized(_)));
        embed
            || self.lm_head.as_ref().is_some_and(Projection::is_blocks)
            || self.model.layers.iter().any(|l| {
                let (a, m) = (&l.self_attn, &l.mlp);
                [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                    .into_iter()
                    .chain([&m.gate_proj, &m.up_proj, &m.down_proj])
                    .any(Projection::is_blocks)
            })
    }

    /// Vocabulary size (rows of the embedding).
    pub fn vocab_size(&self) -> usize {
        self.model.embed_tokens.weight.lazy_shape().dims::<2>()[0]
    }

    /// This model with its embedding and LM head read from row blocks, for devices that
    /// cannot bind a vocabulary-sized matrix whole. `model.embed_tokens.weight` (and
    /// `lm_head`, when separate) are then never read: leave them lazy, and they stay
    /// unallocated. The blocks are outside the module tree (not visited, recorded or moved by
    /// `to_device`); they are already where they will be used.
    ///
    /// # Errors
    ///
    /// When the blocks do not cover the vocabulary exactly, have another hidden size, or give a
    /// head where the model ties it to the embedding (or the reverse).
    pub fn with_vocab_blocks(mut self, blocks: VocabBlocks) -> Result<Self, VocabBlocksError> {
        let [vocab, hidden] = self.model.embed_tokens.weight.lazy_shape().dims::<2>();
        blocks.check(vocab, hidden, self.lm_head.is_none())?;
        self.model.blocks = Some(blocks);
        Ok(self)
    }

    /// This model with the host step on or off. On (the default), one sequence whose `f32`
    /// parameters are on Flex runs each layer over host buffers, with products, RoPE, the
    /// cache write and attention outside Burn's op-by-op dispatch; off, every forward runs as
    /// tensor ops, as it does on other backends and for batches. Both compute the same
    /// function.
    pub fn with_host_step(mut self, enabled: bool) -> Self {
        self.model.host_step = enabled;
        self
    }

    /// This model with generation's device step on or off. On (the default),
    /// [`generate`](Self::generate) of a q8 model on a CubeCL device runs each token as one
    /// recorded graph of the step's own kernels, with the choice (greedy or top-p) made on the
    /// device; off, it runs as tensor ops. Both compute the same function.
    pub fn with_device_step(mut self, enabled: bool) -> Self {
        self.model.device_step = enabled;
        self
    }

    /// Whether generation may take the device step.
    #[cfg(feature = "cubecl")]
    pub(crate) fn device_step(&self) -> bool {
        self.model.device_step
    }

    /// Logits `[batch, seq, vocab]` for every input position. `tokens` (`[batch, seq]`)
    /// continue the sequences held in `cache`, which advances by `seq`.
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut KvCache,
    ) -> Result<Tensor<3>, ForwardError> {
        let hidden = self.model.forward(tokens, cache)?;
        Ok(self.head(hidden))
    }

    /// Logits `[batch, vocab]` of the last input position only: what decoding needs, without
    /// projecting every prompt position onto the vocabulary.
    pub fn forward_last(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut KvCache,
    ) -> Result<Tensor<2>, ForwardError> {
        let hidden = self.model.forward(tokens, cache)?;
        let [batch, seq, _] = hidden.dims();
        let logits = self.head(hidden.narrow(1, seq - 1, 1));
        let vocab = logits.dims()[2];
        Ok(logits.reshape([batch, vocab]))
    }

    fn head(&self, hidden: Tensor<3>) -> Tensor<3> {
        if let Some(blocks) = self
            .model
            .blocks
            .as_ref()
            .filter(|b| b.head.is_some() || self.lm_head.is_none())
        {
            let [batch, seq, hidden_size] = hidden.dims();
            let logits = blocks.logits(hidden.reshape([batch * seq, hidden_size]));
            let vocab = logits.dims()[1];
            return logits.reshape([batch, seq, vocab]);
        }
        match &self.lm_head {
            Some(head) => project(head, hidden),
            // `[vocab, hidden]` transposed is a view; no copy of the embedding.
            None => {
                let [batch, seq, hidden_size] = hidden.dims();
                let logits = burn::tensor::module::linear(
                    hidden.reshape([batch * seq, hidden_size]),
                    self.model.embed_tokens.weight.val().transpose(),
                    None,
                );
                let vocab = logits.dims()[1];
                logits.reshape([batch, seq, vocab])
            }
        }
    }
}

impl Qwen2Model {
    /// Final-normed hidden states `[batch, seq, hidden]`.
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut KvCache,
    ) -> Result<Tensor<3>, ForwardError> {
        let [batch, seq] = tokens.dims();
        let ids = self.check_input(&tokens, cache)?;
        let start = cache.len();
        let device = tokens.device();
        if let Some(hidden) = self.host_forward(&ids, batch, cache) {
            return Ok(hidden);
        }

        let mut x = match &self.blocks {
            Some(blocks) => {
                let rows = blocks.lookup(&ids, &device);
                let hidden = rows.dims()[1];
                rows.reshape([batch, seq, hidden])
            }
            None => self.embed_tokens.forward(tokens),
        };
        let rope = RopeTables::new(
            self.rope_theta,
            self.layers[0].self_attn.head_dim,
            start,
            seq,
            x.dtype(),
            &device,
        );
        // One query sees every cached key; only a multi-token chunk needs a causal mask.
        let mask = (seq > 1).then(|| causal_mask(start, seq, x.dtype(), &device));
        for (index, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x, &rope, mask.as_ref(), cache, index);
        }
        cache.advance(seq);
        Ok(self.norm.forward(x))
    }

    /// The vocabulary blocks that replace the embedding and head, if any.
    pub(crate) fn vocab_blocks(&self) -> Option<&VocabBlocks> {
        self.blocks.as_ref()
    }

    pub(crate) fn rope_theta(&self) -> f64 {
        self.rope_theta
    }

    /// Whether the model was built to take the host step where it can.
    pub(super) fn host_step_on(&self) -> bool {
        self.host_step
    }

    /// The token ids, row-major, once they are known to fit the cache and the vocabulary.
    fn check_input(
        &self,
        tokens: &Tensor<2, Int>,
        cache: &KvCache,
    ) -> Result<Vec<i64>, ForwardError> {
        let [batch, seq] = tokens.dims();
        if batch == 0 || seq == 0 {
            return Err(ForwardError::EmptyInput { batch, seq });
        }
        if cache.num_layers() != self.layers.len() {
            return Err(ForwardError::CacheLayerMismatch {
                cache_layers: cache.num_layers(),
                model_layers: self.layers.len(),
            });
        }
        if batch != cache.batch() {
            return Err(ForwardError::BatchMismatch {
                expected: cache.batch(),
                found: batch,
            });
        }
        if cache.len() + seq > cache.capacity() {
            return Err(ForwardError::CacheFull {
                cached: cache.len(),
                requested: seq,
                capacity: cache.capacity(),
            });
        }
        // The embedding lookup does not bound-check ids, so check them here: a few
        // integers read back per call.
        let ids = tokens
            .clone()
            .try_into_vec_as::<i64>()
            .map_err(|e| ForwardError::ReadTokens(e.to_string()))?;
        let vocab_size = self.embed_tokens.weight.lazy_shape().dims::<2>()[0];
        if let Some((i, &token)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &t)| t < 0 || t as u64 >= vocab_size as u64)
        {
            return Err(ForwardError::TokenOutOfRange {
                token,
                batch: i / seq,
                position: cache.len() + i % seq,
                vocab_size,
            });
        }
        Ok(ids)
    }
}

/// Additive mask `[1, 1, 1, seq, start + seq]`: query `i` (absolute position `start + i`)
/// may see keys `0..=start + i`.
fn causal_mask(start: usize, seq: usize, dtype: DType, device: &Device) -> Tensor<5> {
    let total = start + seq;
    let values: Vec<f32> = (0..seq)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j > start + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    let mask = Tensor::<5>::from_data(
        TensorData::new(values, [1, 1, 1, seq, total]),
        (device, DType::F32),
    );
    if dtype == DType::F32 {
        mask
    } else {
        mask.cast(dtype)
    }
}

impl DecoderLayer {
    fn forward(
        &self,
        x: Tensor<3>,
        rope: &RopeTables,
        mask: Option<&Tensor<5>>,
        cache: &mut KvCache,
        index: usize,
    ) -> Tensor<3> {
        let h = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), rope, mask, cache, index);
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}

impl Attention {
    fn forward(
        &self,
        x: Tensor<3>,
        rope: &RopeTables,
        mask: Option<&Tensor<5>>,
        cache: &mut KvCache,
        index: usize,
    ) -> Tensor<3> {
        let [batch, seq, _] = x.dims();
        let (heads, kv_heads, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let rep = heads / kv_heads;

        let [q, k, v] = project_shared([&self.q_proj, &self.k_proj, &self.v_proj], x);
        let q = q.reshape([batch, seq, heads, d]);
        let k = k.reshape([batch, seq, kv_heads, d]);
        let v = v.reshape([batch, seq, kv_heads, d]);
        let q = rope.apply(q);
        let k = rope.apply(k);

        // [batch, kv_heads, cached + seq, d]
        let (k_all, v_all) = cache.append(index, k.swap_dims(1, 2), v.swap_dims(1, 2));
        let total = k_all.dims()[2];

        // Query head `g * rep + r` uses key/value head `g` (HF `repeat_kv`). Instead of
        // repeating K and V `rep` times, fold the `rep` query heads of a group into the row
        // axis, so one [rep * seq, d] x [d, total] product per group reads the cache once.
        let q = q
            .reshape([batch, seq, kv_heads, rep, d])
            .permute([0, 2, 3, 1, 4])
            .reshape([batch, kv_heads, rep * seq, d]);
        let scores = q
            .matmul(k_all.swap_dims(2, 3))
            .mul_scalar(1.0 / (d as f64).sqrt());
        let scores = match mask {
            Some(mask) => (scores.reshape([batch, kv_heads, rep, seq, total]) + mask.clone())
                .reshape([batch, kv_heads, rep * seq, total]),
            None => scores,
        };
        // Softmax in f32 whatever the weights' dtype, as transformers does.
        let dtype = scores.dtype();
        let probs = if dtype == DType::F32 {
            softmax(scores, 3)
        } else {
            softmax(scores.cast(DType::F32), 3).cast(dtype)
        };
        let out = probs
            .matmul(v_all)
            .reshape([batch, kv_heads, rep, seq, d])
            .permute([0, 3, 1, 2, 4])
            .reshape([batch, seq, heads * d]);
        project(&self.o_proj, out)
    }
}

impl Attention {
    pub(crate) fn num_heads(&self) -> usize {
        self.num_heads
    }

    pub(crate) fn num_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    pub(crate) fn head_dim(&self) -> usize {
        self.head_dim
    }
}

impl Mlp {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [gate, up] = project_shared([&self.gate_proj, &self.up_proj], x);
        project(&self.down_proj, silu(gate) * up)
    }
}

impl RmsNorm {
    pub(crate) fn eps(&self) -> f64 {
        self.eps
    }

    /// `weight * (x / sqrt(mean(x^2) + eps))`, the statistics in f32 (HF `Qwen2RMSNorm`).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        let x32 = if dtype == DType::F32 {
            x
        } else {
            x.cast(DType::F32)
        };
        let inv_rms = x32
            .clone()
            .square()
            .mean_dim(D - 1)
            .add_scalar(self.eps)
            .sqrt()
            .recip();
        let normed = x32 * inv_rms;
        let normed = if dtype == DType::F32 {
            normed
        } else {
            normed.cast(dtype)
        };
        normed * self.weight.val().unsqueeze()
    }
}

/// Applies `layer` to `[batch, seq, in]` as one `[batch * seq, in]` product.
///
/// The `[out, in]` (`Col`) weight is a transposed view; Burn's linear on a 3-D input reshapes
/// the weight to 3-D, and reshaping a transposed view makes Flex copy it into a contiguous
/// buffer on every call: a per-use copy of every weight, every token. A 2-D product hands
/// the strided view straight to the GEMM, which reads the adopted pages in place.
/// `layers` on the same `x`, q8 layers sharing one prepared input ([`Projection::forward_shared`]).
fn project_shared<const N: usize>(layers: [&Projection; N], x: Tensor<3>) -> [Tensor<3>; N] {
    let [batch, seq, d_in] = x.dims();
    Projection::forward_shared(layers, x.reshape([batch * seq, d_in])).map(|y| {
        let d_out = y.dims()[1];
        y.reshape([batch, seq, d_out])
    })
}

fn project(layer: &Projection, x: Tensor<3>) -> Tensor<3> {
    let [batch, seq, d_in] = x.dims();
    let y = layer.forward(x.reshape([batch * seq, d_in]));
    let d_out = y.dims()[1];
    y.reshape([batch, seq, d_out])
}
