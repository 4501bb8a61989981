//! The decode step's own CubeCL kernels: everything of a Qwen2 layer but the products, each
//! fused with the split its product reads ([`split_block`]), and the greedy choice.
//!
//! Every kernel reads the step's position from a device buffer rather than a launch
//! argument, so one recorded launch serves every position. Infinities are avoided on purpose
//! (the running maxima start at [`LOWEST`]): WGSL has no infinity literal.

use burn_cubecl::cubecl;
use burn_mapped::q8::direct::{Word4, split_block};
use cubecl::prelude::*;

/// Threads per cube of the single-cube kernels (the norm and the greedy choice) and of
/// attention; 256 is WebGPU's default limit.
pub(super) const THREADS: usize = 256;

type F4 = Vector<f32, Const<4>>;

/// Below every finite logit and score: where a running maximum starts.
const LOWEST: f32 = -3.4e38;

/// Values per split block.
const BLOCK: usize = 16;

/// Row `ids[pos + t]` of the embedding rows `first..first + rows` (a block of the vocabulary,
/// or all of it) into row `t` of `h`, `t` the cube's row of the grid; a token outside the
/// block writes nothing. One thread per value.
#[cube(launch_unchecked)]
pub(super) fn embed_kernel(
    embed: &[f32],
    ids: &[u32],
    pos: &[u32],
    h: &mut [f32],
    hidden: usize,
    first: usize,
    rows: usize,
) {
    let i = ABSOLUTE_POS_X as usize;
    let t = CUBE_POS_Y as usize;
    let token = ids[pos[0] as usize + t] as usize;
    if i < hidden && token >= first && token < first + rows {
        h[t * hidden + i] = embed[(token - first) * hidden + i];
    }
}

/// RMSNorm of row `first_row + t` of `x` (rows of `n` values) with weight `w`, split as row
/// `t` of the grid's rows for the products that read it. One cube of [`THREADS`] per row.
#[cube(launch_unchecked)]
pub(super) fn rms_split_kernel(
    x: &[f32],
    w: &[f32],
    xq: &mut [Word4],
    xs: &mut [f32],
    n: usize,
    eps: f32,
    first_row: usize,
) {
    let tid = UNIT_POS as usize;
    let t = CUBE_POS_Y as usize;
    let at = (first_row + t) * n;
    let mut shared = Shared::<[f32]>::new_slice(THREADS);
    let mut acc = 0.0f32;
    let mut i = tid;
    while i < n {
        acc += x[at + i] * x[at + i];
        i += THREADS;
    }
    shared[tid] = acc;
    sync_cube();
    // Every thread adds the partial sums itself: 256 reads of shared memory, in one order for
    // all, so every thread holds the same total without another barrier.
    let mut total = 0.0f32;
    for j in 0..THREADS {
        total += shared[j];
    }
    let inv = 1.0f32 / f32::sqrt(total / f32::cast_from(n) + eps);
    let blocks = n / BLOCK;
    let all = CUBE_COUNT_Y as usize * blocks;
    let mut b = tid;
    while b < blocks {
        let mut v = Array::<F4>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            let mut four = F4::new(0.0f32);
            #[unroll]
            for c in 0..4usize {
                let j = b * BLOCK + 4 * i + c;
                four.insert(c, x[at + j] * inv * w[j]);
            }
            v[i] = four;
        }
        split_block(&v, xq, xs, t * blocks + b, all, 8 * all);
        b += THREADS;
    }
}

/// `silu(gate) * up` (`n` values each: every row's), split. One thread per block.
#[cube(launch_unchecked)]
pub(super) fn silu_split_kernel(
    gate: &[f32],
    up: &[f32],
    xq: &mut [Word4],
    xs: &mut [f32],
    n: usize,
) {
    let b = ABSOLUTE_POS;
    let blocks = n / BLOCK;
    if b < blocks {
        let mut v = Array::<F4>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            let mut four = F4::new(0.0f32);
            #[unroll]
            for c in 0..4usize {
                let j = b * BLOCK + 4 * i + c;
                let g = gate[j];
                four.insert(c, g / (1.0f32 + f32::exp(-g)) * up[j]);
            }
            v[i] = four;
        }
        split_block(&v, xq, xs, b, blocks, 8 * blocks);
    }
}

/// The rotation of value `d` of a head (`x` the head's values) by the angles of `pos`:
/// the "rotate_half" convention, pairs `(d, d + head_dim / 2)`.
#[cube]
fn rotated(
    x: &[f32],
    at: usize,
    d: usize,
    cos: &[f32],
    sin: &[f32],
    pos: usize,
    #[comptime] head_dim: usize,
) -> f32 {
    let half = head_dim / 2;
    let i = d % half;
    let c = cos[pos * half + i];
    let s = sin[pos * half + i];
    // The partner of `d` in the other half; the first half's partners enter negated.
    let partner = (d + half) % head_dim;
    let mut signed = s;
    if d < half {
        signed = -s;
    }
    x[at + d] * c + x[at + partner] * signed
}

/// Writes the rotated keys and the values of positions `pos..pos + rows` (the grid's rows) into
/// the cache, ahead of [`attention_kernel`] reading them all from there: a prompt's positions
/// at once. One cube of `head_dim` threads per key-value head and row.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn cache_write_kernel(
    k: &[f32],
    v: &[f32],
    cos: &[f32],
    sin: &[f32],
    pos: &[u32],
    kc: &mut [f32],
    vc: &mut [f32],
    capacity: usize,
    #[comptime] head_dim: usize,
) {
    let g = CUBE_POS_X as usize;
    let kv_heads = CUBE_COUNT_X as usize;
    let t = CUBE_POS_Y as usize;
    let d = UNIT_POS as usize;
    let p = pos[0] as usize + t;
    if d < head_dim && p < capacity {
        let row = (t * kv_heads + g) * head_dim;
        let at = (g * capacity + p) * head_dim + d;
        kc[at] = rotated(k, row, d, cos, sin, p, head_dim);
        vc[at] = v[row + d];
    }
}

/// Single-query attention of one head per cube, for position `pos[0] + t` (`t` the cube's
/// row of the grid): rotates the head's query and attends over positions `0..=pos + t` with
/// a softmax kept as a running maximum and sum over chunks of [`THREADS`] positions, and
/// splits the head's output (row `t`) for the o-projection.
///
/// In a decode step (`cached` false, one row) the kernel also rotates its group's new key and
/// writes it and the value into the cache (the group's first head does): positions before
/// `pos` are read from the cache, `pos` itself from the shared copies, so no cube reads what
/// another writes in the same launch. With `cached`, [`cache_write_kernel`] wrote every row's
/// key and value before, and all are read from the cache.
///
/// `kc`/`vc` are `[kv_heads, capacity, head_dim]`; `cos`/`sin` `[capacity, head_dim / 2]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn attention_kernel(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cos: &[f32],
    sin: &[f32],
    pos: &[u32],
    kc: &mut [f32],
    vc: &mut [f32],
    xq: &mut [Word4],
    xs: &mut [f32],
    capacity: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] group: usize,
    #[comptime] heads: usize,
    #[comptime] cached: bool,
) {
    let h = CUBE_POS_X as usize;
    let g = h / group;
    let t = CUBE_POS_Y as usize;
    let tid = UNIT_POS as usize;
    let p_now = pos[0] as usize + t;
    let mut sq = Shared::<[f32]>::new_slice(head_dim);
    let mut sk = Shared::<[f32]>::new_slice(head_dim);
    let mut sv = Shared::<[f32]>::new_slice(head_dim);
    let mut sc = Shared::<[f32]>::new_slice(THREADS);
    let mut ra = Shared::<[f32]>::new_slice(THREADS);
    let mut rl = Shared::<[f32]>::new_slice(THREADS);
    // A position past the cache (a caller's bug) reads and writes nothing.
    let live = p_now < capacity;
    // The position whose key and value this cube holds in shared memory rather than reads
    // from the cache: none with `cached`.
    let mut fresh = p_now;
    if comptime!(cached) {
        fresh = capacity;
    }
    if tid < head_dim && live {
        sq[tid] = rotated(
            q,
            (t * heads + h) * head_dim,
            tid,
            cos,
            sin,
            p_now,
            head_dim,
        );
        if comptime!(!cached) {
            let key = rotated(k, g * head_dim, tid, cos, sin, p_now, head_dim);
            let value = v[g * head_dim + tid];
            sk[tid] = key;
            sv[tid] = value;
            if h == g * group {
                let at = (g * capacity + p_now) * head_dim + tid;
                kc[at] = key;
                vc[at] = value;
            }
        }
    }
    sync_cube();

    let parts = THREADS / head_dim;
    let d = tid % head_dim;
    let part = tid / head_dim;
    let base = g * capacity * head_dim;
    let mut m = LOWEST.runtime();
    let mut l = 0.0f32;
    let mut acc = 0.0f32;
    let mut len = p_now + 1;
    if !live {
        len = 0;
    }
    let mut start = 0usize;
    while start < len {
        let p = start + tid;
        let mut score = LOWEST.runtime();
        if p < len {
            let mut dot = 0.0f32;
            if p < fresh {
                let row = base + p * head_dim;
                for j in 0..head_dim {
                    dot += sq[j] * kc[row + j];
                }
            } else {
                for j in 0..head_dim {
                    dot += sq[j] * sk[j];
                }
            }
            score = dot * scale;
        }
        sc[tid] = score;
        sync_cube();
        let mut n = len - start;
        if n > THREADS {
            n = THREADS;
        }
        let mut top = m;
        for j in 0..n {
            top = f32::max(top, sc[j]);
        }
        let correction = f32::exp(m - top);
        acc *= correction;
        l *= correction;
        m = top;
        let mut j = part;
        while j < n {
            let w = f32::exp(sc[j] - m);
            let pp = start + j;
            let mut value = sv[d];
            if pp < fresh {
                value = vc[base + pp * head_dim + d];
            }
            l += w;
            acc += w * value;
            j += parts;
        }
        sync_cube();
        start += THREADS;
    }
    ra[tid] = acc;
    rl[tid] = l;
    sync_cube();
    if tid < head_dim {
        let mut a = 0.0f32;
        let mut s = 0.0f32;
        for pt in 0..parts {
            a += ra[pt * head_dim + tid];
            s += rl[pt * head_dim + tid];
        }
        sq[tid] = a / s;
    }
    sync_cube();
    let per_head = head_dim / BLOCK;
    if tid < per_head && live {
        let blocks = CUBE_COUNT_Y as usize * heads * per_head;
        let mut vals = Array::<F4>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            let mut four = F4::new(0.0f32);
            #[unroll]
            for c in 0..4usize {
                four.insert(c, sq[tid * BLOCK + 4 * i + c]);
            }
            vals[i] = four;
        }
        split_block(
            &vals,
            xq,
            xs,
            (t * heads + h) * per_head + tid,
            blocks,
            8 * blocks,
        );
    }
}

/// `src` (`n` values) into `dst` from `first` on: a head block's logits into the vocabulary's.
#[cube(launch_unchecked)]
pub(super) fn copy_kernel(src: &[f32], dst: &mut [f32], first: usize, n: usize) {
    let i = ABSOLUTE_POS;
    if i < n {
        dst[first + i] = src[i];
    }
}

/// The greedy choice over `logits` (`n` values; the first of equal maxima, NaN never
/// chosen), then the step's bookkeeping: position `pos + 1` takes the choice unless the
/// prompt still holds a token there (`prompt[0]` tokens), and the position advances. One cube
/// of [`THREADS`].
#[cube(launch_unchecked)]
pub(super) fn argmax_kernel(
    logits: &[f32],
    ids: &mut [u32],
    pos: &mut [u32],
    prompt: &[u32],
    n: usize,
    capacity: usize,
) {
    let tid = UNIT_POS as usize;
    let mut best = LOWEST.runtime();
    let mut at = n;
    let mut i = tid;
    while i < n {
        let x = logits[i];
        if x > best {
            best = x;
            at = i;
        }
        i += THREADS;
    }
    let mut sv = Shared::<[f32]>::new_slice(THREADS);
    let mut si = Shared::<[u32]>::new_slice(THREADS);
    sv[tid] = best;
    si[tid] = u32::cast_from(at);
    sync_cube();
    if tid == 0 {
        // Thread `j` saw indices `j mod THREADS` only, in order: the strict comparison in
        // thread order keeps the first index of the maximum.
        let mut top = sv[0];
        let mut chosen = si[0];
        for j in 1..THREADS {
            let v = sv[j];
            let at_j = si[j];
            if v > top || (v == top && at_j < chosen) {
                top = v;
                chosen = at_j;
            }
        }
        si[0] = chosen;
        let next = pos[0] + 1;
        if next >= prompt[0] && (next as usize) <= capacity {
            ids[next as usize] = si[0];
        }
        pos[0] = next;
    }
}
