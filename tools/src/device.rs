//! `--device cpu|wgpu|vulkan`: which Burn device runs a model or a probe.
//!
//! `cpu` (Flex) is always built in. `wgpu` and `vulkan` are Burn's CubeCL wgpu backend (the
//! second pinned to Vulkan) and exist only when this crate is built with the cargo feature of
//! the same name; asking for one that is not built is a clear error naming the feature.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use burn::tensor::Device;

/// A device the command line can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceArg {
    /// Burn's Flex backend on the host CPU; adopts mapped pages.
    Cpu,
    /// Burn's wgpu backend, graphics API chosen by wgpu.
    Wgpu,
    /// Burn's wgpu backend pinned to Vulkan.
    Vulkan,
}

/// A device name that this build cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "`--device {name}` needs burn-mapped-tools built with the cargo feature `{feature}` \
         (cargo build --release -p burn-mapped-tools --features {feature})"
    )]
    NotBuilt {
        name: &'static str,
        feature: &'static str,
    },
    #[error(
        "`--device cuda`: Burn's CUDA backend is not built here; the CUDA endpoints are measured by \
         the separate `cuda_probe` binary (cargo feature `cuda-probe`)"
    )]
    Cuda,
    #[error("unknown device `{0}`: expected cpu, wgpu or vulkan")]
    Unknown(String),
    #[error("`--device {name}` could not be initialised: {reason}")]
    Init { name: &'static str, reason: String },
}

/// Launches CubeCL's wgpu runtime gathers into one submission for [`DeviceArg::decode_device`]:
/// above a decode step's (5 a layer and 9 more for Qwen2), so that a step, which the decoder
/// flushes itself, reaches the GPU as one command buffer rather than one per 32 launches.
const DECODE_TASKS_MAX: usize = 512;

impl DeviceArg {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            DeviceArg::Cpu => "cpu",
            DeviceArg::Wgpu => "wgpu",
            DeviceArg::Vulkan => "vulkan",
        }
    }

    /// The Burn device. Only variants that [`FromStr`] accepted in this build can reach the
    /// accelerator arms; the others are compiled out.
    pub fn device(self) -> Device {
        match self {
            DeviceArg::Cpu => Device::flex(),
            #[cfg(feature = "wgpu")]
            DeviceArg::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            #[cfg(feature = "vulkan")]
            DeviceArg::Vulkan => Device::vulkan(burn::tensor::DeviceKind::DefaultDevice),
            #[allow(unreachable_patterns)]
            other => unreachable!("`{other}` is rejected by parsing in this build"),
        }
    }

    /// The Burn device for decoding: [`Self::device`], with a GPU runtime that submits
    /// [`DECODE_TASKS_MAX`] launches at a time unless `CUBECL_WGPU_MAX_TASKS` names a number.
    /// Each submission costs the GPU a gap, and the decoder submits every step itself. Beside
    /// it, how long starting the runtime took, where this call started it (not on the CPU, nor
    /// where the runtime starts at first use or was up already).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Init`] when the GPU runtime does not come up.
    pub fn decode_device(self) -> Result<(Device, Option<Duration>), DeviceError> {
        if self == DeviceArg::Cpu || std::env::var_os("CUBECL_WGPU_MAX_TASKS").is_some() {
            return Ok((self.device(), None));
        }
        self.init_gpu(DECODE_TASKS_MAX)
    }

    #[cfg(any(feature = "wgpu", feature = "vulkan"))]
    fn init_gpu(self, tasks_max: usize) -> Result<(Device, Option<Duration>), DeviceError> {
        use burn::tensor::wgpu::{WgpuBackend, WgpuInitError};
        let api = match self {
            #[cfg(feature = "vulkan")]
            DeviceArg::Vulkan => WgpuBackend::Vulkan,
            _ => WgpuBackend::Auto,
        };
        let start = std::time::Instant::now();
        match Device::wgpu_options()
            .graphics_api(api)
            .tasks_max(tasks_max)
            .init_with_setup()
        {
            Ok((device, setup)) => {
                let open = start.elapsed();
                // Weights reach this device through burn-mapped's staging ring.
                burn_mapped::upload::register(&device, setup.device, setup.queue);
                Ok((device, Some(open)))
            }
            // Up already (an earlier command in this process): it keeps its own batch.
            Err(WgpuInitError::Registration { .. }) => Ok((self.device(), None)),
            Err(e) => Err(DeviceError::Init {
                name: self.name(),
                reason: e.to_string(),
            }),
        }
    }

    #[cfg(not(any(feature = "wgpu", feature = "vulkan")))]
    fn init_gpu(self, _tasks_max: usize) -> Result<(Device, Option<Duration>), DeviceError> {
        Ok((self.device(), None))
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DeviceArg {
    type Err = DeviceError;

    fn from_str(name: &str) -> Result<Self, DeviceError> {
        match name.to_ascii_lowercase().as_str() {
            "cpu" | "flex" => Ok(DeviceArg::Cpu),
            "wgpu" if cfg!(feature = "wgpu") => Ok(DeviceArg::Wgpu),
            "wgpu" => Err(DeviceError::NotBuilt {
                name: "wgpu",
                feature: "wgpu",
            }),
            "vulkan" if cfg!(feature = "vulkan") => Ok(DeviceArg::Vulkan),
            "vulkan" => Err(DeviceError::NotBuilt {
                name: "vulkan",
                feature: "vulkan",
            }),
            "cuda" => Err(DeviceError::Cuda),
            _ => Err(DeviceError::Unknown(name.to_owned())),
        }
    }
}

/// clap value parser for `--device`.
pub fn parse_device(name: &str) -> Result<DeviceArg, DeviceError> {
    name.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "wgpu")]
    #[test]
    fn a_decode_device_comes_up_once_and_is_reused() {
        match DeviceArg::Wgpu.decode_device() {
            Ok((first, _)) => {
                let again = DeviceArg::Wgpu.decode_device();
                assert_eq!(
                    again.ok(),
                    Some((first, None)),
                    "the runtime that is up, reused, and no start timed"
                );
            }
            Err(e) => assert!(std::env::var_os("BURN_MAPPED_REQUIRE_GPU").is_none(), "{e}"),
        }
        assert_eq!(
            DeviceArg::Cpu.decode_device().ok(),
            Some((Device::flex(), None))
        );
    }

    #[test]
    fn cpu_is_always_built_and_other_names_say_what_they_need() {
        assert_eq!(parse_device("cpu"), Ok(DeviceArg::Cpu));
        assert_eq!(parse_device("CPU"), Ok(DeviceArg::Cpu));
        match parse_device("wgpu") {
            Ok(d) => assert!(cfg!(feature = "wgpu") && d == DeviceArg::Wgpu),
            Err(e) => assert!(e.to_string().contains("cargo feature `wgpu`"), "{e}"),
        }
        match parse_device("vulkan") {
            Ok(d) => assert!(cfg!(feature = "vulkan") && d == DeviceArg::Vulkan),
            Err(e) => assert!(e.to_string().contains("cargo feature `vulkan`"), "{e}"),
        }
        assert_eq!(parse_device("cuda"), Err(DeviceError::Cuda));
        assert!(
            parse_device("tpu")
                .unwrap_err()
                .to_string()
                .contains("unknown device `tpu`")
        );
    }
}
