//! The model's 2-D projections, each a float [`Linear`], a packed-int8 [`Q8Linear`] or a
//! [`BlockLinear`] over the checkpoint's own GGUF blocks, with the same module paths in every
//! case.

use burn::module::{
    Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper, ModuleVisitor,
    Param, ParamId,
};
use burn::nn::Linear;
use burn::tensor::{DType, Device, Int, Shape, Tensor};
use burn_mapped::Stager;
use burn_mapped::blocks::{
    BlockError, BlockInput, BlockLayout, BlockWeight, block_linear, block_linear_shared,
};
use burn_mapped::q8::{Q8Error, Q8Input, Q8Weight, q8_linear, q8_linear_input};

/// A q8 linear layer: `y = (x W^T) * scale + bias` with `W` int8 `[out, in]` and one f16 scale
/// per output row. Parameter names match the store's q8 tensors: `weight` (I8),
/// `weight_scale` (F16) and the float `bias`.
#[derive(Module, Debug)]
pub struct Q8Linear {
    /// `[out, in]`, dtype I8.
    pub weight: Param<Tensor<2, Int>>,
    /// `[out]`, dtype F16.
    pub weight_scale: Param<Tensor<1>>,
    /// `[out]`, float.
    pub bias: Option<Param<Tensor<1>>>,
}

impl Q8Linear {
    /// A layer whose parameters stay uninitialized (zeros of the right dtype if read) until a
    /// record or store is loaded over them.
    pub fn new_lazy(d_in: usize, d_out: usize, bias: bool, device: &Device) -> Self {
        let lazy_int = |shape: [usize; 2], dtype: DType| {
            Param::uninitialized(
                ParamId::new(),
                move |device: &Device, _| Tensor::<2, Int>::zeros(shape, (device, dtype)),
                device.clone(),
                false,
                Shape::new(shape),
            )
        };
        let lazy_float = |len: usize, dtype: DType| {
            Param::uninitialized(
                ParamId::new(),
                move |device: &Device, _| Tensor::<1>::zeros([len], (device, dtype)),
                device.clone(),
                false,
                Shape::new([len]),
            )
        };
        Self {
            weight: lazy_int([d_out, d_in], DType::I8),
            weight_scale: lazy_float(d_out, DType::F16),
            bias: bias.then(|| lazy_float(d_out, DType::F32)),
        }
    }

    /// The weight as the op takes it, checked (dtype I8 / F16, shapes, devices).
    pub fn q8_weight(&self) -> Result<Q8Weight, Q8Error> {
        Q8Weight::new(self.weight.val(), self.weight_scale.val())
    }

    /// [`q8_weight`](Self::q8_weight) for a forward pass, where parameters that are not a q8
    /// weight are a loader bug.
    fn loaded_weight(&self) -> Q8Weight {
        self.q8_weight()
            .unwrap_or_else(|e| panic!("Q8Linear parameters: {e}"))
    }

    /// Applies the layer to the last dimension of `x` (`[..., in]` to `[..., out]`); leading
    /// dimensions are flattened into the op's activation rows.
    ///
    /// # Panics
    ///
    /// If the loaded parameters are not a q8 weight of `x`'s width (a loader bug: check
    /// stores with [`q8_weight`](Self::q8_weight) after loading).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let weight = self.loaded_weight();
        on_rows(x, |x| {
            q8_linear(x, &weight, self.bias.as_ref().map(|b| b.val()))
                .unwrap_or_else(|e| panic!("Q8Linear: {e}"))
        })
    }

    /// Applies the layer to a prepared input (`[rows, in]`, see [`Q8Input`]), which the other
    /// layers reading the same rows share.
    ///
    /// # Panics
    ///
    /// As [`forward`](Self::forward).
    pub fn forward_input(&self, input: &Q8Input) -> Tensor<2> {
        let weight = self.loaded_weight();
        q8_linear_input(input, &weight, self.bias.as_ref().map(|b| b.val()))
            .unwrap_or_else(|e| panic!("Q8Linear: {e}"))
    }
}

/// A linear layer over quantized GGUF blocks kept as the checkpoint holds them
/// ([`burn_mapped::blocks`]): `weight` is the u8 `[out, row_bytes]` tensor of the store, the
/// float `bias` as for the other kinds. Runs on Flex.
#[derive(Module, Debug)]
pub struct BlockLinear {
    /// `[out, layout.row_bytes()]`, dtype U8.
    pub weight: Param<Tensor<2, Int>>,
    /// `[out]`, float.
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    layout: BlockLayout,
}

impl BlockLinear {
    /// A layer whose parameters stay uninitialized until a store is loaded over them.
    pub fn new_lazy(layout: BlockLayout, d_out: usize, bias: bool, device: &Device) -> Self {
        let shape = [d_out, layout.row_bytes()];
        Self {
            weight: Param::uninitialized(
                ParamId::new(),
                move |device: &Device, _| Tensor::<2, Int>::zeros(shape, (device, DType::U8)),
                device.clone(),
                false,
                Shape::new(shape),
            ),
            bias: bias.then(|| {
                Param::uninitialized(
                    ParamId::new(),
                    move |device: &Device, _| Tensor::<1>::zeros([d_out], (device, DType::F32)),
                    device.clone(),
                    false,
                    Shape::new([d_out]),
                )
            }),
            layout,
        }
    }

    /// The weight as the product takes it, checked (dtype, row length, device).
    pub fn block_weight(&self) -> Result<BlockWeight, BlockError> {
        BlockWeight::new(self.weight.val(), self.layout)
    }

    /// What the weight's bytes hold.
    pub fn layout(&self) -> BlockLayout {
        self.layout
    }

    /// Applies the layer to the last dimension of `x`, leading dimensions flattened into rows
    /// (layers sharing one input go through [`Projection::forward_shared`]).
    ///
    /// # Panics
    ///
    /// If the loaded parameters do not fit the layout or `x` (a loader bug).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let weight = self
            .block_weight()
            .unwrap_or_else(|e| panic!("BlockLinear parameters: {e}"));
        on_rows(x, |x| {
            block_linear(x, &weight, self.bias.as_ref().map(|b| b.val()))
                .unwrap_or_else(|e| panic!("BlockLinear: {e}"))
        })
    }
}

/// `f` (a product over `[rows, in]`) applied to the last dimension of `x`: leading dimensions
/// are flattened into the product's rows and restored around its `out` columns.
fn on_rows<const D: usize>(x: Tensor<D>, f: impl FnOnce(Tensor<2>) -> Tensor<2>) -> Tensor<D> {
    let dims = x.dims();
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = f(x.reshape([rows, dims[D - 1]]));
    let mut out = dims;
    out[D - 1] = y.dims()[1];
    y.reshape(out)
}

/// A projection stored as float, as q8 or as GGUF blocks.
///
/// Its `Module` implementation is transparent: it visits the inner layer without adding a
/// path segment (a derived enum would add the variant name), so `q_proj.weight` is the
/// parameter's path for both kinds and stores need no remapping.
#[derive(Debug, Clone)]
pub enum Projection {
    /// Float weights (`weight` `[out, in]`, `LinearLayout::Col`).
    Float(Linear),
    /// Int8 weights with per-row f16 scales.
    Q8(Q8Linear),
    /// The checkpoint's quantized blocks.
    Blocks(BlockLinear),
    /// The per-use-copy placement: the inner projection's parameters rest where they were
    /// loaded (for a store, the mapped pages) and every forward first copies them into fresh
    /// storage on the stager's device, computes with the copies, and drops them.
    PerUseCopy(Box<Projection>, Stager),
}

impl Projection {
    /// A float projection over a store weight `[out, in]` as it lies (a transposed view is
    /// what the matmul reads; no copy), without bias.
    pub fn from_weight(weight: Tensor<2>) -> Self {
        Projection::Float(Linear {
            weight: Param::from_tensor(weight.transpose()),
            bias: None,
        })
    }

    /// A q8 projection over int8 values `[out, in]` and their f16 row scales `[out]`, without
    /// bias.
    pub fn from_q8(values: Tensor<2, Int>, scales: Tensor<1>) -> Self {
        Projection::Q8(Q8Linear {
            weight: Param::initialized(ParamId::new(), values),
            weight_scale: Param::from_tensor(scales),
            bias: None,
        })
    }

    /// A projection over GGUF blocks (`[out, layout.row_bytes()]` U8), without bias.
    pub fn from_blocks(bytes: Tensor<2, Int>, layout: BlockLayout) -> Self {
        Projection::Blocks(BlockLinear {
            weight: Param::initialized(ParamId::new(), bytes),
            bias: None,
            layout,
        })
    }

    /// `(in, out)` features, from the weight's shape without initializing a lazy weight. A
    /// lazy float weight is read in this model's `Col` layout (`[out, in]` until loaded).
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Projection::Float(linear) => {
                let [a, b] = linear.weight.lazy_shape().dims::<2>();
                if linear.weight.is_initialized() {
                    (a, b)
                } else {
                    (b, a)
                }
            }
            Projection::Q8(q8) => {
                let [out, inp] = q8.weight.lazy_shape().dims::<2>();
                (inp, out)
            }
            Projection::Blocks(b) => (b.layout.cols(), b.weight.lazy_shape().dims::<2>()[0]),
            Projection::PerUseCopy(inner, _) => inner.dims(),
        }
    }

    /// Applies the projection to the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Projection::Float(linear) => linear.forward(x),
            Projection::Q8(q8) => q8.forward(x),
            Projection::Blocks(b) => b.forward(x),
            Projection::PerUseCopy(inner, stager) => {
                stager.stage_module((**inner).clone()).forward(x)
            }
        }
    }

    /// `layers` applied to the same `x` (`[rows, in]`): when every one is q8 (adopted, not a
    /// per-use copy) they share one [`Q8Input`], so where the dp4a kernel runs the activations
    /// are split once for all of them; when every one holds blocks they share one
    /// [`BlockInput`] (the activations quantized once); otherwise each applies its own forward.
    pub fn forward_shared<const N: usize>(
        layers: [&Projection; N],
        x: Tensor<2>,
    ) -> [Tensor<2>; N] {
        if let Some(operands) = block_operands(&layers) {
            let input = BlockInput::new(x).unwrap_or_else(|e| panic!("BlockLinear input: {e}"));
            let layers: Vec<_> = operands.iter().map(|(w, b)| (w, b.clone())).collect();
            let mut ys = block_linear_shared(&input, &layers)
                .unwrap_or_else(|e| panic!("BlockLinear: {e}"))
                .into_iter();
            return std::array::from_fn(|_| ys.next().expect("one output per layer"));
        }
        let q8: Option<Vec<&Q8Linear>> = layers
            .iter()
            .map(|layer| match layer {
                Projection::Q8(q8) => Some(q8),
                _ => None,
            })
            .collect();
        match q8 {
            Some(q8) => {
                let input = Q8Input::new(x);
                std::array::from_fn(|i| q8[i].forward_input(&input))
            }
            None => std::array::from_fn(|i| layers[i].forward(x.clone())),
        }
    }

    /// Whether the weights are q8.
    pub fn is_q8(&self) -> bool {
        match self {
            Projection::PerUseCopy(inner, _) => inner.is_q8(),
            other => matches!(other, Projection::Q8(_)),
        }
    }

    /// Whether the weights are GGUF blocks.
    pub fn is_blocks(&self) -> bool {
        match self {
            Projection::PerUseCopy(inner, _) => inner.is_blocks(),
            other => matches!(other, Projection::Blocks(_)),
        }
    }

    /// This projection, staged into fresh storage on `stager`'s device before every forward.
    pub fn per_use_copy(self, stager: Stager) -> Self {
        match self {
            Projection::PerUseCopy(inner, _) => Projection::PerUseCopy(inner, stager),
            other => Projection::PerUseCopy(Box::new(other), stager),
        }
    }
}

/// The checked weights and biases of `layers` when every one holds GGUF blocks (adopted, not
/// a per-use copy), as the block products take them.
///
/// # Panics
///
/// If a loaded block weight does not fit its layout (a loader bug).
pub(crate) fn block_operands(
    layers: &[&Projection],
) -> Option<Vec<(BlockWeight, Option<Tensor<1>>)>> {
    layers
        .iter()
        .map(|layer| match layer {
            Projection::Blocks(b) => Some((
                b.block_weight()
                    .unwrap_or_else(|e| panic!("BlockLinear parameters: {e}")),
                b.bias.as_ref().map(|b| b.val()),
            )),
            _ => None,
        })
        .collect()
}

macro_rules! each {
    ($self:expr, |$m:ident| $body:expr) => {
        match $self {
            Projection::Float($m) => $body,
            Projection::Q8($m) => $body,
            Projection::Blocks($m) => $body,
            Projection::PerUseCopy(inner, _) => {
                let $m = &**inner;
                $body
            }
        }
    };
    ($self:expr, |$m:ident| wrap $body:expr) => {
        match $self {
            Projection::Float($m) => Projection::Float($body),
            Projection::Q8($m) => Projection::Q8($body),
            Projection::Blocks($m) => Projection::Blocks($body),
            Projection::PerUseCopy(inner, stager) => {
                let $m = *inner;
                Projection::PerUseCopy(Box::new($body), stager)
            }
        }
    };
}

impl Module for Projection {
    fn collect_devices(&self, devices: Devices) -> Devices {
        each!(self, |m| m.collect_devices(devices))
    }

    fn fork(self, device: &Device) -> Self {
        each!(self, |m| wrap m.fork(device))
    }

    fn to_device(self, device: &Device) -> Self {
        each!(self, |m| wrap m.to_device(device))
    }

    fn train(self) -> Self {
        each!(self, |m| wrap m.train())
    }

    fn valid(&self) -> Self {
        match self {
            Projection::Float(m) => Projection::Float(m.valid()),
            Projection::Q8(m) => Projection::Q8(m.valid()),
            Projection::Blocks(m) => Projection::Blocks(m.valid()),
            Projection::PerUseCopy(inner, stager) => {
                Projection::PerUseCopy(Box::new(inner.valid()), stager.clone())
            }
        }
    }

    fn materialize(self) -> Self {
        each!(self, |m| wrap m.materialize())
    }

    fn num_params(&self) -> usize {
        each!(self, |m| Module::num_params(m))
    }

    fn visit<Visitor: ModuleVisitor>(&self, visitor: &mut Visitor) {
        each!(self, |m| m.visit(visitor))
    }

    fn map<Mapper: ModuleMapper>(self, mapper: &mut Mapper) -> Self {
        each!(self, |m| wrap m.map(mapper))
    }
}

impl ModuleDisplayDefault for Projection {
    fn content(&self, content: Content) -> Option<Content> {
        each!(self, |m| content.add_single(m).optional())
    }

    fn num_params(&self) -> usize {
        Module::num_params(self)
    }
}

impl ModuleDisplay for Projection {}
