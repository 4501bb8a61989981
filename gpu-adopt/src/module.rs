//! A whole Burn module loaded from a store on the GPU device, every parameter adopted where the
//! device imports host memory (or copied resident where it refuses, or when asked to).
//!
//! Burn's own loaders (`load_record`, `load_from`) turn each tensor into `TensorData` and upload
//! it, which on a CubeCL device is always a copy. This walks the module with a
//! [`ModuleMapper`] instead and hands each parameter its store tensor through
//! [`Param::transform_for_load`], which applies the parameter's own load transform (for example
//! the `Col` layout of `nn::Linear`) and never runs the lazy initializer it replaces.

use burn::module::{Module, ModuleMapper, Param, Parameter};
use burn::tensor::{Int, Tensor};
use burn_mapped::MappedStore;

use burn_mapped::Placement;

use crate::device::{GpuDevice, Placed};
use crate::error::AdoptError;

/// Where each parameter of a loaded module ended up, by module path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleReport {
    /// Parameters whose storage is their file's mapping.
    pub mapped: Vec<String>,
    /// Parameters copied into device memory, with the reason the import was refused (`None`
    /// where a resident copy was asked for).
    pub resident: Vec<(String, Option<String>)>,
    /// Parameters left as they were, as asked ([`GpuDevice::load_module_except`]).
    pub left: Vec<String>,
}

impl ModuleReport {
    /// Bytes of the parameters in each list, from the store's manifest: `(mapped, resident)`.
    pub fn bytes(&self, store: &MappedStore) -> (u64, u64) {
        let sum = |names: &mut dyn Iterator<Item = &String>| {
            names
                .filter_map(|n| store.manifest().get(n))
                .map(|e| e.len())
                .sum()
        };
        (
            sum(&mut self.mapped.iter()),
            sum(&mut self.resident.iter().map(|(n, _)| n)),
        )
    }
}

impl GpuDevice {
    /// Loads every parameter of `module` (built on this device, parameters still lazy) from
    /// `store` by module path: adopted when `adopt` is true and the device imports the file,
    /// copied resident otherwise (with the reason in the report).
    ///
    /// # Errors
    ///
    /// The first [`AdoptError`] a copy would hit too: a parameter missing from the store, or
    /// of the wrong rank, kind or size for a binding. The module is not returned then.
    pub fn load_module<M: Module>(
        &self,
        module: M,
        store: &MappedStore,
        adopt: bool,
    ) -> Result<(M, ModuleReport), AdoptError> {
        self.load_module_except(module, store, adopt, &[])
    }

    /// As [`load_module`](Self::load_module), leaving the parameters at the paths in `except`
    /// as they are (still lazy, so never allocated): for tensors the caller loads otherwise,
    /// such as a vocabulary matrix too large for one binding, loaded as row blocks with
    /// [`load_float_rows`](Self::load_float_rows).
    ///
    /// # Errors
    ///
    /// As [`load_module`](Self::load_module).
    pub fn load_module_except<M: Module>(
        &self,
        module: M,
        store: &MappedStore,
        adopt: bool,
        except: &[&str],
    ) -> Result<(M, ModuleReport), AdoptError> {
        let mut loader = Loader {
            gpu: self,
            store,
            adopt,
            except,
            path: Vec::new(),
            report: ModuleReport::default(),
            error: None,
        };
        let module = module.map(&mut loader);
        match loader.error {
            Some(e) => Err(e),
            None => Ok((module, loader.report)),
        }
    }
}

struct Loader<'a> {
    gpu: &'a GpuDevice,
    store: &'a MappedStore,
    adopt: bool,
    except: &'a [&'a str],
    path: Vec<String>,
    report: ModuleReport,
    error: Option<AdoptError>,
}

impl Loader<'_> {
    fn record(&mut self, name: String, placed: Placed) {
        if placed.placement == Placement::Map {
            self.report.mapped.push(name);
        } else {
            self.report.resident.push((name, placed.refused));
        }
    }
}

impl Loader<'_> {
    /// Hands `param` the tensor `load` makes for its path, or records the first error.
    fn place<T: Parameter>(
        &mut self,
        param: Param<T>,
        load: impl FnOnce(&GpuDevice, &MappedStore, &str, bool) -> Result<(T, Placed), AdoptError>,
    ) -> Param<T> {
        if self.error.is_some() {
            return param;
        }
        let name = self.path.join(".");
        if self.except.contains(&name.as_str()) {
            self.report.left.push(name);
            return param;
        }
        match load(self.gpu, self.store, &name, self.adopt) {
            Ok((tensor, placed)) => {
                self.record(name, placed);
                let id = param.id;
                param.transform_for_load(tensor, id)
            }
            Err(e) => {
                self.error = Some(e);
                param
            }
        }
    }
}

impl ModuleMapper for Loader<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        self.place(param, |gpu, store, name, adopt| {
            if adopt {
                gpu.load_float::<D>(store, name)
            } else {
                gpu.copy_float::<D>(store, name)
                    .map(|t| (t, Placed::RESIDENT))
            }
        })
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        self.place(param, |gpu, store, name, adopt| {
            if adopt {
                gpu.load_int::<D>(store, name)
            } else {
                gpu.copy_int::<D>(store, name)
                    .map(|t| (t, Placed::RESIDENT))
            }
        })
    }
}
