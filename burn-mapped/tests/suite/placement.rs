//! Placements: `Resident` loads one owned copy (never the mapping), `PerUseCopy` stages a fresh
//! copy on every use, and both compute exactly what the adopted module computes. Storage
//! addresses are checked against `/proc/self/maps`, not the crate's own bookkeeping.

use crate::common;

use std::ops::Range;
use std::path::Path;

use burn::module::Module;
use burn::store::{ModuleRecord, ModuleSnapshot};
use burn::tensor::Device;
use burn_mapped::{Manifest, MappedRecorder, MappedStore, Placement, Stager};
use burn_mapped_tests::flex::{flex_storage, float_param_storage};
use burn_mapped_tests::maps::{overlaps_a_mapping, store_mappings};
use common::*;

fn assert_outside(storage: &[(String, Range<usize>)], mappings: &[Range<usize>]) {
    for (path, range) in storage {
        assert!(
            !overlaps_a_mapping(range, mappings),
            "{path}: storage {range:x?} lies in a store mapping {mappings:x?}"
        );
    }
}

/// The store at `dir` loaded as Burn's record by the recorder, with `placement`.
fn record_of(dir: &Path, placement: Placement) -> ModuleRecord {
    MappedRecorder::with_placement(placement).load(dir).unwrap()
}

#[test]
fn resident_store_loads_owned_copies_that_compute_the_same() {
    let (_tmp, dir, expected) = recorded_net_and_output();
    let device = Device::flex();

    let mut store = MappedStore::options()
        .placement(Placement::Resident)
        .open(&dir)
        .unwrap();
    assert_eq!(store.placement(), Placement::Resident);
    let mut loaded = Net::init(&device);
    loaded.load_from(&mut store).unwrap();

    let storage = float_param_storage(&loaded);
    assert_eq!(storage.len(), 6);
    let mappings = store_mappings(&dir);
    assert!(!mappings.is_empty(), "the open store still maps its files");
    assert_outside(&storage, &mappings);
    let got = loaded.forward(tokens(&device)).into_data();
    assert_eq!(got.as_bytes(), expected.as_bytes());
}

#[test]
fn resident_recorder_releases_the_mapping_before_returning() {
    let (_tmp, dir, expected) = recorded_net_and_output();
    let device = Device::flex();

    let record = record_of(&dir, Placement::Resident);
    assert!(
        store_mappings(&dir).is_empty(),
        "a resident load must not keep the files mapped"
    );
    let loaded = Net::init(&device).load_record(record);
    let got = loaded.forward(tokens(&device)).into_data();
    assert_eq!(got.as_bytes(), expected.as_bytes());
}

#[test]
fn map_and_per_use_copy_recorders_hand_over_the_mapping() {
    let (_tmp, dir, _) = recorded_net();
    for placement in [Placement::Map, Placement::PerUseCopy] {
        let record = record_of(&dir, placement);
        let loaded = Net::init(&Device::flex()).load_record(record);
        let mappings = store_mappings(&dir);
        for (path, range) in float_param_storage(&loaded) {
            assert!(
                mappings
                    .iter()
                    .any(|m| m.start <= range.start && range.end <= m.end),
                "{placement}: {path} is not the mapping"
            );
        }
    }
}

#[test]
fn staging_copies_into_fresh_storage_on_every_call() {
    let (_tmp, dir, _) = recorded_net();
    let device = Device::flex();
    let mut store = MappedStore::open(&dir).unwrap();
    let mut at_rest = Net::init(&device);
    at_rest.load_from(&mut store).unwrap();
    let mappings = store_mappings(&dir);

    let stager = Stager::new(device.clone());
    // `col` is a Col-layout weight: a transposed view of the mapped [out, in] bytes.
    let first = stager.stage(at_rest.col.weight.val());
    let second = stager.stage(at_rest.col.weight.val());
    let (a, b) = (flex_storage(first.clone()), flex_storage(second.clone()));
    assert_outside(
        &[("first".into(), a.clone()), ("second".into(), b.clone())],
        &mappings,
    );
    assert!(
        !overlaps_a_mapping(&a, std::slice::from_ref(&b)),
        "two uses share storage: {a:x?} {b:x?}"
    );
    let source = at_rest.col.weight.val();
    assert_eq!(first.dims(), source.dims());
    assert_eq!(
        first.into_data().as_bytes(),
        source.clone().into_data().as_bytes()
    );
    assert_eq!(second.into_data().as_bytes(), source.into_data().as_bytes());
    let weight_bytes = (HIDDEN * HIDDEN * 4) as u64;
    assert_eq!(stager.staged_bytes(), 2 * weight_bytes);
    assert_eq!(stager.staged_tensors(), 2);
}

#[test]
fn staging_a_module_copies_every_parameter_per_use_and_computes_the_same() {
    let (_tmp, dir, expected) = recorded_net_and_output();
    let device = Device::flex();
    let record = record_of(&dir, Placement::PerUseCopy);
    let at_rest = Net::init(&device).load_record(record);
    let stager = Stager::new(device.clone());
    let clone = stager.clone();

    let per_pass: u64 = Manifest::read(&dir)
        .unwrap()
        .tensors()
        .iter()
        .map(|t| t.len())
        .sum();
    let mappings = store_mappings(&dir);
    for pass in 1..=2u64 {
        let staged = stager.stage_module(at_rest.clone());
        assert_outside(&float_param_storage(&staged), &mappings);
        let got = staged.forward(tokens(&device)).into_data();
        assert_eq!(got.as_bytes(), expected.as_bytes(), "pass {pass}");
        assert_eq!(clone.staged_bytes(), pass * per_pass, "clones share counts");
        assert_eq!(clone.staged_tensors(), pass * 6);
    }
}

#[test]
fn each_placement_reads_back_its_name_and_keeps_its_serialized_form() {
    for (p, json) in Placement::ALL
        .into_iter()
        .zip(["\"map\"", "\"resident\"", "\"per_use_copy\""])
    {
        assert_eq!(p.name().parse::<Placement>(), Ok(p));
        assert_eq!(p.name().to_uppercase().parse::<Placement>(), Ok(p));
        assert_eq!(serde_json::to_string(&p).unwrap(), json);
        assert_eq!(serde_json::from_str::<Placement>(json).unwrap(), p);
    }
    assert_eq!(Placement::PerUseCopy.to_string(), "per-use copy");
    let err = "streaming".parse::<Placement>().unwrap_err();
    assert!(err.to_string().contains("`streaming`"), "{err}");
}
