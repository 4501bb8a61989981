//! What a backend does with adopted bytes, decided from the device a module loads onto, and
//! the check that every stored dtype can live there.

use std::collections::HashSet;
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
/// - NdArray (feature `ndarray`): [`Placement::PerUseCopy`]. The parameters keep the mapped
///   pages at rest (borrowed storage), but every op that reads a borrowed tensor first copies it
///   into a fresh heap array, so each forward pass copies the weights it touches once more. A
///   parameter whose load runs an op (a `Col`-layout `Linear` weight is transposed on load) is
///   copied by that op at load and rests in the heap instead (and NdArray's matmul copies that
///   transposed array on every use as well). Without the feature, an NdArray device falls
///   under the next line.
/// - Any other backend (the CubeCL ones: wgpu, CUDA, ROCm, ...): [`Placement::Resident`].
///   `from_data` copies the bytes once into device memory, after which the mapping is no
///   longer read.
pub fn placement_on(device: &Device) -> Placement {
    backend_placement(device).0
}

/// [`placement_on`] and one line on what it means for this backend, for the load log.
fn backend_placement(device: &Device) -> (Placement, &'static str) {
    if *device == Device::flex() {
        return (Placement::Map, "parameters are the mapped pages, zero copy");
    }
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)] // NdArray is deprecated upstream, but still a backend users pick.
    {
        if *device == Device::ndarray() {
            return (
                Placement::PerUseCopy,
                "parameters borrow the mapped pages at rest; every op copies the weight it reads",
            );
        }
    }
    (
        Placement::Resident,
        "copied once into device memory; the mapping is not read after load",
    )
}

/// Whether `device` can hold tensors of `dtype` at all. Storage, not arithmetic: a q8 weight
/// is `i8` that only its own kernel computes with, and must still load where `i8` is
/// storage-only.
fn can_store(device: &Device, dtype: DType) -> bool {
    <Dispatch as Backend>::dtype_usage(device.as_dispatch(), dtype).contains(DTypeUsage::Storage)
}

/// Whether `device` runs on one of Burn's CubeCL backends (wgpu, Vulkan, CUDA, ...), where
/// burn-mapped's q8 kernels read int8 as 32-bit words.
pub(crate) fn is_cube(device: &Device) -> bool {
    #[cfg(feature = "wgpu")]
    {
        matches!(device.as_dispatch(), burn::backend::DispatchDevice::Cube(_))
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = device;
        false
    }
}

/// The largest buffer one kernel binding can hold on `device`, in bytes; `None` where no such
/// limit applies (host backends). Drivers differ widely: Mesa's lavapipe binds at most
/// 128 MiB, while a vocabulary-sized matrix can be several times that, so a loader splits such
/// a tensor into row blocks that each bind on their own.
pub fn max_binding(device: &Device) -> Option<u64> {
    match device.as_dispatch() {
        #[cfg(feature = "wgpu")]
        burn::backend::DispatchDevice::Cube(d) => {
            Some(d.client().properties().memory.max_page_size)
        }
        _ => None,
    }
}

/// The tensors of the store read only by burn-mapped's own CubeCL kernels, which bind a
/// buffer as 32-bit words whatever its dtype: the int8 values and f16 scales of each q8
/// matrix. Such a tensor loads on a CubeCL device even where its dtype is not a storage type
/// (WGSL has no 8-bit type at all, and f16 only with an extension): the upload copies bytes,
/// and nothing but those kernels reads them.
fn read_as_words(manifest: &Manifest) -> HashSet<&str> {
    let mut names = HashSet::new();
    for entry in manifest.tensors() {
        if let Some(link) = entry.quant() {
            names.insert(entry.name());
            names.insert(link.scale.as_str());
        }
    }
    names
}

/// Checks that every tensor of the store (except those named in `left_out`, which the caller
/// loads its own way) can be created on every device of the module, then logs the placement
/// each device gives the store. Runs before any tensor byte is read, so a dtype the backend
/// lacks (f16 on NdArray) is a typed error instead of a panic inside Burn.
pub(crate) fn prepare(
    dir: &Path,
    manifest: &Manifest,
    devices: &[Device],
    left_out: &[&str],
) -> Result<(), StoreError> {
    let words = read_as_words(manifest);
    for device in devices {
        for entry in manifest.tensors() {
            if left_out.contains(&entry.name()) {
                continue;
            }
            let words = is_cube(device) && words.contains(entry.name());
            if !words && !can_store(device, entry.dtype()) {
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
