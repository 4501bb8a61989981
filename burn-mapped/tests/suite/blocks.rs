//! Stores that keep a GGUF's quantized blocks: what conversion writes, what the manifest
//! accepts, that the weights are adopted in place, and that a product over them is the f64
//! product over the GGUF reader's dequantized values.

use std::path::Path;

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_mapped::blocks::{BlockError, BlockWeight, block_linear};
use burn_mapped::convert::ConvertOptions;
use burn_mapped::convert::WeightFormat;
use burn_mapped::gguf::{
    GgmlType, GgufConvertError, GgufFile, MappedGguf, dequantize_to_vec, gguf_to_store,
};
use burn_mapped::{Manifest, MappedStore, StoreError};
use burn_mapped_tests::flex::flex_storage;
use burn_mapped_tests::maps::{inside_a_mapping, store_mappings};

const TINY_GGUF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gguf/tiny.gguf");

fn convert(gguf: &Path, out: &Path) -> Result<Manifest, Box<GgufConvertError>> {
    let gguf = MappedGguf::open(gguf).unwrap();
    gguf_to_store(
        &gguf,
        out,
        ConvertOptions::default().format(WeightFormat::Blocks, |_, _| true),
    )
    .map_err(Box::new)
}

#[test]
fn quantized_tensors_keep_their_blocks_and_float_ones_are_dequantized() {
    let tmp = burn_mapped_tests::tempdir();
    let out = tmp.path().join("store");
    let manifest = convert(Path::new(TINY_GGUF), &out).unwrap();
    let file = GgufFile::open(TINY_GGUF).unwrap();
    let store = MappedStore::open(&out).unwrap();
    for info in file.gguf().tensors() {
        let entry = manifest.get(info.name()).unwrap();
        if info.ggml_type() == GgmlType::Q8_0 {
            let layout = entry.blocks().unwrap();
            assert_eq!((layout.ty(), layout.cols()), (GgmlType::Q8_0, 64));
            assert_eq!(entry.dtype(), DType::U8);
            assert_eq!(entry.shape(), [2, 2 * 34]);
            assert_eq!(
                store.tensor_data(info.name()).unwrap().as_bytes(),
                file.tensor_data(info).unwrap(),
                "the store holds the GGUF's bytes"
            );
        } else {
            assert_eq!((entry.blocks(), entry.dtype()), (None, DType::F32));
        }
    }
    // The layout survives the manifest's round trip.
    let again = Manifest::parse(manifest.to_json().as_bytes(), Path::new("m")).unwrap();
    assert_eq!(
        again.get("t.q8_0").unwrap().blocks(),
        manifest.get("t.q8_0").unwrap().blocks()
    );
}

#[test]
fn a_block_weight_is_the_mapped_pages_and_its_product_the_f64_one() {
    let tmp = burn_mapped_tests::tempdir();
    let out = tmp.path().join("store");
    convert(Path::new(TINY_GGUF), &out).unwrap();
    let store = MappedStore::open(&out).unwrap();
    let device = Device::flex();
    let weight = BlockWeight::from_store(&store, "t.q8_0", &device).unwrap();
    let range = flex_storage(weight.bytes().clone());
    assert!(inside_a_mapping(&range, &store_mappings(&out)), "copied");

    let file = GgufFile::open(TINY_GGUF).unwrap();
    let info = file.gguf().tensor("t.q8_0").unwrap();
    let w = dequantize_to_vec(GgmlType::Q8_0, file.tensor_data(info).unwrap()).unwrap();
    let x: Vec<f32> = (0..3 * 64)
        .map(|i| ((i * 7 % 23) as f32 - 11.0) / 5.0)
        .collect();
    let y = block_linear(
        Tensor::<2>::from_data(TensorData::new(x.clone(), [3, 64]), &device),
        &weight,
        None,
    )
    .unwrap();
    assert_eq!(y.dims(), [3, 2]);
    let y: Vec<f32> = y.into_data().try_to_vec().unwrap();
    for t in 0..3 {
        for o in 0..2 {
            let row = &w[o * 64..(o + 1) * 64];
            let xs = &x[t * 64..(t + 1) * 64];
            let exact: f64 = row
                .iter()
                .zip(xs)
                .map(|(&w, &x)| f64::from(w) * f64::from(x))
                .sum();
            // The activations are quantized to 8 bits per value with a scale per 32, so each
            // moves by at most half a step: |x - q| <= absmax / 254 per block.
            let bound: f64 = (0..2)
                .map(|b| {
                    let xb = &xs[32 * b..32 * b + 32];
                    let amax = xb.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
                    let wsum: f64 = row[32 * b..32 * b + 32]
                        .iter()
                        .map(|v| f64::from(v.abs()))
                        .sum();
                    wsum * amax / 254.0
                })
                .sum::<f64>()
                + 1e-5;
            let got = f64::from(y[t * 2 + o]);
            assert!(
                (got - exact).abs() <= bound,
                "y[{t}, {o}] = {got}, f64 {exact}, bound {bound}"
            );
        }
    }
}

#[test]
fn a_non_finite_block_scale_is_refused_at_conversion() {
    let tmp = burn_mapped_tests::tempdir();
    let file = GgufFile::open(TINY_GGUF).unwrap();
    let info = file.gguf().tensor("t.q8_0").unwrap();
    let mut bytes = std::fs::read(TINY_GGUF).unwrap();
    // The second block's f16 scale becomes NaN.
    let at = info.byte_range().start as usize + 34;
    bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    let bad = tmp.path().join("bad.gguf");
    std::fs::write(&bad, bytes).unwrap();
    let err = convert(&bad, &tmp.path().join("store")).unwrap_err();
    assert!(
        matches!(&*err, GgufConvertError::BadBlock { tensor, block: 1, value } if tensor == "t.q8_0" && value.is_nan()),
        "{err:?}"
    );
    assert!(!tmp.path().join("store").exists());
}

fn manifest_with_blocks(dtype: &str, shape: &str, len: usize, blocks: &str) -> String {
    burn_mapped_tests::synthetic::sealed_manifest(&format!(
        r#"{{"format":"burn-mapped","version":2,"alignment":16384,"tensors":[
        {{"name":"w","dtype":"{dtype}","shape":{shape},"file":"00000-w.tensor","len":{len},
          "xxh3":"0000000000000000","blocks":{blocks}}}]}}"#
    ))
}

/// Why `Manifest::parse` refuses `text`, which must be a `BadBlocks` error naming tensor `w`.
fn bad_blocks_reason(text: &str) -> String {
    match Manifest::parse(text.as_bytes(), Path::new("m")).unwrap_err() {
        StoreError::BadBlocks { tensor, reason } => {
            assert_eq!(tensor, "w", "{text}");
            reason
        }
        other => panic!("{text}: {other:?}"),
    }
}

#[test]
fn a_block_layout_that_does_not_describe_the_bytes_is_a_typed_error() {
    let q8_64 = r#"{"type":"Q8_0","cols":64}"#;
    let ok = manifest_with_blocks("u8", "[2,68]", 136, q8_64);
    Manifest::parse(ok.as_bytes(), Path::new("m")).unwrap();
    // Layouts that do not fit two rows of 68 bytes.
    for (blocks, expected) in [
        (r#"{"type":"Q8_0","cols":96}"#, "rows of 68 bytes"),
        (r#"{"type":"Q8_0","cols":48}"#, "multiple of the block size"),
        (r#"{"type":"F32","cols":64}"#, "not a block type"),
        (r#"{"type":"Q9_9","cols":64}"#, "unknown block type"),
        (r#"{"type":"IQ2_XS","cols":256}"#, "not a block type"),
    ] {
        let why = bad_blocks_reason(&manifest_with_blocks("u8", "[2,68]", 136, blocks));
        assert!(why.contains(expected), "{blocks}: {why}");
    }
    // A valid layout on tensors that are not 2-D u8.
    for (dtype, shape) in [("i8", "[2,68]"), ("u8", "[136]")] {
        let why = bad_blocks_reason(&manifest_with_blocks(dtype, shape, 136, q8_64));
        assert!(why.contains("2-D u8"), "{dtype} {shape}: {why}");
    }
}

#[test]
fn block_weights_refuse_what_they_cannot_read() {
    let device = Device::flex();
    let layout = burn_mapped::gguf::BlockLayout::new(GgmlType::Q8_0, 64).unwrap();
    let wrong_rows = Tensor::<2, burn::tensor::Int>::zeros([2, 60], (&device, DType::U8));
    assert!(matches!(
        BlockWeight::new(wrong_rows, layout),
        Err(BlockError::Shape { .. })
    ));
    let wrong_dtype = Tensor::<2, burn::tensor::Int>::zeros([2, 68], (&device, DType::I8));
    assert!(matches!(
        BlockWeight::new(wrong_dtype, layout),
        Err(BlockError::DType { .. })
    ));
    let weight = BlockWeight::new(
        Tensor::<2, burn::tensor::Int>::zeros([2, 68], (&device, DType::U8)),
        layout,
    )
    .unwrap();
    let narrow = Tensor::<2>::zeros([1, 32], &device);
    assert!(matches!(
        block_linear(narrow, &weight, None),
        Err(BlockError::Shape { .. })
    ));
    let odd = Tensor::<2>::zeros([1, 40], &device);
    assert!(matches!(
        block_linear(odd, &weight, None),
        Err(BlockError::Shape { .. })
    ));
}
