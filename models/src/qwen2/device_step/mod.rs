//! Greedy decoding of one sequence on a CubeCL device, each token one recorded graph.
//!
//! Through Burn's ops a decode step on a GPU is bound by the host: every op passes Burn's
//! dispatch, Fusion and CubeCL's launch path, and allocates its result, for a few microseconds
//! of device work each. This path keeps the step on the device. The activations, the key and
//! value cache, the token ids and the position live in buffers made once; the step is a fixed
//! sequence of launches (per layer, eight: the norm fused with its split, the q/k/v products
//! in one launch, attention with RoPE and the cache write, the o-projection adding the
//! residual, the norm, gate and up in one launch, SiLU·mul fused with its split, and the down
//! projection adding the residual)
//! whose kernels read the position from the device, so no launch argument changes between
//! tokens. The greedy choice runs on the device too and writes the next token's id where the
//! next step reads it: the host only reads ids back.
//!
//! That makes the step recordable: the first step runs as launches while CubeCL prepares a
//! capture, the second is recorded (`Client::start_capture`), and every later step replays the
//! recording. Where the runtime records no graph, the same launches run every step. Prompt
//! positions take the same step (its choice is not written where the prompt holds a token):
//! one graph serves prefill and decode. One step is always in flight ahead of the host's read
//! of the previous token.
//!
//! It takes a model whose projections and LM head are q8 with rows of whole dp4a blocks and
//! whose other parameters are `f32`, on a CubeCL device, its vocabulary matrices whole or in
//! row blocks (a lookup per embedding block, a product and a copy per head block); anything
//! else decodes through tensor ops.

mod kernels;
#[cfg(test)]
mod tests;

use burn::tensor::DType;
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use burn_mapped::q8::direct::{DirectWeight, Product, cube_float, product, products, split_words};
use cubecl::bytes::Bytes;
use cubecl::client::{Client, Graph};
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::model::{Qwen2ForCausalLM, RmsNorm};
use super::projection::Projection;
use super::rope;
use kernels::THREADS;

/// Why the device step stopped.
#[derive(Debug, thiserror::Error)]
pub enum DeviceStepError {
    /// The prompt was empty.
    #[error("the prompt has no tokens")]
    EmptyPrompt,
    /// The prompt and the new tokens do not fit the cache.
    #[error("{needed} positions do not fit the device cache of {capacity}")]
    CacheFull { needed: usize, capacity: usize },
    /// A prompt token is outside the vocabulary.
    #[error("prompt token {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    /// The device chose no token (every logit NaN).
    #[error("the device chose no token at position {position} (non-finite logits)")]
    NoChoice { position: usize },
    /// A launch, write or read failed on the device.
    #[error("device step: {0}")]
    Device(String),
}

fn device_error(e: impl std::fmt::Display) -> DeviceStepError {
    DeviceStepError::Device(e.to_string())
}

/// A layer's parameters as device buffers, and its cache.
struct Layer {
    in_norm: CubeTensor,
    post_norm: CubeTensor,
    q: DirectWeight,
    k: DirectWeight,
    v: DirectWeight,
    o: DirectWeight,
    gate: DirectWeight,
    up: DirectWeight,
    down: DirectWeight,
    q_bias: CubeTensor,
    k_bias: CubeTensor,
    v_bias: CubeTensor,
    kc: Handle,
    vc: Handle,
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    eps: f32,
    capacity: usize,
}

/// The step's activations and bookkeeping, made once.
struct Buffers {
    h0: Handle,
    h1: Handle,
    split_h: Handle,
    split_i: Handle,
    q: Handle,
    k: Handle,
    v: Handle,
    gate: Handle,
    up: Handle,
    logits: Handle,
    /// One head block's logits, before they are copied into `logits` (with several blocks).
    block_logits: Option<Handle>,
    /// Token ids by position: the prompt, then the choices; `capacity + 1` of them.
    ids: Handle,
    pos: Handle,
    prompt: Handle,
    cos: Handle,
    sin: Handle,
}

/// How a step runs: recorded once and replayed, or launched each time.
enum Mode {
    /// Not run yet: the next run prepares a capture and launches (the warm-up).
    Fresh,
    /// Warmed up: the next run records.
    Warm,
    Recorded(Graph),
    /// No graph on this runtime (or capture turned off): launch every time.
    Launch,
}

/// Greedy decoding of one sequence on a CubeCL device (see the module documentation).
pub struct DeviceDecoder {
    client: Client,
    layers: Vec<Layer>,
    /// Embedding rows and the LM head, each as consecutive vocabulary blocks (one block where
    /// the device binds the whole matrix): `(rows, first row)`.
    embed: Vec<(CubeTensor, usize)>,
    norm: CubeTensor,
    head: Vec<(DirectWeight, usize)>,
    dims: Dims,
    buf: Buffers,
    mode: Mode,
    /// Launches per step (for reports).
    launches: usize,
    /// Host time spent enqueuing the steps that generated tokens, and how many.
    host: std::time::Duration,
    chosen: usize,
}

fn f32_param(t: &burn::tensor::Tensor<1>) -> Option<CubeTensor> {
    (t.dtype() == DType::F32).then(|| cube_float(t)).flatten()
}

fn q8(p: &Projection) -> Option<(DirectWeight, Option<CubeTensor>)> {
    let Projection::Q8(l) = p else { return None };
    let weight = DirectWeight::new(&l.q8_weight().ok()?)?;
    let bias = match &l.bias {
        Some(b) => Some(f32_param(&b.val())?),
        None => None,
    };
    Some((weight, bias))
}

fn f32_matrix(t: &burn::tensor::Tensor<2>) -> Option<CubeTensor> {
    (t.dtype() == DType::F32).then(|| cube_float(t)).flatten()
}

/// `blocks` with the first vocabulary row of each.
fn in_blocks<T>(blocks: Vec<T>, rows: impl Fn(&T) -> usize) -> Vec<(T, usize)> {
    let mut first = 0;
    blocks
        .into_iter()
        .map(|b| {
            let at = first;
            first += rows(&b);
            (b, at)
        })
        .collect()
}

fn norm(n: &RmsNorm) -> Option<CubeTensor> {
    f32_param(&n.weight.val())
}

impl DeviceDecoder {
    /// The decoder for `model` with room for `capacity` positions (prompt plus new tokens),
    /// or `None` where the model cannot take this path (see the module documentation).
    pub fn new(model: &Qwen2ForCausalLM, capacity: usize) -> Option<Self> {
        let m = &model.model;
        if capacity == 0 {
            return None;
        }
        let attn = &m.layers.first()?.self_attn;
        let (heads, kv_heads, head_dim) = (attn.num_heads(), attn.num_kv_heads(), attn.head_dim());
        let [vocab, hidden] = m.embed_tokens.weight.lazy_shape().dims::<2>();
        let (embed, head) = match m.vocab_blocks() {
            Some(blocks) => (
                blocks
                    .embed
                    .iter()
                    .map(f32_matrix)
                    .collect::<Option<Vec<_>>>()?,
                blocks
                    .head
                    .as_ref()?
                    .iter()
                    .map(q8)
                    .collect::<Option<Vec<_>>>()?,
            ),
            None => (
                vec![f32_matrix(&m.embed_tokens.weight.val())?],
                vec![q8(model.lm_head.as_ref()?)?],
            ),
        };
        let embed = in_blocks(embed, |t| t.meta.shape().dims::<2>()[0]);
        if head.iter().any(|(_, bias)| bias.is_some()) {
            return None;
        }
        let head = in_blocks(
            head.into_iter().map(|(w, _)| w).collect(),
            DirectWeight::out_features,
        );
        let layers = m
            .layers
            .iter()
            .map(|l| {
                let a = &l.self_attn;
                let (q, q_bias) = q8(&a.q_proj)?;
                let (k, k_bias) = q8(&a.k_proj)?;
                let (v, v_bias) = q8(&a.v_proj)?;
                let (o, o_bias) = q8(&a.o_proj)?;
                let (gate, g_bias) = q8(&l.mlp.gate_proj)?;
                let (up, u_bias) = q8(&l.mlp.up_proj)?;
                let (down, d_bias) = q8(&l.mlp.down_proj)?;
                if o_bias.is_some() || g_bias.is_some() || u_bias.is_some() || d_bias.is_some() {
                    return None;
                }
                Some((
                    norm(&l.input_layernorm)?,
                    norm(&l.post_attention_layernorm)?,
                    [q, k, v, o, gate, up, down],
                    [q_bias?, k_bias?, v_bias?],
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        let inter = layers[0].2[4].out_features();
        let dims = Dims {
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
            vocab,
            eps: m.layers[0].input_layernorm.eps() as f32,
            capacity,
        };
        let embed_rows: usize = embed
            .iter()
            .map(|(t, _)| t.meta.shape().dims::<2>()[0])
            .sum();
        let head_rows: usize = head.iter().map(|(w, _)| w.out_features()).sum();
        let shapes_fit = embed_rows == vocab
            && head_rows == vocab
            && embed
                .iter()
                .all(|(t, _)| t.meta.shape().dims::<2>()[1] == hidden)
            && head.iter().all(|(w, _)| w.in_features() == hidden)
            && heads * head_dim == hidden
            && heads.is_multiple_of(kv_heads)
            && head_dim.is_multiple_of(16)
            && head_dim <= THREADS
            && THREADS.is_multiple_of(head_dim)
            && layers.iter().all(|(_, _, w, _)| {
                let kv = kv_heads * head_dim;
                let dims = [
                    (hidden, hidden),
                    (kv, hidden),
                    (kv, hidden),
                    (hidden, hidden),
                    (inter, hidden),
                    (inter, hidden),
                    (hidden, inter),
                ];
                w.iter()
                    .zip(dims)
                    .all(|(w, (o, i))| w.out_features() == o && w.in_features() == i)
            });
        if !shapes_fit {
            return None;
        }
        let client = embed.first()?.0.client.clone();
        let widest = head
            .iter()
            .map(|(w, _)| w.out_features())
            .max()
            .unwrap_or(0);
        let f32s = |n: usize| client.empty(n * size_of::<f32>());
        let cache = kv_heads * capacity * head_dim;
        let layers = layers
            .into_iter()
            .map(|(in_norm, post_norm, w, b)| {
                let [q, k, v, o, gate, up, down] = w;
                let [q_bias, k_bias, v_bias] = b;
                Layer {
                    in_norm,
                    post_norm,
                    q,
                    k,
                    v,
                    o,
                    gate,
                    up,
                    down,
                    q_bias,
                    k_bias,
                    v_bias,
                    kc: f32s(cache),
                    vc: f32s(cache),
                }
            })
            .collect();
        let (cos, sin) = rope_tables(m.rope_theta(), head_dim, capacity);
        let buf = Buffers {
            h0: f32s(hidden),
            h1: f32s(hidden),
            split_h: f32s(split_words(1, hidden)),
            split_i: f32s(split_words(1, inter)),
            q: f32s(hidden),
            k: f32s(kv_heads * head_dim),
            v: f32s(kv_heads * head_dim),
            gate: f32s(inter),
            up: f32s(inter),
            logits: f32s(vocab),
            block_logits: (head.len() > 1).then(|| f32s(widest)),
            ids: f32s(capacity + 1),
            pos: f32s(1),
            prompt: f32s(1),
            cos: client.create_from_slice(f32::as_bytes(&cos)),
            sin: client.create_from_slice(f32::as_bytes(&sin)),
        };
        Some(Self {
            client,
            layers,
            embed,
            norm: norm(&m.norm)?,
            head,
            dims,
            buf,
            mode: Mode::Fresh,
            launches: 0,
            host: std::time::Duration::ZERO,
            chosen: 0,
        })
    }

    /// This decoder launching every step instead of recording it (the fallback where a runtime
    /// records no graph; the same kernels, so the same tokens).
    pub fn without_capture(mut self) -> Self {
        self.mode = Mode::Launch;
        self
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.dims.capacity
    }

    /// Kernel launches per step (0 before the first step).
    pub fn launches_per_token(&self) -> usize {
        self.launches
    }

    /// The host's mean time to enqueue a generating step (replay or launches): what the
    /// device step costs the host per token.
    pub fn host_time_per_token(&self) -> Option<std::time::Duration> {
        (self.chosen > 0).then(|| self.host / self.chosen as u32)
    }

    /// Whether the step replays a recorded graph.
    pub fn is_recorded(&self) -> bool {
        matches!(self.mode, Mode::Recorded(_))
    }

    /// The logits of the latest choosing step (what tests hold to a reference).
    ///
    /// # Errors
    ///
    /// [`DeviceStepError::Device`] when the read fails.
    pub fn logits(&self) -> Result<Vec<f32>, DeviceStepError> {
        let bytes = self
            .client
            .read_one(self.buf.logits.clone())
            .map_err(device_error)?;
        Ok(bytes
            .chunks_exact(4)
            .take(self.dims.vocab)
            .map(|b| f32::from_le_bytes(b.try_into().expect("four bytes")))
            .collect())
    }

    /// Greedy continuation of `prompt`: up to `max_new_tokens` ids, stopping after the first
    /// of `stop_tokens`; `on_token` sees each id as it is read back.
    ///
    /// # Errors
    ///
    /// [`DeviceStepError`]: an empty prompt, a token outside the vocabulary, too little cache,
    /// or a device failure.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        stop_tokens: &[u32],
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, DeviceStepError> {
        let n = prompt.len();
        if n == 0 {
            return Err(DeviceStepError::EmptyPrompt);
        }
        if let Some(&token) = prompt.iter().find(|&&t| t as usize >= self.dims.vocab) {
            return Err(DeviceStepError::TokenOutOfRange {
                token,
                vocab: self.dims.vocab,
            });
        }
        let mut generated = Vec::with_capacity(max_new_tokens);
        if max_new_tokens == 0 {
            return Ok(generated);
        }
        // Steps run at positions `0..n + max_new_tokens - 1`, plus the one in flight when the
        // last token is read.
        let steps = n + max_new_tokens - 1;
        if steps > self.dims.capacity {
            return Err(DeviceStepError::CacheFull {
                needed: steps,
                capacity: self.dims.capacity,
            });
        }
        let mut ids = vec![0u32; self.dims.capacity + 1];
        ids[..n].copy_from_slice(prompt);
        self.client.write(&self.buf.ids, Bytes::from_elems(ids));
        self.client.write(&self.buf.pos, u32_bytes(0));
        self.client.write(&self.buf.prompt, u32_bytes(n as u32));
        // The prompt's positions, then one step in flight ahead of each read.
        for _ in 0..n {
            self.step()?;
        }
        let client = self.client.clone();
        for position in n..n + max_new_tokens {
            let read = client.read_async(vec![self.buf.ids.clone()]);
            if position + 1 < n + max_new_tokens {
                let start = std::time::Instant::now();
                self.step()?;
                self.host += start.elapsed();
                self.chosen += 1;
            }
            let bytes = cubecl::future::block_on(read).map_err(device_error)?;
            let token = read_u32(&bytes[0], position);
            if token as usize >= self.dims.vocab {
                return Err(DeviceStepError::NoChoice { position });
            }
            generated.push(token);
            on_token(token);
            if stop_tokens.contains(&token) {
                break;
            }
        }
        // The step in flight past the last read is finished by the next read or drop; its
        // writes land beyond the positions returned.
        Ok(generated)
    }

    /// One step at the device's position.
    fn step(&mut self) -> Result<(), DeviceStepError> {
        match std::mem::replace(&mut self.mode, Mode::Launch) {
            Mode::Recorded(graph) => {
                // SAFETY: every buffer the graph reads or writes is owned by `self` (the
                // parameters through their tensors, the rest in `buf` and `layers`) and lives
                // as long as the graph, which `self` owns too; everything runs from this client
                // on its one stream, so writes and reads order against the replay.
                let replayed = unsafe { graph.replay() };
                self.mode = Mode::Recorded(graph);
                replayed.map_err(device_error)
            }
            Mode::Launch => self.launch().map(|_| ()),
            Mode::Fresh => {
                let prepared = self.client.graph_prepare().is_ok();
                self.launch()?;
                self.mode = if prepared { Mode::Warm } else { Mode::Launch };
                Ok(())
            }
            Mode::Warm => {
                if self.client.start_capture().is_err() {
                    // The window did not open; close the prepared capture and launch.
                    let _ = self.client.stop_capture();
                    self.launch()?;
                    return Ok(());
                }
                let launched = self.launch();
                let graph = self.client.stop_capture();
                launched?;
                let graph = graph.map_err(device_error)?;
                // Recording ran nothing: replay it for this step.
                // SAFETY: as for the replays above.
                unsafe { graph.replay() }.map_err(device_error)?;
                self.mode = Mode::Recorded(graph);
                Ok(())
            }
        }
    }

    /// Enqueues the step's launches; returns how many.
    fn launch(&mut self) -> Result<usize, DeviceStepError> {
        let d = self.dims;
        let b = &self.buf;
        let c = &self.client;
        let mut count = 0usize;
        let hidden_blocks = d.hidden / 16;
        // SAFETY (all launches below): every buffer was allocated in `new` with the length
        // bound here, in elements of the bound type; the kernels index within `hidden`,
        // `inter`, `vocab` and the cache's `kv_heads * capacity * head_dim`, and read the
        // position from `pos`, which the argmax kernel keeps at most `capacity` and the
        // attention kernel checks against it.
        for (rows, first) in &self.embed {
            let n = rows.meta.shape().dims::<2>()[0];
            unsafe {
                kernels::embed_kernel::launch_unchecked(
                    c,
                    CubeCount::Static(d.hidden.div_ceil(THREADS) as u32, 1, 1),
                    CubeDim::new_1d(THREADS as u32),
                    BufferArg::from_raw_parts(rows.handle.clone(), n * d.hidden),
                    BufferArg::from_raw_parts(b.ids.clone(), d.capacity + 1),
                    BufferArg::from_raw_parts(b.pos.clone(), 1),
                    BufferArg::from_raw_parts(b.h0.clone(), d.hidden),
                    d.hidden,
                    *first,
                    n,
                );
            }
            count += 1;
        }
        for l in &self.layers {
            rms_split(c, &b.h0, &l.in_norm, &b.split_h, d.hidden, d.eps);
            let qkv = [
                (&l.q, &l.q_bias, &b.q),
                (&l.k, &l.k_bias, &b.k),
                (&l.v, &l.v_bias, &b.v),
            ]
            .map(|(weight, bias, y)| Product {
                weight,
                bias: Some(&bias.handle),
                y,
            });
            products(&b.split_h, 1, &qkv).map_err(device_error)?;
            unsafe {
                kernels::attention_kernel::launch_unchecked(
                    c,
                    CubeCount::Static(d.heads as u32, 1, 1),
                    CubeDim::new_1d(THREADS as u32),
                    BufferArg::from_raw_parts(b.q.clone(), d.hidden),
                    BufferArg::from_raw_parts(b.k.clone(), d.kv_heads * d.head_dim),
                    BufferArg::from_raw_parts(b.v.clone(), d.kv_heads * d.head_dim),
                    BufferArg::from_raw_parts(b.cos.clone(), d.capacity * d.head_dim / 2),
                    BufferArg::from_raw_parts(b.sin.clone(), d.capacity * d.head_dim / 2),
                    BufferArg::from_raw_parts(b.pos.clone(), 1),
                    BufferArg::from_raw_parts(l.kc.clone(), d.kv_heads * d.capacity * d.head_dim),
                    BufferArg::from_raw_parts(l.vc.clone(), d.kv_heads * d.capacity * d.head_dim),
                    BufferArg::from_raw_parts(b.split_h.clone(), 2 * hidden_blocks),
                    BufferArg::from_raw_parts(b.split_h.clone(), 9 * hidden_blocks),
                    d.capacity,
                    1.0 / (d.head_dim as f32).sqrt(),
                    d.head_dim,
                    d.heads / d.kv_heads,
                    d.heads,
                );
            }
            product(&b.split_h, 1, &l.o, Some(&b.h0), &b.h1).map_err(device_error)?;
            rms_split(c, &b.h1, &l.post_norm, &b.split_h, d.hidden, d.eps);
            let gate_up = [(&l.gate, &b.gate), (&l.up, &b.up)].map(|(weight, y)| Product {
                weight,
                bias: None,
                y,
            });
            products(&b.split_h, 1, &gate_up).map_err(device_error)?;
            let inter_blocks = d.inter / 16;
            unsafe {
                kernels::silu_split_kernel::launch_unchecked(
                    c,
                    CubeCount::Static(inter_blocks.div_ceil(64) as u32, 1, 1),
                    CubeDim::new_1d(64),
                    BufferArg::from_raw_parts(b.gate.clone(), d.inter),
                    BufferArg::from_raw_parts(b.up.clone(), d.inter),
                    BufferArg::from_raw_parts(b.split_i.clone(), 2 * inter_blocks),
                    BufferArg::from_raw_parts(b.split_i.clone(), 9 * inter_blocks),
                    d.inter,
                );
            }
            product(&b.split_i, 1, &l.down, Some(&b.h1), &b.h0).map_err(device_error)?;
            count += 8;
        }
        rms_split(c, &b.h0, &self.norm, &b.split_h, d.hidden, d.eps);
        for (w, first) in &self.head {
            let Some(block) = &b.block_logits else {
                product(&b.split_h, 1, w, None, &b.logits).map_err(device_error)?;
                count += 1;
                continue;
            };
            product(&b.split_h, 1, w, None, block).map_err(device_error)?;
            let n = w.out_features();
            unsafe {
                kernels::copy_kernel::launch_unchecked(
                    c,
                    CubeCount::Static(n.div_ceil(THREADS) as u32, 1, 1),
                    CubeDim::new_1d(THREADS as u32),
                    BufferArg::from_raw_parts(block.clone(), n),
                    BufferArg::from_raw_parts(b.logits.clone(), d.vocab),
                    *first,
                    n,
                );
            }
            count += 2;
        }
        unsafe {
            kernels::argmax_kernel::launch_unchecked(
                c,
                CubeCount::Static(1, 1, 1),
                CubeDim::new_1d(THREADS as u32),
                BufferArg::from_raw_parts(b.logits.clone(), d.vocab),
                BufferArg::from_raw_parts(b.ids.clone(), d.capacity + 1),
                BufferArg::from_raw_parts(b.pos.clone(), 1),
                BufferArg::from_raw_parts(b.prompt.clone(), 1),
                d.vocab,
                d.capacity,
            );
        }
        count += 2;
        self.launches = count;
        Ok(count)
    }
}

/// RMSNorm of `x` by `w`, split into `out`.
fn rms_split(c: &Client, x: &Handle, w: &CubeTensor, out: &Handle, n: usize, eps: f32) {
    let blocks = n / 16;
    // SAFETY: `x` and `w` hold `n` f32, `out` a split of `n` values (`9 * n / 16` words).
    unsafe {
        kernels::rms_split_kernel::launch_unchecked(
            c,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(x.clone(), n),
            BufferArg::from_raw_parts(w.handle.clone(), n),
            BufferArg::from_raw_parts(out.clone(), 2 * blocks),
            BufferArg::from_raw_parts(out.clone(), 9 * blocks),
            n,
            eps,
        );
    }
}

/// `cos` and `sin` of every position's `head_dim / 2` angles, `[capacity, head_dim / 2]`.
fn rope_tables(theta: f64, head_dim: usize, capacity: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let mut cos = vec![0f32; capacity * half];
    let mut sin = vec![0f32; capacity * half];
    for (pos, (c, s)) in cos
        .chunks_exact_mut(half)
        .zip(sin.chunks_exact_mut(half))
        .enumerate()
    {
        rope::angles(theta, head_dim, pos, c, s);
    }
    (cos, sin)
}

fn u32_bytes(v: u32) -> Bytes {
    Bytes::from_elems(vec![v])
}

fn read_u32(bytes: &[u8], index: usize) -> u32 {
    let at = index * 4;
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}
