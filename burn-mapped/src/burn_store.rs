//! [`ModuleStore`] for [`MappedStore`], so `module.load_from(&mut store)` adopts a store
//! through burn-store's own applier, and `module.save_into(&mut writer)` writes one.

use std::collections::BTreeMap;

use burn::store::burn_pack::Tensor as PackTensor;
use burn::store::{ApplyError, ApplyResult, ModuleSnapshot, ModuleStore};

use crate::error::StoreError;
use crate::store::MappedStore;

impl ModuleStore for MappedStore {
    type Error = StoreError;

    /// A mapped store is read-only: write a store with [`crate::MappedRecorder::record`].
    fn collect_from<M: ModuleSnapshot>(&mut self, _module: &M) -> Result<(), Self::Error> {
        Err(StoreError::ReadOnly {
            tensor: format!("<store {}>", self.dir().display()),
        })
    }

    fn apply_to<M: ModuleSnapshot>(&mut self, module: &mut M) -> Result<ApplyResult, Self::Error> {
        let dir = self.dir().to_path_buf();
        crate::device::prepare(&dir, self.manifest(), &module.devices())?;
        let tensors: Vec<PackTensor> = self.pack_tensors().values().cloned().collect();
        let result = module.apply(tensors, None, None, false);
        if let Some(error) = result.errors.first() {
            return Err(match error {
                ApplyError::ShapeMismatch {
                    path,
                    expected,
                    found,
                } => StoreError::ShapeMismatch {
                    tensor: path.clone(),
                    dir,
                    expected: expected.to_vec(),
                    found: found.to_vec(),
                },
                ApplyError::DTypeMismatch {
                    path,
                    expected,
                    found,
                } => StoreError::DTypeMismatch {
                    tensor: path.clone(),
                    dir,
                    expected: format!("{expected:?}"),
                    found: format!("{found:?}"),
                },
                other => StoreError::Record(other.to_string()),
            });
        }
        if !result.missing.is_empty() {
            return Err(StoreError::Unmatched {
                dir,
                what: "module parameters missing from the store",
                tensors: result.missing.iter().map(|(p, _)| p.clone()).collect(),
            });
        }
        if !result.unused.is_empty() {
            return Err(StoreError::Unmatched {
                dir,
                what: "stored tensors no module parameter uses",
                tensors: result.unused.clone(),
            });
        }
        Ok(result)
    }

    fn get_tensor(&mut self, name: &str) -> Result<Option<&PackTensor>, Self::Error> {
        Ok(self.pack_tensors().get(name))
    }

    fn get_all_tensors(&mut self) -> Result<&BTreeMap<String, PackTensor>, Self::Error> {
        Ok(self.pack_tensors())
    }

    fn keys(&mut self) -> Result<Vec<String>, Self::Error> {
        Ok(self
            .manifest()
            .tensors()
            .iter()
            .map(|t| t.name().to_string())
            .collect())
    }
}
