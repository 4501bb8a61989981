//! This crate's integration tests as one test binary: each file a module, so Burn's generic code
//! is compiled and linked once for all of them rather than once per file.

#[path = "../common/mod.rs"]
mod common;

mod config;
mod forward_errors;
mod load_placement;
mod module_paths;
mod prompt_matrix_wgpu;
mod q8_model;
mod sampling;
mod tiny_qwen2_matches_transformers;
mod tokenizer;
mod tokenizer_matches_reference;
mod tokenizer_matches_tokenizers_bpe;
mod vocab_blocks;
