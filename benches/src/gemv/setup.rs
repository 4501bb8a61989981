//! What the arms run on: the device, the store of random q8 matrices, the dequantized float
//! weights and random activations.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use burn::tensor::{DType, Device, Tensor, TensorData, f16};
use burn_mapped::MappedStore;
use burn_mapped::q8::{Q8Rows, dequantize_rows, write_q8_rows};

use super::args::Args;

/// Opens the device `--device` names.
pub fn device(name: &str) -> Result<Device> {
    match name {
        "flex" => Ok(Device::flex()),
        // Opened here, so a missing adapter is an error rather than a panic on first use.
        #[cfg(feature = "wgpu")]
        "wgpu" => Device::wgpu_options().init().context("no wgpu device"),
        #[cfg(feature = "vulkan")]
        "vulkan" => Device::wgpu_options()
            .graphics_api(burn::tensor::wgpu::WgpuBackend::Vulkan)
            .init()
            .context("no Vulkan device"),
        other => bail!(
            "unknown or not compiled-in device `{other}` (flex; wgpu with --features wgpu; \
             vulkan with --features vulkan)"
        ),
    }
}

/// The device, its adapter and the runtime that compiles its kernels (for a GPU, e.g.
/// `cubecl<wgpu<spirv>>`: which shader compiler the figures are for).
pub fn describe(dev: &Device) -> String {
    use burn::backend::{Backend, Dispatch};
    let runtime = <Dispatch as Backend>::name(dev.as_dispatch());
    #[cfg(feature = "wgpu")]
    if let Some(id) = dev.identity() {
        return format!("{dev:?} `{}` {runtime}", id.name);
    }
    format!("{dev:?} {runtime}")
}

/// A xorshift generator: the same operands on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }
}

/// The store name of matrix `k`.
pub fn name(k: usize) -> String {
    format!("m{k:02}.weight")
}

/// The store of random q8 matrices, written once and reused (it is a cache).
pub fn ensure_store(a: &Args) -> Result<PathBuf> {
    let dir = match &a.store {
        Some(d) => d.clone(),
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set; pass --store")?;
            PathBuf::from(home).join(format!(
                ".cache/burn-mapped/gemv/{}x{}x{}",
                a.out, a.inp, a.matrices
            ))
        }
    };
    if let Ok(store) = MappedStore::open(&dir) {
        let ok = (0..a.matrices).all(|k| {
            store
                .manifest()
                .get(&name(k))
                .is_some_and(|e| e.shape() == [a.out, a.inp] && e.quant().is_some())
        });
        if ok {
            return Ok(dir);
        }
    }
    eprintln!(
        "writing {} q8 matrices [{}, {}] to {}",
        a.matrices,
        a.out,
        a.inp,
        dir.display()
    );
    let mut writer = burn_mapped::StoreWriter::create(&dir)?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for k in 0..a.matrices {
        let values = (0..a.out * a.inp)
            .map(|_| (((rng.next_u64() >> 32) % 255) as i32 - 127) as i8)
            .collect::<Vec<i8>>();
        let scales = (0..a.out)
            .map(|_| f16::from_f32(1e-3 * (1.0 + rng.unit())))
            .collect();
        write_q8_rows(
            &mut writer,
            &name(k),
            &Q8Rows { values, scales },
            a.out,
            a.inp,
        )?;
    }
    writer.finish()?;
    Ok(dir)
}

/// `[t, inp]` f32 activations of magnitude 0.1 to 1 with random signs.
pub fn random_x(rng: &mut Rng, t: usize, inp: usize, device: &Device) -> Tensor<2> {
    let v: Vec<f32> = (0..t * inp)
        .map(|_| {
            let m = 0.1 + 0.9 * rng.unit();
            if rng.next_u64() & 1 == 0 { m } else { -m }
        })
        .collect();
    Tensor::from_data(TensorData::new(v, [t, inp]), (device, DType::F32))
}

/// Dequantized f32 copy of a store matrix, built on the host and uploaded.
pub fn float_weight(store: &MappedStore, k: usize, a: &Args, device: &Device) -> Result<Tensor<2>> {
    let values: Vec<i8> = store
        .tensor_data(&name(k))?
        .try_to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let link = store
        .manifest()
        .get(&name(k))
        .and_then(|e| e.quant())
        .context("q8 link")?;
    let scales: Vec<f16> = store
        .tensor_data(&link.scale)?
        .try_to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let w = dequantize_rows(&values, &scales, a.out, a.inp)?;
    Ok(Tensor::from_data(
        TensorData::new(w, [a.out, a.inp]),
        (device, DType::F32),
    ))
}
