//! libFuzzer entry for [`burn_mapped_fuzz::manifest_parse`]: arbitrary bytes into the
//! store-manifest parser (`burn_mapped::Manifest::parse`).
//!
//! Build and run with `burn-mapped/fuzz/run.sh manifest_parse SECONDS`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burn_mapped_fuzz::manifest_parse(data));
