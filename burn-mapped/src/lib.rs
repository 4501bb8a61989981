//! placeholder

pub mod gguf;
