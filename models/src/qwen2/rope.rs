//! Rotary position embedding in the Hugging Face "rotate_half" convention.
//!
//! The head dimension is split into a first and a second half; pair `(x[i], x[i + d/2])`
//! is rotated by angle `pos * theta^(-2i/d)`:
//! `out = x * cos + rotate_half(x) * sin`, `rotate_half(x) = [-x2, x1]`.
//!
//! The angle table is computed on the host for the positions of one forward call and
//! uploaded once; every layer reuses it. The arithmetic follows transformers' float32
//! recipe (`inv_freq` and `pos * inv_freq` rounded to f32 before `cos`/`sin`), because at
//! large positions computing the angle in f64 instead would move it by up to ~1e-3 rad
//! away from what the reference model (and the weights' training) used.

use burn::tensor::{DType, Device, Tensor, TensorData};

/// `cos` and `sin` tables of shape `[1, seq, 1, head_dim]`, ready to broadcast over
/// `[batch, seq, heads, head_dim]`.
pub(crate) struct RopeTables {
    cos: Tensor<4>,
    sin: Tensor<4>,
}

impl RopeTables {
    pub(crate) fn new(
        theta: f64,
        head_dim: usize,
        start: usize,
        len: usize,
        dtype: DType,
        device: &Device,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = vec![0f32; len * head_dim];
        let mut sin = vec![0f32; len * head_dim];
        for (i, pos) in (start..start + len).enumerate() {
            let (c, s) = (
                &mut cos[i * head_dim..(i + 1) * head_dim],
                &mut sin[i * head_dim..(i + 1) * head_dim],
            );
            angles(theta, head_dim, pos, &mut c[..half], &mut s[..half]);
            // Both halves of the head use the same angles.
            c.copy_within(..half, half);
            s.copy_within(..half, half);
        }
        let shape = [1, len, 1, head_dim];
        let upload = |v: Vec<f32>| {
            let t = Tensor::<4>::from_data(TensorData::new(v, shape), (device, DType::F32));
            if dtype == DType::F32 {
                t
            } else {
                t.cast(dtype)
            }
        };
        Self {
            cos: upload(cos),
            sin: upload(sin),
        }
    }

    /// Rotate `x` of shape `[batch, seq, heads, head_dim]`.
    pub(crate) fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let [_, _, _, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

/// `cos` and `sin` of the `head_dim / 2` angles of position `pos`, in transformers' float32
/// recipe (see the module documentation).
pub(crate) fn angles(theta: f64, head_dim: usize, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
    let base = theta as f32;
    for (i, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
        let inv_freq = 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32);
        let angle = (pos as f32 * inv_freq) as f64;
        *c = angle.cos() as f32;
        *s = angle.sin() as f32;
    }
}

/// Rotates each `head_dim`-wide head of `x` in place by the angles of [`angles`] (`cos`, `sin`
/// hold `head_dim / 2` values): the host step's form of [`RopeTables::apply`].
pub(crate) fn rotate(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        let (x1, x2) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = a * cos[i] - b * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}
