//! The decode step's own CubeCL kernels: everything of a Qwen2 layer but the products, each
//! fused with the split its product reads ([`split_block`]) or run by the product's cubes as
//! its input ([`Prologue`]), and the choice of the next token (greedy or top-p).
//!
//! Every kernel reads the step's position from a device buffer rather than a launch
//! argument, so one recorded launch serves every position. Infinities are avoided on purpose
//! (the running maxima start at [`LOWEST`]): WGSL has no infinity literal.

use burn_cubecl::cubecl;
use burn_mapped::q8::direct::{Pairing, Prologue, Word4, split_block};
use cubecl::prelude::*;

/// Threads per cube of the single-cube kernels (the norm and the choice) and of
/// attention; 256 is WebGPU's default limit.
pub(super) const THREADS: usize = 256;

type F4 = Vector<f32, Const<4>>;

/// Below every finite logit and score: where a running maximum starts.
const LOWEST: f32 = -3.4e38;

/// Values per split block.
const BLOCK: usize = 16;

/// Values a pass of the top-p choice loads at once, per thread.
const LOAD_BATCH: usize = 8;

/// Positions whose values an attention thread loads at once.
const VALUE_BATCH: usize = 16;

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

/// The blocks of the `n` values of `x` from `at` that a thread of `threads` takes (blocks
/// `tid + r * threads`) as `4 * r + i` vectors of four, zero past the row: loaded before any is
/// used, so the thread waits on memory once rather than once per block.
#[cube]
fn thread_blocks(
    x: &[f32],
    at: usize,
    #[comptime] n: usize,
    #[comptime] threads: usize,
) -> Array<F4> {
    let tid = UNIT_POS as usize;
    let blocks = comptime!(n / BLOCK);
    let per = comptime!((n / BLOCK).div_ceil(threads));
    let mut v = Array::<F4>::new(comptime!(4 * per));
    #[unroll]
    for r in 0..per {
        let b = tid + r * threads;
        #[unroll]
        for i in 0..4usize {
            let mut four = F4::new(0.0f32);
            if b < blocks {
                #[unroll]
                for c in 0..4usize {
                    four.insert(c, x[at + b * BLOCK + 4 * i + c]);
                }
            }
            v[4 * r + i] = four;
        }
    }
    v
}

/// RMSNorm (weight `w`, epsilon `eps`) of the `n` values of `x` from `at`, split: block `b`
/// as block `first + b` of a split of `all` blocks whose scales start at `xs_at`
/// ([`split_block`]). Each of the cube's `threads` threads calls it and takes the blocks of
/// [`thread_blocks`], with their weights.
#[cube]
#[allow(clippy::too_many_arguments)]
fn norm_split(
    x: &[f32],
    at: usize,
    w: &[f32],
    eps: f32,
    xq: &mut [Word4],
    xs: &mut [f32],
    first: usize,
    all: usize,
    xs_at: usize,
    #[comptime] n: usize,
    #[comptime] threads: usize,
) {
    let tid = UNIT_POS as usize;
    let blocks = comptime!(n / BLOCK);
    let per = comptime!((n / BLOCK).div_ceil(threads));
    let xv = thread_blocks(x, at, n, threads);
    let wv = thread_blocks(w, 0, n, threads);
    let mut acc = 0.0f32;
    #[unroll]
    for k in 0..comptime!(4 * per) {
        let f = xv[k] * xv[k];
        acc += f.extract(0usize) + f.extract(1usize) + f.extract(2usize) + f.extract(3usize);
    }
    let mut shared = Shared::<[f32]>::new_slice(threads);
    let total = cube_total(acc, &mut shared, threads);
    let inv = F4::new(1.0f32 / f32::sqrt(total / comptime!(n as f32) + eps));
    #[unroll]
    for r in 0..per {
        let b = tid + r * threads;
        if b < blocks {
            let mut v = Array::<F4>::new(4usize);
            #[unroll]
            for i in 0..4usize {
                v[i] = xv[4 * r + i] * inv * wv[4 * r + i];
            }
            split_block(&v, xq, xs, first + b, all, xs_at);
        }
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
    eps: f32,
    first_row: usize,
    #[comptime] n: usize,
) {
    let t = CUBE_POS_Y as usize;
    let blocks = comptime!(n / BLOCK);
    let all = CUBE_COUNT_Y as usize * blocks;
    norm_split(
        x,
        (first_row + t) * n,
        w,
        eps,
        xq,
        xs,
        t * blocks,
        all,
        8 * all,
        n,
        THREADS,
    );
}

/// A fused product's input ([`Prologue`]): RMSNorm of row `t` of `x` (`first`, rows of `n`
/// values) with the norm's weight `second` and epsilon `scalar`: the norm before q/k/v and
/// before gate/up.
pub(super) struct NormInput;

#[cube]
impl Prologue for NormInput {
    #[allow(clippy::too_many_arguments)]
    fn split_row(
        x: &[f32],
        w: &[f32],
        eps: f32,
        t: usize,
        xq: &mut [Word4],
        xs: &mut [f32],
        #[comptime] n: usize,
        #[comptime] threads: usize,
    ) {
        let blocks = comptime!(n / BLOCK);
        norm_split(x, t * n, w, eps, xq, xs, 0, blocks, 0, n, threads);
    }
}

/// The gated MLP's combination of a gate and an up projection's outputs, `silu(gate) * up`,
/// as their paired products write it for the down projection ([`Pairing`]).
pub(super) struct SiluMul;

#[cube]
impl Pairing for SiluMul {
    fn combine(gate: f32, up: f32) -> f32 {
        gate / (1.0f32 + f32::exp(-gate)) * up
    }
}

/// `silu(gate) * up` of a prompt's rows (`g` and `u`, `blocks` blocks of 16 values each,
/// vectors of four) split for the down projection, as the paired products write it for a
/// single row: one thread per block. A prompt's gate and up are tiled products of their own
/// (each weight read once per tile of rows); this joins them.
#[cube(launch_unchecked)]
pub(super) fn silu_mul_split_kernel(
    g: &[F4],
    u: &[F4],
    xq: &mut [Word4],
    xs: &mut [f32],
    blocks: usize,
) {
    let b = ABSOLUTE_POS;
    if b < blocks {
        let mut v = Array::<F4>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            let (gate, up) = (g[4 * b + i], u[4 * b + i]);
            let mut four = F4::new(0.0f32);
            #[unroll]
            for c in 0..4usize {
                four.insert(c, SiluMul::combine(gate.extract(c), up.extract(c)));
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
/// With `partial` (decode only), cube `z` of the grid's third axis attends over positions
/// `z * span..(z + 1) * span` alone and leaves its running maximum, sum and unnormalized
/// output in `parts` (`[heads, splits, head_dim + 2]`) for [`attention_combine_kernel`]: a long
/// cache is read by `splits` cubes a head at once rather than one cube walking it. Without,
/// `span` covers the cache and the cube splits its own output.
///
/// `kc`/`vc` are `[kv_heads, capacity, head_dim]`; `keys` is `kc` again, bound as vectors of
/// four so that a thread reads its key in `head_dim / 4` loads rather than `head_dim` (every
/// thread reads a different key: each load of a warp touches as many lines as it has threads,
/// whatever its width). `cos`/`sin` are `[capacity, head_dim / 2]`.
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
    keys: &[F4],
    xq: &mut [Word4],
    xs: &mut [f32],
    parts: &mut [f32],
    capacity: usize,
    span: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] group: usize,
    #[comptime] heads: usize,
    #[comptime] cached: bool,
    #[comptime] partial: bool,
) {
    let h = CUBE_POS_X as usize;
    let g = h / group;
    let t = CUBE_POS_Y as usize;
    let z = CUBE_POS_Z as usize;
    let tid = UNIT_POS as usize;
    let p_now = pos[0] as usize + t;
    let mut sq = Shared::<[f32]>::new_slice(head_dim);
    let mut sk = Shared::<[f32]>::new_slice(head_dim);
    let mut sv = Shared::<[f32]>::new_slice(head_dim);
    let mut sc = Shared::<[f32]>::new_slice(THREADS);
    let mut red = Shared::<[f32]>::new_slice(THREADS);
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
            if h == g * group && z == 0 {
                let at = (g * capacity + p_now) * head_dim + tid;
                kc[at] = key;
                vc[at] = value;
            }
        }
    }
    sync_cube();

    let groups = THREADS / head_dim;
    let d = tid % head_dim;
    let part = tid / head_dim;
    let base = g * capacity * head_dim;
    let mut m = LOWEST.runtime();
    let mut l = 0.0f32;
    let mut acc = 0.0f32;
    // This cube's positions: `first..len`.
    let first = z * span;
    let mut len = p_now + 1;
    if !live {
        len = 0;
    }
    if len > first + span {
        len = first + span;
    }
    let mut start = first;
    while start < len {
        let p = start + tid;
        let mut score = LOWEST.runtime();
        if p < len {
            let mut dot = 0.0f32;
            if p < fresh {
                let row = (base + p * head_dim) / 4;
                #[unroll]
                for j in 0..comptime!(head_dim / 4) {
                    let key = keys[row + j];
                    #[unroll]
                    for c in 0..4usize {
                        dot += sq[4 * j + c] * key.extract(c);
                    }
                }
            } else {
                #[unroll]
                for j in 0..head_dim {
                    dot += sq[j] * sk[j];
                }
            }
            score = dot * scale;
        }
        // The chunk's largest score by a tree (eight halvings), rather than every thread
        // reading every score.
        red[tid] = score;
        sync_cube();
        let mut stride = (THREADS / 2).runtime();
        while stride > 0 {
            if tid < stride {
                red[tid] = f32::max(red[tid], red[tid + stride]);
            }
            sync_cube();
            stride /= 2;
        }
        let top = f32::max(m, red[0]);
        let correction = f32::exp(m - top);
        acc *= correction;
        l *= correction;
        m = top;
        // Each position's weight once, not once per value dimension.
        let mut w = 0.0f32;
        if p < len {
            w = f32::exp(score - m);
        }
        sc[tid] = w;
        sync_cube();
        let mut n = len - start;
        if n > THREADS {
            n = THREADS;
        }
        // The values of `VALUE_BATCH` positions loaded before any is added (the batch past `n`
        // masked rather than finished one position at a time): a thread waits on its loads
        // once per batch, not once per position.
        let mut j = part;
        while j < n {
            let mut vals = Array::<f32>::new(VALUE_BATCH);
            let mut ws = Array::<f32>::new(VALUE_BATCH);
            #[unroll]
            for u in 0..VALUE_BATCH {
                let jj = j + u * groups;
                let mut value = 0.0f32;
                let mut weight = 0.0f32;
                if jj < n {
                    let pp = start + jj;
                    weight = sc[jj];
                    value = sv[d];
                    if pp < fresh {
                        value = vc[base + pp * head_dim + d];
                    }
                }
                vals[u] = value;
                ws[u] = weight;
            }
            #[unroll]
            for u in 0..VALUE_BATCH {
                l += ws[u];
                acc += ws[u] * vals[u];
            }
            j += VALUE_BATCH * groups;
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
        for pt in 0..groups {
            a += ra[pt * head_dim + tid];
            s += rl[pt * head_dim + tid];
        }
        if comptime!(partial) {
            // An empty range leaves `LOWEST` and zeros, which the combination weighs as 0.
            let at = (h * CUBE_COUNT_Z as usize + z) * (head_dim + 2);
            parts[at + tid] = a;
            if tid == 0 {
                parts[at + head_dim] = m;
                parts[at + head_dim + 1] = s;
            }
        } else {
            sq[tid] = a / s;
        }
    }
    if comptime!(!partial) {
        sync_cube();
        if live {
            split_head(&sq, xq, xs, t, h, heads, head_dim);
        }
    }
}

/// Prompt positions one cube of [`prompt_attention_kernel`] attends for.
pub(super) const PROMPT_QUERIES: usize = 32;

/// Threads of [`prompt_attention_kernel`] that score one row: each takes every eighth key
/// of a tile.
const ROW_THREADS: usize = 8;

/// The keys a tile of [`prompt_attention_kernel`] holds for heads of `head_dim` values on a
/// device with `max_shared` bytes of shared memory a cube: 32 where they fit (38 KB at 128
/// values), else 16 (28 KB), else none (the kernel does not run; attention goes per row).
/// Heads of 32, 64 or 128 values only: a row's vectors of four must fill whole swizzle groups
/// of eight and the cube's threads must hold 32 rows' outputs in registers.
pub(super) fn prompt_attention_keys(head_dim: usize, max_shared: usize) -> Option<usize> {
    if !head_dim.is_multiple_of(32) || head_dim > 128 {
        return None;
    }
    [32, 16]
        .into_iter()
        .find(|&keys| 4 * prompt_attention_shared(head_dim, keys) <= max_shared)
}

/// The f32 of shared memory [`prompt_attention_kernel`] takes: the rows' queries, a tile of
/// keys (then values), the tile's weights (rows padded by one), the rows' corrections and the
/// row threads' partial maxima.
fn prompt_attention_shared(head_dim: usize, keys: usize) -> usize {
    PROMPT_QUERIES * head_dim
        + keys * head_dim
        + PROMPT_QUERIES * (keys + 1)
        + PROMPT_QUERIES
        + PROMPT_QUERIES * ROW_THREADS
}

/// Causal attention of a prompt pass: head `h` (the grid's `x`) for [`PROMPT_QUERIES`]
/// consecutive rows of the pass (tile `y`) at positions `pos[0] + t`, over the cache, which
/// [`cache_write_kernel`] filled up to the pass's last position; each output split for the
/// o-projection as [`attention_kernel`] splits it.
///
/// [`attention_kernel`] gives each position a cube, which reads every key and value before
/// it: a prompt's attention would read the cache once per position and head. Here a cube holds
/// its rows' rotated queries in shared memory and walks the cache in tiles of `keys` keys,
/// then the same positions' values, each loaded once (coalesced) for all its rows; the softmax
/// is kept per row as a running maximum and sum. Shared-memory reads, not global ones, bound
/// such a kernel, so each thread works on a small block held in registers: while scoring, one
/// row against every eighth key of the tile (a vector of four of the query read once for all
/// of them); while adding values, four consecutive values of `head_dim / 32` rows (a vector of
/// a value read once for all of them). Vectors of a key or query row sit at `e ^ (row % 8)`,
/// so the eight keys (four rows) a warp reads at once fall in distinct banks without padding.
/// A row's eight threads agree on its maximum through shared memory and keep their own
/// partial sums, added once at the end.
///
/// `kc`/`vc` are the cache (`[kv_heads, capacity, head_dim]`) bound as vectors of four.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn prompt_attention_kernel(
    q: &[f32],
    cos: &[f32],
    sin: &[f32],
    pos: &[u32],
    kc: &[F4],
    vc: &[F4],
    xq: &mut [Word4],
    xs: &mut [f32],
    rows: usize,
    capacity: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] group: usize,
    #[comptime] heads: usize,
    #[comptime] keys: usize,
) {
    let h = CUBE_POS_X as usize;
    let g = h / group;
    let t0 = CUBE_POS_Y as usize * PROMPT_QUERIES;
    let tid = UNIT_POS as usize;
    let p0 = pos[0] as usize;
    // Vectors of four in a row of a head.
    let hv = comptime!(head_dim / 4);
    let kpt = comptime!(keys / ROW_THREADS);
    let sp_row = comptime!(keys + 1);
    let mut sq = Shared::<[F4]>::new_slice(comptime!(PROMPT_QUERIES * head_dim / 4));
    let mut skv = Shared::<[F4]>::new_slice(comptime!(keys * head_dim / 4));
    let mut sp = Shared::<[f32]>::new_slice(comptime!(PROMPT_QUERIES * (keys + 1)));
    let mut sc = Shared::<[f32]>::new_slice(PROMPT_QUERIES);
    let mut spart = Shared::<[f32]>::new_slice(comptime!(PROMPT_QUERIES * ROW_THREADS));
    // The rows' live count: rows past the pass, or past the cache (a caller's bug), attend to
    // nothing and write nothing.
    let mut live = rows - t0;
    if t0 >= rows {
        live = 0;
    }
    if live > PROMPT_QUERIES {
        live = PROMPT_QUERIES;
    }
    if p0 + t0 + live > capacity {
        live = 0;
        if p0 + t0 < capacity {
            live = capacity - p0 - t0;
        }
    }
    let mut i = tid;
    while i < comptime!(PROMPT_QUERIES * head_dim / 4) {
        let r = i / hv;
        let e = i % hv;
        let mut four = F4::new(0.0f32);
        if r < live {
            let t = t0 + r;
            let at = (t * heads + h) * head_dim;
            #[unroll]
            for c in 0..4usize {
                four.insert(c, rotated(q, at, 4 * e + c, cos, sin, p0 + t, head_dim));
            }
        }
        sq[r * hv + (e ^ (r % 8))] = four;
        i += THREADS;
    }
    // Keys `0..len`: up to the last live row's position.
    let len = p0 + t0 + live;
    let base = g * capacity * hv;
    // Scoring: row `sr` against keys `kg + 8 * c` of each tile.
    let sr = tid / ROW_THREADS;
    let kg = tid % ROW_THREADS;
    let last = p0 + t0 + sr;
    let mut m = LOWEST.runtime();
    let mut l = 0.0f32;
    // Adding values: vector `vi` of rows `rg * per + u`.
    let per = comptime!(head_dim / 32);
    let vi = tid % hv;
    let rg = tid / hv;
    let mut acc = Array::<F4>::new(per);
    #[unroll]
    for u in 0..per {
        acc[u] = F4::new(0.0f32);
    }
    sync_cube();
    let mut k0 = 0usize;
    if live == 0 {
        k0 = len;
    }
    while k0 < len {
        load_tile(kc, &mut skv, base, k0, len, head_dim, keys);
        sync_cube();
        let mut dots = Array::<F4>::new(kpt);
        #[unroll]
        for c in 0..kpt {
            dots[c] = F4::new(0.0f32);
        }
        #[unroll]
        for e in 0..hv {
            let qv = sq[sr * hv + (e ^ (sr % 8))];
            #[unroll]
            for c in 0..kpt {
                dots[c] += qv * skv[(kg + 8 * c) * hv + (e ^ kg)];
            }
        }
        let mut s = Array::<f32>::new(kpt);
        let mut top = LOWEST.runtime();
        #[unroll]
        for c in 0..kpt {
            let d = dots[c];
            let mut score = LOWEST.runtime();
            if sr < live && k0 + kg + 8 * c <= last {
                score =
                    (d.extract(0usize) + d.extract(1usize) + d.extract(2usize) + d.extract(3usize))
                        * scale;
            }
            s[c] = score;
            top = f32::max(top, score);
        }
        spart[tid] = top;
        sync_cube();
        // The keys are read: the tile's values load while the weights are worked out.
        load_tile(vc, &mut skv, base, k0, len, head_dim, keys);
        top = m;
        #[unroll]
        for k in 0..ROW_THREADS {
            top = f32::max(top, spart[sr * ROW_THREADS + k]);
        }
        let mut sum = 0.0f32;
        #[unroll]
        for c in 0..kpt {
            let mut w = 0.0f32;
            if sr < live && k0 + kg + 8 * c <= last {
                w = f32::exp(s[c] - top);
            }
            sp[sr * sp_row + kg + 8 * c] = w;
            sum += w;
        }
        // The first tile's correction is `exp(LOWEST - top)`: 0, or 1 over a row with no key
        // yet, whose sums are still 0.
        let correction = f32::exp(m - top);
        l = l * correction + sum;
        m = top;
        if kg == 0 {
            sc[sr] = correction;
        }
        sync_cube();
        #[unroll]
        for u in 0..per {
            acc[u] *= F4::new(sc[rg * per + u]);
        }
        #[unroll]
        for j in 0..keys {
            let value = skv[j * hv + (vi ^ (j % 8))];
            #[unroll]
            for u in 0..per {
                acc[u] += value * F4::new(sp[(rg * per + u) * sp_row + j]);
            }
        }
        sync_cube();
        k0 += keys;
    }
    spart[tid] = l;
    sync_cube();
    #[unroll]
    for u in 0..per {
        let r = rg * per + u;
        let mut total = 0.0f32;
        #[unroll]
        for k in 0..ROW_THREADS {
            total += spart[r * ROW_THREADS + k];
        }
        sq[r * hv + (vi ^ (r % 8))] = acc[u] / F4::new(total);
    }
    sync_cube();
    let per_head = comptime!(head_dim / BLOCK);
    if tid < comptime!(PROMPT_QUERIES * head_dim / BLOCK) {
        let r = tid / per_head;
        let b = tid % per_head;
        if r < live {
            let blocks = rows * comptime!(heads * head_dim / BLOCK);
            let mut vals = Array::<F4>::new(4usize);
            #[unroll]
            for i in 0..4usize {
                vals[i] = sq[r * hv + ((4 * b + i) ^ (r % 8))];
            }
            let at = ((t0 + r) * heads + h) * per_head + b;
            split_block(&vals, xq, xs, at, blocks, 8 * blocks);
        }
    }
}

/// Rows `k0..k0 + keys` of a head's cache (vectors of four from `base`) into `tile`, vector
/// `e` of row `j` at `e ^ (j % 8)`; zeros from `len` on.
#[cube]
fn load_tile(
    cache: &[F4],
    tile: &mut Shared<[F4]>,
    base: usize,
    k0: usize,
    len: usize,
    #[comptime] head_dim: usize,
    #[comptime] keys: usize,
) {
    let hv = comptime!(head_dim / 4);
    let mut i = UNIT_POS as usize;
    while i < comptime!(keys * head_dim / 4) {
        let j = i / hv;
        let e = i % hv;
        let mut four = F4::new(0.0f32);
        if k0 + j < len {
            four = cache[base + (k0 + j) * hv + e];
        }
        tile[j * hv + (e ^ (j % 8))] = four;
        i += THREADS;
    }
}

/// Row `t`'s output of head `h` (`head_dim` values in `out`) split for the o-projection, by
/// the cube's first `head_dim / BLOCK` threads.
#[cube]
fn split_head(
    out: &Shared<[f32]>,
    xq: &mut [Word4],
    xs: &mut [f32],
    t: usize,
    h: usize,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
) {
    let tid = UNIT_POS as usize;
    let per_head = head_dim / BLOCK;
    if tid < per_head {
        let blocks = CUBE_COUNT_Y as usize * heads * per_head;
        let mut vals = Array::<F4>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            let mut four = F4::new(0.0f32);
            #[unroll]
            for c in 0..4usize {
                four.insert(c, out[tid * BLOCK + 4 * i + c]);
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

/// The decode step's attention output of head `h` (one cube each, `head_dim` threads) from
/// the `splits` ranges [`attention_kernel`] left in `parts` with `partial`: each range's sum
/// and output weighed by `exp(its maximum - the greatest)`, then split for the o-projection.
#[cube(launch_unchecked)]
pub(super) fn attention_combine_kernel(
    parts: &[f32],
    pos: &[u32],
    xq: &mut [Word4],
    xs: &mut [f32],
    capacity: usize,
    splits: usize,
    #[comptime] head_dim: usize,
    #[comptime] heads: usize,
) {
    let h = CUBE_POS_X as usize;
    let tid = UNIT_POS as usize;
    let mut out = Shared::<[f32]>::new_slice(head_dim);
    let stride = head_dim + 2;
    let first = h * splits * stride;
    if tid < head_dim {
        let mut top = LOWEST.runtime();
        for s in 0..splits {
            top = f32::max(top, parts[first + s * stride + head_dim]);
        }
        let mut num = 0.0f32;
        let mut den = 0.0f32;
        for s in 0..splits {
            let at = first + s * stride;
            let w = f32::exp(parts[at + head_dim] - top);
            num += w * parts[at + tid];
            den += w * parts[at + head_dim + 1];
        }
        out[tid] = num / den;
    }
    sync_cube();
    if (pos[0] as usize) < capacity {
        split_head(&out, xq, xs, 0, h, heads, head_dim);
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

/// Cubes of the greedy choice's first pass ([`argmax_part_kernel`]): enough to spread the
/// vocabulary's read over the device, few enough for one cube to reduce.
pub(super) const ARGMAX_PARTS: usize = THREADS;

/// The greedy choice's first pass: cube `c` finds the first maximum of its slice of `logits`
/// (`n` values in [`ARGMAX_PARTS`] consecutive slices; NaN never chosen) and writes it to
/// `part_v[c]` and its index to `part_i[c]` (index `n` and [`LOWEST`] for a slice without a
/// finite value). Reading the logits once with one cube left most of the device idle while
/// that cube waited on its loads one after another.
#[cube(launch_unchecked)]
pub(super) fn argmax_part_kernel(logits: &[f32], part_v: &mut [f32], part_i: &mut [u32], n: usize) {
    let tid = UNIT_POS as usize;
    let c = CUBE_POS_X as usize;
    let chunk = n.div_ceil(ARGMAX_PARTS);
    let start = c * chunk;
    let mut end = start + chunk;
    if end > n {
        end = n;
    }
    let mut best = LOWEST.runtime();
    let mut at = n;
    // Each thread sees its indices in increasing order: the strict comparison keeps the first.
    let mut i = start + tid;
    while i < end {
        let x = logits[i];
        if x > best {
            best = x;
            at = i;
        }
        i += THREADS;
    }
    let (v, a) = first_maximum(best, u32::cast_from(at));
    if tid == 0 {
        part_v[c] = v;
        part_i[c] = a;
    }
}

/// The greedy choice's second pass: the first maximum over the first pass's
/// [`ARGMAX_PARTS`] slices, then the step's bookkeeping ([`advance`]). One cube of
/// [`THREADS`].
#[cube(launch_unchecked)]
pub(super) fn argmax_kernel(
    part_v: &[f32],
    part_i: &[u32],
    ids: &mut [u32],
    pos: &mut [u32],
    capacity: usize,
) {
    let tid = UNIT_POS as usize;
    let mut v = LOWEST.runtime();
    let mut a = u32::MAX.runtime();
    if tid < ARGMAX_PARTS {
        v = part_v[tid];
        a = part_i[tid];
    }
    let (_, chosen) = first_maximum(v, a);
    if tid == 0 {
        advance(ids, pos, chosen, capacity);
    }
}

/// The largest of the cube's `(value, index)` pairs, the smallest index among equal values,
/// in thread 0 (a tree over shared memory: eight halvings of [`THREADS`]).
#[cube]
fn first_maximum(value: f32, index: u32) -> (f32, u32) {
    let tid = UNIT_POS as usize;
    let mut sv = Shared::<[f32]>::new_slice(THREADS);
    let mut si = Shared::<[u32]>::new_slice(THREADS);
    sv[tid] = value;
    si[tid] = index;
    sync_cube();
    let mut stride = (THREADS / 2).runtime();
    while stride > 0 {
        if tid < stride {
            let v = sv[tid + stride];
            let i = si[tid + stride];
            if v > sv[tid] || (v == sv[tid] && i < si[tid]) {
                sv[tid] = v;
                si[tid] = i;
            }
        }
        sync_cube();
        stride /= 2;
    }
    (sv[0], si[0])
}

/// A step's last act: `choice` becomes the id of position `pos + 1` (within the cache) and the
/// position advances. One thread runs it.
#[cube]
fn advance(ids: &mut [u32], pos: &mut [u32], choice: u32, capacity: usize) {
    let next = pos[0] + 1;
    if (next as usize) <= capacity {
        ids[next as usize] = choice;
    }
    pos[0] = next;
}

/// The sum over a cube of `threads` threads of every thread's `local`, the same in every
/// thread: halvings in shared memory, a barrier each ([`cube_halvings`]), rather than every
/// thread reading every partial sum in turn (as many dependent reads as threads, in every norm
/// and every pass of top-p's search). One more barrier is needed before `shared` is written
/// again ([`cube_sum`]).
#[cube]
fn cube_total(local: f32, shared: &mut Shared<[f32]>, #[comptime] threads: usize) -> f32 {
    shared[UNIT_POS as usize] = local;
    cube_halvings(shared, threads, false);
    shared[0]
}

/// Folds `shared[..threads]` into `shared[0]` by halvings, a barrier after each (the first
/// before any): `shared[i]` and `shared[i + stride]` summed, or with `greatest` their larger.
#[cube]
fn cube_halvings(
    shared: &mut Shared<[f32]>,
    #[comptime] threads: usize,
    #[comptime] greatest: bool,
) {
    let tid = UNIT_POS as usize;
    sync_cube();
    let mut stride = comptime!(threads.next_power_of_two() / 2).runtime();
    while stride > 0 {
        if tid < stride && tid + stride < threads {
            let (a, b) = (shared[tid], shared[tid + stride]);
            if comptime!(greatest) {
                shared[tid] = f32::max(a, b);
            } else {
                shared[tid] = a + b;
            }
        }
        sync_cube();
        stride /= 2;
    }
}

/// [`cube_total`] over [`THREADS`], with `shared` free to be written again after it.
#[cube]
fn cube_sum(local: f32, shared: &mut Shared<[f32]>) -> f32 {
    let total = cube_total(local, shared, THREADS);
    sync_cube();
    total
}

/// `x[first + u * stride]` for `u < LOAD_BATCH`, `fill` from `end` on: one pass's loads, all
/// issued before any is used.
#[cube]
fn load_batch(
    x: &[f32],
    first: usize,
    #[comptime] stride: usize,
    end: usize,
    fill: f32,
) -> Array<f32> {
    let mut batch = Array::<f32>::new(LOAD_BATCH);
    #[unroll]
    for u in 0..LOAD_BATCH {
        let mut v = fill;
        if first + u * stride < end {
            v = x[first + u * stride];
        }
        batch[u] = v;
    }
    batch
}

/// The least (`least`) or the greatest of every thread's `local` over the cube, the same in
/// every thread.
#[cube]
fn cube_extreme(local: u32, shared: &mut Shared<[u32]>, #[comptime] least: bool) -> u32 {
    shared[UNIT_POS as usize] = local;
    sync_cube();
    let mut pick = shared[0];
    for j in 1..THREADS {
        if comptime!(least) {
            pick = u32::min(pick, shared[j]);
        } else {
            pick = u32::max(pick, shared[j]);
        }
    }
    sync_cube();
    pick
}

/// Top-p's first pass: cube `c` writes the largest of its slice of `logits` (`n` values in
/// [`ARGMAX_PARTS`] consecutive slices, as [`argmax_part_kernel`]'s) to `part_m[c]` and the
/// sum of its weights `exp((x - m) * inv_temperature)` relative to that maximum `m` to
/// `part_s[c]`: each thread keeps a running maximum and sum, and the cube combines them. An
/// empty slice writes [`LOWEST`] and 0; a NaN or infinite logit makes its slice's sum NaN.
#[cube(launch_unchecked)]
pub(super) fn softmax_part_kernel(
    logits: &[f32],
    part_m: &mut [f32],
    part_s: &mut [f32],
    n: usize,
    inv_temperature: f32,
) {
    let tid = UNIT_POS as usize;
    let c = CUBE_POS_X as usize;
    let mut shared = Shared::<[f32]>::new_slice(THREADS);
    let chunk = n.div_ceil(ARGMAX_PARTS);
    let start = c * chunk;
    let mut end = start + chunk;
    if end > n {
        end = n;
    }
    let mut m = LOWEST.runtime();
    let mut s = 0.0f32;
    let mut i = start + tid;
    while i < end {
        let x = logits[i];
        let top = f32::max(m, x);
        s = s * f32::exp((m - top) * inv_temperature) + f32::exp((x - top) * inv_temperature);
        m = top;
        i += THREADS;
    }
    let top = cube_greatest(m, &mut shared);
    let total = cube_sum(s * f32::exp((m - top) * inv_temperature), &mut shared);
    if tid == 0 {
        part_m[c] = top;
        part_s[c] = total;
    }
}

/// The greatest of every thread's `local` over the cube, the same in every thread, with
/// `shared` free to be written again after it.
#[cube]
fn cube_greatest(local: f32, shared: &mut Shared<[f32]>) -> f32 {
    shared[UNIT_POS as usize] = local;
    cube_halvings(shared, THREADS, true);
    let top = shared[0];
    sync_cube();
    top
}

/// The weight of `logit` under the maximum `top` and the temperature `1 / inv_temperature`:
/// the one expression every pass of [`top_p_kernel`] computes it by.
#[cube]
fn weight_of(logit: f32, top: f32, inv_temperature: f32) -> f32 {
    f32::exp((logit - top) * inv_temperature)
}

/// The maximum logit, the total weight, the nucleus's goal (`top_p` of the total) and the
/// candidates' floor (`(total - goal) / 2n`, see [`top_p_kernel`]) as `[top, total, goal,
/// floor]`, from the slices' maxima and sums [`softmax_part_kernel`] wrote: the same in every
/// thread, and in every cube of every launch that computes them.
#[cube]
fn nucleus_bounds(
    part_m: &[f32],
    part_s: &[f32],
    n: usize,
    inv_temperature: f32,
    top_p: f32,
    sf: &mut Shared<[f32]>,
) -> Array<f32> {
    let tid = UNIT_POS as usize;
    let mut local = LOWEST.runtime();
    let mut j = tid;
    while j < ARGMAX_PARTS {
        local = f32::max(local, part_m[j]);
        j += THREADS;
    }
    let top = cube_greatest(local, sf);
    let mut local = 0.0f32;
    let mut j = tid;
    while j < ARGMAX_PARTS {
        local += part_s[j] * weight_of(part_m[j], top, inv_temperature);
        j += THREADS;
    }
    let total = cube_sum(local, sf);
    let goal = top_p * total;
    let mut bounds = Array::<f32>::new(4usize);
    bounds[0] = top;
    bounds[1] = total;
    bounds[2] = goal;
    bounds[3] = (total - goal) * 0.5f32 / f32::cast_from(n);
    bounds
}

/// The slice of cube `CUBE_POS_X` (of [`ARGMAX_PARTS`] consecutive slices of `n` values) that
/// thread `UNIT_POS` takes, `[begin, end)`: consecutive runs, in id order.
#[cube]
fn thread_run(n: usize) -> Array<usize> {
    let chunk = n.div_ceil(ARGMAX_PARTS);
    let start = CUBE_POS_X as usize * chunk;
    let mut end = start + chunk;
    if end > n {
        end = n;
    }
    let sub = chunk.div_ceil(THREADS);
    let mut run = Array::<usize>::new(2usize);
    let mut b = start + UNIT_POS as usize * sub;
    if b > end {
        b = end;
    }
    let mut e = b + sub;
    if e > end {
        e = end;
    }
    run[0] = b;
    run[1] = e;
    run
}

/// How many of `logits[begin..end]` weigh at least `floor`.
#[cube]
fn candidates_in(
    logits: &[f32],
    begin: usize,
    end: usize,
    top: f32,
    floor: f32,
    inv_temperature: f32,
) -> u32 {
    let mut count = 0u32;
    let mut i = begin;
    while i < end {
        let batch = load_batch(logits, i, 1usize, end, LOWEST.runtime());
        #[unroll]
        for u in 0..LOAD_BATCH {
            if i + u < end && weight_of(batch[u], top, inv_temperature) >= floor {
                count += 1;
            }
        }
        i += LOAD_BATCH;
    }
    count
}

/// The sum of every thread's `local` over the cube and of those of the threads before this
/// one, as `[all, before]`, with `shared` free to be written again after it.
#[cube]
fn cube_prefix(local: u32, shared: &mut Shared<[u32]>) -> Array<u32> {
    let tid = UNIT_POS as usize;
    shared[tid] = local;
    sync_cube();
    let mut all = 0u32;
    let mut before = 0u32;
    for j in 0..THREADS {
        let m = shared[j];
        all += m;
        if j < tid {
            before += m;
        }
    }
    sync_cube();
    let mut out = Array::<u32>::new(2usize);
    out[0] = all;
    out[1] = before;
    out
}

/// Top-p's second pass: each of [`ARGMAX_PARTS`] cubes counts its slice's candidates (the
/// tokens weighing at least the floor of [`nucleus_bounds`]) into `counts[c]`.
#[cube(launch_unchecked)]
pub(super) fn candidate_count_kernel(
    logits: &[f32],
    part_m: &[f32],
    part_s: &[f32],
    counts: &mut [u32],
    n: usize,
    inv_temperature: f32,
    top_p: f32,
) {
    let mut sf = Shared::<[f32]>::new_slice(THREADS);
    let mut su = Shared::<[u32]>::new_slice(THREADS);
    let bounds = nucleus_bounds(part_m, part_s, n, inv_temperature, top_p, &mut sf);
    let run = thread_run(n);
    let count = candidates_in(
        logits,
        run[0],
        run[1],
        bounds[0],
        bounds[3],
        inv_temperature,
    );
    let sums = cube_prefix(count, &mut su);
    if UNIT_POS == 0 {
        counts[CUBE_POS_X as usize] = sums[0];
    }
}

/// Top-p's third pass: each of [`ARGMAX_PARTS`] cubes copies its slice's candidates, in id
/// order, to `cand` and `cand_ids` after those of the slices before it (`counts`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn candidate_copy_kernel(
    logits: &[f32],
    part_m: &[f32],
    part_s: &[f32],
    counts: &[u32],
    cand: &mut [f32],
    cand_ids: &mut [u32],
    n: usize,
    inv_temperature: f32,
    top_p: f32,
) {
    let tid = UNIT_POS as usize;
    let mut sf = Shared::<[f32]>::new_slice(THREADS);
    let mut su = Shared::<[u32]>::new_slice(THREADS);
    let bounds = nucleus_bounds(part_m, part_s, n, inv_temperature, top_p, &mut sf);
    let top = bounds[0];
    let floor = bounds[3];
    let mut earlier = 0u32;
    if tid < CUBE_POS_X as usize {
        earlier = counts[tid];
    }
    let slices = cube_prefix(earlier, &mut su);
    let run = thread_run(n);
    let count = candidates_in(logits, run[0], run[1], top, floor, inv_temperature);
    let own = cube_prefix(count, &mut su);
    let mut at = (slices[0] + own[1]) as usize;
    let mut i = run[0];
    while i < run[1] {
        let batch = load_batch(logits, i, 1usize, run[1], LOWEST.runtime());
        #[unroll]
        for u in 0..LOAD_BATCH {
            let w = weight_of(batch[u], top, inv_temperature);
            if i + u < run[1] && w >= floor {
                cand[at] = w;
                cand_ids[at] = u32::cast_from(i + u);
                at += 1;
            }
        }
        i += LOAD_BATCH;
    }
}

/// Nucleus sampling over `n` logits with temperature `1 / inv_temperature`, after
/// [`softmax_part_kernel`] wrote the slices' maxima and sums to `part_m`/`part_s` and
/// [`candidate_count_kernel`] and [`candidate_copy_kernel`] the candidates; then the step's
/// bookkeeping ([`advance`]). The draw in `[0, 1)` is `draws[pos + 1]`, written by the host. A
/// NaN or infinite logit chooses nothing (`n`). One cube of [`THREADS`].
///
/// The rule is [`Sampler`](crate::qwen2::Sampler)'s: the weights `exp((x - max) / T)`; the
/// nucleus is the fewest most likely tokens (ties by the lower id) whose weight reaches
/// `top_p` of the total; the draw picks from the nucleus in id order. Without sorting:
/// - Candidates: the tokens whose weight is at least `(total - goal) / 2n`. All the others
///   together weigh less than `total - goal`, so the nucleus has none of them. The two passes
///   before this one copy them out in id order (`cand`, `cand_ids`), each over the vocabulary
///   in [`ARGMAX_PARTS`] cubes rather than one: fewer the more peaked the logits, every token
///   where `top_p` is 1.
/// - The nucleus's smallest weight: weights are non-negative, so their bit patterns order as
///   they do, and a bisection over the bit patterns (30 passes over the candidates) finds the
///   largest `k` whose weights `>= k` reach the goal.
/// - The walks in id order (ties at `k`, then the draw) give each thread a contiguous run of
///   the candidates, so it needs only the sums of the runs before its own.
///
/// The passes over the candidates load [`LOAD_BATCH`] values before they use any: one cube's
/// thread otherwise waits on its loads one after another.
#[cube(launch_unchecked)]
// Index loops and the spelled-out `div_ceil`: what the `#[cube]` expansion takes.
#[allow(
    clippy::too_many_arguments,
    clippy::needless_range_loop,
    clippy::manual_div_ceil
)]
pub(super) fn top_p_kernel(
    part_m: &[f32],
    part_s: &[f32],
    counts: &[u32],
    cand: &[f32],
    cand_ids: &[u32],
    draws: &[f32],
    ids: &mut [u32],
    pos: &mut [u32],
    n: usize,
    capacity: usize,
    inv_temperature: f32,
    top_p: f32,
) {
    let tid = UNIT_POS as usize;
    let mut sf = Shared::<[f32]>::new_slice(THREADS);
    let mut sg = Shared::<[f32]>::new_slice(THREADS);
    let mut su = Shared::<[u32]>::new_slice(THREADS);

    let bounds = nucleus_bounds(part_m, part_s, n, inv_temperature, top_p, &mut sf);
    let total = bounds[1];
    let goal = bounds[2];
    let mut local = 0u32;
    if tid < ARGMAX_PARTS {
        local = counts[tid];
    }
    let sums = cube_prefix(local, &mut su);
    let c = sums[0] as usize;

    // Invariant: the weights `>= lo` reach the goal, those `>= hi` do not (1.0 is 0x3F80_0000).
    // With `top_p` 1 every token is in: no search (`k` 0).
    let mut searched = c;
    if top_p >= 1.0 {
        searched = 0;
    }
    let mut lo = 0u32;
    let mut hi = 0x3F80_0001u32;
    for _ in 0..30u32 {
        let mid = (lo + hi) / 2;
        let mut local = 0.0f32;
        let mut j = tid;
        while j < searched {
            let batch = load_batch(cand, j, THREADS, searched, 0.0f32);
            #[unroll]
            for u in 0..LOAD_BATCH {
                if u32::reinterpret(batch[u]) >= mid {
                    local += batch[u];
                }
            }
            j += LOAD_BATCH * THREADS;
        }
        if cube_sum(local, &mut sf) >= goal {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let k = lo;

    let cchunk = (c + THREADS - 1) / THREADS;
    let mut cbegin = tid * cchunk;
    if cbegin > c {
        cbegin = c;
    }
    let mut cend = cbegin + cchunk;
    if cend > c {
        cend = c;
    }
    // Weights above `k` are in; those equal to `k` join in id order until the goal is reached.
    let mut above = 0.0f32;
    let mut tied = 0.0f32;
    for j in cbegin..cend {
        let w = cand[j];
        let b = u32::reinterpret(w);
        if b > k {
            above += w;
        } else if b == k {
            tied += w;
        }
    }
    sf[tid] = above;
    sg[tid] = tied;
    sync_cube();
    let mut run = 0.0f32;
    for j in 0..THREADS {
        run += sf[j];
    }
    for j in 0..tid {
        run += sg[j];
    }
    let mut last = n;
    for j in cbegin..cend {
        let w = cand[j];
        if u32::reinterpret(w) == k && last == n {
            run += w;
            if run >= goal {
                last = cand_ids[j] as usize;
            }
        }
    }
    // The first tie at which the goal is reached, over all runs (none: rounding, every tie).
    let last_tie = cube_extreme(u32::cast_from(last), &mut su, true) as usize;

    let mut own = 0.0f32;
    for j in cbegin..cend {
        let w = cand[j];
        let b = u32::reinterpret(w);
        if b > k || (b == k && cand_ids[j] as usize <= last_tie) {
            own += w;
        }
    }
    sf[tid] = own;
    sync_cube();
    let mut kept = 0.0f32;
    let mut before = 0.0f32;
    for j in 0..THREADS {
        let s = sf[j];
        kept += s;
        if j < tid {
            before += s;
        }
    }
    sync_cube();
    let next = pos[0] as usize + 1;
    let mut draw = 0.0f32;
    if next <= capacity {
        draw = draws[next] * kept;
    }
    // The member at which the running weight passes the draw, searched by the runs that start
    // at or below it; the lowest id found wins. Rounding may leave none: the last member.
    let mut chosen = n;
    let mut last_member = 0usize;
    let mut run = before;
    for j in cbegin..cend {
        let w = cand[j];
        let b = u32::reinterpret(w);
        let id = cand_ids[j] as usize;
        if b > k || (b == k && id <= last_tie) {
            last_member = id;
            if chosen == n && before <= draw {
                run += w;
                if run > draw {
                    chosen = id;
                }
            }
        }
    }
    let first = cube_extreme(u32::cast_from(chosen), &mut su, true) as usize;
    let fallback = cube_extreme(u32::cast_from(last_member), &mut su, false) as usize;
    if tid == 0 {
        let mut choice = first;
        if choice == n {
            choice = fallback;
        }
        // NaN fails both comparisons; an infinite logit makes the total NaN.
        let finite = total > 0.0 && total <= 3.4e38;
        if !finite {
            choice = n;
        }
        advance(ids, pos, u32::cast_from(choice), capacity);
    }
}
