//! A store written from a module loads back with no copy, through both routes, and computes
//! exactly what the original module computed.

use crate::common;

use burn::module::Module;
use burn::store::ModuleSnapshot;
use burn::tensor::{Device, TensorData};
use burn_mapped::{Manifest, MappedRecorder, MappedStore};
use burn_mapped_tests::flex::float_param_storage;
use burn_mapped_tests::maps::{inside_a_mapping, mapped_ranges};
use burn_mapped_tests::tempdir;
use common::*;

fn assert_adopted(net: &Net, dir: &std::path::Path) {
    let manifest = Manifest::read(dir).unwrap();
    let storage = float_param_storage(net);
    assert_eq!(
        storage.len(),
        6,
        "embed, col weight+bias, row weight+bias, gain"
    );
    for (path, range) in storage {
        let entry = manifest
            .get(&path)
            .unwrap_or_else(|| panic!("{path} not in store"));
        let mappings = mapped_ranges(&dir.join(entry.file()));
        assert!(
            inside_a_mapping(&range, &mappings),
            "{path}: storage {range:x?} is not inside a mapping of its file {mappings:x?}"
        );
        assert_eq!(
            range.start % burn_mapped::host::page_size(),
            0,
            "{path} not page aligned"
        );
    }
}

/// A forward pass of `loaded` bitwise equal to `expected`.
fn assert_forward_equals(loaded: &Net, expected: &TensorData) {
    let got = loaded.forward(tokens(&Device::flex())).into_data();
    assert_eq!(
        got.as_bytes(),
        expected.as_bytes(),
        "forward must be bitwise equal"
    );
}

#[test]
fn recorder_round_trip_adopts_the_pages_and_reproduces_the_forward_pass() {
    let device = Device::flex();
    let (_tmp, dir, expected) = recorded_net_and_output();

    let fresh = Net::init(&device);
    assert!(!fresh.col.weight.is_initialized(), "init must be lazy");
    let record = MappedRecorder::default().load(&dir).unwrap();
    let loaded = fresh.load_record(record);

    assert_adopted(&loaded, &dir);
    assert_forward_equals(&loaded, &expected);
}

#[test]
fn burn_store_route_adopts_the_pages_and_reproduces_the_forward_pass() {
    let device = Device::flex();
    let (_tmp, dir, expected) = recorded_net_and_output();

    let mut loaded = Net::init(&device);
    let mut store = MappedStore::open(&dir).unwrap();
    let result = loaded.load_from(&mut store).unwrap();
    assert_eq!(result.applied.len(), 6);

    assert_adopted(&loaded, &dir);
    assert_forward_equals(&loaded, &expected);
}

#[test]
fn adopted_tensor_data_is_the_mapping_and_survives_the_store() {
    let (_tmp, dir, _) = recorded_net();
    let store = MappedStore::open(&dir).unwrap();
    let data = store.tensor_data("row.weight").unwrap();
    let mapping = store.mapped("row.weight").unwrap().address_range();
    let ptr = data.as_bytes().as_ptr() as usize;
    assert!(mapping.contains(&ptr));
    let expected = data.as_bytes().to_vec();
    drop(store);
    // The tensor keeps its own reference to the mapping.
    assert_eq!(data.as_bytes(), &expected[..]);
}

#[test]
fn rewriting_a_store_leaves_live_mappings_on_the_old_bytes() {
    let device = Device::flex();
    let tmp = tempdir();
    let dir = tmp.path().join("store");
    let first = Net::init(&device);
    MappedRecorder::default().record(&first, &dir).unwrap();
    let old = MappedStore::open(&dir).unwrap();
    let before = old.tensor_data("row.weight").unwrap().as_bytes().to_vec();

    let second = Net::init(&device);
    MappedRecorder::default().record(&second, &dir).unwrap();

    assert_eq!(
        old.tensor_data("row.weight").unwrap().as_bytes(),
        &before[..]
    );
    let new = MappedStore::open(&dir).unwrap();
    assert_ne!(
        new.tensor_data("row.weight").unwrap().as_bytes(),
        &before[..]
    );
    assert!(new.verify().is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary directories left behind");
}

/// Tensors of a huge page or more start on huge-page boundaries of the record's image and are
/// advised `MADV_HUGEPAGE`, so the kernel can map their page-cache folios huge; smaller ones
/// are packed at the 16 KiB alignment between them.
#[test]
fn large_tensors_sit_on_huge_page_boundaries_of_the_image() {
    use burn::tensor::DType;
    use burn_mapped::{StoreWriter, TensorSpec, host::huge_page_size};
    let huge = huge_page_size() as usize;
    let tmp = tempdir();
    let dir = tmp.path().join("store");
    let mut writer = StoreWriter::create(&dir).unwrap();
    // Sizes in f32 elements: small, 1.5 huge pages, small, exactly one huge page.
    let sizes = [1000, huge * 3 / 8, 5000, huge / 4];
    for (i, &n) in sizes.iter().enumerate() {
        let bytes: Vec<u8> = (0..n * 4).map(|b| (b * 31 + i) as u8).collect();
        let spec = TensorSpec::new(format!("t{i}"), DType::F32, vec![n]);
        writer.add(spec, &bytes).unwrap();
    }
    let manifest = writer.finish().unwrap();
    let record = MappedRecorder::default().load(&dir).unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    for (i, &n) in sizes.iter().enumerate() {
        let file = dir.join(manifest.get(&format!("t{i}")).unwrap().file());
        let ranges = mapped_ranges(&file);
        assert_eq!(ranges.len(), 1, "t{i}: {ranges:x?}");
        let start = ranges[0].start;
        if n * 4 >= huge {
            assert_eq!(start % huge, 0, "t{i} at {start:x} is not on a huge page");
            // The VMA's flags show the advice (`hg`) where the kernel has huge pages at all.
            if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
                let vma = smaps
                    .split_inclusive("VmFlags:")
                    .skip_while(|s| !s.contains(&format!("{start:x}-")))
                    .nth(1)
                    .unwrap_or_default();
                let flags = vma.lines().next().unwrap_or_default();
                assert!(flags.split_whitespace().any(|f| f == "hg"), "t{i}: {flags}");
            }
        } else {
            assert_eq!(start % burn_mapped::manifest::ALIGNMENT as usize, 0, "t{i}");
        }
    }
    drop(record);
}

#[test]
fn tensor_rows_are_the_mapped_rows_and_out_of_range_rows_are_a_typed_error() {
    let (_tmp, dir, original) = recorded_net();
    let store = MappedStore::open(&dir).unwrap();
    let name = "embed.weight";
    let whole = original.embed.weight.val().into_data();
    let whole = whole.as_slice::<f32>().unwrap();
    let mapping = store.mapped(name).unwrap().address_range();
    for rows in [0..1, 7..23, 13..VOCAB, 0..VOCAB] {
        let data = store.tensor_rows(name, rows.clone()).unwrap();
        assert_eq!(data.shape().to_vec(), [rows.len(), HIDDEN]);
        assert_eq!(
            data.as_slice::<f32>().unwrap(),
            &whole[rows.start * HIDDEN..rows.end * HIDDEN],
            "{rows:?}"
        );
        let ptr = data.as_bytes().as_ptr() as usize;
        assert_eq!(
            ptr,
            mapping.start + rows.start * HIDDEN * 4,
            "{rows:?}: not in place"
        );
    }
    // Empty, reversed, one row past the end, starting at the end.
    #[allow(clippy::reversed_empty_ranges)]
    let bad = [3..3, 5..2, 0..VOCAB + 1, VOCAB..VOCAB + 1];
    for rows in bad {
        assert!(
            matches!(
                store.tensor_rows(name, rows.clone()),
                Err(burn_mapped::StoreError::RowsOutOfRange { rows: VOCAB, .. })
            ),
            "{rows:?}"
        );
    }
    assert!(matches!(
        store.tensor_rows("no.such", 0..1),
        Err(burn_mapped::StoreError::TensorNotFound { .. })
    ));
}

#[test]
fn load_except_leaves_the_named_parameters_as_they_were() {
    let (_tmp, dir, original) = recorded_net();
    let mut loaded = Net::init(&Device::flex());
    let mut store = MappedStore::open(&dir).unwrap();
    let result = store
        .load_except(&mut loaded, &["embed.weight", "col.bias"])
        .unwrap();
    assert_eq!(result.applied.len(), 4);
    assert!(
        !loaded.embed.weight.is_initialized(),
        "left out, still lazy"
    );
    let bias = loaded.col.bias.as_ref().expect("col has a bias");
    assert!(!bias.is_initialized(), "left out, still lazy");
    assert_eq!(
        loaded.row.weight.val().into_data().as_bytes(),
        original.row.weight.val().into_data().as_bytes()
    );
    // Without the exception the same module loads whole, and nothing is reported missing.
    let mut whole = Net::init(&Device::flex());
    assert_eq!(store.load_except(&mut whole, &[]).unwrap().applied.len(), 6);
    assert_adopted(&whole, &dir);
}
