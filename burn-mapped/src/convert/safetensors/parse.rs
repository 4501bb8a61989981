//! The Burn-free half of safetensors input: a file's header, checked against the file's length,
//! and a sharded checkpoint's index.
//!
//! Nothing here uses Burn or another module of the crate: the fuzz crate (`burn-mapped/fuzz`)
//! compiles this file on its own by path.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{SafeTensorError, SafeTensors};
use serde::Deserialize;

/// Length of the safetensors length prefix.
pub(super) const PREFIX: usize = 8;

/// A safetensors header validated against the whole file: its tensors tile the data section,
/// which ends exactly at the end of the file.
pub(super) struct Header {
    /// Offset of the data section in the file.
    pub(super) data_start: usize,
    pub(super) metadata: Metadata,
}

impl Header {
    /// Byte range of `info`'s data in the file; in bounds for the file the header came from.
    pub(super) fn data_range(&self, info: &TensorInfo) -> Range<usize> {
        let (start, end) = info.data_offsets;
        // No overflow: `read_header` checked that the data section ends at the end of the file.
        self.data_start + start..self.data_start + end
    }
}

/// Why a file's header was rejected.
#[derive(Debug)]
pub(super) enum HeaderError {
    /// The file is shorter than its length prefix or its header says it should be.
    Truncated { expected: u64, actual: u64 },
    /// The file goes on past the end of the data section its header describes.
    TrailingBytes { expected: u64, actual: u64 },
    /// Any other rejection by the `safetensors` crate.
    Safetensors(SafeTensorError),
}

/// Validates the header of the safetensors file `bytes` with `SafeTensors::read_metadata`
/// (offsets contiguous from 0, sizes exact, data ending at the end of the file).
///
/// When the header can tell how long the file should be, the crate's "buffer does not match"
/// errors become a precise [`HeaderError::Truncated`] or [`HeaderError::TrailingBytes`].
pub(super) fn read_header(bytes: &[u8]) -> Result<Header, HeaderError> {
    let actual = bytes.len() as u64;
    let Some(prefix) = bytes.get(..PREFIX) else {
        return Err(HeaderError::Truncated {
            expected: PREFIX as u64,
            actual,
        });
    };
    let prefix = u64::from_le_bytes(prefix.try_into().expect("PREFIX bytes"));
    // When the header is inside the file and parses: the file length it declares, `None` if
    // that overflows. safetensors 0.8's `read_metadata` adds the data length to the header end
    // unchecked, so a header whose tensors add up to nearly `usize::MAX` bytes panics there in
    // a build with overflow checks (and wraps without them); it is turned away here first.
    let declared = usize::try_from(prefix)
        .ok()
        .and_then(|n| bytes.get(PREFIX..PREFIX.checked_add(n)?))
        .and_then(|header| serde_json::from_slice::<Metadata>(header).ok())
        .map(|metadata| (PREFIX as u64 + prefix).checked_add(metadata.data_len() as u64));
    if declared == Some(None) {
        return Err(HeaderError::Safetensors(
            SafeTensorError::ValidationOverflow,
        ));
    }
    let error = match SafeTensors::read_metadata(bytes) {
        Ok((header_len, metadata)) => {
            return Ok(Header {
                data_start: PREFIX + header_len,
                metadata,
            });
        }
        Err(error) => error,
    };
    let expected = match (&error, declared) {
        // The header runs past the end of the file.
        (SafeTensorError::InvalidHeaderLength, _) => (PREFIX as u64).saturating_add(prefix),
        // The header was read; the data section is longer or shorter than the rest.
        (SafeTensorError::MetadataIncompleteBuffer, Some(Some(expected))) => expected,
        _ => return Err(HeaderError::Safetensors(error)),
    };
    Err(if expected > actual {
        HeaderError::Truncated { expected, actual }
    } else {
        HeaderError::TrailingBytes { expected, actual }
    })
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

/// Parses a sharded checkpoint's `*.safetensors.index.json` into shard name -> the tensors the
/// index places in it. Shard names are not checked here; see [`is_plain_file_name`].
pub(super) fn parse_index(
    bytes: &[u8],
) -> Result<BTreeMap<String, BTreeSet<String>>, serde_json::Error> {
    let index: Index = serde_json::from_slice(bytes)?;
    let mut by_shard: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (tensor, shard) in index.weight_map {
        by_shard.entry(shard).or_default().insert(tensor);
    }
    Ok(by_shard)
}

/// Whether `name` names a file inside the index's directory: one normal path component, no
/// separator, NUL or control character.
pub(super) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !name.chars().any(char::is_control)
}
