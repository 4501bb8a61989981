//! Shared by the adoption tests: the device, fixture stores, and f64 references written
//! here from the definitions of the ops, independent of Burn's kernels.
#![allow(dead_code)]

use std::path::Path;
use std::sync::OnceLock;

use burn::tensor::DType;
use burn_mapped::{MappedStore, StoreWriter, TensorSpec};
use burn_mapped_gpu::GpuDevice;
use sha2::{Digest, Sha256};

/// The shared device, or `None` (skip) when no Vulkan adapter works and
/// `BURN_MAPPED_REQUIRE_GPU=1` is not set (then it panics). In CI the adapter is Mesa's
/// lavapipe (`apt-get install mesa-vulkan-drivers libvulkan1`).
pub fn gpu() -> Option<&'static GpuDevice> {
    static DEVICE: OnceLock<Option<GpuDevice>> = OnceLock::new();
    let device = DEVICE.get_or_init(|| match GpuDevice::open() {
        Ok(device) => {
            eprintln!(
                "adapter: {} (host import: {:?}, alignment {:?}, max binding {})",
                device.adapter_name(),
                device.host_import(),
                device.import_alignment(),
                device.max_binding()
            );
            Some(device)
        }
        Err(err) => {
            let required = std::env::var("BURN_MAPPED_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "BURN_MAPPED_REQUIRE_GPU=1 but: {err}");
            eprintln!("skipping: {err} (set BURN_MAPPED_REQUIRE_GPU=1 to fail instead)");
            None
        }
    });
    device.as_ref()
}

/// The shared device when it imports host memory, or `None` (skip, saying why) when there is
/// no device or it cannot import.
pub fn importing() -> Option<&'static GpuDevice> {
    let gpu = gpu()?;
    match gpu.host_import() {
        Ok(()) => Some(gpu),
        Err(reason) => {
            eprintln!(
                "skipping: no host import on {}: {reason}",
                gpu.adapter_name()
            );
            None
        }
    }
}

/// Deterministic values in (-1, 1) (xorshift), different per seed.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes a store at `dir` with one f32 tensor per `(name, shape, values)`.
pub fn f32_store(dir: &Path, tensors: &[(&str, Vec<usize>, &[f32])]) -> MappedStore {
    let mut w = StoreWriter::create(dir).unwrap();
    for (name, shape, data) in tensors {
        w.add(
            TensorSpec::new(*name, DType::F32, shape.clone()),
            &f32_bytes(data),
        )
        .unwrap();
    }
    w.finish().unwrap();
    open_strict(dir)
}

/// Opens the store at `dir` strict: a host-side mutable access to its mapped bytes is refused
/// (an error naming the tensor) rather than served by a private copy, so a test that passes
/// shows that no path it took wanted to write them.
pub fn open_strict(dir: impl AsRef<Path>) -> MappedStore {
    MappedStore::options().strict(true).open(dir).unwrap()
}

/// SHA-256 of every file in `dir`, in name order.
pub fn digest_dir(dir: &Path) -> Vec<(String, [u8; 32])> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                Sha256::digest(&bytes).into(),
            )
        })
        .collect()
}

/// `x [t, k] @ w [k, n]` in f64, with the error bound of an f32 kernel: `k` roundings of
/// products and sums, times the magnitude sum, with a factor 2 margin.
pub fn matmul_reference(x: &[f32], w: &[f32], t: usize, k: usize, n: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(t * n);
    for i in 0..t {
        for j in 0..n {
            let (mut dot, mut mag) = (0f64, 0f64);
            for p in 0..k {
                let v = f64::from(x[i * k + p]) * f64::from(w[p * n + j]);
                dot += v;
                mag += v.abs();
            }
            out.push((dot, 2.0 * (k as f64 + 2.0) * f64::from(f32::EPSILON) * mag));
        }
    }
    out
}

pub fn assert_close(got: &[f32], want: &[(f64, f64)], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for (i, (&g, &(w, tol))) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= tol,
            "{ctx}: [{i}] = {g}, reference {w}, error {err:e} > {tol:e}"
        );
    }
}
