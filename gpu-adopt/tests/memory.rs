//! Adoption adds no anonymous memory: a 64 MiB weight read by a GPU GEMV through its file
//! mapping grows the process's file-backed resident set, while the same weight loaded resident
//! (on lavapipe, device memory is host memory) grows the anonymous one by its size.
//!
//! Its own test binary so nothing else allocates while it measures.

mod common;

use burn::tensor::{DType, Tensor, TensorData};
use burn_mapped::host::memstat::rss_self;
use common::{f32_store, importing, values};

const MIB: f64 = 1024.0 * 1024.0;

#[test]
fn a_mapped_weight_adds_no_anonymous_memory_and_a_resident_one_adds_its_size() {
    let Some(gpu) = importing() else { return };
    let (k, n) = (2048, 8192); // 64 MiB of f32
    let size = (k * n * 4) as f64;
    let w = values(7, k * n);
    let x = values(8, k);
    let dir = tempfile::tempdir().unwrap();
    let store = f32_store(
        &dir.path().join("s"),
        &[("warm", vec![k, n], &w), ("w", vec![k, n], &w)],
    );
    drop(w);
    let device = gpu.device();
    let gemv = |weight: Tensor<2>| {
        let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [1, k]), (device, DType::F32));
        xt.matmul(weight).into_data().try_to_vec::<f32>().unwrap()
    };

    // Warm-up on another file of the same shape: kernels compiled, pools sized.
    let warm = gpu
        .adopt_float(store.mapped("warm").unwrap(), [k, n], DType::F32)
        .unwrap();
    let y_warm = gemv(warm);
    gpu.cleanup();

    let r0 = rss_self().unwrap();
    let mapped = gpu
        .adopt_float(store.mapped("w").unwrap(), [k, n], DType::F32)
        .unwrap();
    let y_mapped = gemv(mapped.clone());
    let r1 = rss_self().unwrap();
    drop(mapped);
    gpu.cleanup();

    let host_w = store.tensor_data("w").unwrap();
    let r2 = rss_self().unwrap();
    let resident = Tensor::<2>::from_data(host_w, (device, DType::F32));
    let y_resident = gemv(resident.clone());
    let r3 = rss_self().unwrap();

    let d_anon_mapped = r1.anon as f64 - r0.anon as f64;
    let d_file_mapped = r1.file as f64 - r0.file as f64;
    let d_anon_resident = r3.anon as f64 - r2.anon as f64;
    eprintln!(
        "64 MiB weight, one GEMV: mapped RssAnon {:+.1} MiB, RssFile {:+.1} MiB; resident \
         RssAnon {:+.1} MiB",
        d_anon_mapped / MIB,
        d_file_mapped / MIB,
        d_anon_resident / MIB
    );
    assert_eq!(y_mapped, y_warm, "same bytes, same result");
    assert_eq!(y_mapped, y_resident, "mapped and resident agree");
    assert!(
        d_anon_mapped < 0.05 * size,
        "mapped added {:.1} MiB of anonymous memory",
        d_anon_mapped / MIB
    );
    assert!(
        d_file_mapped > 0.9 * size,
        "the GEMV read the pages through the mapping: RssFile grew only {:.1} MiB",
        d_file_mapped / MIB
    );
    assert!(
        d_anon_resident > 0.9 * size,
        "resident should hold an anonymous copy: {:.1} MiB",
        d_anon_resident / MIB
    );
    drop(resident);
}
