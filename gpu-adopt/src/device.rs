//! [`GpuDevice`]: a Burn wgpu device whose tensors can be adopted from mapped store files.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;
use burn::tensor::{DType, Device, Int, Shape, Tensor};
use burn_cubecl::CubeDevice;
use burn_cubecl::cubecl::wgpu::{
    AutoCompiler, RuntimeOptions, WgpuDevice, WgpuServer, WgpuSetup, try_init_device, wgpu,
};
use burn_cubecl::tensor::CubeTensor;
use burn_mapped::{MappedFile, MappedStore, Placement, TensorEntry};
use cubecl_common::device::Device as _;
use cubecl_common::device_handle::DeviceHandle;
use cubecl_runtime::memory_management::ManagedMemoryHandle;
use cubecl_runtime::server::Handle;
use wgpu::hal;

use crate::error::{AdoptError, DeviceError, Unavailable};
use crate::primitive;
use crate::vulkan::{self, HostImport};

/// The CubeCL server type behind a device registered through `try_init_device`.
type Server = WgpuServer<AutoCompiler>;

/// A Burn device on a Vulkan adapter (Burn's `wgpu` backend, WGSL kernels) that can adopt
/// mapped store files as tensors without copying them.
///
/// [`open`](Self::open) creates the wgpu device itself, enabling `VK_EXT_external_memory_host`
/// when the driver offers it, probes one import (drivers may offer the extension and refuse
/// every import), and registers the device with CubeCL. [`adopt_float`](Self::adopt_float) and
/// [`adopt_int`](Self::adopt_int) then import a file's mapping as a Vulkan storage buffer and
/// hand it to CubeCL as ordinary, read-only storage: every Burn operation (and Fusion) runs on
/// it on Burn's own stream. [`load_float`](Self::load_float) and [`load_int`](Self::load_int)
/// fall back to a resident copy, with a log line, when the import is refused.
///
/// Cloning shares the device.
#[derive(Clone)]
pub struct GpuDevice {
    inner: Arc<Inner>,
}

struct Inner {
    cube: WgpuDevice,
    device: Device,
    adapter: wgpu::AdapterInfo,
    wgpu: wgpu::Device,
    import: Result<HostImport, Unavailable>,
    max_binding: u64,
    ledger: Arc<Ledger>,
}

/// Live imports, for identity checks and release accounting.
#[derive(Default)]
struct Ledger {
    live: Mutex<Vec<Import>>,
    released: AtomicUsize,
}

/// One live import: the file mapping and the Vulkan buffer bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// The tensor's name.
    pub tensor: String,
    /// The imported address range: the whole page-padded mapping, or a block of its rows.
    pub address: Range<usize>,
    /// The raw `VkBuffer` handle bound to the imported memory.
    pub vk_buffer: u64,
}

/// Where a [`GpuDevice::load_float`] / [`load_int`](GpuDevice::load_int) tensor lives, and
/// why, when it is not where it was asked to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// [`Placement::Map`]: the tensor's storage is the imported file mapping.
    /// [`Placement::Resident`]: it was copied into device memory.
    pub placement: Placement,
    /// Why the import did not happen (rendered), for a resident tensor that was meant to be
    /// adopted; `None` for an adopted tensor and for a resident copy that was asked for.
    pub refused: Option<String>,
}

impl Placed {
    /// Adopted: the storage is the imported mapping.
    pub(crate) const MAPPED: Placed = Placed {
        placement: Placement::Map,
        refused: None,
    };

    /// Resident as asked.
    pub(crate) const RESIDENT: Placed = Placed {
        placement: Placement::Resident,
        refused: None,
    };

    /// Resident because the import was refused, for `reason`.
    pub(crate) fn refused(reason: String) -> Placed {
        Placed {
            placement: Placement::Resident,
            refused: Some(reason),
        }
    }
}

/// The storage behind a tensor, as CubeCL resolves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backing {
    /// The raw `VkBuffer` handle.
    pub vk_buffer: u64,
    /// Offset of the tensor in the buffer, in bytes.
    pub offset: u64,
    /// Bytes bound.
    pub size: u64,
}

impl GpuDevice {
    /// Opens the first Vulkan adapter (a GPU if there is one, else a software rasterizer such as
    /// Mesa's lavapipe) and registers it with CubeCL.
    ///
    /// # Errors
    ///
    /// [`DeviceError`] when there is no adapter or the device cannot be created or registered.
    /// A device that cannot import host memory still opens; see
    /// [`host_import`](Self::host_import).
    pub fn open() -> Result<Self, DeviceError> {
        Self::open_with(true)
    }

    /// As [`open`](Self::open); with `host_import` false the extension is left off and every
    /// tensor loads resident (the copy arm of a comparison, or a test of the fallback).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_with(host_import: bool) -> Result<Self, DeviceError> {
        let (instance, adapter) = vulkan::default_adapter()?;
        Self::open_adapter(instance, adapter, host_import)
    }

    /// As [`open_with`](Self::open_with), on a given adapter of `instance`.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_adapter(
        instance: wgpu::Instance,
        adapter: wgpu::Adapter,
        host_import: bool,
    ) -> Result<Self, DeviceError> {
        let info = adapter.get_info();
        let mut opened = vulkan::open(instance, adapter, host_import)?;
        if let Err(refused @ Unavailable::ProbeRefused(_)) = &opened.import {
            // The device that tried is not trusted further: on the H200 (NVIDIA 580.159.04)
            // the first buffer CubeCL reserved after the refused probe failed too. The device
            // the resident placement gets is one that never enabled the extension.
            let refused = refused.clone();
            let (instance, adapter) = (opened.instance.clone(), opened.adapter.clone());
            drop(opened);
            opened = vulkan::open(instance, adapter, false)?;
            opened.import = Err(refused);
        }
        let max_binding = opened.device.limits().max_storage_buffer_binding_size;
        let wgpu = opened.device.clone();
        if let Some(reason) = opened
            .import
            .as_ref()
            .err()
            .filter(|r| **r != Unavailable::Disabled)
        {
            log::warn!(
                "burn-mapped-gpu: {}: host-memory import unavailable ({reason}); tensors will be \
                 loaded resident",
                info.name
            );
        }
        let setup = WgpuSetup {
            instance: opened.instance,
            adapter: opened.adapter,
            device: opened.device,
            queue: opened.queue,
            backend: wgpu::Backend::Vulkan,
        };
        let cube = try_init_device(setup, RuntimeOptions::default()).map_err(|source| {
            DeviceError::Register {
                adapter: info.name.clone(),
                source,
            }
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                device: Device::new(cube.clone()),
                cube,
                adapter: info,
                wgpu,
                import: opened.import,
                max_binding,
                ledger: Arc::default(),
            }),
        })
    }

    /// The Burn device: tensors made on it run on this adapter.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The adapter's name, as the driver reports it.
    pub fn adapter_name(&self) -> &str {
        &self.inner.adapter.name
    }

    /// `Ok` when the device imports host memory (the map arm is available), or why not.
    pub fn host_import(&self) -> Result<(), &Unavailable> {
        self.inner.import.as_ref().map(|_| ())
    }

    /// The driver's host-import granularity (`minImportedHostPointerAlignment`), when importing
    /// is available.
    pub fn import_alignment(&self) -> Option<u64> {
        self.inner.import.as_ref().ok().map(|i| i.alignment)
    }

    /// The largest tensor a kernel can bind (`max_storage_buffer_binding_size`).
    pub fn max_binding(&self) -> u64 {
        self.inner.max_binding
    }

    /// The imports whose buffers are still alive.
    pub fn live_imports(&self) -> Vec<Import> {
        self.inner.ledger.live.lock().expect("ledger lock").clone()
    }

    /// How many imported buffers have been destroyed (their memory freed and their mapping
    /// released) since the device opened.
    pub fn released_imports(&self) -> usize {
        self.inner.ledger.released.load(Ordering::Acquire)
    }

    /// Waits for queued work and gives every buffer no tensor holds any more back to the driver:
    /// after it, dropped adopted tensors are released (see
    /// [`released_imports`](Self::released_imports)).
    pub fn cleanup(&self) {
        // Drains Burn's queue (Fusion included) first, so dropped tensors have let go of their
        // handles before CubeCL looks.
        let _ = Tensor::<1>::zeros([1], &self.inner.device).into_data();
        let client = CubeDevice::Wgpu(self.inner.cube.clone()).client();
        if let Err(err) = client.memory_cleanup() {
            log::warn!("burn-mapped-gpu: memory cleanup failed: {err}");
        }
        let _ = burn_cubecl::cubecl::future::block_on(client.sync());
        let _ = self.inner.wgpu.poll(wgpu::PollType::wait_indefinitely());
    }

    /// Adopts `file` as a float tensor of `shape` and `dtype`, without copying.
    ///
    /// # Errors
    ///
    /// [`AdoptError`]: the import is unavailable or refused, the dtype is not a float type, the
    /// shape does not cover exactly the file's bytes, or the tensor exceeds a device limit.
    pub fn adopt_float<const D: usize>(
        &self,
        file: &Arc<MappedFile>,
        shape: [usize; D],
        dtype: DType,
    ) -> Result<Tensor<D>, AdoptError> {
        kind(file.tensor(), dtype, true)?;
        let tensor = self.cube_tensor(file, 0..file.bytes().len(), Shape::new(shape), dtype)?;
        Ok(Tensor::from_primitive::<burn_cubecl::Cube>(
            primitive::float(tensor),
        ))
    }

    /// Adopts `file` as an integer tensor of `shape` and `dtype`, without copying.
    ///
    /// # Errors
    ///
    /// As [`adopt_float`](Self::adopt_float), with an integer dtype.
    pub fn adopt_int<const D: usize>(
        &self,
        file: &Arc<MappedFile>,
        shape: [usize; D],
        dtype: DType,
    ) -> Result<Tensor<D, Int>, AdoptError> {
        kind(file.tensor(), dtype, false)?;
        let tensor = self.cube_tensor(file, 0..file.bytes().len(), Shape::new(shape), dtype)?;
        Ok(Tensor::from_primitive::<burn_cubecl::Cube>(primitive::int(
            tensor,
        )))
    }

    /// Tensor `name` of `store` as a float tensor: adopted when the device imports it, else
    /// copied into device memory with a log line saying why.
    ///
    /// # Errors
    ///
    /// [`AdoptError`] for errors a copy would hit too (unknown tensor, wrong rank or kind, a
    /// tensor larger than a binding).
    pub fn load_float<const D: usize>(
        &self,
        store: &MappedStore,
        name: &str,
    ) -> Result<(Tensor<D>, Placed), AdoptError> {
        let (file, shape, dtype) = lookup::<D>(store, name)?;
        match self.adopt_float(file, shape, dtype) {
            Ok(t) => Ok((t, Placed::MAPPED)),
            Err(e) if e.resident_fallback() => {
                let reason = self.fallback_reason(&e);
                Ok((self.copy_float(store, name)?, Placed::refused(reason)))
            }
            Err(e) => Err(e),
        }
    }

    /// As [`load_float`](Self::load_float), for an integer tensor.
    ///
    /// # Errors
    ///
    /// As [`load_float`](Self::load_float).
    pub fn load_int<const D: usize>(
        &self,
        store: &MappedStore,
        name: &str,
    ) -> Result<(Tensor<D, Int>, Placed), AdoptError> {
        let (file, shape, dtype) = lookup::<D>(store, name)?;
        match self.adopt_int(file, shape, dtype) {
            Ok(t) => Ok((t, Placed::MAPPED)),
            Err(e) if e.resident_fallback() => {
                let reason = self.fallback_reason(&e);
                Ok((self.copy_int(store, name)?, Placed::refused(reason)))
            }
            Err(e) => Err(e),
        }
    }

    /// Tensor `name` of `store` copied into device memory (the resident placement, asked
    /// for rather than fallen back to).
    ///
    /// # Errors
    ///
    /// As [`load_float`](Self::load_float).
    pub fn copy_float<const D: usize>(
        &self,
        store: &MappedStore,
        name: &str,
    ) -> Result<Tensor<D>, AdoptError> {
        let (file, _, dtype) = lookup::<D>(store, name)?;
        kind(name, dtype, true)?;
        self.check_binding(name, file.bytes().len() as u64)?;
        let data = store.tensor_data(name).map_err(Box::new)?;
        Ok(Tensor::from_data(data, (&self.inner.device, dtype)))
    }

    /// As [`copy_float`](Self::copy_float), for an integer tensor.
    ///
    /// # Errors
    ///
    /// As [`load_float`](Self::load_float).
    pub fn copy_int<const D: usize>(
        &self,
        store: &MappedStore,
        name: &str,
    ) -> Result<Tensor<D, Int>, AdoptError> {
        let (file, _, dtype) = lookup::<D>(store, name)?;
        kind(name, dtype, false)?;
        self.check_binding(name, file.bytes().len() as u64)?;
        let data = store.tensor_data(name).map_err(Box::new)?;
        Ok(Tensor::from_data(data, (&self.inner.device, dtype)))
    }

    /// A tensor no kernel can bind is an error for a copy as much as for an adoption.
    pub(crate) fn check_binding(&self, name: &str, bytes: u64) -> Result<(), AdoptError> {
        if bytes > self.inner.max_binding {
            return Err(AdoptError::TooLargeForBinding {
                tensor: name.to_string(),
                bytes,
                limit: self.inner.max_binding,
            });
        }
        Ok(())
    }

    pub(crate) fn fallback_reason(&self, err: &AdoptError) -> String {
        let reason = err.to_string();
        log::warn!("burn-mapped-gpu: {reason}; loading it resident (copied into device memory)");
        reason
    }

    /// The buffer CubeCL resolves a float tensor to. Waits for queued work on the tensor.
    ///
    /// # Errors
    ///
    /// A rendered error when the tensor is not a CubeCL tensor of this runtime.
    pub fn backing<const D: usize>(&self, tensor: &Tensor<D>) -> Result<Backing, String> {
        let dtype = tensor.dtype();
        let primitive = tensor
            .clone()
            .try_into_primitive::<burn_cubecl::Cube>()
            .map_err(|e| format!("{e:?}"))?;
        backing(primitive::resolve(primitive, dtype))
    }

    /// As [`backing`](Self::backing), for an integer tensor.
    ///
    /// # Errors
    ///
    /// As [`backing`](Self::backing).
    pub fn backing_int<const D: usize>(&self, tensor: &Tensor<D, Int>) -> Result<Backing, String> {
        let dtype = tensor.dtype();
        let primitive = tensor
            .clone()
            .try_into_primitive::<burn_cubecl::Cube>()
            .map_err(|e| format!("{e:?}"))?;
        backing(primitive::resolve(primitive, dtype))
    }

    /// Imports bytes `data` of `file` (all of them, or a block of rows), registers the buffer
    /// with CubeCL and wraps it as a contiguous tensor.
    pub(crate) fn cube_tensor(
        &self,
        file: &Arc<MappedFile>,
        data: Range<usize>,
        shape: Shape,
        dtype: DType,
    ) -> Result<CubeTensor, AdoptError> {
        let name = file.tensor();
        let bytes = data.len() as u64;
        let expected = shape.num_elements() as u64 * dtype.size() as u64;
        if expected != bytes {
            return Err(AdoptError::Shape {
                tensor: name.to_string(),
                asked: shape.to_vec(),
                stored: vec![bytes as usize / dtype.size().max(1)],
            });
        }
        if bytes == 0 {
            return Err(AdoptError::Empty {
                tensor: name.to_string(),
            });
        }
        self.check_binding(name, bytes)?;
        let buffer = self.import(file, data)?;
        let memory = ManagedMemoryHandle::new().read_only();
        let stream = cubecl_environment::stream::StreamId::current();
        let registered = memory.clone();
        DeviceHandle::<Server>::new(self.inner.cube.to_id())
            .submit_blocking(move |server| {
                server.register_external(registered, buffer, bytes, stream)
            })
            .map_err(|e| format!("{e:?}"))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|reason| AdoptError::Register {
                tensor: name.to_string(),
                reason,
            })?;
        let client = CubeDevice::Wgpu(self.inner.cube.clone()).client();
        let handle = Handle::from_memory(memory, client.service_id(), stream, bytes);
        Ok(CubeTensor::new_contiguous(
            client,
            CubeDevice::Wgpu(self.inner.cube.clone()),
            shape,
            handle,
            dtype,
        ))
    }

    /// Imports the part of `file`'s mapping that holds bytes `data` as a wgpu buffer that owns
    /// the import: dropping the buffer (wgpu does so once no submitted work uses it) destroys
    /// the Vulkan buffer, frees the imported memory and releases its hold on the mapping. A
    /// part that ends where the tensor ends runs on to the end of the page-padded mapping.
    fn import(
        &self,
        file: &Arc<MappedFile>,
        data: Range<usize>,
    ) -> Result<wgpu::Buffer, AdoptError> {
        let name = file.tensor();
        let import = self
            .inner
            .import
            .as_ref()
            .map_err(|reason| AdoptError::Unavailable {
                tensor: name.to_string(),
                adapter: self.inner.adapter.name.clone(),
                reason: reason.clone(),
            })?;
        let mapping = file.address_range();
        let end = if data.end == file.bytes().len() {
            mapping.end
        } else {
            mapping.start + data.end
        };
        let range = mapping.start + data.start..end;
        let len = range.len() as u64;
        if !(range.start as u64).is_multiple_of(import.alignment)
            || !len.is_multiple_of(import.alignment)
        {
            return Err(AdoptError::Misaligned {
                tensor: name.to_string(),
                address: range.start,
                len: range.len(),
                alignment: import.alignment,
            });
        }
        if len > import.max_allocation {
            return Err(AdoptError::TooLargeForAllocation {
                tensor: name.to_string(),
                len,
                limit: import.max_allocation,
            });
        }
        // SAFETY: the range lies in `file`'s mapping, aligned as checked above; the release
        // callback below owns a reference to `file`, so the mapping outlives the imported memory.
        let (buffer, memory) =
            unsafe { import.import(range.start as *const u8, len) }.map_err(|r| {
                AdoptError::Refused {
                    tensor: name.to_string(),
                    step: r.step,
                    result: r.result,
                }
            })?;
        let record = Import {
            tensor: name.to_string(),
            address: range,
            vk_buffer: vk::Handle::as_raw(buffer),
        };
        self.inner
            .ledger
            .live
            .lock()
            .expect("ledger lock")
            .push(record.clone());
        let owner = Arc::clone(file);
        let ledger = Arc::clone(&self.inner.ledger);
        let release = import.clone();
        let on_drop: hal::DropCallback = Box::new(move || {
            // SAFETY: wgpu-hal runs this when wgpu destroys the buffer, after the work that used
            // it completed; nothing else holds these objects.
            unsafe { release.release(buffer, memory) };
            drop(owner);
            let mut live = ledger.live.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|i| i != &record);
            ledger.released.fetch_add(1, Ordering::AcqRel);
        });
        // SAFETY: `buffer` is bound to memory that `on_drop` frees, after which it destroys the
        // buffer; wgpu never maps it (no MAP usage below).
        let hal_buffer = unsafe { hal::vulkan::Buffer::from_raw_externally_owned(buffer, on_drop) };
        // SAFETY: the buffer was created on this device with the Vulkan usage wgpu derives from
        // `STORAGE | COPY_SRC`, and is `len` bytes long.
        Ok(unsafe {
            self.inner.wgpu.create_buffer_from_hal::<hal::api::Vulkan>(
                hal_buffer,
                &wgpu::BufferDescriptor {
                    label: Some(name),
                    size: len,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                },
            )
        })
    }
}

/// The Vulkan buffer CubeCL resolves `cube` to.
fn backing(cube: CubeTensor) -> Result<Backing, String> {
    let resource = cube
        .client
        .get_resource::<Server>(cube.handle.clone())
        .map_err(|e| e.to_string())?;
    let resource = resource.resource();
    // SAFETY: only reads the raw handle of a buffer the resource keeps alive.
    let raw = unsafe { resource.buffer.as_hal::<hal::api::Vulkan>() }
        // SAFETY: the handle is only compared, never destroyed.
        .map(|b| unsafe { b.raw_handle() })
        .ok_or("not a Vulkan buffer")?;
    Ok(Backing {
        vk_buffer: vk::Handle::as_raw(raw),
        offset: resource.offset,
        size: resource.size,
    })
}

/// The manifest entry of tensor `name`.
pub(crate) fn entry<'a>(store: &'a MappedStore, name: &str) -> Result<&'a TensorEntry, AdoptError> {
    store.manifest().get(name).ok_or_else(|| {
        AdoptError::from(Box::new(burn_mapped::StoreError::TensorNotFound {
            tensor: name.to_string(),
            dir: store.dir().to_path_buf(),
        }))
    })
}

/// The file, shape and dtype of tensor `name`, checking the rank.
pub(crate) fn lookup<'a, const D: usize>(
    store: &'a MappedStore,
    name: &str,
) -> Result<(&'a Arc<MappedFile>, [usize; D], DType), AdoptError> {
    let file = store.mapped(name).map_err(Box::new)?;
    let entry = entry(store, name)?;
    let stored = entry.shape().to_vec();
    let shape: [usize; D] = stored.clone().try_into().map_err(|_| AdoptError::Shape {
        tensor: name.to_string(),
        asked: vec![0; D],
        stored,
    })?;
    Ok((file, shape, entry.dtype()))
}

pub(crate) fn kind(tensor: &str, dtype: DType, float: bool) -> Result<(), AdoptError> {
    let ok = if float {
        dtype.is_float()
    } else {
        dtype.is_int() || dtype.is_uint()
    };
    if ok {
        Ok(())
    } else {
        Err(AdoptError::Kind {
            tensor: tensor.to_string(),
            dtype,
            expected: if float { "float" } else { "integer" },
        })
    }
}
