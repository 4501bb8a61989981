//! Host registration of the file mappings (`cuMemHostRegister`): which flags the driver accepts
//! for a read-only file mapping is tried, not assumed, and every attempt is recorded.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::config::{CudaCapabilities, RegistrationAttempt};
use super::driver::driver_error;

pub(super) fn flags_name(flags: u32) -> String {
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
pub(super) fn register(
    region: &[u8],
    flags: u32,
) -> Result<(*mut c_void, sys::CUdeviceptr), String> {
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
pub(super) fn pick_flags(region: &[u8], caps: &mut CudaCapabilities) -> Option<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_spelled_out() {
        assert_eq!(flags_name(0), "0 (default)");
        assert_eq!(
            flags_name(sys::CU_MEMHOSTREGISTER_READ_ONLY | sys::CU_MEMHOSTREGISTER_DEVICEMAP),
            "READ_ONLY|DEVICEMAP"
        );
    }
}
