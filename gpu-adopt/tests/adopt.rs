//! Adoption on Burn's wgpu backend over a Vulkan driver that imports host memory (Mesa's
//! lavapipe in CI): the tensors' storage is the file mapping itself.
//!
//! `cargo test --release` in gpu-adopt/ (after ./prepare.sh). Skips without an adapter unless
//! `BURN_MAPPED_REQUIRE_GPU=1`.

mod common;

#[path = "../../burn-mapped/tests/q8_common/mod.rs"]
mod q8_common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use burn::tensor::{DType, Int, Tensor, TensorData};
use burn_mapped::q8::{Q8Rows, Q8Weight, q8_linear, write_q8_rows};
use burn_mapped::{Manifest, Placement, StoreWriter};
use burn_mapped_gpu::{AdoptError, GpuDevice};
use common::{assert_close, digest_dir, f32_store, gpu, matmul_reference, open_strict, values};

/// The device, skipping the test where there is none; fails where the device cannot import
/// (these tests are about adoption; the refusal path has its own test).
fn importing() -> Option<&'static GpuDevice> {
    let device = gpu()?;
    if let Err(reason) = device.host_import() {
        let required = std::env::var("BURN_MAPPED_REQUIRE_IMPORT").is_ok_and(|v| v == "1");
        assert!(!required, "BURN_MAPPED_REQUIRE_IMPORT=1 but: {reason}");
        eprintln!(
            "skipping: {} cannot import host memory: {reason}",
            device.adapter_name()
        );
        return None;
    }
    Some(device)
}

fn host(t: Tensor<2>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

#[test]
fn a_matmul_reads_the_file_mapping_in_place_and_matches_the_resident_path() {
    let Some(gpu) = importing() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (t, k, n) = (5, 300, 260);
    let w = values(1, k * n);
    let x = values(2, t * k);
    let store = f32_store(&dir.path().join("s"), &[("w", vec![k, n], &w)]);
    let before = digest_dir(&dir.path().join("s"));
    let file = store.mapped("w").unwrap();
    let device = gpu.device();

    let adopted: Tensor<2> = gpu.adopt_float(file, [k, n], DType::F32).unwrap();

    // Identity: CubeCL resolves the tensor to the Vulkan buffer imported from this mapping.
    let import = gpu
        .live_imports()
        .into_iter()
        .find(|i| i.tensor == "w")
        .expect("a live import of w");
    assert_eq!(import.address, file.address_range());
    let backing = gpu.backing(&adopted).unwrap();
    assert_eq!(
        backing.vk_buffer, import.vk_buffer,
        "the tensor's buffer is the import"
    );
    assert_eq!(backing.offset, 0);
    assert_eq!(backing.size, (k * n * 4) as u64);

    let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [t, k]), (device, DType::F32));
    let y_mapped = host(xt.clone().matmul(adopted.clone()));
    let resident = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), (device, DType::F32));
    assert_ne!(gpu.backing(&resident).unwrap().vk_buffer, import.vk_buffer);
    let y_resident = host(xt.matmul(resident));

    assert_close(
        &y_mapped,
        &matmul_reference(&x, &w, t, k, n),
        "mapped matmul",
    );
    assert_eq!(
        y_mapped, y_resident,
        "mapped and resident run the same kernel on the same bytes"
    );
    // Reading the adopted tensor back returns the file's bytes.
    assert_eq!(host(adopted), w);
    assert_eq!(digest_dir(&dir.path().join("s")), before, "files unchanged");
}

#[test]
fn a_write_to_the_file_shows_in_the_next_gpu_result() {
    // Aliasing, not a copy: bytes written to the file after adoption reach the kernel.
    let Some(gpu) = importing() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (k, n) = (64, 48);
    let w = values(3, k * n);
    let store = f32_store(&dir.path().join("s"), &[("alias", vec![k, n], &w)]);
    let file = store.mapped("alias").unwrap();
    let adopted: Tensor<2> = gpu.adopt_float(file, [k, n], DType::F32).unwrap();
    let ones = Tensor::<2>::ones([1, k], (gpu.device(), DType::F32));
    let before = host(ones.clone().matmul(adopted.clone()));

    // Column 0 becomes all 2.0 through an ordinary write to the file (the page cache pages
    // the mapping shares).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(file.path())
        .unwrap();
    for row in 0..k {
        f.write_all_at(&2f32.to_le_bytes(), (row * n * 4) as u64)
            .unwrap();
    }
    drop(f);
    let after = host(ones.matmul(adopted));
    assert_eq!(after[0], 2.0 * k as f32, "column 0 sums the new bytes");
    assert_eq!(before[1..], after[1..], "other columns unchanged");
    assert_ne!(before[0], after[0]);
}

#[test]
fn operations_on_a_sole_adopted_tensor_never_write_it() {
    // A tensor whose only owner passes it to an op is normally written in place. An adopted
    // one is read-only (its pages are PROT_READ: a write would fault), so every result lands
    // in fresh memory and the file keeps its bytes.
    let Some(gpu) = importing() else { return };
    let dir = tempfile::tempdir().unwrap();
    let v = values(4, 1024);
    let store = f32_store(&dir.path().join("s"), &[("ro", vec![32, 32], &v)]);
    let before = digest_dir(&dir.path().join("s"));
    let file = store.mapped("ro").unwrap();
    let adopted: Tensor<2> = gpu.adopt_float(file, [32, 32], DType::F32).unwrap();
    let y = ((adopted.add_scalar(1.0) * 3.0).exp() - 1.0).neg();
    let want: Vec<f32> = v.iter().map(|a| -(((a + 1.0) * 3.0).exp() - 1.0)).collect();
    let got = host(y);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
    let again: Tensor<2> = gpu.adopt_float(file, [32, 32], DType::F32).unwrap();
    assert_eq!(host(again), v, "the mapping still holds the file's values");
    assert_eq!(digest_dir(&dir.path().join("s")), before, "files unchanged");
}

#[test]
fn the_import_is_released_after_the_last_tensor_and_its_work_are_gone() {
    let Some(gpu) = importing() else { return };
    let dir = tempfile::tempdir().unwrap();
    let v = values(5, 64 * 64);
    let store = f32_store(&dir.path().join("s"), &[("release-me", vec![64, 64], &v)]);
    let file = store.mapped("release-me").unwrap();
    let baseline = Arc::strong_count(file);
    let live = |gpu: &GpuDevice| gpu.live_imports().iter().any(|i| i.tensor == "release-me");

    let a: Tensor<2> = gpu.adopt_float(file, [64, 64], DType::F32).unwrap();
    assert!(live(gpu));
    assert_eq!(
        Arc::strong_count(file),
        baseline + 1,
        "the import holds the mapping"
    );
    let b = a.clone();
    let y = a.clone().matmul(b.clone());
    drop(a);
    gpu.cleanup();
    assert!(live(gpu), "a clone still holds it");
    drop(b);
    // `y` is still queued or in flight: it was computed from the import.
    let y = host(y);
    assert!(y.iter().all(|v| v.is_finite()));
    gpu.cleanup();
    assert!(!live(gpu), "released once every tensor is gone");
    assert_eq!(
        Arc::strong_count(file),
        baseline,
        "the mapping's owner was dropped"
    );
}

#[test]
fn the_q8_gemv_reads_mapped_int8_and_scales_in_place() {
    let Some(gpu) = importing() else { return };
    let mut rng = q8_common::Rng::fresh();
    let dir = tempfile::tempdir().unwrap();
    let (out, inp, t) = (77, 96, 3);
    let rows = Q8Rows {
        values: rng.q8_values(out * inp),
        scales: rng.scales(out),
    };
    let mut w = StoreWriter::create(dir.path().join("s")).unwrap();
    let (values_name, scale_name) = write_q8_rows(&mut w, "proj.weight", &rows, out, inp).unwrap();
    let _: Manifest = w.finish().unwrap();
    let store = open_strict(dir.path().join("s"));
    let before = digest_dir(&dir.path().join("s"));

    let (values, placed): (Tensor<2, Int>, _) = gpu.load_int(&store, &values_name).unwrap();
    assert_eq!((placed.placement, placed.refused), (Placement::Map, None));
    let (scales, placed): (Tensor<1>, _) = gpu.load_float(&store, &scale_name).unwrap();
    assert_eq!((placed.placement, placed.refused), (Placement::Map, None));
    for name in [&values_name, &scale_name] {
        let import = gpu
            .live_imports()
            .into_iter()
            .find(|i| &i.tensor == name)
            .unwrap();
        assert_eq!(import.address, store.mapped(name).unwrap().address_range());
    }
    assert_eq!(
        gpu.backing_int(&values).unwrap().vk_buffer,
        gpu.live_imports()
            .iter()
            .find(|i| i.tensor == values_name)
            .unwrap()
            .vk_buffer
    );
    let mapped = Q8Weight::new(values, scales).unwrap();
    let resident = Q8Weight::from_rows(&rows, out, inp, gpu.device()).unwrap();

    let x = rng.vec_nonzero(t * inp);
    let run = |weight: &Q8Weight| {
        let xt = Tensor::<2>::from_data(
            TensorData::new(x.clone(), [t, inp]),
            (gpu.device(), DType::F32),
        );
        host(q8_linear(xt, weight, None).unwrap())
    };
    let y_mapped = run(&mapped);
    let want = q8_common::reference(&x, &rows.values, &rows.scales, None, t, out, inp);
    q8_common::assert_close(&y_mapped, &want, out, "mapped q8");
    assert_eq!(
        y_mapped,
        run(&resident),
        "mapped and resident q8 agree bit for bit"
    );
    assert_eq!(digest_dir(&dir.path().join("s")), before, "files unchanged");
}

#[test]
fn a_tensor_larger_than_a_storage_binding_is_a_clear_error() {
    let Some(gpu) = importing() else { return };
    let dir = tempfile::tempdir().unwrap();
    let len = gpu.max_binding() as usize + 4;
    let mut w = StoreWriter::create(dir.path().join("s")).unwrap();
    w.add(
        burn_mapped::TensorSpec::new("huge", DType::F32, vec![len / 4]),
        &vec![0u8; len],
    )
    .unwrap();
    w.finish().unwrap();
    let store = open_strict(dir.path().join("s"));
    let err = gpu.load_float::<1>(&store, "huge").unwrap_err();
    assert!(
        matches!(&err, AdoptError::TooLargeForBinding { tensor, bytes, limit }
            if tensor == "huge" && *bytes == len as u64 && *limit == gpu.max_binding()),
        "{err}"
    );
}

#[test]
fn kind_and_shape_mismatches_are_typed_errors() {
    let Some(gpu) = importing() else { return };
    let dir = tempfile::tempdir().unwrap();
    let v = values(6, 16);
    let store = f32_store(&dir.path().join("s"), &[("small", vec![4, 4], &v)]);
    let file = store.mapped("small").unwrap();
    let err = gpu.adopt_int::<2>(file, [4, 4], DType::F32).unwrap_err();
    assert!(matches!(err, AdoptError::Kind { .. }), "{err}");
    let err = gpu.adopt_float::<2>(file, [4, 5], DType::F32).unwrap_err();
    assert!(matches!(err, AdoptError::Shape { .. }), "{err}");
    let err = gpu.load_float::<3>(&store, "small").unwrap_err();
    assert!(matches!(err, AdoptError::Shape { .. }), "{err}");
    let err = gpu.load_float::<2>(&store, "missing").unwrap_err();
    assert!(matches!(err, AdoptError::Store(_)), "{err}");
}
