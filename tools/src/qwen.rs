//! Where a Qwen2.5 model's weights come from: a known name (fetched on first use), a GGUF file
//! (read in place, or converted once into a cached store when a store format is asked for),
//! or a store directory. Loading is `burn_mapped_models::qwen2::load`'s.

use std::path::{Path, PathBuf};

use burn_mapped::convert::WeightFormat;
use burn_mapped::convert::{ConvertOptions, Progress};
use burn_mapped::gguf::{
    GgufConvertError, GgufError, MappedGguf, SourceError, SourceRecord, SourceState, gguf_to_store,
};
use burn_mapped::q8::is_projection_weight;
use burn_mapped::{Existing, OpenOptions, StoreError, manifest::MANIFEST_FILE};

use burn_mapped_models::qwen2::hf_name;
use burn_mapped_models::qwen2::load::Weights;
use burn_mapped_models::tokenizer::{Qwen2Tokenizer, TokenizerError};

use crate::fetch::{FetchError, fetch_qwen25_coder_05b};

/// The checkpoint `generate --model qwen2.5-coder-0.5b` names.
pub const QWEN25_CODER_05B: &str = "qwen2.5-coder-0.5b";

/// Errors on the way from a model name to a loaded model.
#[derive(Debug, thiserror::Error)]
pub enum QwenError {
    /// Downloading the checkpoint failed.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The GGUF could not be read.
    #[error(transparent)]
    Gguf(Box<GgufError>),
    /// Converting the GGUF into a store failed.
    #[error(transparent)]
    Convert(Box<GgufConvertError>),
    /// The store could not be opened or applied.
    #[error(transparent)]
    Store(Box<StoreError>),
    /// The tokenizer could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// `--model` named nothing usable.
    #[error("`{0}` is neither a known model, a .gguf file, nor a store directory")]
    UnknownModel(String),
    /// A store's recorded source GGUF (needed for the tokenizer) is missing, unreadable or
    /// not recorded.
    #[error("store {}: {source}", store.display())]
    Source {
        /// The store.
        store: PathBuf,
        /// What is wrong with its source.
        source: SourceError,
    },
    /// A store's source GGUF has changed since the store was converted from it.
    #[error(
        "store {} was converted from {}, whose {what} has changed since; convert it again (or pass the GGUF as --model)",
        store.display(),
        gguf.display()
    )]
    SourceChanged {
        /// The store.
        store: PathBuf,
        /// The recorded source.
        gguf: PathBuf,
        /// What differs.
        what: &'static str,
    },
    /// The cache directory cannot hold stores.
    #[error("cache directory {}: {reason}", dir.display())]
    CacheDir {
        /// The directory.
        dir: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
}

impl From<GgufError> for QwenError {
    fn from(e: GgufError) -> Self {
        Self::Gguf(Box::new(e))
    }
}

impl From<GgufConvertError> for QwenError {
    fn from(e: GgufConvertError) -> Self {
        Self::Convert(Box::new(e))
    }
}

impl From<StoreError> for QwenError {
    fn from(e: StoreError) -> Self {
        Self::Store(Box::new(e))
    }
}

/// Conversion progress, as the converters report it.
pub type ConvertProgress<'a> = dyn FnMut(&Progress<'_>) + 'a;

/// Where a model's files are.
#[derive(Debug, Clone)]
pub struct ModelPaths {
    /// The weights: a store, or the GGUF itself, read in place.
    pub weights: WeightsPath,
    /// The GGUF the weights come from (vocabulary, chat template).
    pub gguf: PathBuf,
}

/// The weights of [`ModelPaths`], owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightsPath {
    /// A store directory.
    Store(PathBuf),
    /// A GGUF file read in place.
    Gguf(PathBuf),
}

impl ModelPaths {
    /// The weights as the loader takes them.
    pub fn weights(&self) -> Weights<'_> {
        match &self.weights {
            WeightsPath::Store(dir) => Weights::Store(dir),
            WeightsPath::Gguf(file) => Weights::Gguf(file),
        }
    }

    /// The store directory or GGUF file that holds the weights.
    pub fn weights_path(&self) -> &Path {
        match &self.weights {
            WeightsPath::Store(path) | WeightsPath::Gguf(path) => path,
        }
    }
}

/// Resolves `spec` (a known model name, a `.gguf` file, or a store directory) to the weights
/// to load. A GGUF (the known name's after fetching it) is read in place when `format` is
/// `None`; with a store format it is converted on first use into
/// `<cache>/stores/<gguf stem>-<hash of its path>-<format>`. A store directory is used as it
/// is, once its recorded source GGUF is found unchanged.
///
/// A cached store is used only while the GGUF it was converted from is the same file, or one
/// with the same bytes ([`SourceRecord::check`]): two GGUFs of one name in two folders get two
/// stores, and a GGUF replaced in place is converted again.
///
/// `progress` is called during conversion with (done bytes, total bytes, tensor).
pub fn resolve<'a>(
    spec: &str,
    format: Option<WeightFormat>,
    cache: &Path,
    progress: Option<&'a mut ConvertProgress<'a>>,
) -> Result<ModelPaths, QwenError> {
    let path = Path::new(spec);
    let gguf = if spec == QWEN25_CODER_05B {
        fetch_qwen25_coder_05b(cache, true)?
    } else if path.is_dir() && path.join(MANIFEST_FILE).is_file() {
        let manifest = burn_mapped::Manifest::read(path)?;
        let gguf = checked_source(path, &manifest)?.ok_or_else(|| QwenError::Source {
            store: path.to_path_buf(),
            source: SourceError::Unrecorded {
                key: burn_mapped::gguf::SOURCE_KEY,
                reason: "missing",
            },
        })?;
        return Ok(ModelPaths {
            weights: WeightsPath::Store(path.to_path_buf()),
            gguf,
        });
    } else if path.extension().is_some_and(|e| e == "gguf") && path.is_file() {
        path.to_path_buf()
    } else {
        return Err(QwenError::UnknownModel(spec.to_string()));
    };
    let gguf = std::fs::canonicalize(&gguf).map_err(|source| QwenError::Source {
        store: gguf.clone(),
        source: SourceError::Io {
            path: gguf.clone(),
            source,
        },
    })?;
    let Some(format) = format else {
        return Ok(ModelPaths {
            weights: WeightsPath::Gguf(gguf.clone()),
            gguf,
        });
    };
    let store = cached_store_dir(cache, &gguf, format)?;
    let current = burn_mapped::Manifest::read(&store)
        .ok()
        .is_some_and(|manifest| {
            matches!(checked_source(&store, &manifest), Ok(Some(recorded)) if recorded == gguf)
        });
    if !current {
        // The cache's own store: replacing a damaged, older or stale one is its job.
        let mut options = ConvertOptions::default()
            .format(format, is_projection_weight)
            .existing(Existing::Replace);
        if let Some(progress) = progress {
            options = options.progress(progress);
        }
        convert(&gguf, &store, options)?;
    }
    Ok(ModelPaths {
        weights: WeightsPath::Store(store),
        gguf,
    })
}

/// The cache's store for `gguf` (an absolute, resolved path) as `format`: named by the file's
/// stem for people and by a hash of its full path so that two files of one name never share
/// a store.
fn cached_store_dir(cache: &Path, gguf: &Path, format: WeightFormat) -> Result<PathBuf, QwenError> {
    use std::os::unix::ffi::OsStrExt;
    let stores = cache.join("stores");
    for dir in [cache, stores.as_path()] {
        if dir.exists() && !dir.is_dir() {
            return Err(QwenError::CacheDir {
                dir: dir.to_path_buf(),
                reason: "exists and is not a directory".into(),
            });
        }
    }
    let stem: String = gguf
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(96)
        .collect();
    let key = path_key(gguf.as_os_str().as_bytes());
    Ok(stores.join(format!("{stem}-{key:08x}-{format}")))
}

/// 32 bits of xxh3-64: enough to tell the few GGUFs of one name a cache sees apart.
fn path_key(bytes: &[u8]) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(bytes) >> 32) as u32
}

/// The GGUF a store converted from GGUF records, once checked to be the file it was converted
/// from (or one with the same bytes); `None` for a store that records no source.
fn checked_source(
    store: &Path,
    manifest: &burn_mapped::Manifest,
) -> Result<Option<PathBuf>, QwenError> {
    let metadata = manifest.metadata();
    if !metadata.contains_key(burn_mapped::gguf::SOURCE_KEY)
        && !metadata.contains_key(burn_mapped::gguf::SOURCE_HEX_KEY)
    {
        return Ok(None);
    }
    let source_err = |source| QwenError::Source {
        store: store.to_path_buf(),
        source,
    };
    let record = SourceRecord::from_metadata(metadata).map_err(source_err)?;
    match record.check().map_err(source_err)? {
        SourceState::Same => Ok(Some(record.path)),
        SourceState::Changed { what } => Err(QwenError::SourceChanged {
            store: store.to_path_buf(),
            gguf: record.path,
            what,
        }),
    }
}

/// Converts a GGUF into a store at `store` as `options` say. Qwen2 tensors take this
/// project's module paths (the Hugging Face names; `options`' own rename is replaced); other
/// architectures keep GGUF's names.
pub fn convert(
    gguf: &Path,
    store: &Path,
    options: ConvertOptions<'_>,
) -> Result<burn_mapped::Manifest, QwenError> {
    let mapped = MappedGguf::open(gguf)?;
    let options = if mapped.gguf().architecture().is_ok_and(|a| a == "qwen2") {
        options.rename(hf_name)
    } else {
        options
    };
    Ok(gguf_to_store(&mapped, store, options)?)
}

/// The tokenizer of the GGUF `paths` names (for a GGUF loaded in place, pass the header the
/// loader kept instead: `Qwen2Tokenizer::from_gguf`).
pub fn load_tokenizer(paths: &ModelPaths) -> Result<Qwen2Tokenizer, QwenError> {
    Ok(Qwen2Tokenizer::from_gguf(
        MappedGguf::open(&paths.gguf)?.into_gguf(),
    )?)
}

/// Store options with strict mode forced on by `strict`, else as `BURN_MAPPED_STRICT` says.
pub fn open_options(strict: bool) -> OpenOptions {
    let options = burn_mapped::MappedStore::options();
    if strict {
        options.strict(true)
    } else {
        options
    }
}
