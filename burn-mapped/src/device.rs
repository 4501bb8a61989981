//! What a backend does with adopted bytes, decided from the device a module loads onto, and
//! the check that every stored dtype can live there.

use std::path::Path;

use burn::backend::{Backend, DTypeUsage, Dispatch};
use burn::tensor::{DType, Device};

use crate::error::StoreError;
use crate::manifest::Manifest;

/// Where a loaded store's bytes end up, which depends only on the backend.
///
/// The names follow the paper's three placements. Loading never copies on the way in (both
/// routes hand the backend the mapped pages); what differs is what the backend does with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevicePlacement {
    /// Flex: the parameters' storage *is* the mapped page-cache pages, read in place by every
    /// op. No copy, ever.
    Map,
    /// NdArray: the parameters keep the mapped pages at rest (borrowed storage), but every op
    /// that reads a borrowed tensor first copies it into a fresh heap array, so each forward
    /// pass copies the weights it touches once more. A parameter whose load runs an op (a
    /// `Col`-layout `Linear` weight is transposed on load) is copied by that op at load and
    /// rests in the heap instead (and NdArray's matmul copies that transposed array on every
    /// use as well).
    PerUseCopy,
    /// Any other backend (the CubeCL ones: wgpu, CUDA, ROCm, ...): `from_data` copies the
    /// bytes once into device memory, after which the mapping is no longer read.
    Resident,
}

impl DevicePlacement {
    /// The placement a module's tensors get on `device` (autodiff looks through to the device
    /// it wraps).
    pub fn of(device: &Device) -> Self {
        #[allow(deprecated)] // NdArray is deprecated upstream, but still a backend users pick.
        let ndarray = Device::ndarray();
        if *device == Device::flex() {
            DevicePlacement::Map
        } else if *device == ndarray {
            DevicePlacement::PerUseCopy
        } else {
            DevicePlacement::Resident
        }
    }

    /// The label used in logs and docs: `map`, `per-use copy` or `resident`.
    pub fn label(self) -> &'static str {
        match self {
            DevicePlacement::Map => "map",
            DevicePlacement::PerUseCopy => "per-use copy",
            DevicePlacement::Resident => "resident",
        }
    }

    fn meaning(self) -> &'static str {
        match self {
            DevicePlacement::Map => "parameters are the mapped pages, zero copy",
            DevicePlacement::PerUseCopy => {
                "parameters borrow the mapped pages at rest; every op copies the weight it reads"
            }
            DevicePlacement::Resident => {
                "copied once into device memory; the mapping is not read after load"
            }
        }
    }
}

impl std::fmt::Display for DevicePlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
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
        let placement = DevicePlacement::of(device);
        log::info!(
            target: "burn_mapped",
            "store {}: {} tensors, {bytes} bytes onto {device:?}: {placement} ({})",
            dir.display(),
            manifest.tensors().len(),
            placement.meaning(),
        );
    }
    Ok(())
}
