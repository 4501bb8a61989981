//! The dp4a product launched straight on a CubeCL client, over buffers the caller owns.
//!
//! Burn's op-by-op path allocates every result and passes each op through its dispatch (and
//! Fusion), which is most of a small model's decode step on a GPU. A step that keeps its
//! activations in fixed buffers and records its launches once as a graph
//! (`Client::start_capture`, replayed per token) needs the kernels themselves: [`DirectWeight`]
//! holds a q8 matrix's device buffers, [`product`] launches the dp4a kernel on a split of
//! activations, and the caller's own kernels write that split as they compute their output
//! with [`split_block`], or [`fused_products`] has each cube compute its input itself.

use burn::tensor::{DType, Int, Tensor};
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::server::Handle;

use super::blocks::{self, BlockPart};
pub use super::dot::{Word4, split_block};
use super::fused::StagedSplit;
pub use super::fused::{Prologue, PrologueInput, fused_max_in};
pub use super::matrix::{MatrixScratch, matrix_products, matrix_units};
pub use super::paired::Pairing;
use super::{contiguous, dot, fused, paired};
use crate::blocks::BlockLayout;
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

/// A matrix's device buffers, contiguous, on one CubeCL client: q8 (int8 values and an f16
/// scale per row) or a GGUF's own blocks.
#[derive(Debug, Clone)]
pub struct DirectWeight {
    pub(super) inner: Inner,
}

#[derive(Debug, Clone)]
pub(super) enum Inner {
    Q8 {
        values: CubeTensor,
        scales: Box<CubeTensor>,
    },
    Blocks {
        bytes: CubeTensor,
        layout: BlockLayout,
    },
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
        (values.dtype == DType::I8 && scales.dtype == DType::F16).then_some(Self {
            inner: Inner::Q8 {
                values,
                scales: Box::new(scales),
            },
        })
    }

    /// A GGUF tensor's bytes as the file holds them (U8 `[out, layout.row_bytes()]`), read on
    /// the device by the block kernels; `None` off CubeCL, for another dtype or shape, a type
    /// they do not read (they read Q8_0, Q5_0, Q4_K and Q6_K), or a matrix that is not whole
    /// 4-byte words (the kernels bind words).
    pub fn blocks(bytes: &Tensor<2, Int>, layout: BlockLayout) -> Option<Self> {
        blocks::kind(layout)?;
        let [out, row] = bytes.dims();
        let bytes = cube_int(bytes)?;
        let whole = row == layout.row_bytes() && (out * row).is_multiple_of(4);
        (bytes.dtype == DType::U8 && whole).then_some(Self {
            inner: Inner::Blocks { bytes, layout },
        })
    }

    fn tensor(&self) -> &CubeTensor {
        match &self.inner {
            Inner::Q8 { values, .. } => values,
            Inner::Blocks { bytes, .. } => bytes,
        }
    }

    /// Output rows.
    pub fn out_features(&self) -> usize {
        self.tensor().meta.shape().dims::<2>()[0]
    }

    /// Values per row.
    pub fn in_features(&self) -> usize {
        match &self.inner {
            Inner::Q8 { values, .. } => values.meta.shape().dims::<2>()[1],
            Inner::Blocks { layout, .. } => layout.cols(),
        }
    }

    /// The client the buffers live on.
    pub fn client(&self) -> &Client {
        &self.tensor().client
    }

    /// Device bytes of its values and scales, or of its blocks.
    pub fn bytes(&self) -> u64 {
        match &self.inner {
            Inner::Q8 { values, scales } => {
                values.handle.size_in_used() + scales.handle.size_in_used()
            }
            Inner::Blocks { bytes, .. } => bytes.handle.size_in_used(),
        }
    }

    /// Whether [`staged_product`] reads its input's split in place (block rows: any width)
    /// rather than copying it into shared memory (q8 rows: at most [`fused_max_in`] values).
    pub fn reads_split_in_place(&self) -> bool {
        matches!(self.inner, Inner::Blocks { .. })
    }

    /// What its rows hold: `"q8"`, or the GGUF block type's name.
    pub fn format(&self) -> &'static str {
        match &self.inner {
            Inner::Q8 { .. } => "q8",
            Inner::Blocks { layout, .. } => layout.ty().name(),
        }
    }

    /// The device the buffers live on.
    pub(super) fn device(&self) -> burn_cubecl::CubeDevice {
        self.tensor().device.clone()
    }

    /// The block kernels' binding of the weight with an addend and output, or `None` for q8.
    pub(super) fn block_part<'a>(
        &'a self,
        bias: Option<dot::Addend<'a>>,
        y: &'a Handle,
    ) -> Option<BlockPart<'a>> {
        match &self.inner {
            Inner::Q8 { .. } => None,
            Inner::Blocks { bytes, layout } => Some(BlockPart {
                bytes: &bytes.handle,
                layout: *layout,
                out: self.out_features(),
                bias,
                y,
            }),
        }
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
    /// Products launched together must be one to three and share their width and their kind
    /// of addend.
    #[error("q8 direct products: {0}")]
    Parts(String),
}

pub(super) fn check(what: &'static str, handle: &Handle, needed: usize) -> Result<(), DirectError> {
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

/// What a product adds to its output.
#[derive(Debug, Clone, Copy)]
pub enum Addend<'a> {
    /// Nothing.
    None,
    /// `out` f32 added to every activation row's output: a bias.
    Bias(&'a Handle),
    /// `rows * out` f32, one per output element: a residual stream.
    Residual(&'a Handle),
}

impl<'a> Addend<'a> {
    fn kernel(self) -> Option<dot::Addend<'a>> {
        match self {
            Addend::None => None,
            Addend::Bias(handle) => Some(dot::Addend {
                handle,
                each: false,
            }),
            Addend::Residual(handle) => Some(dot::Addend { handle, each: true }),
        }
    }

    /// The f32 it holds for `rows` rows of `out`.
    pub(super) fn len(self, rows: usize, out: usize) -> usize {
        match self {
            Addend::None => 0,
            Addend::Bias(_) => out,
            Addend::Residual(_) => rows * out,
        }
    }
}

/// One product of a launch: `y = x W^T * scale + add`, `y` receiving `rows * out` f32. The
/// addend and `y` must be different buffers.
#[derive(Debug, Clone, Copy)]
pub struct Product<'a> {
    /// The weight.
    pub weight: &'a DirectWeight,
    /// What is added to the output.
    pub add: Addend<'a>,
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
    add: Addend<'_>,
    y: &Handle,
) -> Result<(), DirectError> {
    products(split, rows, &[Product { weight, add, y }])
}

/// Enqueues one to three products over the same split (q/k/v, gate/up): the weights share
/// their width and their kind of addend. Over q8 rows one launch, its cubes taking several
/// rows from two rows on; over block rows one launch a product, each cube reading eight rows
/// of the split where it lies and decoding each unit of its weight row once for all of them
/// (a prompt's pass reads the weights once per eight positions).
///
/// # Errors
///
/// [`DirectError::BufferTooSmall`] as for [`product`]; [`DirectError::Parts`] for another
/// count of products, differing widths or addends, or weights on another client.
pub fn products(split: &Handle, rows: usize, parts: &[Product<'_>]) -> Result<(), DirectError> {
    launch(split, rows, parts, dot::kernel_tile(rows))
}

/// [`products`] through the kernel compiled for a single activation row, one cube row per
/// activation row. Each row reads the weight again (from the device's cache where the matrix
/// fits there), but a caller that also launches single rows (a prompt's prefill before its
/// decode steps) compiles one kernel for both instead of two: on a GPU that compiles
/// per process, compilation is most of a short prompt's time.
///
/// # Errors
///
/// As for [`products`].
pub fn products_per_row(
    split: &Handle,
    rows: usize,
    parts: &[Product<'_>],
) -> Result<(), DirectError> {
    launch(split, rows, parts, 1)
}

/// Enqueues one to three products (as [`products`]) whose `rows` activation rows, of the
/// weights' width, each cube computes from `input` through `P` ([`Prologue`]) instead of
/// reading a split: the launch that would have written the split is saved. Compiled for
/// single rows, as [`products_per_row`], for rows of at most [`fused_max_in`] values; `P` is
/// part of the kernel, so each prologue compiles its own.
///
/// # Safety
///
/// `P` reads `input`'s buffers only within the lengths given, for `rows` rows of the weights'
/// width, and no output is one of `input`'s buffers.
///
/// # Errors
///
/// As for [`products`], for the outputs, the addends and `input`'s buffers (shorter than the
/// lengths given); [`DirectError::Parts`] for rows wider than [`fused_max_in`].
pub unsafe fn fused_products<P: Prologue>(
    input: PrologueInput<'_>,
    rows: usize,
    parts: &[Product<'_>],
) -> Result<(), DirectError> {
    let (client, inp, kernel_parts) = checked(rows, parts)?;
    check_prologue(client, &input, inp)?;
    // SAFETY: `checked` checked the sizes, widths and addends (see `launch`), and the input's
    // buffers hold the lengths given; the caller vouches that `P` reads within them.
    match kernel_parts {
        Parts::Q8(kernel_parts) => unsafe {
            fused::launch::<P>(client, input, rows, inp, &kernel_parts)
        },
        Parts::Blocks(kernel_parts) => unsafe {
            blocks::launch::<P>(client, input, rows, inp, &kernel_parts)
        },
    }
    Ok(())
}

/// Enqueues two products of `rows` activation rows computed by `P` from `input` (as
/// [`fused_products`]) whose outputs are combined element by element through `C`
/// ([`Pairing`]) and written as their split into `split` ([`split_words`] of `rows` rows of
/// the weights' `out`), the input of the next product ([`staged_product`]): a gated MLP's
/// gate and up projections in one launch, without their rows going through memory.
///
/// # Safety
///
/// As for [`fused_products`]: `P` reads `input`'s buffers only within the lengths given, and
/// `split` is none of them.
///
/// # Errors
///
/// As for [`fused_products`]; [`DirectError::Parts`] where the weights' shapes differ or their
/// rows are not whole blocks of 16.
pub unsafe fn paired_products<'a, P: Prologue, C: Pairing>(
    input: PrologueInput<'_>,
    rows: usize,
    a: &'a DirectWeight,
    b: &'a DirectWeight,
    split: &'a Handle,
) -> Result<(), DirectError> {
    let (out, inp) = paired_shape(a, b)?;
    check_prologue(a.client(), &input, inp)?;
    check("split", split, split_words(rows, out))?;
    // SAFETY: the shapes (`DirectWeight::new` and `DirectWeight::blocks` checked the dtypes,
    // contiguity and layouts), the split's size and the input's lengths were checked above;
    // the caller vouches that `P` reads within them and that `split` is not an input.
    match (&a.inner, &b.inner) {
        (
            Inner::Q8 {
                values: va,
                scales: sa,
            },
            Inner::Q8 {
                values: vb,
                scales: sb,
            },
        ) => unsafe {
            paired::launch::<P, C>(
                a.client(),
                input,
                rows,
                inp,
                [(&va.handle, &sa.handle), (&vb.handle, &sb.handle)],
                out,
                split,
            )
        },
        _ => {
            let (Some(pa), Some(pb)) = (a.block_part(None, split), b.block_part(None, split))
            else {
                return Err(DirectError::Parts(
                    "paired products over a q8 and a block weight".into(),
                ));
            };
            unsafe { blocks::launch_paired::<P, C>(a.client(), input, rows, inp, [pa, pb], split) }
        }
    }
    Ok(())
}

/// Enqueues [`paired_products`] whose input is the split of `rows` rows in `input`
/// ([`split_words`] of the weights' `in`, as [`staged_product`] reads one) rather than computed
/// by every cube: over block rows each cube reads it where it lies, with no prologue, no copy
/// and no limit on the width; over q8 rows each cube copies it into shared memory. Where the
/// input is wide, norming it once in a launch of its own and reading the result costs less
/// than every cube norming it.
///
/// # Errors
///
/// As for [`paired_products`]; [`DirectError::BufferTooSmall`] where `input` holds less than
/// the split of `rows` rows; [`DirectError::Parts`] where `input` is `split`'s buffer.
pub fn paired_split_products<'a, C: Pairing>(
    input: &'a Handle,
    rows: usize,
    a: &'a DirectWeight,
    b: &'a DirectWeight,
    split: &'a Handle,
) -> Result<(), DirectError> {
    let (out, inp) = paired_shape(a, b)?;
    let len = split_words(rows, inp);
    check("input split", input, len)?;
    if input.memory.descriptor() == split.memory.descriptor() {
        return Err(DirectError::Parts(
            "paired products would write the split they read".into(),
        ));
    }
    match (a.block_part(None, split), b.block_part(None, split)) {
        (Some(pa), Some(pb)) => {
            check("split", split, split_words(rows, out))?;
            // SAFETY: `paired_shape` checked the weights' shapes (their layouts were checked
            // when they were made) and both splits' sizes were checked above.
            unsafe {
                blocks::launch_paired_split::<C>(a.client(), input, len, rows, inp, [pa, pb], split)
            };
            Ok(())
        }
        // SAFETY: `StagedSplit` reads row `t < rows` of the split of `rows` rows in `input`,
        // within the `len` words checked above, and `input` is not `split` (checked above).
        _ => unsafe {
            paired_products::<StagedSplit, C>(staged_input(input, len), rows, a, b, split)
        },
    }
}

/// `(out, in)` of two weights a paired launch takes: the same shape, rows in whole blocks of
/// 16, on one client.
fn paired_shape(a: &DirectWeight, b: &DirectWeight) -> Result<(usize, usize), DirectError> {
    let (out, inp) = (a.out_features(), a.in_features());
    if (b.out_features(), b.in_features()) != (out, inp) || !out.is_multiple_of(16) {
        return Err(DirectError::Parts(format!(
            "paired products need two [out, in] weights of the same shape with out % 16 == 0, \
             got [{out}, {inp}] and [{}, {}]",
            b.out_features(),
            b.in_features()
        )));
    }
    if a.client().name() != b.client().name() {
        return Err(DirectError::Parts("weights on different clients".into()));
    }
    Ok((out, inp))
}

/// Enqueues one product over a split in memory (as [`product`]) for a product whose input a
/// launch just wrote ([`paired_products`]). Over q8 rows its cubes fetch their weights before
/// they copy the split into shared memory, so the wait on the weights overlaps the split's
/// (rows of at most [`fused_max_in`] values); over block rows they read the split where it
/// lies, with no copy and no limit on the width.
///
/// # Errors
///
/// As for [`fused_products`].
pub fn staged_product(
    split: &Handle,
    rows: usize,
    product: Product<'_>,
) -> Result<(), DirectError> {
    let len = split_words(rows, product.weight.in_features());
    let (client, inp, kernel_parts) = checked(rows, std::slice::from_ref(&product))?;
    match kernel_parts {
        Parts::Blocks(parts) => {
            check("split", split, len)?;
            // SAFETY: `checked` checked the part's sizes and layout, and the split holds `len`
            // words, `rows` rows of the weight's width.
            unsafe { blocks::launch_split(client, split, len, rows, inp, &parts[0], 1) };
        }
        Parts::Q8(parts) => {
            let input = staged_input(split, len);
            check_prologue(client, &input, inp)?;
            // SAFETY: `StagedSplit` reads row `t < rows` of a split of `rows` rows of the
            // weight's width, within the `len` words checked against the buffer; `checked`
            // checked the part's sizes and addend.
            unsafe { fused::launch::<StagedSplit>(client, input, rows, inp, &parts) };
        }
    }
    Ok(())
}

/// A split of `len` words in memory as [`StagedSplit`] reads it.
fn staged_input(split: &Handle, len: usize) -> PrologueInput<'_> {
    PrologueInput {
        first: split,
        first_len: len,
        second: split,
        second_len: len,
        scalar: 0.0,
    }
}

/// Enqueues the lookup of `rows` rows of a block weight (a token embedding kept as the file's
/// blocks): row `ids[pos[0] + t]`, dequantized, into `out[t * in..(t + 1) * in]` for each
/// `t < rows`; an id past the weight's rows writes nothing. The position is read on the
/// device, so a recorded step can replay the launch.
///
/// # Safety
///
/// `pos[0] + rows <= ids_len` when the launch runs (the host cannot check a value on the
/// device), and `out` is neither `ids` nor `pos`.
///
/// # Errors
///
/// [`DirectError::BufferTooSmall`] for buffers shorter than the lengths given or needed;
/// [`DirectError::Parts`] for a q8 weight.
pub unsafe fn lookup_rows(
    weight: &DirectWeight,
    ids: &Handle,
    ids_len: usize,
    pos: &Handle,
    rows: usize,
    out: &Handle,
) -> Result<(), DirectError> {
    let Some(part) = weight.block_part(None, out) else {
        return Err(DirectError::Parts("a lookup reads block weights".into()));
    };
    check("ids", ids, ids_len)?;
    check("position", pos, 1)?;
    check("rows", out, rows * weight.in_features())?;
    // SAFETY: the lengths were checked above and the caller vouches for the position; the
    // weight's bytes hold its layout's rows (`DirectWeight::blocks`).
    unsafe { blocks::launch_rows(weight.client(), part, ids, ids_len, pos, rows, out) };
    Ok(())
}

/// Whether a prologue's product takes rows of `inp` values on `client`'s device (at most
/// [`fused_max_in`]) and `input`'s buffers hold the lengths it gives.
fn check_prologue(
    client: &Client,
    input: &PrologueInput<'_>,
    inp: usize,
) -> Result<(), DirectError> {
    let widest = fused_max_in(client);
    if inp > widest {
        return Err(DirectError::Parts(format!(
            "rows of {inp} values are wider than a fused product takes on this device \
             ({widest}: its split must fit the cube's shared memory)"
        )));
    }
    check("prologue input", input.first, input.first_len)?;
    check("prologue input", input.second, input.second_len)
}

/// The kernels' descriptions of a launch's parts: all q8, or all blocks.
enum Parts<'a> {
    Q8(Vec<dot::Part<'a>>),
    Blocks(Vec<BlockPart<'a>>),
}

/// The parts' weights' client and width and their kernel descriptions, once every output and
/// addend holds what `rows` rows need and the parts agree.
fn checked<'a>(
    rows: usize,
    parts: &[Product<'a>],
) -> Result<(&'a Client, usize, Parts<'a>), DirectError> {
    let Some(first) = parts.first() else {
        return Err(DirectError::Parts("no products".into()));
    };
    let inp = first.weight.in_features();
    if parts.len() > 3 {
        return Err(DirectError::Parts(format!("{} products", parts.len())));
    }
    for p in parts {
        if p.weight.in_features() != inp
            || std::mem::discriminant(&p.add) != std::mem::discriminant(&first.add)
        {
            return Err(DirectError::Parts(
                "widths or addends differ between the products".into(),
            ));
        }
        if p.weight.client().name() != first.weight.client().name() {
            return Err(DirectError::Parts("weights on different clients".into()));
        }
        let out = p.weight.out_features();
        check("y", p.y, rows * out)?;
        if let Addend::Bias(b) | Addend::Residual(b) = p.add {
            check("addend", b, p.add.len(rows, out))?;
        }
    }
    let q8: Option<Vec<_>> = parts
        .iter()
        .map(|p| match &p.weight.inner {
            Inner::Q8 { values, scales } => Some(dot::Part {
                values,
                scales,
                bias: p.add.kernel(),
                y: p.y,
            }),
            Inner::Blocks { .. } => None,
        })
        .collect();
    let kernel_parts = match q8 {
        Some(q8) => Parts::Q8(q8),
        None => Parts::Blocks(
            parts
                .iter()
                .map(|p| p.weight.block_part(p.add.kernel(), p.y))
                .collect::<Option<_>>()
                .ok_or_else(|| DirectError::Parts("q8 and block weights in one launch".into()))?,
        ),
    };
    Ok((first.weight.client(), inp, kernel_parts))
}

fn launch(
    split: &Handle,
    rows: usize,
    parts: &[Product<'_>],
    tile: usize,
) -> Result<(), DirectError> {
    let (client, inp, kernel_parts) = checked(rows, parts)?;
    let len = split_words(rows, inp);
    check("split", split, len)?;
    match kernel_parts {
        Parts::Q8(kernel_parts) => {
            let tuning = DotTuning::default_for(tile.clamp(1, TILE));
            // SAFETY: the sizes were checked above; every `values` is I8 `[out, in]`,
            // contiguous, with `in % 16 == 0` (checked in `DirectWeight::new`), and the widths
            // and addends agree.
            unsafe { dot::launch_parts(client, split, rows, &kernel_parts, tuning, tile) };
        }
        Parts::Blocks(kernel_parts) if tile > 1 => {
            // A prompt's rows: each cube reads the split where it lies, for a tile of rows.
            for part in &kernel_parts {
                // SAFETY: `checked` checked the part's sizes and layout, and the split holds
                // `len` words, `rows` rows of the weights' width.
                unsafe { blocks::launch_split(client, split, len, rows, inp, part, TILE) };
            }
        }
        Parts::Blocks(kernel_parts) => {
            // Single rows: the block kernels copy the split into shared memory, row by row.
            let input = staged_input(split, len);
            check_prologue(client, &input, inp)?;
            // SAFETY: `StagedSplit` reads row `t < rows` of the split, `len` words checked
            // against the buffer; `checked` checked the parts' sizes and layouts.
            unsafe { blocks::launch::<StagedSplit>(client, input, rows, inp, &kernel_parts) };
        }
    }
    Ok(())
}
