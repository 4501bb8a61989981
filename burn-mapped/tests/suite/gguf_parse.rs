//! GGUF parsing: a file written by the Python `gguf` package, files built
//! here byte by byte, and one rejection test per validation rule.

use burn_mapped::gguf::{
    Array, GgmlType, GgufError, GgufFile, MAX_ARRAY_LEN, MAX_DIMS, MAX_KEY_LEN,
    MAX_METADATA_ENTRIES, MAX_STRING_LEN, MAX_TENSOR_NAME_LEN, MAX_TENSORS, MappedGguf, Value,
    ValueType, dequantize_to_vec,
};
use burn_mapped_tests::assert_matches;
use serde_json::Value as Json;

const TINY_GGUF: &[u8] = include_bytes!("../fixtures/gguf/tiny.gguf");
const TINY_JSON: &str = include_str!("../fixtures/gguf/tiny.json");

// The byte-level builder writes exactly what the tests say, valid or not.
use burn_mapped_tests::gguf::{
    Builder, F16, F32, Q8_0, T_ARRAY, T_BOOL, T_STRING, T_U8, T_U64, assert_table_like_gguf_py,
    gstr, le32, le64,
};
use burn_mapped_tests::json::u64s;

/// A small valid file: an F32 vector and an F16 matrix.
fn valid() -> Builder {
    let f32s: Vec<u8> = [1.0f32, -2.0, 0.5, 3.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    // F16 1.0, -1.0, 0.5, 2.0, then zeros.
    let mut f16s = vec![0x00, 0x3C, 0x00, 0xBC, 0x00, 0x38, 0x00, 0x40];
    f16s.resize(16, 0);
    let mut data = f32s;
    data.resize(32, 0xEE); // padding between tensors
    data.extend(f16s);
    Builder::new()
        .kv_str("general.architecture", "test")
        .kv_u32("test.n", 7)
        .tensor("vec", &[4], F32, 0)
        .tensor("mat", &[4, 2], F16, 32)
        .data(data)
}

/// A file of the one tensor `name` (`dims` of ggml type `ty` at `offset`) over a data section of
/// `data_len` zero bytes.
fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    Builder::new()
        .tensor(name, dims, ty, offset)
        .data(vec![0; data_len])
        .build()
}

/// [`valid`] with the tensor `name` added (`dims` of ggml type `ty` at `offset`) and its data
/// section `data_len` zero bytes.
fn valid_and(name: &str, dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    valid()
        .tensor(name, dims, ty, offset)
        .data(vec![0; data_len])
        .build()
}

fn parse_err(bytes: &[u8]) -> GgufError {
    match GgufFile::parse(bytes) {
        Ok(_) => panic!("parsed although invalid"),
        Err(e) => e,
    }
}

// ---------------------------------------------------------------------------
// Valid files

#[test]
fn parses_a_file_built_in_code() {
    let bytes = valid().build();
    let gguf = GgufFile::parse(&bytes).unwrap();
    assert_eq!(gguf.version(), 3);
    assert_eq!(gguf.architecture().unwrap(), "test");
    assert_eq!(gguf.get_u32("test.n").unwrap(), 7);
    assert_eq!(gguf.alignment(), 32);
    let header_len = valid().header_bytes().len() as u64;
    assert_eq!(gguf.data_offset(), header_len.div_ceil(32) * 32);
    assert_eq!(gguf.file_len(), bytes.len() as u64);

    let vec = gguf.tensor("vec").unwrap();
    assert_eq!(vec.ggml_type(), GgmlType::F32);
    assert_eq!(vec.dims(), &[4]);
    assert_eq!(vec.offset(), gguf.data_offset());
    assert_eq!(vec.byte_len(), 16);
    let data = gguf.tensor_bytes(&bytes, vec).unwrap();
    assert_eq!(
        dequantize_to_vec(vec.ggml_type(), data).unwrap(),
        [1.0, -2.0, 0.5, 3.25]
    );

    let mat = gguf.tensor("mat").unwrap();
    assert_eq!(mat.dims(), &[4, 2]);
    assert_eq!(mat.shape_row_major(), [2, 4]);
    assert_eq!(mat.n_elements(), 8);
    assert_eq!(mat.offset(), gguf.data_offset() + 32);
    assert_eq!(mat.byte_len(), 16);
    let values = dequantize_to_vec(mat.ggml_type(), gguf.tensor_bytes(&bytes, mat).unwrap());
    assert_eq!(values.unwrap(), [1.0, -1.0, 0.5, 2.0, 0.0, 0.0, 0.0, 0.0]);
    let names: Vec<_> = gguf.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["vec", "mat"]);
}

#[test]
fn accepts_version_2() {
    let mut b = valid();
    b.version = 2;
    assert_eq!(GgufFile::parse(&b.build()).unwrap().version(), 2);
}

#[test]
fn honours_a_custom_alignment() {
    let mut b = Builder::new()
        .kv_u32("general.alignment", 64)
        .tensor("a", &[4], F32, 0)
        .tensor("b", &[4], F32, 64)
        .data(vec![0; 80]);
    b.align = 64;
    let bytes = b.build();
    let gguf = GgufFile::parse(&bytes).unwrap();
    assert_eq!(gguf.alignment(), 64);
    assert_eq!(gguf.data_offset() % 64, 0);
    assert_eq!(gguf.tensor("b").unwrap().offset(), gguf.data_offset() + 64);
}

#[test]
fn accepts_a_file_without_tensors() {
    let bytes = Builder::new().kv_u32("x", 1).header_bytes();
    let gguf = GgufFile::parse(&bytes).unwrap();
    assert!(gguf.tensors().is_empty());
}

#[test]
fn empty_tensors_do_not_overlap_anything() {
    let bytes = Builder::new()
        .tensor("a", &[4], F32, 0)
        .tensor("empty", &[0, 3], F32, 0)
        .data(vec![0; 16])
        .build();
    let gguf = GgufFile::parse(&bytes).unwrap();
    assert_eq!(gguf.tensor("empty").unwrap().byte_len(), 0);
}

#[test]
fn typed_getters_report_missing_keys_and_wrong_types() {
    let bytes = valid().build();
    let gguf = GgufFile::parse(&bytes).unwrap();
    assert!(matches!(gguf.get_u32("nope"), Err(GgufError::MissingKey { key }) if key == "nope"));
    match gguf.get_u64("test.n") {
        Err(GgufError::WrongType {
            key,
            expected,
            found,
        }) => {
            assert_eq!(
                (key.as_str(), expected, found.as_str()),
                ("test.n", "u64", "u32")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        gguf.get_str_array("general.architecture"),
        Err(GgufError::WrongType { found, .. }) if found == "string"
    ));
}

#[test]
fn take_str_array_moves_the_array_out_and_keeps_the_other_keys() {
    let strings = |items: &[&str]| {
        let mut v = [le32(T_STRING), le64(items.len() as u64)].concat();
        for item in items {
            v.extend(gstr(item.as_bytes()));
        }
        v
    };
    let bytes = Builder::new()
        .kv_str("general.architecture", "test")
        .kv("test.tokens", T_ARRAY, strings(&["a", "Ġb", ""]))
        .kv("test.merges", T_ARRAY, strings(&["a b"]))
        .kv_u32("test.n", 7)
        .build();
    let mut gguf = GgufFile::parse(&bytes).unwrap();
    // Errors remove nothing.
    assert!(matches!(
        gguf.take_str_array("test.n"),
        Err(GgufError::WrongType { found, .. }) if found == "u32"
    ));
    assert!(matches!(
        gguf.take_str_array("nope"),
        Err(GgufError::MissingKey { .. })
    ));
    assert_eq!(gguf.metadata().len(), 4);

    assert_eq!(gguf.take_str_array("test.tokens").unwrap(), ["a", "Ġb", ""]);
    assert!(matches!(
        gguf.take_str_array("test.tokens"),
        Err(GgufError::MissingKey { .. })
    ));
    assert!(gguf.get("test.tokens").is_none());
    let keys: Vec<_> = gguf.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["general.architecture", "test.merges", "test.n"]);
    // The keys after the removed one are still found.
    assert_eq!(gguf.get_u32("test.n").unwrap(), 7);
    assert_eq!(gguf.get_str_array("test.merges").unwrap(), ["a b"]);
    assert_eq!(gguf.architecture().unwrap(), "test");
}

#[test]
fn tensor_bytes_rejects_a_buffer_that_was_not_parsed() {
    let bytes = valid().build();
    let gguf = GgufFile::parse(&bytes).unwrap();
    let info = gguf.tensor("mat").unwrap();
    let err = gguf
        .tensor_bytes(&bytes[..bytes.len() - 1], info)
        .unwrap_err();
    assert_matches!(&err, GgufError::BufferMismatch { tensor, .. } if tensor == "mat");
}

/// `tiny.gguf` was written by `gguf.GGUFWriter`; `tiny.json` is what
/// `gguf.GGUFReader` reads back from it.
#[test]
fn parses_a_file_written_by_gguf_py_like_gguf_py_reads_it() {
    let expected: Json = serde_json::from_str(TINY_JSON).unwrap();
    let gguf = GgufFile::parse(TINY_GGUF).unwrap();
    assert_table_like_gguf_py(&gguf, &expected);
    let meta = expected["metadata"].as_object().unwrap();
    assert_eq!(gguf.metadata().len(), meta.len());
    for (key, want) in meta {
        let got = gguf.get(key).unwrap_or_else(|| panic!("{key} missing"));
        assert_value_matches(key, got, want);
    }
    // Order is the file's.
    let keys: Vec<_> = gguf.metadata().iter().map(|(k, _)| k.as_str()).collect();
    let want_keys: Vec<_> = meta.keys().map(String::as_str).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    let mut want_sorted = want_keys.clone();
    want_sorted.sort_unstable();
    assert_eq!(sorted, want_sorted);

    // Every tensor dequantized to gguf-py's values, bit for bit.
    for (info, want) in gguf
        .tensors()
        .iter()
        .zip(expected["tensors"].as_array().unwrap())
    {
        let values = dequantize_to_vec(
            info.ggml_type(),
            gguf.tensor_bytes(TINY_GGUF, info).unwrap(),
        )
        .unwrap();
        let bits: Vec<u64> = values.iter().map(|v| u64::from(v.to_bits())).collect();
        let want_bits = u64s(&want["f32_bits"]);
        assert_eq!(bits, want_bits, "{}", info.name());
    }
}

/// Compares a parsed value with gguf-py's description of it (see
/// `describe_value` in make_fixture.py).
fn assert_value_matches(key: &str, got: &Value, want: &Json) {
    let ty = want["type"].as_str().unwrap();
    match (got, ty) {
        (Value::String(s), "string") => assert_eq!(s, want["value"].as_str().unwrap(), "{key}"),
        (Value::Array(a), "array") => {
            assert_eq!(a.len() as u64, want["len"].as_u64().unwrap(), "{key}");
            let elem = want["element_type"].as_str().unwrap();
            let as_json: Vec<Json> = match (a, elem) {
                (Array::String(v), "STRING") => v.iter().map(|s| Json::from(s.as_str())).collect(),
                (Array::I32(v), "INT32") => v.iter().map(|&x| Json::from(x)).collect(),
                (Array::U32(v), "UINT32") => v.iter().map(|&x| Json::from(x)).collect(),
                (Array::F32(v), "FLOAT32") => v.iter().map(|x| Json::from(x.to_bits())).collect(),
                (Array::Bool(v), "BOOL") => v.iter().map(|&x| Json::from(x)).collect(),
                _ => panic!("{key}: array of {} vs {elem}", a.element_type()),
            };
            let first = want["first"].as_array().unwrap();
            assert_eq!(&as_json[..first.len()], first.as_slice(), "{key}");
            let last = want["last"].as_array().unwrap();
            assert_eq!(
                &as_json[as_json.len() - last.len()..],
                last.as_slice(),
                "{key}"
            );
        }
        (Value::F32(v), "FLOAT32") => assert_eq!(
            u64::from(v.to_bits()),
            want["bits"].as_u64().unwrap(),
            "{key}"
        ),
        (Value::F64(v), "FLOAT64") => {
            assert_eq!(v.to_bits(), want["bits"].as_u64().unwrap(), "{key}")
        }
        (Value::Bool(v), "BOOL") => assert_eq!(*v, want["value"].as_bool().unwrap(), "{key}"),
        (Value::U8(v), "UINT8") => assert_eq!(u64::from(*v), want["value"].as_u64().unwrap()),
        (Value::U16(v), "UINT16") => assert_eq!(u64::from(*v), want["value"].as_u64().unwrap()),
        (Value::U32(v), "UINT32") => assert_eq!(u64::from(*v), want["value"].as_u64().unwrap()),
        (Value::U64(v), "UINT64") => assert_eq!(*v, want["value"].as_u64().unwrap()),
        (Value::I8(v), "INT8") => assert_eq!(i64::from(*v), want["value"].as_i64().unwrap()),
        (Value::I16(v), "INT16") => assert_eq!(i64::from(*v), want["value"].as_i64().unwrap()),
        (Value::I32(v), "INT32") => assert_eq!(i64::from(*v), want["value"].as_i64().unwrap()),
        (Value::I64(v), "INT64") => assert_eq!(*v, want["value"].as_i64().unwrap()),
        _ => panic!(
            "{key}: parsed {} but gguf-py says {ty}",
            got.type_description()
        ),
    }
}

#[test]
fn every_truncation_into_tensor_data_is_an_error() {
    let gguf = GgufFile::parse(TINY_GGUF).unwrap();
    // gguf-py pads the last tensor; cutting only padding leaves a valid file.
    let data_end = gguf
        .tensors()
        .iter()
        .map(|t| t.byte_range().end)
        .max()
        .unwrap();
    assert!(data_end < TINY_GGUF.len() as u64);
    for len in 0..TINY_GGUF.len() {
        let parsed = GgufFile::parse(&TINY_GGUF[..len]);
        assert_eq!(
            parsed.is_ok(),
            len as u64 >= data_end,
            "prefix of {len} bytes"
        );
    }
}

#[test]
fn flipping_any_header_byte_never_panics() {
    let gguf = GgufFile::parse(TINY_GGUF).unwrap();
    let mut bytes = TINY_GGUF.to_vec();
    for i in 0..gguf.data_offset() as usize {
        for mask in [0x01, 0x80, 0xFF] {
            bytes[i] ^= mask;
            let _ = GgufFile::parse(&bytes);
            bytes[i] ^= mask;
        }
    }
}

#[test]
fn maps_a_file_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    std::fs::write(&path, TINY_GGUF).unwrap();
    let mapped = MappedGguf::open(&path).unwrap();
    assert_eq!(mapped.path(), path);
    assert_eq!(mapped.bytes(), TINY_GGUF);
    let info = mapped.gguf().tensor("t.f32").unwrap().clone();
    assert_eq!(mapped.tensor_data(&info).unwrap().len(), 24);
    let header = mapped.gguf().clone();
    let gguf = mapped.into_gguf();
    assert_eq!(gguf.metadata(), header.metadata());
    assert_eq!(gguf.tensors(), header.tensors());
}

#[test]
fn rejects_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = GgufFile::open(dir.path().join("absent.gguf")).unwrap_err();
    assert_matches!(
        &err,
        GgufError::Io { action: "open", source, .. } if source.kind() == std::io::ErrorKind::NotFound
    );
}

#[test]
fn open_names_the_file_of_a_parse_error() {
    let dir = tempfile::tempdir().unwrap();
    for (name, contents) in [
        ("empty.gguf", &b""[..]),
        ("garbage.gguf", &b"nonsense bytes"[..]),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        let err = GgufFile::open(&path).unwrap_err();
        assert_matches!(&err, GgufError::InFile { path: p, .. } if *p == path);
        assert!(matches!(
            err.innermost(),
            GgufError::Truncated { .. } | GgufError::BadMagic { .. }
        ));
    }
}

// ---------------------------------------------------------------------------
// One rejection per rule

#[test]
fn rejects_bad_magic() {
    let mut b = valid();
    b.magic = *b"GGML";
    assert_matches!(parse_err(&b.build()), GgufError::BadMagic { found } if &found == b"GGML");
}

#[test]
fn rejects_unsupported_versions() {
    for version in [1, 4, 0x0300_0000] {
        let mut b = valid();
        b.version = version;
        assert_matches!(
            parse_err(&b.build()),
            GgufError::UnsupportedVersion { version: v } if v == version
        );
    }
}

#[test]
fn rejects_a_truncated_header() {
    let bytes = valid().build();
    match parse_err(&bytes[..20]) {
        GgufError::Truncated {
            field,
            offset,
            needed,
            available,
        } => {
            assert_eq!(field, "metadata entry count");
            assert_eq!((offset, needed, available), (16, 8, 4));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn rejects_a_tensor_count_above_the_cap() {
    let mut b = valid();
    b.n_tensors = Some(MAX_TENSORS + 1);
    assert_matches!(
        parse_err(&b.build()),
        GgufError::TooMany { what: "tensors", count, max: MAX_TENSORS } if count == MAX_TENSORS + 1
    );
}

#[test]
fn rejects_a_metadata_count_above_the_cap() {
    let mut b = valid();
    b.n_kv = Some(u64::MAX);
    assert!(matches!(
        parse_err(&b.build()),
        GgufError::TooMany {
            what: "metadata entries",
            max: MAX_METADATA_ENTRIES,
            ..
        }
    ));
}

#[test]
fn rejects_a_metadata_count_larger_than_the_file() {
    let mut b = valid();
    b.n_kv = Some(MAX_METADATA_ENTRIES);
    assert_matches!(
        parse_err(&b.build()),
        GgufError::CountExceedsFile { what, count: MAX_METADATA_ENTRIES, .. } if what == "metadata"
    );
}

#[test]
fn rejects_a_tensor_count_larger_than_the_file() {
    let mut b = valid();
    b.n_tensors = Some(1000);
    assert_matches!(
        parse_err(&b.build()),
        GgufError::CountExceedsFile { what, count: 1000, min_item_bytes: 24, .. } if what == "tensor table"
    );
}

#[test]
fn rejects_a_key_longer_than_the_cap() {
    let key = "k".repeat(MAX_KEY_LEN as usize + 1);
    let bytes = Builder::new().kv_u32(&key, 1).build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::StringTooLong { len, max: MAX_KEY_LEN, .. } if len == MAX_KEY_LEN + 1
    );
}

#[test]
fn rejects_a_string_value_longer_than_the_cap() {
    // Only the length is written: the cap is checked before reading.
    let bytes = Builder::new()
        .kv("s", T_STRING, le64(MAX_STRING_LEN + 1))
        .build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::StringTooLong { field, max: MAX_STRING_LEN, .. } if field == "value of key s"
    );
}

#[test]
fn rejects_a_string_longer_than_the_rest_of_the_file() {
    let bytes = Builder::new().kv("s", T_STRING, le64(1000)).build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::Truncated { field, needed: 1000, .. } if field == "value of key s"
    );
}

#[test]
fn rejects_a_tensor_name_longer_than_the_cap() {
    let name = "n".repeat(MAX_TENSOR_NAME_LEN as usize + 1);
    let bytes = one_tensor(&name, &[4], F32, 0, 16);
    assert_matches!(
        parse_err(&bytes),
        GgufError::StringTooLong { field, max: MAX_TENSOR_NAME_LEN, .. } if field == "name of tensor 0"
    );
}

#[test]
fn rejects_invalid_utf8() {
    let bytes = Builder::new().kv("s", T_STRING, gstr(b"\xFF\xFE")).build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::InvalidUtf8 { field } if field == "value of key s"
    );
}

#[test]
fn rejects_an_array_longer_than_the_cap() {
    let value = [le32(T_U8), le64(MAX_ARRAY_LEN + 1)].concat();
    let bytes = Builder::new().kv("a", T_ARRAY, value).build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::ArrayTooLong { key, max: MAX_ARRAY_LEN, .. } if key == "a"
    );
}

#[test]
fn rejects_an_array_longer_than_the_rest_of_the_file() {
    // 100 u64s need 800 bytes; 100 strings at least as many.
    for elem in [T_U64, T_STRING] {
        let value = [le32(elem), le64(100), vec![0; 16]].concat();
        let bytes = Builder::new().kv("a", T_ARRAY, value).header_bytes();
        assert_matches!(
            parse_err(&bytes),
            GgufError::CountExceedsFile { what, count: 100, min_item_bytes: 8, available: 16 } if what == "array a"
        );
    }
}

#[test]
fn rejects_an_unknown_value_type() {
    let bytes = Builder::new().kv("x", 13, le32(0)).build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::UnknownValueType { key, type_id: 13 } if key == "x"
    );
    let bytes = Builder::new()
        .kv("y", T_ARRAY, [le32(99), le64(0)].concat())
        .build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::UnknownValueType { key, type_id: 99 } if key == "y"
    );
}

#[test]
fn rejects_an_array_of_arrays() {
    let inner = [le32(T_U8), le64(1), vec![5]].concat();
    let value = [le32(T_ARRAY), le64(1), inner].concat();
    let bytes = Builder::new().kv("nested", T_ARRAY, value).build();
    assert_matches!(parse_err(&bytes), GgufError::NestedArray { key } if key == "nested");
}

#[test]
fn rejects_a_bool_other_than_0_or_1() {
    let bytes = Builder::new().kv("b", T_BOOL, vec![2]).build();
    assert_matches!(parse_err(&bytes), GgufError::InvalidBool { key, byte: 2 } if key == "b");
    let value = [le32(T_BOOL), le64(2), vec![1, 7]].concat();
    let bytes = Builder::new().kv("bs", T_ARRAY, value).build();
    assert_matches!(parse_err(&bytes), GgufError::InvalidBool { key, byte: 7 } if key == "bs");
}

#[test]
fn rejects_a_duplicate_key() {
    let bytes = valid().kv_u32("test.n", 8).build();
    assert_matches!(parse_err(&bytes), GgufError::DuplicateKey { key } if key == "test.n");
}

#[test]
fn rejects_a_duplicate_tensor_name() {
    let bytes = valid_and("vec", &[4], F32, 64, 96);
    assert_matches!(parse_err(&bytes), GgufError::DuplicateTensor { tensor } if tensor == "vec");
}

#[test]
fn rejects_a_zero_alignment() {
    let bytes = valid().kv_u32("general.alignment", 0).build();
    assert_matches!(parse_err(&bytes), GgufError::BadAlignment { alignment: 0 });
}

#[test]
fn rejects_an_alignment_that_is_not_a_power_of_two() {
    let bytes = valid().kv_u32("general.alignment", 48).build();
    assert_matches!(parse_err(&bytes), GgufError::BadAlignment { alignment: 48 });
}

#[test]
fn rejects_an_alignment_that_is_not_u32() {
    let bytes = valid().kv("general.alignment", T_U64, le64(32)).build();
    assert_matches!(
        parse_err(&bytes),
        GgufError::WrongType { key, expected: "u32", found } if key == "general.alignment" && found == "u64"
    );
}

#[test]
fn rejects_more_than_four_dims() {
    let bytes = one_tensor("t5", &[1, 1, 1, 1, 1], F32, 0, 4);
    assert_matches!(
        parse_err(&bytes),
        GgufError::TooManyDims { tensor, n_dims: 5, max: MAX_DIMS } if tensor == "t5"
    );
}

#[test]
fn rejects_an_unknown_ggml_type() {
    // 4 was Q4_2, retired from ggml.
    let bytes = valid_and("old", &[32], 4, 64, 128);
    assert_matches!(
        parse_err(&bytes),
        GgufError::UnknownGgmlType { tensor, type_id: 4 } if tensor == "old"
    );
}

#[test]
fn rejects_an_element_count_that_overflows() {
    let bytes = one_tensor("huge", &[1 << 32, 1 << 32], F32, 0, 4);
    assert_matches!(parse_err(&bytes), GgufError::ShapeOverflow { tensor, .. } if tensor == "huge");
}

#[test]
fn rejects_a_byte_size_that_overflows() {
    // 2^62 elements fit in i64, but 2^64 bytes of F32 do not fit in u64.
    let bytes = one_tensor("big", &[1 << 31, 1 << 31], F32, 0, 4);
    assert_matches!(
        parse_err(&bytes),
        GgufError::ShapeOverflow { tensor, dims } if tensor == "big" && dims == [1 << 31, 1 << 31]
    );
}

#[test]
fn rejects_a_dim_above_i64_max() {
    let bytes = one_tensor("neg", &[u64::MAX], F32, 0, 4);
    assert_matches!(parse_err(&bytes), GgufError::ShapeOverflow { tensor, .. } if tensor == "neg");
}

#[test]
fn rejects_a_row_that_is_not_a_whole_number_of_blocks() {
    let bytes = one_tensor("q", &[16, 2], Q8_0, 0, 64);
    assert_matches!(
        parse_err(&bytes),
        GgufError::RowNotBlockAligned { tensor, ggml_type: GgmlType::Q8_0, ne0: 16, block_size: 32 } if tensor == "q"
    );
}

#[test]
fn rejects_a_misaligned_tensor_offset() {
    let bytes = one_tensor("m", &[4], F32, 4, 32);
    assert_matches!(
        parse_err(&bytes),
        GgufError::MisalignedTensor { tensor, offset: 4, alignment: 32 } if tensor == "m"
    );
}

#[test]
fn rejects_a_tensor_past_the_end_of_the_file() {
    let bytes = valid_and("late", &[8], F32, 64, 80);
    match parse_err(&bytes) {
        GgufError::TensorOutOfBounds {
            tensor,
            start,
            end,
            file_len,
        } => {
            assert_eq!(tensor, "late");
            assert_eq!(end - start, 32);
            assert_eq!(u128::from(file_len), start + 16);
        }
        other => panic!("{other}"),
    }
}

#[test]
fn rejects_a_tensor_offset_whose_end_overflows_u64() {
    let offset = u64::MAX - 31; // aligned
    let bytes = one_tensor("wrap", &[16], F32, offset, 64);
    assert_matches!(
        parse_err(&bytes),
        GgufError::TensorOutOfBounds { tensor, start, .. } if tensor == "wrap" && start > u128::from(u64::MAX)
    );
}

#[test]
fn rejects_overlapping_tensors() {
    let bytes = Builder::new()
        .tensor("a", &[16], F32, 0)
        .tensor("b", &[4], F32, 32)
        .data(vec![0; 64])
        .build();
    match parse_err(&bytes) {
        GgufError::TensorOverlap {
            first,
            first_start,
            first_end,
            second,
            second_start,
            ..
        } => {
            assert_eq!((first.as_str(), second.as_str()), ("a", "b"));
            assert_eq!(first_end - first_start, 64);
            assert_eq!(second_start - first_start, 32);
        }
        other => panic!("{other}"),
    }
}

#[test]
fn rejects_a_data_section_past_the_end_of_the_file() {
    // The table ends unaligned and the file stops there.
    let b = Builder::new().tensor("e", &[0], F32, 0);
    let bytes = b.header_bytes();
    assert_ne!(bytes.len() % 32, 0);
    assert_matches!(
        parse_err(&bytes),
        GgufError::DataSectionOutOfBounds { data_offset, file_len } if file_len == bytes.len() as u64 && data_offset > file_len
    );
}

#[test]
fn value_types_round_trip_their_ids() {
    for id in 0..=12 {
        assert_eq!(ValueType::from_id(id).unwrap() as u32, id);
    }
    assert_eq!(ValueType::from_id(13), None);
}
