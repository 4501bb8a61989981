//! What the CUDA probe takes (its configuration) and reports beside the endpoint rates (what
//! the driver says about the device, and every registration attempt).

use serde::{Deserialize, Serialize};

use crate::probe::ProbeReport;

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
