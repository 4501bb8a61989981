//! The q8 CubeCL kernel on Burn's wgpu backend (WGSL) or, with the `vulkan` feature, on
//! Burn's `vulkan` backend (SPIR-V), against an f64 reference computed here from the same
//! int8 values and scales.
//!
//! Run with `cargo test --release -p burn-mapped --features wgpu --test q8_wgpu` (add
//! `fusion` for Burn's fused stream). Without an adapter the tests skip, unless
//! `BURN_MAPPED_REQUIRE_GPU=1`, in which case they fail. In CI, Mesa's lavapipe is the
//! adapter (`apt-get install mesa-vulkan-drivers libvulkan1`).
//!
//! With `--features vulkan` the same tests take the first hardware Vulkan adapter (wgpu pinned
//! to Vulkan, kernels compiled to SPIR-V) and check that SPIR-V is what runs. Software adapters
//! are passed over there: on a device without `VK_KHR_workgroup_memory_explicit_layout`, such
//! as Mesa 22.3's lavapipe, CubeCL 0.11.3 declares shared memory as a pointer to a pointer
//! (`spirv-val` rejects the module), and lavapipe crashes compiling our kernels (Burn's own
//! matmul crashes there as well).
#![cfg(feature = "gpu-tests")]

mod q8_common;

use burn::tensor::{DType, Device, DeviceType, Int, Tensor, TensorData, f16};
use burn_mapped::q8::{
    CubeLaunch, CubeTuning, DotTuning, Q8Error, Q8Input, Q8Rows, Q8Weight, SPLIT_Q_MAX, Tuning,
    q8_linear, q8_linear_input, set_poison_outputs,
};
use q8_common::{
    Rng, assert_close, check_split_products, reference, reference_dot, spread_rows, weight,
};

/// The API the tests run on, as the messages name it.
#[cfg(not(feature = "vulkan"))]
const API: &str = "wgpu";
#[cfg(feature = "vulkan")]
const API: &str = "Vulkan";

/// The adapters the tests may take, in order.
#[cfg(not(feature = "vulkan"))]
fn candidates() -> Vec<Device> {
    Device::enumerate(DeviceType::Wgpu).into_vec()
}

/// Hardware Vulkan adapters only (a software one has no physical card behind it), unless
/// `BURN_MAPPED_VULKAN_SOFTWARE=1` (to reproduce the lavapipe crash).
#[cfg(feature = "vulkan")]
fn candidates() -> Vec<Device> {
    let software = std::env::var("BURN_MAPPED_VULKAN_SOFTWARE").is_ok_and(|v| v == "1");
    Device::enumerate(DeviceType::Vulkan)
        .iter()
        .filter(|d| software || d.identity().is_some_and(|id| id.physical.is_some()))
        .cloned()
        .collect()
}

/// The runtime behind `device` as Burn names it, e.g. `dispatch<cubecl<wgpu<spirv>>>`.
fn runtime(device: &Device) -> String {
    use burn::backend::{Backend, Dispatch};
    <Dispatch as Backend>::name(device.as_dispatch())
}

/// The first working adapter, or `None` (skip) when there is none and a GPU is not required.
fn gpu() -> Option<Device> {
    let device = burn_mapped_tests::gpu::first_working(candidates(), API)?;
    set_poison_outputs(true);
    let name = device.identity().map(|id| id.name).unwrap_or_default();
    eprintln!("{API} adapter `{name}`, runtime {}", runtime(&device));
    Some(device)
}

/// Under the `vulkan` feature the kernels must reach the GPU as SPIR-V: CubeCL quietly
/// compiles WGSL instead on a Vulkan adapter that lacks the features its SPIR-V compiler
/// needs, and these tests would then be testing the other compiler.
#[cfg(feature = "vulkan")]
#[test]
fn under_the_vulkan_feature_the_kernels_are_compiled_to_spirv() {
    let Some(device) = gpu() else { return };
    let name = runtime(&device);
    assert!(name.contains("wgpu<spirv>"), "runtime: {name}");
}

/// The f64 reference and the bound for the kernel a `t`-row product on `w` launches: the
/// dp4a kernel rounds the activations (see [`reference_dot`]).
fn expected(
    w: &Q8Weight,
    x: &[f32],
    (q, s): (&[i8], &[f16]),
    bias: Option<&[f32]>,
    t: usize,
) -> Vec<(f64, f64)> {
    let (out, inp) = (w.out_features(), w.in_features());
    match w.planned_launch(t) {
        Some(CubeLaunch::Dot(_)) => {
            reference_dot(x, q, s, bias, t, out, inp, 16, f64::from(SPLIT_Q_MAX))
        }
        _ => reference(x, q, s, bias, t, out, inp),
    }
}

fn run(x: &[f32], w: &Q8Weight, bias: Option<&[f32]>, t: usize, device: &Device) -> Vec<f32> {
    let inp = w.in_features();
    let x = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [t, inp]), (device, DType::F32));
    let bias = bias.map(|b| {
        Tensor::<1>::from_data(TensorData::new(b.to_vec(), [b.len()]), (device, DType::F32))
    });
    q8_linear(x, w, bias)
        .unwrap()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

#[test]
fn q8_linear_on_wgpu_matches_the_f64_reference_for_every_t() {
    let Some(device) = gpu() else { return };
    let mut rng = Rng::fresh();
    // `in` a multiple of 4 but of neither 8 nor 16 (one word per load), of 8 only (at most
    // two), of 16 (up to four: the T 1-2 shape loads four, the T >= 3 shape two); `out` not a
    // multiple of the rows a cube covers.
    for &(out, inp) in &[(37, 52), (45, 56), (70, 96), (1, 4)] {
        let (q, s, w) = weight(&mut rng, out, inp, &device);
        for t in (1..=8).chain([11]) {
            let x = rng.vec_nonzero(t * inp);
            let b = rng.vec_nonzero(out);
            for bias in [None, Some(b.as_slice())] {
                let got = run(&x, &w, bias, t, &device);
                let want = expected(&w, &x, (&q, &s), bias, t);
                let ctx = format!("{API} [{out}, {inp}] T={t} bias={}", bias.is_some());
                assert_close(&got, &want, out, &ctx);
            }
        }
    }
}

/// `w` with every product launched as `cube` says.
fn tuned(w: &Q8Weight, cube: CubeLaunch) -> Q8Weight {
    let tuning = Tuning {
        cube: Some(cube),
        ..Tuning::default()
    };
    w.clone().with_tuning(tuning).unwrap()
}

/// Every launch shape is a correct kernel, not just the default: odd lane counts, row and
/// unroll counts that leave remainders, one thread per cube.
#[test]
fn every_launch_shape_matches_the_f64_reference() {
    let Some(device) = gpu() else { return };
    let mut rng = Rng::fresh();
    // Rows of 13, 24 (twelve 2-word or six 4-word loads), 1, 26 (a 4-word shape falls back to
    // 2-word loads) and 257 words (1-word loads only).
    let shapes = [(37, 52), (70, 96), (1, 4), (19, 104), (33, 1028)];
    let weights: Vec<_> = shapes
        .iter()
        .map(|&(out, inp)| weight(&mut rng, out, inp, &device))
        .collect();
    for (lanes, groups, rows, unroll, vector) in [
        (8, 2, 3, 3, 4),
        (8, 1, 1, 1, 1),
        (16, 4, 2, 5, 2),
        (64, 4, 1, 1, 4),
        (32, 8, 4, 1, 1),
        (32, 4, 8, 2, 2),
    ] {
        let tuning = CubeTuning {
            lanes,
            groups,
            rows,
            unroll,
            vector,
        };
        for ((out, inp), (q, s, w)) in shapes.iter().copied().zip(&weights) {
            let w = tuned(w, CubeLaunch::Fma(tuning));
            for t in [1, 3, 8, 11] {
                let x = rng.vec_nonzero(t * inp);
                let b = rng.vec_nonzero(out);
                let got = run(&x, &w, Some(&b), t, &device);
                let want = expected(&w, &x, (q, s), Some(&b), t);
                let ctx = format!("{API} {tuning:?} [{out}, {inp}] T={t}");
                assert_close(&got, &want, out, &ctx);
            }
        }
    }
}

/// Runs the weight on `x` (`t` rows) without and with a fresh bias, each held to the f64
/// reference of the kernel it launches; `label` names the launch shape in failures.
fn check_both_biases(
    device: &Device,
    rng: &mut Rng,
    x: &[f32],
    (q, s, w): (&[i8], &[f16], &Q8Weight),
    t: usize,
    label: &str,
) {
    let (out, inp) = (w.out_features(), w.in_features());
    let b = rng.vec_nonzero(out);
    for bias in [None, Some(b.as_slice())] {
        let got = run(x, w, bias, t, device);
        let want = expected(w, x, (q, s), bias, t);
        let ctx = format!("{API} {label} [{out}, {inp}] T={t} bias={}", bias.is_some());
        assert_close(&got, &want, out, &ctx);
    }
}

/// The dp4a kernel (every adapter: native on SPIR-V, expanded by CubeCL on WGSL) at every
/// `T` and several shapes (8 to 64 lanes per row, one to eight rows per thread, unrolls that
/// leave remainders), held to the bound of its documented activation rounding. Rows span 1e6
/// and 1e-9 in magnitude and one has a single large outlier, which only its own block's scale
/// may feel.
#[test]
fn every_dot_shape_matches_the_f64_reference() {
    let Some(device) = gpu() else { return };
    let mut rng = Rng::fresh();
    // Rows of 4, 6, 1, 65 and 448 blocks of 16, and one of 52 values, which takes the FMA
    // kernel instead.
    let shapes = [
        (37, 64),
        (70, 96),
        (1, 16),
        (33, 1040),
        (45, 7168),
        (19, 52),
    ];
    let weights: Vec<_> = shapes
        .iter()
        .map(|&(out, inp)| weight(&mut rng, out, inp, &device))
        .collect();
    let every_t: Vec<usize> = (1..=8).chain([11]).collect();
    let shape = |(lanes, groups, rows, unroll)| DotTuning {
        lanes,
        groups,
        rows,
        unroll,
    };
    // On hardware, every shape at every T. A software adapter (lavapipe in CI) compiles each
    // shape and tile for minutes in all (CubeCL expands `dp4a` there): the two small shapes at
    // every T and each default shape at the tiles it is the default for.
    let software = device.identity().is_none_or(|id| id.physical.is_none());
    let mut plan: Vec<(DotTuning, Vec<usize>)> = [(8, 1, 1, 1), (16, 2, 3, 3)]
        .map(|s| (shape(s), every_t.clone()))
        .into();
    if software {
        plan.extend([
            (DotTuning::ONE, vec![1]),
            (DotTuning::FEW, vec![2, 3, 4]),
            (DotTuning::MANY, vec![5, 6, 7, 8, 11]),
        ]);
    } else {
        for s in [
            (32, 4, 4, 2),
            (64, 4, 2, 2),
            (32, 8, 5, 2),
            (32, 2, 8, 2),
            (32, 4, 8, 1),
            (32, 4, 6, 1),
            (32, 4, 2, 4),
            (64, 2, 4, 2),
        ] {
            plan.push((shape(s), every_t.clone()));
        }
    }
    for (tuning, ts) in plan {
        for ((out, inp), (q, s, w)) in shapes.iter().copied().zip(&weights) {
            let w = tuned(w, CubeLaunch::Dot(tuning));
            let dot = w.planned_launch(3) == Some(CubeLaunch::Dot(tuning));
            assert_eq!(dot, inp % 16 == 0, "{tuning:?} [{out}, {inp}]");
            for &t in &ts {
                let mut x = spread_rows(&mut rng, t, inp);
                if t > 3 {
                    x[3 * inp + inp / 2] *= 1000.0;
                }
                check_both_biases(
                    &device,
                    &mut rng,
                    &x,
                    (q.as_slice(), s.as_slice(), &w),
                    t,
                    &format!("{tuning:?}"),
                );
            }
        }
    }
}

/// Under the dp4a kernel a non-finite activation turns its own output row into NaN (its
/// block's scale is NaN) and leaves the other rows correct.
#[test]
fn under_the_dot_kernel_a_non_finite_activation_yields_nan_in_its_row_only() {
    let Some(device) = gpu() else { return };
    let mut rng = Rng::fresh();
    let (out, inp, t) = (21, 64, 3);
    let (q, s, w) = weight(&mut rng, out, inp, &device);
    let w = tuned(&w, CubeLaunch::Dot(DotTuning::MANY));
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = rng.vec_nonzero(t * inp);
        x[inp + 17] = bad;
        let got = run(&x, &w, None, t, &device);
        assert!(
            got[out..2 * out].iter().all(|v| v.is_nan()),
            "{bad}: {got:?}"
        );
        let want = expected(&w, &x, (&q, &s), None, t);
        for row in [0, 2] {
            let r = row * out..(row + 1) * out;
            assert_close(&got[r.clone()], &want[r], out, &format!("{bad}: row {row}"));
        }
    }
}

/// One split shared by the products of several weights over the same activations (the
/// activations computed on the device just before, never read back): each product is held to
/// the f64 bound of the dp4a rounding, with and without bias; a weight tuned for the FMA
/// kernel still reads the split; a weight of another width gets the typed error. The input
/// asks for the dp4a kernel, so it splits where that is not the default (WGSL) too; the
/// shapes used are the defaults, which the other tests compile.
#[test]
fn products_sharing_one_split_match_the_f64_reference_of_its_rounding() {
    let Some(device) = gpu() else { return };
    let mut rng = Rng::fresh();
    let inp = 96;
    let weights: Vec<_> = [37, 1, 70]
        .into_iter()
        .map(|out| weight(&mut rng, out, inp, &device))
        .collect();
    for t in [1, 3, 8] {
        let x = spread_rows(&mut rng, t, inp);
        let half: Vec<f32> = x.iter().map(|v| v / 2.0).collect();
        let xt = Tensor::<2>::from_data(TensorData::new(half, [t, inp]), (&device, DType::F32))
            .mul_scalar(2.0);
        let tuning = Tuning {
            cube: Some(CubeLaunch::Dot(DotTuning::default_for(t))),
            ..Tuning::default()
        };
        let input = Q8Input::with_tuning(xt, tuning).unwrap();
        assert!(input.is_split(), "T={t}");
        for (round, (q, s, w)) in weights.iter().enumerate() {
            // The input was split for the dp4a kernel; its products stay on it.
            let w = match round {
                2 => &tuned(w, CubeLaunch::Fma(CubeTuning::DEFAULT)),
                _ => w,
            };
            let weight = (q.as_slice(), s.as_slice(), w);
            let ctx = format!("{API} shared split");
            check_split_products(&mut rng, &input, &x, t, weight, &device, &ctx);
        }
        let (_, _, other) = weight(&mut rng, 4, 32, &device);
        assert!(matches!(
            q8_linear_input(&input, &other, None),
            Err(Q8Error::Shape { .. })
        ));
    }
}

/// The benchmark's shape (`[12288, 7168]`, 88 MB) and an odd one, on a hardware adapter
/// only: a software one (lavapipe in CI) would take minutes and binds at most 128 MiB.
#[test]
fn q8_linear_matches_the_f64_reference_at_the_benchmark_shape_on_hardware() {
    let Some(device) = gpu() else { return };
    if device.identity().is_none_or(|id| id.physical.is_none()) {
        eprintln!("software adapter: skipping the large shapes");
        return;
    }
    let mut rng = Rng::fresh();
    for &(out, inp, ts, with_bias) in &[
        (12288, 7168, &[1usize, 8][..], false),
        (4099, 7172, &[3][..], true),
    ] {
        let (q, s, w) = weight(&mut rng, out, inp, &device);
        for &t in ts {
            let x = rng.vec_nonzero(t * inp);
            let b = rng.vec_nonzero(out);
            let bias = with_bias.then_some(b.as_slice());
            let got = run(&x, &w, bias, t, &device);
            let want = expected(&w, &x, (&q, &s), bias, t);
            let ctx = format!("{API} [{out}, {inp}] T={t} bias={with_bias}");
            assert_close(&got, &want, out, &ctx);
        }
    }
}

#[test]
fn the_kernel_reads_x_produced_by_earlier_ops_on_the_same_stream() {
    let Some(device) = gpu() else { return };
    let mut rng = Rng::fresh();
    let (out, inp, t) = (33, 64, 5);
    let (q, s, w) = weight(&mut rng, out, inp, &device);
    let x0 = rng.vec_nonzero(t * inp);
    // x = (x0 * 3 - 1) computed on the device right before the op, never read back first.
    let x = Tensor::<2>::from_data(TensorData::new(x0.clone(), [t, inp]), (&device, DType::F32))
        .mul_scalar(3.0)
        .sub_scalar(1.0);
    let y = q8_linear(x, &w, None).unwrap();
    // And the result feeds further device ops.
    let y = (y * 2.0).into_data().try_to_vec::<f32>().unwrap();
    let x_host: Vec<f32> = x0.iter().map(|v| v * 3.0 - 1.0).collect();
    let want: Vec<(f64, f64)> = expected(&w, &x_host, (&q, &s), None, t)
        .into_iter()
        .map(|(v, tol)| (2.0 * v, 2.0 * tol + 2.0 * v.abs() * f64::from(f32::EPSILON)))
        .collect();
    assert_close(&y, &want, out, "chained");
}

#[test]
fn scales_decode_exactly_including_subnormal_and_zero() {
    let Some(device) = gpu() else { return };
    let (out, inp) = (5, 8);
    let q: Vec<i8> = (0..out * inp).map(|k| (k as i32 % 17 - 8) as i8).collect();
    let s = vec![
        f16::from_bits(0x0001), // smallest subnormal
        f16::from_bits(0x03FF), // largest subnormal
        f16::ZERO,
        f16::from_f32(-0.75),
        f16::MAX,
    ];
    let w = Q8Weight::from_rows(
        &Q8Rows {
            values: q.clone(),
            scales: s.clone(),
        },
        out,
        inp,
        &device,
    )
    .unwrap();
    let x: Vec<f32> = (0..inp).map(|i| 0.5 + i as f32 * 0.125).collect();
    let got = run(&x, &w, None, 1, &device);
    assert_close(&got, &expected(&w, &x, (&q, &s), None, 1), out, "scales");
}

#[test]
fn a_width_not_a_multiple_of_four_is_refused_on_the_gpu() {
    let Some(device) = gpu() else { return };
    let values = Tensor::<2, Int>::from_data(
        TensorData::new(vec![1i8; 3 * 53], [3, 53]),
        (&device, DType::I8),
    );
    let scales = Tensor::<1>::from_data(
        TensorData::new(vec![f16::ONE; 3], [3]),
        (&device, DType::F16),
    );
    assert!(matches!(
        Q8Weight::new(values, scales),
        Err(Q8Error::GpuPacking { out: 3, inp: 53 })
    ));
}

/// With the `fusion` feature the op is a custom operation in Burn's fused stream, between
/// the fused ops that produce its input and consume its output.
#[cfg(feature = "fusion")]
#[test]
fn under_fusion_the_op_is_registered_as_a_custom_operation() {
    use std::sync::{Arc, Mutex};

    use burn::backend::fusion::custom::OperationIr;
    use burn::backend::fusion::observer::{BlockOperations, FusionObservation, FusionObserver};

    #[derive(Default)]
    struct Custom(Mutex<Vec<String>>);
    impl FusionObserver for Custom {
        fn registered(&self, operation: &OperationIr) {
            if let OperationIr::Custom(op) = operation {
                self.0.lock().unwrap().push(op.id.to_string());
            }
        }
        fn block_starts(&self, _: BlockOperations<'_>) {}
        fn block_ran(&self) {}
    }

    let Some(device) = gpu() else { return };
    let mut rng = Rng::fresh();
    let (out, inp, t) = (40, 64, 3);
    let (q, s, w) = weight(&mut rng, out, inp, &device);
    device.sync().unwrap();
    let seen = Arc::new(Custom::default());
    let observation = FusionObservation::new(seen.clone());
    let x0 = rng.vec_nonzero(t * inp);
    let x = Tensor::<2>::from_data(TensorData::new(x0.clone(), [t, inp]), (&device, DType::F32))
        .add_scalar(0.5);
    let y = q8_linear(x, &w, None).unwrap().mul_scalar(-1.0);
    let y: Vec<f32> = y.into_data().try_to_vec().unwrap();
    device.sync().unwrap();
    drop(observation);
    let ids = seen.0.lock().unwrap().clone();
    assert!(
        ids.iter().any(|id| id == "q8_matmul"),
        "custom ops seen: {ids:?}"
    );
    let x_host: Vec<f32> = x0.iter().map(|v| v + 0.5).collect();
    let want: Vec<(f64, f64)> = expected(&w, &x_host, (&q, &s), None, t)
        .into_iter()
        .map(|(v, tol)| (-v, tol))
        .collect();
    assert_close(&y, &want, out, "fused");
}
