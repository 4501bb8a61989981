//! The forward pass of one sequence on the host, over plain `f32` buffers.
//!
//! Through tensor ops a decode step of a small model on Flex is dominated by everything but
//! its products: a few dozen ops per layer, each allocating its result, building masks,
//! transposes and RoPE tables, and (for the block and q8 products) converting between tensors
//! and the kernels' buffers. This path runs the same model, reading the same parameters in
//! place, with the activations in buffers the cache keeps between calls: RMSNorm writes the
//! products' input, RoPE rotates the new queries and keys where they lie, keys and values go
//! straight into a preallocated host cache, and single-query attention walks the cached prefix
//! without a mask. Products over GGUF blocks take and fill host buffers directly
//! ([`block_linear_into`]); any other projection kind runs its own forward on a tensor made
//! from the buffer, so every store the model loads takes this path.
//!
//! It serves one sequence (batch 1) of `f32` parameters on Flex; anything else, or a model
//! built [`without`](super::Qwen2ForCausalLM::with_host_step) it, runs as tensor ops. Both
//! compute the same function; the tests hold each to transformers' and a float64 reference.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_mapped::blocks::{BlockWeight, block_linear_into};

use super::cache::{HostKv, KvCache};
use super::host_attention::{AttnShape, attention, dot};
use super::model::{Qwen2Model, RmsNorm};
use super::projection::{Projection, block_operands};
use super::rope;

/// Where the step looks token rows up.
enum HostEmbed {
    /// The `f32` table.
    F32(FlexTensor),
    /// The checkpoint's quantized blocks, each looked-up row dequantized.
    Quantized(BlockWeight),
}

/// The `f32` host views of the parameters the step reads outside the projections.
struct HostParams {
    device: Device,
    embed: HostEmbed,
    hidden: usize,
    /// Per layer: input and post-attention norm weights.
    norms: Vec<[FlexTensor; 2]>,
    norm: FlexTensor,
}

impl HostParams {
    /// The views, or `None` when the model cannot take the host path (a parameter off Flex, not
    /// `f32`, or not contiguous; vocabulary row blocks).
    fn new(model: &Qwen2Model) -> Option<Self> {
        let device = model.embed_tokens.weight.lazy_device();
        let [_, hidden] = model.embed_tokens.weight.lazy_shape().dims::<2>();
        let embed = match model.vocab_blocks() {
            Some(blocks) => HostEmbed::Quantized(blocks.quantized_embed()?.clone()),
            None => HostEmbed::F32(host_f32(model.embed_tokens.weight.val())?),
        };
        let norm_of = |n: &RmsNorm| host_f32(n.weight.val());
        let norms = model
            .layers
            .iter()
            .map(|l| {
                Some([
                    norm_of(&l.input_layernorm)?,
                    norm_of(&l.post_attention_layernorm)?,
                ])
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            device,
            embed,
            hidden,
            norms,
            norm: norm_of(&model.norm)?,
        })
    }
}

/// `t` as a Flex tensor whose `f32` elements are one contiguous slice, without copying.
fn host_f32<const D: usize>(t: Tensor<D>) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let flex = t.try_into_primitive::<Flex>().ok()?;
    flex.as_slice::<f32>()?;
    Some(flex)
}

fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("checked in HostParams::new")
}

impl Qwen2Model {
    /// The host step's final-normed hidden states `[1, seq, hidden]` for `ids` after the
    /// cache's positions, or `None` where tensor ops run instead. A cache continues on the
    /// path that holds its positions; an empty one takes the host step when it is on, the
    /// batch is one and the model's parameters allow it.
    pub(super) fn host_forward(
        &self,
        ids: &[i64],
        batch: usize,
        cache: &mut KvCache,
    ) -> Option<Tensor<3>> {
        let start = cache.len();
        let params = if start == 0 {
            (self.host_step_on() && batch == 1)
                .then(|| HostParams::new(self))
                .flatten()
        } else if cache.on_host() {
            HostParams::new(self)
        } else {
            None
        }?;
        let attn = &self.layers[0].self_attn;
        let kv = cache.host(attn.num_kv_heads(), attn.head_dim());
        let hidden = forward(self, &params, ids, start, kv);
        cache.advance(ids.len());
        Some(hidden)
    }
}

/// Runs `ids` (one sequence) from position `start`, writing their keys and values into `kv`,
/// and returns the final-normed hidden states `[ids.len(), hidden]` as a tensor.
fn forward(
    model: &Qwen2Model,
    params: &HostParams,
    ids: &[i64],
    start: usize,
    kv: &mut HostKv,
) -> Tensor<3> {
    let t = ids.len();
    let hidden = params.hidden;
    let attn0 = &model.layers[0].self_attn;
    let (heads, kv_heads, d) = (attn0.num_heads(), attn0.num_kv_heads(), attn0.head_dim());
    let capacity = kv.capacity;
    let buf = &mut kv.buf;
    let eps = model.norm.eps() as f32;

    buf.x.clear();
    match &params.embed {
        HostEmbed::F32(table) => {
            let embed = slice(table);
            for &id in ids {
                let row = id as usize * hidden;
                buf.x.extend_from_slice(&embed[row..row + hidden]);
            }
        }
        HostEmbed::Quantized(w) => {
            let ids: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
            w.dequantize_rows(&ids, &mut buf.x)
                .expect("ids are checked against the vocabulary before the step");
        }
    }
    fit(&mut buf.h, t * hidden);
    fit(&mut buf.q, t * heads * d);
    fit(&mut buf.k, t * kv_heads * d);
    fit(&mut buf.v, t * kv_heads * d);
    fit(&mut buf.attn, t * heads * d);
    fit(&mut buf.o, t * hidden);
    fit(&mut buf.cos, t * d / 2);
    fit(&mut buf.sin, t * d / 2);
    for (i, pos) in (start..start + t).enumerate() {
        let half = d / 2;
        rope::angles(
            model.rope_theta(),
            d,
            pos,
            &mut buf.cos[i * half..(i + 1) * half],
            &mut buf.sin[i * half..(i + 1) * half],
        );
    }

    for (index, layer) in model.layers.iter().enumerate() {
        let [input_norm, post_norm] = &params.norms[index];
        let attn = &layer.self_attn;
        rms_norm(&buf.x, slice(input_norm), eps, hidden, &mut buf.h);
        products(
            &params.device,
            [&attn.q_proj, &attn.k_proj, &attn.v_proj],
            &buf.h,
            t,
            [&mut buf.q, &mut buf.k, &mut buf.v],
        );
        let half = d / 2;
        for i in 0..t {
            let (cos, sin) = (
                &buf.cos[i * half..(i + 1) * half],
                &buf.sin[i * half..(i + 1) * half],
            );
            rope::rotate(&mut buf.q[i * heads * d..(i + 1) * heads * d], d, cos, sin);
            rope::rotate(
                &mut buf.k[i * kv_heads * d..(i + 1) * kv_heads * d],
                d,
                cos,
                sin,
            );
        }
        let (kc, vc) = (&mut kv.k[index], &mut kv.v[index]);
        for i in 0..t {
            for g in 0..kv_heads {
                let at = (g * capacity + start + i) * d;
                let from = (i * kv_heads + g) * d;
                kc[at..at + d].copy_from_slice(&buf.k[from..from + d]);
                vc[at..at + d].copy_from_slice(&buf.v[from..from + d]);
            }
        }
        attention(
            &buf.q,
            kc,
            vc,
            AttnShape {
                start,
                t,
                heads,
                kv_heads,
                d,
                capacity,
            },
            &mut buf.attn,
        );
        products(&params.device, [&attn.o_proj], &buf.attn, t, [&mut buf.o]);
        add(&mut buf.x, &buf.o);

        let mlp = &layer.mlp;
        let inter = mlp.gate_proj.dims().1;
        fit(&mut buf.gate, t * inter);
        fit(&mut buf.up, t * inter);
        rms_norm(&buf.x, slice(post_norm), eps, hidden, &mut buf.h);
        products(
            &params.device,
            [&mlp.gate_proj, &mlp.up_proj],
            &buf.h,
            t,
            [&mut buf.gate, &mut buf.up],
        );
        silu_mul(&mut buf.gate, &buf.up, inter, t);
        products(&params.device, [&mlp.down_proj], &buf.gate, t, [&mut buf.o]);
        add(&mut buf.x, &buf.o);
    }
    rms_norm(&buf.x, slice(&params.norm), eps, hidden, &mut buf.h);
    Tensor::from_data(
        TensorData::new(buf.h.clone(), [1, t, hidden]),
        (&params.device, DType::F32),
    )
}

/// `gate = silu(gate) * up`, rows `[t, inter]`, on the pool's threads for a prompt.
fn silu_mul(gate: &mut [f32], up: &[f32], inter: usize, t: usize) {
    let parallel = t * inter >= PARALLEL_ACTIVATION;
    burn_mapped::host::for_each_piece(gate, inter, parallel, &|first, piece| {
        let up = &up[first * inter..first * inter + piece.len()];
        for (g, &u) in piece.iter_mut().zip(up) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
    });
}

/// Activations (`exp` each) below which [`silu_mul`] stays on the calling thread.
const PARALLEL_ACTIVATION: usize = 1 << 15;

/// `v` resized to `len` (its capacity is kept, so after the first call nothing is allocated).
fn fit(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// HF `Qwen2RMSNorm` per row of `width`: `w * x / sqrt(mean(x^2) + eps)`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, width: usize, out: &mut [f32]) {
    for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let inv = 1.0 / (dot(row, row) / width as f32 + eps).sqrt();
        for ((o, &v), &g) in dst.iter_mut().zip(row).zip(w) {
            *o = v * inv * g;
        }
    }
}

/// `layers` applied to `x` (`[t, in]`) into `outs` (`[t, out_i]`): over GGUF blocks straight
/// from and into the buffers, otherwise through the projections' own forward.
fn products<const N: usize>(
    device: &Device,
    layers: [&Projection; N],
    x: &[f32],
    t: usize,
    outs: [&mut Vec<f32>; N],
) {
    let mut outs = outs.map(|o| {
        o.clear();
        o
    });
    for (o, layer) in outs.iter_mut().zip(layers) {
        o.resize(t * layer.dims().1, 0.0);
    }
    if let Some(operands) = block_operands(&layers) {
        let operands: Vec<_> = operands.iter().map(|(w, b)| (w, b.clone())).collect();
        let mut dst: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        block_linear_into(x, t, &operands, &mut dst).unwrap_or_else(|e| panic!("BlockLinear: {e}"));
        return;
    }
    let input = Tensor::<2>::from_data(
        TensorData::new(x.to_vec(), [t, x.len() / t]),
        (device, DType::F32),
    );
    let ys = Projection::forward_shared(layers, input);
    for (o, y) in outs.iter_mut().zip(ys) {
        let y = y
            .cast(DType::F32)
            .try_into_vec_as::<f32>()
            .unwrap_or_else(|e| panic!("projection output: {e:?}"));
        o.copy_from_slice(&y);
    }
}
