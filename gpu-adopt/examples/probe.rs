//! Reports whether the first Vulkan adapter can adopt mapped files (the map arm), and with a
//! store directory, where each of its tensors would live.
//!
//! `cargo run --release --example probe [-- STORE_DIR]`

use burn::tensor::Tensor;
use burn_mapped::{MappedStore, Placement, TensorEntry};
use burn_mapped_gpu::{AdoptError, GpuDevice, Placed};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = GpuDevice::open()?;
    println!("adapter: {}", gpu.adapter_name());
    match gpu.host_import() {
        Ok(()) => println!(
            "map arm: available (host-import alignment {} bytes, max binding {} bytes)",
            gpu.import_alignment().unwrap_or_default(),
            gpu.max_binding()
        ),
        Err(reason) => println!("map arm: unavailable: {reason}"),
    }
    if let Some(dir) = std::env::args().nth(1) {
        let store = MappedStore::open(&dir)?;
        for entry in store.manifest().tensors() {
            let name = entry.name();
            match placement(&gpu, &store, entry) {
                Ok(p) => println!("{name}: {p:?}"),
                Err(e) => println!("{name}: error: {e}"),
            }
        }
    }
    Ok(())
}

/// Adopts the tensor flat (where it lives does not depend on its rank) and drops it.
fn placement(
    gpu: &GpuDevice,
    store: &MappedStore,
    entry: &TensorEntry,
) -> Result<Placed, AdoptError> {
    let file = store.mapped(entry.name()).map_err(Box::new)?;
    let n = entry.shape().iter().product::<usize>();
    let result = if entry.dtype().is_float() {
        gpu.adopt_float::<1>(file, [n], entry.dtype())
            .map(|t: Tensor<1>| drop(t))
    } else {
        gpu.adopt_int::<1>(file, [n], entry.dtype()).map(drop)
    };
    match result {
        Ok(()) => Ok(Placed {
            placement: Placement::Map,
            refused: None,
        }),
        Err(e) if e.resident_fallback() => Ok(Placed {
            placement: Placement::Resident,
            refused: Some(e.to_string()),
        }),
        Err(e) => Err(e),
    }
}
