//! The synthetic model: a stack of `[dim, dim]` linear layers (4 GiB at the defaults), its
//! inputs written once, and the child that loads it and runs one token through every layer.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, LinearLayout};
use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_mapped::{MappedRecorder, StoreWriter, TensorSpec};
use serde::{Deserialize, Serialize};

use crate::arms::{self, Arm, ArmFiles};
use crate::measure::{Mem, bits_hash, ms};

#[derive(Module, Debug)]
pub struct Stack {
    layers: Vec<Linear>,
}

impl Stack {
    /// Lazily initialized: no weight is generated unless read before a load replaces it.
    pub fn init(layers: usize, dim: usize, device: &Device) -> Self {
        Self {
            layers: (0..layers)
                .map(|_| {
                    LinearConfig::new(dim, dim)
                        .with_layout(LinearLayout::Col)
                        .init(device)
                })
                .collect(),
        }
    }

    /// One token through every layer (reads every weight); returns the output's bit-pattern
    /// hash, which must agree across arms.
    pub fn forward_one(&self, dim: usize, device: &Device) -> Result<u64> {
        let input: Vec<f32> = (0..dim).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        let mut x = Tensor::<2>::from_data(TensorData::new(input, [1, dim]), device);
        for layer in &self.layers {
            x = layer.forward(x).tanh();
        }
        let out = x
            .try_into_vec_as::<f32>()
            .map_err(|e| anyhow::anyhow!("reading the output back: {e}"))?;
        Ok(bits_hash(&out))
    }
}

/// Deterministic values in `[-scale, scale)` (SplitMix64), so every format holds the same.
fn fill(seed: u64, out: &mut [f32], scale: f32) {
    let mut state = seed;
    for v in out {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let unit = (z >> 40) as f32 / (1u64 << 24) as f32;
        *v = (unit * 2.0 - 1.0) * scale;
    }
}

/// Input paths for a `layers` x `[dim, dim]` stack under `bench_dir`.
pub fn files(bench_dir: &Path, layers: usize, dim: usize) -> ArmFiles {
    let dir = bench_dir.join(format!("synthetic-{layers}x{dim}"));
    ArmFiles {
        store: dir.join("store"),
        burnpack: dir.join("model.bpk"),
        safetensors: dir.join("model.safetensors"),
    }
}

/// Writes the store layer by layer (never the whole model in memory), then the burnpack and
/// safetensors copies from the adopted store.
pub fn prepare(files: &ArmFiles, layers: usize, dim: usize) -> Result<()> {
    if let Some(parent) = files.store.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if !files
        .store
        .join(burn_mapped::manifest::MANIFEST_FILE)
        .is_file()
    {
        eprintln!("writing the synthetic store {}", files.store.display());
        let mut writer = StoreWriter::create(&files.store)?;
        let scale = 1.0 / (dim as f32).sqrt();
        let mut w = vec![0f32; dim * dim];
        let mut b = vec![0f32; dim];
        for i in 0..layers {
            fill(2 * i as u64 + 1, &mut w, scale);
            fill(2 * i as u64 + 2, &mut b, scale);
            writer.add(
                TensorSpec::new(format!("layers.{i}.weight"), DType::F32, [dim, dim]),
                bytes_of(&w),
            )?;
            writer.add(
                TensorSpec::new(format!("layers.{i}.bias"), DType::F32, [dim]),
                bytes_of(&b),
            )?;
        }
        writer.finish()?;
    }
    if !files.burnpack.is_file() || !files.safetensors.is_file() {
        eprintln!("writing the synthetic burnpack and safetensors copies");
        let device = Device::flex();
        let model = Stack::init(layers, dim, &device)
            .try_load_record(MappedRecorder::default().load(&files.store)?)
            .context("loading the synthetic store")?;
        arms::write_formats(&model, files)?;
    }
    Ok(())
}

fn bytes_of(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every bit pattern is a valid u8; the slice covers exactly
    // the vector's initialized elements.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// What the child of one synthetic arm reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SynthSample {
    pub arm: Arm,
    pub round: usize,
    pub residency_before: f64,
    pub construct_ms: f64,
    /// Construction + load.
    pub load_ms: f64,
    /// Load + one token through every layer (touches every weight).
    pub ready_ms: f64,
    pub forward_ms: f64,
    pub mem_after_load: Mem,
    pub mem_after_forward: Mem,
    pub output_xxh3: String,
    pub process_ms: f64,
}

/// The child side.
pub fn run(arm: Arm, files: &ArmFiles, layers: usize, dim: usize) -> Result<SynthSample> {
    let device = Device::flex();
    let start = Instant::now();
    let fresh = Stack::init(layers, dim, &device);
    let construct_ms = ms(start);
    let model = arms::load(arm, fresh, files)?;
    let load_ms = ms(start);
    let mem_after_load = Mem::now()?;
    let t = Instant::now();
    let hash = model.forward_one(dim, &device)?;
    let forward_ms = ms(t);
    let ready_ms = ms(start);
    Ok(SynthSample {
        arm,
        round: 0,
        residency_before: 0.0,
        construct_ms,
        load_ms,
        ready_ms,
        forward_ms,
        mem_after_load,
        mem_after_forward: Mem::now()?,
        output_xxh3: format!("{hash:016x}"),
        process_ms: 0.0,
    })
}
