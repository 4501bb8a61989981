//! Key/value cache for incremental decoding.
//!
//! Each layer owns one preallocated buffer per K and V of shape
//! `[batch, kv_heads, capacity, head_dim]`, created on first use with the dtype and device
//! of the keys. New positions are written with `slice_assign`; on Flex that writes in place
//! because the cache holds the only handle to the buffer between steps (the prefix views
//! handed to attention are dropped before the next write). Attention then reads the prefix
//! `[.., 0..len, ..]` as a strided view, which Flex's batched GEMM consumes without
//! copying. Growing with `cat` instead would copy the whole cache on every token.
//!
//! The price is the memory for `capacity` positions up front; callers size it to what
//! they will generate (`prompt + max_new_tokens`).
//!
//! The host step keeps its keys and values in plain `f32` buffers of
//! the same shape instead, made on its first use; a cache continues on the path that filled
//! it.

use burn::tensor::Tensor;

/// Cache of past keys and values, created by
/// [`Qwen2ForCausalLM::new_cache`](crate::qwen2::Qwen2ForCausalLM::new_cache).
///
/// Tied to the model that created it (layer count, head shapes) and to one batch size.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    /// The host step's cache, made on its first use.
    host: Option<HostKv>,
    /// Whether the cached positions were written by the host step (the two paths keep their
    /// keys and values apart; a cache continues on the path that filled it).
    on_host: bool,
    batch: usize,
    capacity: usize,
    len: usize,
}

#[derive(Debug, Default)]
struct LayerCache {
    k: Option<Tensor<4>>,
    v: Option<Tensor<4>>,
}

impl KvCache {
    pub(crate) fn new(num_layers: usize, batch: usize, capacity: usize) -> Self {
        Self {
            layers: (0..num_layers).map(|_| LayerCache::default()).collect(),
            host: None,
            on_host: false,
            batch,
            capacity,
            len: 0,
        }
    }

    /// Positions already cached (the position the next token will take).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maximum number of positions this cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Batch size the cache was created for.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Forget all positions; the buffers are kept for reuse.
    pub fn reset(&mut self) {
        self.len = 0;
    }

    pub(crate) fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Write `k`, `v` (`[batch, kv_heads, seq, head_dim]`) at positions `len..len + seq` of
    /// `layer` and return views of positions `0..len + seq`. The caller has checked capacity
    /// and calls [`advance`](Self::advance) once every layer is done.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: Tensor<4>,
        v: Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>) {
        let [batch, kv_heads, seq, head_dim] = k.dims();
        let (start, end) = (self.len, self.len + seq);
        debug_assert!(
            end <= self.capacity,
            "capacity is checked before the forward pass"
        );
        let capacity = self.capacity;
        self.on_host = false;
        let entry = &mut self.layers[layer];
        let write = |slot: &mut Option<Tensor<4>>, value: Tensor<4>| {
            let buffer = slot.take().unwrap_or_else(|| {
                Tensor::zeros(
                    [batch, kv_heads, capacity, head_dim],
                    (&value.device(), value.dtype()),
                )
            });
            let buffer =
                buffer.slice_assign([0..batch, 0..kv_heads, start..end, 0..head_dim], value);
            *slot = Some(buffer.clone());
            buffer.narrow(2, 0, end)
        };
        let k_all = write(&mut entry.k, k);
        let v_all = write(&mut entry.v, v);
        (k_all, v_all)
    }

    /// Whether the cached positions were written by the host step
    /// ([`Qwen2ForCausalLM::with_host_step`](crate::qwen2::Qwen2ForCausalLM::with_host_step)).
    pub fn on_host(&self) -> bool {
        self.on_host
    }

    /// The host step's cache (made on first use) for a model of these shapes; from now on the
    /// positions are the host step's.
    pub(crate) fn host(&mut self, kv_heads: usize, head_dim: usize) -> &mut HostKv {
        self.on_host = true;
        let (layers, capacity) = (self.layers.len(), self.capacity);
        self.host
            .get_or_insert_with(|| HostKv::new(layers, kv_heads, head_dim, capacity))
    }

    pub(crate) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }
}

/// Keys and values of every layer, `[kv_heads, capacity, head_dim]` each, and the step's
/// scratch buffers, kept between calls so a step allocates no activations.
#[derive(Debug)]
pub(crate) struct HostKv {
    pub(super) k: Vec<Vec<f32>>,
    pub(super) v: Vec<Vec<f32>>,
    pub(super) capacity: usize,
    pub(super) buf: Buffers,
}

/// The host step's activations, reused from step to step.
#[derive(Debug, Default)]
pub(super) struct Buffers {
    pub(super) x: Vec<f32>,
    pub(super) h: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) attn: Vec<f32>,
    pub(super) o: Vec<f32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
}

impl HostKv {
    /// Zeroed buffers come from the allocator's fresh (untouched, copy-on-write zero) pages, so
    /// memory grows with the positions written, not with `capacity`.
    pub(crate) fn new(layers: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let per_layer = kv_heads * capacity * head_dim;
        Self {
            k: (0..layers).map(|_| vec![0f32; per_layer]).collect(),
            v: (0..layers).map(|_| vec![0f32; per_layer]).collect(),
            capacity,
            buf: Buffers::default(),
        }
    }
}
