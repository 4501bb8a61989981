//! The load-path benchmark harness: five ways of loading the same weights, each in a fresh
//! process, compared on start-up, memory, sharing across processes, and eviction.
//!
//! `harness run` (in `src/bin/harness.rs`, driven by [`parent`]) prepares the inputs once under
//! the cache directory, re-executes itself as a child per measurement ([`spawn`], [`child`]),
//! checks that every arm computed the same ([`identity`]), and writes a results file
//! ([`report`]), SVG figures ([`plot`]) and the generated section of `docs/PERFORMANCE.md`
//! ([`doc`], from [`markdown`], [`summary`] and [`targets`]).
//!
//! [`gemv`] is the GEMV benchmark of the q8 kernels (`src/bin/gemv.rs`).

pub mod arms;
pub mod child;
pub mod doc;
pub mod evict;
pub mod gemv;
pub mod identity;
pub mod llama;
pub mod markdown;
pub mod measure;
pub mod parent;
pub mod plot;
pub mod qwen;
pub mod report;
pub mod spawn;
pub mod stats;
pub mod summary;
pub mod synth;
pub mod sys;
pub mod targets;
