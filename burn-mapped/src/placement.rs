//! Where loaded weights live: the three endpoints through which a device reaches the weight
//! bytes. Which one to pick for a store on a device is policy, and lives in
//! `burn-mapped-tools`; what a backend makes of adopted bytes is [`placement_on`].
//!
//! - [`Placement::Map`]: tensors adopt the mapped file pages. On Flex the parameters *are* the
//!   page cache; on a CubeCL backend `from_data` uploads them once (there, map is not
//!   available and the upload is the resident placement).
//! - [`Placement::Resident`]: loading copies each tensor once into storage the process owns
//!   ([`owned_copy`]); the mapping is released by the loader and only the copy is read.
//! - [`Placement::PerUseCopy`]: the weights rest in the mapping (loaded as for `Map`) and are
//!   copied into fresh storage on the compute device before every use, by a [`Stager`]. A
//!   loader cannot make an arbitrary module do that; the module stages through a `Stager`
//!   (`Stager::stage_module` re-materializes a whole module or layer per call).
//!
//!
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::StoreError;
use crate::manifest::Manifest;
use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::backend::{Backend, DTypeUsage, Dispatch};
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::DType;
use burn::tensor::kind::Basic;
use burn::tensor::{BackendPrimitive, Bytes, Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;

/// One of the three endpoints through which a device reaches the weight bytes: what a loader
/// is asked for, what a backend gives, and what the selection rule chooses.
///
/// Serialized in snake case (`map`, `resident`, `per_use_copy`), the form probe reports and
/// verdicts on disk already use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Adopt the mapped pages; no copy (on backends that can adopt host memory).
    #[default]
    Map,
    /// Copy once into owned storage at load and read that copy.
    Resident,
    /// Keep the mapping at rest and copy into fresh storage before every use.
    PerUseCopy,
}

impl Placement {
    /// All three, in the order of reports and of breaking exact ties: fewest owned copies first.
    pub const ALL: [Placement; 3] = [Placement::Map, Placement::Resident, Placement::PerUseCopy];

    /// The command-line spelling, which [`FromStr`] reads back: `map`, `resident`,
    /// `per-use-copy`.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Map => "map",
            Placement::Resident => "resident",
            Placement::PerUseCopy => "per-use-copy",
        }
    }

    /// The label for prose, tables and logs (also [`Display`](fmt::Display)): `map`,
    /// `resident`, `per-use copy`.
    pub fn label(self) -> &'static str {
        match self {
            Placement::Map => "map",
            Placement::Resident => "resident",
            Placement::PerUseCopy => "per-use copy",
        }
    }

    /// Whether loading copies the bytes (only `Resident`: per-use copy stages later).
    pub(crate) fn copies_at_load(self) -> bool {
        self == Placement::Resident
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A placement name that is none of the three.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement `{0}`: expected map, resident or per-use-copy")]
pub struct UnknownPlacement(pub String);

impl FromStr for Placement {
    type Err = UnknownPlacement;

    /// The [`name`](Placement::name), in any case; `per_use_copy` (the serialized form) and
    /// `copy` also name the per-use copy.
    fn from_str(s: &str) -> Result<Self, UnknownPlacement> {
        match s.to_ascii_lowercase().as_str() {
            "map" => Ok(Placement::Map),
            "resident" => Ok(Placement::Resident),
            "per-use-copy" | "per_use_copy" | "copy" => Ok(Placement::PerUseCopy),
            _ => Err(UnknownPlacement(s.to_owned())),
        }
    }
}

/// A fresh, 16-byte aligned buffer holding a copy of `src`: exactly one `memcpy`.
///
/// `Bytes::from_bytes_vec` would copy a second time to raise a `Vec<u8>`'s alignment; starting
/// from an empty `u128` allocation of the right capacity avoids that.
pub fn owned_copy(src: &[u8]) -> Bytes {
    let mut bytes = Bytes::from_elems(Vec::<u128>::with_capacity(src.len().div_ceil(16)));
    bytes.extend_from_byte_slice(src);
    bytes
}

/// [`owned_copy`] behind a reference count, so that handing it to Burn (which clones tensor
/// bytes while applying a record) shares the one copy instead of duplicating it.
pub(crate) fn shared_owned_copy(src: &[u8]) -> Bytes {
    struct Owned(Bytes);
    impl AsRef<[u8]> for Owned {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    let shared = bytes::Bytes::from_owner(Owned(owned_copy(src)));
    Bytes::from_shared(shared, burn::tensor::AllocationProperty::Native)
}

#[derive(Debug, Default)]
struct Counts {
    bytes: AtomicU64,
    tensors: AtomicU64,
}

/// Copies tensors into fresh storage on one compute device, every call, and counts the bytes.
///
/// This is the per-use-copy endpoint: the stock streaming path that stages each weight before
/// it is used. On Flex a staged tensor is one `memcpy` of the source's storage into a new
/// buffer (same layout, so a transposed `Col` weight stays a view and the copy stays a plain
/// `memcpy`); on another backend it is a contiguous host copy (the staging buffer) uploaded by
/// `from_data`. Clones share the counters.
#[derive(Clone, Debug)]
pub struct Stager {
    device: Device,
    counts: Arc<Counts>,
}

impl Stager {
    /// A stager that places its copies on `device`.
    pub fn new(device: Device) -> Self {
        Self {
            device,
            counts: Arc::default(),
        }
    }

    /// The compute device the copies land on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes copied so far by this stager and its clones.
    pub fn staged_bytes(&self) -> u64 {
        self.counts.bytes.load(Ordering::Relaxed)
    }

    /// Tensors copied so far by this stager and its clones.
    pub fn staged_tensors(&self) -> u64 {
        self.counts.tensors.load(Ordering::Relaxed)
    }

    /// A copy of `tensor` in fresh storage on the stager's device (see the type docs).
    pub fn stage<const D: usize, K>(&self, tensor: Tensor<D, K>) -> Tensor<D, K>
    where
        K: Basic + BackendPrimitive<Flex, Primitive = FlexTensor>,
    {
        let to_flex = is_flex(&self.device);
        let (staged, bytes) = match tensor.clone().try_into_primitive::<Flex>() {
            Ok(flex) if to_flex => {
                let copy = owned_copy(flex.bytes());
                let bytes = copy.len();
                let fresh = FlexTensor::new(copy, flex.layout().clone(), flex.dtype());
                (Tensor::from_primitive::<Flex>(fresh), bytes)
            }
            Ok(flex) if flex.is_contiguous() && flex.layout().start_offset() == 0 => {
                let len = flex.layout().num_elements() * flex.dtype().size();
                let data = TensorData::from_bytes(
                    owned_copy(&flex.bytes()[..len]),
                    flex.layout().shape().clone(),
                    flex.dtype(),
                );
                (Tensor::from_data(data, &self.device), len)
            }
            // A strided host view, or a tensor on another backend: reading it back is the copy.
            _ => {
                let data = tensor.into_data();
                let bytes = data.as_bytes().len();
                (Tensor::from_data(data, &self.device), bytes)
            }
        };
        self.counts.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.counts.tensors.fetch_add(1, Ordering::Relaxed);
        staged
    }

    /// `module` with every float and int parameter replaced by a fresh staged copy: the
    /// per-use route for a module (or one layer) that has no staging of its own. Call it before
    /// each use and drop the result after.
    pub fn stage_module<M: Module>(&self, module: M) -> M {
        module.map(&mut StageMapper { stager: self })
    }
}

struct StageMapper<'a> {
    stager: &'a Stager,
}

impl ModuleMapper for StageMapper<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| self.stager.stage(t))
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        param.map(|t| self.stager.stage(t))
    }
}

/// Whether `device` is Flex, whose tensors can be host bytes this crate hands over or copies.
pub fn is_flex(device: &Device) -> bool {
    matches!(device.as_dispatch(), burn::backend::DispatchDevice::Flex(_))
}

// What a backend does with adopted bytes, decided from the device a module loads onto, and the
// check that every stored dtype can live there.

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
    #[cfg(feature = "cubecl")]
    {
        matches!(device.as_dispatch(), burn::backend::DispatchDevice::Cube(_))
    }
    #[cfg(not(feature = "cubecl"))]
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
        #[cfg(feature = "cubecl")]
        burn::backend::DispatchDevice::Cube(d) => {
            Some(d.client().properties().memory.max_page_size)
        }
        _ => None,
    }
}

/// The tensors of the store read only by burn-mapped's own CubeCL kernels, which bind a
/// buffer as 32-bit words whatever its dtype: the int8 values and f16 scales of each q8
/// matrix, and the bytes of GGUF blocks. Such a tensor loads on a CubeCL device even where its dtype is not a storage type
/// (WGSL has no 8-bit type at all, and f16 only with an extension): the upload copies bytes,
/// and nothing but those kernels reads them.
fn read_as_words(manifest: &Manifest) -> HashSet<&str> {
    let mut names = HashSet::new();
    for entry in manifest.tensors() {
        if let Some(link) = entry.quant() {
            names.insert(entry.name());
            names.insert(link.scale.as_str());
        }
        if entry.blocks().is_some() {
            names.insert(entry.name());
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
