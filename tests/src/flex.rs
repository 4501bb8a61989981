//! Where Burn's CPU backend (Flex) keeps a tensor's bytes: compared with [`crate::maps`] it
//! tells whether a parameter *is* the mapped page or a copy of it.

use std::ops::Range;

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::module::{Module, Param};
use burn::tensor::kind::Basic;
use burn::tensor::{BackendPrimitive, Tensor};

use crate::params::{ParamProbe, probe_float_params};

/// Address range of a Flex tensor's storage, float or integer.
pub fn flex_storage<const D: usize, K>(tensor: Tensor<D, K>) -> Range<usize>
where
    K: Basic + BackendPrimitive<Flex, Primitive = FlexTensor>,
{
    let flex = tensor
        .try_into_primitive::<Flex>()
        .expect("the default test device is Flex");
    let bytes = flex.bytes();
    let start = bytes.as_ptr() as usize;
    start..start + bytes.len()
}

/// Every (path, storage range) of the float parameters of a module, as Flex holds them.
pub fn float_param_storage<M: Module>(module: &M) -> Vec<(String, Range<usize>)> {
    struct Storage;
    impl ParamProbe for Storage {
        type Out = Range<usize>;
        fn probe<const D: usize>(&mut self, param: &Param<Tensor<D>>) -> Range<usize> {
            flex_storage(param.val())
        }
    }
    probe_float_params(module, Storage)
}
