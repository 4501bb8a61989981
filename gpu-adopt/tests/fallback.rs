//! The resident fallback: where the device does not import host memory, `load_*` copies the
//! tensor into device memory and says why. On lavapipe the device is opened with import
//! disabled; on a driver that refuses imports (NVIDIA) the plain `open` takes the same path.

mod common;

use burn::tensor::{DType, Tensor, TensorData};
use burn_mapped::Placement;
use burn_mapped_gpu::{GpuDevice, Unavailable};
use common::{assert_close, digest_dir, f32_store, matmul_reference, values};

fn check_fallback(gpu: &GpuDevice) {
    let dir = tempfile::tempdir().unwrap();
    let (t, k, n) = (3, 40, 24);
    let w = values(11, k * n);
    let x = values(12, t * k);
    let store = f32_store(&dir.path().join("s"), &[("w", vec![k, n], &w)]);
    let before = digest_dir(&dir.path().join("s"));

    let (weight, placed): (Tensor<2>, _) = gpu.load_float(&store, "w").unwrap();
    let (Placement::Resident, Some(reason)) = (placed.placement, &placed.refused) else {
        panic!("expected a resident fallback, got {placed:?}")
    };
    assert!(
        reason.contains("tensor w") && reason.contains("unavailable"),
        "{reason}"
    );
    assert!(gpu.live_imports().is_empty(), "nothing imported");
    let xt = Tensor::<2>::from_data(
        TensorData::new(x.clone(), [t, k]),
        (gpu.device(), DType::F32),
    );
    let y = xt.matmul(weight).into_data().try_to_vec::<f32>().unwrap();
    assert_close(&y, &matmul_reference(&x, &w, t, k, n), "resident matmul");
    assert_eq!(digest_dir(&dir.path().join("s")), before);
}

#[test]
fn a_device_without_host_import_loads_resident_and_says_why() {
    let gpu = match GpuDevice::open_with(false) {
        Ok(gpu) => gpu,
        Err(err) => {
            let required = std::env::var("BURN_MAPPED_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "BURN_MAPPED_REQUIRE_GPU=1 but: {err}");
            eprintln!("skipping: {err}");
            return;
        }
    };
    assert_eq!(gpu.host_import(), Err(&Unavailable::Disabled));
    check_fallback(&gpu);
}

#[test]
fn a_driver_that_refuses_imports_is_reported_and_falls_back() {
    // Only meaningful where the driver refuses (BURN_MAPPED_EXPECT_REFUSAL=1, e.g. the NVIDIA
    // Vulkan driver); elsewhere it checks that the probe agrees with the first real import.
    let Some(gpu) = common::gpu() else { return };
    let expect_refusal = std::env::var("BURN_MAPPED_EXPECT_REFUSAL").is_ok_and(|v| v == "1");
    match gpu.host_import() {
        Err(reason) => {
            eprintln!("{}: {reason}", gpu.adapter_name());
            assert!(
                matches!(
                    reason,
                    Unavailable::ProbeRefused(_) | Unavailable::NotAdvertised
                ),
                "{reason}"
            );
            check_fallback(gpu);
        }
        Ok(()) => {
            assert!(
                !expect_refusal,
                "{} imported host memory",
                gpu.adapter_name()
            );
            let dir = tempfile::tempdir().unwrap();
            let v = values(13, 256);
            let store = f32_store(&dir.path().join("s"), &[("probe-agrees", vec![256], &v)]);
            let (t, placement): (Tensor<1>, _) = gpu.load_float(&store, "probe-agrees").unwrap();
            assert_eq!(placement.placement, Placement::Map);
            assert_eq!(t.into_data().try_to_vec::<f32>().unwrap(), v);
        }
    }
}
