//! Qwen2.5 from a mapped store: where the store comes from (a known name, a GGUF file, or a
//! store directory), converting once, and loading with every weight adopted.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::{Param, ParamId};
use burn::nn::Linear;
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_mapped::gguf::{
    GgufConvert, GgufConvertError, GgufError, GgufFile, MappedGguf, SourceError, SourceRecord,
    SourceState, gguf_to_store,
};
use burn_mapped::q8::{is_projection_weight, scale_name};
use burn_mapped::{
    Existing, MANIFEST_FILE, MappedStore, OpenOptions, Placement, Stager, StoreError, is_flex,
    max_binding,
};

use burn_mapped_models::qwen2::{
    ConfigError, Projection, Qwen2Config, Qwen2ForCausalLM, VocabBlocks, VocabBlocksError,
    config_from_manifest, hf_name,
};
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
    /// The configuration is missing or invalid.
    #[error("model configuration: {0}")]
    Config(#[from] ConfigError),
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
    /// The vocabulary's row blocks do not fit the model.
    #[error("vocabulary row blocks: {0}")]
    VocabBlocks(#[from] VocabBlocksError),
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

/// Conversion progress: (bytes written, total bytes, tensor name).
pub type ConvertProgress<'a> = dyn FnMut(u64, u64, &str) + 'a;

/// Where a model's files are.
#[derive(Debug, Clone)]
pub struct ModelPaths {
    /// The mapped store.
    pub store: PathBuf,
    /// The GGUF the store was converted from (vocabulary, chat template).
    pub gguf: PathBuf,
}

/// What a converted store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreDType {
    /// Every tensor in one float type (f32, f16 or bf16).
    Float(DType),
    /// The projections and LM head as q8 matrices
    /// ([`is_projection_weight`]), everything else
    /// (embedding, norms, biases) f32.
    Q8,
    /// The projections and LM head keep the GGUF's quantized blocks byte for byte
    /// ([`burn_mapped::blocks`]), everything else f32 (the embedding is a row lookup: its
    /// dequantized rows are exact in f32). Runs on the CPU.
    Blocks,
}

impl StoreDType {
    /// The name used on the command line and in store directory names (`f32`, `q8`).
    pub fn tag(self) -> &'static str {
        match self {
            Self::Float(dtype) => burn_mapped::dtype_name(dtype).unwrap_or("f32"),
            Self::Q8 => "q8",
            Self::Blocks => "blocks",
        }
    }

    /// The float type of the tensors that are not quantized.
    pub fn float(self) -> DType {
        match self {
            Self::Float(dtype) => dtype,
            Self::Q8 | Self::Blocks => DType::F32,
        }
    }
}

impl From<DType> for StoreDType {
    fn from(dtype: DType) -> Self {
        Self::Float(dtype)
    }
}

impl From<burn_mapped::convert::CastTo> for StoreDType {
    fn from(cast: burn_mapped::convert::CastTo) -> Self {
        Self::Float(cast.dtype())
    }
}

impl std::fmt::Display for StoreDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.tag())
    }
}

/// A name that is not one of `blocks`, `f32`, `f16`, `bf16`, `q8`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported store dtype `{0}` (blocks, f32, f16, bf16, q8)")]
pub struct ParseStoreDTypeError(pub String);

impl std::str::FromStr for StoreDType {
    type Err = ParseStoreDTypeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "q8" => Ok(Self::Q8),
            "blocks" => Ok(Self::Blocks),
            other => other
                .parse::<burn_mapped::convert::CastTo>()
                .map(|c| Self::Float(c.dtype()))
                .map_err(|_| ParseStoreDTypeError(s.to_string())),
        }
    }
}

/// Resolves `spec` to a store, fetching and converting on first use into
/// `<cache>/stores/<gguf stem>-<hash of its path>-<dtype>` (a store directory given as `spec`
/// is used as it is, once its recorded source GGUF is found unchanged).
///
/// A cached store is used only while the GGUF it was converted from is the same file, or one
/// with the same bytes ([`SourceRecord::check`]): two GGUFs of one name in two folders get two
/// stores, and a GGUF replaced in place is converted again.
///
/// `progress` is called during conversion with (done bytes, total bytes, tensor).
pub fn resolve<'a>(
    spec: &str,
    dtype: impl Into<StoreDType>,
    cache: &Path,
    progress: Option<&'a mut ConvertProgress<'a>>,
) -> Result<ModelPaths, QwenError> {
    let dtype = dtype.into();
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
            store: path.to_path_buf(),
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
    let store = cached_store_dir(cache, &gguf, dtype)?;
    let current = burn_mapped::Manifest::read(&store)
        .ok()
        .is_some_and(|manifest| {
            matches!(checked_source(&store, &manifest), Ok(Some(recorded)) if recorded == gguf)
        });
    if !current {
        // The cache's own store: replacing a damaged, older or stale one is its job.
        convert(&gguf, &store, dtype, Existing::Replace, progress)?;
    }
    Ok(ModelPaths { store, gguf })
}

/// The cache's store for `gguf` (an absolute, resolved path) as `dtype`: named by the file's
/// stem for people and by a hash of its full path so that two files of one name never share
/// a store.
fn cached_store_dir(cache: &Path, gguf: &Path, dtype: StoreDType) -> Result<PathBuf, QwenError> {
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
    Ok(stores.join(format!("{stem}-{key:08x}-{}", dtype.tag())))
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

/// Converts a GGUF into a store at `store`. Qwen2 tensors take this project's module paths
/// (the Hugging Face names); other architectures keep GGUF's names. With
/// [`StoreDType::Q8`] the matrices [`is_projection_weight`] picks are requantized to q8; with
/// [`StoreDType::Blocks`] they keep their GGUF blocks (those of a type without a block product
/// are dequantized to f32).
pub fn convert<'a>(
    gguf: &Path,
    store: &Path,
    dtype: impl Into<StoreDType>,
    existing: Existing,
    progress: Option<&'a mut ConvertProgress<'a>>,
) -> Result<burn_mapped::Manifest, QwenError> {
    let dtype = dtype.into();
    let mapped = MappedGguf::open(gguf)?;
    let is_qwen2 = mapped.gguf().architecture().is_ok_and(|a| a == "qwen2");
    let rename = |name: &str| {
        if is_qwen2 {
            hf_name(name)
        } else {
            Some(name.to_string())
        }
    };
    let q8_rule: &dyn Fn(&str, &[usize]) -> bool = &is_projection_weight;
    Ok(gguf_to_store(
        &mapped,
        store,
        GgufConvert {
            rename: &rename,
            dtype: dtype.float(),
            q8: (dtype == StoreDType::Q8).then_some(q8_rule),
            blocks: (dtype == StoreDType::Blocks).then_some(q8_rule),
            progress,
            existing,
        },
    )?)
}

/// The model configuration recorded in a store converted from GGUF.
pub fn config_from_store(store: &MappedStore) -> Result<Qwen2Config, QwenError> {
    if store.manifest().get("model.embed_tokens.weight").is_none() {
        return Err(StoreError::TensorNotFound {
            tensor: "model.embed_tokens.weight".into(),
            dir: store.dir().to_path_buf(),
        }
        .into());
    }
    Ok(config_from_manifest(store.manifest())?)
}

/// Builds the tokenizer from a GGUF's embedded vocabulary. Takes the file so that the token
/// and merge strings move into the tokenizer rather than being copied.
pub fn tokenizer_from_gguf(mut gguf: GgufFile) -> Result<Qwen2Tokenizer, QwenError> {
    let tokens = gguf.take_str_array("tokenizer.ggml.tokens")?;
    let merges = gguf.take_str_array("tokenizer.ggml.merges")?;
    let types = gguf.get_i32_array("tokenizer.ggml.token_type")?.to_vec();
    let eos = gguf.get_u32("tokenizer.ggml.eos_token_id")?;
    let bos = gguf.get_u32("tokenizer.ggml.bos_token_id").ok();
    let add_bos = gguf
        .get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(false);
    Ok(Qwen2Tokenizer::from_vocab(
        tokens, merges, types, eos, bos, add_bos,
    )?)
}

/// A loaded model with its tokenizer and how long loading took.
pub struct LoadedQwen {
    /// The model, its weights adopted from the store.
    pub model: Qwen2ForCausalLM,
    /// The open store (keeps the mappings alive and can verify them).
    pub store: MappedStore,
    /// Time from opening the store to a model ready to run.
    pub model_ready: Duration,
}

/// Opens the store and loads the model with every weight adopted (no copy on Flex); each
/// projection is float or q8 as the store holds it. `strict` forces strict mode; without it
/// the mode is `BURN_MAPPED_STRICT`'s.
pub fn load(paths: &ModelPaths, device: &Device, strict: bool) -> Result<LoadedQwen, QwenError> {
    let start = Instant::now();
    let mut store = open_options(strict).open(&paths.store)?;
    let config = config_from_store(&store)?;
    let model = config.try_init_for_store(device, store.manifest())?;
    let model = load_weights(model, &mut store, device)?;
    Ok(LoadedQwen {
        model,
        store,
        model_ready: start.elapsed(),
    })
}

/// Opens the GGUF recorded for a store and builds its tokenizer.
///
/// Parsing the GGUF allocates a string per token and merge, all freed once the tokenizer is
/// built; those pages are then handed back to the system (`malloc_trim` on glibc) rather than
/// staying in the process's anonymous memory for the rest of the run.
pub fn load_tokenizer(paths: &ModelPaths) -> Result<Qwen2Tokenizer, QwenError> {
    let tokenizer = tokenizer_from_gguf(MappedGguf::open(&paths.gguf)?.into_gguf())?;
    release_free_heap();
    Ok(tokenizer)
}

/// Returns the heap's free pages to the system. glibc keeps freed small blocks resident
/// unless they border the top of the heap; `malloc_trim` releases every whole free page.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_heap() {
    // SAFETY: malloc_trim takes no pointers and only releases memory malloc holds as free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Returns the heap's free pages to the system: nothing to do where the allocator is not
/// glibc's, which is the one known to keep them.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_heap() {}

/// A model loaded with a given placement.
pub struct PlacedQwen {
    /// The model and its store.
    pub loaded: LoadedQwen,
    /// How the weights were placed.
    pub placement: Placement,
    /// For `PerUseCopy`: the stager every projection copies through (its counters say how many
    /// bytes were copied).
    pub stager: Option<Stager>,
}

/// A placement the device cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum PlacementUnsupported {
    /// Only Flex adopts host pages.
    #[error(
        "the `map` placement needs a backend that adopts host memory (cpu); Burn's backend for \
         {0} copies every weight into its own buffers at load, which is `resident`"
    )]
    MapNeedsFlex(String),
    /// Per-use copy keeps the at-rest weights in the mapping, which only Flex can hold as
    /// parameters in this loader.
    #[error(
        "the `per-use-copy` placement is implemented for cpu only: on {0} the at-rest weights \
         would have to stay in host memory beside device-resident norms and embeddings"
    )]
    PerUseCopyNeedsFlex(String),
}

/// Opens the store and loads the model with `placement`:
///
/// - `Map`: every weight adopts its mapped pages (Flex only);
/// - `Resident`: every weight is copied once into owned storage (on a GPU: the normal upload),
///   and the mapping used for the copy is released;
/// - `PerUseCopy`: the weights stay adopted at rest and every projection, the tied output head
///   included, copies its weights into fresh storage before each forward. The embedding lookup
///   reads one row per token in place.
///
/// # Errors
/// As [`load`], and placements the device cannot serve ([`PlacementUnsupported`]).
pub fn load_placed(
    paths: &ModelPaths,
    device: &Device,
    options: OpenOptions,
    placement: Placement,
) -> Result<PlacedQwen, LoadPlacedError> {
    load_placed_with(&paths.store, device, options, placement, config_from_store)
}

/// Store options with strict mode forced on by `strict`, else as `BURN_MAPPED_STRICT` says.
pub fn open_options(strict: bool) -> OpenOptions {
    let options = MappedStore::options();
    if strict {
        options.strict(true)
    } else {
        options
    }
}

/// [`load_placed`] for any store directory, with the configuration from `config` (for stores
/// not converted from GGUF).
///
/// # Errors
/// As [`load_placed`], and whatever `config` returns.
pub fn load_placed_with(
    store_dir: &Path,
    device: &Device,
    options: OpenOptions,
    placement: Placement,
    config: impl FnOnce(&MappedStore) -> Result<Qwen2Config, QwenError>,
) -> Result<PlacedQwen, LoadPlacedError> {
    let flex = is_flex(device);
    match placement {
        Placement::Map if !flex => {
            return Err(PlacementUnsupported::MapNeedsFlex(format!("{device:?}")).into());
        }
        Placement::PerUseCopy if !flex => {
            return Err(PlacementUnsupported::PerUseCopyNeedsFlex(format!("{device:?}")).into());
        }
        _ => {}
    }
    let start = Instant::now();
    // Off Flex, `from_data` uploads straight from the mapping: that is the resident copy.
    let store_placement = if flex { placement } else { Placement::Map };
    let mut store = options.placement(store_placement).open(store_dir)?;
    let config = config(&store)?;
    let model = config.try_init_for_store(device, store.manifest())?;
    let mut model = load_weights(model, &mut store, device)?;
    let stager = (placement == Placement::PerUseCopy).then(|| Stager::new(device.clone()));
    if let Some(stager) = &stager {
        stage_every_projection(&mut model, &store, stager)?;
    }
    if placement == Placement::Resident {
        // The weights are owned copies now; reopening maps the files without touching a page,
        // so the copy's source pages leave this process's resident set.
        store = options.verify(false).open(store_dir)?;
    }
    Ok(PlacedQwen {
        loaded: LoadedQwen {
            model,
            store,
            model_ready: start.elapsed(),
        },
        placement,
        stager,
    })
}

/// `model`'s weights from `store`: all of them as module parameters, or, where a vocabulary
/// matrix exceeds the largest buffer `device` binds, the others as parameters and the
/// vocabulary matrices as row blocks ([`Qwen2ForCausalLM::with_vocab_blocks`]).
fn load_weights(
    mut model: Qwen2ForCausalLM,
    store: &mut MappedStore,
    device: &Device,
) -> Result<Qwen2ForCausalLM, QwenError> {
    let Some(rows) = vocab_block_rows(store, device, &model) else {
        model.load_from(store)?;
        return Ok(model);
    };
    let names = vocab_tensors(&model);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    store.load_except(&mut model, &names)?;
    let blocks = vocab_blocks(store, device, &model, rows)?;
    Ok(model.with_vocab_blocks(blocks)?)
}

/// The store tensors of the vocabulary matrices: the embedding, and a separate LM head with
/// its q8 scales where it has them.
fn vocab_tensors(model: &Qwen2ForCausalLM) -> Vec<String> {
    let mut names = vec![EMBED_TOKENS.to_string()];
    if let Some(head) = &model.lm_head {
        names.push(LM_HEAD.to_string());
        if head.is_q8() {
            names.push(scale_name(LM_HEAD));
        }
    }
    names
}

/// Rows per block when a vocabulary matrix of the store exceeds the largest buffer `device`
/// binds ([`burn_mapped::max_binding`]; Mesa's lavapipe: 128 MiB, against the 0.5B model's
/// 545 MB f32 embedding): as many rows as the widest of them fits in one binding. `None`
/// when every one binds whole, or the device sets no limit.
fn vocab_block_rows(
    store: &MappedStore,
    device: &Device,
    model: &Qwen2ForCausalLM,
) -> Option<usize> {
    let limit = max_binding(device)?;
    let entries: Vec<_> = vocab_tensors(model)
        .iter()
        .filter_map(|name| store.manifest().get(name))
        .collect();
    if entries.iter().all(|e| e.len() <= limit) {
        return None;
    }
    let widest = entries
        .iter()
        .map(|e| e.len() / e.shape().first().copied().unwrap_or(1).max(1) as u64)
        .max()?;
    Some((limit / widest.max(1)).max(1) as usize)
}

/// The vocabulary matrices of `store` as blocks of `rows` rows on `device`, each its own
/// tensor (and, for a separate head, its own projection).
fn vocab_blocks(
    store: &MappedStore,
    device: &Device,
    model: &Qwen2ForCausalLM,
    rows: usize,
) -> Result<VocabBlocks, QwenError> {
    let vocab = model.vocab_size();
    let ranges: Vec<_> = (0..vocab)
        .step_by(rows)
        .map(|start| start..(start + rows).min(vocab))
        .collect();
    // Each block keeps the stored dtype (int8 values and f16 scales for a q8 head).
    let blocks_of = |name: &str| -> Result<Vec<TensorData>, QwenError> {
        ranges
            .iter()
            .map(|r| Ok(store.tensor_rows(name, r.clone())?))
            .collect()
    };
    let float = |data: TensorData| {
        let dtype = data.dtype();
        Tensor::<2>::from_data(data, (device, dtype))
    };
    let embed = blocks_of(EMBED_TOKENS)?.into_iter().map(float).collect();
    let head = match &model.lm_head {
        None => None,
        Some(head) if head.is_q8() => {
            let values = blocks_of(LM_HEAD)?;
            let scales = blocks_of(&scale_name(LM_HEAD))?;
            let projections = values
                .into_iter()
                .zip(scales)
                .map(|(values, scales)| {
                    let (vt, st) = (values.dtype(), scales.dtype());
                    Projection::from_q8(
                        Tensor::<2, Int>::from_data(values, (device, vt)),
                        Tensor::<1>::from_data(scales, (device, st)),
                    )
                })
                .collect();
            Some(projections)
        }
        Some(_) => Some(
            blocks_of(LM_HEAD)?
                .into_iter()
                .map(|data| Projection::from_weight(float(data)))
                .collect(),
        ),
    };
    Ok(VocabBlocks { embed, head })
}

/// Errors of [`load_placed`].
#[derive(Debug, thiserror::Error)]
pub enum LoadPlacedError {
    #[error(transparent)]
    Load(#[from] QwenError),
    #[error(transparent)]
    Unsupported(#[from] PlacementUnsupported),
}

impl From<StoreError> for LoadPlacedError {
    fn from(e: StoreError) -> Self {
        Self::Load(e.into())
    }
}

impl From<ConfigError> for LoadPlacedError {
    fn from(e: ConfigError) -> Self {
        Self::Load(e.into())
    }
}

/// Wraps every projection in [`Projection::PerUseCopy`]; a tied output head (no `lm_head` in
/// the store) gets its own per-use projection over the embedding's mapped pages.
fn stage_every_projection(
    model: &mut Qwen2ForCausalLM,
    store: &MappedStore,
    stager: &Stager,
) -> Result<(), StoreError> {
    let stage = |p: &mut Projection| *p = p.clone().per_use_copy(stager.clone());
    for layer in &mut model.model.layers {
        let attn = &mut layer.self_attn;
        let mlp = &mut layer.mlp;
        for p in [
            &mut attn.q_proj,
            &mut attn.k_proj,
            &mut attn.v_proj,
            &mut attn.o_proj,
            &mut mlp.gate_proj,
            &mut mlp.up_proj,
            &mut mlp.down_proj,
        ] {
            stage(p);
        }
    }
    match &mut model.lm_head {
        Some(head) => stage(head),
        None => {
            // `[vocab, hidden]` adopted from the mapping; `Linear` wants `[in, out]`, a view.
            let table = Tensor::<2>::from_data(
                store.tensor_data(EMBED_TOKENS)?,
                &model.model.embed_tokens.weight.lazy_device(),
            );
            let head = Linear {
                weight: Param::initialized(ParamId::new(), table.transpose()),
                bias: None,
            };
            model.lm_head = Some(Projection::Float(head).per_use_copy(stager.clone()));
        }
    }
    Ok(())
}

const EMBED_TOKENS: &str = "model.embed_tokens.weight";
const LM_HEAD: &str = "lm_head.weight";
