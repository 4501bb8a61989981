//! CubeCL tensors to and from the primitive of Burn's `Cube` backend, which is
//! `Fusion<CubeBackend>` with the `fusion` feature and `CubeBackend` without.

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;

/// The tensor primitive of the dispatch `Cube` backend (float and int share it).
pub(crate) type Primitive =
    <burn_cubecl::Cube as burn::backend::BackendTypes>::FloatTensorPrimitive;

/// `tensor` as a float primitive: with Fusion, registered in the fused stream as an initialized
/// tensor (the handle moves into Fusion's handle container, unchanged).
pub(crate) fn float(tensor: CubeTensor) -> Primitive {
    register(tensor, true)
}

/// `tensor` as an int primitive.
pub(crate) fn int(tensor: CubeTensor) -> Primitive {
    register(tensor, false)
}

#[cfg(feature = "fusion")]
fn register(tensor: CubeTensor, float: bool) -> Primitive {
    use burn_cubecl::CubeBackend;
    use burn_fusion::{NoOp, get_client, stream::StreamId};
    use burn_ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};

    let client = get_client::<CubeBackend>(&tensor.device);
    let shape = tensor.meta.shape().clone();
    let dtype = tensor.dtype;
    let handle = if float {
        CubeBackend::float_tensor_handle(tensor)
    } else {
        CubeBackend::int_tensor_handle(tensor)
    };
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client
        .register(
            StreamId::current(),
            OperationIr::Init(desc),
            NoOp::<CubeBackend>::new(),
        )
        .output()
}

#[cfg(not(feature = "fusion"))]
fn register(tensor: CubeTensor, _float: bool) -> Primitive {
    tensor
}

/// The CubeCL tensor behind `primitive` (with Fusion, after the queued work on it ran).
#[cfg(feature = "fusion")]
pub(crate) fn resolve(primitive: Primitive, dtype: DType) -> CubeTensor {
    use burn_cubecl::CubeBackend;
    let client = primitive.client.clone();
    if dtype.is_float() {
        client.resolve_tensor_float::<CubeBackend>(primitive)
    } else {
        client.resolve_tensor_int::<CubeBackend>(primitive)
    }
}

/// The CubeCL tensor behind `primitive`.
#[cfg(not(feature = "fusion"))]
pub(crate) fn resolve(primitive: Primitive, _dtype: DType) -> CubeTensor {
    primitive
}
