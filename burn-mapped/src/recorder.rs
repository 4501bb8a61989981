//! [`MappedRecorder`]: writes a store from any Burn module, and loads one back as a
//! [`ModuleRecord`] whose tensors are the store's mapped pages.

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::store::ModuleRecord;
use burn::tensor::{Bool, Int, Tensor, TensorData};

use crate::error::StoreError;
use crate::image;
use crate::manifest::Manifest;
use crate::placement::{Placement, shared_owned_copy};
use crate::writer::{StoreWriter, TensorSpec};

/// Records modules to stores and loads stores as records.
///
/// ```no_run
/// # use burn_mapped::MappedRecorder;
/// # fn demo<M: burn::module::Module>(module: M, dir: &std::path::Path) -> Result<M, burn_mapped::StoreError> {
/// MappedRecorder::default().record(&module, dir)?;
/// let record = MappedRecorder::default().load(dir)?;
/// Ok(module.load_record(record))
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MappedRecorder {
    placement: Placement,
}

impl MappedRecorder {
    /// A recorder whose [`load`](Self::load) places tensors as `placement` says: the mapped
    /// pages for `Map` and `PerUseCopy` (the module stages them per use, see
    /// [`crate::Stager`]), one owned copy of the whole record for `Resident` (the mapping is
    /// released before `load` returns). The default is `Map`.
    pub fn with_placement(placement: Placement) -> Self {
        Self { placement }
    }

    /// The placement [`load`](Self::load) uses.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Writes every parameter of `module` (in its saved form, e.g. a `Col`-layout `Linear`
    /// weight as `[out, in]`) into a new store at `dir`, atomically.
    pub fn record<M: Module>(
        &self,
        module: &M,
        dir: impl AsRef<Path>,
    ) -> Result<Manifest, StoreError> {
        let mut writer = StoreWriter::create(dir)?;
        let mut collector = Collector {
            path: Vec::new(),
            writer: &mut writer,
            error: None,
        };
        module.visit(&mut collector);
        if let Some(err) = collector.error {
            return Err(err);
        }
        writer.finish()
    }

    /// Loads the store at `dir` as a [`ModuleRecord`] without copying tensor bytes (unless the
    /// recorder was made [`with_placement`](Self::with_placement)`(Resident)`).
    ///
    /// The record's tensors are windows into one read-only image in which every tensor file is
    /// mapped shared (see the crate docs). `module.load_record(record)` then adopts the pages:
    /// on Flex the parameters' storage *is* the page cache. Burn's reader wraps the image in its
    /// own shared controller, so a write on this route copies the tensor first (never touching
    /// the file); for writes that fail loudly instead, load through [`crate::MappedStore`] in
    /// strict mode.
    pub fn load(&self, dir: impl AsRef<Path>) -> Result<ModuleRecord, StoreError> {
        let (image, _) = image::build(dir.as_ref())?;
        self.record_of(image)
    }

    /// The record over `image`, or over one owned copy of it for a copying placement.
    fn record_of(&self, image: std::sync::Arc<image::Image>) -> Result<ModuleRecord, StoreError> {
        let bytes = if self.placement().copies_at_load() {
            // One copy of header and tensors; the image (and every mapping) drops here.
            shared_owned_copy(image.as_ref().as_ref())
        } else {
            let shared = bytes::Bytes::from_owner(ImageOwner(image));
            burn::tensor::Bytes::from_shared(shared, burn::tensor::AllocationProperty::File)
        };
        ModuleRecord::from_bytes(bytes).map_err(|e| StoreError::Record(e.to_string()))
    }
}

impl MappedRecorder {
    /// The copy control: the record [`load`](Self::load) builds, with every tensor file read
    /// into one anonymous buffer instead of mapped. Same files, same record construction,
    /// owned storage, so a benchmark can tell what adoption saves from what the per-tensor
    /// layout saves. Loaders should use [`load`](Self::load).
    pub fn load_copied(&self, dir: impl AsRef<Path>) -> Result<ModuleRecord, StoreError> {
        let image = image::read_owned(dir.as_ref())?;
        // `bytes::Bytes` takes the Vec without copying; Burn's `from_bytes_vec` would copy it
        // again to raise its alignment.
        let bytes = burn::tensor::Bytes::from_shared(
            bytes::Bytes::from(image),
            burn::tensor::AllocationProperty::Native,
        );
        ModuleRecord::from_bytes(bytes).map_err(|e| StoreError::Record(e.to_string()))
    }
}

struct ImageOwner(std::sync::Arc<image::Image>);

impl AsRef<[u8]> for ImageOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().as_ref()
    }
}

struct Collector<'a> {
    path: Vec<String>,
    writer: &'a mut StoreWriter,
    error: Option<StoreError>,
}

impl Collector<'_> {
    fn add(&mut self, id: u64, data: impl FnOnce() -> TensorData) {
        if self.error.is_some() {
            return;
        }
        let name = self.path.join(".");
        let data = data();
        let spec = TensorSpec::new(name, data.dtype(), data.shape().to_vec()).param_id(id);
        if let Err(err) = self.writer.add(spec, data.as_bytes()) {
            self.error = Some(err);
        }
    }
}

impl ModuleVisitor for Collector<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.add(param.id.val(), || {
            param.transform_for_save().val().into_data()
        });
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.add(param.id.val(), || {
            param.transform_for_save().val().into_data()
        });
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        self.add(param.id.val(), || {
            param.transform_for_save().val().into_data()
        });
    }
}

impl MappedRecorder {
    /// Loads the store at `dir` into `module`: [`load`](Self::load) plus
    /// `module.try_load_record`, with what the bare pair cannot do because a record does not
    /// know the device. Before any tensor byte is read it checks that every stored dtype exists
    /// on the module's devices (an f16 store on NdArray is a typed
    /// [`StoreError::DeviceDType`] here, a panic inside Burn there), and it logs what the
    /// backend does with the pages ([`placement_on`](crate::placement::placement_on): `map`,
    /// `per-use copy` or `resident`).
    pub fn load_into<M: Module>(&self, module: M, dir: impl AsRef<Path>) -> Result<M, StoreError> {
        let dir = dir.as_ref();
        // One generation for both the check and the record.
        let (image, manifest) = image::build(dir)?;
        crate::placement::prepare(dir, &manifest, &module.devices(), &[])?;
        module
            .try_load_record(self.record_of(image)?)
            .map_err(|e| StoreError::Record(e.to_string()))
    }
}
