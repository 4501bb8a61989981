//! The one way to a ready Qwen2 model: from a burn-mapped store or a GGUF file read in place,
//! with a placement and a device, every weight adopted where it can be.
//!
//! [`load`] opens the weights ([`Weights`]), reads the configuration from their metadata,
//! builds the model with each projection as the weights hold it (float, q8 or GGUF blocks),
//! and applies the placement:
//!
//! - `Map`: every weight adopts its mapped pages (Flex only);
//! - `Resident`: every weight is copied once into owned storage (on a GPU: the normal upload),
//!   and the mapping used for the copy is released;
//! - `PerUseCopy`: the weights stay adopted at rest and every projection, the tied output head
//!   included, copies its weights into fresh storage before each forward (Flex only).
//!
//! Off Flex a store is opened as `Map` and `from_data` makes the device copy, which is what
//! `Resident` means there. Where a device binds buffers only up to some size, the vocabulary
//! matrices load as row blocks. A GGUF read in place keeps its token embedding as quantized
//! blocks, each looked-up row decoded when it is used ([`VocabEmbed::Quantized`]).

use std::path::Path;
use std::time::{Duration, Instant};

use burn::module::{Param, ParamId};
use burn::nn::Linear;
use burn::store::ModuleSnapshot;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::blocks::BlockWeight;
use burn_mapped::gguf::GgufFile;
use burn_mapped::q8::scale_name;
use burn_mapped::{
    MappedStore, OpenOptions, Placement, Stager, StoreError, placement::is_flex,
    placement::max_binding,
};

use super::config::{ConfigError, Qwen2Config};
use super::gguf_names::{config_from_manifest, hf_name};
use super::model::Qwen2ForCausalLM;
use super::projection::Projection;
use super::vocab::{VocabBlocks, VocabBlocksError, VocabEmbed};

/// The token embedding's tensor name.
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
/// A separate LM head's tensor name.
pub const LM_HEAD: &str = "lm_head.weight";

/// Where a model's weights are.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// A burn-mapped store directory.
    Store(&'a Path),
    /// A GGUF file, read in place: nothing converted, nothing written.
    Gguf(&'a Path),
}

impl<'a> Weights<'a> {
    /// The directory or file.
    pub fn path(&self) -> &'a Path {
        match *self {
            Weights::Store(p) | Weights::Gguf(p) => p,
        }
    }
}

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The store or file could not be opened, or its tensors applied.
    #[error(transparent)]
    Store(Box<StoreError>),
    /// The configuration is missing or invalid.
    #[error("model configuration of {}: {source}", path.display())]
    Config {
        /// The store or file.
        path: std::path::PathBuf,
        /// What is wrong.
        source: ConfigError,
    },
    /// A GGUF of another architecture.
    #[error("{}: a `{found}` model; this loader reads `qwen2`", path.display())]
    Architecture {
        /// The file.
        path: std::path::PathBuf,
        /// `general.architecture`.
        found: String,
    },
    /// The vocabulary matrices do not fit the model.
    #[error("vocabulary matrices: {0}")]
    Vocab(#[from] VocabBlocksError),
    /// The device cannot serve the placement asked for.
    #[error(transparent)]
    Unsupported(#[from] PlacementUnsupported),
}

impl From<StoreError> for LoadError {
    fn from(e: StoreError) -> Self {
        Self::Store(Box::new(e))
    }
}

/// A placement or weight format the device cannot serve.
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

/// A loaded model.
pub struct Loaded {
    /// The model, its weights adopted from the store or file.
    pub model: Qwen2ForCausalLM,
    /// The open store or file view (keeps the mappings alive and can verify them).
    pub store: MappedStore,
    /// The configuration read from the weights.
    pub config: Qwen2Config,
    /// How the weights were placed.
    pub placement: Placement,
    /// For `PerUseCopy`: the stager every projection copies through (its counters say how many
    /// bytes were copied).
    pub stager: Option<Stager>,
    /// A GGUF read in place: its parsed header (vocabulary, chat template), for the tokenizer.
    pub header: Option<GgufFile>,
    /// Time from opening the weights to a model ready to run.
    pub model_ready: Duration,
}

/// Loads the Qwen2 model at `weights` onto `device` with `placement`, the configuration read
/// from the weights' metadata (a store converted from GGUF, or a GGUF).
///
/// # Errors
/// [`LoadError`]: the store or file, the configuration, the vocabulary matrices, or a
/// placement the device cannot serve.
pub fn load(
    weights: Weights<'_>,
    device: &Device,
    options: OpenOptions,
    placement: Placement,
) -> Result<Loaded, LoadError> {
    load_with(weights, device, options, placement, |store| {
        config_from_manifest(store.manifest()).map_err(|source| LoadError::Config {
            path: store.dir().to_path_buf(),
            source,
        })
    })
}

/// [`load`] with the configuration from `config` (for stores converted from safetensors,
/// whose configuration is a Hugging Face `config.json`).
///
/// # Errors
/// As [`load`], and whatever `config` returns.
pub fn load_with(
    weights: Weights<'_>,
    device: &Device,
    options: OpenOptions,
    placement: Placement,
    config: impl FnOnce(&MappedStore) -> Result<Qwen2Config, LoadError>,
) -> Result<Loaded, LoadError> {
    let flex = is_flex(device);
    let unsupported = |e: fn(String) -> PlacementUnsupported| Err(e(format!("{device:?}")).into());
    match (placement, weights) {
        (Placement::Map, _) if !flex => return unsupported(PlacementUnsupported::MapNeedsFlex),
        (Placement::PerUseCopy, _) if !flex => {
            return unsupported(PlacementUnsupported::PerUseCopyNeedsFlex);
        }
        _ => {}
    }
    let start = Instant::now();
    // Off Flex, the upload reads straight from the mapping (`from_data`, or burn-mapped's
    // staging ring on a registered wgpu device): that is the resident copy.
    let opened = options.placement(if flex { placement } else { Placement::Map });
    let (mut store, header) = open(weights, opened)?;
    let config = config(&store)?;
    // The disk runs ahead of the first use of each weight; a tied embedding is the head, read
    // whole at every token, an untied one a few rows at a time.
    let tied = store.manifest().get(LM_HEAD).is_none();
    store.read_ahead(if tied { &[] } else { &[EMBED_TOKENS] });
    let model = config
        .try_init_for_store(device, store.manifest())
        .map_err(|source| LoadError::Config {
            path: store.dir().to_path_buf(),
            source,
        })?;
    let mut model = load_weights(model, &mut store, device)?;
    // A token's row is all a lookup reads of the embedding.
    store.advise_lookups(EMBED_TOKENS)?;
    let stager = (placement == Placement::PerUseCopy).then(|| Stager::new(device.clone()));
    if let Some(stager) = &stager {
        stage_every_projection(&mut model, &store, stager)?;
    }
    // The staging ring the GPU upload kept between the model's loads is no longer needed.
    #[cfg(feature = "wgpu")]
    burn_mapped::upload::release_staging(device);
    if placement == Placement::Resident {
        // The weights are owned copies now; reopening maps the files without touching a page,
        // so the copy's source pages leave this process's resident set.
        store = open(weights, options.verify(false))?.0;
    }
    Ok(Loaded {
        model,
        store,
        config,
        placement,
        stager,
        header,
        model_ready: start.elapsed(),
    })
}

/// Opens the store, or the GGUF in place with Qwen2's tensor names (its header kept).
fn open(
    weights: Weights<'_>,
    options: OpenOptions,
) -> Result<(MappedStore, Option<GgufFile>), LoadError> {
    match weights {
        Weights::Store(dir) => Ok((options.open(dir)?, None)),
        Weights::Gguf(path) => {
            let (store, header) = options.open_gguf_with_header(path, &hf_name)?;
            match header.architecture() {
                Ok("qwen2") => Ok((store, Some(header))),
                found => Err(LoadError::Architecture {
                    path: path.to_path_buf(),
                    found: found.unwrap_or("(none)").to_string(),
                }),
            }
        }
    }
}

/// `model`'s weights from `store`: all of them as module parameters; or, where the embedding
/// holds GGUF blocks, the others as parameters and the embedding as blocks; or, where a
/// vocabulary matrix exceeds the largest buffer `device` binds, the others as parameters and
/// the vocabulary matrices as row blocks ([`Qwen2ForCausalLM::with_vocab_blocks`]).
fn load_weights(
    mut model: Qwen2ForCausalLM,
    store: &mut MappedStore,
    device: &Device,
) -> Result<Qwen2ForCausalLM, LoadError> {
    if store
        .manifest()
        .get(EMBED_TOKENS)
        .is_some_and(|e| e.blocks().is_some())
    {
        let head_rows = block_head_rows(store, device, &model);
        let left_out: &[&str] = match head_rows {
            Some(_) => &[EMBED_TOKENS, LM_HEAD],
            None => &[EMBED_TOKENS],
        };
        store.load_except(&mut model, left_out)?;
        let embed = BlockWeight::from_store(store, EMBED_TOKENS, device).map_err(|e| match e {
            burn_mapped::blocks::BlockError::Store(e) => LoadError::Store(e),
            other => LoadError::Store(Box::new(StoreError::Record(other.to_string()))),
        })?;
        // A separate head stays the model's own projection (so a placement can stage it),
        // unless the device binds it only in row blocks.
        let head = head_rows
            .map(|rows| block_head(store, device, &model, rows))
            .transpose()?;
        return Ok(model.with_vocab_blocks(VocabBlocks {
            embed: VocabEmbed::Quantized(Box::new(embed)),
            head,
        })?);
    }
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
/// binds ([`burn_mapped::placement::max_binding`]; Mesa's lavapipe: 128 MiB, against the 0.5B model's
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

/// Rows per block of a separate LM head of GGUF blocks larger than the largest buffer
/// `device` binds (Mesa's lavapipe: 128 MiB, against the 0.5B checkpoint's 145 MB Q8_0 head);
/// `None` when it binds whole or is not blocks.
fn block_head_rows(
    store: &MappedStore,
    device: &Device,
    model: &Qwen2ForCausalLM,
) -> Option<usize> {
    let limit = max_binding(device)?;
    let entry = store.manifest().get(LM_HEAD)?;
    let blocks = model.lm_head.as_ref().is_some_and(Projection::is_blocks);
    let row = entry.blocks()?.row_bytes() as u64;
    (blocks && entry.len() > limit).then(|| (limit / row.max(1)).max(1) as usize)
}

/// A separate LM head of GGUF blocks as projections over blocks of `rows` rows on `device`.
fn block_head(
    store: &MappedStore,
    device: &Device,
    model: &Qwen2ForCausalLM,
    rows: usize,
) -> Result<Vec<Projection>, LoadError> {
    let layout = store
        .manifest()
        .get(LM_HEAD)
        .and_then(|e| e.blocks())
        .ok_or_else(|| StoreError::Record(format!("`{LM_HEAD}` holds no GGUF blocks")))?;
    let vocab = model.vocab_size();
    (0..vocab)
        .step_by(rows)
        .map(|start| {
            let data = store.tensor_rows(LM_HEAD, start..(start + rows).min(vocab))?;
            let dtype = data.dtype();
            Ok(Projection::from_blocks(
                Tensor::<2, Int>::from_data(data, (device, dtype)),
                layout,
            ))
        })
        .collect()
}

/// The vocabulary matrices of `store` as blocks of `rows` rows on `device`, each its own
/// tensor (and, for a separate head, its own projection).
fn vocab_blocks(
    store: &MappedStore,
    device: &Device,
    model: &Qwen2ForCausalLM,
    rows: usize,
) -> Result<VocabBlocks, LoadError> {
    let vocab = model.vocab_size();
    let ranges: Vec<_> = (0..vocab)
        .step_by(rows)
        .map(|start| start..(start + rows).min(vocab))
        .collect();
    // Each block keeps the stored dtype (int8 values and f16 scales for a q8 head).
    let blocks_of = |name: &str| -> Result<Vec<TensorData>, LoadError> {
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
    Ok(VocabBlocks {
        embed: VocabEmbed::RowBlocks(embed),
        head,
    })
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
    let quantized_embed = store
        .manifest()
        .get(EMBED_TOKENS)
        .is_some_and(|e| e.blocks().is_some());
    match &mut model.lm_head {
        Some(head) => stage(head),
        // A tied head over a quantized embedding is the block product over its pages, read
        // in place like the embedding's rows.
        None if quantized_embed => {}
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
