//! `q8_linear` on Flex reads the adopted int8 pages where they are: the process's peak
//! resident set does not grow by a copy of the weights (an f32 copy would be 4x their size,
//! an int8 copy 1x). Alone in its test binary so no other test allocates meanwhile.

mod q8_common;

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_mapped::host::memstat::rss_self;
use burn_mapped::q8::{Q8Rows, Q8Weight, q8_linear, write_q8_rows};
use burn_mapped::{MappedStore, StoreWriter};
use q8_common::Rng;

const OUT: usize = 4096;
const IN: usize = 8192;
const WEIGHT_BYTES: u64 = (OUT * IN) as u64; // 32 MiB

/// Resets `VmHWM` to the current resident set (Linux `clear_refs` value 5).
fn reset_peak() -> std::io::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5")
}

#[test]
fn q8_linear_does_not_copy_the_mapped_weights() {
    let mut rng = Rng::fresh();
    let dir = burn_mapped_tests::tempdir();
    let store_dir = dir.path().join("store");
    {
        let rows = Q8Rows {
            values: rng.q8_values(OUT * IN),
            scales: rng.scales(OUT),
        };
        let mut writer = StoreWriter::create(&store_dir).unwrap();
        write_q8_rows(&mut writer, "w.weight", &rows, OUT, IN).unwrap();
        writer.finish().unwrap();
    }
    let device = Device::flex();
    let store = MappedStore::open(&store_dir).unwrap();
    let weight = Q8Weight::from_store(&store, "w.weight", &device).unwrap();
    let x = |t: usize, rng: &mut Rng| {
        Tensor::<2>::from_data(
            TensorData::new(rng.vec_nonzero(t * IN), [t, IN]),
            (&device, DType::F32),
        )
    };
    // Warm up: fault the file pages in and let the allocator and thread stacks settle.
    let _ = q8_linear(x(8, &mut rng), &weight, None)
        .unwrap()
        .into_data();
    let inputs = [x(1, &mut rng), x(8, &mut rng), x(11, &mut rng)];

    reset_peak().expect("this test needs /proc/self/clear_refs (Linux)");
    let before = rss_self().unwrap();
    for x in inputs {
        let _ = q8_linear(x, &weight, None).unwrap().into_data();
    }
    let after = rss_self().unwrap();
    let resident = before.anon + before.file + before.shmem;
    let growth = after.peak.saturating_sub(resident);
    eprintln!(
        "peak growth {} KiB for {} KiB of int8 weights",
        growth / 1024,
        WEIGHT_BYTES / 1024
    );
    assert!(
        growth < WEIGHT_BYTES / 4,
        "peak resident set grew by {growth} bytes running over {WEIGHT_BYTES} bytes of weights"
    );
}
