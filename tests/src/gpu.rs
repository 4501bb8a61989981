//! The GPU adapter a test runs on: the first listed one that works, or a skip.
//!
//! CI installs Mesa's lavapipe and sets `BURN_MAPPED_REQUIRE_GPU=1`, so a missing or broken
//! adapter fails there instead of passing as a skip.

use burn::tensor::{Device, DeviceType, Tensor};

/// Whether `BURN_MAPPED_REQUIRE_GPU=1`: then no adapter is a failure, not a skip.
pub fn gpu_required() -> bool {
    std::env::var("BURN_MAPPED_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The first of `candidates` if it runs a small op (a listed adapter may not open), named
/// `api` in messages; `None` (skip) when none does and a GPU is not required.
///
/// # Panics
///
/// When none works and [`gpu_required`].
pub fn first_working(candidates: Vec<Device>, api: &str) -> Option<Device> {
    let found = std::panic::catch_unwind(|| {
        let device = candidates.first().cloned()?;
        let probe = Tensor::<1>::from_floats([1.0, 2.0], &device) * 2.0;
        let back = probe.into_data().try_to_vec::<f32>().ok()?;
        (back == [2.0, 4.0]).then_some(device)
    })
    .ok()
    .flatten();
    if found.is_none() {
        assert!(
            !gpu_required(),
            "BURN_MAPPED_REQUIRE_GPU=1 but no working {api} adapter"
        );
        eprintln!("no {api} adapter: skipping (set BURN_MAPPED_REQUIRE_GPU=1 to fail)");
    }
    found
}

/// The first working wgpu adapter (see [`first_working`]).
pub fn wgpu_device() -> Option<Device> {
    first_working(Device::enumerate(DeviceType::Wgpu).into_vec(), "wgpu")
}
