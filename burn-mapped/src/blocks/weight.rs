//! [`BlockWeight`], [`BlockInput`] and the products over them, on Flex tensors read in place.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::act::{self, ACT_BLOCK, Acts};
use super::error::BlockError;
use super::kernel::{Isa, Product, matmul_many, matmul_many_into};
use crate::error::StoreError;
use crate::gguf::BlockLayout;
use crate::placement::is_flex;
use crate::store::MappedStore;

/// A matrix of quantized GGUF blocks: a `u8` tensor `[out, layout.row_bytes()]` (on Flex, for
/// a store, the mapped file pages; on a GPU, the bytes uploaded as they are) and the layout
/// that says what the bytes hold. The host products and [`dequantize_rows`](Self::dequantize_rows)
/// read it on Flex; on a CubeCL device the direct kernels do (`q8::direct::DirectWeight::blocks`).
///
/// Borrowed by [`block_linear`], never consumed or written.
#[derive(Debug, Clone)]
pub struct BlockWeight {
    bytes: Tensor<2, Int>,
    layout: BlockLayout,
}

impl BlockWeight {
    /// Pairs the bytes with their layout after checking dtype, shape and device.
    ///
    /// # Errors
    ///
    /// [`BlockError::DType`] unless `bytes` is U8, [`BlockError::Shape`] unless its rows are
    /// `layout.row_bytes()` long.
    pub fn new(bytes: Tensor<2, Int>, layout: BlockLayout) -> Result<Self, BlockError> {
        if bytes.dtype() != DType::U8 {
            return Err(BlockError::DType {
                what: "block weight",
                found: bytes.dtype(),
                expected: "U8",
            });
        }
        let [out, row] = bytes.dims();
        if row != layout.row_bytes() {
            return Err(BlockError::Shape {
                what: "block weight",
                found: vec![out, row],
                expected: format!(
                    "[{out}, {}] ({} values of {} per row)",
                    layout.row_bytes(),
                    layout.cols(),
                    layout.ty().name()
                ),
            });
        }
        Ok(Self { bytes, layout })
    }

    /// The block matrix `name` of `store`, adopting its mapped pages (no copy).
    ///
    /// # Errors
    ///
    /// [`BlockError::NotBlocks`] if the manifest gives `name` no block layout, store errors
    /// if it is absent, and the checks of [`new`](Self::new).
    pub fn from_store(
        store: &MappedStore,
        name: &str,
        device: &Device,
    ) -> Result<Self, BlockError> {
        let entry = store.manifest().get(name).ok_or_else(|| {
            BlockError::Store(Box::new(StoreError::TensorNotFound {
                tensor: name.to_string(),
                dir: store.dir().to_path_buf(),
            }))
        })?;
        let layout = entry.blocks().ok_or_else(|| BlockError::NotBlocks {
            tensor: name.to_string(),
        })?;
        let store_err = |e| BlockError::Store(Box::new(e));
        #[cfg(feature = "wgpu")]
        if let Some(mut staging) = crate::upload::Staging::begin(device) {
            let bytes = store.bytes(name).map_err(store_err)?;
            let shape = burn::tensor::Shape::from(entry.shape().to_vec());
            let uploaded = staging
                .int::<2>(name, bytes, shape, DType::U8)
                .map_err(store_err)?;
            staging.finish().map_err(store_err)?;
            if let Some(tensor) = uploaded {
                return Self::new(tensor, layout);
            }
        }
        let data = store.tensor_data(name).map_err(store_err)?;
        Self::new(
            Tensor::<2, Int>::from_data(data, (device, DType::U8)),
            layout,
        )
    }

    /// Rows of the matrix (`out`).
    pub fn out_features(&self) -> usize {
        self.bytes.dims()[0]
    }

    /// Values per row (`in`).
    pub fn in_features(&self) -> usize {
        self.layout.cols()
    }

    /// What the bytes hold.
    pub fn layout(&self) -> BlockLayout {
        self.layout
    }

    /// The bytes, `[out, row_bytes]`.
    pub fn bytes(&self) -> &Tensor<2, Int> {
        &self.bytes
    }

    /// Bytes a product reads from the weight.
    pub fn byte_len(&self) -> usize {
        self.out_features() * self.layout.row_bytes()
    }

    /// Rows `ids` dequantized to f32, one after another, appended to `out` (`ids.len() * in`
    /// values): a token embedding kept as blocks decodes only the rows it looks up, and no f32
    /// copy of the table ever exists.
    ///
    /// # Errors
    ///
    /// [`BlockError::Shape`] for an id past the last row, [`BlockError::Device`] off Flex.
    pub fn dequantize_rows(&self, ids: &[usize], out: &mut Vec<f32>) -> Result<(), BlockError> {
        check_flex("block weight", &self.bytes.device())?;
        let rows = self.out_features();
        if let Some(&id) = ids.iter().find(|&&id| id >= rows) {
            return Err(BlockError::Shape {
                what: "embedding row",
                found: vec![id],
                expected: format!("a row below {rows}"),
            });
        }
        let bytes = contiguous(
            self.bytes
                .clone()
                .try_into_primitive::<Flex>()
                .expect("checked above: on Flex"),
        );
        let bytes = bytes.as_slice::<u8>().expect("u8");
        let (row_bytes, cols) = (self.layout.row_bytes(), self.layout.cols());
        let start = out.len();
        out.resize(start + ids.len() * cols, 0.0);
        for (&id, dst) in ids.iter().zip(out[start..].chunks_exact_mut(cols)) {
            let row = &bytes[id * row_bytes..(id + 1) * row_bytes];
            crate::gguf::dequantize(self.layout.ty(), row, dst)
                .expect("a layout's rows are whole blocks of a type it decodes");
        }
        Ok(())
    }
}

/// Activations `[T, in]` quantized once (8 bits per value, a scale per 32) for any number of
/// products over the same rows: the query, key and value projections, or gate and up.
#[derive(Debug, Clone)]
pub struct BlockInput {
    /// Packed rows (see `act`), U8 `[T, act::row_bytes(in)]`.
    packed: Tensor<2, Int>,
    inp: usize,
    dtype: DType,
}

impl BlockInput {
    /// Quantizes `x` (`[T, in]`, any float dtype, on Flex; `in % 32 == 0`).
    ///
    /// # Errors
    ///
    /// [`BlockError::Shape`] when `in` is not a multiple of 32, [`BlockError::Device`] off
    /// Flex.
    pub fn new(x: Tensor<2>) -> Result<Self, BlockError> {
        let [t, inp] = x.dims();
        if !inp.is_multiple_of(ACT_BLOCK) {
            return Err(BlockError::Shape {
                what: "block product input",
                found: vec![t, inp],
                expected: format!("[{t}, a multiple of {ACT_BLOCK}]"),
            });
        }
        check_flex("block product input", &x.device())?;
        let dtype = x.dtype();
        let device = x.device();
        let x = if dtype == DType::F32 {
            x
        } else {
            x.cast(DType::F32)
        };
        let flex = contiguous(x.try_into_primitive::<Flex>().expect("checked: on Flex"));
        let packed = act::quantize(flex.as_slice::<f32>().expect("f32"), t, inp);
        let packed = Tensor::<2, Int>::from_data(
            TensorData::new(packed, [t, act::row_bytes(inp)]),
            (&device, DType::U8),
        );
        Ok(Self { packed, inp, dtype })
    }

    /// `[T, in]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.packed.dims()[0], self.inp]
    }
}

/// `y = x W^T + bias` for a block weight: `x` is `[T, in]`, the result `[T, out]` in `x`'s
/// dtype. The activations are quantized to 8 bits per value with a scale per 32 (see
/// [`BlockInput`]); accumulation is exact in integers within each block and f32 across them.
///
/// # Errors
///
/// [`BlockError::Shape`] for an `x` whose width is not the weight's or a bias not `[out]`,
/// [`BlockError::Device`] for operands off Flex.
pub fn block_linear(
    x: Tensor<2>,
    w: &BlockWeight,
    bias: Option<Tensor<1>>,
) -> Result<Tensor<2>, BlockError> {
    block_linear_input(&BlockInput::new(x)?, w, bias)
}

/// [`block_linear`] on activations quantized once for several products.
///
/// # Errors
///
/// As [`block_linear`].
pub fn block_linear_input(
    input: &BlockInput,
    w: &BlockWeight,
    bias: Option<Tensor<1>>,
) -> Result<Tensor<2>, BlockError> {
    let mut y = products(input, &[(w, bias)], Isa::detect())?;
    Ok(y.pop().expect("one product"))
}

/// The products of several weights over one input (a layer's query, key and value, or gate
/// and up), computed in one pass of the thread pool: their rows are shared out among the
/// threads as if they were one matrix, so the small products do not each wait for the pool.
///
/// # Errors
///
/// As [`block_linear`], for any of the weights.
pub fn block_linear_shared(
    input: &BlockInput,
    layers: &[(&BlockWeight, Option<Tensor<1>>)],
) -> Result<Vec<Tensor<2>>, BlockError> {
    products(input, layers, Isa::detect())
}

/// [`block_linear_shared`] for a caller that keeps its activations and results in host memory
/// (a decode step run outside Burn's op-by-op dispatch): `x` is `[t, in]` row-major, and
/// `outs[i]` receives layer `i`'s `[t, out_i]`, row-major. No tensor is created.
///
/// # Errors
///
/// [`BlockError::Shape`] when `x`, an output or a bias does not fit, or `in` is not a
/// multiple of 32; [`BlockError::Device`] for operands off Flex.
pub fn block_linear_into(
    x: &[f32],
    t: usize,
    layers: &[(&BlockWeight, Option<Tensor<1>>)],
    outs: &mut [&mut [f32]],
) -> Result<(), BlockError> {
    let inp = x.len().checked_div(t).unwrap_or(0);
    if t == 0 || x.len() != t * inp || !inp.is_multiple_of(ACT_BLOCK) {
        return Err(BlockError::Shape {
            what: "block product input",
            found: vec![t, x.len()],
            expected: format!("{t} rows of a multiple of {ACT_BLOCK} values"),
        });
    }
    if outs.len() != layers.len() {
        return Err(BlockError::Shape {
            what: "block product outputs",
            found: vec![outs.len()],
            expected: format!("{} (one per layer)", layers.len()),
        });
    }
    for ((w, _), y) in layers.iter().zip(outs.iter()) {
        if y.len() != t * w.out_features() {
            return Err(BlockError::Shape {
                what: "block product output",
                found: vec![y.len()],
                expected: format!("[{t}, {}]", w.out_features()),
            });
        }
    }
    let (weights, biases) = operands(layers, t, inp)?;
    let packed = act::quantize(x, t, inp);
    let acts = Acts::parse(&packed, t, inp);
    let ps = product_list(layers, &weights, &biases, &acts, t);
    matmul_many_into(&ps, Isa::detect(), outs);
    Ok(())
}

/// The products with a chosen inner loop (tests hold every loop the CPU has to the definition).
pub(super) fn products(
    input: &BlockInput,
    layers: &[(&BlockWeight, Option<Tensor<1>>)],
    isa: Isa,
) -> Result<Vec<Tensor<2>>, BlockError> {
    let [t, inp] = input.dims();
    let (weights, biases) = operands(layers, t, inp)?;
    let packed = contiguous(
        input
            .packed
            .clone()
            .try_into_primitive::<Flex>()
            .expect("checked: on Flex"),
    );
    let acts = Acts::parse(packed.as_slice::<u8>().expect("u8"), t, inp);
    let ps = product_list(layers, &weights, &biases, &acts, t);
    Ok(matmul_many(&ps, isa)
        .into_iter()
        .zip(layers)
        .map(|(y, (w, _))| {
            let y = Tensor::<2>::from_primitive::<Flex>(FlexTensor::from_data(TensorData::new(
                y,
                [t, w.out_features()],
            )));
            if input.dtype == DType::F32 {
                y
            } else {
                y.cast(input.dtype)
            }
        })
        .collect())
}

/// The weights' bytes and the biases as f32, checked against an input of `[t, inp]`.
#[allow(clippy::type_complexity)]
fn operands(
    layers: &[(&BlockWeight, Option<Tensor<1>>)],
    t: usize,
    inp: usize,
) -> Result<(Vec<FlexTensor>, Vec<Option<FlexTensor>>), BlockError> {
    let mut weights = Vec::with_capacity(layers.len());
    let mut biases = Vec::with_capacity(layers.len());
    for (w, bias) in layers {
        let out = w.out_features();
        check_flex("block weight", &w.bytes.device())?;
        if inp != w.in_features() {
            return Err(BlockError::Shape {
                what: "block product input",
                found: vec![t, inp],
                expected: format!("[{t}, {}]", w.in_features()),
            });
        }
        biases.push(match bias {
            Some(b) if b.dims() != [out] => {
                return Err(BlockError::Shape {
                    what: "block product bias",
                    found: b.dims().to_vec(),
                    expected: format!("[{out}]"),
                });
            }
            Some(b) => {
                check_flex("block product bias", &b.device())?;
                let b = if b.dtype() == DType::F32 {
                    b.clone()
                } else {
                    b.clone().cast(DType::F32)
                };
                Some(contiguous(
                    b.try_into_primitive::<Flex>().expect("checked: on Flex"),
                ))
            }
            None => None,
        });
        weights.push(contiguous(
            w.bytes
                .clone()
                .try_into_primitive::<Flex>()
                .expect("checked: on Flex"),
        ));
    }
    Ok((weights, biases))
}

fn product_list<'a>(
    layers: &[(&BlockWeight, Option<Tensor<1>>)],
    weights: &'a [FlexTensor],
    biases: &'a [Option<FlexTensor>],
    acts: &'a Acts<'a>,
    t: usize,
) -> Vec<Product<'a>> {
    layers
        .iter()
        .zip(weights)
        .zip(biases)
        .map(|(((w, _), bytes), bias)| Product {
            w: bytes.as_slice::<u8>().expect("u8"),
            layout: w.layout,
            out: w.out_features(),
            acts,
            t,
            bias: bias.as_ref().map(|b| b.as_slice::<f32>().expect("f32")),
        })
        .collect()
}

fn check_flex(what: &'static str, device: &Device) -> Result<(), BlockError> {
    if is_flex(device) {
        Ok(())
    } else {
        Err(BlockError::Device {
            what,
            device: format!("{device:?}"),
        })
    }
}

/// `t` itself when its elements are contiguous from offset 0 (always so for adopted store
/// tensors), a contiguous copy otherwise.
fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.is_contiguous() && t.layout().start_offset() == 0 {
        t
    } else {
        t.to_contiguous()
    }
}
