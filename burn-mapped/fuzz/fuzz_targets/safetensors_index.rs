//! libFuzzer entry for [`burn_mapped_fuzz::safetensors_index`]: arbitrary bytes into the
//! converter's sharded-checkpoint index parser.
//!
//! Build and run with `burn-mapped/fuzz/run.sh safetensors_index SECONDS`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burn_mapped_fuzz::safetensors_index(data));
