//! The five ways of loading the same weights that the harness compares.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::module::Module;
use burn::store::{ModuleRecord, ModuleSnapshot, SafetensorsStore};
use burn::tensor::{AllocationProperty, Bytes};
use burn_mapped::MappedRecorder;
use serde::{Deserialize, Serialize};

/// One loader under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arm {
    /// The burn-mapped store through `MappedRecorder::load` + `Module::load_record`.
    Mapped,
    /// Burn's default: the burnpack file through `Module::load_file`.
    LoadFile,
    /// Hugging Face safetensors through burn-store's `SafetensorsStore`.
    Safetensors,
    /// Copy control: the store's files read into anonymous memory, same record route as
    /// `Mapped` (`MappedRecorder::load_copied`).
    Copy,
    /// The best stock Burn does today: the burnpack file mapped shared and read through
    /// `ModuleRecord::from_bytes(Bytes::from_shared(..))`.
    PackMapped,
}

impl Arm {
    /// Every arm, in the order of the first round.
    pub const ALL: [Arm; 5] = [
        Arm::Mapped,
        Arm::LoadFile,
        Arm::Safetensors,
        Arm::Copy,
        Arm::PackMapped,
    ];

    /// Short name used in JSON and file names.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Mapped => "mapped",
            Arm::LoadFile => "load_file",
            Arm::Safetensors => "safetensors",
            Arm::Copy => "copy",
            Arm::PackMapped => "pack_mapped",
        }
    }

    /// What the arm does, for tables.
    pub fn label(self) -> &'static str {
        match self {
            Arm::Mapped => "mapped store (`MappedRecorder` + `load_record`)",
            Arm::LoadFile => "burnpack `Module::load_file` (Burn default)",
            Arm::Safetensors => "safetensors `SafetensorsStore`",
            Arm::Copy => "copy control (store files read into memory)",
            Arm::PackMapped => "burnpack mapped, `ModuleRecord::from_bytes` (stock best)",
        }
    }

    /// Parses [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Arm> {
        Arm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Arms in the order of round `round`: rotated by one each round, so every arm takes
    /// every position and none always follows the same neighbour's cache state.
    pub fn order(round: usize) -> Vec<Arm> {
        let n = Arm::ALL.len();
        (0..n).map(|i| Arm::ALL[(i + round) % n]).collect()
    }

    /// The files the arm reads.
    pub fn input(self, files: &ArmFiles) -> &Path {
        match self {
            Arm::Mapped | Arm::Copy => &files.store,
            Arm::LoadFile | Arm::PackMapped => &files.burnpack,
            Arm::Safetensors => &files.safetensors,
        }
    }

    /// Whether the arm keeps the weights as file-backed pages rather than owned copies.
    pub fn is_mapped(self) -> bool {
        matches!(self, Arm::Mapped | Arm::PackMapped)
    }
}

/// The same weights in the three formats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArmFiles {
    /// burn-mapped store directory.
    pub store: PathBuf,
    /// Burnpack file (`Module::save_file`).
    pub burnpack: PathBuf,
    /// Safetensors file (burn-store).
    pub safetensors: PathBuf,
}

/// Loads `files` into `fresh` (a lazily initialized module) the way `arm` does.
pub fn load<M: Module>(arm: Arm, fresh: M, files: &ArmFiles) -> Result<M> {
    Ok(match arm {
        Arm::Mapped => {
            let record = MappedRecorder::default()
                .load(&files.store)
                .with_context(|| format!("mapping {}", files.store.display()))?;
            fresh.try_load_record(record)?
        }
        Arm::Copy => {
            let record = MappedRecorder::default()
                .load_copied(&files.store)
                .with_context(|| format!("reading {}", files.store.display()))?;
            fresh.try_load_record(record)?
        }
        Arm::LoadFile => fresh
            .try_load_file(&files.burnpack)
            .with_context(|| format!("loading {}", files.burnpack.display()))?,
        Arm::Safetensors => {
            let mut model = fresh;
            model
                .load_from(&mut SafetensorsStore::from_file(&files.safetensors))
                .with_context(|| format!("loading {}", files.safetensors.display()))?;
            model
        }
        Arm::PackMapped => {
            let file = std::fs::File::open(&files.burnpack)
                .with_context(|| format!("opening {}", files.burnpack.display()))?;
            // SAFETY: the benchmark's cache files are written once and never modified while a
            // child maps them (the hazard memmap2 names: the file changing under the map).
            let map = unsafe { memmap2::Mmap::map(&file) }
                .with_context(|| format!("mapping {}", files.burnpack.display()))?;
            let bytes = Bytes::from_shared(bytes::Bytes::from_owner(map), AllocationProperty::File);
            fresh.try_load_record(ModuleRecord::from_bytes(bytes)?)?
        }
    })
}

/// Writes `module` (already loaded, e.g. adopted from a store) as the burnpack and
/// safetensors inputs, each through a sibling temporary file renamed into place.
pub fn write_formats<M: Module + Clone>(module: &M, files: &ArmFiles) -> Result<()> {
    if !files.burnpack.is_file() {
        let tmp = files.burnpack.with_extension("bpk.partial");
        module
            .clone()
            .save_file(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &files.burnpack)?;
    }
    if !files.safetensors.is_file() {
        let tmp = files.safetensors.with_extension("safetensors.partial");
        module
            .save_into(&mut SafetensorsStore::from_file(&tmp).overwrite(true))
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &files.safetensors)?;
    }
    Ok(())
}
