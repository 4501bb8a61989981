//! Vulkan capability probe: can a Vulkan device read the store's mapped pages in place?
//!
//! For every physical device: its type (integrated GPUs share DRAM with the host), its memory
//! heaps, whether it advertises `VK_EXT_external_memory_host`, and, if it does, whether an
//! import of the actual read-only mapping of each file succeeds (`vkAllocateMemory` with
//! `VkImportMemoryHostPointerInfoEXT`), plus an import of anonymous memory of the same size to
//! tell "refuses file mappings" from "refuses every import". Advertising the extension proves
//! nothing: the import is tried. `libvulkan` is loaded at run time; without it the report says
//! so.

use std::ffi::c_void;
use std::path::PathBuf;

use ash::vk;
use serde::{Deserialize, Serialize};

use super::{ProbeError, map_files};

/// What one physical device offers and what it accepted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VulkanDevice {
    pub name: String,
    /// `INTEGRATED_GPU`, `DISCRETE_GPU`, `CPU`, ...
    pub device_type: String,
    pub vendor_id: u32,
    pub device_id: u32,
    pub driver_version: u32,
    pub api_version: String,
    /// `(size in bytes, DEVICE_LOCAL)` per memory heap.
    pub heaps: Vec<(u64, bool)>,
    /// Some memory type is both `DEVICE_LOCAL` and `HOST_VISIBLE` on a heap of at least half the
    /// largest device-local heap: the device reads host-visible memory at its own rate.
    pub unified_memory: bool,
    pub external_memory_host: bool,
    pub min_imported_host_pointer_alignment: Option<u64>,
    /// Imports of the files' mappings that succeeded, of those tried.
    pub mapping_imports_ok: usize,
    pub mapping_imports_tried: usize,
    /// The first failure importing a mapping (the Vulkan result and the step).
    pub mapping_import_error: Option<String>,
    /// The same-size import of anonymous memory: `ok` or the error.
    pub anonymous_import: Option<String>,
    /// Why the import test did not run (no extension, device creation failed, ...).
    pub import_not_tried: Option<String>,
}

/// The Vulkan capability report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VulkanReport {
    /// Why nothing could be asked (no loader, no instance), if so.
    pub unavailable: Option<String>,
    pub devices: Vec<VulkanDevice>,
}

impl VulkanReport {
    /// One line per device for humans.
    pub fn summary(&self) -> String {
        if let Some(reason) = &self.unavailable {
            return format!("vulkan: {reason}");
        }
        self.devices
            .iter()
            .map(|d| {
                let import = match (&d.import_not_tried, &d.mapping_import_error) {
                    (Some(why), _) => format!("import not tried: {why}"),
                    (None, None) => format!(
                        "imported {}/{} mappings",
                        d.mapping_imports_ok, d.mapping_imports_tried
                    ),
                    (None, Some(e)) => format!(
                        "imported {}/{} mappings, first failure: {e}; anonymous memory: {}",
                        d.mapping_imports_ok,
                        d.mapping_imports_tried,
                        d.anonymous_import.as_deref().unwrap_or("not tried")
                    ),
                };
                format!(
                    "vulkan {} ({}, unified memory {}): VK_EXT_external_memory_host {}; {import}",
                    d.name,
                    d.device_type,
                    d.unified_memory,
                    if d.external_memory_host {
                        "advertised"
                    } else {
                        "absent"
                    },
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Whether some device imported every mapping it was given.
    pub fn any_device_imports_the_mapping(&self) -> bool {
        self.devices
            .iter()
            .any(|d| d.mapping_imports_tried > 0 && d.mapping_imports_ok == d.mapping_imports_tried)
    }
}

/// Most files whose mappings are imported per device (each import is one allocation).
pub const MAX_IMPORTS: usize = 64;

/// Asks every Vulkan device about host-pointer import of `paths`' read-only mappings.
///
/// # Errors
/// Only files that cannot be opened or mapped; every Vulkan failure is in the report.
pub fn probe_vulkan(paths: &[PathBuf]) -> Result<VulkanReport, ProbeError> {
    let files = map_files(paths)?;
    let regions: Vec<&[u8]> = files.iter().map(|f| &f.map[..]).collect();
    // SAFETY: loads the system's Vulkan loader library; nothing else is assumed about it.
    let entry = match unsafe { ash::Entry::load() } {
        Ok(entry) => entry,
        Err(e) => {
            return Ok(VulkanReport {
                unavailable: Some(format!("no Vulkan loader (libvulkan): {e}")),
                devices: Vec::new(),
            });
        }
    };
    let app = vk::ApplicationInfo::default().api_version(vk::make_api_version(0, 1, 1, 0));
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: a plain instance with no layers or extensions, destroyed below.
    let instance = match unsafe { entry.create_instance(&info, None) } {
        Ok(instance) => instance,
        Err(e) => {
            return Ok(VulkanReport {
                unavailable: Some(format!("vkCreateInstance failed: {e:?}")),
                devices: Vec::new(),
            });
        }
    };
    // SAFETY: `instance` is live.
    let devices = match unsafe { instance.enumerate_physical_devices() } {
        Ok(list) => list
            .into_iter()
            .map(|pd| describe(&instance, pd, &regions))
            .collect(),
        Err(e) => {
            // SAFETY: nothing was created from the instance.
            unsafe { instance.destroy_instance(None) };
            return Ok(VulkanReport {
                unavailable: Some(format!("vkEnumeratePhysicalDevices failed: {e:?}")),
                devices: Vec::new(),
            });
        }
    };
    // SAFETY: every device made from it was destroyed by `describe`.
    unsafe { instance.destroy_instance(None) };
    Ok(VulkanReport {
        unavailable: None,
        devices,
    })
}

fn describe(instance: &ash::Instance, pd: vk::PhysicalDevice, regions: &[&[u8]]) -> VulkanDevice {
    // SAFETY: `pd` was enumerated from the live `instance`.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    // SAFETY: as above.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    let heaps: Vec<(u64, bool)> = memory.memory_heaps[..memory.memory_heap_count as usize]
        .iter()
        .map(|h| (h.size, h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL)))
        .collect();
    let largest_local = heaps.iter().filter(|h| h.1).map(|h| h.0).max().unwrap_or(0);
    let both = vk::MemoryPropertyFlags::DEVICE_LOCAL | vk::MemoryPropertyFlags::HOST_VISIBLE;
    let unified_memory = memory.memory_types[..memory.memory_type_count as usize]
        .iter()
        .any(|t| {
            t.property_flags.contains(both)
                && heaps
                    .get(t.heap_index as usize)
                    .is_some_and(|h| h.0 >= largest_local / 2)
        });
    // SAFETY: as above.
    let extensions =
        unsafe { instance.enumerate_device_extension_properties(pd) }.unwrap_or_default();
    let external_memory_host = extensions.iter().any(|e| {
        e.extension_name_as_c_str()
            .is_ok_and(|n| n == ash::ext::external_memory_host::NAME)
    });
    let version = props.api_version;
    let mut device = VulkanDevice {
        name: props
            .device_name_as_c_str()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string_lossy().into_owned()),
        device_type: format!("{:?}", props.device_type),
        vendor_id: props.vendor_id,
        device_id: props.device_id,
        driver_version: props.driver_version,
        api_version: format!(
            "{}.{}.{}",
            vk::api_version_major(version),
            vk::api_version_minor(version),
            vk::api_version_patch(version)
        ),
        heaps,
        unified_memory,
        external_memory_host,
        min_imported_host_pointer_alignment: None,
        mapping_imports_ok: 0,
        mapping_imports_tried: 0,
        mapping_import_error: None,
        anonymous_import: None,
        import_not_tried: None,
    };
    if !external_memory_host {
        device.import_not_tried = Some("VK_EXT_external_memory_host is not advertised".into());
        return device;
    }
    let mut host_props = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut host_props);
    // SAFETY: `pd` is valid and the chained struct is of a type the extension defines.
    unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    let align = host_props.min_imported_host_pointer_alignment;
    device.min_imported_host_pointer_alignment = Some(align);
    if let Err(why) = try_imports(instance, pd, regions, align.max(1), &mut device) {
        device.import_not_tried = Some(why);
    }
    device
}

/// Creates a logical device with the extension and imports each mapping, then anonymous memory.
fn try_imports(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    regions: &[&[u8]],
    align: u64,
    report: &mut VulkanDevice,
) -> Result<(), String> {
    let priorities = [1.0f32];
    let queue = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(0)
        .queue_priorities(&priorities)];
    let names = [ash::ext::external_memory_host::NAME.as_ptr()];
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queue)
        .enabled_extension_names(&names);
    // SAFETY: queue family 0 always exists; the one extension was advertised. Destroyed below.
    let device = unsafe { instance.create_device(pd, &info, None) }
        .map_err(|e| format!("vkCreateDevice with the extension failed: {e:?}"))?;
    let ext = ash::ext::external_memory_host::Device::new(instance, &device);

    for region in regions.iter().take(MAX_IMPORTS) {
        // Imports need an aligned base and size; the mapping starts on a page boundary.
        let len = region.len() as u64 / align * align;
        if len == 0 || !(region.as_ptr() as u64).is_multiple_of(align) {
            continue;
        }
        report.mapping_imports_tried += 1;
        match import(&device, &ext, region.as_ptr().cast_mut().cast(), len) {
            Ok(()) => report.mapping_imports_ok += 1,
            Err(e) => {
                report.mapping_import_error.get_or_insert(e);
            }
        }
    }
    if report.mapping_import_error.is_some() || report.mapping_imports_tried == 0 {
        let len = regions
            .first()
            .map_or(align, |r| (r.len() as u64 / align * align).max(align));
        report.anonymous_import = Some(anonymous_import(&device, &ext, len, align));
    }
    // SAFETY: every allocation made on `device` was freed by `import`.
    unsafe { device.destroy_device(None) };
    Ok(())
}

/// Imports `len` bytes at `ptr` as device memory and frees it again.
fn import(
    device: &ash::Device,
    ext: &ash::ext::external_memory_host::Device,
    ptr: *mut c_void,
    len: u64,
) -> Result<(), String> {
    let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
    let mut pointer_props = vk::MemoryHostPointerPropertiesEXT::default();
    // SAFETY: `ptr` is a live, aligned host allocation (the caller's mapping) and the out
    // struct is properly typed.
    let rc = unsafe {
        (ext.fp().get_memory_host_pointer_properties_ext)(
            device.handle(),
            handle,
            ptr,
            &mut pointer_props,
        )
    };
    if rc != vk::Result::SUCCESS {
        return Err(format!("vkGetMemoryHostPointerPropertiesEXT: {rc:?}"));
    }
    let bits = pointer_props.memory_type_bits;
    if bits == 0 {
        return Err("no memory type accepts this host pointer".to_owned());
    }
    let mut import_info = vk::ImportMemoryHostPointerInfoEXT::default()
        .handle_type(handle)
        .host_pointer(ptr);
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(len)
        .memory_type_index(bits.trailing_zeros())
        .push_next(&mut import_info);
    // SAFETY: imports `len` bytes of live host memory that outlives the allocation, which is
    // freed right away.
    match unsafe { device.allocate_memory(&alloc, None) } {
        Ok(memory) => {
            // SAFETY: allocated just above and not in use.
            unsafe { device.free_memory(memory, None) };
            Ok(())
        }
        Err(e) => Err(format!("vkAllocateMemory(import of {len} B): {e:?}")),
    }
}

/// An import of fresh anonymous read-write memory of `len` bytes: `ok` or the error.
fn anonymous_import(
    device: &ash::Device,
    ext: &ash::ext::external_memory_host::Device,
    len: u64,
    align: u64,
) -> String {
    let Ok(size) = usize::try_from(len + align) else {
        return "too large".to_owned();
    };
    // SAFETY: an anonymous private mapping, unmapped below; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return format!("mmap failed: {}", std::io::Error::last_os_error());
    }
    let base = (raw as usize).next_multiple_of(align as usize);
    let outcome = import(device, ext, base as *mut c_void, len);
    // SAFETY: the whole range mapped above, after the import was freed.
    unsafe { libc::munmap(raw, size) };
    match outcome {
        Ok(()) => "ok".to_owned(),
        Err(e) => e,
    }
}
