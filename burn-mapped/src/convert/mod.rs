//! Converters from other checkpoint formats into a store.
//!
//! Each input format has a module that opens and validates the input and lists its tensors as
//! [`SourceTensor`]s borrowing a read-only mapping of the input file; [`write_tensors`] then
//! streams them into a [`StoreWriter`], applying the [`ConvertOptions`]: a rename hook (which
//! may drop tensors), an optional float cast ([`CastTo`], rounding to nearest even, see
//! [Casting](#casting)), optional q8 quantization of chosen matrices (see
//! [Quantizing](#quantizing)), and a progress callback. Nothing is copied into memory whole:
//! tensor bytes go from the input's page cache through a small buffer into the tensor file.
//!
//! - [`from_safetensors`] / [`SafetensorsInput`]: a Hugging Face `.safetensors` file, a sharded
//!   checkpoint's `*.safetensors.index.json`, or a directory of shards.
//! - [`from_burnpack`] / [`BurnpackInput`]: Burn's own `.bpk`, keeping parameter ids.
//!
//! # Casting
//!
//! With [`ConvertOptions::cast`], every float tensor (f64, f32, f16, bf16) is stored as the
//! target type; integer and bool tensors are kept as they are. Narrowing rounds to nearest,
//! ties to even, overflow gives infinity and NaN stays NaN; f64 -> f16/bf16 is rounded once,
//! correctly (not through a double rounding).
//!
//! # Quantizing
//!
//! With [`ConvertOptions::q8`], each 2-D float tensor the predicate picks (asked with its
//! store name and shape; [`is_projection_weight`](crate::q8::is_projection_weight) is the
//! CLI's rule) is stored as a [q8 matrix](crate::q8): int8 `[out, in]` linked to an f16
//! `<name>_scale`. Rows are read a block at a time, widened exactly to f32 (f64 inputs are
//! rounded to f32 for quantizing) and quantized as [`quantize_rows`](crate::q8::quantize_rows)
//! does; the relative Frobenius error against the exact input values (f64 included) is
//! recorded in the manifest's link. The int8 values of one matrix are held in memory until
//! it is written (a quarter of its f32 size); the cast applies to the other tensors.
//!
//! # Safety hazard
//!
//! Inputs are memory-mapped. If another program truncates an input file during a conversion,
//! reading the lost pages raises `SIGBUS`; if it rewrites the file, the store receives whatever
//! bytes were read (its checksums describe those bytes, so the store stays self-consistent).

mod burnpack;
mod cast;
mod format;
mod safetensors;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::{BoolStore, DType};

use crate::dtype::dtype_name;
use crate::error::StoreError;
use crate::manifest::Manifest;
use crate::q8::{Q8Builder, Q8Error, scale_name};
use crate::writer::{Existing, StoreWriter, TensorSpec};

pub use burnpack::{BurnpackInput, from_burnpack};
pub use format::{CastTo, ParseCastError, ParseWeightFormatError, WeightFormat};
pub use safetensors::{SafetensorsInput, from_safetensors};

/// Input bytes handled per step: bounds the cast buffer and sets the progress granularity.
pub const CHUNK_BYTES: usize = 8 << 20;

const _: () = assert!(
    CHUNK_BYTES.is_multiple_of(8),
    "chunks must never split an element"
);

/// The rename hook: a tensor's input name to its store name, or `None` to drop it.
type RenameFn<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// A quantization predicate: a 2-D tensor's store name and shape to whether it is picked.
type SelectFn<'a> = dyn Fn(&str, &[usize]) -> bool + 'a;

/// The progress callback.
type ProgressFn<'a> = dyn FnMut(&Progress<'_>) + 'a;

/// How far a conversion has got, in input bytes of the tensors being converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress<'a> {
    /// Input bytes read so far.
    pub done_bytes: u64,
    /// Input bytes of every tensor to convert (dropped tensors excluded).
    pub total_bytes: u64,
    /// Input name of the tensor being converted.
    pub tensor: &'a str,
}

/// What to do to each tensor on its way into the store: one options type for every converter
/// (safetensors, burnpack, [GGUF](crate::gguf::gguf_to_store)). The default keeps every
/// tensor, its name and dtype (a GGUF's tensors are dequantized to f32), and reports nothing.
#[derive(Default)]
pub struct ConvertOptions<'a> {
    rename: Option<Box<RenameFn<'a>>>,
    cast: Option<CastTo>,
    q8: Option<Box<SelectFn<'a>>>,
    blocks: Option<Box<SelectFn<'a>>>,
    progress: Option<Box<ProgressFn<'a>>>,
    existing: Existing,
}

impl std::fmt::Debug for ConvertOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvertOptions")
            .field("rename", &self.rename.is_some())
            .field("cast", &self.cast)
            .field("q8", &self.q8.is_some())
            .field("blocks", &self.blocks.is_some())
            .field("progress", &self.progress.is_some())
            .field("existing", &self.existing)
            .finish()
    }
}

impl<'a> ConvertOptions<'a> {
    /// Stores the weights in `format`: the matrices `select(store_name, shape)` picks quantized
    /// as the format says, every other float tensor as its float type (f32 for q8 and blocks).
    pub fn format(
        self,
        format: WeightFormat,
        select: impl Fn(&str, &[usize]) -> bool + 'a,
    ) -> Self {
        let options = self.cast(format.float());
        match format {
            WeightFormat::Float(_) => options,
            WeightFormat::Q8 => options.q8(select),
            WeightFormat::Blocks => options.blocks(select),
        }
    }

    /// Maps each input name to its store name; returning `None` drops the tensor (an
    /// unsupported dtype is not an error for a dropped tensor).
    pub fn rename(mut self, rename: impl Fn(&str) -> Option<String> + 'a) -> Self {
        self.rename = Some(Box::new(rename));
        self
    }

    /// What to do about an existing store at the output (default: replace it atomically).
    /// Anything there that is not a store is always refused.
    pub fn existing(mut self, existing: Existing) -> Self {
        self.existing = existing;
        self
    }

    /// Stores every float tensor as `target`; integers and bools are kept.
    pub fn cast(mut self, target: CastTo) -> Self {
        self.cast = Some(target);
        self
    }

    /// Stores each 2-D float tensor for which `select(store_name, shape)` holds as a q8 matrix
    /// (see [Quantizing](crate::convert#quantizing)); other tensors follow the other options.
    pub fn q8(mut self, select: impl Fn(&str, &[usize]) -> bool + 'a) -> Self {
        self.q8 = Some(Box::new(select));
        self
    }

    /// Keeps the quantized blocks of each 2-D GGUF tensor `select` picks byte for byte
    /// ([`crate::blocks`]). Asked before [`q8`](Self::q8): a tensor whose type has no block
    /// product goes to q8 if that picks it, else to the cast. Only a GGUF has blocks; the
    /// other converters never ask.
    pub fn blocks(mut self, select: impl Fn(&str, &[usize]) -> bool + 'a) -> Self {
        self.blocks = Some(Box::new(select));
        self
    }

    /// Called after each chunk of input is written (at most [`CHUNK_BYTES`] apart) and once
    /// per tensor, including empty ones.
    pub fn progress(mut self, progress: impl FnMut(&Progress<'_>) + 'a) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    /// The cast target, if any.
    pub fn cast_target(&self) -> Option<CastTo> {
        self.cast
    }

    /// `name`'s store name: the rename hook's answer, or the name itself.
    pub(crate) fn store_name(&self, name: &str) -> Option<String> {
        match &self.rename {
            Some(rename) => rename(name),
            None => Some(name.to_string()),
        }
    }

    /// Whether the q8 predicate picks a 2-D tensor.
    pub(crate) fn picks_q8(&self, name: &str, shape: &[usize]) -> bool {
        shape.len() == 2 && self.q8.as_ref().is_some_and(|select| select(name, shape))
    }

    /// Whether the blocks predicate picks a 2-D tensor.
    pub(crate) fn picks_blocks(&self, name: &str, shape: &[usize]) -> bool {
        shape.len() == 2
            && self
                .blocks
                .as_ref()
                .is_some_and(|select| select(name, shape))
    }

    /// Whether a q8 or blocks predicate is set (recorded in the store's metadata).
    pub(crate) fn quantizes(&self) -> (bool, bool) {
        (self.q8.is_some(), self.blocks.is_some())
    }

    /// Reports progress, if asked to.
    pub(crate) fn report(&mut self, progress: &Progress<'_>) {
        if let Some(report) = self.progress.as_mut() {
            report(progress);
        }
    }

    /// What to do about an existing store.
    pub(crate) fn existing_policy(&self) -> Existing {
        self.existing
    }
}

/// An input element type.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceDType {
    /// A type the store can hold.
    Known(DType),
    /// One it cannot, spelled as the input spells it (`F8_E4M3`). Converting such a tensor is
    /// an error unless the rename hook drops it.
    Unsupported(String),
}

/// One input tensor, its bytes borrowed from the input's mapping.
#[derive(Debug, Clone)]
pub struct SourceTensor<'a> {
    /// The input file it comes from (for messages).
    pub file: &'a Path,
    /// Its name in the input.
    pub name: String,
    /// Element type.
    pub dtype: SourceDType,
    /// Shape, row-major.
    pub shape: Vec<usize>,
    /// Burn parameter id, if the input records one.
    pub param_id: Option<u64>,
    /// Little-endian element bytes, exactly shape x element size (no alignment assumed).
    pub data: &'a [u8],
}

/// Counts of what a conversion did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvertSummary {
    /// Tensors written to the store.
    pub written: usize,
    /// Input names the rename hook dropped, in input order.
    pub dropped: Vec<String>,
    /// Tensors stored under a different name.
    pub renamed: usize,
    /// Tensors whose dtype was changed by the cast.
    pub cast: usize,
    /// Tensors stored as q8 matrices (each adds a scale tensor, not counted in `written`).
    pub quantized: usize,
    /// Input bytes of the written tensors.
    pub source_bytes: u64,
    /// Logical bytes written (differs from `source_bytes` when casting).
    pub stored_bytes: u64,
}

/// Errors from converting an input into a store. Every variant names the input file, and the
/// tensor where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// The input could not be opened, listed or mapped.
    #[error("{}: {source}", file.display())]
    Open {
        /// Input path.
        file: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A safetensors file is shorter than its header says.
    #[error("{}: truncated: the header implies {expected} bytes, the file has {actual}", file.display())]
    Truncated {
        /// Input file.
        file: PathBuf,
        /// Length the header implies (at least 8 when the length prefix itself is cut).
        expected: u64,
        /// Actual length.
        actual: u64,
    },
    /// A safetensors file is longer than its header says.
    #[error("{}: {} bytes after the last tensor (the header implies {expected} bytes, the file has {actual})", file.display(), actual - expected)]
    TrailingBytes {
        /// Input file.
        file: PathBuf,
        /// Length the header implies.
        expected: u64,
        /// Actual length.
        actual: u64,
    },
    /// The safetensors crate rejected a file's header.
    #[error("{}: invalid safetensors file: {source}", file.display())]
    Safetensors {
        /// Input file.
        file: PathBuf,
        /// The crate's error.
        source: ::safetensors::SafeTensorError,
    },
    /// Burn's burnpack reader rejected the file.
    #[error("{}: invalid burnpack file: {source}", file.display())]
    Burnpack {
        /// Input file.
        file: PathBuf,
        /// Burn's error.
        source: burn::store::burn_pack::Error,
    },
    /// A sharded checkpoint's index is not valid JSON of the expected shape.
    #[error("{}: malformed safetensors index: {source}", file.display())]
    IndexSyntax {
        /// Index file.
        file: PathBuf,
        /// Parser error.
        source: serde_json::Error,
    },
    /// The index names a shard that is not a plain file name next to it.
    #[error("{}: shard `{shard}` is not a file name in the index's directory", file.display())]
    UnsafeShardName {
        /// Index file.
        file: PathBuf,
        /// The shard name as found (escaped).
        shard: String,
    },
    /// The index and a shard disagree about which tensors the shard holds.
    #[error("tensor `{tensor}`: {reason} (shard {}, index {})", shard.display(), index.display())]
    ShardMismatch {
        /// Index file.
        index: PathBuf,
        /// Shard file.
        shard: PathBuf,
        /// Tensor.
        tensor: String,
        /// What disagrees.
        reason: &'static str,
    },
    /// A directory holds no safetensors file, or several index files.
    #[error("{}: {reason}", dir.display())]
    NoInput {
        /// The directory given.
        dir: PathBuf,
        /// Why nothing could be chosen.
        reason: String,
    },
    /// An element type the store cannot hold.
    #[error("{}: tensor `{tensor}` has dtype {dtype}, which a store cannot hold (drop it with a rename hook)", file.display())]
    UnsupportedDType {
        /// Input file.
        file: PathBuf,
        /// Tensor (input name).
        tensor: String,
        /// The dtype as the input spells it.
        dtype: String,
    },
    /// A finite value is past the range of the dtype the tensor is cast to: storing it would
    /// store an infinity instead. Nothing is written.
    #[error(
        "{}: tensor `{tensor}`: element {index} ({value:e}) is out of {target}'s range; keep a wider dtype for this checkpoint",
        file.display()
    )]
    Unrepresentable {
        /// Input file.
        file: PathBuf,
        /// Tensor.
        tensor: String,
        /// Element index.
        index: u64,
        /// The value.
        value: f64,
        /// The cast target.
        target: &'static str,
    },
    /// A bool tensor holds a byte other than 0 or 1 (reading it as bool would be undefined).
    #[error("{}: tensor `{tensor}` is bool but element {index} is the byte {value:#04x}", file.display())]
    InvalidBool {
        /// Input file.
        file: PathBuf,
        /// Tensor.
        tensor: String,
        /// Element index.
        index: u64,
        /// The byte found.
        value: u8,
    },
    /// A source tensor's bytes do not match its shape and dtype (a bug in a format reader).
    #[error("{}: tensor `{tensor}` has {actual} bytes, its shape and dtype need {expected:?}", file.display())]
    LengthMismatch {
        /// Input file.
        file: PathBuf,
        /// Tensor.
        tensor: String,
        /// Bytes needed, `None` on overflow.
        expected: Option<u64>,
        /// Bytes given.
        actual: u64,
    },
    /// Two input tensors would get the same store name.
    #[error("tensor `{tensor}` would be written twice: from `{first}` ({}) and from `{second}` ({})", first_file.display(), second_file.display())]
    DuplicateTensor {
        /// Store name.
        tensor: String,
        /// First input name.
        first: String,
        /// Its file.
        first_file: PathBuf,
        /// Second input name.
        second: String,
        /// Its file.
        second_file: PathBuf,
    },
    /// A tensor chosen for q8 cannot be quantized (a NaN or infinite weight, or a row whose
    /// scale exceeds f16).
    #[error("{}: tensor `{tensor}`: cannot quantize to q8: {source}", file.display())]
    Quantize {
        /// Input file.
        file: PathBuf,
        /// Tensor (input name).
        tensor: String,
        /// What went wrong (boxed: it is large and rare).
        source: Box<Q8Error>,
    },
    /// A q8 matrix's scale tensor would take the name of another tensor.
    #[error("tensor `{tensor}` is quantized to q8, but its scale name `{scale}` is already the store name of `{other}` ({})", file.display())]
    ScaleNameTaken {
        /// Input file.
        file: PathBuf,
        /// The quantized tensor (input name).
        tensor: String,
        /// Its scale tensor's name.
        scale: String,
        /// The input tensor stored under that name.
        other: String,
    },
    /// Writing one tensor into the store failed.
    #[error("{}: tensor `{tensor}`: {source}", file.display())]
    Write {
        /// Input file.
        file: PathBuf,
        /// Tensor (input name).
        tensor: String,
        /// The store's error (boxed: it is large and rare).
        source: Box<StoreError>,
    },
    /// Creating or publishing the store failed.
    #[error(transparent)]
    Store(Box<StoreError>),
}

impl From<StoreError> for ConvertError {
    fn from(error: StoreError) -> Self {
        ConvertError::Store(Box::new(error))
    }
}

struct Planned<'a> {
    source: SourceTensor<'a>,
    dtype: DType,
    out_name: String,
    out_dtype: DType,
    q8: bool,
}

fn element_count(shape: &[usize]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
}

/// Checks every tensor, applies the rename hook, and decides each output dtype, before any
/// byte is written: a bad input fails without leaving work behind.
fn plan<'a>(
    tensors: impl IntoIterator<Item = SourceTensor<'a>>,
    options: &ConvertOptions,
    summary: &mut ConvertSummary,
) -> Result<Vec<Planned<'a>>, ConvertError> {
    let mut planned: Vec<Planned<'a>> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for source in tensors {
        let Some(out_name) = options.store_name(&source.name) else {
            summary.dropped.push(source.name);
            continue;
        };
        let dtype = match &source.dtype {
            SourceDType::Known(d) if dtype_name(*d).is_some() => match d {
                // One spelling per type in the store.
                DType::Flex32 => DType::F32,
                DType::Bool(_) => DType::Bool(BoolStore::Native),
                d => *d,
            },
            SourceDType::Known(d) => {
                return Err(ConvertError::UnsupportedDType {
                    file: source.file.to_path_buf(),
                    tensor: source.name,
                    dtype: format!("{d:?}"),
                });
            }
            SourceDType::Unsupported(name) => {
                return Err(ConvertError::UnsupportedDType {
                    file: source.file.to_path_buf(),
                    tensor: source.name.clone(),
                    dtype: name.clone(),
                });
            }
        };
        let expected =
            element_count(&source.shape).and_then(|n| n.checked_mul(dtype.size() as u64));
        if expected != Some(source.data.len() as u64) {
            return Err(ConvertError::LengthMismatch {
                file: source.file.to_path_buf(),
                tensor: source.name,
                expected,
                actual: source.data.len() as u64,
            });
        }
        if let Some(&i) = seen.get(&out_name) {
            let first = &planned[i].source;
            return Err(ConvertError::DuplicateTensor {
                tensor: out_name,
                first: first.name.clone(),
                first_file: first.file.to_path_buf(),
                second: source.name,
                second_file: source.file.to_path_buf(),
            });
        }
        let q8 = cast::is_castable_float(dtype) && options.picks_q8(&out_name, &source.shape);
        let out_dtype = match options.cast {
            _ if q8 => DType::I8,
            Some(target) if cast::is_castable_float(dtype) => target.dtype(),
            _ => dtype,
        };
        seen.insert(out_name.clone(), planned.len());
        planned.push(Planned {
            source,
            dtype,
            out_name,
            out_dtype,
            q8,
        });
    }
    for p in planned.iter().filter(|p| p.q8) {
        let scale = scale_name(&p.out_name);
        if let Some(&i) = seen.get(&scale) {
            return Err(ConvertError::ScaleNameTaken {
                file: p.source.file.to_path_buf(),
                tensor: p.source.name.clone(),
                scale,
                other: planned[i].source.name.clone(),
            });
        }
    }
    Ok(planned)
}

/// Streams `tensors` into `writer` as [`ConvertOptions`] says, in the order given.
///
/// All tensors are checked (dtype, length, bool bytes, duplicate names after renaming) before
/// the first is written. The writer is left open so the caller can add metadata and
/// [`finish`](StoreWriter::finish) it; on error, dropping it removes the partial store.
pub fn write_tensors<'a>(
    writer: &mut StoreWriter,
    tensors: impl IntoIterator<Item = SourceTensor<'a>>,
    options: &mut ConvertOptions,
) -> Result<ConvertSummary, ConvertError> {
    let mut summary = ConvertSummary::default();
    let planned = plan(tensors, options, &mut summary)?;
    for p in &planned {
        if p.dtype.is_bool()
            && let Some(index) = p.source.data.iter().position(|&b| b > 1)
        {
            return Err(ConvertError::InvalidBool {
                file: p.source.file.to_path_buf(),
                tensor: p.source.name.clone(),
                index: index as u64,
                value: p.source.data[index],
            });
        }
    }
    let total_bytes: u64 = planned.iter().map(|p| p.source.data.len() as u64).sum();
    let mut done_bytes = 0u64;
    let mut buffer = Vec::new();
    for p in planned {
        if p.q8 {
            let source = &p.source;
            let report = |done: u64| {
                options.report(&Progress {
                    done_bytes: done,
                    total_bytes,
                    tensor: &source.name,
                })
            };
            write_q8(writer, &p, &mut done_bytes, report)?;
            summary.written += 1;
            summary.renamed += usize::from(p.out_name != source.name);
            summary.quantized += 1;
            summary.source_bytes += source.data.len() as u64;
            let [out, inp] = [source.shape[0] as u64, source.shape[1] as u64];
            summary.stored_bytes += out * inp + out * 2;
            continue;
        }
        let Planned {
            source,
            dtype,
            out_name,
            out_dtype,
            q8: _,
        } = p;
        let mut spec = TensorSpec::new(out_name.clone(), out_dtype, source.shape.clone());
        if let Some(id) = source.param_id {
            spec = spec.param_id(id);
        }
        let cast = (out_dtype != dtype)
            .then(|| options.cast.expect("out dtype differs only when casting"));
        let mut report = |done: u64| {
            options.report(&Progress {
                done_bytes: done,
                total_bytes,
                tensor: &source.name,
            })
        };
        let mut overflow = None;
        let elem = dtype.size() as u64;
        let start_bytes = done_bytes;
        let result = writer.add_with(spec, |sink| {
            for chunk in source.data.chunks(CHUNK_BYTES) {
                match cast {
                    Some(target) => {
                        buffer.clear();
                        if let Err(mut at) = cast::cast_into(dtype, target, chunk, &mut buffer) {
                            at.index += done_bytes.saturating_sub(start_bytes) / elem;
                            overflow = Some((at, target));
                            return Err(std::io::Error::other("value out of range"));
                        }
                        sink.write_all(&buffer)?;
                    }
                    None => sink.write_all(chunk)?,
                }
                done_bytes += chunk.len() as u64;
                report(done_bytes);
            }
            if source.data.is_empty() {
                report(done_bytes);
            }
            Ok(())
        });
        if let Some((at, target)) = overflow {
            return Err(ConvertError::Unrepresentable {
                file: source.file.to_path_buf(),
                tensor: source.name.clone(),
                index: at.index,
                value: at.value,
                target: target.name(),
            });
        }
        result.map_err(|e| ConvertError::Write {
            file: source.file.to_path_buf(),
            tensor: source.name.clone(),
            source: Box::new(e),
        })?;
        summary.written += 1;
        summary.renamed += usize::from(out_name != source.name);
        summary.cast += usize::from(cast.is_some());
        summary.source_bytes += source.data.len() as u64;
        summary.stored_bytes += element_count(&source.shape).unwrap_or(0) * out_dtype.size() as u64;
    }
    Ok(summary)
}

/// Quantizes one planned 2-D float tensor block by block and adds the q8 pair to `writer`.
fn write_q8(
    writer: &mut StoreWriter,
    p: &Planned<'_>,
    done_bytes: &mut u64,
    mut report: impl FnMut(u64),
) -> Result<(), ConvertError> {
    let source = &p.source;
    let (out, inp) = (source.shape[0], source.shape[1]);
    let quantize_error = |e: Q8Error| ConvertError::Quantize {
        file: source.file.to_path_buf(),
        tensor: source.name.clone(),
        source: Box::new(e),
    };
    let elem = p.dtype.size();
    let row_bytes = inp * elem;
    // Whole rows per step, about CHUNK_BYTES of input (at least one row).
    let rows_per_step = (CHUNK_BYTES / row_bytes.max(1)).max(1);
    let mut builder = Q8Builder::new(out, inp);
    let mut rows32 = Vec::new();
    let mut exact = Vec::new();
    for block in source.data.chunks(rows_per_step * row_bytes.max(1)) {
        rows32.clear();
        cast::widen_to_f32(p.dtype, block, &mut rows32);
        let pushed = if p.dtype == DType::F64 {
            exact.clear();
            exact.extend(
                block
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))),
            );
            builder.push_exact(&rows32, &exact)
        } else {
            builder.push(&rows32)
        };
        pushed.map_err(quantize_error)?;
        *done_bytes += block.len() as u64;
        report(*done_bytes);
    }
    if source.data.is_empty() {
        report(*done_bytes);
    }
    let (rows, rel_error) = builder.finish().map_err(quantize_error)?;
    crate::q8::add_q8(writer, &p.out_name, &rows, out, inp, Some(rel_error))
        .map(drop)
        .map_err(|e| match e {
            Q8Error::Store(e) => ConvertError::Write {
                file: source.file.to_path_buf(),
                tensor: source.name.clone(),
                source: Box::new(e),
            },
            other => quantize_error(other),
        })
}

/// Creates a store at `out` from `tensors` with `metadata`, publishing it only if every tensor
/// converts.
fn convert_into<'a>(
    out: &Path,
    tensors: impl IntoIterator<Item = SourceTensor<'a>>,
    metadata: impl IntoIterator<Item = (String, String)>,
    options: &mut ConvertOptions,
) -> Result<(Manifest, ConvertSummary), ConvertError> {
    let mut writer = StoreWriter::create_with(out, options.existing)?;
    for (key, value) in metadata {
        writer.metadata(key, value);
    }
    if let Some(target) = options.cast {
        writer.metadata("convert.cast", target.name());
    }
    if options.q8.is_some() {
        writer.metadata("convert.q8", crate::manifest::Q8_ROW_F16);
    }
    let summary = write_tensors(&mut writer, tensors, options)?;
    let manifest = writer.finish()?;
    Ok((manifest, summary))
}
