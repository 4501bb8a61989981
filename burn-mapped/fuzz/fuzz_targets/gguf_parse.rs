//! libFuzzer entry for [`burn_mapped_fuzz::gguf_parse`]: arbitrary bytes into the GGUF parser
//! (`burn_mapped::gguf::GgufFile::parse`).
//!
//! Build and run with `burn-mapped/fuzz/run.sh gguf_parse SECONDS`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burn_mapped_fuzz::gguf_parse(data));
