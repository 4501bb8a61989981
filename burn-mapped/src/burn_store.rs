//! [`ModuleStore`] for [`MappedStore`], so `module.load_from(&mut store)` adopts a store
//! through burn-store's own applier ([`MappedStore::load_except`]: all but some tensors), and
//! `module.save_into(&mut writer)` writes one.

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
        self.load_except(module, &[])
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

impl MappedStore {
    /// `module.load_from(store)` without the tensors named in `left_out`: they are neither
    /// checked nor applied, and the module's parameters at those paths stay as they were (a
    /// lazy one stays unallocated). For a caller that loads those tensors its own way, such
    /// as a vocabulary matrix in row blocks ([`tensor_rows`](Self::tensor_rows)) on a device
    /// that cannot bind it whole.
    ///
    /// On a wgpu device registered with `burn_mapped::upload` (feature `wgpu`), the tensors
    /// that go through its staging ring are loaded first and are not in the returned
    /// [`ApplyResult`], which lists what burn-store's applier did with the rest.
    ///
    /// # Errors
    ///
    /// As `load_from`: a dtype the device cannot hold, shape or dtype mismatches, module
    /// parameters missing from the store (other than `left_out`), or stored tensors no
    /// parameter takes.
    pub fn load_except<M: ModuleSnapshot>(
        &mut self,
        module: &mut M,
        left_out: &[&str],
    ) -> Result<ApplyResult, StoreError> {
        let dir = self.dir().to_path_buf();
        crate::placement::prepare(&dir, self.manifest(), &module.devices(), left_out)?;
        #[cfg(feature = "wgpu")]
        let uploaded = self.upload(module, left_out)?;
        #[cfg(not(feature = "wgpu"))]
        let uploaded: Vec<String> = Vec::new();
        let left_out: Vec<&str> = left_out
            .iter()
            .copied()
            .chain(uploaded.iter().map(String::as_str))
            .collect();
        let tensors: Vec<PackTensor> = self
            .pack_tensors()
            .iter()
            .filter(|(name, _)| !left_out.contains(&name.as_str()))
            .map(|(_, tensor)| tensor.clone())
            .collect();
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
        let missing: Vec<String> = result
            .missing
            .iter()
            .map(|(p, _)| p.clone())
            .filter(|p| !left_out.contains(&p.as_str()))
            .collect();
        if !missing.is_empty() {
            return Err(StoreError::Unmatched {
                dir,
                what: "module parameters missing from the store",
                tensors: missing,
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

    /// On a device registered with [`crate::upload::register`], the parameters of `module`
    /// (but `left_out`) uploaded through its staging ring; the paths loaded.
    #[cfg(feature = "wgpu")]
    fn upload<M: ModuleSnapshot>(
        &self,
        module: &mut M,
        left_out: &[&str],
    ) -> Result<Vec<String>, StoreError> {
        let devices = module.devices();
        let [device] = devices.as_slice() else {
            return Ok(Vec::new());
        };
        let Some(mut staging) = crate::upload::Staging::begin(device) else {
            return Ok(Vec::new());
        };
        let (loaded, done) =
            crate::upload::upload_module(self, module.clone(), left_out, &mut staging)?;
        staging.finish()?;
        *module = loaded;
        Ok(done)
    }
}
