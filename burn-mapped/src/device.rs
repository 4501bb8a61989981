//! What a backend does with adopted bytes, decided from the device a module loads onto, and
//! the check that every stored dtype can live there.

use std::path::Path;

use burn::backend::{Backend, DTypeUsage, Dispatch};
use burn::tensor::{DType, Device};

use crate::error::StoreError;
use crate::manifest::Manifest;
use crate::placement::Placement;

/// The placement a module's tensors get on `device`, which depends only on its backend
/// (autodiff looks through to the device it wraps).
///
/// Loading never copies on the way in (both routes hand the backend the mapped pages); what
/// differs is what the backend does with them:
/// - Flex: [`Placement::Map`]. The parameters' storage *is* the mapped page-cache pages, read
///   in place by every op. No copy, ever.
/// - NdArray: [`Placement::PerUseCopy`]. The parameters keep the mapped pages at rest
///   (borrowed storage), but every op that reads a borrowed tensor first copies it into a fresh
///   heap array, so each forward pass copies the weights it touches once more. A parameter
///   whose load runs an op (a `Col`-layout `Linear` weight is transposed on load) is copied by
///   that op at load and rests in the heap instead (and NdArray's matmul copies that
///   transposed array on every use as well).
/// - Any other backend (the CubeCL ones: wgpu, CUDA, ROCm, ...): [`Placement::Resident`].
///   `from_data` copies the bytes once into device memory, after which the mapping is no
///   longer read.
pub fn placement_on(device: &Device) -> Placement {
    backend_placement(device).0
}

/// [`placement_on`] and one line on what it means for this backend, for the load log.
fn backend_placement(device: &Device) -> (Placement, &'static str) {
    #[allow(deprecated)] // NdArray is deprecated upstream, but still a backend users pick.
    let ndarray = Device::ndarray();
    if *device == Device::flex() {
        (Placement::Map, "parameters are the mapped pages, zero copy")
    } else if *device == ndarray {
        (
            Placement::PerUseCopy,
            "parameters borrow the mapped pages at rest; every op copies the weight it reads",
        )
    } else {
        (
            Placement::Resident,
            "copied once into device memory; the mapping is not read after load",
        )
    }
}

/// Whether `device` can hold tensors of `dtype` at all. Storage, not arithmetic: a q8 weight
/// is `i8` that only its own kernel computes with, and must still load where `i8` is
/// storage-only.
fn can_store(device: &Device, dtype: DType) -> bool {
    <Dispatch as Backend>::dtype_usage(device.as_dispatch(), dtype).contains(DTypeUsage::Storage)
}

/// Checks that every tensor of the store can be created on every device of the module, then
/// logs the placement each device gives the store. Runs before any tensor byte is read, so a
/// dtype the backend lacks (f16 on NdArray) is a typed error instead of a panic inside Burn.
pub(crate) fn prepare(
    dir: &Path,
    manifest: &Manifest,
    devices: &[Device],
) -> Result<(), StoreError> {
    for device in devices {
        for entry in manifest.tensors() {
            if !can_store(device, entry.dtype()) {
                return Err(StoreError::DeviceDType {
                    tensor: entry.name().to_string(),
                    file: dir.join(entry.file()),
                    dtype: entry.dtype_name().to_string(),
                    device: format!("{device:?}"),
                });
            }
        }
    }
    let bytes: u64 = manifest.tensors().iter().map(|t| t.len()).sum();
    for device in devices {
        let (placement, meaning) = backend_placement(device);
        log::info!(
            target: "burn_mapped",
            "store {}: {} tensors, {bytes} bytes onto {device:?}: {placement} ({meaning})",
            dir.display(),
            manifest.tensors().len(),
        );
    }
    Ok(())
}
