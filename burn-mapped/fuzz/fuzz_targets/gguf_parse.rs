//! Arbitrary bytes into the GGUF parser: it must return an error or a file
//! whose every promise holds, and never panic.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_parse` from `burn-mapped/`;
//! seed `fuzz/corpus/gguf_parse/` with `tests/fixtures/gguf/tiny.gguf`.

#![no_main]

use libfuzzer_sys::fuzz_target;

// The module depends on nothing else in burn-mapped, so it is included from
// source rather than through the crate, which would pull in burn.
#[path = "../../src/gguf/mod.rs"]
#[allow(dead_code, unused_imports)]
mod gguf;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = gguf::GgufFile::parse(data) else {
        return;
    };
    assert_eq!(file.file_len(), data.len() as u64);
    assert!(file.alignment().is_power_of_two());
    for (key, value) in file.metadata() {
        // Identity, not equality: NaN values are not equal to themselves.
        assert!(file.get(key).is_some_and(|v| std::ptr::eq(v, value)));
    }
    let mut ranges = Vec::new();
    for info in file.tensors() {
        assert!(
            file.tensor(info.name())
                .is_some_and(|t| std::ptr::eq(t, info))
        );
        assert!(info.dims().len() <= gguf::MAX_DIMS as usize);
        assert_eq!(info.shape_row_major().len(), info.dims().len());
        assert_eq!((info.offset() - file.data_offset()) % file.alignment(), 0);
        let bytes = file
            .tensor_bytes(data, info)
            .expect("a parsed tensor lies inside the parsed buffer");
        assert_eq!(bytes.len() as u64, info.byte_len());
        if info.byte_len() > 0 {
            ranges.push(info.byte_range());
        }
        // Dequantize at most a few blocks to keep each run fast.
        let ty = info.ggml_type();
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
});
