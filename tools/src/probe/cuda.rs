//! The CUDA endpoint probe, on the `cudarc` driver bindings with `libcuda` loaded at run time
//! (so it builds without CUDA and reports, rather than panics, where there is no driver).
//!
//! - **map**: every file's read-only shared mapping is registered with `cuMemHostRegister`
//!   (the flags are tried, not assumed: a `PROT_READ` file mapping can only be registered with
//!   `CU_MEMHOSTREGISTER_READ_ONLY`, and some drivers refuse file-backed memory altogether) and
//!   a kernel reads it in place through its device pointer, across the bus;
//! - **resident**: one device allocation per file, filled once with `cuMemcpyHtoD` from the
//!   mapping (timed separately), then read by the kernel every pass;
//! - **per-use copy**: every pass stages every chunk of the mapping into a pinned host buffer
//!   (parallel `memcpy`), copies it to a device chunk buffer and reads it there; two slots
//!   alternate so that the host copy of one chunk overlaps the device work of the previous one.
//!
//! The kernel ([`SUM_WORDS_PTX`], hand-written PTX JIT-compiled by the driver, so no NVRTC is
//! needed) sums 64-bit words; every pass of every arm must reproduce the host's own
//! [`sum_words`] of the files. Warm-up rounds are discarded, the rate is `W` (counted once) over
//! the median pass, and the arm order rotates per round.

use std::ffi::{CString, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::Instant;

use cudarc::driver::{result, sys};
use serde::{Deserialize, Serialize};

use super::cpu::sum_words;
use super::{ArmReport, MappedFile, ProbeError, ProbeReport, map_files, mapped_residency, median};
use crate::select::ArmRate;

/// The read kernel, `sum_words(data, n_words, out)`.
pub const SUM_WORDS_PTX: &str = include_str!("sum_words.ptx");

/// How the CUDA probe runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaProbeConfig {
    /// CUDA device ordinal.
    pub device: usize,
    /// Discarded rounds, at least 1 (the first is the coexistence pass).
    pub warmup_passes: usize,
    /// Measured rounds, at least 1.
    pub passes: usize,
    /// Per-use copy staging chunk (each of two pinned host and two device buffers); a positive
    /// multiple of 16.
    pub chunk_bytes: usize,
    /// Threads for the host-side staging copy and the reference checksum.
    pub threads: usize,
    /// Device memory that must stay free beyond the resident copy and the staging buffers.
    pub device_margin_bytes: u64,
}

impl Default for CudaProbeConfig {
    fn default() -> Self {
        Self {
            device: 0,
            warmup_passes: 1,
            passes: 5,
            chunk_bytes: 64 << 20,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(16)),
            device_margin_bytes: 1 << 30,
        }
    }
}

/// One `cuMemHostRegister` attempt on the first file's mapping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationAttempt {
    /// The flags, spelled out (`READ_ONLY`, `DEVICEMAP`, `0`).
    pub flags: String,
    /// `ok`, or the driver's error.
    pub result: String,
}

/// What the driver says about the device, and what was tried.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaCapabilities {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: Option<i32>,
    pub name: Option<String>,
    pub compute_capability: Option<(i32, i32)>,
    pub pci_bus_id: Option<i32>,
    pub total_memory_bytes: Option<u64>,
    /// Free device memory before the probe allocated anything.
    pub free_memory_bytes: Option<u64>,
    pub multiprocessors: Option<i32>,
    /// An integrated GPU shares DRAM with the host.
    pub integrated: Option<bool>,
    /// Kernels may dereference ordinary pageable host memory (HMM/ATS); off means the plain
    /// mapping cannot be read by a kernel without registration.
    pub pageable_memory_access: Option<bool>,
    pub pageable_memory_access_uses_host_page_tables: Option<bool>,
    pub host_register_supported: Option<bool>,
    pub read_only_host_register_supported: Option<bool>,
    pub can_use_host_pointer_for_registered_mem: Option<bool>,
    /// Registration attempts on the first file, in order.
    pub registration: Vec<RegistrationAttempt>,
}

/// The probe's report plus the driver's capabilities; `cuda_unavailable` says why nothing ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CudaProbe {
    pub probe: ProbeReport,
    pub cuda: CudaCapabilities,
    pub cuda_unavailable: Option<String>,
}

/// Runs the CUDA probe over `paths`.
///
/// Missing `libcuda`, a driver that fails to initialise, or any CUDA failure inside an arm is
/// reported in the result (the arm or every arm unavailable, with the reason), never as a panic.
///
/// # Errors
/// Invalid configuration, files that cannot be opened or mapped, and a checksum that disagrees
/// with the host's own sum (wrong kernel or files changed).
pub fn probe_cuda(paths: &[PathBuf], config: &CudaProbeConfig) -> Result<CudaProbe, ProbeError> {
    super::check_passes(config.warmup_passes, config.passes)?;
    if config.chunk_bytes == 0 || !config.chunk_bytes.is_multiple_of(16) {
        return Err(ProbeError::Config {
            field: "chunk_bytes",
            problem: "must be a positive multiple of 16".to_owned(),
        });
    }
    let files = map_files(paths)?;
    let regions: Vec<&[u8]> = files
        .iter()
        .map(|f| &f.map[..f.map.len() / 8 * 8])
        .collect();
    let w: u64 = regions.iter().map(|r| r.len() as u64).sum();
    if w == 0 {
        return Err(ProbeError::EmptyWorkingSet { count: paths.len() });
    }
    let residency_at_start = mapped_residency(&files)?;
    let expected = host_checksum(&regions, config.threads.max(1));

    let mut report = ProbeReport {
        device: format!("cuda:{}", config.device),
        file_count: files.len(),
        working_set_bytes: w,
        threads: config.threads,
        warmup_passes: config.warmup_passes,
        passes: config.passes,
        chunk_bytes: config.chunk_bytes,
        map: unavailable_arm("not run"),
        resident: unavailable_arm("not run"),
        per_use_copy: unavailable_arm("not run"),
        resident_copy_seconds: None,
        residency_at_start,
        residency_after_one_pass_each: residency_at_start,
        residency_at_end: residency_at_start,
        resident_coexists: false,
        mem_available_bytes: None,
        checksum: expected,
    };
    let mut caps = CudaCapabilities::default();

    // SAFETY: `is_culib_present` only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        let reason = "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver";
        mark_all(&mut report, reason);
        return Ok(CudaProbe {
            probe: report,
            cuda: caps,
            cuda_unavailable: Some(reason.to_owned()),
        });
    }
    let run = catch_unwind(AssertUnwindSafe(|| {
        run_arms(&files, &regions, expected, config, &mut report, &mut caps)
    }));
    let cuda_unavailable = match run {
        Ok(Ok(())) => None,
        Ok(Err(RunError::Setup(reason))) => {
            mark_all(&mut report, &reason);
            Some(reason)
        }
        Ok(Err(RunError::Probe(e))) => return Err(e),
        Err(panic) => {
            let reason = format!("the CUDA bindings panicked: {}", panic_message(&*panic));
            mark_all(&mut report, &reason);
            Some(reason)
        }
    };
    report.residency_at_end = mapped_residency(&files)?;
    Ok(CudaProbe {
        probe: report,
        cuda: caps,
        cuda_unavailable,
    })
}

fn unavailable_arm(reason: &str) -> ArmReport {
    ArmReport {
        rate: ArmRate::unavailable(reason),
        pass_seconds: Vec::new(),
    }
}

fn mark_all(report: &mut ProbeReport, reason: &str) {
    for arm in [
        &mut report.map,
        &mut report.resident,
        &mut report.per_use_copy,
    ] {
        if !matches!(arm.rate, ArmRate::Measured { .. }) {
            *arm = unavailable_arm(reason);
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// The host's own checksum of whole 8-byte words, in `threads` threads.
fn host_checksum(regions: &[&[u8]], threads: usize) -> u64 {
    const PIECE: usize = 16 << 20;
    let pieces: Vec<&[u8]> = regions.iter().flat_map(|r| r.chunks(PIECE)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut acc = 0u64;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(piece) = pieces.get(i) else {
                            return acc;
                        };
                        acc = acc.wrapping_add(sum_words(piece));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .fold(0u64, u64::wrapping_add)
    })
}

enum RunError {
    /// CUDA could not be brought up at all.
    Setup(String),
    /// A probe failure that stops the run (checksum disagreement).
    Probe(ProbeError),
}

fn driver_error(what: &str, e: result::DriverError) -> String {
    let name = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    format!("{what}: {name} ({:?})", e.0)
}

/// The CUDA context, module and stream, released on drop.
struct Cuda {
    device: sys::CUdevice,
    module: sys::CUmodule,
    function: sys::CUfunction,
    stream: sys::CUstream,
    /// One `u64` accumulator on the device.
    acc: sys::CUdeviceptr,
    blocks: u32,
}

const THREADS_PER_BLOCK: u32 = 256;

impl Cuda {
    fn open(config: &CudaProbeConfig, caps: &mut CudaCapabilities) -> Result<Cuda, String> {
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
    fn reset(&self) -> Result<(), String> {
        // SAFETY: `acc` is an 8-byte device allocation owned by `self`.
        unsafe { result::memset_d8_async(self.acc, 0, 8, self.stream) }
            .map_err(|e| driver_error("clearing the accumulator", e))
    }

    /// Queues the kernel over `bytes` bytes (a multiple of 8) at device address `data`.
    fn launch(&self, data: sys::CUdeviceptr, bytes: usize) -> Result<(), String> {
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
    fn finish(&self) -> Result<u64, String> {
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
struct DeviceBuffers(Vec<sys::CUdeviceptr>);

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
struct PinnedBuffers(Vec<(*mut u8, usize)>);

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
struct Registered(Vec<(*mut c_void, sys::CUdeviceptr)>);

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

fn flags_name(flags: u32) -> String {
    let mut names = Vec::new();
    if flags & sys::CU_MEMHOSTREGISTER_READ_ONLY != 0 {
        names.push("READ_ONLY");
    }
    if flags & sys::CU_MEMHOSTREGISTER_DEVICEMAP != 0 {
        names.push("DEVICEMAP");
    }
    if flags & sys::CU_MEMHOSTREGISTER_PORTABLE != 0 {
        names.push("PORTABLE");
    }
    if names.is_empty() {
        "0 (default)".to_owned()
    } else {
        names.join("|")
    }
}

/// Registers `region` (a live read-only mapping) with `flags`, returning its device pointer.
fn register(region: &[u8], flags: u32) -> Result<(*mut c_void, sys::CUdeviceptr), String> {
    let ptr = region.as_ptr().cast_mut().cast::<c_void>();
    // SAFETY: `ptr..ptr+len` is a live mapping owned by the caller for longer than the
    // registration (unregistered by `Registered::drop` before the files are unmapped); the
    // device only reads it.
    unsafe { sys::cuMemHostRegister_v2(ptr, region.len(), flags) }
        .result()
        .map_err(|e| driver_error(&format!("cuMemHostRegister({})", flags_name(flags)), e))?;
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: `ptr` was just registered; writes one device pointer.
    if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr, 0) }.result() {
        // SAFETY: registered above, unregistered once here.
        unsafe {
            let _ = sys::cuMemHostUnregister(ptr).result();
        }
        return Err(driver_error("cuMemHostGetDevicePointer", e));
    }
    Ok((ptr, dptr))
}

/// Tries the registration flags on the first region, recording every attempt, and returns the
/// first flags that work (the read-only ones first: the mapping is `PROT_READ`).
fn pick_flags(region: &[u8], caps: &mut CudaCapabilities) -> Option<u32> {
    let ro = sys::CU_MEMHOSTREGISTER_READ_ONLY;
    let dm = sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    let mut working = None;
    for flags in [0, dm, ro, ro | dm] {
        let outcome = register(region, flags);
        caps.registration.push(RegistrationAttempt {
            flags: flags_name(flags),
            result: outcome
                .as_ref()
                .map_or_else(Clone::clone, |_| "ok".to_owned()),
        });
        if let Ok((ptr, _)) = outcome {
            // SAFETY: registered just now by `register`; unregistered once.
            unsafe {
                let _ = sys::cuMemHostUnregister(ptr).result();
            }
            if working.is_none() || flags & ro != 0 && working.is_some_and(|w| w & ro == 0) {
                working = Some(flags);
            }
        }
    }
    working
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Arm {
    Map,
    Resident,
    PerUseCopy,
}

fn run_arms(
    files: &[MappedFile],
    regions: &[&[u8]],
    expected: u64,
    config: &CudaProbeConfig,
    report: &mut ProbeReport,
    caps: &mut CudaCapabilities,
) -> Result<(), RunError> {
    let cuda = Cuda::open(config, caps).map_err(RunError::Setup)?;
    report.device = format!(
        "cuda:{} {} (driver {}, cc {})",
        config.device,
        caps.name.as_deref().unwrap_or("?"),
        caps.driver_version.map_or_else(
            || "?".to_owned(),
            |v| format!("{}.{}", v / 1000, v % 1000 / 10)
        ),
        caps.compute_capability
            .map_or_else(|| "?".to_owned(), |(a, b)| format!("{a}.{b}"))
    );
    let w: u64 = report.working_set_bytes;
    let chunk = config.chunk_bytes;

    // Resident first, so its one-time copy reads the plain (unregistered) mapping as a loader
    // would. It must fit beside the staging buffers and a margin.
    let mut reasons: [Option<String>; 3] = Default::default();
    let free = result::mem_get_info().map_or(0, |(free, _)| free as u64);
    let need = w + 2 * chunk as u64 + config.device_margin_bytes;
    let resident = if need > free {
        reasons[Arm::Resident as usize] = Some(format!(
            "does not fit: W = {w} B plus {} B of staging and a {} B margin exceeds the {free} B \
             of free device memory",
            2 * chunk,
            config.device_margin_bytes
        ));
        DeviceBuffers(Vec::new())
    } else {
        let mut buffers = DeviceBuffers(Vec::with_capacity(regions.len()));
        let start = Instant::now();
        let mut failed = None;
        for region in regions {
            // SAFETY: a fresh device allocation of the region's size, freed by `buffers`.
            match unsafe { result::malloc_sync(region.len()) } {
                Ok(ptr) => {
                    buffers.0.push(ptr);
                    // SAFETY: `ptr` holds `region.len()` bytes; `region` is a live mapping.
                    if let Err(e) = unsafe { result::memcpy_htod_sync(ptr, region) } {
                        failed = Some(driver_error("copying to the resident buffer", e));
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(driver_error("allocating the resident copy", e));
                    break;
                }
            }
        }
        match failed {
            Some(reason) => {
                reasons[Arm::Resident as usize] = Some(reason);
                DeviceBuffers(Vec::new())
            }
            None => {
                report.resident_copy_seconds = Some(start.elapsed().as_secs_f64());
                buffers
            }
        }
    };

    // Map: registration flags are tested on the first file, then every file is registered.
    let mut registered = Registered(Vec::new());
    match pick_flags(regions[0], caps) {
        None => {
            reasons[Arm::Map as usize] = Some(format!(
                "cuMemHostRegister refused the read-only file mapping with every flag set: {}",
                caps.registration
                    .iter()
                    .map(|a| format!("{} -> {}", a.flags, a.result))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        Some(flags) => {
            for region in regions {
                match register(region, flags) {
                    Ok(r) => registered.0.push(r),
                    Err(e) => {
                        reasons[Arm::Map as usize] = Some(e);
                        registered = Registered(Vec::new());
                        break;
                    }
                }
            }
        }
    }

    // Per-use copy: two pinned staging slots and two device chunk buffers.
    let mut pinned = PinnedBuffers(Vec::new());
    let mut device_chunks = DeviceBuffers(Vec::new());
    let mut events: Vec<sys::CUevent> = Vec::new();
    for _ in 0..2 {
        // SAFETY: fresh allocations of `chunk` bytes, freed by their owners.
        let setup = unsafe {
            result::malloc_host(chunk, 0)
                .map(|p| pinned.0.push((p.cast(), chunk)))
                .and_then(|()| result::malloc_sync(chunk).map(|p| device_chunks.0.push(p)))
                .and_then(|()| {
                    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                        .map(|e| events.push(e))
                })
        };
        if let Err(e) = setup {
            reasons[Arm::PerUseCopy as usize] =
                Some(driver_error("allocating the staging buffers", e));
            break;
        }
    }

    let arms = [Arm::Map, Arm::Resident, Arm::PerUseCopy];
    let mut seconds: [Vec<f64>; 3] = Default::default();
    for round in 0..config.warmup_passes + config.passes {
        for k in 0..arms.len() {
            let arm = arms[(round + k) % arms.len()];
            if reasons[arm as usize].is_some() {
                continue;
            }
            let start = Instant::now();
            let pass = match arm {
                Arm::Map => read_pass(&cuda, registered.0.iter().map(|r| r.1), regions),
                Arm::Resident => read_pass(&cuda, resident.0.iter().copied(), regions),
                Arm::PerUseCopy => copy_pass(
                    &cuda,
                    regions,
                    &pinned,
                    &device_chunks,
                    &events,
                    config.threads,
                ),
            };
            let elapsed = start.elapsed().as_secs_f64();
            match pass {
                Ok(sum) if sum == expected => {
                    if round >= config.warmup_passes {
                        seconds[arm as usize].push(elapsed);
                    }
                }
                Ok(sum) => {
                    return Err(RunError::Probe(ProbeError::ChecksumMismatch {
                        arm: ["map", "resident", "per-use copy"][arm as usize],
                        pass: round,
                        expected,
                        found: sum,
                    }));
                }
                Err(reason) => reasons[arm as usize] = Some(reason),
            }
        }
        if round == 0 {
            report.residency_after_one_pass_each =
                mapped_residency(files).map_err(RunError::Probe)?;
        }
    }
    for event in events {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = result::event::destroy(event);
        }
    }

    let [map_s, resident_s, copy_s] = seconds;
    let arm_report = |reason: &Option<String>, pass_seconds: Vec<f64>| match reason {
        Some(reason) => unavailable_arm(reason),
        None => ArmReport {
            rate: ArmRate::measured(w as f64 / 1e9 / median(&pass_seconds)),
            pass_seconds,
        },
    };
    report.map = arm_report(&reasons[0], map_s);
    report.resident = arm_report(&reasons[1], resident_s);
    report.per_use_copy = arm_report(&reasons[2], copy_s);
    report.resident_coexists =
        reasons[1].is_none() && report.residency_after_one_pass_each.is_full();
    drop(registered);
    drop(resident);
    Ok(())
}

/// One pass of the kernel over device-readable copies (or registrations) of every region.
fn read_pass(
    cuda: &Cuda,
    pointers: impl Iterator<Item = sys::CUdeviceptr>,
    regions: &[&[u8]],
) -> Result<u64, String> {
    cuda.reset()?;
    for (ptr, region) in pointers.zip(regions) {
        cuda.launch(ptr, region.len())?;
    }
    cuda.finish()
}

/// One pass staging every chunk through pinned memory to the device, then reading it there.
fn copy_pass(
    cuda: &Cuda,
    regions: &[&[u8]],
    pinned: &PinnedBuffers,
    device: &DeviceBuffers,
    events: &[sys::CUevent],
    threads: usize,
) -> Result<u64, String> {
    cuda.reset()?;
    let chunks = regions.iter().flat_map(|r| r.chunks(pinned.0[0].1));
    for (k, src) in chunks.enumerate() {
        let slot = k % 2;
        let (host, _) = pinned.0[slot];
        // SAFETY: the event was recorded after the last copy out of this slot (or never).
        unsafe { result::event::synchronize(events[slot]) }
            .map_err(|e| driver_error("waiting for a staging slot", e))?;
        // SAFETY: `host` is a pinned buffer of at least `src.len()` bytes that no copy in
        // flight reads (waited above), and `src` is a live mapping.
        let dst = unsafe { std::slice::from_raw_parts_mut(host, src.len()) };
        parallel_copy(dst, src, threads);
        // SAFETY: copies `src.len()` bytes from the pinned slot into the device slot, both
        // large enough; the slot is not reused before its event completes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(device.0[slot], host.cast(), src.len(), cuda.stream)
                .result()
                .map_err(|e| driver_error("staging a chunk to the device", e))?;
        }
        cuda.launch(device.0[slot], src.len())?;
        // SAFETY: records on the probe's stream after the copy and the kernel of this slot.
        unsafe { result::event::record(events[slot], cuda.stream) }
            .map_err(|e| driver_error("recording a staging event", e))?;
    }
    cuda.finish()
}

/// `dst.copy_from_slice(src)` split over `threads` threads.
fn parallel_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let piece = src
        .len()
        .div_ceil(threads.max(1))
        .next_multiple_of(4096)
        .max(4096);
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_kernel_is_the_one_the_probe_loads() {
        assert!(SUM_WORDS_PTX.contains(".visible .entry sum_words("));
        assert!(CString::new(SUM_WORDS_PTX).is_ok(), "no NUL inside the PTX");
    }

    #[test]
    fn flags_are_spelled_out() {
        assert_eq!(flags_name(0), "0 (default)");
        assert_eq!(
            flags_name(sys::CU_MEMHOSTREGISTER_READ_ONLY | sys::CU_MEMHOSTREGISTER_DEVICEMAP),
            "READ_ONLY|DEVICEMAP"
        );
    }

    #[test]
    fn parallel_copy_copies_every_byte() {
        let src: Vec<u8> = (0..100_003u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        parallel_copy(&mut dst, &src, 3);
        assert_eq!(dst, src);
    }
}
