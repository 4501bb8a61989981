//! Loading onto Burn's NdArray backend: both routes work and reproduce the forward pass, the
//! weights stay borrowed from their file mappings at rest, and every use copies them (the
//! per-use copy, measured here against Flex, which reads the same pages in place).
//!
//! Allocations are counted by this binary's global allocator, so the copy is measured as the
//! heap bytes Burn allocates during a forward pass; `/proc` gives the resident set at rest.
// NdArray is deprecated upstream; what it does with mapped bytes is this file's subject.
#![allow(deprecated)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use burn::backend::NdArray;
use burn::backend::ndarray::NdArrayTensor;
use burn::module::{Module, Param};
use burn::nn::LinearLayout;
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_mapped::host::memstat::rss_self;
use burn_mapped::{
    Manifest, MappedRecorder, MappedStore, Placement, StoreError, StoreWriter, TensorSpec,
    placement::placement_on,
};
use burn_mapped_tests::flex::float_param_storage;
use burn_mapped_tests::maps::inside_a_mapping;
use burn_mapped_tests::maps::mapped_ranges;
use burn_mapped_tests::numeric::median;
use burn_mapped_tests::params::{ParamProbe, probe_float_params};
use burn_mapped_tests::synthetic::{
    BIG_DIM, BIG_LAYERS, BIG_WEIGHT_BYTES, BigStack, write_big_stack,
};
use burn_mapped_tests::tempdir;
use common::*;

// ---------------------------------------------------------------------------------------------
// Allocation counting

struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

fn grew(n: usize) {
    ALLOCATED.fetch_add(n as u64, Ordering::Relaxed);
    let live = LIVE.fetch_add(n as i64, Ordering::Relaxed) + n as i64;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(n: usize) {
    LIVE.fetch_sub(n as i64, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; the wrapper only counts
// sizes, so it upholds exactly the guarantees `System` does.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size > layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes allocated, and the peak of live heap bytes above the starting level, while `f`
/// runs. Meaningful in a child process running one test.
fn heap_during<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    let start_live = LIVE.load(Ordering::Relaxed);
    PEAK.store(start_live, Ordering::Relaxed);
    let start = ALLOCATED.load(Ordering::Relaxed);
    let out = f();
    let allocated = ALLOCATED.load(Ordering::Relaxed) - start;
    let peak = (PEAK.load(Ordering::Relaxed) - start_live).max(0) as u64;
    (out, allocated, peak)
}

// ---------------------------------------------------------------------------------------------
// NdArray storage, seen from outside the crate

fn ndarray() -> Device {
    Device::ndarray()
}

/// Whether an NdArray tensor's storage is borrowed, and the address range it reads.
fn ndarray_storage<const D: usize>(tensor: Tensor<D>) -> (bool, std::ops::Range<usize>) {
    let primitive = tensor
        .try_into_primitive::<NdArray>()
        .expect("tensor is on NdArray");
    let borrowed = primitive.is_borrowed();
    let range = match &primitive {
        NdArrayTensor::F32(s) => {
            let start = s.view().as_ptr() as usize;
            start..start + s.len() * 4
        }
        other => panic!("fixture tensors are f32, got {:?}", other),
    };
    (borrowed, range)
}

/// (path, borrowed, storage range) of every float parameter of a module on NdArray.
fn ndarray_params<M: Module>(module: &M) -> Vec<(String, bool, std::ops::Range<usize>)> {
    struct Storage;
    impl ParamProbe for Storage {
        type Out = (bool, std::ops::Range<usize>);
        fn probe<const D: usize>(&mut self, param: &Param<Tensor<D>>) -> Self::Out {
            ndarray_storage(param.val())
        }
    }
    probe_float_params(module, Storage)
        .into_iter()
        .map(|(path, (borrowed, range))| (path, borrowed, range))
        .collect()
}

/// Whether `range` lies inside a mapping of the file holding tensor `path` (`/proc/self/maps`).
fn inside_its_mapping(
    dir: &Path,
    manifest: &Manifest,
    path: &str,
    range: &std::ops::Range<usize>,
) -> bool {
    let entry = manifest
        .get(path)
        .unwrap_or_else(|| panic!("{path} not in store"));
    inside_a_mapping(range, &mapped_ranges(&dir.join(entry.file())))
}

/// On NdArray every parameter rests in its file mapping, except a `Col`-layout weight: its
/// load-time transpose is an NdArray op, and NdArray ops copy borrowed storage.
fn assert_borrowed_at_rest(net: &Net, dir: &Path) {
    let manifest = Manifest::read(dir).unwrap();
    let params = ndarray_params(net);
    assert_eq!(params.len(), 6);
    for (path, borrowed, range) in params {
        let mapped = inside_its_mapping(dir, &manifest, &path, &range);
        if path == "col.weight" {
            assert!(
                !borrowed && !mapped,
                "{path}: the Col transpose at load should have copied it"
            );
        } else {
            assert!(borrowed, "{path}: storage is not borrowed");
            assert!(
                mapped,
                "{path}: storage {range:x?} is not inside its file mapping"
            );
            assert_eq!(range.start % burn_mapped::host::page_size(), 0, "{path}");
        }
    }
}

fn store_of(net: &Net) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempdir();
    let dir = tmp.path().join("store");
    MappedRecorder::default().record(net, &dir).unwrap();
    (tmp, dir)
}

/// A fresh [`Net`] on `device` recorded into a store ([`store_of`]), with its output on
/// [`tokens`]: what a module loaded from the store must reproduce.
fn stored_net_and_output(device: &Device) -> (tempfile::TempDir, std::path::PathBuf, TensorData) {
    let net = Net::init(device);
    let output = net.forward(tokens(device)).into_data();
    let (tmp, dir) = store_of(&net);
    (tmp, dir, output)
}

// ---------------------------------------------------------------------------------------------
// Both routes

/// A forward pass of `loaded` bitwise equal to `expected`, with the weights borrowed from the
/// mapping before and after it: a use copies; it does not replace the parameter's storage.
fn forward_from_the_mapping(loaded: &Net, dir: &Path, device: &Device, expected: &TensorData) {
    assert_borrowed_at_rest(loaded, dir);
    let got = loaded.forward(tokens(device)).into_data();
    assert_eq!(
        got.as_bytes(),
        expected.as_bytes(),
        "forward must be bitwise equal"
    );
    assert_borrowed_at_rest(loaded, dir);
}

#[test]
fn recorder_route_on_ndarray_keeps_weights_in_the_mapping_and_reproduces_the_forward_pass() {
    let device = ndarray();
    let (_tmp, dir, expected) = stored_net_and_output(&device);
    let before = file_snapshot(&dir);

    // Burn's own pair, and the device-aware wrapper.
    let bare = Net::init(&device).load_record(MappedRecorder::default().load(&dir).unwrap());
    let checked = MappedRecorder::default()
        .load_into(Net::init(&device), &dir)
        .unwrap();
    for loaded in [bare, checked] {
        forward_from_the_mapping(&loaded, &dir, &device, &expected);
    }
    assert_eq!(file_snapshot(&dir), before);
    assert!(MappedStore::open(&dir).unwrap().verify().is_empty());
}

#[test]
fn store_route_on_ndarray_runs_a_strict_forward_pass_from_the_mapping() {
    let device = ndarray();
    let (_tmp, dir, expected) = stored_net_and_output(&device);
    let before = file_snapshot(&dir);

    let mut loaded = Net::init(&device);
    let mut store = MappedStore::options().strict(true).open(&dir).unwrap();
    assert_eq!(loaded.load_from(&mut store).unwrap().applied.len(), 6);
    drop(store);

    forward_from_the_mapping(&loaded, &dir, &device, &expected);
    assert_eq!(file_snapshot(&dir), before);
}

fn f32s<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// On Flex these same ops on a sole-owned weight fail in strict mode (tests/suite/readonly.rs). On
/// NdArray they succeed: it never asks for write access to borrowed bytes, it copies them, so
/// strict mode has nothing to refuse.
#[test]
fn strict_mode_has_nothing_to_refuse_on_ndarray_because_every_write_copies() {
    let (_tmp, dir) = store_of(&Net::init(&ndarray()));
    let before = file_snapshot(&dir);
    let reference = file_f32(&dir, "row.weight");
    let mut net = Net::init(&ndarray());
    net.load_from(&mut MappedStore::options().strict(true).open(&dir).unwrap())
        .unwrap();
    let w = net.row.weight.val();
    drop(net);
    assert!(ndarray_storage(w.clone()).0, "sole owner, still borrowed");

    let plus = f32s(w.clone() + 1.0);
    for (p, r) in plus.iter().zip(&reference) {
        assert_eq!(*p, r + 1.0);
    }
    assert_corner_patched(&w, &reference);
    assert_eq!(f32s(w.clone()), reference);
    assert!(ndarray_storage(w).0);
    assert_eq!(file_snapshot(&dir), before);
}

// ---------------------------------------------------------------------------------------------
// Dtypes NdArray lacks

/// A store with `Net`'s names and shapes in f16 (NdArray has no f16).
fn f16_store(dir: &Path) {
    let mut w = StoreWriter::create(dir).unwrap();
    for (name, shape) in [
        ("embed.weight", vec![VOCAB, HIDDEN]),
        ("col.weight", vec![HIDDEN, HIDDEN]),
        ("col.bias", vec![HIDDEN]),
        ("row.weight", vec![HIDDEN, OUT]),
        ("row.bias", vec![OUT]),
        ("gain", vec![OUT]),
    ] {
        let n: usize = shape.iter().product();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|i| burn::tensor::f16::from_f32(i as f32 / 64.0).to_le_bytes())
            .collect();
        w.add(TensorSpec::new(name, DType::F16, shape), &bytes)
            .unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn an_f16_store_on_ndarray_is_a_typed_error_on_both_routes() {
    let tmp = tempdir();
    let dir = tmp.path().join("store");
    f16_store(&dir);
    let expect_device_dtype = |err: StoreError| match err {
        StoreError::DeviceDType {
            tensor,
            file,
            dtype,
            device,
        } => {
            assert_eq!(dtype, "f16");
            assert!(device.contains("NdArray"), "{device}");
            let manifest = Manifest::read(&dir).unwrap();
            assert_eq!(file, dir.join(manifest.get(&tensor).unwrap().file()));
        }
        other => panic!("expected DeviceDType, got {other:?}"),
    };
    expect_device_dtype(
        MappedRecorder::default()
            .load_into(Net::init(&ndarray()), &dir)
            .unwrap_err(),
    );
    let mut net = Net::init(&ndarray());
    expect_device_dtype(
        net.load_from(&mut MappedStore::open(&dir).unwrap())
            .unwrap_err(),
    );
    // The same store is fine where f16 exists: the check is about the device, not the store.
    let flex = MappedRecorder::default()
        .load_into(Net::init(&Device::flex()), &dir)
        .unwrap();
    assert_eq!(flex.gain.val().dtype(), DType::F16);
}

// ---------------------------------------------------------------------------------------------
// Placement labels in logs

struct Capture;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target() == "burn_mapped"
    }
    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            LINES.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        log::set_logger(&Capture).unwrap();
        log::set_max_level(log::LevelFilter::Info);
    });
}

/// The log lines that mention `dir`.
fn lines_about(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&dir))
        .cloned()
        .collect()
}

#[test]
fn placement_follows_the_backend() {
    assert_eq!(placement_on(&Device::flex()), Placement::Map);
    assert_eq!(placement_on(&ndarray()), Placement::PerUseCopy);
    assert_eq!(Placement::PerUseCopy.label(), "per-use copy");
}

#[test]
fn both_loaders_log_the_placement_the_device_gives_the_weights() {
    capture_logs();
    let (_tmp, dir) = store_of(&Net::init(&Device::flex()));
    for (device, label) in [(Device::flex(), ": map ("), (ndarray(), ": per-use copy (")] {
        LINES
            .lock()
            .unwrap()
            .retain(|l| !l.contains(&dir.display().to_string()));
        MappedRecorder::default()
            .load_into(Net::init(&device), &dir)
            .unwrap();
        Net::init(&device)
            .load_from(&mut MappedStore::open(&dir).unwrap())
            .unwrap();
        let lines = lines_about(&dir);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines.iter().all(|l| l.contains(label)), "{lines:?}");
    }
}

/// On a CubeCL device the one copy into device memory is labelled `resident`. Needs a wgpu
/// adapter (lavapipe in CI); skips without one unless `BURN_MAPPED_REQUIRE_GPU=1`.
#[cfg(feature = "gpu-tests")]
#[test]
fn loading_onto_wgpu_is_logged_as_resident_and_carries_the_file_bytes() {
    let Some(device) = burn_mapped_tests::gpu::wgpu_device() else {
        return;
    };
    capture_logs();
    assert_eq!(placement_on(&device), Placement::Resident);
    let (_tmp, dir) = store_of(&Net::init(&Device::flex()));
    let mut net = Net::init(&device);
    net.load_from(&mut MappedStore::open(&dir).unwrap())
        .unwrap();
    let lines = lines_about(&dir);
    assert!(
        lines.len() == 1 && lines[0].contains(": resident ("),
        "{lines:?}"
    );
    assert_eq!(f32s(net.row.weight.val()), file_f32(&dir, "row.weight"));
}

// ---------------------------------------------------------------------------------------------
// The per-use copy, measured

const FORWARDS: usize = 3;
/// Seed of the big store's values.
const SEED: u64 = 0x2545_F491_4F6C_DD1D;

const ARMS: [&str; 5] = [
    "flex-map",
    "ndarray-store",
    "ndarray-recorder",
    "ndarray-owned",
    "ndarray-col",
];

#[test]
fn a_forward_on_ndarray_copies_the_mapped_weights_while_flex_reads_them_in_place() {
    let tmp = tempdir();
    let store = tmp.path().join("store");
    write_big_stack(&store, SEED);
    let before: Vec<u64> = Manifest::read(&store)
        .unwrap()
        .tensors()
        .iter()
        .filter_map(|t| t.xxh3())
        .collect();
    let w = BIG_WEIGHT_BYTES as f64;
    let mut results = Vec::new();
    for arm in ARMS {
        let out = run_child(
            "child_runs_big_forwards",
            &[("BM_ARM", arm), ("BM_STORE", store.to_str().unwrap())],
        );
        let v = |k: &str| child_value::<f64>(&out, k);
        println!(
            "{arm:>16}: at rest RssAnon +{:6.2}% of weights, {:2}/{BIG_LAYERS} borrowed from the mapping; \
             per forward: heap allocated {:7.1} MiB ({:5.1}% of weights), peak live heap +{:5.1} MiB, \
             {:7.1} ms (median of {FORWARDS}); RssAnon after the forwards +{:.2}%",
            v("anon_load") / w * 100.0,
            v("in_mapping"),
            v("allocated") / (1 << 20) as f64,
            v("allocated") / w * 100.0,
            v("peak_heap") / (1 << 20) as f64,
            v("ms"),
            v("anon_after") / w * 100.0,
        );
        results.push((
            arm,
            v("anon_load") / w,
            v("in_mapping"),
            v("allocated") / w,
            v("ms"),
        ));
    }
    for &(arm, anon_load, in_mapping, allocated, _) in &results {
        match arm {
            "flex-map" => {
                assert!(anon_load < 0.02, "{arm}: {anon_load}");
                assert!(allocated < 0.02, "{arm} must read in place: {allocated}");
            }
            "ndarray-store" | "ndarray-recorder" => {
                assert!(
                    anon_load < 0.02,
                    "{arm} must rest in the mapping: {anon_load}"
                );
                assert_eq!(in_mapping as usize, BIG_LAYERS, "{arm}");
                // The per-use copy: every weight is copied again by every forward pass.
                assert!(
                    allocated > 0.95,
                    "{arm} should copy the weights per use: {allocated}"
                );
            }
            // Control: the at-rest measurement sees a copy when there is one, and the same
            // forward over owned weights does not copy them, so the copy above is the borrow's.
            "ndarray-owned" => {
                assert!(anon_load > 0.9, "{arm} holds a heap copy: {anon_load}");
                assert_eq!(in_mapping as usize, 0, "{arm}");
                assert!(
                    allocated < 0.5,
                    "{arm} should not copy per use: {allocated}"
                );
            }
            // A Col weight is copied by its load-time transpose, and NdArray's matmul copies
            // the transposed view into standard layout on every use as well.
            "ndarray-col" => {
                assert!(anon_load > 0.9, "{arm} holds a heap copy: {anon_load}");
                assert_eq!(in_mapping as usize, 0, "{arm}");
                assert!(allocated > 0.95, "{arm}: {allocated}");
            }
            _ => unreachable!(),
        }
    }
    let arm = |name: &str| *results.iter().find(|r| r.0 == name).unwrap();
    let (mapped, owned, flex) = (arm("ndarray-store"), arm("ndarray-owned"), arm("flex-map"));
    println!(
        "per-use copy on NdArray: {:.1} MiB copied per forward over {} MiB of weights, \
         +{:.1} ms per forward (mapped {:.1} ms vs owned {:.1} ms); Flex mapped {:.1} ms, nothing copied",
        (mapped.3 - owned.3) * w / (1 << 20) as f64,
        BIG_WEIGHT_BYTES >> 20,
        mapped.4 - owned.4,
        mapped.4,
        owned.4,
        flex.4,
    );
    let after: Vec<u64> = MappedStore::open(&store)
        .unwrap()
        .iter()
        .map(|(_, f)| xxhash_rust::xxh3::xxh3_64(f.bytes()))
        .collect();
    assert_eq!(after, before, "store files changed");
}

#[test]
#[ignore = "child process of a_forward_on_ndarray_copies_the_mapped_weights_while_flex_reads_them_in_place"]
fn child_runs_big_forwards() {
    let env = |k: &str| std::env::var(k).unwrap();
    let dir = std::path::PathBuf::from(env("BM_STORE"));
    let arm = env("BM_ARM");
    let device = if arm.starts_with("flex") {
        Device::flex()
    } else {
        ndarray()
    };
    let layout = if arm == "ndarray-col" {
        LinearLayout::Col
    } else {
        LinearLayout::Row
    };
    let base = rss_self().unwrap().anon;
    let fresh = BigStack::init(&device, layout);
    let module = match arm.as_str() {
        "ndarray-recorder" => MappedRecorder::default().load_into(fresh, &dir).unwrap(),
        "ndarray-owned" => {
            // The same weights copied into heap arrays NdArray owns: `into_record` reads every
            // tensor out into a native buffer, and NdArray keeps native buffers as owned arrays.
            let mut mapped = BigStack::init(&device, layout);
            mapped
                .load_from(&mut MappedStore::open(&dir).unwrap())
                .unwrap();
            fresh.load_record(mapped.into_record())
        }
        _ => {
            let mut module = fresh;
            module
                .load_from(&mut MappedStore::options().strict(true).open(&dir).unwrap())
                .unwrap();
            module
        }
    };
    let anon_load = rss_self().unwrap().anon.saturating_sub(base);

    let manifest = Manifest::read(&dir).unwrap();
    let count_in_mapping = |module: &BigStack| {
        if arm.starts_with("flex") {
            let storage = float_param_storage(module);
            storage
                .iter()
                .filter(|(p, r)| inside_its_mapping(&dir, &manifest, p, r))
                .count()
        } else {
            ndarray_params(module)
                .iter()
                .filter(|(p, b, r)| *b && inside_its_mapping(&dir, &manifest, p, r))
                .count()
        }
    };
    let in_mapping = count_in_mapping(&module);

    let x = Tensor::<2>::ones([1, BIG_DIM], &device);
    let y = module.forward(x.clone()).into_data(); // warm-up: faults the pages in
    assert!(y.iter::<f32>().all(f32::is_finite));
    let mut runs = Vec::new();
    for _ in 0..FORWARDS {
        let t = Instant::now();
        let (y, allocated, peak_heap) = heap_during(|| module.forward(x.clone()).into_data());
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(y.iter::<f32>().all(f32::is_finite));
        runs.push((ms, allocated, peak_heap));
    }
    // A use copies; it does not change what the parameters rest in.
    assert_eq!(count_in_mapping(&module), in_mapping);
    let anon_after = rss_self().unwrap().anon.saturating_sub(base);

    println!("anon_load={anon_load}");
    println!("in_mapping={in_mapping}");
    println!("ms={}", median(runs.iter().map(|r| r.0)));
    println!("allocated={}", median(runs.iter().map(|r| r.1 as f64)));
    println!("peak_heap={}", median(runs.iter().map(|r| r.2 as f64)));
    println!("anon_after={anon_after}");
}
