//! Inputs written by the tests themselves, in temporary directories: deterministic bytes,
//! safetensors files, and a store too large to hold in memory, written straight from a
//! generator.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, LinearLayout};
use burn::tensor::{DType, Device, Tensor};
use burn_mapped::{StoreWriter, TensorSpec};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

pub use crate::xorshift::XorShift;

/// A fresh temporary directory that removes itself.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("burn-mapped-test")
        .tempdir()
        .unwrap()
}

/// Deterministic, non-repeating bytes (a 64-bit LCG).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect()
}

/// The paths of the entries of `dir`, in name order.
pub fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    entries
}

/// The names of the entries of `dir`, in order: what a test checks was left behind.
pub fn entry_names(dir: &Path) -> Vec<String> {
    sorted_entries(dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// Writes `bytes` as `dir/name` and returns its path.
pub fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    path
}

/// Edits a store's `manifest.json` as JSON, then seals it again: when the edited entries are
/// valid, the manifest's digest is set to theirs (taken from the library's own refusal), so a
/// test can make a store that is consistent but different, as a converter of another version
/// might. An edit that makes an entry invalid is left for the parser to refuse.
pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(burn_mapped::manifest::MANIFEST_FILE);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, sealed_manifest(&v.to_string())).unwrap();
}

/// `manifest` (JSON text) with its digest set to its entries' when they are valid (see
/// [`edit_manifest`]); as it is otherwise.
pub fn sealed_manifest(manifest: &str) -> String {
    let path = Path::new("manifest.json");
    match burn_mapped::Manifest::parse(manifest.as_bytes(), path) {
        Err(burn_mapped::StoreError::ManifestDigest { computed, .. }) => {
            let mut v: serde_json::Value = serde_json::from_str(manifest).unwrap();
            v["digest"] = computed.into();
            v.to_string()
        }
        _ => manifest.to_string(),
    }
}

/// One tensor of a safetensors file: name, dtype, shape, little-endian bytes.
pub type RawTensor<N> = (N, Dtype, Vec<usize>, Vec<u8>);

/// Writes `tensors` as a safetensors file with the `safetensors` crate itself.
pub fn write_safetensors<N: AsRef<str>>(
    path: &Path,
    tensors: &[RawTensor<N>],
    metadata: Option<HashMap<String, String>>,
) {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.as_ref(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, metadata, path).unwrap();
}

/// Layers of [`BigStack`].
pub const BIG_LAYERS: usize = 33;
/// Width of each [`BigStack`] layer.
pub const BIG_DIM: usize = 2048;
/// Bytes of [`BigStack`]'s weights: 528 MiB, enough that a copy shows in anonymous memory.
pub const BIG_WEIGHT_BYTES: u64 = (BIG_LAYERS * BIG_DIM * BIG_DIM * 4) as u64;

/// [`BIG_LAYERS`] `[BIG_DIM, BIG_DIM]` f32 linear layers without bias.
#[derive(Module, Debug)]
pub struct BigStack {
    pub layers: Vec<Linear>,
}

impl BigStack {
    /// Lazily initialized: no weight is generated unless read before a load replaces it.
    pub fn init(device: &Device, layout: LinearLayout) -> Self {
        let layers = (0..BIG_LAYERS)
            .map(|_| {
                LinearConfig::new(BIG_DIM, BIG_DIM)
                    .with_bias(false)
                    .with_layout(layout)
                    .init(device)
            })
            .collect();
        Self { layers }
    }

    /// Reads every weight once.
    pub fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        for layer in &self.layers {
            x = layer.forward(x).tanh();
        }
        x
    }
}

/// Writes [`BigStack`]'s store (`layers.{i}.weight`, xorshift values from `seed` in
/// `[-0.02, 0.02)`) straight from a generator, so the test process never holds it.
pub fn write_big_stack(dir: &Path, seed: u64) {
    let mut w = StoreWriter::create(dir).unwrap();
    let mut state = seed;
    for i in 0..BIG_LAYERS {
        let spec = TensorSpec::new(format!("layers.{i}.weight"), DType::F32, [BIG_DIM, BIG_DIM]);
        w.add_with(spec, |sink| {
            let mut row = Vec::with_capacity(BIG_DIM * 4);
            for _ in 0..BIG_DIM {
                row.clear();
                for _ in 0..BIG_DIM {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04;
                    row.extend_from_slice(&v.to_le_bytes());
                }
                sink.write_all(&row)?;
            }
            Ok(())
        })
        .unwrap();
    }
    w.finish().unwrap();
}
