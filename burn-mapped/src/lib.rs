#![doc = include_str!("../README.md")]
//!
//! # Crate reference
//!
//! # Store format (version 1)
//!
//! A store is a directory:
//!
//! ```text
//! store/
//!   manifest.json          format tag, version, alignment, and per tensor: name (module path),
//!                          dtype, shape, file, logical length, xxh3-64, optional param id and
//!                          quantization link
//!   00000-<name>.tensor    tensor bytes at offset 0, zero-padded to a multiple of 16 KiB
//!   00001-<name>.tensor
//!   ...
//! ```
//!
//! One file per tensor puts every tensor at offset 0, so its mapping starts on a page boundary
//! and never shares a page with another tensor on 4 KiB or 16 KiB page systems; GPU host-import
//! APIs need page-aligned bases and lengths and can take such a file whole.
//!
//! # Adoption
//!
//! Files are mapped `PROT_READ` + `MAP_SHARED` (a private mapping can turn into anonymous
//! copies). Two routes lead into a module, both without copying:
//!
//! - [`MappedRecorder::load`] returns Burn's own [`ModuleRecord`](burn::store::ModuleRecord):
//!   it reserves one address range, writes a small burnpack header into its first pages and
//!   maps each tensor file at a 16 KiB-aligned slot behind it, then hands the range to
//!   `ModuleRecord::from_bytes`, whose reader windows into it. `module.load_record(record)`
//!   adopts the windows.
//! - [`MappedStore`] implements burn-store's `ModuleStore`, so
//!   `module.load_from(&mut MappedStore::open(dir)?)` adopts each file's mapping directly,
//!   through this crate's read-only controller (which supports strict mode).
//!
//! # What each backend does with the pages
//!
//! Both routes hand the backend the mapped pages; what it does with them depends on the
//! backend alone, and [`placement_on`](placement::placement_on) names it as a [`Placement`]. The loaders that see the
//! module's device ([`MappedRecorder::load_into`], and [`MappedStore`] through `load_from`)
//! log the placement (target `burn_mapped`, level info) and refuse, with
//! [`StoreError::DeviceDType`], a stored dtype the device lacks, before reading any tensor
//! byte.
//!
//! - **Flex — `map`.** The parameter tensors *are* the page-cache pages, shared by every
//!   process that maps the store; kernels read them in place. No copy, at load or after.
//! - **NdArray — `per-use copy`** (feature `ndarray`). Parameters borrow the pages at rest
//!   (no anonymous memory at load), but every NdArray op copies a borrowed tensor into a fresh
//!   heap array before reading it, so every forward pass copies every weight it uses, and frees
//!   the copy after.
//!   Measured by `tests/ndarray.rs` (33 `Row`-layout layers, 528 MiB of f32; 2-core x86-64
//!   shared with builds, two runs): at rest anonymous memory grows by 0.02 % of the weights;
//!   each forward pass copies 528.0 MiB, all of them, one layer (16 MiB) at a time, and takes
//!   1.09–1.61 s against 0.75–1.17 s with the same weights owned by NdArray, while Flex on
//!   the mapping takes 0.18–0.23 s and copies nothing. A `Col`-layout `Linear` weight is
//!   transposed on load, an op, so NdArray copies it then (it rests in the heap), and its
//!   matmul copies the transposed array again on every use (4.6–5.5 s per pass). NdArray has
//!   no f16 or bf16.
//! - **CubeCL (wgpu, CUDA, ROCm, ...) — `resident`.** `from_data` copies the bytes once into
//!   device memory; the mapping is not read after load. This is a copy, not adoption.
//!
//! # Converting
//!
//! [`convert`] turns Hugging Face safetensors (single or sharded) and Burn burnpack files into
//! stores, streaming each tensor from a read-only mapping of the input, with an optional rename
//! hook and float cast. [`verify_dir`] re-hashes a store file by file.
//!
//! # Read-only
//!
//! Nothing writes mapped bytes: the pages are `PROT_READ`, and Burn's requests for mutable
//! access either copy first (default) or fail naming the tensor ([`readonly::StrictMode`], also set by
//! `BURN_MAPPED_STRICT=1`). See [`readonly`](crate::readonly::StrictMode) and [`MappedFile`] for what
//! happens if another program truncates or rewrites a mapped file.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod blocks;
mod burn_store;
pub mod convert;
mod dtype;
mod error;
mod fault;
mod generation;
pub mod gguf;
pub mod host;
mod image;
mod layout;
pub mod manifest;
mod map;
pub mod placement;
mod pool;
pub mod q8;
mod readahead;
pub mod readonly;
mod recorder;
mod slabs;
mod store;
pub mod untrusted;
#[cfg(feature = "wgpu")]
pub mod upload;
pub mod view;
mod writer;

pub use error::{ExpectedLen, StoreError};
pub use manifest::{Manifest, TensorEntry};
pub use map::MappedFile;
pub use placement::{Placement, Stager};
pub use recorder::MappedRecorder;
pub use store::{MappedStore, OpenOptions, verify_dir};
pub use writer::{Existing, StoreWriter, TensorSink, TensorSpec};
