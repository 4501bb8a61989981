//! The driver side: the context, the PTX read kernel and its stream, and the device, pinned and
//! registered memory the arms use, each released on drop.

use std::ffi::{CString, c_void};

use cudarc::driver::{result, sys};

use super::config::{CudaCapabilities, CudaProbeConfig};

/// The read kernel, `sum_words(data, n_words, out)`.
pub const SUM_WORDS_PTX: &str = include_str!("sum_words.ptx");

pub(super) fn driver_error(what: &str, e: result::DriverError) -> String {
    let name = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    format!("{what}: {name} ({:?})", e.0)
}

/// The CUDA context, module and stream, released on drop.
pub(super) struct Cuda {
    device: sys::CUdevice,
    module: sys::CUmodule,
    function: sys::CUfunction,
    pub(super) stream: sys::CUstream,
    /// One `u64` accumulator on the device.
    acc: sys::CUdeviceptr,
    blocks: u32,
}

pub(super) const THREADS_PER_BLOCK: u32 = 256;

impl Cuda {
    pub(super) fn open(
        config: &CudaProbeConfig,
        caps: &mut CudaCapabilities,
    ) -> Result<Cuda, String> {
        result::init().map_err(|e| driver_error("cuInit", e))?;
        let mut version = 0;
        // SAFETY: writes one int.
        if unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .is_ok()
        {
            caps.driver_version = Some(version);
        }
        let ordinal = i32::try_from(config.device).map_err(|_| "device ordinal too large")?;
        let device = result::device::get(ordinal)
            .map_err(|e| driver_error(&format!("device {ordinal}"), e))?;
        caps.name = result::device::get_name(device).ok();
        let attr = |a: sys::CUdevice_attribute| -> Option<i32> {
            // SAFETY: `device` is a valid device handle from `cuDeviceGet`.
            unsafe { result::device::get_attribute(device, a) }.ok()
        };
        use sys::CUdevice_attribute as A;
        caps.compute_capability = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .zip(attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
        caps.pci_bus_id = attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
        caps.multiprocessors = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
        let flag = |a| attr(a).map(|v| v != 0);
        caps.integrated = flag(A::CU_DEVICE_ATTRIBUTE_INTEGRATED);
        caps.pageable_memory_access = flag(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
        caps.pageable_memory_access_uses_host_page_tables =
            flag(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
        caps.host_register_supported = flag(A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
        caps.read_only_host_register_supported =
            flag(A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
        caps.can_use_host_pointer_for_registered_mem =
            flag(A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
        // SAFETY: `device` is valid; the primary context is released in `Drop`.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(|e| driver_error("retaining the primary context", e))?;
        // SAFETY: `ctx` was just retained.
        unsafe { result::ctx::set_current(ctx) }
            .map_err(|e| driver_error("making the context current", e))?;
        // SAFETY: `device` is valid.
        caps.total_memory_bytes = unsafe { result::device::total_mem(device) }
            .ok()
            .map(|b| b as u64);
        caps.free_memory_bytes = result::mem_get_info().ok().map(|(free, _)| free as u64);

        let ptx = CString::new(SUM_WORDS_PTX).map_err(|_| "the PTX holds a NUL byte")?;
        // SAFETY: `ptx` is a NUL-terminated PTX image that outlives the call.
        let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }
            .map_err(|e| driver_error("loading the PTX read kernel", e))?;
        // SAFETY: `module` was just loaded and defines `sum_words`.
        let function =
            unsafe { result::module::get_function(module, CString::new("sum_words").unwrap()) }
                .map_err(|e| driver_error("finding the read kernel", e))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error("creating a stream", e))?;
        // SAFETY: an 8-byte device allocation in the current context, freed in `Drop`.
        let acc = unsafe { result::malloc_sync(8) }
            .map_err(|e| driver_error("allocating the accumulator", e))?;
        let sms = u32::try_from(caps.multiprocessors.unwrap_or(32).max(1)).unwrap_or(32);
        Ok(Cuda {
            device,
            module,
            function,
            stream,
            acc,
            blocks: sms * 8,
        })
    }

    /// Zeroes the accumulator (in stream order).
    pub(super) fn reset(&self) -> Result<(), String> {
        // SAFETY: `acc` is an 8-byte device allocation owned by `self`.
        unsafe { result::memset_d8_async(self.acc, 0, 8, self.stream) }
            .map_err(|e| driver_error("clearing the accumulator", e))
    }

    /// Queues the kernel over `bytes` bytes (a multiple of 8) at device address `data`.
    pub(super) fn launch(&self, data: sys::CUdeviceptr, bytes: usize) -> Result<(), String> {
        let mut data = data;
        let mut words = (bytes / 8) as u64;
        let mut out = self.acc;
        let mut params: [*mut c_void; 3] = [
            (&raw mut data).cast(),
            (&raw mut words).cast(),
            (&raw mut out).cast(),
        ];
        // No more blocks than there are 16-byte pairs per thread: a small tensor gets a small
        // grid instead of a thousand idle blocks.
        let pairs = words.div_ceil(2);
        let blocks = pairs
            .div_ceil(u64::from(THREADS_PER_BLOCK))
            .clamp(1, u64::from(self.blocks)) as u32;
        // SAFETY: `function` takes (u64 data, u64 n_words, u64 out) and reads `n_words` words
        // from `data`, which the caller guarantees is readable by the device for that length
        // until the stream reaches this point; `params` point at live locals for the call.
        unsafe {
            result::launch_kernel(
                self.function,
                (blocks, 1, 1),
                (THREADS_PER_BLOCK, 1, 1),
                0,
                self.stream,
                &mut params,
            )
        }
        .map_err(|e| driver_error("launching the read kernel", e))
    }

    /// Waits for the stream and reads the accumulator.
    pub(super) fn finish(&self) -> Result<u64, String> {
        let mut out = [0u64];
        // SAFETY: `stream` belongs to this context; `acc` holds one u64.
        unsafe {
            result::stream::synchronize(self.stream)
                .map_err(|e| driver_error("running the read kernel", e))?;
            result::memcpy_dtoh_sync(&mut out, self.acc)
                .map_err(|e| driver_error("reading the accumulator", e))?;
        }
        Ok(out[0])
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: every handle was created by `open` in this context and is released once.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            let _ = result::free_sync(self.acc);
            let _ = result::stream::destroy(self.stream);
            let _ = result::module::unload(self.module);
            let _ = result::primary_ctx::release(self.device);
        }
    }
}

/// Device allocations, freed on drop.
pub(super) struct DeviceBuffers(pub(super) Vec<sys::CUdeviceptr>);

impl Drop for DeviceBuffers {
    fn drop(&mut self) {
        for &ptr in &self.0 {
            // SAFETY: allocated with `malloc_sync` and freed once.
            unsafe {
                let _ = result::free_sync(ptr);
            }
        }
    }
}

/// Pinned host buffers, freed on drop.
pub(super) struct PinnedBuffers(pub(super) Vec<(*mut u8, usize)>);

impl Drop for PinnedBuffers {
    fn drop(&mut self) {
        for &(ptr, _) in &self.0 {
            // SAFETY: allocated with `malloc_host` and freed once.
            unsafe {
                let _ = result::free_host(ptr.cast());
            }
        }
    }
}

/// Registered host ranges, unregistered on drop.
pub(super) struct Registered(pub(super) Vec<(*mut c_void, sys::CUdeviceptr)>);

impl Drop for Registered {
    fn drop(&mut self) {
        for &(ptr, _) in &self.0 {
            // SAFETY: `ptr` was registered with `cuMemHostRegister` and is unregistered once.
            unsafe {
                let _ = sys::cuMemHostUnregister(ptr).result();
            }
        }
    }
}
