//! The integration tests that need no process of their own, as one test binary: each file a
//! module, so Burn's generic code is compiled and linked once for all of them rather than once
//! per file. Tests that measure the process's memory, install process-wide state or end the
//! process stay in files of their own beside this directory.

#[path = "../common/mod.rs"]
mod common;
#[path = "../q8_common/mod.rs"]
mod q8_common;

mod adoption;
mod blocks;
mod convert;
mod errors;
mod gguf_dequant;
mod gguf_parse;
mod gguf_real;
mod placement;
mod q8_convert;
mod q8_cpu;
mod readonly;
