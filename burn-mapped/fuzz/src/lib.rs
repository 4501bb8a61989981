//! burn-mapped's parsers as fuzz targets, built on stable Rust without Burn.
//!
//! Each target is a function here that takes arbitrary bytes, returns quietly when the parser
//! rejects them, and panics when the parser accepts them but breaks a promise its
//! documentation makes. `fuzz_targets/<target>.rs` wraps one for libFuzzer; `run.sh` builds
//! those with coverage instrumentation and runs one; `tests/corpus.rs` replays every committed
//! corpus file (`corpus/<target>/`) through every target, which is what CI runs.
//!
//! The parsers are compiled in from burn-mapped's source files by `#[path]`: the GGUF format
//! module, the store manifest with what it uses, and the Burn-free halves of the safetensors
//! and burnpack converters. None of them uses Burn, so neither build compiles it; should one
//! start to use Burn or another module of the crate, this crate stops building, which is how CI
//! notices. Burn's burnpack reader comes from its own crate, `burn-pack`, which needs only
//! `burn-std`, `serde` and `ciborium`.
//!
//! The release profile keeps debug assertions and overflow checks on, as `run.sh` does, so the
//! replay catches what the fuzzer catches.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::{Component, Path};

// The store manifest and what it uses; `manifest.rs` names them as `crate::{dtype, error, // layout}`, so they sit at this crate's root too.
#[path = "../../src/dtype.rs"]
#[allow(dead_code, unused_imports)]
mod dtype;
#[path = "../../src/error.rs"]
#[allow(dead_code, unused_imports)]
mod error;
#[path = "../../src/layout.rs"]
#[allow(dead_code, unused_imports)]
mod layout;
#[path = "../../src/manifest.rs"]
#[allow(dead_code, unused_imports)]
mod manifest;

#[path = "../../src/gguf/format/mod.rs"]
#[allow(dead_code, unused_imports)]
mod gguf_format;

/// `gguf::format` as in burn-mapped, where the manifest names it so.
mod gguf {
    pub(crate) use super::gguf_format as format;
    pub(crate) use super::gguf_format::*;
}

#[path = "../../src/view/plan.rs"]
#[allow(dead_code, unused_imports)]
mod view_plan;

#[path = "../../src/convert/safetensors/parse.rs"]
#[allow(dead_code, unused_imports)]
mod safetensors_parse;

#[path = "../../src/convert/burnpack/parse.rs"]
#[allow(dead_code, unused_imports)]
mod burnpack_parse;

/// A fuzz target: arbitrary bytes in, a panic when the parser breaks a promise.
pub type Target = fn(&[u8]);

/// Every target by name: the names of `fuzz_targets/*.rs` and of the `corpus/` directories.
pub const TARGETS: [(&str, Target); 6] = [
    ("gguf_parse", gguf_parse),
    ("gguf_view", gguf_view),
    ("manifest_parse", manifest_parse),
    ("safetensors_header", safetensors_header),
    ("safetensors_index", safetensors_index),
    ("burnpack", burnpack),
];

/// The plan of a GGUF read in place (`view::plan::plan_gguf`) for every file the parser
/// accepts: each tensor adopted in place is the file's tensor at its offset, as long as its type
/// and shape give, as the dtype or block layout its type calls for; each dequantized one is of
/// a type that decodes; the adopted ranges pass the view's own bounds and overlap check against
/// the file; the metadata carries every scalar as `gguf.<key>`.
pub fn gguf_view(data: &[u8]) {
    use burn_std::DType;
    use gguf::GgmlType;
    use view_plan::{Planned, check_ranges, plan_gguf};

    let Ok(file) = gguf::GgufFile::parse(data) else {
        return;
    };
    let path = Path::new("fuzz.gguf");
    let Ok((planned, metadata)) = plan_gguf(&file, path, "fuzz.gguf", &|n| Some(n.to_string()))
    else {
        return;
    };
    assert_eq!(metadata["source.format"], "gguf");
    for (key, value) in file.metadata() {
        assert_eq!(
            metadata.get(&format!("gguf.{key}")),
            value.scalar_text().as_ref()
        );
    }
    let mut ranges = Vec::new();
    for tensor in &planned {
        match tensor {
            Planned::InFile(entry) => {
                let info = file.tensor(entry.name()).expect("planned from the file");
                assert_eq!(entry.offset(), info.offset());
                assert_eq!(entry.len(), info.byte_len());
                assert!(entry.xxh3().is_none());
                match (info.ggml_type(), entry.blocks()) {
                    (GgmlType::F32, None) => assert_eq!(entry.dtype(), DType::F32),
                    (GgmlType::F16, None) => assert_eq!(entry.dtype(), DType::F16),
                    (GgmlType::BF16, None) => assert_eq!(entry.dtype(), DType::BF16),
                    (ty, Some(layout)) => {
                        assert_eq!(layout.ty(), ty);
                        assert_eq!(entry.dtype(), DType::U8);
                        assert_eq!(info.dims().len(), 2);
                        assert_eq!(layout.cols() as u64, info.dims()[0]);
                        assert_eq!(entry.shape(), [info.dims()[1] as usize, layout.row_bytes()]);
                    }
                    (ty, None) => panic!("{} adopted in place without a layout", ty.name()),
                }
                ranges.push((0, entry.offset(), entry.len(), entry.name()));
            }
            Planned::Dequantized { entry, source } => {
                let info = &file.tensors()[*source];
                assert_eq!(info.name(), entry.name());
                assert!(gguf::can_dequantize(info.ggml_type()));
                assert_eq!(entry.dtype(), DType::F32);
                assert_eq!(entry.len(), info.n_elements() * 4);
            }
        }
    }
    check_ranges(ranges, |_| data.len() as u64, |_| path.to_path_buf())
        .expect("the parser's tensors pass the view's range check");
}

/// `GgufFile::parse`: an accepted file keeps every cap, its lookups agree with its tables, and
/// every tensor has the length its type and shape give, lies aligned inside the data section,
/// shares no byte with another, and dequantizes.
pub fn gguf_parse(data: &[u8]) {
    use gguf::{Value, ValueType};

    let Ok(file) = gguf::GgufFile::parse(data) else {
        return;
    };
    assert!(matches!(file.version(), 2 | 3));
    assert_eq!(file.file_len(), data.len() as u64);
    assert!(file.alignment().is_power_of_two());
    assert_eq!(file.data_offset() % file.alignment(), 0);
    assert!(file.metadata().len() as u64 <= gguf::MAX_METADATA_ENTRIES);
    assert!(file.tensors().len() as u64 <= gguf::MAX_TENSORS);
    for (key, value) in file.metadata() {
        assert!(key.len() as u64 <= gguf::MAX_KEY_LEN);
        // Identity, not equality: NaN values are not equal to themselves.
        assert!(file.get(key).is_some_and(|v| std::ptr::eq(v, value)));
        match value {
            Value::String(s) => assert!(s.len() as u64 <= gguf::MAX_STRING_LEN),
            Value::Array(a) => {
                assert!(a.len() as u64 <= gguf::MAX_ARRAY_LEN);
                assert_ne!(a.element_type(), ValueType::Array, "nested array accepted");
            }
            _ => {}
        }
    }
    if !file.tensors().is_empty() {
        assert!(file.data_offset() <= file.file_len());
    }
    let mut ranges = Vec::new();
    for info in file.tensors() {
        assert!(
            file.tensor(info.name())
                .is_some_and(|t| std::ptr::eq(t, info))
        );
        assert!(info.name().len() as u64 <= gguf::MAX_TENSOR_NAME_LEN);
        assert!(info.dims().len() <= gguf::MAX_DIMS as usize);
        assert_eq!(info.shape_row_major().len(), info.dims().len());
        let elements = info.dims().iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        assert_eq!(elements, Some(info.n_elements()));
        let ty = info.ggml_type();
        assert_eq!(info.dims().first().unwrap_or(&1) % ty.block_size(), 0);
        assert_eq!(
            info.byte_len(),
            info.n_elements() / ty.block_size() * ty.type_size()
        );
        assert!(info.offset() >= file.data_offset());
        assert_eq!((info.offset() - file.data_offset()) % file.alignment(), 0);
        let bytes = file
            .tensor_bytes(data, info)
            .expect("a parsed tensor lies inside the parsed buffer");
        assert_eq!(bytes.len() as u64, info.byte_len());
        if let Some(shorter) = data.len().checked_sub(1) {
            assert!(file.tensor_bytes(&data[..shorter], info).is_err());
        }
        if info.byte_len() > 0 {
            ranges.push(info.byte_range());
        }
        // Dequantize at most a few blocks to keep each run fast.
        if gguf::can_dequantize(ty) {
            let type_size = ty.type_size() as usize;
            let n = (bytes.len() / type_size).min(4) * type_size;
            let values = gguf::dequantize_to_vec(ty, &bytes[..n]).expect("whole blocks");
            assert_eq!(values.len(), n / type_size * ty.block_size() as usize);
        }
    }
    ranges.sort_by_key(|r| r.start);
    for pair in ranges.windows(2) {
        assert!(pair[0].end <= pair[1].start, "overlapping tensors accepted");
    }
}

/// `Manifest::parse`: an accepted manifest keeps every cap, its lookups agree with its table,
/// each entry's length is its shape times its dtype and its file a unique plain name, every
/// quantization link points at a valid scale tensor, and it serializes and parses back to
/// itself.
pub fn manifest_parse(data: &[u8]) {
    use burn_std::DType;

    let Ok(m) = manifest::Manifest::parse(data, Path::new("fuzz/manifest.json")) else {
        return;
    };
    assert!(m.tensors().len() <= manifest::MAX_TENSORS);
    let mut files = HashSet::new();
    let (mut total, mut padded) = (0u64, 0u64);
    for (i, t) in m.tensors().iter().enumerate() {
        assert!(std::ptr::eq(m.get(t.name()).unwrap(), t));
        assert_eq!(m.position(t.name()), Some(i));
        assert!(!t.name().is_empty() && t.name().len() <= manifest::MAX_NAME_BYTES);
        assert!(files.insert(t.file()), "two tensors share a file");
        assert!(t.file().len() <= manifest::MAX_FILE_NAME_BYTES);
        assert_ne!(t.file(), manifest::MANIFEST_FILE);
        assert!(is_one_file_name(t.file()), "unsafe file name accepted");
        assert!(t.shape().len() <= manifest::MAX_RANK);
        let elems = t
            .shape()
            .iter()
            .try_fold(1u128, |n, &d| n.checked_mul(d as u128));
        assert_eq!(
            elems.and_then(|n| n.checked_mul(t.dtype().size() as u128)),
            Some(u128::from(t.len()))
        );
        assert!(t.padded_len() >= t.len());
        assert!(t.padded_len() - t.len() < layout::ALIGNMENT);
        assert_eq!(t.padded_len() % layout::ALIGNMENT, 0);
        total += t.len();
        padded += t.padded_len();
        if let Some(link) = t.quant() {
            let scale = m
                .get(&link.scale)
                .expect("a quantization link names a tensor");
            assert_ne!(scale.name(), t.name());
            assert_eq!(link.scheme, manifest::Q8_ROW_F16);
            assert!(link.rel_error.is_none_or(|e| e.is_finite() && e >= 0.0));
            assert_eq!(t.dtype(), DType::I8);
            assert_eq!(t.shape().len(), 2);
            assert_eq!(scale.dtype(), DType::F16);
            assert_eq!(scale.shape(), &t.shape()[..1]);
        }
    }
    assert!(padded <= manifest::MAX_STORE_BYTES);
    assert_eq!(m.padded_bytes(), padded);
    assert_eq!(m.total_bytes(), total);
    // What parses must serialize and parse back to the same manifest.
    let again = manifest::Manifest::parse(m.to_json().as_bytes(), Path::new("x")).unwrap();
    assert_eq!(again, m);
    // The digest binds names to entries: two names exchanged (every file still matching its
    // entry) must be refused.
    if m.tensors().len() >= 2 {
        let mut v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
        let first = v["tensors"][0]["name"].take();
        v["tensors"][0]["name"] = v["tensors"][1]["name"].take();
        v["tensors"][1]["name"] = first;
        let swapped = manifest::Manifest::parse(v.to_string().as_bytes(), Path::new("x"));
        assert!(
            matches!(swapped, Err(error::StoreError::ManifestDigest { .. })),
            "exchanged names accepted"
        );
    }
}

/// The safetensors header check the converter runs on every shard (`read_header`: the crate's
/// `SafeTensors::read_metadata` plus our length errors): an accepted header's tensors tile the
/// data section in offset order, each as long as its shape and dtype say, and the data section
/// ends at the end of the file; the crate's own view of each tensor is the same bytes. A length
/// error names the real length and an expected length on the right side of it.
pub fn safetensors_header(data: &[u8]) {
    use safetensors_parse::HeaderError;

    let actual = data.len() as u64;
    let header = match safetensors_parse::read_header(data) {
        Ok(header) => header,
        Err(HeaderError::Truncated {
            expected,
            actual: a,
        }) => {
            assert_eq!(a, actual);
            assert!(expected > actual, "truncated, yet {expected} <= {actual}");
            return;
        }
        Err(HeaderError::TrailingBytes {
            expected,
            actual: a,
        }) => {
            assert_eq!(a, actual);
            assert!(
                expected < actual,
                "trailing bytes, yet {expected} >= {actual}"
            );
            return;
        }
        Err(HeaderError::Safetensors(_)) => return,
    };
    let prefix = u64::from_le_bytes(data[..safetensors_parse::PREFIX].try_into().unwrap());
    assert_eq!(
        header.data_start as u64,
        safetensors_parse::PREFIX as u64 + prefix
    );
    let view = safetensors::SafeTensors::deserialize(data).expect("read_metadata accepted it");
    let names = header.metadata.offset_keys();
    assert_eq!(names.len(), view.len());
    let mut next = header.data_start;
    for name in &names {
        let info = header
            .metadata
            .info(name)
            .expect("offset_keys lists known names");
        let range = header.data_range(info);
        assert_eq!(range.start, next, "tensors do not tile the data section");
        next = range.end;
        let bits = info
            .shape
            .iter()
            .try_fold(info.dtype.bitsize() as u128, |n, &d| {
                n.checked_mul(d as u128)
            });
        assert_eq!(bits, Some(range.len() as u128 * 8));
        let bytes = data.get(range).expect("in bounds");
        let tensor = view.tensor(name).expect("the crate lists the same names");
        assert_eq!(tensor.data().as_ptr(), bytes.as_ptr());
        assert_eq!(tensor.data().len(), bytes.len());
        assert_eq!(tensor.shape(), &info.shape[..]);
    }
    assert_eq!(
        next,
        data.len(),
        "data section does not end at the end of the file"
    );
}

/// The converter's index parser (`parse_index`) and shard-name check (`is_plain_file_name`):
/// an accepted index places every tensor in exactly one shard, agrees with a generic JSON
/// reading of `weight_map` (the last of repeated keys wins), and every shard name the check
/// passes, joined to a directory, names a file directly inside it.
pub fn safetensors_index(data: &[u8]) {
    let Ok(by_shard) = safetensors_parse::parse_index(data) else {
        return;
    };
    let dir = Path::new("/fuzz/checkpoint");
    let mut placed = HashSet::new();
    for (shard, tensors) in &by_shard {
        assert!(!tensors.is_empty(), "a shard with no tensors");
        for tensor in tensors {
            assert!(placed.insert(tensor), "{tensor} placed in two shards");
        }
        if safetensors_parse::is_plain_file_name(shard) {
            let path = dir.join(shard);
            assert_eq!(path.parent(), Some(dir), "{shard:?} escapes the directory");
            assert_eq!(path.file_name(), Some(OsStr::new(shard)));
            assert!(is_one_file_name(shard));
        }
    }
    // The other fields are skipped without a full check (serde_json does not validate the
    // UTF-8 of ignored strings), so only `weight_map` is read generically.
    #[derive(serde::Deserialize)]
    struct Generic {
        weight_map: serde_json::Map<String, serde_json::Value>,
    }
    let generic: Generic = serde_json::from_slice(data).expect("the index parsed");
    assert_eq!(generic.weight_map.len(), placed.len());
    for (tensor, shard) in &generic.weight_map {
        let shard = shard.as_str().expect("shard names are strings");
        assert!(by_shard[shard].contains(tensor));
    }
}

/// The converter's burnpack reader (`read_pack`: Burn's `Reader` plus our flattening and file
/// order): an accepted pack's tensors are unique, in file order, each a window onto its own
/// bytes of the input past the header, as long as its shape and dtype say; the flattened
/// metadata holds exactly the reader's metadata and scalars.
pub fn burnpack(data: &[u8]) {
    use burn_pack::{Bytes, DType, Reader, Scalar};
    use burn_std::AllocationProperty;

    // As the converter hands it a mapped file.
    let input = || {
        let shared = bytes::Bytes::copy_from_slice(data);
        Bytes::from_shared(shared, AllocationProperty::File)
    };
    let Ok(pack) = burnpack_parse::read_pack(input()) else {
        return;
    };
    let reader = Reader::from_bytes(input()).expect("read_pack accepted it");
    let metadata_size = u32::from_le_bytes(data[6..10].try_into().unwrap());
    let data_start = burn_pack::aligned_data_section_start(metadata_size as usize);
    let mut names = HashSet::new();
    let mut previous = 0;
    for t in &pack.tensors {
        assert!(names.insert(t.name.as_str()), "{} listed twice", t.name);
        assert!(t.offset >= previous, "not in file order");
        previous = t.offset;
        assert!(
            t.offset >= data_start,
            "{} starts inside the header",
            t.name
        );
        let end = t.offset.checked_add(t.bytes.len()).expect("no overflow");
        assert_eq!(
            &data[t.offset..end],
            &t.bytes[..],
            "{} is not its own bytes",
            t.name
        );
        if !matches!(t.dtype, DType::QFloat(_)) {
            let len = t
                .shape
                .iter()
                .try_fold(t.dtype.size() as u128, |n, &d| n.checked_mul(d as u128));
            assert_eq!(len, Some(t.bytes.len() as u128));
        }
    }
    let listed: HashSet<&str> = reader.tensor_names().into_iter().collect();
    assert_eq!(names, listed);
    // Every scalar is there as JSON that reads back to it (a non-finite float is written as
    // `null`, which serde_json allows); every metadata entry is there unless a scalar's key
    // shadows it (metadata key `scalar.k` and scalar `k` flatten to the same key).
    let mut shadowed = 0;
    for (k, v) in reader.scalars() {
        let json = &pack.metadata[&format!("burnpack.scalar.{k}")];
        if !matches!(v, Scalar::Float(f) if !f.is_finite()) {
            assert_eq!(serde_json::from_str::<Scalar>(json).unwrap(), *v);
        }
        shadowed += usize::from(reader.metadata().contains_key(&format!("scalar.{k}")));
    }
    for (k, v) in reader.metadata() {
        let key = format!("burnpack.{k}");
        let is_scalar = k
            .strip_prefix("scalar.")
            .is_some_and(|s| reader.scalars().contains_key(s));
        if !is_scalar {
            assert_eq!(&pack.metadata[&key], v);
        }
    }
    assert_eq!(
        pack.metadata.len(),
        reader.metadata().len() + reader.scalars().len() - shadowed
    );
    assert!(pack.metadata.keys().all(|k| k.starts_with("burnpack.")));
}

/// Whether `name`, as a path, is exactly one normal component.
fn is_one_file_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!(components.next(), Some(Component::Normal(c)) if c == OsStr::new(name))
        && components.next().is_none()
}
