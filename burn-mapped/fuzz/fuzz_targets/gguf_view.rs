//! libFuzzer entry for [`burn_mapped_fuzz::gguf_view`]: arbitrary bytes through the GGUF
//! parser into the plan of a GGUF read in place (`burn_mapped::view::plan`).
//!
//! Build and run with `burn-mapped/fuzz/run.sh gguf_view SECONDS`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burn_mapped_fuzz::gguf_view(data));
