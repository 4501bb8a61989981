//! libFuzzer entry for [`burn_mapped_fuzz::safetensors_header`]: arbitrary bytes into the
//! safetensors header check the converter runs on every shard.
//!
//! Build and run with `burn-mapped/fuzz/run.sh safetensors_header SECONDS`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burn_mapped_fuzz::safetensors_header(data));
