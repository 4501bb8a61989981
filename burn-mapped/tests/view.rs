//! Checkpoint files read in place (`MappedStore::open_gguf`, `open_safetensors`): every adopted
//! tensor's storage lies inside the file's own mapping, anonymous memory stays flat, a tensor
//! that cannot be adopted is copied once and reported, and bad files are typed errors naming
//! the file and tensor.

use std::path::Path;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device, Int, Tensor};
use burn_mapped::MappedStore;
use burn_mapped::host::memstat::rss_self;
use burn_mapped_tests::flex::{flex_storage, float_param_storage};
use burn_mapped_tests::gguf::{Builder, F16, F32, Q8_0};
use burn_mapped_tests::maps::{inside_a_mapping, mapped_ranges};
use burn_mapped_tests::numeric::f32_le_bytes;
use burn_mapped_tests::synthetic::{pattern, write_safetensors};
use safetensors::Dtype;

/// 34-byte Q8_0 blocks of 32 values: an f16 scale of 1.0, then `q` as the values.
fn q8_0_blocks(blocks: usize, seed: u64) -> Vec<u8> {
    let q = pattern(blocks * 32, seed);
    q.chunks(32)
        .flat_map(|c| [0x00, 0x3C].into_iter().chain(c.iter().copied()))
        .collect()
}

fn write(dir: &Path, name: &str, bytes: Vec<u8>) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A GGUF with an f32 matrix, an f16 vector and a Q8_0 matrix.
fn small_gguf(dir: &Path) -> std::path::PathBuf {
    let f32s = f32_le_bytes((0..12).map(|i| i as f32 - 5.5));
    let f16s: Vec<u8> = [1.0f32, -2.0, 0.5, 4.0]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let bytes = Builder::new()
        .kv_str("general.architecture", "test")
        .kv_u32("test.answer", 42)
        .tensor_data("w", &[4, 3], F32, &f32s)
        .tensor_data("h", &[4], F16, &f16s)
        .tensor_data("q", &[64, 3], Q8_0, &q8_0_blocks(6, 1))
        .build();
    write(dir, "small.gguf", bytes)
}

#[test]
fn a_gguf_read_in_place_is_its_own_bytes_at_their_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let path = small_gguf(tmp.path());
    let store = MappedStore::open_gguf(&path).unwrap();
    let manifest = store.manifest();
    assert!(manifest.is_view());
    assert_eq!(manifest.metadata()["gguf.test.answer"], "42");
    assert_eq!(manifest.metadata()["source.format"], "gguf");
    let file = std::fs::read(&path).unwrap();
    let parsed = burn_mapped::gguf::GgufFile::parse(&file).unwrap();
    for (name, dtype, shape) in [
        ("w", DType::F32, vec![3, 4]),
        ("h", DType::F16, vec![4]),
        ("q", DType::U8, vec![3, 68]),
    ] {
        let entry = manifest.get(name).unwrap();
        assert_eq!(entry.dtype(), dtype, "{name}");
        assert_eq!(entry.shape(), shape.as_slice(), "{name}");
        assert_eq!(entry.xxh3(), None);
        let info = parsed.tensor(name).unwrap();
        assert_eq!(entry.offset(), info.offset(), "{name}");
        assert_eq!(
            store.bytes(name).unwrap(),
            parsed.tensor_bytes(&file, info).unwrap(),
            "{name}"
        );
    }
    let layout = manifest.get("q").unwrap().blocks().unwrap();
    assert_eq!((layout.ty().name(), layout.cols()), ("Q8_0", 64));
    assert!(store.copied().is_empty());
    assert!(store.verify().is_empty());
}

#[test]
fn adopted_gguf_tensors_are_the_files_pages() {
    let tmp = tempfile::tempdir().unwrap();
    let path = small_gguf(tmp.path());
    let store = MappedStore::open_gguf(&path).unwrap();
    let maps = mapped_ranges(&path);
    assert_eq!(maps.len(), 1, "one mapping of the whole file");
    let device = Device::flex();
    let w = Tensor::<2>::from_data(store.tensor_data("w").unwrap(), &device);
    let q = Tensor::<2, Int>::from_data(store.tensor_data("q").unwrap(), (&device, DType::U8));
    assert!(inside_a_mapping(&flex_storage(w.clone()), &maps));
    assert!(inside_a_mapping(&flex_storage(q), &maps));
    let values: Vec<f32> = w.into_data().try_to_vec().unwrap();
    assert_eq!(values, (0..12).map(|i| i as f32 - 5.5).collect::<Vec<_>>());
}

#[test]
fn loading_a_large_gguf_in_place_adds_no_anonymous_memory() {
    let tmp = tempfile::tempdir().unwrap();
    // 64 MiB of f32 in four tensors.
    let mut builder = Builder::new().kv_str("general.architecture", "test");
    let rows = 1024usize;
    let cols = 4096usize;
    let data = pattern(rows * cols * 4, 3);
    for i in 0..4 {
        builder = builder.tensor_data(&format!("t{i}"), &[cols as u64, rows as u64], F32, &data);
    }
    let path = write(tmp.path(), "big.gguf", builder.build());
    drop(data);
    let device = Device::flex();
    let before = rss_self().unwrap().anon;
    let store = MappedStore::open_gguf(&path).unwrap();
    let tensors: Vec<Tensor<2>> = (0..4)
        .map(|i| Tensor::from_data(store.tensor_data(&format!("t{i}")).unwrap(), &device))
        .collect();
    let after = rss_self().unwrap().anon;
    let file_len = std::fs::metadata(&path).unwrap().len();
    let grown = after.saturating_sub(before);
    assert!(
        grown * 50 <= file_len,
        "anonymous memory grew by {grown} bytes for a {file_len}-byte file"
    );
    let maps = mapped_ranges(&path);
    for t in tensors {
        assert!(inside_a_mapping(&flex_storage(t), &maps));
    }
}

#[test]
fn a_gguf_tensor_no_kernel_reads_where_it_lies_is_copied_once_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    // A 1-D Q8_0 tensor (blocks are read as rows of a matrix), and an f32 tensor at an offset
    // that is not a multiple of 4 (the file's alignment is 2; the padding tensor's length is
    // chosen so that `w` lands on an odd pair of bytes).
    let build = |pad: u64| {
        let mut builder = Builder::new().kv_str("general.architecture", "test");
        builder.align = 2;
        builder
            .kv_u32("general.alignment", 2)
            .tensor_data("q", &[64], Q8_0, &q8_0_blocks(2, 4))
            .tensor_data("pad", &[pad], F16, &vec![0u8; 2 * pad as usize])
            .tensor_data("w", &[3], F32, &f32_le_bytes([1.0f32, 2.0, 3.0]))
            .build()
    };
    let misaligned = |bytes: &[u8]| {
        let gguf = burn_mapped::gguf::GgufFile::parse(bytes).unwrap();
        !gguf.tensor("w").unwrap().offset().is_multiple_of(4)
    };
    let bytes = [build(1), build(2)]
        .into_iter()
        .find(|b| misaligned(b))
        .unwrap();
    let path = write(tmp.path(), "odd.gguf", bytes);
    let store = MappedStore::open_gguf(&path).unwrap();
    let copied: Vec<(&str, u64)> = store.copied();
    assert!(copied.contains(&("q", 256)), "{copied:?}");
    assert!(copied.contains(&("w", 12)), "{copied:?}");
    let device = Device::flex();
    let w = Tensor::<1>::from_data(store.tensor_data("w").unwrap(), &device);
    assert_eq!(w.into_data().try_to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
    // The dequantized values: scale 1.0 times the int8 values.
    let q: Vec<f32> = Tensor::<1>::from_data(store.tensor_data("q").unwrap(), &device)
        .into_data()
        .try_to_vec()
        .unwrap();
    let raw = q8_0_blocks(2, 4);
    let expected: Vec<f32> = raw
        .chunks(34)
        .flat_map(|b| b[2..].iter().map(|&v| f32::from(v as i8)))
        .collect();
    assert_eq!(q, expected);
}

#[test]
fn bad_gguf_files_are_typed_errors_naming_the_file_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let f32s = f32_le_bytes([1.0f32; 8]);
    let valid = || {
        Builder::new()
            .kv_str("general.architecture", "test")
            .tensor_data("alpha", &[8], F32, &f32s)
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            {
                let mut b = valid().build();
                b.truncate(b.len() - 4);
                b
            },
            "alpha",
        ),
        (
            "past-end",
            valid().tensor("beta", &[8], F32, 4096).build(),
            "beta",
        ),
        (
            "overlap",
            valid().tensor("beta", &[8], F32, 0).build(),
            "beta",
        ),
        (
            "misaligned",
            valid()
                .tensor("beta", &[1], F32, 36)
                .data({
                    let mut d = f32s.clone();
                    d.resize(64, 0);
                    d
                })
                .build(),
            "beta",
        ),
        (
            "unknown-type",
            valid().tensor("beta", &[8], 99, 32).build(),
            "beta",
        ),
        (
            "duplicate",
            valid().tensor("alpha", &[8], F32, 0).build(),
            "alpha",
        ),
        (
            "unsupported-type",
            valid().tensor_data("beta", &[32], 2, &[0u8; 18]).build(),
            "beta",
        ),
    ];
    for (label, bytes, tensor) in cases {
        let path = write(tmp.path(), &format!("{label}.gguf"), bytes);
        let err = MappedStore::open_gguf(&path).expect_err(label);
        let text = format!(
            "{err}: {}",
            std::error::Error::source(&err).map_or(String::new(), |s| s.to_string())
        );
        assert!(text.contains(&*path.to_string_lossy()), "{label}: {text}");
        let words: Vec<&str> = text.split(|c: char| !c.is_alphanumeric()).collect();
        assert!(words.contains(&tensor), "{label}: {text}");
    }
}

/// A tiny module whose parameter is adopted from a safetensors file.
#[derive(Module, Debug)]
struct Net {
    linear: Linear,
}

#[test]
fn a_safetensors_checkpoint_loads_into_a_module_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.safetensors");
    let weight = f32_le_bytes((0..64 * 32).map(|i| (i % 17) as f32 * 0.25));
    let bias = f32_le_bytes((0..32).map(|i| i as f32));
    write_safetensors(
        &path,
        &[
            ("linear.weight", Dtype::F32, vec![64, 32], weight),
            ("linear.bias", Dtype::F32, vec![32], bias),
        ],
        None,
    );
    let device = Device::flex();
    let mut net = Net {
        linear: LinearConfig::new(64, 32).init(&device),
    };
    let mut store = burn_mapped::MappedStore::options()
        .strict(true)
        .open_safetensors(&path, &|name| Some(name.to_string()))
        .unwrap();
    net.load_from(&mut store).unwrap();
    assert!(store.copied().is_empty());
    let maps = mapped_ranges(&path);
    let storage = float_param_storage(&net);
    assert_eq!(storage.len(), 2);
    for (name, range) in storage {
        assert!(
            inside_a_mapping(&range, &maps),
            "{name} is not the file's pages"
        );
    }
    let y = net.linear.forward(Tensor::<2>::ones([1, 64], &device));
    // Burn's `Linear` holds its weight `[in, out]`: output 0 sums column 0 and adds bias 0.
    let expected: f32 = (0..64).map(|i| (i * 32 % 17) as f32 * 0.25).sum();
    let y: Vec<f32> = y.into_data().try_to_vec().unwrap();
    assert_eq!(y[0], expected);
}

#[test]
fn a_misaligned_safetensors_tensor_is_copied_once_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    // A header of 9 bytes puts the data section at offset 17: no f32 offset is aligned.
    let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut header = header.to_vec();
    while (8 + header.len()) % 4 != 1 {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&header);
    bytes.extend(f32_le_bytes([1.5f32, -2.0]));
    let path = write(tmp.path(), "odd.safetensors", bytes);
    let store = MappedStore::open_safetensors(&path).unwrap();
    assert_eq!(store.copied(), [("w", 8)]);
    let w = Tensor::<1>::from_data(store.tensor_data("w").unwrap(), &Device::flex());
    assert_eq!(w.into_data().try_to_vec::<f32>().unwrap(), [1.5, -2.0]);
}

#[test]
fn a_sharded_safetensors_checkpoint_reads_in_place_from_every_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_safetensors(
        &dir.join("model-00001-of-00002.safetensors"),
        &[("a", Dtype::F32, vec![2], f32_le_bytes([1.0f32, 2.0]))],
        None,
    );
    write_safetensors(
        &dir.join("model-00002-of-00002.safetensors"),
        &[("b", Dtype::F32, vec![2], f32_le_bytes([3.0f32, 4.0]))],
        None,
    );
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        br#"{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let store = MappedStore::open_safetensors(dir.join("model.safetensors.index.json")).unwrap();
    for (name, shard, values) in [
        ("a", "model-00001-of-00002.safetensors", [1.0f32, 2.0]),
        ("b", "model-00002-of-00002.safetensors", [3.0, 4.0]),
    ] {
        let t = Tensor::<1>::from_data(store.tensor_data(name).unwrap(), &Device::flex());
        assert!(inside_a_mapping(
            &flex_storage(t.clone()),
            &mapped_ranges(&dir.join(shard))
        ));
        assert_eq!(t.into_data().try_to_vec::<f32>().unwrap(), values);
    }
}

#[test]
fn an_in_place_op_on_a_checkpoint_tensor_is_refused_in_strict_mode_and_the_file_stays() {
    let tmp = tempfile::tempdir().unwrap();
    let path = small_gguf(tmp.path());
    let before = std::fs::read(&path).unwrap();
    let store = MappedStore::options()
        .strict(true)
        .open_gguf(&path, &|n| Some(n.to_string()))
        .unwrap();
    let w = Tensor::<2>::from_data(store.tensor_data("w").unwrap(), &Device::flex());
    drop(store);
    // `w` is the only owner now, so Flex may choose it as an in-place output.
    burn_mapped_tests::assert_strict_refusal("w", || {
        let _ = (w + 1.0).into_data();
    });
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
