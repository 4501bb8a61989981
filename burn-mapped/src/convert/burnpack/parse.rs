//! The Burn-free half of burnpack input: Burn's own reader over an in-memory pack, its metadata
//! flattened to strings, and its tensors put back in file order.
//!
//! Nothing here uses Burn or another module of the crate, only `burn-pack` (the crate
//! `burn::store::burn_pack` re-exports): the fuzz crate (`burn-mapped/fuzz`) compiles this
//! file on its own by path.

use std::collections::BTreeMap;

use burn_pack::{Bytes, DType, Error, Reader};

/// One tensor of a pack, its bytes a window into the pack.
pub(super) struct PackTensor {
    pub(super) name: String,
    pub(super) dtype: DType,
    pub(super) shape: Vec<usize>,
    pub(super) param_id: Option<u64>,
    /// Offset of the tensor's bytes in the pack.
    pub(super) offset: usize,
    pub(super) bytes: Bytes,
}

/// A pack read by [`read_pack`].
pub(super) struct Pack {
    /// Every tensor, in file order.
    pub(super) tensors: Vec<PackTensor>,
    /// The pack's key/value metadata as `burnpack.<key>`, and its typed scalars as
    /// `burnpack.scalar.<key>` holding the scalar's JSON (`{"Int":3}`).
    pub(super) metadata: BTreeMap<String, String>,
}

/// Reads the pack in `bytes` with Burn's [`Reader`], which validates the header, the CBOR
/// metadata and every tensor's range; each tensor's bytes are a window into `bytes`.
pub(super) fn read_pack(bytes: Bytes) -> Result<Pack, Error> {
    let base = bytes.as_ptr() as usize;
    let reader = Reader::from_bytes(bytes)?;
    let mut metadata: BTreeMap<String, String> = reader
        .metadata()
        .iter()
        .map(|(k, v)| (format!("burnpack.{k}"), v.clone()))
        .collect();
    for (k, v) in reader.scalars() {
        let value = serde_json::to_string(v).expect("scalars always serialize");
        metadata.insert(format!("burnpack.scalar.{k}"), value);
    }
    let mut tensors = reader
        .into_tensors()?
        .into_iter()
        .map(|t| {
            let (name, dtype, shape, param_id, bytes) = t.into_parts()?;
            Ok(PackTensor {
                name,
                dtype,
                shape: shape.to_vec(),
                param_id,
                // Every window points into the one buffer, so its address is its offset
                // plus `base`.
                offset: (bytes.as_ptr() as usize).wrapping_sub(base),
                bytes,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    // The reader lists names alphabetically; the file holds them in module order, which is
    // also the order that reads the input front to back.
    tensors.sort_by_key(|t| t.offset);
    Ok(Pack { tensors, metadata })
}
