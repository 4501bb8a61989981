//! Writing q8 matrices into a store, and reading them back as a [`Q8Weight`].

use std::io::Write;

use burn::tensor::{DType, Device, Int, Tensor, f16};

use super::error::Q8Error;
use super::quantize::{Q8Rows, quantize_rows, relative_error};
use super::weight::Q8Weight;
use crate::manifest::{Q8_ROW_F16, QuantLink};
use crate::store::MappedStore;
use crate::writer::{StoreWriter, TensorSpec};

/// Suffix that names a weight's scale tensor: `X.weight` has its scales in `X.weight_scale`.
pub const SCALE_SUFFIX: &str = "_scale";

/// Whether a converter asked for q8 quantizes the tensor `name` of `shape`: the rule for
/// linear (projection) weights in Hugging Face and GGUF naming.
///
/// A tensor is quantized when it is 2-D, its last name segment is `weight`, and no segment
/// names an embedding (contains `embed` or `embd`, or is `wte` / `wpe`). For Qwen2 / Llama
/// checkpoints that is every attention and MLP projection (`q_proj`, `k_proj`, `v_proj`,
/// `o_proj`, `gate_proj`, `up_proj`, `down_proj`; GGUF `attn_q` ... `ffn_down`) and the
/// untied LM head (`lm_head.weight`, GGUF `output.weight`), but not `embed_tokens` /
/// `token_embd` (a row gather, not a GEMV; a tied head keeps reading the float embedding).
/// Norm weights and biases are 1-D and stay float.
pub fn is_projection_weight(name: &str, shape: &[usize]) -> bool {
    let mut segments = name.split('.');
    shape.len() == 2
        && name.rsplit('.').next() == Some("weight")
        && !segments.any(|s| {
            let s = s.to_ascii_lowercase();
            s.contains("embed") || s.contains("embd") || s == "wte" || s == "wpe"
        })
}

/// The scale tensor's name for q8 weight `weight` (`layers.0.mlp.up_proj.weight` ->
/// `layers.0.mlp.up_proj.weight_scale`).
pub fn scale_name(weight: &str) -> String {
    format!("{weight}{SCALE_SUFFIX}")
}

/// What [`write_q8`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Written {
    /// The int8 tensor's name.
    pub weight: String,
    /// The f16 scale tensor's name.
    pub scale: String,
    /// `||W - dequant||_F / ||W||_F` of this matrix.
    pub relative_error: f64,
}

/// Quantizes a row-major `[out, in]` f32 matrix and adds it to `writer` as two tensors:
/// `name` (i8 `[out, in]`, linked to its scales) and [`scale_name`]`(name)` (f16 `[out]`).
///
/// Converters call this for 2-D projection weights only; embeddings and norms stay float.
///
/// # Errors
///
/// Quantization errors of [`quantize_rows`], and the writer's errors (an existing name,
/// I/O).
pub fn write_q8(
    writer: &mut StoreWriter,
    name: &str,
    w: &[f32],
    out: usize,
    inp: usize,
) -> Result<Q8Written, Q8Error> {
    let rows = quantize_rows(w, out, inp)?;
    let relative_error = relative_error(w, &rows.values, &rows.scales, out, inp)?;
    let (weight, scale) = add_q8(writer, name, &rows, out, inp, Some(relative_error))?;
    Ok(Q8Written {
        weight,
        scale,
        relative_error,
    })
}

/// Adds already quantized rows to `writer` (see [`write_q8`]); returns the two tensor names.
/// The manifest records no quantization error: the source values are not known here.
pub fn write_q8_rows(
    writer: &mut StoreWriter,
    name: &str,
    rows: &Q8Rows,
    out: usize,
    inp: usize,
) -> Result<(String, String), Q8Error> {
    add_q8(writer, name, rows, out, inp, None)
}

/// [`write_q8_rows`], recording `relative_error` in the weight's quantization link.
pub(crate) fn add_q8(
    writer: &mut StoreWriter,
    name: &str,
    rows: &Q8Rows,
    out: usize,
    inp: usize,
    relative_error: Option<f64>,
) -> Result<(String, String), Q8Error> {
    if out.checked_mul(inp) != Some(rows.values.len()) || rows.scales.len() != out {
        return Err(Q8Error::Shape {
            what: "q8 rows",
            found: vec![rows.values.len(), rows.scales.len()],
            expected: format!("{} values and {out} scales", out.saturating_mul(inp)),
        });
    }
    let scale = scale_name(name);
    let link = QuantLink {
        scheme: Q8_ROW_F16.to_string(),
        scale: scale.clone(),
        rel_error: relative_error.map(|e| e as f32),
    };
    // SAFETY: i8 and u8 have the same size and alignment and every bit pattern is valid for
    // both; the view lives no longer than `rows`.
    let bytes: &[u8] =
        unsafe { std::slice::from_raw_parts(rows.values.as_ptr().cast::<u8>(), rows.values.len()) };
    writer.add(
        TensorSpec::new(name, DType::I8, [out, inp]).quant(link),
        bytes,
    )?;
    writer.add_with(TensorSpec::new(&scale, DType::F16, [out]), |sink| {
        for s in &rows.scales {
            sink.write_all(&s.to_le_bytes())?;
        }
        Ok(())
    })?;
    Ok((name.to_string(), scale))
}

impl Q8Weight {
    /// The q8 weight `name` of `store`, with the scales its manifest links to, on `device`.
    ///
    /// On Flex the tensors adopt the mapped pages (no copy); on a GPU backend `from_data`
    /// copies them once into device memory.
    ///
    /// # Errors
    ///
    /// [`Q8Error::NotQuantized`] if `name` carries no q8 link, store errors if it is absent,
    /// and the checks of [`Q8Weight::new`].
    pub fn from_store(store: &MappedStore, name: &str, device: &Device) -> Result<Self, Q8Error> {
        let entry = store.manifest().get(name).ok_or_else(|| {
            Q8Error::Store(crate::StoreError::TensorNotFound {
                tensor: name.to_string(),
                dir: store.dir().to_path_buf(),
            })
        })?;
        let link = entry
            .quant()
            .filter(|l| l.scheme == Q8_ROW_F16)
            .ok_or_else(|| Q8Error::NotQuantized {
                tensor: name.to_string(),
            })?;
        let values = Tensor::<2, Int>::from_data(store.tensor_data(name)?, (device, DType::I8));
        let scales = Tensor::<1>::from_data(store.tensor_data(&link.scale)?, (device, DType::F16));
        Self::new(values, scales)
    }

    /// Copies quantized rows into new tensors on `device` (tests and small models; a store
    /// avoids the copy on Flex).
    pub fn from_rows(
        rows: &Q8Rows,
        out: usize,
        inp: usize,
        device: &Device,
    ) -> Result<Self, Q8Error> {
        if out.checked_mul(inp) != Some(rows.values.len()) || rows.scales.len() != out {
            return Err(Q8Error::Shape {
                what: "q8 rows",
                found: vec![rows.values.len(), rows.scales.len()],
                expected: format!("{} values and {out} scales", out.saturating_mul(inp)),
            });
        }
        let values = Tensor::<2, Int>::from_data(
            burn::tensor::TensorData::new(rows.values.clone(), [out, inp]),
            (device, DType::I8),
        );
        let scales = Tensor::<1>::from_data(
            burn::tensor::TensorData::new(rows.scales.clone(), [out]),
            (device, DType::F16),
        );
        Self::new(values, scales)
    }
}

// The scale column is read as two bytes a row.
const _: () = assert!(std::mem::size_of::<f16>() == 2);
