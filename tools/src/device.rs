//! `--device cpu|wgpu|vulkan`: which Burn device runs a model or a probe.
//!
//! `cpu` (Flex) is always built in. `wgpu` and `vulkan` are Burn's CubeCL wgpu backend (the
//! second pinned to Vulkan) and exist only when this crate is built with the cargo feature of
//! the same name; asking for one that is not built is a clear error naming the feature.

use std::fmt;
use std::str::FromStr;

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
}

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
