//! libFuzzer entry for [`burn_mapped_fuzz::burnpack`]: arbitrary bytes into the converter's
//! burnpack reader (Burn's `burn_pack::Reader` plus our flattening).
//!
//! Build and run with `burn-mapped/fuzz/run.sh burnpack SECONDS`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burn_mapped_fuzz::burnpack(data));
