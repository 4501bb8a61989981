//! Errors of device setup and adoption.

use std::fmt;

use ash::vk;
use burn::tensor::DType;
use burn_mapped::StoreError;

/// Opening the Vulkan device or registering it with CubeCL failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// No Vulkan adapter is reachable (no driver, or no ICD installed).
    #[error("no Vulkan adapter found (is a Vulkan driver such as Mesa's lavapipe installed?)")]
    NoAdapter,
    /// The driver refused to create the device.
    #[error("opening a Vulkan device on {adapter}: {reason}")]
    Open {
        /// The adapter's name.
        adapter: String,
        /// What wgpu or the driver said.
        reason: String,
    },
    /// CubeCL refused the device.
    #[error("registering the Vulkan device {adapter} with CubeCL: {source}")]
    Register {
        /// The adapter's name.
        adapter: String,
        /// CubeCL's error.
        #[source]
        source: burn_cubecl::cubecl::wgpu::WgpuInitError,
    },
}

/// Why a device cannot import host memory at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The device was opened without host import ([`GpuDevice::open_with`](crate::GpuDevice::open_with)).
    Disabled,
    /// The driver does not advertise `VK_EXT_external_memory_host`.
    NotAdvertised,
    /// The driver advertises the extension but refused a one-page probe import (the NVIDIA
    /// driver answers `VK_ERROR_OUT_OF_DEVICE_MEMORY` for every host pointer).
    ProbeRefused(vk::Result),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("the device was opened without host-memory import"),
            Self::NotAdvertised => {
                f.write_str("the driver does not offer VK_EXT_external_memory_host")
            }
            Self::ProbeRefused(result) => write!(
                f,
                "the driver offers VK_EXT_external_memory_host but refused a one-page probe import ({result})"
            ),
        }
    }
}

/// Adopting one tensor file failed.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The device cannot import host memory (see [`Unavailable`]).
    #[error("tensor {tensor}: host-memory import is unavailable on {adapter}: {reason}")]
    Unavailable {
        /// The tensor.
        tensor: String,
        /// The adapter's name.
        adapter: String,
        /// Why.
        reason: Unavailable,
    },
    /// The driver refused this mapping (the device imports others).
    #[error("tensor {tensor}: the driver refused to import its mapping: {step} returned {result}")]
    Refused {
        /// The tensor.
        tensor: String,
        /// The Vulkan call that failed.
        step: &'static str,
        /// Its result.
        result: vk::Result,
    },
    /// The mapping's base or length is not a multiple of the driver's import granularity
    /// (`minImportedHostPointerAlignment`), so it cannot be imported without importing memory
    /// outside the mapping.
    #[error(
        "tensor {tensor}: its mapping ({len} bytes at {address:#x}) is not aligned to the driver's \
         {alignment}-byte host-import granularity"
    )]
    Misaligned {
        /// The tensor.
        tensor: String,
        /// Base address of the mapping.
        address: usize,
        /// Length of the mapping.
        len: usize,
        /// The driver's granularity.
        alignment: u64,
    },
    /// The mapping is larger than one device allocation may be (`maxMemoryAllocationSize`).
    #[error(
        "tensor {tensor}: its {len}-byte mapping exceeds the device's largest allocation \
         ({limit} bytes); split it into several files"
    )]
    TooLargeForAllocation {
        /// The tensor.
        tensor: String,
        /// Length of the mapping.
        len: u64,
        /// The device's limit.
        limit: u64,
    },
    /// The tensor is larger than one storage binding may be
    /// (`max_storage_buffer_binding_size`): no kernel could bind it whole, adopted or resident.
    #[error(
        "tensor {tensor}: {bytes} bytes exceed the device's largest storage binding ({limit} \
         bytes); no kernel can bind it whole"
    )]
    TooLargeForBinding {
        /// The tensor.
        tensor: String,
        /// Its logical size.
        bytes: u64,
        /// The device's limit.
        limit: u64,
    },
    /// The dtype does not fit the requested tensor kind.
    #[error("tensor {tensor}: dtype {dtype:?} is not a {expected} type")]
    Kind {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: DType,
        /// `"float"` or `"integer"`.
        expected: &'static str,
    },
    /// The shape does not match the store entry.
    #[error("tensor {tensor}: asked for shape {asked:?}, the store holds {stored:?}")]
    Shape {
        /// The tensor.
        tensor: String,
        /// The requested shape.
        asked: Vec<usize>,
        /// The stored shape.
        stored: Vec<usize>,
    },
    /// An empty tensor has no pages to import.
    #[error("tensor {tensor}: an empty tensor has no pages to import")]
    Empty {
        /// The tensor.
        tensor: String,
    },
    /// A tensor's rows cannot be split into binding-sized blocks as asked.
    #[error(
        "tensor {tensor}: cannot split its {rows} rows of {row_bytes} bytes into blocks of \
         {block} rows: {reason}"
    )]
    Blocks {
        /// The tensor.
        tensor: String,
        /// Its rows (first dimension).
        rows: usize,
        /// Bytes per row.
        row_bytes: u64,
        /// The rows per block asked for.
        block: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// CubeCL refused to register the imported buffer.
    #[error("tensor {tensor}: CubeCL refused the imported buffer: {reason}")]
    Register {
        /// The tensor.
        tensor: String,
        /// CubeCL's error, rendered.
        reason: String,
    },
    /// The store lookup failed.
    #[error(transparent)]
    Store(#[from] Box<StoreError>),
}

impl AdoptError {
    /// Whether loading the tensor resident (copied into device memory) is a sensible fallback:
    /// true for refusals of the import itself, false for errors a copy would hit too.
    pub fn resident_fallback(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. }
                | Self::Refused { .. }
                | Self::Misaligned { .. }
                | Self::TooLargeForAllocation { .. }
        )
    }
}
