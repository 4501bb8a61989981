//! Loads onto a wgpu device registered with `burn_mapped::upload`: every parameter of a kind the
//! staging ring takes arrives byte for byte (one larger than a staging buffer, one of an odd
//! length), a float16 one and a small one still load through burn-store's applier, and the
//! ring's counters
//! show which went which way. Its own test binary: the device is initialized here, once, to
//! get its wgpu handles.
//!
//! Run with `cargo test --release -p burn-mapped --features gpu-tests --test upload_wgpu`;
//! without an adapter it skips unless `BURN_MAPPED_REQUIRE_GPU=1`.
#![cfg(feature = "gpu-tests")]

use burn::module::{Module, Param, ParamId};
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device, Int, Tensor, TensorData, f16};
use std::sync::{Mutex, MutexGuard, OnceLock};

use burn_mapped::blocks::BlockWeight;
use burn_mapped::gguf::{BlockLayout, GgmlType};
use burn_mapped::{MappedStore, StoreWriter, TensorSpec, upload};
use burn_mapped_tests::numeric::f32_le_bytes;

#[derive(Module, Debug)]
struct Weights {
    /// Larger than one staging buffer (64 MiB): two chunks.
    big: Param<Tensor<2, Int>>,
    /// A length that is not a whole number of words: the copy's last word is padded.
    odd: Param<Tensor<2, Int>>,
    norm: Param<Tensor<1>>,
    /// Not a dtype the ring takes: loaded by burn-store's applier.
    half: Param<Tensor<1>>,
    /// Too small for the ring's round trips: loaded by the applier too.
    bias: Param<Tensor<1>>,
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The counters are the process's: one test at a time reads them.
static SERIAL: Mutex<()> = Mutex::new(());

/// The wgpu device, registered once for the process.
fn device() -> Option<Device> {
    static DEVICE: OnceLock<Option<Device>> = OnceLock::new();
    DEVICE.get_or_init(init).clone()
}

fn init() -> Option<Device> {
    match Device::wgpu_options().init_with_setup() {
        Ok((device, setup)) => {
            upload::register(&device, setup.device, setup.queue);
            Some(device)
        }
        Err(e) => {
            assert!(
                !burn_mapped_tests::gpu::gpu_required(),
                "BURN_MAPPED_REQUIRE_GPU=1 but wgpu did not come up: {e}"
            );
            eprintln!("no wgpu adapter ({e}): skipping");
            None
        }
    }
}

/// The device, the counters to this test alone, and a directory for its store.
fn setup() -> Option<(Device, MutexGuard<'static, ()>, tempfile::TempDir)> {
    let device = device()?;
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Some((device, serial, tempfile::tempdir().unwrap()))
}

#[test]
fn registered_device_loads_through_the_ring() {
    let Some((device, _serial, tmp)) = setup() else {
        return;
    };
    let dir = tmp.path().join("store");
    // GGUF blocks: on a CubeCL device bytes that only the block kernels read, as 32-bit words.
    let big_layout = BlockLayout::new(GgmlType::Q8_0, 32 * 1900).unwrap();
    let (rows, cols) = (1100, big_layout.row_bytes());
    let big = bytes(rows * cols, 1);
    let odd_layout = BlockLayout::new(GgmlType::Q8_0, 32 * 5).unwrap();
    let odd = bytes(6201 * odd_layout.row_bytes(), 2);
    assert!(big.len() > 64 << 20 && !odd.len().is_multiple_of(4));
    // Over the 1 MiB below which a tensor keeps `from_data`.
    let norm: Vec<f32> = (0..300_000).map(|i| i as f32 * 0.25 - 3.0).collect();
    let half: Vec<f16> = (0..9).map(|i| f16::from_f32(i as f32 / 8.0)).collect();
    let mut w = StoreWriter::create(&dir).unwrap();
    w.add(
        TensorSpec::new("big", DType::U8, [rows, cols]).blocks(big_layout),
        &big,
    )
    .unwrap();
    w.add(
        TensorSpec::new("odd", DType::U8, [6201, odd_layout.row_bytes()]).blocks(odd_layout),
        &odd,
    )
    .unwrap();
    w.add(
        TensorSpec::new("norm", DType::F32, [300_000]),
        &f32_le_bytes(&norm),
    )
    .unwrap();
    w.add(
        TensorSpec::new("half", DType::F16, [9]),
        &half
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let bias: Vec<f32> = (0..37).map(|i| i as f32 - 18.0).collect();
    w.add(
        TensorSpec::new("bias", DType::F32, [37]),
        &f32_le_bytes(&bias),
    )
    .unwrap();
    w.finish().unwrap();

    let mut module = Weights {
        big: Param::initialized(
            ParamId::new(),
            Tensor::<2, Int>::zeros([rows, cols], (&device, DType::U8)),
        ),
        odd: Param::initialized(
            ParamId::new(),
            Tensor::<2, Int>::zeros([6201, odd_layout.row_bytes()], (&device, DType::U8)),
        ),
        norm: Param::from_tensor(Tensor::zeros([300_000], &device)),
        half: Param::from_tensor(Tensor::zeros([9], (&device, DType::F16))),
        bias: Param::from_tensor(Tensor::zeros([37], &device)),
    };
    let before = upload::totals();
    let mut store = MappedStore::open(&dir).unwrap();
    module.load_from(&mut store).unwrap();
    let after = upload::totals();
    assert_eq!(after.tensors - before.tensors, 3, "big, odd and norm");
    assert_eq!(
        after.bytes - before.bytes,
        (big.len() + odd.len() + 4 * norm.len()) as u64
    );

    let back = |t: Tensor<2, Int>| t.into_data().into_bytes().to_vec();
    assert!(back(module.big.val()) == big, "big differs");
    assert_eq!(module.odd.val().into_data().into_bytes().to_vec(), odd);
    assert_eq!(
        module.norm.val().into_data(),
        TensorData::new(norm, [300_000]),
        "norm"
    );
    assert_eq!(
        module.half.val().into_data().try_to_vec::<f16>().unwrap(),
        half
    );
    assert_eq!(module.bias.val().into_data(), TensorData::new(bias, [37]));
}

#[test]
fn block_weight_uploads_through_the_ring() {
    let Some((device, _serial, tmp)) = setup() else {
        return;
    };
    let dir = tmp.path().join("store");
    let layout = BlockLayout::new(GgmlType::Q8_0, 64).unwrap();
    let rows = 16_000;
    let data = bytes(rows * layout.row_bytes(), 3);
    let mut w = StoreWriter::create(&dir).unwrap();
    w.add(
        TensorSpec::new("emb", DType::U8, [rows, layout.row_bytes()]).blocks(layout),
        &data,
    )
    .unwrap();
    w.finish().unwrap();
    let store = MappedStore::open(&dir).unwrap();
    let before = upload::totals();
    let weight = BlockWeight::from_store(&store, "emb", &device).unwrap();
    assert_eq!(upload::totals().tensors - before.tensors, 1);
    assert_eq!(
        weight.bytes().clone().into_data().into_bytes().to_vec(),
        data
    );
}
