//! GPU adoption of mapped store files: a file's read-only shared mapping becomes the storage of
//! a Burn tensor on the `wgpu` backend (Vulkan, WGSL kernels) with no copy, through
//! `VK_EXT_external_memory_host`.
//!
//! # How
//!
//! 1. [`GpuDevice::open`] creates the wgpu device itself on a Vulkan adapter with
//!    `VK_EXT_external_memory_host` enabled (when offered), probes one import, and hands the
//!    device to CubeCL (`try_init_device`), so Burn runs on it like any wgpu device.
//! 2. [`GpuDevice::adopt_float`] / [`adopt_int`](GpuDevice::adopt_int) import a
//!    [`MappedFile`](burn_mapped::MappedFile)'s whole page-padded mapping
//!    (`VkImportMemoryHostPointerInfoEXT`), bind it to a storage buffer, and wrap that with
//!    wgpu-hal's externally owned buffer constructor and `create_buffer_from_hal`.
//! 3. The buffer is registered with CubeCL's memory management as an *external* allocation
//!    (the patch in `patches/`): a read-only handle (`can_mut()` is always false, so no
//!    operation writes it in place), never served to other allocations, released only after
//!    its last handle is gone and wgpu has retired the work that used it. The release destroys
//!    the buffer, frees the imported memory and drops the mapping.
//! 4. The handle becomes a `CubeTensor` and, with Fusion, an initialized tensor of the fused
//!    stream: matmul, the q8 GEMV and everything else read the file pages in place, ordered on
//!    Burn's own stream.
//! 5. [`GpuDevice::load_module`] does this for every parameter of a module by path (a Burn
//!    module mapper), so a model built lazily on the device runs on its adopted store.
//!
//! # Limits
//!
//! - A tensor larger than `max_storage_buffer_binding_size` (128 MiB on lavapipe) cannot be
//!   bound by any kernel, adopted or resident: [`AdoptError::TooLargeForBinding`].
//! - A mapping larger than `maxMemoryAllocationSize`, or whose base or length is not a multiple
//!   of `minImportedHostPointerAlignment`, is refused ([`AdoptError::TooLargeForAllocation`],
//!   [`AdoptError::Misaligned`]); [`GpuDevice::load_float`] then copies it resident.
//! - Drivers may offer the extension and refuse every import (NVIDIA's Vulkan driver answers
//!   `VK_ERROR_OUT_OF_DEVICE_MEMORY`): the open-time probe reports it
//!   ([`GpuDevice::host_import`]) and the `load_*` functions fall back to resident with a log
//!   line.
//! - Only the WGSL compiler path: the SPIR-V path binds buffers by device address, which the
//!   patched registration refuses.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(rustdoc::broken_intra_doc_links)]

mod blocks;
mod device;
mod error;
mod module;
mod primitive;
mod vulkan;

pub use device::{Backing, GpuDevice, Import, Placed};
pub use error::{AdoptError, DeviceError, Unavailable};
pub use module::ModuleReport;
