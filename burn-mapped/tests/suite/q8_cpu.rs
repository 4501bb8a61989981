//! q8 format and the `q8_linear` op on Flex, checked against an f64 reference computed here
//! from the same int8 values and scales.

use crate::q8_common;

use burn::backend::Flex;
use burn::tensor::{DType, Device, Int, Tensor, TensorData, f16};
use burn_mapped::q8::{
    CubeLaunch, DotTuning, Q8Error, Q8Input, Q8Rows, Q8Weight, SPLIT_Q_MAX, Tuning,
    dequantize_rows, q8_linear, q8_linear_input, quantize_rows, relative_error, scale_name,
    write_q8,
};
use burn_mapped::{MappedStore, StoreWriter, manifest::Q8_ROW_F16};
use q8_common::{
    Rng, assert_close, check_split_products, reference, reference_dot, spread_rows, weight,
};

/// Flex explicitly: with the `wgpu` feature on, Burn's default device is the GPU.
fn device() -> Device {
    Device::flex()
}

fn run(x: &[f32], w: &Q8Weight, bias: Option<&[f32]>, t: usize) -> Vec<f32> {
    let inp = w.in_features();
    let x = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [t, inp]), &device());
    let bias =
        bias.map(|b| Tensor::<1>::from_data(TensorData::new(b.to_vec(), [b.len()]), &device()));
    q8_linear(x, w, bias)
        .unwrap()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

/// Quantization written from the definition: `scale = f16(absmax / 127)`, `q = round(w /
/// scale)` in f64, clamped to 127.
fn quantize_by_definition(w: &[f32], out: usize, inp: usize) -> (Vec<i8>, Vec<f16>) {
    let mut q = Vec::new();
    let mut s = Vec::new();
    for row in w.chunks(inp).take(out) {
        let absmax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = f16::from_f32(absmax / 127.0);
        s.push(scale);
        for &v in row {
            q.push(if scale.to_f64() == 0.0 {
                0
            } else {
                (f64::from(v) / scale.to_f64()).round().clamp(-127.0, 127.0) as i8
            });
        }
    }
    (q, s)
}

#[test]
fn quantize_rows_follows_the_definition_and_zero_rows_get_scale_zero() {
    let mut rng = Rng::fresh();
    let (out, inp) = (37, 53);
    let mut w = rng.vec_nonzero(out * inp);
    for v in &mut w[5 * inp..6 * inp] {
        *v = 0.0;
    }
    let rows = quantize_rows(&w, out, inp).unwrap();
    let (q, s) = quantize_by_definition(&w, out, inp);
    assert_eq!(rows.values, q);
    assert_eq!(rows.scales, s);
    assert_eq!(rows.scales[5], f16::ZERO);
    assert!(rows.values[5 * inp..6 * inp].iter().all(|&v| v == 0));
    // Each row's largest magnitude maps to +-127 (or 126 when f16 rounding moved the scale).
    for o in (0..out).filter(|&o| o != 5) {
        let m = rows.values[o * inp..(o + 1) * inp]
            .iter()
            .map(|v| v.unsigned_abs())
            .max();
        assert!(m >= Some(126), "row {o}: max |q| {m:?}");
    }
    assert!(!rows.values.contains(&i8::MIN));
}

#[test]
fn relative_error_is_the_frobenius_ratio_and_small_for_q8() {
    let mut rng = Rng::fresh();
    let (out, inp) = (16, 64);
    let w = rng.vec_nonzero(out * inp);
    let rows = quantize_rows(&w, out, inp).unwrap();
    let deq = dequantize_rows(&rows.values, &rows.scales, out, inp).unwrap();
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in w.iter().zip(&deq) {
        num += (f64::from(*a) - f64::from(*b)).powi(2);
        den += f64::from(*a).powi(2);
    }
    let err = relative_error(&w, &rows.values, &rows.scales, out, inp).unwrap();
    assert!((err - (num / den).sqrt()).abs() < 1e-12);
    // Rounding error per element is at most scale/2 = absmax/254 (plus f16 rounding of the
    // scale): relative to values spread over [0.1, 1) that stays below 1%.
    assert!(err > 0.0 && err < 0.01, "relative error {err}");
}

#[test]
fn quantize_rows_rejects_bad_input_by_row_and_column() {
    assert!(matches!(
        quantize_rows(&[1.0; 5], 2, 3),
        Err(Q8Error::Length {
            len: 5,
            out: 2,
            inp: 3,
            ..
        })
    ));
    let mut w = vec![0.5f32; 6];
    w[4] = f32::NAN;
    assert!(matches!(
        quantize_rows(&w, 2, 3),
        Err(Q8Error::NonFinite { row: 1, col: 1, .. })
    ));
    assert!(matches!(
        quantize_rows(&[1.0e7, 0.0], 1, 2),
        Err(Q8Error::ScaleOverflow { row: 0, .. })
    ));
}

#[test]
fn q8_linear_matches_the_f64_reference_for_every_t_with_and_without_bias() {
    let mut rng = Rng::fresh();
    // Shapes not multiples of 4, 8 or 32; the last is large enough to be split over threads.
    for &(out, inp) in &[(37, 53), (1, 1), (9, 7), (301, 1003)] {
        let (q, s, w) = weight(&mut rng, out, inp, &device());
        for t in (1..=8).chain([11]) {
            let x = rng.vec_nonzero(t * inp);
            let b = rng.vec_nonzero(out);
            for bias in [None, Some(b.as_slice())] {
                let got = run(&x, &w, bias, t);
                let want = reference(&x, &q, &s, bias, t, out, inp);
                let ctx = format!("[{out}, {inp}] T={t} bias={}", bias.is_some());
                assert_close(&got, &want, out, &ctx);
            }
        }
    }
}

#[test]
fn q8_linear_uses_every_configured_thread_count() {
    let mut rng = Rng::fresh();
    let (out, inp) = (523, 1031); // ~540 KB: two or more slabs
    let (q, s, w) = weight(&mut rng, out, inp, &device());
    let x = rng.vec_nonzero(3 * inp);
    let want = reference(&x, &q, &s, None, 3, out, inp);
    for threads in [1, 2, 5] {
        let tuning = Tuning {
            host_threads: threads,
            ..Tuning::default()
        };
        let w = w.clone().with_tuning(tuning).unwrap();
        assert_close(
            &run(&x, &w, None, 3),
            &want,
            out,
            &format!("threads={threads}"),
        );
    }
}

#[test]
fn half_precision_activations_are_cast_and_cast_back() {
    let mut rng = Rng::fresh();
    let (out, inp, t) = (21, 33, 3);
    let (q, s, w) = weight(&mut rng, out, inp, &device());
    let x: Vec<f32> = rng
        .vec_nonzero(t * inp)
        .into_iter()
        .map(|v| f16::from_f32(v).to_f32())
        .collect();
    let xt = Tensor::<2>::from_data(
        TensorData::new(x.clone(), [t, inp]),
        (&device(), DType::F16),
    );
    let y = q8_linear(xt, &w, None).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    let got = y.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    for (k, (g, (want, tol))) in got
        .iter()
        .zip(reference(&x, &q, &s, None, t, out, inp))
        .enumerate()
    {
        // One more rounding, to f16 (relative 2^-11).
        let bound = tol + want.abs() * 2f64.powi(-11);
        assert!(
            (f64::from(*g) - want).abs() <= bound,
            "element {k}: {g} vs {want}"
        );
    }
}

#[test]
fn empty_and_degenerate_shapes_give_the_bias() {
    let w = Q8Weight::from_rows(
        &Q8Rows {
            values: vec![],
            scales: vec![f16::ONE; 3],
        },
        3,
        0,
        &device(),
    )
    .unwrap();
    let x = Tensor::<2>::zeros([2, 0], &device());
    let b = Tensor::<1>::from_floats([1.5, -2.0, 0.25], &device());
    let y = q8_linear(x, &w, Some(b)).unwrap();
    assert_eq!(
        y.into_data().try_to_vec::<f32>().unwrap(),
        [1.5, -2.0, 0.25, 1.5, -2.0, 0.25]
    );
    let w = Q8Weight::from_rows(
        &Q8Rows {
            values: vec![1; 4],
            scales: vec![f16::ONE],
        },
        1,
        4,
        &device(),
    )
    .unwrap();
    let y = q8_linear(Tensor::<2>::zeros([0, 4], &device()), &w, None).unwrap();
    assert_eq!(y.dims(), [0, 1]);
}

#[test]
fn rejects_mismatched_operands_with_typed_errors() {
    let dev = device();
    let values =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i8; 12], [3, 4]), (&dev, DType::I8));
    let scales =
        Tensor::<1>::from_data(TensorData::new(vec![f16::ONE; 3], [3]), (&dev, DType::F16));
    let w = Q8Weight::new(values.clone(), scales.clone()).unwrap();
    assert!(matches!(
        q8_linear(Tensor::<2>::zeros([2, 5], &dev), &w, None),
        Err(Q8Error::Shape {
            what: "q8_linear input",
            ..
        })
    ));
    assert!(matches!(
        q8_linear(
            Tensor::<2>::zeros([2, 4], &dev),
            &w,
            Some(Tensor::zeros([4], &dev))
        ),
        Err(Q8Error::Shape {
            what: "q8_linear bias",
            ..
        })
    ));
    let wide =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i32; 12], [3, 4]), (&dev, DType::I32));
    assert!(matches!(
        Q8Weight::new(wide, scales.clone()),
        Err(Q8Error::DType {
            what: "q8 values",
            ..
        })
    ));
    assert!(matches!(
        Q8Weight::new(values.clone(), scales.clone().cast(DType::F32)),
        Err(Q8Error::DType {
            what: "q8 scales",
            ..
        })
    ));
    let short = Tensor::<1>::from_data(TensorData::new(vec![f16::ONE; 2], [2]), (&dev, DType::F16));
    assert!(matches!(
        Q8Weight::new(values, short),
        Err(Q8Error::Shape {
            what: "q8 scales",
            ..
        })
    ));
}

#[test]
fn a_store_written_by_write_q8_links_the_scales_and_runs_in_place() {
    let mut rng = Rng::fresh();
    let (out, inp) = (37, 53);
    let w = rng.vec_nonzero(out * inp);
    let dir = burn_mapped_tests::tempdir();
    let store_dir = dir.path().join("store");
    let mut writer = StoreWriter::create(&store_dir).unwrap();
    let written = write_q8(&mut writer, "layers.0.mlp.up_proj.weight", &w, out, inp).unwrap();
    writer.finish().unwrap();
    assert_eq!(written.scale, "layers.0.mlp.up_proj.weight_scale");
    assert_eq!(written.scale, scale_name(&written.weight));
    assert!(written.relative_error > 0.0 && written.relative_error < 0.01);

    let store = MappedStore::open(&store_dir).unwrap();
    let entry = store.manifest().get("layers.0.mlp.up_proj.weight").unwrap();
    assert_eq!(entry.dtype(), DType::I8);
    assert_eq!(entry.shape(), [out, inp]);
    let link = entry.quant().unwrap();
    assert_eq!(
        (link.scheme.as_str(), link.scale.as_str()),
        (Q8_ROW_F16, written.scale.as_str())
    );
    let scale_entry = store.manifest().get(&written.scale).unwrap();
    assert_eq!(
        (scale_entry.dtype(), scale_entry.shape()),
        (DType::F16, &[out][..])
    );

    let weight = Q8Weight::from_store(&store, "layers.0.mlp.up_proj.weight", &device()).unwrap();
    // The int8 tensor is the mapped file, not a copy.
    let flex = weight
        .values()
        .clone()
        .try_into_primitive::<Flex>()
        .unwrap();
    let ptr = flex.bytes().as_ptr() as usize;
    let file = store_dir.join(entry.file());
    assert!(
        burn_mapped_tests::maps::mapped_ranges(&file)
            .iter()
            .any(|r| r.contains(&ptr)),
        "values are not the mapping of {}",
        file.display()
    );
    // The stored bytes are the quantization of `w` by definition.
    let (q, s) = quantize_by_definition(&w, out, inp);
    let stored: Vec<i8> = weight.values().clone().into_data().try_to_vec().unwrap();
    let stored_s: Vec<f16> = weight.scales().clone().into_data().try_to_vec().unwrap();
    assert_eq!((stored, stored_s), (q.clone(), s.clone()));

    for t in [1, 4, 11] {
        let x = rng.vec_nonzero(t * inp);
        assert_close(
            &run(&x, &weight, None, t),
            &reference(&x, &q, &s, None, t, out, inp),
            out,
            &format!("store T={t}"),
        );
    }
    assert!(matches!(
        Q8Weight::from_store(&store, &written.scale, &device()),
        Err(Q8Error::NotQuantized { .. })
    ));
}

/// An input split for the dp4a kernel on the host: what Flex runs when a dp4a launch is asked
/// for explicitly.
fn host_split(x: &[f32], t: usize, inp: usize) -> Q8Input {
    let tuning = Tuning {
        cube: Some(CubeLaunch::Dot(DotTuning::ONE)),
        ..Tuning::default()
    };
    let x = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [t, inp]), &device());
    let input = Q8Input::with_tuning(x, tuning).unwrap();
    assert!(input.is_split(), "[{t}, {inp}]");
    input
}

/// The dp4a kernel's split format, as Flex computes it (the host definition of what the GPU
/// kernel reads): split once, then products over several weights, every `T` in 1..8 and 11,
/// rows scaled far apart and one outlier, with and without bias, held to the f64 bound of
/// the documented rounding.
#[test]
fn products_over_one_host_split_match_the_f64_reference_of_its_rounding() {
    let mut rng = Rng::fresh();
    let inp = 96;
    let weights: Vec<_> = [37, 1, 70]
        .into_iter()
        .map(|out| weight(&mut rng, out, inp, &device()))
        .collect();
    for t in (1..=8).chain([11]) {
        let mut x = spread_rows(&mut rng, t, inp);
        if t > 3 {
            x[3 * inp + 41] *= 1000.0;
        }
        let input = host_split(&x, t, inp);
        for (q, s, w) in &weights {
            let weight = (q.as_slice(), s.as_slice(), w);
            check_split_products(&mut rng, &input, &x, t, weight, &device(), "host split");
        }
    }
}

/// A non-finite activation in the host split makes its own output row NaN and no other.
#[test]
fn a_non_finite_activation_in_a_host_split_yields_nan_in_its_row_only() {
    let mut rng = Rng::fresh();
    let (out, inp, t) = (9, 32, 3);
    let (q, s, w) = weight(&mut rng, out, inp, &device());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = rng.vec_nonzero(t * inp);
        x[inp + 5] = bad;
        let got = q8_linear_input(&host_split(&x, t, inp), &w, None)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert!(
            got[out..2 * out].iter().all(|v| v.is_nan()),
            "{bad}: {got:?}"
        );
        let want = reference_dot(&x, &q, &s, None, t, out, inp, 16, f64::from(SPLIT_Q_MAX));
        for row in [0, 2] {
            let r = row * out..(row + 1) * out;
            assert_close(&got[r.clone()], &want[r], out, &format!("{bad}: row {row}"));
        }
    }
}

/// A host split needs whole blocks of 16: a width without them keeps `x` unsplit; a launch
/// shape no kernel runs is refused with its typed error, by an input and by a weight.
#[test]
fn a_host_split_needs_whole_blocks_and_a_runnable_shape() {
    let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32; 2 * 40], [2, 40]), &device());
    let dot = |shape| Tuning {
        cube: Some(CubeLaunch::Dot(shape)),
        ..Tuning::default()
    };
    assert!(
        !Q8Input::with_tuning(x.clone(), dot(DotTuning::ONE))
            .unwrap()
            .is_split()
    );
    let bad = DotTuning {
        lanes: 4,
        ..DotTuning::ONE
    };
    assert!(matches!(
        Q8Input::with_tuning(x, dot(bad)),
        Err(Q8Error::Tuning { .. })
    ));
    let (_, _, w) = weight(&mut Rng::fresh(), 3, 40, &device());
    assert!(matches!(
        w.with_tuning(dot(bad)),
        Err(Q8Error::Tuning { .. })
    ));
}

/// On Flex a prepared input carries no split (the host kernel reads f32 activations): its
/// products are `q8_linear`'s, in the input's dtype, and bad operands get the same typed
/// errors.
#[test]
fn a_prepared_input_on_the_host_gives_q8_linear_products_and_errors() {
    let mut rng = Rng::fresh();
    let (t, inp) = (3, 40);
    let x = rng.vec_nonzero(t * inp);
    let input = Q8Input::new(Tensor::<2>::from_data(
        TensorData::new(x.clone(), [t, inp]),
        &device(),
    ));
    assert!(!input.is_split());
    assert_eq!(input.dims(), [t, inp]);
    for out in [5, 17] {
        let (q, s, w) = weight(&mut rng, out, inp, &device());
        let b = rng.vec_nonzero(out);
        let bias = Tensor::<1>::from_data(TensorData::new(b.clone(), [out]), &device());
        let got = q8_linear_input(&input, &w, Some(bias))
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_close(
            &got,
            &reference(&x, &q, &s, Some(&b), t, out, inp),
            out,
            "input",
        );
    }
    // A half-precision input returns half-precision products.
    let (_, _, w) = weight(&mut rng, 7, inp, &device());
    let half = Tensor::<2>::from_data(TensorData::new(x, [t, inp]), &device()).cast(DType::F16);
    let y = q8_linear_input(&Q8Input::new(half), &w, None).unwrap();
    assert_eq!((y.dtype(), y.dims()), (DType::F16, [t, 7]));
    let (_, _, other) = weight(&mut rng, 4, 24, &device());
    assert!(matches!(
        q8_linear_input(&input, &other, None),
        Err(Q8Error::Shape {
            what: "q8_linear input",
            ..
        })
    ));
}
