//! Decoding of one sequence on a CubeCL device, each token one recorded graph.
//!
//! Through Burn's ops a decode step on a GPU is bound by the host: every op passes Burn's
//! dispatch, Fusion and CubeCL's launch path, and allocates its result, for a few microseconds
//! of device work each. This path keeps the step on the device. The activations, the key and
//! value cache, the token ids and the position live in buffers made once; the step is a fixed
//! sequence of launches whose kernels read the position from the device, so no launch
//! argument changes between tokens. A layer is five launches, because a launch costs the
//! device microseconds however little it does: the q/k/v products, each cube of which norms
//! the row itself (`fused_products`); attention with RoPE and the cache write, splitting its
//! output (over a cache longer than one cube's pass, each head's positions are spread over
//! cubes and a sixth launch combines them); the o-projection adding the residual; gate and
//! up, norming as q/k/v do, each cube computing sixteen rows of both and writing their
//! `silu(gate) * up` as one split block (`paired_products`; over blocks from a hidden width of
//! 3584, the norm runs once in a launch of its own and the cubes read its split in place,
//! `paired_split_products`); and the down projection reading that split (`staged_product`: q8
//! cubes fetch their weights before they copy it, block cubes read it in place), adding the
//! residual. The choice runs on the device too, greedy or top-p (the host writes the sampler's draws once, by
//! position), and writes the next token's id where the next step reads it: the host only reads
//! ids back.
//!
//! That makes the step recordable: the first step runs as launches while CubeCL prepares a
//! capture, the second is recorded (`Client::start_capture`), and every later step replays the
//! recording. Where the runtime records no graph, the same launches run every step. Steps run
//! ahead of the host: it reads the tokens several at a time ([`READ_AHEAD`]), the next ones'
//! steps already queued.
//!
//! The prompt runs before, once, over all its positions at a time (in passes of
//! [`DeviceDecoder::with_prefill_rows`]); the last position's choice is the first new token. A
//! pass of eight positions or more norms its rows apart from its products and runs each product
//! over all of them: where the device has matrix units (cooperative matrices), as one f16
//! matrix product per weight, the weight dequantized for it ([`matrix_products`]); elsewhere
//! over GGUF blocks as dp4a tiles of eight positions. Its keys and values go into the cache in
//! one launch, and its attention reads them in tiles shared by sixteen positions
//! ([`kernels::prompt_attention_kernel`]). A shorter pass runs the decode step's own kernels,
//! one cube row per position, which compiles nothing more for a short prompt.
//!
//! It takes a model whose projections and LM head are q8 or a GGUF's own blocks (Q8_0, Q5_0,
//! Q4_K, Q6_K, read as the file holds them), with rows of whole blocks whose hidden width (and
//! over q8, MLP width) is at most `fused_max_in` values (what a cube's shared memory holds on
//! the device), and whose
//! other parameters are `f32`, on a CubeCL device; its embedding f32 (whole or in row blocks: a
//! lookup per block) or GGUF blocks (each looked-up row dequantized on the device); its head
//! whole or in row blocks (a product and a copy per block). Anything else
//! decodes through tensor ops, and [`DeviceDecoder::try_new`] says why.

#[cfg(all(test, feature = "gpu-tests"))]
mod block_tests;
mod kernels;
#[cfg(all(test, feature = "gpu-tests"))]
mod tests;

use burn::tensor::DType;
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use burn_mapped::q8::direct::{
    Addend, DirectError, DirectWeight, MatrixScratch, Product, PrologueInput, cube_float,
    fused_max_in, fused_products, lookup_rows, matrix_products, matrix_units, paired_products,
    paired_split_products, product, products, products_per_row, split_words, staged_product,
};
use cubecl::bytes::Bytes;
use cubecl::client::{Client, Graph, ProfileWindow};
use cubecl::prelude::*;
use cubecl::profile::{ProfileDuration, TimingMethod};
use cubecl::server::Handle;
use std::cell::RefCell;

use super::model::{Qwen2ForCausalLM, RmsNorm};
use super::projection::Projection;
use super::rope;
use super::sampling::{Sampler, Sampling};
use super::vocab::VocabEmbed;
use kernels::{ARGMAX_PARTS, NormInput, SiluMul, THREADS};

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

/// Device memory of a [`DeviceDecoder`], in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceBytes {
    /// The model's parameters the step reads (uploaded with the model; the step adds none).
    pub weights: u64,
    /// The key and value cache.
    pub cache: u64,
    /// Activations, logits, sampling and position tables, and the largest prompt pass's
    /// activations.
    pub scratch: u64,
}

/// Why the device step does not take a model (the model then decodes through tensor ops).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DeviceStepRefused(pub String);

fn refused(reason: impl Into<String>) -> DeviceStepRefused {
    DeviceStepRefused(reason.into())
}

/// Prompt positions per prefill pass over the dp4a tiles unless
/// [`DeviceDecoder::with_prefill_rows`] says otherwise: ~32 MiB of activations on Qwen2.5-0.5B.
const PREFILL_ROWS: usize = 512;

/// The same on the matrix units, where each pass converts every weight to f16 once: a ~1920-token
/// prompt in one pass took 514 ms on an H100 at 7B against 829 ms in passes of 512, 71 against
/// 106 at 0.5B (docs/PERFORMANCE.md, "Prompts on the matrix units"); ~0.8 GiB of activations
/// and scratch at 7B.
const MATRIX_PREFILL_ROWS: usize = 2048;

/// Prompt positions from which a prefill pass runs its products over all its rows (as matrix
/// products where the device has matrix units, else over GGUF blocks the eight-row tile of
/// [`products`]) and its attention in tiles; shorter passes run the decode step's kernels, so a
/// short prompt compiles nothing more.
const TILED_FROM: usize = 8;

/// The hidden width from which a decode step norms the input of gate and up over GGUF blocks
/// once, in a launch of its own, and their cubes read its split in place, instead of every
/// cube norming it: at 7B's 3584 on an H100 gate/up took 1.41 ms a token against 1.58, at
/// 0.5B's 896 0.41 against 0.34 (the norm's launch costs more than the cubes' prologue).
/// Widths between were not measured and keep the prologue.
const NORM_APART_FROM: usize = 3584;

/// Positions one cube of a decode step's attention reads when the cache is longer than
/// [`THREADS`] positions: a head's cache is then read by `capacity / ATTENTION_SPAN` cubes at
/// once, and one more launch combines their parts. Up to [`THREADS`] positions one cube a head
/// reads the cache in one pass, and the combining launch would cost more than it saves.
const ATTENTION_SPAN: usize = 128;

/// Tokens a decode read takes after the first, and steps queued ahead of it. A read's wait
/// ends when CubeCL's wgpu runtime polls the device for its latest submission, often the
/// steps queued after the read, so the device runs dry while the host turns each read
/// around. Qwen2.5-0.5B on an H200, tg128 (one call, 3 runs each, 0.91 ms of device time a
/// step): 755-948 tok/s reading a token at a time, 1037-1065 four at a time, 956-1036
/// eight, 991-1010 sixteen. A stop token in a read leaves at most twice this many steps run
/// past it, their writes beyond the positions returned.
const READ_AHEAD: usize = 4;

/// How many cubes a head's decode attention takes over a cache of `capacity` positions.
fn attention_splits(capacity: usize) -> usize {
    if capacity <= THREADS {
        1
    } else {
        capacity.div_ceil(ATTENTION_SPAN)
    }
}

fn device_error(e: impl std::fmt::Display) -> DeviceStepError {
    DeviceStepError::Device(e.to_string())
}

/// An RMSNorm's weight on the device, and its epsilon.
struct Norm {
    weight: CubeTensor,
    eps: f32,
}

/// A layer's parameters as device buffers, and its cache.
struct Layer {
    in_norm: Norm,
    post_norm: Norm,
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

#[derive(Clone, Copy, Debug, Default)]
struct Dims {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    capacity: usize,
    /// Cubes a head's decode attention takes ([`attention_splits`]).
    splits: usize,
}

/// Activations of some positions: one for a decode step, a chunk of the prompt in prefill.
struct Acts {
    h0: Handle,
    h1: Handle,
    split_h: Handle,
    q: Handle,
    k: Handle,
    v: Handle,
    /// The split of `silu(gate) * up`: the down projection's input.
    split_i: Handle,
    /// A tiled prefill pass's gate and up outputs, `rows * inter` f32 each ([`Acts::tiled`]).
    mlp: Option<(Handle, Handle)>,
    /// A prefill pass's scratch for products on the matrix units ([`Acts::matrix`]).
    matrix: Option<MatrixScratch>,
}

impl Acts {
    fn bytes(&self) -> u64 {
        [
            &self.h0,
            &self.h1,
            &self.split_h,
            &self.q,
            &self.k,
            &self.v,
            &self.split_i,
        ]
        .into_iter()
        .chain(self.mlp.iter().flat_map(|(g, u)| [g, u]))
        .map(|h| h.size_in_used())
        .sum::<u64>()
            + self.matrix.as_ref().map_or(0, MatrixScratch::bytes)
    }

    /// Activations of `rows` positions; `tiled` adds the gate and up outputs a tiled prefill
    /// pass writes ([`DeviceDecoder::layers`]), `matrix` the scratch of its products on the
    /// matrix units (which are tiled products too).
    fn new(client: &Client, d: &Dims, rows: usize, tiled: bool, matrix: bool) -> Self {
        let f32s = |n: usize| client.empty(rows * n * size_of::<f32>());
        Self {
            h0: f32s(d.hidden),
            h1: f32s(d.hidden),
            split_h: f32s(split_words(1, d.hidden)),
            q: f32s(d.hidden),
            k: f32s(d.kv_heads * d.head_dim),
            v: f32s(d.kv_heads * d.head_dim),
            split_i: f32s(split_words(1, d.inter)),
            mlp: (tiled || matrix).then(|| (f32s(d.inter), f32s(d.inter))),
            matrix: matrix.then(|| {
                let widest = d.hidden.max(d.inter);
                MatrixScratch::new(client, rows, widest, widest, d.hidden * widest)
            }),
        }
    }

    /// The gate and up outputs when a pass of `rows` positions over these activations runs
    /// the tiled products; `None` when it runs the decode step's kernels.
    fn tiled(&self, rows: usize) -> Option<&(Handle, Handle)> {
        self.mlp.as_ref().filter(|_| rows >= TILED_FROM)
    }

    /// The matrix units' scratch when a pass of `rows` positions runs its products there.
    fn matrix(&self, rows: usize) -> Option<&MatrixScratch> {
        self.matrix.as_ref().filter(|_| rows >= TILED_FROM)
    }

    /// The tiled products of a prefill pass of `rows` positions: on the matrix units where
    /// the pass has their scratch, else the dp4a tiles.
    fn products(&self, split: &Handle, rows: usize, parts: &[Product]) -> Result<(), DirectError> {
        match self.matrix(rows) {
            Some(m) => matrix_products(split, rows, parts, m),
            None => products(split, rows, parts),
        }
    }
}

/// The step's activations and bookkeeping, made once.
struct Buffers {
    acts: Acts,
    logits: Handle,
    /// One head block's logits, before they are copied into `logits` (with several blocks).
    block_logits: Option<Handle>,
    /// The choice's first pass, `ARGMAX_PARTS` words each: each slice's maximum and its index
    /// (greedy), or its maximum and its weights' sum (top-p).
    parts: (Handle, Handle),
    /// Token ids by position: the prompt, then the choices; `capacity + 1` of them.
    ids: Handle,
    pos: Handle,
    nucleus: Nucleus,
    cos: Handle,
    sin: Handle,
    /// Each decode attention cube's maximum, sum and output, `[heads, splits, head_dim + 2]`
    /// (one word where a head takes one cube).
    attention_parts: Handle,
}

/// Top-p's own buffers.
struct Nucleus {
    /// The draw in `[0, 1)` for the token at each position, `capacity + 1` of them.
    draws: Handle,
    /// Scratch, one word per vocabulary entry each: the candidates' weights and their ids.
    cand: Handle,
    cand_ids: Handle,
    /// The candidates of each of the `ARGMAX_PARTS` vocabulary slices.
    counts: Handle,
}

/// How the step chooses the next token: a launch argument of its last kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Choice {
    Greedy,
    TopP { inv_temperature: f32, top_p: f32 },
}

impl Choice {
    /// Its launches.
    fn launches(self) -> usize {
        match self {
            Self::Greedy => 2,
            Self::TopP { .. } => 4,
        }
    }

    fn of(rule: Sampling) -> Self {
        match rule {
            Sampling::Greedy => Self::Greedy,
            Sampling::TopP {
                temperature, top_p, ..
            } => Self::TopP {
                inv_temperature: (1.0 / temperature) as f32,
                top_p: top_p as f32,
            },
        }
    }
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

/// Decoding of one sequence on a CubeCL device (see the module documentation).
pub struct DeviceDecoder {
    client: Client,
    layers: Vec<Layer>,
    /// The token embedding.
    embed: Embed,
    /// The LM head as consecutive vocabulary blocks (one block where the device binds the
    /// whole matrix): `(rows, first row)`.
    norm: Norm,
    head: Vec<(DirectWeight, usize)>,
    dims: Dims,
    buf: Buffers,
    mode: Mode,
    /// The choice the step launches with (a recording holds it).
    choice: Choice,
    /// Launches per step (for reports).
    launches: usize,
    /// The most prompt positions one prefill pass takes, where the caller set it.
    prefill_rows: Option<usize>,
    /// Whether a prefill pass's products run as f16 matrix products ([`matrix_products`]).
    matrix: bool,
    /// The keys a tile of [`kernels::prompt_attention_kernel`] holds, where a tiled prefill
    /// pass's attention runs it (the device's shared memory holds its tiles).
    prompt_attention: Option<usize>,
    /// Device bytes of the largest prefill pass's activations so far (made per prompt).
    prefill_bytes: u64,
    /// Host time spent enqueuing the steady steps (replays, or launches without a graph) that
    /// generated tokens, and how many.
    host: std::time::Duration,
    chosen: usize,
    /// The latest generation's first step position and how many steps it ran, which
    /// [`DeviceDecoder::device_time_per_step`] replays.
    last_run: Option<(usize, usize)>,
    /// Open while [`DeviceDecoder::device_time_by_launch`] times a step's launches one by one.
    timer: RefCell<Option<LaunchTimer>>,
}

/// The per-launch timing of one step: the window open since the previous launch, the windows
/// closed so far with the kind of launch each holds, and the first failure.
struct LaunchTimer {
    window: Option<ProfileWindow>,
    closed: Vec<(&'static str, ProfileDuration)>,
    error: Option<String>,
}

/// The token embedding as the step reads it.
enum Embed {
    /// f32 rows as consecutive vocabulary blocks: `(rows, first row)`.
    Rows(Vec<(CubeTensor, usize)>),
    /// The GGUF's blocks, each looked-up row dequantized on the device.
    Blocks(Box<DirectWeight>),
}

impl Embed {
    /// Rows and width.
    fn shape(&self) -> (usize, usize) {
        match self {
            Embed::Rows(blocks) => (
                blocks
                    .iter()
                    .map(|(t, _)| t.meta.shape().dims::<2>()[0])
                    .sum(),
                blocks
                    .first()
                    .map_or(0, |(t, _)| t.meta.shape().dims::<2>()[1]),
            ),
            Embed::Blocks(w) => (w.out_features(), w.in_features()),
        }
    }

    /// Device bytes.
    fn bytes(&self) -> u64 {
        match self {
            Embed::Rows(blocks) => blocks.iter().map(|(t, _)| t.handle.size_in_used()).sum(),
            Embed::Blocks(w) => w.bytes(),
        }
    }
}

fn f32_param(t: &burn::tensor::Tensor<1>) -> Option<CubeTensor> {
    (t.dtype() == DType::F32).then(|| cube_float(t)).flatten()
}

/// A projection's weight as the direct kernels read it (q8, or the GGUF's blocks) and its
/// bias.
fn direct(p: &Projection) -> Option<(DirectWeight, Option<CubeTensor>)> {
    let (weight, bias) = match p {
        Projection::Q8(l) => (DirectWeight::new(&l.q8_weight().ok()?)?, &l.bias),
        Projection::Blocks(l) => (DirectWeight::blocks(&l.weight.val(), l.layout())?, &l.bias),
        _ => return None,
    };
    let bias = match bias {
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

fn norm(n: &RmsNorm) -> Option<Norm> {
    Some(Norm {
        weight: f32_param(&n.weight.val())?,
        eps: n.eps() as f32,
    })
}

impl DeviceDecoder {
    /// The decoder for `model` with room for `capacity` positions (prompt plus new tokens),
    /// or `None` where the model cannot take this path (see the module documentation and
    /// [`try_new`](Self::try_new), which says why).
    pub fn new(model: &Qwen2ForCausalLM, capacity: usize) -> Option<Self> {
        Self::try_new(model, capacity).ok()
    }

    /// [`new`](Self::new), or why the model cannot take this path.
    ///
    /// # Errors
    ///
    /// [`DeviceStepRefused`] naming what the step does not take: a projection that is not q8,
    /// a width past what a fused product stages in the device's shared memory, a head shape.
    pub fn try_new(model: &Qwen2ForCausalLM, capacity: usize) -> Result<Self, DeviceStepRefused> {
        let m = &model.model;
        if capacity == 0 {
            return Err(refused("no cache positions were asked for"));
        }
        let attn = &m
            .layers
            .first()
            .ok_or_else(|| refused("the model has no layers"))?
            .self_attn;
        let (heads, kv_heads, head_dim) = (attn.num_heads(), attn.num_kv_heads(), attn.head_dim());
        let [vocab, hidden] = m.embed_tokens.weight.lazy_shape().dims::<2>();
        let not_f32 = || refused("the embedding is not an f32 matrix on a CubeCL device");
        let not_direct = |what: &str| {
            refused(format!(
                "{what} is not a q8 matrix or GGUF blocks the step reads (Q8_0, Q5_0, Q4_K, \
                 Q6_K) on a CubeCL device"
            ))
        };
        let rows = |t: &CubeTensor| t.meta.shape().dims::<2>()[0];
        let embed = match m.vocab_blocks().map(|b| &b.embed) {
            Some(VocabEmbed::RowBlocks(blocks)) => Embed::Rows(in_blocks(
                blocks
                    .iter()
                    .map(f32_matrix)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(not_f32)?,
                rows,
            )),
            Some(VocabEmbed::Quantized(w)) => Embed::Blocks(Box::new(
                DirectWeight::blocks(w.bytes(), w.layout())
                    .ok_or_else(|| not_direct("the embedding"))?,
            )),
            None => Embed::Rows(in_blocks(
                vec![f32_matrix(&m.embed_tokens.weight.val()).ok_or_else(not_f32)?],
                rows,
            )),
        };
        let head = match m.vocab_blocks().and_then(|b| b.head.as_ref()) {
            Some(blocks) => blocks
                .iter()
                .map(direct)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| not_direct("the LM head"))?,
            None => vec![
                direct(
                    model
                        .lm_head
                        .as_ref()
                        .ok_or_else(|| refused("a head tied to the embedding"))?,
                )
                .ok_or_else(|| not_direct("the LM head"))?,
            ],
        };
        if head.iter().any(|(_, bias)| bias.is_some()) {
            return Err(refused("the LM head has a bias"));
        }
        let head = in_blocks(
            head.into_iter().map(|(w, _)| w).collect(),
            DirectWeight::out_features,
        );
        let layers = m
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let a = &l.self_attn;
                let q8_of = |p: &Projection, name: &str| {
                    direct(p).ok_or_else(|| not_direct(&format!("layer {i}'s {name}")))
                };
                let (q, q_bias) = q8_of(&a.q_proj, "q_proj")?;
                let (k, k_bias) = q8_of(&a.k_proj, "k_proj")?;
                let (v, v_bias) = q8_of(&a.v_proj, "v_proj")?;
                let (o, o_bias) = q8_of(&a.o_proj, "o_proj")?;
                let (gate, g_bias) = q8_of(&l.mlp.gate_proj, "gate_proj")?;
                let (up, u_bias) = q8_of(&l.mlp.up_proj, "up_proj")?;
                let (down, d_bias) = q8_of(&l.mlp.down_proj, "down_proj")?;
                if o_bias.is_some() || g_bias.is_some() || u_bias.is_some() || d_bias.is_some() {
                    return Err(refused(format!(
                        "layer {i} has a bias on o_proj or the MLP"
                    )));
                }
                let biases = q_bias.zip(k_bias).zip(v_bias).ok_or_else(|| {
                    refused(format!("layer {i}'s q, k and v projections lack biases"))
                })?;
                let norm_of = |n: &RmsNorm| {
                    norm(n).ok_or_else(|| refused(format!("layer {i}'s norms are not f32")))
                };
                Ok((
                    norm_of(&l.input_layernorm)?,
                    norm_of(&l.post_attention_layernorm)?,
                    [q, k, v, o, gate, up, down],
                    [biases.0.0, biases.0.1, biases.1],
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let inter = layers[0].2[4].out_features();
        let dims = Dims {
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
            vocab,
            capacity,
            splits: attention_splits(capacity),
        };
        let (embed_rows, embed_width) = embed.shape();
        let head_rows: usize = head.iter().map(|(w, _)| w.out_features()).sum();
        let shapes_fit = embed_rows == vocab
            && head_rows == vocab
            && embed_width == hidden
            && head.iter().all(|(w, _)| w.in_features() == hidden)
            && heads * head_dim == hidden
            && heads.is_multiple_of(kv_heads)
            && head_dim.is_multiple_of(16)
            && inter.is_multiple_of(16)
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
            return Err(refused(format!(
                "the model's shapes (hidden {hidden}, {heads} heads of {head_dim}, {kv_heads} \
                 key/value heads, MLP {inter}, vocabulary {vocab}) are not ones the step's \
                 kernels take"
            )));
        }
        let client = head[0].0.client().clone();
        let units = matrix_units(&client);
        let prompt_attention = kernels::prompt_attention_keys(
            dims.head_dim,
            client.properties().hardware.max_shared_memory_size,
        );
        // The products after a norm stage `hidden` values in shared memory; the down
        // projection stages `inter` only over q8 rows (over blocks it reads its split in place).
        let staged = if layers
            .iter()
            .all(|(_, _, w, _)| w[6].reads_split_in_place())
        {
            hidden
        } else {
            hidden.max(inter)
        };
        let widest_in = fused_max_in(&client);
        if staged > widest_in {
            return Err(refused(format!(
                "rows of {staged} values are wider than a fused product stages in this device's \
                 shared memory ({widest_in} values)"
            )));
        }
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
            acts: Acts::new(&client, &dims, 1, false, false),
            logits: f32s(vocab),
            block_logits: (head.len() > 1).then(|| f32s(widest)),
            parts: (f32s(ARGMAX_PARTS), f32s(ARGMAX_PARTS)),
            ids: f32s(capacity + 1),
            pos: f32s(1),
            nucleus: Nucleus {
                draws: f32s(capacity + 1),
                cand: f32s(vocab),
                cand_ids: f32s(vocab),
                counts: f32s(ARGMAX_PARTS),
            },
            cos: client.create_from_slice(f32::as_bytes(&cos)),
            sin: client.create_from_slice(f32::as_bytes(&sin)),
            attention_parts: f32s(attention_parts_len(&dims)),
        };
        Ok(Self {
            client,
            layers,
            embed,
            norm: norm(&m.norm).ok_or_else(|| refused("the final norm is not f32"))?,
            head,
            dims,
            buf,
            mode: Mode::Fresh,
            choice: Choice::Greedy,
            launches: 0,
            prefill_rows: None,
            matrix: units,
            prompt_attention,
            prefill_bytes: 0,
            host: std::time::Duration::ZERO,
            chosen: 0,
            last_run: None,
            timer: RefCell::new(None),
        })
    }

    /// Device memory the step holds, by purpose.
    pub fn device_bytes(&self) -> DeviceBytes {
        let tensor = |t: &CubeTensor| t.handle.size_in_used();
        let layers = self.layers.iter().map(|l| {
            let products = [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down];
            let rest = [
                &l.in_norm.weight,
                &l.post_norm.weight,
                &l.q_bias,
                &l.k_bias,
                &l.v_bias,
            ];
            products.iter().map(|w| w.bytes()).sum::<u64>()
                + rest.into_iter().map(tensor).sum::<u64>()
        });
        let weights = layers.sum::<u64>()
            + self.embed.bytes()
            + tensor(&self.norm.weight)
            + self.head.iter().map(|(w, _)| w.bytes()).sum::<u64>();
        let cache = self
            .layers
            .iter()
            .map(|l| l.kc.size_in_used() + l.vc.size_in_used())
            .sum();
        let b = &self.buf;
        let n = &b.nucleus;
        let step = [
            &b.logits,
            &b.parts.0,
            &b.parts.1,
            &b.ids,
            &b.pos,
            &n.draws,
            &n.cand,
            &n.cand_ids,
            &n.counts,
            &b.cos,
            &b.sin,
            &b.attention_parts,
        ];
        let scratch = b.acts.bytes()
            + b.block_logits.as_ref().map_or(0, |h| h.size_in_used())
            + step.iter().map(|h| h.size_in_used()).sum::<u64>()
            + self.prefill_bytes;
        DeviceBytes {
            weights,
            cache,
            scratch,
        }
    }

    /// This decoder launching every step instead of recording it (the fallback where a runtime
    /// records no graph; the same kernels, so the same tokens).
    pub fn without_capture(mut self) -> Self {
        self.mode = Mode::Launch;
        self
    }

    /// This decoder taking at most `rows` prompt positions per prefill pass (at least one;
    /// by default 2048 on the matrix units, 512 elsewhere): a pass's activations take about
    /// 64 KiB per position on Qwen2.5-0.5B.
    pub fn with_prefill_rows(mut self, rows: usize) -> Self {
        self.prefill_rows = Some(rows.max(1));
        self
    }

    /// This decoder running a prompt pass's products as f16 matrix products (`true`) or as
    /// the dp4a tiles (`false`), whatever the device has; by default they run as matrix products
    /// where the device has matrix units ([`matrix_units`]). For comparisons, and for testing
    /// the path on a device without them (its matrix products then run on the cores).
    pub fn with_matrix_products(mut self, on: bool) -> Self {
        self.matrix = on;
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

    /// The host's mean time to enqueue a steady generating step (a replay, or the launches
    /// where nothing is recorded): what the device step costs the host per token. With steps
    /// queued ahead of the reads it includes the waits CubeCL's runtime makes once 512
    /// launches are in flight.
    pub fn host_time_per_token(&self) -> Option<std::time::Duration> {
        (self.chosen > 0).then(|| self.host / self.chosen as u32)
    }

    /// The device's time per step, timed by the device over the first `steps` steps of the
    /// latest generation run again (at most as many as it ran). A step run again at a position
    /// already decoded writes what is there already: the same cache rows and ids, and at the
    /// end the logits of the last step replayed. `None` where the latest generation ran no
    /// step, or where the runtime times on the host (the steps still run).
    ///
    /// The device's clock runs from the first step's start to the last one's end, so time it
    /// spends waiting for the host between submissions counts. CubeCL's wgpu runtime submits
    /// every `tasks_max` launches as the host enqueues them (32 by default, or as set when the
    /// runtime starts, or by `CUBECL_WGPU_MAX_TASKS`); with that limit above `steps` times
    /// [`Self::launches_per_token`], the steps reach the device in one submission and the
    /// figure is the device's alone.
    ///
    /// # Errors
    ///
    /// [`DeviceStepError::Device`] when a launch, the timer or a read fails.
    pub fn device_time_per_step(
        &mut self,
        steps: usize,
    ) -> Result<Option<std::time::Duration>, DeviceStepError> {
        let Some((first, ran)) = self.last_run else {
            return Ok(None);
        };
        let steps = steps.min(ran);
        if steps == 0 {
            return Ok(None);
        }
        self.client.write(&self.buf.pos, u32_bytes(first as u32));
        let timed = self.time_window(|s| (0..steps).try_for_each(|_| s.step()));
        self.release_capture();
        Ok(timed?.map(|t| t / steps as u32))
    }

    /// Where a step's device time goes: the device's time for each kind of launch, summed over
    /// the step's launches of that kind, in the order each kind first runs. Runs the latest
    /// generation's first step again (as [`Self::device_time_per_step`] does), each launch in
    /// a timing window of its own, so each also counts its own start and drain on the device:
    /// the kinds add up to more than [`Self::device_time_per_step`]. `None` where it does.
    ///
    /// # Errors
    ///
    /// [`DeviceStepError::Device`] when a launch, the timer or a read fails.
    pub fn device_time_by_launch(
        &mut self,
    ) -> Result<Option<Vec<(&'static str, std::time::Duration)>>, DeviceStepError> {
        let Some((first, _)) = self.last_run else {
            return Ok(None);
        };
        self.client.write(&self.buf.pos, u32_bytes(first as u32));
        self.time_launches(|s| s.launch().map(drop))
    }

    /// The device's time for the latest prompt: its prefill runs again in one timing window
    /// (the same keys, values and first choice written where they are), the figure to set
    /// beside another runtime's prompt throughput; the per-launch view over-counts. `None`
    /// where the device has no timer or no generation ran. Leaves the position past the prompt.
    ///
    /// # Errors
    ///
    /// [`DeviceStepError::Device`] when a launch, the timer or a read fails.
    pub fn prompt_device_time(&mut self) -> Result<Option<std::time::Duration>, DeviceStepError> {
        let Some((n, _)) = self.last_run else {
            return Ok(None);
        };
        self.time_window(|s| s.prefill(n))
    }

    /// Runs `launch` in one timing window: the device's time, or `None` where the device has
    /// no timer.
    fn time_window(
        &mut self,
        launch: impl FnOnce(&mut Self) -> Result<(), DeviceStepError>,
    ) -> Result<Option<std::time::Duration>, DeviceStepError> {
        let window = self.client.profile_start().map_err(device_error)?;
        if let Err(e) = launch(self) {
            self.client.profile_abandon(window);
            return Err(e);
        }
        let timed = self.client.profile_end(window).map_err(device_error)?;
        let on_device = timed.timing_method() == TimingMethod::Device;
        let ticks = cubecl::future::block_on(timed.resolve());
        Ok(ticks.filter(|_| on_device).map(|t| t.duration()))
    }

    /// Where the latest prompt's device time goes, as [`Self::device_time_by_launch`] gives a
    /// step's: its prefill runs again (the same keys, values and first choice written where
    /// they are), each launch timed alone. `None` where the device has no timer or no
    /// generation ran. Run it after the step timings: it leaves the position past the prompt.
    ///
    /// # Errors
    ///
    /// [`DeviceStepError::Device`] when a launch, the timer or a read fails.
    pub fn prompt_time_by_launch(
        &mut self,
    ) -> Result<Option<Vec<(&'static str, std::time::Duration)>>, DeviceStepError> {
        let Some((n, _)) = self.last_run else {
            return Ok(None);
        };
        self.time_launches(|s| s.prefill(n))
    }

    /// Runs `launch` with each launch in a timing window of its own; the device's time by kind
    /// of launch, in the order each kind first runs.
    fn time_launches(
        &mut self,
        launch: impl FnOnce(&mut Self) -> Result<(), DeviceStepError>,
    ) -> Result<Option<Vec<(&'static str, std::time::Duration)>>, DeviceStepError> {
        let window = self.client.profile_start().map_err(device_error)?;
        *self.timer.borrow_mut() = Some(LaunchTimer {
            window: Some(window),
            closed: Vec::new(),
            error: None,
        });
        let launched = launch(self);
        let timer = self.timer.borrow_mut().take().expect("set above");
        if let Some(window) = timer.window {
            self.client.profile_abandon(window);
        }
        launched?;
        if let Some(e) = timer.error {
            return Err(DeviceStepError::Device(e));
        }
        let mut kinds: Vec<(&'static str, std::time::Duration)> = Vec::new();
        for (kind, timed) in timer.closed {
            if timed.timing_method() != TimingMethod::Device {
                return Ok(None);
            }
            let Some(ticks) = cubecl::future::block_on(timed.resolve()) else {
                return Ok(None);
            };
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, total)) => *total += ticks.duration(),
                None => kinds.push((kind, ticks.duration())),
            }
        }
        Ok(Some(kinds))
    }

    /// Closes the timing window of the launch just enqueued as `kind` and opens the next one,
    /// while [`Self::device_time_by_launch`] times; otherwise nothing.
    fn timed(&self, kind: &'static str) {
        let mut timer = self.timer.borrow_mut();
        let Some(t) = timer.as_mut() else { return };
        if let Some(window) = t.window.take() {
            match self.client.profile_end(window) {
                Ok(timed) => t.closed.push((kind, timed)),
                Err(e) => {
                    t.error.get_or_insert(e.to_string());
                }
            }
        }
        match self.client.profile_start() {
            Ok(window) => t.window = Some(window),
            Err(e) => {
                t.error.get_or_insert(e.to_string());
            }
        }
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

    /// The continuation of `prompt` that `sampler` chooses: up to `max_new_tokens` ids,
    /// stopping after the first of `stop_tokens`; `on_token` sees each id as it is read back.
    /// A top-p sampler's stream advances by one draw per returned token, as on the host, and
    /// one seed gives the host's tokens (up to `f32` rounding where a draw or the nucleus's
    /// edge falls within it).
    ///
    /// # Errors
    ///
    /// [`DeviceStepError`]: an empty prompt, a token outside the vocabulary, too little cache,
    /// or a device failure.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        stop_tokens: &[u32],
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, DeviceStepError> {
        self.generate_until(prompt, max_new_tokens, sampler, stop_tokens, |id| {
            on_token(id);
            std::ops::ControlFlow::Continue(())
        })
    }

    /// [`generate`](Self::generate) whose callback can end the generation early: returning
    /// `Break` stops after that token (steps already queued finish unread).
    ///
    /// # Errors
    ///
    /// As [`generate`](Self::generate).
    pub fn generate_until(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        stop_tokens: &[u32],
        mut on_token: impl FnMut(u32) -> std::ops::ControlFlow<()>,
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
        if max_new_tokens == 0 {
            return Ok(Vec::new());
        }
        let mut generated = Vec::with_capacity(max_new_tokens.min(self.dims.capacity + 1));
        // Prefill takes positions `0..n`, steps `n..n + max_new_tokens - 1` (the last in
        // flight when the last token is read).
        let steps = n + max_new_tokens - 1;
        if steps > self.dims.capacity {
            return Err(DeviceStepError::CacheFull {
                needed: steps,
                capacity: self.dims.capacity,
            });
        }
        let choice = Choice::of(sampler.rule());
        if choice != self.choice && matches!(self.mode, Mode::Recorded(_)) {
            // The recording holds the other choice; a stream records once.
            self.mode = Mode::Launch;
        }
        self.choice = choice;
        if matches!(choice, Choice::TopP { .. }) {
            let mut ahead = sampler.clone();
            let mut draws = vec![0f32; self.dims.capacity + 1];
            // Rounded to `f32`, a draw stays below 1.
            let below_one = f32::from_bits(0x3F7F_FFFF);
            for d in &mut draws[n..n + max_new_tokens] {
                *d = (ahead.draw() as f32).min(below_one);
            }
            self.client
                .write(&self.buf.nucleus.draws, Bytes::from_elems(draws));
        }
        let mut ids = vec![0u32; self.dims.capacity + 1];
        ids[..n].copy_from_slice(prompt);
        self.client.write(&self.buf.ids, Bytes::from_elems(ids));
        // The prompt's positions at once, then the steps, queued ahead of the reads.
        self.last_run = None;
        self.prefill(n)?;
        let total = n + max_new_tokens;
        // The tokens at `position..end` are read at once, and the steps choosing the next
        // read's go to the device before the host waits for them.
        let mut position = n;
        let mut end = n + 1;
        let mut enqueued = n;
        let mut ran = 0;
        let client = self.client.clone();
        let allocated = 4 * (self.dims.capacity as u64 + 1);
        'reads: while position < total {
            // Their bytes, not the whole id buffer. One read in flight at a time: CubeCL's
            // wgpu runtime may stage two small reads in one buffer, which the second would
            // submit while the first holds it mapped.
            let words = self
                .buf
                .ids
                .clone()
                .offset_start(4 * position as u64)
                .offset_end(allocated - 4 * end as u64);
            let read = client.read_async(vec![words]);
            // The first token waits for one step queued behind it; later reads for more.
            let ahead = if position == n { 1 } else { READ_AHEAD };
            let next = (end + ahead).min(total);
            while enqueued + 1 < next {
                // The warm-up and the recording compile and prepare: not a step's steady cost.
                let steady = matches!(self.mode, Mode::Recorded(_) | Mode::Launch);
                let start = std::time::Instant::now();
                self.step()?;
                ran += 1;
                enqueued += 1;
                if steady {
                    self.host += start.elapsed();
                    self.chosen += 1;
                }
            }
            // The steps go to the device now, not with the next read: the device has them
            // queued while the host waits for these tokens and turns them around.
            self.client.flush().map_err(device_error)?;
            let bytes = cubecl::future::block_on(read).map_err(device_error)?;
            for i in 0..end - position {
                let token = read_u32(&bytes[0], i);
                if token as usize >= self.dims.vocab {
                    return Err(DeviceStepError::NoChoice {
                        position: position + i,
                    });
                }
                generated.push(token);
                if on_token(token).is_break() || stop_tokens.contains(&token) {
                    break 'reads;
                }
            }
            position = end;
            end = next;
        }
        self.last_run = Some((n, ran));
        // The steps queued past the last read are finished by the next read or drop; their
        // writes land beyond the positions returned.
        if matches!(choice, Choice::TopP { .. }) {
            for _ in &generated {
                sampler.draw();
            }
        }
        self.release_capture();
        Ok(generated)
    }

    /// Closes a capture prepared by a first step but not recorded yet (a generation that
    /// ended after one step): a prepared capture holds the client's stream, and another
    /// decoder on it could not prepare its own. The next step prepares again.
    fn release_capture(&mut self) {
        if matches!(self.mode, Mode::Warm) {
            // Closing a capture that never opened unwinds it; no graph comes back.
            let _ = self.client.stop_capture();
            self.mode = Mode::Fresh;
        }
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

    /// Enqueues the prompt's `n` positions in passes of at most `prefill_rows`: each layer's
    /// products over a pass's positions at once, the keys and values into the cache, then
    /// attention for every position; the last position's logits choose the first new token.
    /// Runs once per prompt, so it is launched, not recorded, and its launch arguments may
    /// depend on the prompt.
    fn prefill(&mut self, n: usize) -> Result<(), DeviceStepError> {
        let most = match self.prefill_rows {
            Some(rows) => rows,
            None if self.matrix => MATRIX_PREFILL_ROWS,
            None => PREFILL_ROWS,
        };
        let rows = most.min(n);
        let tiled = rows >= TILED_FROM
            && self.layers.iter().all(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .all(|w| w.reads_split_in_place())
            });
        // Where the device has matrix units, a pass's products run there, over q8 or blocks.
        let matrix = rows >= TILED_FROM && self.matrix;
        let acts = Acts::new(&self.client, &self.dims, rows, tiled, matrix);
        self.prefill_bytes = self.prefill_bytes.max(acts.bytes());
        for start in (0..n).step_by(rows) {
            let t = rows.min(n - start);
            self.client.write(&self.buf.pos, u32_bytes(start as u32));
            self.embed(&acts, t);
            self.layers(&acts, t, true)?;
        }
        // The choice at the prompt's last position (row `(n - 1) % rows` of the last pass)
        // writes the first new token and moves the position past the prompt.
        self.client.write(&self.buf.pos, u32_bytes(n as u32 - 1));
        self.head(&acts.h0, (n - 1) % rows)?;
        Ok(())
    }

    /// Enqueues the step's launches; returns how many.
    fn launch(&mut self) -> Result<usize, DeviceStepError> {
        let mut count = self.embed(&self.buf.acts, 1);
        count += self.layers(&self.buf.acts, 1, false)?;
        count += self.head(&self.buf.acts.h0, 0)?;
        self.launches = count;
        Ok(count)
    }

    /// The embedding rows of positions `pos..pos + rows` into `a.h0`; returns the launches.
    fn embed(&self, a: &Acts, rows: usize) -> usize {
        let d = self.dims;
        let b = &self.buf;
        let blocks = match &self.embed {
            Embed::Rows(blocks) => blocks,
            Embed::Blocks(w) => {
                // SAFETY: the ids hold `capacity + 1` and the caller keeps `pos + rows` within
                // the cache; `a.h0` is none of the step's id or position buffers.
                unsafe { lookup_rows(w, &b.ids, d.capacity + 1, &b.pos, rows, &a.h0) }
                    .expect("the step's buffers were made for its dims");
                self.timed("embedding");
                return 1;
            }
        };
        // SAFETY: each block holds `n * hidden` f32 and `a.h0` at least `rows * hidden`; the
        // kernel reads ids at `pos + t < capacity + 1` (the caller keeps `pos + rows` within
        // the cache) and writes row `t < rows` only.
        for (block, first) in blocks {
            let n = block.meta.shape().dims::<2>()[0];
            unsafe {
                kernels::embed_kernel::launch_unchecked(
                    &self.client,
                    CubeCount::Static(d.hidden.div_ceil(THREADS) as u32, rows as u32, 1),
                    CubeDim::new_1d(THREADS as u32),
                    BufferArg::from_raw_parts(block.handle.clone(), n * d.hidden),
                    BufferArg::from_raw_parts(b.ids.clone(), d.capacity + 1),
                    BufferArg::from_raw_parts(b.pos.clone(), 1),
                    BufferArg::from_raw_parts(a.h0.clone(), rows * d.hidden),
                    d.hidden,
                    *first,
                    n,
                );
            }
            self.timed("embedding");
        }
        blocks.len()
    }

    /// Every layer over positions `pos..pos + rows`, from `a.h0` back into `a.h0`; returns the
    /// launches. `prefill` writes the rows' keys and values into the cache first and attends
    /// from there (any number of rows); otherwise the one row's attention writes its own.
    fn layers(&self, a: &Acts, rows: usize, prefill: bool) -> Result<usize, DeviceStepError> {
        let d = self.dims;
        let b = &self.buf;
        let c = &self.client;
        let mut count = 0;
        let kv = d.kv_heads * d.head_dim;
        let cache = d.kv_heads * d.capacity * d.head_dim;
        let hidden_blocks = rows * d.hidden / 16;
        // A prompt's pass over GGUF blocks: norms and products apart, each product reading
        // its split in place a tile of rows at a time.
        let mlp = if prefill { a.tiled(rows) } else { None };
        let tiled = mlp.is_some();
        // SAFETY (all launches below): every buffer was allocated with room for `rows` rows
        // (`Acts::new`) or with the length bound here, in elements of the bound type; the
        // kernels index within `rows` rows of `hidden`, `inter` and `kv` values and the
        // cache's `kv_heads * capacity * head_dim`, at positions `pos + t` that they check
        // against `capacity`.
        for l in &self.layers {
            let qkv = [
                (&l.q, &l.q_bias, &a.q),
                (&l.k, &l.k_bias, &a.k),
                (&l.v, &l.v_bias, &a.v),
            ]
            .map(|(weight, bias, y)| Product {
                weight,
                add: Addend::Bias(&bias.handle),
                y,
            });
            if tiled {
                rms_split(c, &a.h0, &l.in_norm, &a.split_h, d.hidden, 0, rows);
                a.products(&a.split_h, rows, &qkv).map_err(device_error)?;
                count += 3;
            } else {
                // SAFETY: the norm reads `rows` rows of `hidden` from `h0` and `hidden`
                // weights, the lengths given; the outputs are other buffers.
                unsafe {
                    fused_products::<NormInput>(norm_input(&a.h0, &l.in_norm, d, rows), rows, &qkv)
                }
                .map_err(device_error)?;
            }
            self.timed("q/k/v with the norm");
            if prefill {
                unsafe {
                    kernels::cache_write_kernel::launch_unchecked(
                        c,
                        CubeCount::Static(d.kv_heads as u32, rows as u32, 1),
                        CubeDim::new_1d(d.head_dim as u32),
                        BufferArg::from_raw_parts(a.k.clone(), rows * kv),
                        BufferArg::from_raw_parts(a.v.clone(), rows * kv),
                        BufferArg::from_raw_parts(b.cos.clone(), d.capacity * d.head_dim / 2),
                        BufferArg::from_raw_parts(b.sin.clone(), d.capacity * d.head_dim / 2),
                        BufferArg::from_raw_parts(b.pos.clone(), 1),
                        BufferArg::from_raw_parts(l.kc.clone(), cache),
                        BufferArg::from_raw_parts(l.vc.clone(), cache),
                        d.capacity,
                        d.head_dim,
                    );
                }
                self.timed("cache write");
                count += 1;
            }
            if let (true, Some(keys)) = (tiled, self.prompt_attention) {
                // SAFETY: as above: `q` holds `rows` rows of `hidden`, the cache
                // `kv_heads * capacity * head_dim` (the cache write filled the pass's
                // positions), the split `rows` rows of `hidden`; a cube's rows past the pass
                // or the cache write nothing.
                unsafe {
                    kernels::prompt_attention_kernel::launch_unchecked(
                        c,
                        CubeCount::Static(
                            d.heads as u32,
                            rows.div_ceil(kernels::PROMPT_QUERIES) as u32,
                            1,
                        ),
                        CubeDim::new_1d(THREADS as u32),
                        BufferArg::from_raw_parts(a.q.clone(), rows * d.hidden),
                        BufferArg::from_raw_parts(b.cos.clone(), d.capacity * d.head_dim / 2),
                        BufferArg::from_raw_parts(b.sin.clone(), d.capacity * d.head_dim / 2),
                        BufferArg::from_raw_parts(b.pos.clone(), 1),
                        BufferArg::from_raw_parts(l.kc.clone(), cache / 4),
                        BufferArg::from_raw_parts(l.vc.clone(), cache / 4),
                        BufferArg::from_raw_parts(a.split_h.clone(), 2 * hidden_blocks),
                        BufferArg::from_raw_parts(a.split_h.clone(), 9 * hidden_blocks),
                        rows,
                        d.capacity,
                        1.0 / (d.head_dim as f32).sqrt(),
                        d.head_dim,
                        d.heads / d.kv_heads,
                        d.heads,
                        keys,
                    );
                }
                self.timed("attention");
            } else {
                count += self.attention(a, l, rows, prefill);
            }
            let o = Product {
                weight: &l.o,
                add: Addend::Residual(&a.h0),
                y: &a.h1,
            };
            if tiled {
                a.products(&a.split_h, rows, &[o]).map_err(device_error)?;
            } else {
                products_per_row(&a.split_h, rows, &[o]).map_err(device_error)?;
            }
            self.timed("o-projection");
            if let Some((g, u)) = mlp {
                rms_split(c, &a.h1, &l.post_norm, &a.split_h, d.hidden, 0, rows);
                let [gate, up] = [(&l.gate, g), (&l.up, u)].map(|(weight, y)| Product {
                    weight,
                    add: Addend::None,
                    y,
                });
                a.products(&a.split_h, rows, &[gate, up])
                    .map_err(device_error)?;
                let blocks = rows * d.inter / 16;
                // SAFETY: `g` and `u` hold `rows * inter` f32 (`Acts::new`), `split_i` the
                // split of `rows` rows of `inter`; each thread writes its own block.
                unsafe {
                    kernels::silu_mul_split_kernel::launch_unchecked(
                        c,
                        CubeCount::Static(blocks.div_ceil(THREADS) as u32, 1, 1),
                        CubeDim::new_1d(THREADS as u32),
                        BufferArg::from_raw_parts(g.clone(), rows * d.inter / 4),
                        BufferArg::from_raw_parts(u.clone(), rows * d.inter / 4),
                        BufferArg::from_raw_parts(a.split_i.clone(), 2 * blocks),
                        BufferArg::from_raw_parts(a.split_i.clone(), 9 * blocks),
                        blocks,
                    );
                }
                count += 3;
            } else if d.hidden >= NORM_APART_FROM && l.gate.reads_split_in_place() {
                rms_split(c, &a.h1, &l.post_norm, &a.split_h, d.hidden, 0, rows);
                paired_split_products::<SiluMul>(&a.split_h, rows, &l.gate, &l.up, &a.split_i)
                    .map_err(device_error)?;
                count += 1;
            } else {
                // SAFETY: the norm reads `rows` rows of `hidden` from `h1` and `hidden`
                // weights, the lengths given; the output is `split_i`.
                unsafe {
                    paired_products::<NormInput, SiluMul>(
                        norm_input(&a.h1, &l.post_norm, d, rows),
                        rows,
                        &l.gate,
                        &l.up,
                        &a.split_i,
                    )
                }
                .map_err(device_error)?;
            }
            self.timed("gate/up with the norm and SiLU·mul");
            let down = Product {
                weight: &l.down,
                add: Addend::Residual(&a.h1),
                y: &a.h0,
            };
            if tiled {
                a.products(&a.split_i, rows, &[down])
                    .map_err(device_error)?;
            } else {
                staged_product(&a.split_i, rows, down).map_err(device_error)?;
            }
            self.timed("down");
            count += 5;
        }
        Ok(count)
    }

    /// A layer's attention over `rows` positions through [`kernels::attention_kernel`] (one
    /// cube a head and position): every decode step, and prompt passes the tiled attention
    /// does not take; returns the launches beyond the one counted with the layer.
    fn attention(&self, a: &Acts, l: &Layer, rows: usize, prefill: bool) -> usize {
        let d = self.dims;
        let b = &self.buf;
        let c = &self.client;
        let kv = d.kv_heads * d.head_dim;
        let cache = d.kv_heads * d.capacity * d.head_dim;
        let hidden_blocks = rows * d.hidden / 16;
        let mut count = 0;
        // A decode step over a long cache splits each head's positions over cubes.
        let split = !prefill && d.splits > 1;
        let (splits, span) = if split {
            (d.splits, ATTENTION_SPAN)
        } else {
            (1, d.capacity)
        };
        // SAFETY (both launches): the buffers hold `rows` rows of `hidden` and `kv` values,
        // the cache `kv_heads * capacity * head_dim`, the parts `attention_parts_len`; the
        // kernels check positions `pos + t` against `capacity`.
        unsafe {
            kernels::attention_kernel::launch_unchecked(
                c,
                CubeCount::Static(d.heads as u32, rows as u32, splits as u32),
                CubeDim::new_1d(THREADS as u32),
                BufferArg::from_raw_parts(a.q.clone(), rows * d.hidden),
                BufferArg::from_raw_parts(a.k.clone(), rows * kv),
                BufferArg::from_raw_parts(a.v.clone(), rows * kv),
                BufferArg::from_raw_parts(b.cos.clone(), d.capacity * d.head_dim / 2),
                BufferArg::from_raw_parts(b.sin.clone(), d.capacity * d.head_dim / 2),
                BufferArg::from_raw_parts(b.pos.clone(), 1),
                BufferArg::from_raw_parts(l.kc.clone(), cache),
                BufferArg::from_raw_parts(l.vc.clone(), cache),
                BufferArg::from_raw_parts(l.kc.clone(), cache / 4),
                BufferArg::from_raw_parts(a.split_h.clone(), 2 * hidden_blocks),
                BufferArg::from_raw_parts(a.split_h.clone(), 9 * hidden_blocks),
                BufferArg::from_raw_parts(b.attention_parts.clone(), attention_parts_len(&d)),
                d.capacity,
                span,
                1.0 / (d.head_dim as f32).sqrt(),
                d.head_dim,
                d.heads / d.kv_heads,
                d.heads,
                prefill,
                split,
            );
        }
        if split {
            self.timed("attention");
            unsafe {
                kernels::attention_combine_kernel::launch_unchecked(
                    c,
                    CubeCount::Static(d.heads as u32, 1, 1),
                    CubeDim::new_1d(d.head_dim as u32),
                    BufferArg::from_raw_parts(b.attention_parts.clone(), attention_parts_len(&d)),
                    BufferArg::from_raw_parts(b.pos.clone(), 1),
                    BufferArg::from_raw_parts(a.split_h.clone(), 2 * hidden_blocks),
                    BufferArg::from_raw_parts(a.split_h.clone(), 9 * hidden_blocks),
                    d.capacity,
                    d.splits,
                    d.head_dim,
                    d.heads,
                );
            }
            self.timed("attention combine");
            count += 1;
        } else {
            self.timed("attention");
        }
        count
    }

    /// The final norm of row `row` of `x`, the LM head and the choice at the device's
    /// position, which advances; returns the launches.
    fn head(&self, x: &Handle, row: usize) -> Result<usize, DeviceStepError> {
        let d = self.dims;
        let b = &self.buf;
        let c = &self.client;
        let split = &b.acts.split_h;
        rms_split(c, x, &self.norm, split, d.hidden, row, 1);
        self.timed("final norm");
        let mut count = 1;
        for (w, first) in &self.head {
            let Some(block) = &b.block_logits else {
                product(split, 1, w, Addend::None, &b.logits).map_err(device_error)?;
                self.timed("LM head");
                count += 1;
                continue;
            };
            product(split, 1, w, Addend::None, block).map_err(device_error)?;
            self.timed("LM head");
            let n = w.out_features();
            // SAFETY: `block` holds the widest head block's logits, `logits` `vocab`, and
            // `first + n <= vocab`.
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
            self.timed("head block copy");
            count += 2;
        }
        // SAFETY: the buffers have the lengths `Buffers::new` gave them for `d`: what `argmax`
        // and `sample_top_p` ask.
        unsafe {
            match self.choice {
                Choice::Greedy => argmax(c, &b.logits, &b.parts, &b.ids, &b.pos, d),
                Choice::TopP {
                    inv_temperature,
                    top_p,
                } => sample_top_p(
                    c,
                    &b.logits,
                    &b.parts,
                    &b.nucleus,
                    &b.ids,
                    &b.pos,
                    d,
                    inv_temperature,
                    top_p,
                ),
            }
        }
        self.timed("choice");
        Ok(count + self.choice.launches())
    }
}

impl Drop for DeviceDecoder {
    fn drop(&mut self) {
        self.release_capture();
    }
}

/// The greedy choice over `logits` (`vocab` values; the first of equal maxima, NaN never
/// chosen) at the position in `pos`, which advances: two launches, through `parts`.
///
/// # Safety
///
/// `logits` holds `vocab` f32, each of `parts` `ARGMAX_PARTS` words, `ids` `capacity + 1`
/// and `pos` one.
unsafe fn argmax(
    c: &Client,
    logits: &Handle,
    parts: &(Handle, Handle),
    ids: &Handle,
    pos: &Handle,
    d: Dims,
) {
    // SAFETY: the caller's lengths; the first pass writes each part once (cube `c` of
    // `ARGMAX_PARTS`), the second reads them and writes `ids` only at `pos + 1 <= capacity`.
    unsafe {
        kernels::argmax_part_kernel::launch_unchecked(
            c,
            CubeCount::Static(ARGMAX_PARTS as u32, 1, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(logits.clone(), d.vocab),
            BufferArg::from_raw_parts(parts.0.clone(), ARGMAX_PARTS),
            BufferArg::from_raw_parts(parts.1.clone(), ARGMAX_PARTS),
            d.vocab,
        );
        kernels::argmax_kernel::launch_unchecked(
            c,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(parts.0.clone(), ARGMAX_PARTS),
            BufferArg::from_raw_parts(parts.1.clone(), ARGMAX_PARTS),
            BufferArg::from_raw_parts(ids.clone(), d.capacity + 1),
            BufferArg::from_raw_parts(pos.clone(), 1),
            d.capacity,
        );
    }
}

/// Nucleus sampling over `logits` (`vocab` values) with the draw `nucleus.draws[pos + 1]`, at
/// the position in `pos`, which advances: four launches, through `parts`.
///
/// # Safety
///
/// `logits` holds `vocab` f32, each of `parts` `ARGMAX_PARTS` words, the nucleus's scratch
/// `vocab` words each and its counts `ARGMAX_PARTS`, its draws and `ids` `capacity + 1`, and
/// `pos` one.
#[allow(clippy::too_many_arguments)]
unsafe fn sample_top_p(
    c: &Client,
    logits: &Handle,
    parts: &(Handle, Handle),
    nucleus: &Nucleus,
    ids: &Handle,
    pos: &Handle,
    d: Dims,
    inv_temperature: f32,
    top_p: f32,
) {
    // SAFETY: the caller's lengths; the first pass writes each part once (cube `c` of
    // `ARGMAX_PARTS`), the second each slice's count once, the third at most `vocab`
    // candidates (the counts' sum, over slices that partition the vocabulary), and the last
    // reads them and writes `ids` only at `pos + 1 <= capacity`, reading `draws` there.
    let logits = || unsafe { BufferArg::from_raw_parts(logits.clone(), d.vocab) };
    let part_m = || unsafe { BufferArg::from_raw_parts(parts.0.clone(), ARGMAX_PARTS) };
    let part_s = || unsafe { BufferArg::from_raw_parts(parts.1.clone(), ARGMAX_PARTS) };
    let counts = || unsafe { BufferArg::from_raw_parts(nucleus.counts.clone(), ARGMAX_PARTS) };
    let cand = || unsafe { BufferArg::from_raw_parts(nucleus.cand.clone(), d.vocab) };
    let cand_ids = || unsafe { BufferArg::from_raw_parts(nucleus.cand_ids.clone(), d.vocab) };
    let slices = CubeCount::Static(ARGMAX_PARTS as u32, 1, 1);
    let cube = CubeDim::new_1d(THREADS as u32);
    unsafe {
        kernels::softmax_part_kernel::launch_unchecked(
            c,
            slices.clone(),
            cube,
            logits(),
            part_m(),
            part_s(),
            d.vocab,
            inv_temperature,
        );
        kernels::candidate_count_kernel::launch_unchecked(
            c,
            slices.clone(),
            cube,
            logits(),
            part_m(),
            part_s(),
            counts(),
            d.vocab,
            inv_temperature,
            top_p,
        );
        kernels::candidate_copy_kernel::launch_unchecked(
            c,
            slices,
            cube,
            logits(),
            part_m(),
            part_s(),
            counts(),
            cand(),
            cand_ids(),
            d.vocab,
            inv_temperature,
            top_p,
        );
        kernels::top_p_kernel::launch_unchecked(
            c,
            CubeCount::Static(1, 1, 1),
            cube,
            part_m(),
            part_s(),
            counts(),
            cand(),
            cand_ids(),
            BufferArg::from_raw_parts(nucleus.draws.clone(), d.capacity + 1),
            BufferArg::from_raw_parts(ids.clone(), d.capacity + 1),
            BufferArg::from_raw_parts(pos.clone(), 1),
            d.vocab,
            d.capacity,
            inv_temperature,
            top_p,
        );
    }
}

/// What [`NormInput`] reads for `rows` rows of `x` (rows of `hidden` values) under norm `w`.
fn norm_input<'a>(x: &'a Handle, w: &'a Norm, d: Dims, rows: usize) -> PrologueInput<'a> {
    PrologueInput {
        first: x,
        first_len: rows * d.hidden,
        second: &w.weight.handle,
        second_len: d.hidden,
        scalar: w.eps,
    }
}

/// RMSNorm `w` of rows `first_row..first_row + rows` of `x` (rows of `n` values), split into
/// `out`.
fn rms_split(
    c: &Client,
    x: &Handle,
    w: &Norm,
    out: &Handle,
    n: usize,
    first_row: usize,
    rows: usize,
) {
    let blocks = rows * n / 16;
    // SAFETY: `x` holds `first_row + rows` rows of `n` f32 and `w` `n` f32, `out` a split of
    // `rows` rows (`9 * rows * n / 16` words); the kernel reads and writes within those.
    unsafe {
        kernels::rms_split_kernel::launch_unchecked(
            c,
            CubeCount::Static(1, rows as u32, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(x.clone(), (first_row + rows) * n),
            BufferArg::from_raw_parts(w.weight.handle.clone(), n),
            BufferArg::from_raw_parts(out.clone(), 2 * blocks),
            BufferArg::from_raw_parts(out.clone(), 9 * blocks),
            w.eps,
            first_row,
            n,
        );
    }
}

/// Words of [`Buffers::attention_parts`].
fn attention_parts_len(d: &Dims) -> usize {
    if d.splits > 1 {
        d.heads * d.splits * (d.head_dim + 2)
    } else {
        1
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
