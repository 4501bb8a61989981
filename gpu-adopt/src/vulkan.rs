//! The Vulkan side: a wgpu device opened with `VK_EXT_external_memory_host`, and imports of
//! page-aligned host ranges as storage buffers.

use std::ffi::c_void;

use ash::vk;
use burn_cubecl::cubecl::wgpu::wgpu;
use wgpu::hal;

use crate::error::{DeviceError, Unavailable};

const EXT: &std::ffi::CStr = ash::ext::external_memory_host::NAME;
const HOST: vk::ExternalMemoryHandleTypeFlags =
    vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;

/// A wgpu device on a Vulkan adapter, with the extension enabled where the driver offers it.
pub(crate) struct OpenedDevice {
    pub(crate) instance: wgpu::Instance,
    pub(crate) adapter: wgpu::Adapter,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// The importer, or why there is none.
    pub(crate) import: Result<HostImport, Unavailable>,
}

/// What importing needs from the device. `raw` is a copy of the device's dispatch table and
/// handle: valid while the wgpu device lives, which outlasts every buffer made on it.
#[derive(Clone)]
pub(crate) struct HostImport {
    pub(crate) raw: ash::Device,
    ext: ash::ext::external_memory_host::Device,
    /// `minImportedHostPointerAlignment`: base and length of an import are multiples of it.
    pub(crate) alignment: u64,
    /// `maxMemoryAllocationSize`.
    pub(crate) max_allocation: u64,
}

/// A Vulkan call that failed during an import, and its result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal {
    pub(crate) step: &'static str,
    pub(crate) result: vk::Result,
}

/// The first Vulkan adapter: a GPU if there is one, else a software one (lavapipe).
pub(crate) fn default_adapter() -> Result<(wgpu::Instance, wgpu::Adapter), DeviceError> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapters =
        burn_cubecl::cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    let adapter = adapters
        .iter()
        .find(|a| a.get_info().device_type != wgpu::DeviceType::Cpu)
        .or_else(|| adapters.first())
        .cloned()
        .ok_or(DeviceError::NoAdapter)?;
    Ok((instance, adapter))
}

/// Opens `adapter` the way CubeCL's WGSL runtime opens its own (every adapter feature but
/// mappable primary buffers, the adapter's limits), plus `VK_EXT_external_memory_host` when
/// `enable` and the driver offers it, and probes whether imports actually work.
pub(crate) fn open(
    instance: wgpu::Instance,
    adapter: wgpu::Adapter,
    enable: bool,
) -> Result<OpenedDevice, DeviceError> {
    let name = adapter.get_info().name;
    let open_err = |reason: String| DeviceError::Open {
        adapter: name.clone(),
        reason,
    };
    let features = adapter
        .features()
        .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
    let limits = adapter.limits();
    let hints = wgpu::MemoryHints::MemoryUsage;

    let (opened, advertised, alignment, max_allocation) = {
        // SAFETY: the guard only borrows the adapter's hal object for this block.
        let hal_adapter = unsafe { adapter.as_hal::<hal::api::Vulkan>() }
            .ok_or_else(|| open_err("not a Vulkan adapter".into()))?;
        let advertised = hal_adapter
            .physical_device_capabilities()
            .supports_extension(EXT);
        let (alignment, max_allocation) = properties(&hal_adapter, advertised);
        let callback = if advertised && enable {
            let add: Box<hal::vulkan::CreateDeviceCallback<'_>> = Box::new(|args| {
                if !args.extensions.contains(&EXT) {
                    args.extensions.push(EXT);
                }
            });
            Some(add)
        } else {
            None
        };
        // SAFETY: the callback only adds an extension the adapter reports, as the callback's
        // contract allows; features and limits are the adapter's own.
        let opened = unsafe { hal_adapter.open_with_callback(features, &limits, &hints, callback) }
            .map_err(|e| open_err(e.to_string()))?;
        (opened, advertised, alignment, max_allocation)
    };
    let raw = opened.device.raw_device().clone();
    let ext = ash::ext::external_memory_host::Device::new(
        opened.device.shared_instance().raw_instance(),
        &raw,
    );

    // SAFETY: `opened` was opened from this adapter with the features and limits requested here.
    let (device, queue) = unsafe {
        adapter.create_device_from_hal(
            opened,
            &wgpu::DeviceDescriptor {
                label: Some("burn-mapped-gpu"),
                required_features: features,
                required_limits: limits,
                memory_hints: hints,
                trace: wgpu::Trace::Off,
                // SAFETY: as CubeCL's own WGSL device: it may use passthrough shaders.
                experimental_features: wgpu::ExperimentalFeatures::enabled(),
            },
        )
    }
    .map_err(|e| open_err(e.to_string()))?;

    let import = if !enable {
        Err(Unavailable::Disabled)
    } else if advertised {
        let import = HostImport {
            raw,
            ext,
            alignment,
            max_allocation,
        };
        import
            .probe()
            .map(|()| import)
            .map_err(|r| Unavailable::ProbeRefused(r.result))
    } else {
        Err(Unavailable::NotAdvertised)
    };

    Ok(OpenedDevice {
        instance,
        adapter,
        device,
        queue,
        import,
    })
}

/// `minImportedHostPointerAlignment` (when the extension is offered) and
/// `maxMemoryAllocationSize`.
fn properties(adapter: &hal::vulkan::Adapter, advertised: bool) -> (u64, u64) {
    let instance = adapter.shared_instance().raw_instance();
    let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
    let mut maintenance3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut maintenance3);
    if advertised {
        props = props.push_next(&mut host);
    }
    // SAFETY: a query into structures this function owns; the host-properties structure is
    // chained only when the driver offers its extension.
    unsafe { instance.get_physical_device_properties2(adapter.raw_physical_device(), &mut props) };
    (
        host.min_imported_host_pointer_alignment,
        maintenance3.max_memory_allocation_size,
    )
}

impl HostImport {
    /// Imports one anonymous read-only page-aligned range and releases it: drivers that
    /// advertise the extension may still refuse every import.
    fn probe(&self) -> Result<(), Refusal> {
        let len = self.alignment.max(page_size()) as usize;
        // SAFETY: a fresh private anonymous mapping, unmapped below after the import is gone.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Refusal {
                step: "mmap",
                result: vk::Result::ERROR_OUT_OF_HOST_MEMORY,
            });
        }
        // SAFETY: the range stays mapped until after `release`.
        let result = unsafe { self.import(ptr.cast(), len as u64) }.map(|(buffer, memory)| {
            // SAFETY: nothing else holds the probe's buffer or memory.
            unsafe { self.release(buffer, memory) }
        });
        // SAFETY: the mapping made above, no longer imported.
        unsafe { libc::munmap(ptr, len) };
        result
    }

    /// Imports `len` bytes at `ptr` and binds them to a new storage buffer (`STORAGE_BUFFER |
    /// TRANSFER_SRC`, the Vulkan usage of wgpu's `STORAGE | COPY_SRC`).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is mapped and stays mapped until [`release`](Self::release) of the
    /// returned pair; `ptr` and `len` are multiples of [`alignment`](Self::alignment).
    pub(crate) unsafe fn import(
        &self,
        ptr: *const u8,
        len: u64,
    ) -> Result<(vk::Buffer, vk::DeviceMemory), Refusal> {
        let refusal = |step| move |result| Refusal { step, result };
        let mut host_props = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: the extension is enabled on this device and the pointer is valid (caller).
        let result = unsafe {
            (self.ext.fp().get_memory_host_pointer_properties_ext)(
                self.raw.handle(),
                HOST,
                ptr.cast::<c_void>(),
                &mut host_props,
            )
        };
        result
            .result()
            .map_err(refusal("vkGetMemoryHostPointerPropertiesEXT"))?;

        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HOST);
        let info = vk::BufferCreateInfo::default()
            .size(len)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_SRC)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        // SAFETY: a valid create info on a live device.
        let buffer =
            unsafe { self.raw.create_buffer(&info, None) }.map_err(refusal("vkCreateBuffer"))?;
        // SAFETY: `buffer` was just created on this device.
        let needs = unsafe { self.raw.get_buffer_memory_requirements(buffer) };
        let types = needs.memory_type_bits & host_props.memory_type_bits;
        if types == 0 || needs.size > len {
            // SAFETY: unbound and unused.
            unsafe { self.raw.destroy_buffer(buffer, None) };
            return Err(Refusal {
                step: if types == 0 {
                    "memory type selection"
                } else {
                    "vkGetBufferMemoryRequirements"
                },
                result: vk::Result::ERROR_INVALID_EXTERNAL_HANDLE,
            });
        }
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(HOST)
            .host_pointer(ptr.cast_mut().cast::<c_void>());
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(len)
            .memory_type_index(types.trailing_zeros())
            .push_next(&mut import);
        // SAFETY: the pointer and size satisfy the import rules (caller); the memory type is
        // one the driver listed for this pointer and this buffer.
        let memory = match unsafe { self.raw.allocate_memory(&alloc, None) } {
            Ok(memory) => memory,
            Err(result) => {
                // SAFETY: unbound and unused.
                unsafe { self.raw.destroy_buffer(buffer, None) };
                return Err(Refusal {
                    step: "vkAllocateMemory",
                    result,
                });
            }
        };
        // SAFETY: both objects are fresh; offset 0 satisfies any alignment.
        if let Err(result) = unsafe { self.raw.bind_buffer_memory(buffer, memory, 0) } {
            // SAFETY: unused.
            unsafe { self.release(buffer, memory) };
            return Err(Refusal {
                step: "vkBindBufferMemory",
                result,
            });
        }
        Ok((buffer, memory))
    }

    /// Destroys an imported buffer and frees its memory (the host range stays mapped).
    ///
    /// # Safety
    ///
    /// No pending or future GPU work uses `buffer`.
    pub(crate) unsafe fn release(&self, buffer: vk::Buffer, memory: vk::DeviceMemory) {
        // SAFETY: the caller guarantees the objects are idle; both belong to this device.
        unsafe {
            self.raw.destroy_buffer(buffer, None);
            self.raw.free_memory(memory, None);
        }
    }
}

/// The system page size.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}
