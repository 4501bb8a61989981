//! Language models for burn-mapped.
//!
//! [`qwen2`] implements Qwen2 / Qwen2.5 with module paths equal to the Hugging Face tensor
//! names, so weights load with no key remapping:
//!
//! ```no_run
//! use burn::module::Module;
//! use burn_mapped_models::qwen2::{Qwen2Config, Sampler};
//!
//! let device = burn::tensor::Device::flex();
//! let config = Qwen2Config::from_hf_json("config.json")?;
//! let model = config.init(&device); // parameters stay uninitialized until loaded
//! # let record: burn::store::ModuleRecord = unimplemented!();
//! let model = model.load_record(record);
//! let tokens = model.generate(&[9707, 11, 1879], 16, &mut Sampler::greedy(), &[151643])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod qwen2;
pub mod tokenizer;
