//! The dp4a product launched straight on a CubeCL client, over buffers the caller owns.
//!
//! Burn's op-by-op path allocates every result and passes each op through its dispatch (and
//! Fusion), which is most of a small model's decode step on a GPU. A step that keeps its
//! activations in fixed buffers and records its launches once as a graph
//! (`Client::start_capture`, replayed per token) needs the kernels themselves: [`DirectWeight`]
//! holds a q8 matrix's device buffers, [`product`] launches the dp4a kernel on a split of
//! activations, and the caller's own kernels write that split as they compute their output
//! with [`split_block`].

use burn::tensor::{DType, Int, Tensor};
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::server::Handle;

pub use super::dot::{Word4, split_block};
use super::{contiguous, dot};
use crate::q8::split::{SPLIT_BLOCK, SPLIT_WORDS};
use crate::q8::tuning::{DotTuning, TILE};
use crate::q8::weight::Q8Weight;

/// The CubeCL tensor behind a float tensor, once the work queued on it has run (with Fusion,
/// this drains its stream); `None` when the tensor is not on a CubeCL device.
pub fn cube_float<const D: usize>(tensor: &Tensor<D>) -> Option<CubeTensor> {
    let primitive = tensor
        .clone()
        .try_into_primitive::<burn_cubecl::Cube>()
        .ok()?;
    #[cfg(feature = "fusion")]
    let primitive = primitive
        .client
        .clone()
        .resolve_tensor_float::<burn_cubecl::CubeBackend>(primitive);
    Some(contiguous(&primitive))
}

/// [`cube_float`] for an integer tensor.
pub fn cube_int<const D: usize>(tensor: &Tensor<D, Int>) -> Option<CubeTensor> {
    let primitive = tensor
        .clone()
        .try_into_primitive::<burn_cubecl::Cube>()
        .ok()?;
    #[cfg(feature = "fusion")]
    let primitive = primitive
        .client
        .clone()
        .resolve_tensor_int::<burn_cubecl::CubeBackend>(primitive);
    Some(contiguous(&primitive))
}

/// Words of the split of `rows` activation rows of `inp` values (`inp % 16 == 0`): the size of
/// the buffer [`product`] reads, in 4-byte words.
pub fn split_words(rows: usize, inp: usize) -> usize {
    SPLIT_WORDS * rows * inp / SPLIT_BLOCK
}

/// A q8 matrix's device buffers, contiguous, on one CubeCL client.
#[derive(Debug, Clone)]
pub struct DirectWeight {
    values: CubeTensor,
    scales: CubeTensor,
}

impl DirectWeight {
    /// The buffers of `weight`; `None` off CubeCL or where the dp4a kernel does not run a row
    /// of its width (`in % 16 != 0`).
    pub fn new(weight: &Q8Weight) -> Option<Self> {
        if !dot::fits(weight.in_features()) {
            return None;
        }
        let values = cube_int(weight.values())?;
        let scales = cube_float(weight.scales())?;
        (values.dtype == DType::I8 && scales.dtype == DType::F16).then_some(Self { values, scales })
    }

    /// Output rows.
    pub fn out_features(&self) -> usize {
        self.values.meta.shape().dims::<2>()[0]
    }

    /// Values per row.
    pub fn in_features(&self) -> usize {
        self.values.meta.shape().dims::<2>()[1]
    }

    /// The client the buffers live on.
    pub fn client(&self) -> &Client {
        &self.values.client
    }
}

/// Why a direct launch was refused.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    /// A buffer is smaller than what the launch reads or writes there.
    #[error("q8 direct product: {what} holds {found} bytes, needs {needed}")]
    BufferTooSmall {
        /// Which operand.
        what: &'static str,
        /// Its bytes.
        found: u64,
        /// The bytes the launch needs.
        needed: u64,
    },
    /// Products launched together must be one to three, share their width and either all have
    /// a bias or none.
    #[error("q8 direct products: {0}")]
    Parts(String),
}

fn check(what: &'static str, handle: &Handle, needed: usize) -> Result<(), DirectError> {
    let found = handle.size_in_used();
    let needed = (needed * size_of::<u32>()) as u64;
    if found < needed {
        return Err(DirectError::BufferTooSmall {
            what,
            found,
            needed,
        });
    }
    Ok(())
}

/// One product of a launch: `y = x W^T * scale (+ bias)`, `bias` holding `out` f32 (a
/// residual stream works as well as a bias: the kernel adds it per output row) and `y`
/// receiving `rows * out` f32. `bias` and `y` must be different buffers.
#[derive(Debug, Clone, Copy)]
pub struct Product<'a> {
    /// The weight.
    pub weight: &'a DirectWeight,
    /// The per-row addend.
    pub bias: Option<&'a Handle>,
    /// The output.
    pub y: &'a Handle,
}

/// Enqueues one product for `rows` activation rows on the weight's client: `split` holds
/// their split ([`split_words`] words, as [`split_block`] writes it). No allocation, read or
/// synchronization, so a capture can record it.
///
/// # Errors
///
/// [`DirectError::BufferTooSmall`] when a buffer is smaller than the product needs.
pub fn product(
    split: &Handle,
    rows: usize,
    weight: &DirectWeight,
    bias: Option<&Handle>,
    y: &Handle,
) -> Result<(), DirectError> {
    products(split, rows, &[Product { weight, bias, y }])
}

/// Enqueues one to three products over the same split as one launch (q/k/v, gate/up): the
/// weights share their width and whether they have a bias.
///
/// # Errors
///
/// [`DirectError::BufferTooSmall`] as for [`product`]; [`DirectError::Parts`] for another
/// count of products, differing widths or biases, or weights on another client.
pub fn products(split: &Handle, rows: usize, parts: &[Product<'_>]) -> Result<(), DirectError> {
    let Some(first) = parts.first() else {
        return Err(DirectError::Parts("no products".into()));
    };
    let inp = first.weight.in_features();
    if parts.len() > 3 {
        return Err(DirectError::Parts(format!("{} products", parts.len())));
    }
    check("split", split, split_words(rows, inp))?;
    for p in parts {
        if p.weight.in_features() != inp || p.bias.is_some() != first.bias.is_some() {
            return Err(DirectError::Parts(
                "widths or biases differ between the products".into(),
            ));
        }
        if p.weight.client().name() != first.weight.client().name() {
            return Err(DirectError::Parts("weights on different clients".into()));
        }
        let out = p.weight.out_features();
        check("y", p.y, rows * out)?;
        if let Some(b) = p.bias {
            check("bias", b, out)?;
        }
    }
    let tuning = DotTuning::default_for(rows.clamp(1, TILE));
    let launch: Vec<dot::Part<'_>> = parts
        .iter()
        .map(|p| dot::Part {
            values: &p.weight.values,
            scales: &p.weight.scales,
            bias: p.bias,
            y: p.y,
        })
        .collect();
    // SAFETY: the sizes were checked above; every `values` is I8 `[out, in]`, contiguous, with
    // `in % 16 == 0` (checked in `DirectWeight::new`), and the widths and biases agree.
    unsafe { dot::launch_parts(first.weight.client(), split, rows, &launch, tuning) };
    Ok(())
}
