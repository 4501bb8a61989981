//! Micro-benchmarks of the mapped load path, so a regression shows in review:
//! manifest parse, mapping every file (`MappedStore::open`), building the burnpack image
//! (`MappedRecorder::load`), and adopting a record into a module (`load_record`), each per
//! tensor (criterion's element throughput) on a store of 192 small tensors made in a temp dir.
//!
//! ```text
//! cargo bench -p burn-mapped-benches --bench load_path
//! ```

use std::hint::black_box;

use burn::module::Module;
use burn::tensor::Device;
use burn_mapped::{Manifest, MappedRecorder, MappedStore, manifest::MANIFEST_FILE};
use burn_mapped_benches::synth::Stack;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

const LAYERS: usize = 96;
const DIM: usize = 64;

/// The synthetic model's stack, small: 96 layers of `[64, 64]`.
fn stack(device: &Device) -> Stack {
    Stack::init(LAYERS, DIM, device)
}

fn load_path(c: &mut Criterion) {
    let device = Device::flex();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    let manifest = MappedRecorder::default()
        .record(&stack(&device), &store)
        .expect("writing the store");
    let tensors = manifest.tensors().len() as u64;
    let manifest_bytes = std::fs::read(store.join(MANIFEST_FILE)).expect("manifest");

    let mut g = c.benchmark_group("load_path");
    g.throughput(Throughput::Elements(tensors));
    g.bench_function("manifest_parse", |b| {
        b.iter(|| Manifest::parse(black_box(&manifest_bytes), &store).expect("parse"))
    });
    g.bench_function("map_every_file", |b| {
        b.iter(|| MappedStore::open(black_box(&store)).expect("open"))
    });
    g.bench_function("build_image", |b| {
        b.iter(|| {
            MappedRecorder::default()
                .load(black_box(&store))
                .expect("load")
        })
    });
    g.bench_function("adopt_record", |b| {
        b.iter_batched(
            || {
                (
                    stack(&device),
                    MappedRecorder::default().load(&store).expect("load"),
                )
            },
            |(fresh, record)| fresh.try_load_record(record).expect("adopt"),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, load_path);
criterion_main!(benches);
