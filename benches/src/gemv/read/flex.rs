//! The read on the host (Flex): XOR over the int8 bytes in place, split into slabs like the
//! q8 host kernel splits the product.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;

use super::{READ_PARTIALS, ReadBackend, read_xor};

impl ReadBackend for Flex {
    fn gemv_read(values: FlexTensor, threads: usize, _unroll: usize) -> FlexTensor {
        let values = if values.layout().contiguous_offsets().is_some() {
            values
        } else {
            values.to_contiguous()
        };
        let bytes = values
            .as_slice::<i8>()
            .expect("gemv_read: values must be I8");
        // SAFETY: i8 and u8 share size, alignment and validity; same lifetime.
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len()) };
        let mut partials = read_xor(bytes, threads);
        partials.resize(READ_PARTIALS, 0);
        FlexTensor::from_data(TensorData::new(partials, [READ_PARTIALS]))
    }
}
