//! [`Q8Backend`] on Flex: the host kernel ([`super::cpu`]) and the host definition of the
//! split format ([`super::split`]), reading the tensors' bytes in place.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, TensorData, f16};

use super::backend::Q8Backend;
use super::cpu::{Gemm, Isa, gemm, threads};
use super::split::{self, SPLIT_BLOCK, SPLIT_WORDS};
use super::tuning::{DotTuning, Tuning};

/// A contiguous typed view of `t`, copying only if its layout is strided (never the case
/// for adopted store tensors).
fn contiguous(t: &FlexTensor) -> std::borrow::Cow<'_, FlexTensor> {
    if t.layout().contiguous_offsets().is_some() {
        std::borrow::Cow::Borrowed(t)
    } else {
        std::borrow::Cow::Owned(t.to_contiguous())
    }
}

fn run(
    x: FlexTensor,
    values: &FlexTensor,
    scales: &FlexTensor,
    bias: Option<&FlexTensor>,
    tuning: Tuning,
) -> FlexTensor {
    assert_eq!(x.dtype(), DType::F32, "q8_matmul: x must be f32");
    let [t, inp] = x.layout().shape().dims::<2>();
    let [out, w_in] = values.layout().shape().dims::<2>();
    assert_eq!(
        inp, w_in,
        "q8_matmul: x is [{t}, {inp}], weight [{out}, {w_in}]"
    );
    let (x, values, scales) = (contiguous(&x), contiguous(values), contiguous(scales));
    let bias = bias.map(contiguous);
    let args = Gemm {
        x: x.as_slice::<f32>().expect("contiguous f32"),
        w: values
            .as_slice::<i8>()
            .expect("q8_matmul: values must be contiguous I8"),
        scales: scales
            .as_slice::<f16>()
            .expect("q8_matmul: scales must be contiguous F16"),
        bias: bias
            .as_ref()
            .map(|b| b.as_slice::<f32>().expect("q8_matmul: bias must be f32")),
        t,
        out,
        inp,
    };
    let y = gemm(args, Isa::detect(), threads(tuning.host_threads));
    FlexTensor::from_data(TensorData::new(y, [t, out]))
}

fn run_split(
    split: &FlexTensor,
    values: &FlexTensor,
    scales: &FlexTensor,
    bias: Option<&FlexTensor>,
) -> FlexTensor {
    let [t, words] = split.layout().shape().dims::<2>();
    let [out, inp] = values.layout().shape().dims::<2>();
    assert!(
        t > 0 && inp.is_multiple_of(SPLIT_BLOCK) && words == SPLIT_WORDS * inp / SPLIT_BLOCK,
        "q8_matmul_split: split [{t}, {words}] does not fit a [{out}, {inp}] weight"
    );
    let (split, values, scales) = (contiguous(split), contiguous(values), contiguous(scales));
    let bias = bias.map(contiguous);
    let y = split::gemm(
        split
            .as_slice::<u32>()
            .expect("q8_matmul_split: split must be U32"),
        t,
        values
            .as_slice::<i8>()
            .expect("q8_matmul_split: values must be contiguous I8"),
        scales
            .as_slice::<f16>()
            .expect("q8_matmul_split: scales must be contiguous F16"),
        bias.as_ref().map(|b| {
            b.as_slice::<f32>()
                .expect("q8_matmul_split: bias must be f32")
        }),
        inp,
    );
    FlexTensor::from_data(TensorData::new(y, [t, out]))
}

/// The host has no launch shapes: `tuning` gives only the slab count, and the dp4a shape of
/// the split products is ignored.
impl Q8Backend for Flex {
    fn q8_matmul(
        x: FlexTensor,
        values: FlexTensor,
        scales: &FlexTensor,
        tuning: Tuning,
    ) -> FlexTensor {
        run(x, &values, scales, None, tuning)
    }

    fn q8_matmul_bias(
        x: FlexTensor,
        values: FlexTensor,
        scales: &FlexTensor,
        bias: &FlexTensor,
        tuning: Tuning,
    ) -> FlexTensor {
        run(x, &values, scales, Some(bias), tuning)
    }

    fn q8_split(x: FlexTensor) -> FlexTensor {
        assert_eq!(x.dtype(), DType::F32, "q8_split: x must be f32");
        let [t, inp] = x.layout().shape().dims::<2>();
        assert!(
            t > 0 && inp > 0 && inp.is_multiple_of(SPLIT_BLOCK),
            "q8_split: x is [{t}, {inp}]; needs T > 0 and `in` a positive multiple of 16"
        );
        let x = contiguous(&x);
        let words = split::split(x.as_slice::<f32>().expect("contiguous f32"), t, inp);
        FlexTensor::from_data(TensorData::new(words, [t, SPLIT_WORDS * inp / SPLIT_BLOCK]))
    }

    fn q8_matmul_split(
        split: FlexTensor,
        values: FlexTensor,
        scales: &FlexTensor,
        _shape: DotTuning,
    ) -> FlexTensor {
        run_split(&split, &values, scales, None)
    }

    fn q8_matmul_split_bias(
        split: FlexTensor,
        values: FlexTensor,
        scales: &FlexTensor,
        bias: &FlexTensor,
        _shape: DotTuning,
    ) -> FlexTensor {
        run_split(&split, &values, scales, Some(bias))
    }
}

/// The split's shape is stated twice, by the backend and by the metadata Fusion records
/// ahead of execution; the public API never shows the split tensor, so this unit test holds
/// the host's split to the metadata.
#[cfg(test)]
mod tests {
    use burn::tensor::Shape;

    use super::*;
    use crate::q8::backend::split_shape;

    #[test]
    fn the_host_split_has_the_shape_and_dtype_fusion_records() {
        let (t, inp) = (3, 48);
        let x = FlexTensor::from_data(TensorData::new(vec![0.5f32; t * inp], [t, inp]));
        let split = Flex::q8_split(x);
        assert_eq!(split.dtype(), DType::U32);
        assert_eq!(*split.layout().shape(), split_shape(&Shape::new([t, inp])));
    }
}
